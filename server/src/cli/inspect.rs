use std::io::Write;
use std::path::PathBuf;

use llm_server::gguf::Gguf;

use super::CliResult;

#[derive(clap::Args)]
pub struct Inspect {
    /// The GGUF model file.
    #[arg(long, short)]
    model: PathBuf,
}

impl Inspect {
    pub fn run(self) -> CliResult {
        let g = Gguf::open(&self.model)?;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "GGUF v{}, {} metadata keys, {} tensors, alignment {}",
            g.version,
            g.metadata.len(),
            g.tensors.len(),
            g.alignment
        )?;
        writeln!(out, "\nmetadata:")?;
        for (k, v) in g.metadata.iter() {
            writeln!(out, "  {k:<44} {v}")?;
        }
        writeln!(
            out,
            "\n{:<36} {:<7} {:<22} {:>12}",
            "tensor", "type", "shape", "bytes"
        )?;
        let mut total = 0;
        for t in &g.tensors {
            let shape = format!("{:?}", t.dims);
            writeln!(
                out,
                "{:<36} {:<7} {:<22} {:>12}",
                t.name,
                t.ty.name(),
                shape,
                t.size
            )?;
            total += t.size;
        }
        writeln!(out, "{:<36} {:<7} {:<22} {:>12}", "total", "", "", total)?;
        Ok(())
    }
}
