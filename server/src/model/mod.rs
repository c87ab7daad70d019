//! A loaded model: the mapped file, its config and weights, its tokenizer and a thread pool.
//! Conversations run in [`Session`]s, each with its own KV cache.
//!
//! In reading order: `arch` (one [`ArchSpec`] row per architecture), `config` (the sizes from
//! the file), `weights` (the tensors, with their shapes), `scratch` and `kv_cache` (a session's
//! memory), `session` (the forward pass: embed → RoPE tables → layers → output), `attention`
//! (its attention block), `matmul` and `ops` (its arithmetic); `footprint` (the bytes a token
//! reads).

mod arch;
mod attention;
mod config;
mod footprint;
mod kv_cache;
pub mod kv_file;
mod matmul;
mod ops;
mod scratch;
mod session;
pub(crate) mod weights;

use std::path::Path;

pub use arch::{Arch, ArchSpec, Ffn, RopeStyle, Swa, ARCHS};
pub use config::{Config, ConfigError};
pub use footprint::weight_bytes_per_token;
pub use kv_cache::{KvCache, MAX_DRAFT, REWIND, UBATCH};
pub use session::{decode_batch, Session};
pub use weights::Weights;

use crate::gguf::{Gguf, GgufError};
use crate::threads::Pool;
use crate::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(
        "tensor `{tensor}` has shape {got}, expected {want} from the model's hyper-parameters"
    )]
    Shape {
        tensor: String,
        want: String,
        got: String,
    },
    #[error("the context holds {n_ctx} tokens but {need} are needed; shorten the prompt or raise --ctx-size")]
    ContextFull { n_ctx: usize, need: usize },
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    BadToken { id: u32, n_vocab: usize },
    #[error("nothing to evaluate: the token list is empty")]
    EmptyInput,
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Threads for the forward pass (the caller's thread included).
    pub threads: usize,
    /// Lock the weights in RAM (`mlock`).
    pub mlock: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 1,
            mlock: false,
        }
    }
}

pub struct Model {
    gguf: Gguf,
    config: Config,
    weights: Weights,
    tokenizer: Tokenizer,
    pool: Pool,
}

impl Model {
    /// Maps and checks `path`. Weights are not read here: `madvise(WILLNEED)` starts the
    /// kernel's read-ahead and the first tokens fault the rest in.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
        Self::from_gguf(Gguf::open(path)?, opts)
    }

    pub fn from_gguf(gguf: Gguf, opts: &LoadOptions) -> Result<Model, ModelError> {
        let config = Config::from_gguf(&gguf)?;
        let weights = Weights::load(&gguf, &config)?;
        let tokenizer = Tokenizer::from_metadata(&gguf.metadata)?;
        if tokenizer.n_vocab() > config.n_vocab {
            return Err(ModelError::Shape {
                tensor: "token_embd.weight".into(),
                want: format!("at least {} rows (the vocabulary)", tokenizer.n_vocab()),
                got: format!("{} rows", config.n_vocab),
            });
        }
        // Failing to advise only costs speed; report nothing.
        let _ = gguf.advise_willneed();
        if opts.mlock {
            gguf.lock()?;
        }
        ops::warm_up();
        Ok(Model {
            gguf,
            config,
            weights,
            tokenizer,
            pool: Pool::new(opts.threads),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    pub fn n_ctx_train(&self) -> usize {
        self.config.n_ctx_train
    }

    /// `general.name`, else the architecture.
    pub fn name(&self) -> &str {
        let md = &self.gguf.metadata;
        md.str("general.name")
            .or_else(|_| md.str("general.architecture"))
            .unwrap_or("model")
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.gguf.metadata.str("tokenizer.chat_template").ok()
    }

    /// A session with room for `n_ctx` tokens; all its memory is allocated here.
    pub fn new_session(&self, n_ctx: usize) -> Session {
        Session::new(self, n_ctx)
    }

    /// Bytes of weights one token's forward pass reads ([`weight_bytes_per_token`]).
    pub fn weight_bytes_per_token(&self) -> u64 {
        weight_bytes_per_token(&self.weights)
    }

    /// Bytes a session of `n_ctx` allocates: (KV cache, scratch).
    pub fn session_bytes(&self, n_ctx: usize) -> (u64, u64) {
        (
            KvCache::bytes(&self.config, n_ctx),
            Session::scratch_bytes(&self.config, &self.weights, self.threads(), n_ctx),
        )
    }
}
