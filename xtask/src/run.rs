//! `cargo xtask run`: the default model, fetched if needed, completing a prompt through the
//! release `llm-server run`.

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use crate::model;

#[derive(clap::Args)]
pub struct Run {
    /// The text the model continues (the default model is a base model, not a chat model).
    #[arg(long, default_value = "The capital of France is")]
    prompt: String,
    /// More `llm-server run` options, after `--` (e.g. `-- -n 64 --temp 0`).
    #[arg(last = true)]
    args: Vec<String>,
}

impl Run {
    pub fn run(self, sh: &Shell) -> Result<()> {
        let model = model::ensure(sh, false)?;
        let Run { prompt, args } = self;
        cmd!(
            sh,
            "cargo run --release -p llm-server -- run --model {model} --prompt {prompt} {args...}"
        )
        .run()
        .context("llm-server run failed")
    }
}
