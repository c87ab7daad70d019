//! A model's hyper-parameters: its architecture's [`ArchSpec`] row and the sizes read from its
//! GGUF metadata.

use super::arch::ArchSpec;
use crate::gguf::{Gguf, GgufError, Metadata};

#[derive(Clone, Debug)]
pub struct Config {
    /// What the architecture computes differently from the others.
    pub spec: &'static ArchSpec,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    /// Rotated elements of each head (the first `n_rot`; the rest pass through).
    pub n_rot: usize,
    /// RoPE base of the global layers (`rope.freq_base`).
    pub rope_base: f32,
    /// Sliding-window size, where the architecture has local layers and the file gives one.
    pub sliding_window: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("architecture `{0}` is not supported; supported architectures: {list}", list = ArchSpec::names().collect::<Vec<_>>().join(", "))]
    UnsupportedArch(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("inconsistent hyper-parameters: {0}")]
    Inconsistent(String),
}

impl Config {
    /// The config of a model file; the vocabulary size is the embedding's row count.
    pub fn from_gguf(g: &Gguf) -> Result<Config, ConfigError> {
        let md = &g.metadata;
        let name = md.str("general.architecture")?;
        let spec =
            ArchSpec::by_name(name).ok_or_else(|| ConfigError::UnsupportedArch(name.into()))?;
        let key = |k: &str| format!("{name}.{k}");
        let n_embd = md.usize(&key("embedding_length"))?;
        let n_head = md.usize(&key("attention.head_count"))?;
        let n_head_kv = md
            .opt(&key("attention.head_count_kv"), Metadata::usize)?
            .unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ConfigError::Inconsistent(format!(
                "{n_head} attention heads cannot be shared by {n_head_kv} KV heads"
            )));
        }
        let head_dim = md
            .opt(&key("attention.key_length"), Metadata::usize)?
            .unwrap_or(n_embd / n_head);
        let v_dim = md
            .opt(&key("attention.value_length"), Metadata::usize)?
            .unwrap_or(head_dim);
        if v_dim != head_dim || head_dim == 0 || head_dim % 2 != 0 {
            return Err(ConfigError::Inconsistent(format!(
                "key length {head_dim} and value length {v_dim} must be equal and even"
            )));
        }
        let n_rot = md
            .opt(&key("rope.dimension_count"), Metadata::usize)?
            .unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ConfigError::Inconsistent(format!(
                "rope.dimension_count {n_rot} must be even and at most the head size {head_dim}"
            )));
        }
        let embd = g.tensor("token_embd.weight")?;
        let n_vocab = embd.info.n_rows();
        let sliding_window = match spec.swa {
            Some(_) => md
                .opt(&key("attention.sliding_window"), Metadata::usize)?
                .filter(|&w| w > 0),
            None => None,
        };
        Ok(Config {
            spec,
            n_embd,
            n_layer: md.usize(&key("block_count"))?,
            n_ff: md.usize(&key("feed_forward_length"))?,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train: md
                .opt(&key("context_length"), Metadata::usize)?
                .unwrap_or(2048),
            norm_eps: md.f32(&key("attention.layer_norm_rms_epsilon"))?,
            n_rot,
            rope_base: md
                .opt(&key("rope.freq_base"), Metadata::f32)?
                .unwrap_or(10_000.0),
            sliding_window,
        })
    }

    /// The sliding window of layer `il`, if it is a local layer.
    pub fn window(&self, il: usize) -> Option<usize> {
        let swa = self.spec.swa?;
        let w = self.sliding_window?;
        (il % swa.pattern < swa.pattern - 1).then_some(w)
    }

    /// The RoPE base of the sliding-window layers, if the model has any.
    pub fn local_rope_base(&self) -> Option<f32> {
        self.sliding_window
            .and(self.spec.swa)
            .map(|swa| swa.rope_base)
    }

    /// Embeddings are multiplied by this (Gemma: sqrt(n_embd)).
    pub fn embed_scale(&self) -> Option<f32> {
        self.spec.embed_scale.then(|| (self.n_embd as f32).sqrt())
    }

    /// Q·K scores are multiplied by this, or Q before the product where the spec says so.
    pub fn attn_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Q width of one token: `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// K (and V) width of one token: `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
