//! `llm-server synth`: a GGUF of a real model's shapes and tensor types with deterministic
//! pseudo-random weights (llm_server::gguf::synth), for measuring memory and speed where the
//! real weights cannot be fetched (the VM proof of Gemma 3 1B at 1 GB). It is an `llm-server`
//! subcommand, not an xtask, so it uses the engine's own quant table (block layouts, float
//! fields) and the file it writes is checked by the same reader that loads it.
//!
//! The shape comes from a preset (`--preset`, with the tokenizer copied from `--vocab-from`, a
//! GGUF with the same vocabulary such as the default model) or from a real file's header
//! (`--like`: every key and the whole tensor table, types included). The types of a preset
//! follow `--mix`, as llama.cpp's quantiser mixes them (see [`Mix`]).

use std::path::PathBuf;

use llm_server::gguf::synth::{like_header, write_file, Mix, Preset};

use super::CliResult;

#[derive(clap::Args)]
pub struct Synth {
    /// The file to write.
    #[arg(long, short)]
    out: PathBuf,
    /// An architecture preset: gemma3-1b (Gemma 3 1B), or gemma3-tiny (a small Gemma 3 for tests).
    #[arg(long, conflicts_with = "like", requires = "vocab_from")]
    preset: Option<String>,
    /// With --preset: the GGUF whose `tokenizer.*` keys the file gets; its vocabulary must have
    /// the preset's size (the default model's for gemma3-1b).
    #[arg(long)]
    vocab_from: Option<PathBuf>,
    /// With --preset: the tensor types, as a file of that quantisation mixes them: iq4_xs, q4_0,
    /// or a grid type (iq3_s, iq3_xxs, iq2_s, iq2_xs, iq2_xxs, iq1_m, iq1_s) for every matrix.
    #[arg(long, default_value = "iq4_xs")]
    mix: String,
    /// Instead of a preset: copy this GGUF's header (metadata, tensor names, shapes and types)
    /// and synthesise its data.
    #[arg(long)]
    like: Option<PathBuf>,
    /// Seed of the pseudo-random weights (the same seed writes the same file).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl Synth {
    pub fn run(self) -> CliResult {
        let (metadata, tensors) = match (&self.preset, &self.like) {
            (Some(name), None) => {
                let preset = Preset::named(name)?;
                let mix = Mix::named(&self.mix)?;
                let vocab = self.vocab_from.as_deref().expect("clap requires it");
                (preset.metadata(vocab)?, preset.tensors(mix))
            }
            (None, Some(like)) => like_header(like)?,
            _ => return Err("give --preset P --vocab-from GGUF, or --like GGUF".into()),
        };
        let bytes = write_file(&self.out, &metadata, &tensors, self.seed)?;
        eprintln!(
            "wrote {} ({} tensors, {bytes} bytes)",
            self.out.display(),
            tensors.len()
        );
        Ok(())
    }
}
