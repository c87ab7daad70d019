//! `llm-server run`: complete one prompt and stream the generated text to stdout.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use llm_server::model::{LoadOptions, Model};
use llm_server::sampler::{Sampler, SamplerParams};
use llm_server::tokenizer::StreamDecoder;

use super::CliResult;

#[derive(clap::Args)]
pub struct Run {
    /// The GGUF model file.
    #[arg(long, short)]
    model: PathBuf,
    /// The text to continue (special tokens such as `<start_of_turn>` are parsed).
    #[arg(long)]
    prompt: String,
    /// Most tokens to generate; generation also stops at an end-of-generation token.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Sampling temperature; 0 picks the most likely token every time.
    #[arg(long = "temp", default_value_t = SamplerParams::default().temperature)]
    temperature: f32,
    /// Seed of the sampler's random stream [default: random].
    #[arg(long)]
    seed: Option<u64>,
    /// Threads for the forward pass [default: the physical cores, at most the CPUs the cgroup's
    /// quota grants].
    #[arg(long, short)]
    threads: Option<usize>,
    /// Keep only the K most likely tokens (0 disables).
    #[arg(long, default_value_t = SamplerParams::default().top_k)]
    top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to P (1.0 disables).
    #[arg(long, default_value_t = SamplerParams::default().top_p)]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0.0 disables).
    #[arg(long, default_value_t = SamplerParams::default().min_p)]
    min_p: f32,
    /// Tokens of context [default: the prompt plus -n, at most the model's training context].
    #[arg(long, short = 'c')]
    ctx_size: Option<usize>,
    /// Print the control tokens the model writes (Gemma's `<start_of_turn>`) as their text;
    /// without it they print as nothing, as in llama.cpp (`--special`). Tokens the vocabulary
    /// types as user-defined (Gemma's `<start_of_image>`) are text either way, as in llama.cpp.
    #[arg(long)]
    special: bool,
    /// Print load, prompt and generation speeds to stderr.
    #[arg(long, short)]
    verbose: bool,
}

impl Run {
    pub fn run(self) -> CliResult {
        let threads = self
            .threads
            .unwrap_or_else(|| llm_server::threads::default_threads().threads);
        if threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        let started = Instant::now();
        let model = Model::load(
            &self.model,
            &LoadOptions {
                threads,
                mlock: false,
            },
        )?;
        let loaded = started.elapsed();
        let tok = model.tokenizer();
        let prompt = tok.encode(&self.prompt, true, true);
        if prompt.is_empty() {
            return Err("the prompt is empty (and the model adds no BOS token); give some text with --prompt".into());
        }
        let n_ctx = self
            .ctx_size
            .unwrap_or_else(|| (prompt.len() + self.n_predict).min(model.n_ctx_train()));
        if prompt.len() > n_ctx {
            return Err(format!(
                "the prompt is {} tokens but the context holds {n_ctx}; shorten the prompt or raise --ctx-size",
                prompt.len()
            )
            .into());
        }
        let seed = self.seed.unwrap_or_else(rand::random);
        let mut sampler = Sampler::new(
            SamplerParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                seed,
                ..SamplerParams::default()
            },
            model.config().n_vocab,
        );
        let mut session = model.new_session(n_ctx);
        let mut text = StreamDecoder::new(self.special);
        let mut out = io::stdout().lock();
        // The prompt and the tokens generated so far (the sampler's penalties look at them).
        let mut history = Vec::with_capacity(n_ctx);
        history.extend_from_slice(&prompt);

        let prefill_start = Instant::now();
        let mut logits = session.eval(&model, &prompt)?;
        let prefill = prefill_start.elapsed();
        let decode_start = Instant::now();
        let mut generated = 0;
        // The context may fill before -n tokens: stop there rather than fail after printing.
        let budget = self.n_predict.min(n_ctx - prompt.len());
        while generated < budget {
            let id = sampler.sample(logits, &history);
            if tok.is_eog(id) {
                break;
            }
            generated += 1;
            history.push(id);
            if let Some(piece) = text.push(tok, id) {
                if !emit(&mut out, piece)? {
                    return Ok(());
                }
            }
            if generated < budget {
                logits = session.eval(&model, &[id])?;
            }
        }
        if let Some(rest) = text.finish() {
            emit(&mut out, rest)?;
        }
        // Only the generated text goes to a pipe; a terminal also gets the prompt back on its own line.
        if out.is_terminal() {
            emit(&mut out, "\n")?;
        }
        let decode = decode_start.elapsed();

        if self.verbose {
            eprintln!();
            eprintln!(
                "llm-server: load {:.2} s, {threads} threads, context {n_ctx}, seed {seed}",
                loaded.as_secs_f64()
            );
            eprintln!(
                "llm-server: prompt {} tokens, {}",
                prompt.len(),
                speed(prompt.len(), prefill)
            );
            eprintln!(
                "llm-server: generated {generated} tokens, {}",
                speed(generated, decode)
            );
            if generated == budget && budget < self.n_predict {
                eprintln!("llm-server: stopped because the context of {n_ctx} tokens is full");
            }
        }
        Ok(())
    }
}

/// Writes and flushes `text` so each token shows as soon as it is made. Returns false when the
/// reader has gone (`llm-server run … | head`): nothing more needs generating.
fn emit(out: &mut impl Write, text: &str) -> io::Result<bool> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

fn speed(tokens: usize, took: Duration) -> String {
    let secs = took.as_secs_f64();
    let rate = if secs > 0.0 {
        tokens as f64 / secs
    } else {
        0.0
    };
    format!("{:.2} s, {rate:.1} tok/s", secs)
}
