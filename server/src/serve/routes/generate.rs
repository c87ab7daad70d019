//! `POST /v1/chat/completions` and `POST /v1/completions`: check, tokenize, submit to the
//! engine, then answer ([`answer`](super::answer)).

use std::time::Instant;

use axum::extract::State;
use axum::response::Response;

use super::answer::{self, Kind};
use super::blocking;
use crate::engine::{Generation, Refused};
use crate::serve::error::ApiError;
use crate::serve::extract::JsonBody;
use crate::serve::openai::{ChatRequest, Checked, CompletionRequest, Delivery, PromptInput};
use crate::serve::AppState;

/// How long a client should wait before retrying when the queue is full.
const RETRY_AFTER_SECS: u64 = 1;

pub async fn chat(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    // While the model loads, 503 comes before any complaint about the request's values.
    state.engine()?;
    let Checked {
        input: turns,
        generation,
        delivery,
    } = req.check()?;
    let prompt = blocking(&state, "tokenizer", move |engine| {
        let prompt = engine.chat_prompt(&turns);
        prompt.map_err(|e| ApiError::bad_param("messages", e.to_string()))
    })
    .await?;
    generate(&state, prompt, generation, delivery, Kind::Chat).await
}

pub async fn completions(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    state.engine()?;
    let Checked {
        input,
        generation,
        delivery,
    } = req.check()?;
    let prompt = match input {
        PromptInput::Tokens(ids) => {
            let n_vocab = state.engine()?.model().tokenizer().n_vocab();
            check_token_ids(&ids, n_vocab, "prompt")?;
            ids
        }
        PromptInput::Text(text) => {
            blocking(&state, "tokenizer", move |e| Ok(e.text_prompt(&text))).await?
        }
    };
    generate(&state, prompt, generation, delivery, Kind::Completion).await
}

/// Refuses ids the model does not have, naming the first.
pub fn check_token_ids(ids: &[u32], n_vocab: usize, param: &'static str) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= n_vocab) {
        Some(id) => Err(ApiError::bad_param(
            param,
            format!("token id {id} is outside the vocabulary of {n_vocab} tokens"),
        )),
        None => Ok(()),
    }
}

/// Submits the job, then answers as the request asked.
async fn generate(
    state: &AppState,
    prompt: Vec<u32>,
    mut generation: Generation,
    delivery: Delivery,
    kind: Kind,
) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    generation.max_tokens = generation.max_tokens.or(state.http().default_max_tokens);
    let timeout = state.http().request_timeout;
    let events = ready
        .engine
        .submit(prompt, generation, Instant::now() + timeout)
        .map_err(|refused| refused_error(refused, kind))?;
    answer::answer(&ready.model_id, kind, delivery, events, timeout.as_secs()).await
}

fn refused_error(refused: Refused, kind: Kind) -> ApiError {
    match refused {
        Refused::EmptyPrompt => ApiError::bad_param("prompt", "the prompt is empty"),
        // No silent truncation: at least one token must be generated after the prompt.
        Refused::PromptTooLong { tokens, n_ctx } => ApiError::bad_param(
            match kind {
                Kind::Chat => "messages",
                Kind::Completion => "prompt",
            },
            format!(
                "the prompt is {tokens} tokens but the context holds {n_ctx} (the prompt must leave room for at least one generated token); shorten the prompt or start the server with a larger --ctx-size"
            ),
        ),
        Refused::QueueFull { queue } => ApiError::Overloaded {
            queue,
            retry_after: RETRY_AFTER_SECS,
        },
        Refused::ShuttingDown => ApiError::ShuttingDown,
    }
}
