//! What crosses between a front end and the decode thread: the job going in, its events
//! coming out, and why a job was refused.

use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::generation::{FinishReason, Generation, Usage};
use crate::sampler::TokenLogprob;

/// A generation request, tokenized and validated.
pub(super) struct Job {
    pub prompt: Vec<u32>,
    pub generation: Generation,
    /// When the request must be done, queueing included.
    pub deadline: Instant,
    pub events: UnboundedSender<Event>,
}

/// The events of one job, in order. Dropping the receiver cancels the job: its slot is freed at
/// its next step.
pub type Events = UnboundedReceiver<Event>;

/// What a slot reports to the job's owner.
#[derive(Debug)]
pub enum Event {
    /// The next piece of completion text (never part of a stop sequence), and the
    /// log-probabilities of the tokens generated since the last piece (when asked for; a token
    /// whose text is held back, e.g. half a UTF-8 character, comes with a later piece).
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The last event of a job that ran to its end.
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    Failed(JobFailure),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobFailure {
    /// The per-request time limit passed.
    Timeout,
    /// The server is shutting down and its deadline for in-flight work passed.
    ShuttingDown,
    /// The engine failed; the message is for the log.
    Engine(String),
}

/// Why [`Engine::submit`](super::Engine::submit) refused a job.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No token to start from.
    EmptyPrompt,
    /// The prompt leaves no room in the context for a generated token (nothing is truncated).
    PromptTooLong {
        tokens: usize,
        n_ctx: usize,
    },
    /// Every slot is busy and the queue is full.
    QueueFull {
        queue: usize,
    },
    ShuttingDown,
}
