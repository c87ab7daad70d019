//! What a generation is asked to do, and what it reports at the end.

use crate::sampler::SamplerParams;

/// Validated generation settings.
#[derive(Debug, Clone)]
pub struct Generation {
    pub sampler: SamplerParams,
    /// `None`: until the end of the context.
    pub max_tokens: Option<usize>,
    /// Texts that end the generation; none of them is empty.
    pub stop: Vec<String>,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop sequence.
    Stop,
    /// max_tokens reached, or the context is full.
    Length,
}

/// Tokens read and written by one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}
