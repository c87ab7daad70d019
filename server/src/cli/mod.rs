//! The command line: one module per subcommand, each a `run` on its clap struct.

mod bench;
mod inspect;
mod plan;
mod run;
mod serve;
mod synth;
mod tokenize;

use std::process::ExitCode;

use llm_server::exit::{Refusal, Status};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "llm-server",
    version,
    about = "CPU inference for GGUF models on small x86-64-v3 machines"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The matmul kernels' instruction set: `vnni` where the CPU has AVX512-VNNI (Cascade Lake,
    /// Zen 4 and later), `avx2` everywhere; left out, the best this CPU has. Both give
    /// bit-identical results; the flag is for comparing their speed.
    #[arg(long, global = true, value_name = "SET")]
    kernels: Option<llm_server::quant::isa::Choice>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure prefill and decode speed (as llama-bench does).
    Bench(bench::Bench),
    /// Print a model's metadata and tensor table.
    Inspect(inspect::Inspect),
    /// Print the memory plan (weights, KV cache, scratch) beside the memory limits found.
    Plan(plan::Plan),
    /// Complete one prompt, streaming the generated text to stdout.
    Run(run::Run),
    /// Serve the OpenAI-compatible HTTP API.
    // Boxed: its options outweigh every other command's (clippy's large_enum_variant).
    Serve(Box<serve::Serve>),
    /// Write a GGUF of a model's real shapes and tensor types with pseudo-random weights.
    Synth(synth::Synth),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::Tokenize),
}

pub fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        // A bad option exits 1, not clap's 2: 2 says "the memory plan does not fit" (plan.rs),
        // and systemd is told not to restart on either.
        let _ = e.print();
        if e.use_stderr() {
            Status::BadInput.exit()
        }
        Status::Success.exit()
    });
    if let Some(choice) = cli.kernels {
        if let Err(e) = llm_server::quant::isa::select(choice) {
            eprintln!("llm-server: {e}");
            return Status::BadInput.into();
        }
    }
    let result = match cli.cmd {
        Cmd::Bench(c) => c.run(),
        Cmd::Inspect(c) => c.run(),
        Cmd::Plan(c) => c.run(),
        Cmd::Run(c) => c.run(),
        Cmd::Serve(c) => (*c).run(),
        Cmd::Synth(c) => c.run(),
        Cmd::Tokenize(c) => c.run(),
    };
    match result {
        Ok(()) => Status::Success.into(),
        Err(e) => {
            eprintln!("llm-server: {e}");
            e.downcast_ref::<Refusal>()
                .map_or(Status::BadInput, |r| r.status)
                .into()
        }
    }
}

/// Errors the CLI prints: already phrased for the user.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;
