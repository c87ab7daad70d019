//! Hyper-parameters of the supported architectures, read from GGUF metadata.

use crate::gguf::{Gguf, GgufError, Metadata};

/// The architectures this engine computes. Each differs from the others only where a field of
/// [`Config`] says so, so the forward pass is one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Gemma3,
    Llama,
    Qwen2,
}

impl Arch {
    pub const SUPPORTED: [&'static str; 3] = ["gemma3", "llama", "qwen2"];

    fn from_name(name: &str) -> Option<Arch> {
        match name {
            "gemma3" => Some(Arch::Gemma3),
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            _ => None,
        }
    }
}

/// How RoPE pairs the elements of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): Llama, whose converter permutes Q/K rows to match.
    Normal,
    /// Halves (i, i + n_rot/2): GPT-NeoX, Qwen2, Gemma 3. The wrong one corrupts attention.
    Neox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU(gate) * up.
    SwiGlu,
    /// GELU-tanh(gate) * up, through ggml's fp16 table.
    GeGlu,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    pub rope_style: RopeStyle,
    pub n_rot: usize,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (Gemma 3: 10,000, hard-coded as llama.cpp does).
    pub rope_base_swa: f32,
    /// Sliding-window size, for architectures that have local layers.
    pub sliding_window: Option<usize>,
    /// Every `swa_pattern`-th layer is global; the others are local (Gemma 3: 6).
    pub swa_pattern: usize,
    pub activation: Activation,
    /// Gemma: embeddings are scaled by sqrt(n_embd).
    pub embed_scale: Option<f32>,
    /// Gemma 3: Q is scaled by this before the dot product (instead of scaling the scores).
    pub q_prescale: bool,
    /// Gemma 3: RMSNorm after attention and after the FFN, and per-head norms on Q and K.
    pub sandwich_norms: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("architecture `{0}` is not supported; supported architectures: {list}", list = Arch::SUPPORTED.join(", "))]
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
        let arch =
            Arch::from_name(name).ok_or_else(|| ConfigError::UnsupportedArch(name.into()))?;
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
        let gemma = arch == Arch::Gemma3;
        let embd = g.tensor("token_embd.weight")?;
        let n_vocab = embd.info.n_rows();
        let sliding_window = if gemma {
            md.opt(&key("attention.sliding_window"), Metadata::usize)?
                .filter(|&w| w > 0)
        } else {
            None
        };
        Ok(Config {
            arch,
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
            rope_style: if arch == Arch::Llama {
                RopeStyle::Normal
            } else {
                RopeStyle::Neox
            },
            n_rot,
            rope_base: md
                .opt(&key("rope.freq_base"), Metadata::f32)?
                .unwrap_or(10_000.0),
            rope_base_swa: 10_000.0,
            sliding_window,
            swa_pattern: 6,
            activation: if gemma {
                Activation::GeGlu
            } else {
                Activation::SwiGlu
            },
            embed_scale: gemma.then(|| (n_embd as f32).sqrt()),
            q_prescale: gemma,
            sandwich_norms: gemma,
        })
    }

    /// Whether layer `il` attends only to the last `sliding_window` positions.
    pub fn is_local(&self, il: usize) -> bool {
        self.sliding_window.is_some() && il % self.swa_pattern < self.swa_pattern - 1
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// KV cells layer `il` needs for a context of `n_ctx`: a ring of the window for local
    /// layers, the whole context for global ones.
    pub fn kv_cells(&self, il: usize, n_ctx: usize) -> usize {
        match self.sliding_window {
            Some(w) if self.is_local(il) => w.min(n_ctx),
            _ => n_ctx,
        }
    }
}
