//! The supported architectures as data: one [`ArchSpec`] row each in [`ARCHS`]. The forward
//! pass is one function that reads these rows; it never asks which architecture it runs.
//! Adding a llama-like architecture is one row here (and its synthetic golden files).

/// The architectures this engine computes, named as in `general.architecture`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Gemma3,
    Llama,
    Qwen2,
    Qwen3,
}

/// How RoPE pairs the elements of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): Llama, whose converter permutes Q/K rows to match.
    Normal,
    /// Halves (i, i + n_rot/2): GPT-NeoX, Qwen2, Qwen3, Gemma 3. The wrong one corrupts attention.
    Neox,
}

/// The gated feed-forward's activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ffn {
    /// SiLU(gate) * up.
    SwiGlu,
    /// GELU-tanh(gate) * up, through ggml's fp16 table.
    GeGlu,
}

/// Local (sliding-window) attention layers interleaved with global ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Swa {
    /// Every `pattern`-th layer is global; the others attend to the last
    /// `attention.sliding_window` positions only.
    pub pattern: usize,
    /// RoPE base of the local layers (a constant in llama.cpp, not a GGUF key).
    pub rope_base: f32,
}

/// Everything that tells one architecture's forward pass from another's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchSpec {
    pub arch: Arch,
    /// `general.architecture`, which is also the prefix of its hyper-parameter keys.
    pub name: &'static str,
    pub rope: RopeStyle,
    pub ffn: Ffn,
    /// Per-head RMSNorm of Q and K before RoPE (`attn_{q,k}_norm`, one weight shared by heads).
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before their residual adds
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Embeddings are multiplied by sqrt(n_embd).
    pub embed_scale: bool,
    /// Q is multiplied by 1/sqrt(head_dim) before the products with K instead of the scores
    /// after them (the same value, rounded at another point).
    pub q_prescale: bool,
    /// Sliding-window layers, where the file gives a window.
    pub swa: Option<Swa>,
}

pub const ARCHS: &[ArchSpec] = &[
    ArchSpec {
        arch: Arch::Gemma3,
        name: "gemma3",
        rope: RopeStyle::Neox,
        ffn: Ffn::GeGlu,
        qk_norm: true,
        post_norms: true,
        embed_scale: true,
        q_prescale: true,
        swa: Some(Swa {
            pattern: 6,
            rope_base: 10_000.0,
        }),
    },
    ArchSpec {
        arch: Arch::Llama,
        name: "llama",
        rope: RopeStyle::Normal,
        ffn: Ffn::SwiGlu,
        qk_norm: false,
        post_norms: false,
        embed_scale: false,
        q_prescale: false,
        swa: None,
    },
    ArchSpec {
        arch: Arch::Qwen2,
        name: "qwen2",
        rope: RopeStyle::Neox,
        ffn: Ffn::SwiGlu,
        qk_norm: false,
        post_norms: false,
        embed_scale: false,
        q_prescale: false,
        swa: None,
    },
    ArchSpec {
        arch: Arch::Qwen3,
        name: "qwen3",
        rope: RopeStyle::Neox,
        ffn: Ffn::SwiGlu,
        qk_norm: true,
        post_norms: false,
        embed_scale: false,
        q_prescale: false,
        swa: None,
    },
];

impl ArchSpec {
    /// The row of `general.architecture` = `name`.
    pub fn by_name(name: &str) -> Option<&'static ArchSpec> {
        ARCHS.iter().find(|a| a.name == name)
    }

    /// The supported names, for error messages.
    pub fn names() -> impl Iterator<Item = &'static str> {
        ARCHS.iter().map(|a| a.name)
    }
}

impl Arch {
    pub fn spec(self) -> &'static ArchSpec {
        ARCHS
            .iter()
            .find(|a| a.arch == self)
            .expect("every Arch has a row in ARCHS")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_found_by_its_name_and_its_arch() {
        for spec in ARCHS {
            assert_eq!(ArchSpec::by_name(spec.name), Some(spec));
            assert_eq!(spec.arch.spec(), spec);
        }
        assert_eq!(ArchSpec::by_name("mamba"), None);
    }
}
