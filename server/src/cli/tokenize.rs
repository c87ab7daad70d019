//! `llm-server tokenize`: the token ids of a text, as a JSON array.

use std::path::PathBuf;

use llm_server::gguf::Gguf;
use llm_server::tokenizer::Tokenizer;

use super::CliResult;

#[derive(clap::Args)]
pub struct Tokenize {
    /// The GGUF model file (only its vocabulary is read).
    #[arg(long, short)]
    model: PathBuf,
    /// The text to tokenize; BOS is added and special tokens such as `<start_of_turn>` are parsed,
    /// as for a prompt.
    #[arg(long)]
    text: String,
}

impl Tokenize {
    pub fn run(self) -> CliResult {
        let gguf = Gguf::open(&self.model)?;
        let tokenizer = Tokenizer::from_metadata(&gguf.metadata)?;
        let ids = tokenizer.encode(&self.text, true, true);
        println!("{}", serde_json::to_string(&ids)?);
        Ok(())
    }
}
