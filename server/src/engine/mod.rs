//! The engine: a loaded model, its slots and the decode thread. Prompts go in as token ids with
//! [`Generation`] settings; text comes out as [`Event`]s. Nothing here knows HTTP or the shape of
//! any API: `serve/` translates OpenAI requests into these types and events into responses.

pub mod chat_template;
mod counters;
mod draft;
mod generation;
mod job;
mod scheduler;
pub mod slot_store;
mod stop;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::Model;
use crate::tokenizer::TooManyTokens;
use chat_template::{ChatTemplate, TemplateError, Turn};
use job::Job;
use scheduler::Scheduler;
use slot_store::{SlotAction, SlotError, SlotOp, SlotOutcome, SlotStore};

pub use counters::{Counters, Liveness};

/// The decode thread's name: a panic on it ends the process (`serve` installs the hook).
pub const DECODE_THREAD: &str = "decode";
pub use generation::{FinishReason, Generation, Usage};
pub use job::{End, Event, Events, JobFailure, Piece, Refused};
pub use stop::StopMatcher;

/// How many jobs run and wait, and how much each may hold.
#[derive(Debug, Clone, Copy)]
pub struct Slots {
    /// Jobs generated at the same time, each in its own session.
    pub parallel: usize,
    /// Tokens of context per slot (prompt and generated text).
    pub n_ctx: usize,
    /// Jobs that may wait for a slot; beyond this [`Engine::submit`] refuses.
    pub queue: usize,
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The decode thread could not be spawned.
    #[error(transparent)]
    Thread(#[from] std::io::Error),
}

/// Why a prompt was not built.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// It takes more tokens than the context leaves room for (counted as it was tokenized).
    #[error("the prompt takes at least {} tokens", .0.at_least)]
    TooLong(#[from] TooManyTokens),
}

pub struct Engine {
    model: Arc<Model>,
    template: ChatTemplate,
    scheduler: Scheduler,
}

impl Engine {
    /// Reads the model's chat template, allocates every slot's session and starts the decode
    /// thread.
    pub fn start(
        model: Arc<Model>,
        slots: Slots,
        counters: Arc<Counters>,
    ) -> Result<Engine, StartError> {
        Self::start_with_store(model, slots, counters, None)
    }

    /// [`Engine::start`], with the slots restored from `store` first and saved to it
    /// ([`slot_store`]).
    pub fn start_with_store(
        model: Arc<Model>,
        slots: Slots,
        counters: Arc<Counters>,
        store: Option<SlotStore>,
    ) -> Result<Engine, StartError> {
        let template = ChatTemplate::for_model(&model)?;
        let scheduler = Scheduler::start(model.clone(), slots, counters, store)?;
        Ok(Engine {
            model,
            template,
            scheduler,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The model, for what outlives a borrow of the engine (a streamed answer writing out
    /// token texts from its vocabulary).
    pub fn shared_model(&self) -> Arc<Model> {
        self.model.clone()
    }

    /// Each slot's context size.
    pub fn n_ctx(&self) -> usize {
        self.scheduler.n_ctx()
    }

    /// The prompt for a chat: the turns in the model's template, offering the functions
    /// `tools` (OpenAI's `tools` list, may be empty), then the opening of the assistant's turn.
    /// The template's own markup is read for control tokens; what the client wrote (contents,
    /// roles, calls, tools) is plain text unless `parse_special_in_content` (llama.cpp's way,
    /// under which `<end_of_turn>` in a user's text ends the turn).
    pub fn chat_prompt(
        &self,
        turns: &[Turn],
        tools: &[serde_json::Value],
        parse_special_in_content: bool,
    ) -> Result<Vec<u32>, PromptError> {
        self.template.tokens(
            self.model.tokenizer(),
            turns,
            tools,
            parse_special_in_content,
            self.max_prompt_tokens(),
        )
    }

    /// The prompt for a text to continue. As llama-server: BOS added where the vocabulary wants
    /// it, control-token texts such as `<start_of_turn>` read as those tokens.
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        let max = self.max_prompt_tokens();
        Ok(self
            .model
            .tokenizer()
            .encode_within(text, true, true, max)?)
    }

    /// The longest prompt [`Engine::submit`] takes: one token of the context is left to generate.
    /// A text too long for it is refused while it is tokenized, not after: tokenizing costs
    /// tens of times the text's size.
    fn max_prompt_tokens(&self) -> usize {
        self.n_ctx().saturating_sub(1)
    }

    /// Queues a generation from `prompt` that must end by `deadline`; its events arrive on the
    /// returned receiver. The prompt must leave room for at least one generated token.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        generation: Generation,
        deadline: Instant,
    ) -> Result<Events, Refused> {
        let n_ctx = self.n_ctx();
        if prompt.is_empty() {
            return Err(Refused::EmptyPrompt);
        }
        if prompt.len() >= n_ctx {
            return Err(Refused::PromptTooLong {
                tokens: prompt.len(),
                n_ctx,
            });
        }
        let (output, events) = job::pipe();
        self.scheduler.submit(Job {
            prompt,
            generation,
            deadline,
            output,
        })?;
        Ok(events)
    }

    /// Whether slots can be saved and restored (`--slot-save-path`).
    pub fn has_slot_store(&self) -> bool {
        self.scheduler.has_store()
    }

    /// Runs `action` on slot `slot` once it is free, with `file` a name inside the store's
    /// directory (checked by the caller with [`slot_store::check_file_name`]); blocks for at
    /// most `wait`.
    pub fn slot_action(
        &self,
        slot: usize,
        action: SlotAction,
        file: String,
        wait: Duration,
    ) -> Result<SlotOutcome, SlotError> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.scheduler.submit_op(SlotOp {
            slot,
            action,
            file,
            reply,
        })?;
        answer
            .recv_timeout(wait)
            .unwrap_or(Err(SlotError::TimedOut))
    }

    /// Fails every queued and running job with [`JobFailure::ShuttingDown`], refuses new ones
    /// and waits for the decode thread to end.
    pub fn stop(&self) {
        self.scheduler.stop();
    }
}
