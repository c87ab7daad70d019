//! What a generation is asked to do, and what it reports at the end.

use crate::grammar::Constraint;
use crate::sampler::SamplerParams;

/// Validated generation settings.
#[derive(Debug, Clone)]
pub struct Generation {
    pub sampler: SamplerParams,
    /// `None`: until the end of the context.
    pub max_tokens: Option<usize>,
    /// Texts that end the generation; none of them is empty.
    pub stop: Vec<String>,
    /// What the output must be (a JSON schema, a grammar); each token is sampled among the
    /// ones it allows, and the generation stops when it is complete and nothing can follow.
    pub constraint: Option<Constraint>,
    /// Report each token's log-probability with this many alternatives (at most 20).
    pub logprobs: Option<usize>,
    /// Start from the longest prefix of the prompt a slot's cache holds (llama-server's
    /// `cache_prompt`); false evaluates the whole prompt.
    pub cache_prompt: bool,
    /// Draft tokens by prompt lookup and verify them in one pass, where that pays (the output
    /// is the same either way).
    pub speculative: bool,
    /// Write control tokens (`<start_of_turn>`, `<|im_end|>`) as their text; without it they are
    /// nothing, as in llama-server without `--special`.
    pub special: bool,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, or a constrained output that is complete.
    Stop,
    /// The stop sequence of this index in [`Generation::stop`] was written (and withheld).
    StopSequence(usize),
    /// max_tokens reached, or the context is full.
    Length,
}

/// Tokens read and written by one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Of the prompt tokens, those taken from the slot's cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}
