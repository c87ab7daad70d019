//! `POST /v1/chat/completions` and `POST /v1/completions`: validate, tokenize, queue, then
//! answer in one JSON body or as server-sent events, as OpenAI does.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::serve::chat_template::Turn;
use crate::serve::error::ApiError;
use crate::serve::json::{from_value, JsonBody};
use crate::serve::openai::*;
use crate::serve::scheduler::{Event, Job, JobFailure, Refused};
use crate::serve::AppState;

/// How long a client should wait before retrying when the queue is full.
const RETRY_AFTER_SECS: u64 = 1;

pub async fn chat(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    state.engine()?;
    let req: ChatRequest = from_value(&body)?;
    let generation = from_value::<GenerationRequest>(&body)?.validate()?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages is empty: send at least one message",
        ));
    }
    let turns = req
        .messages
        .iter()
        .map(|m| {
            Ok(Turn {
                role: m.role.clone(),
                content: m.text()?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let prompt = blocking(state.clone(), move |state| {
        let engine = state.engine()?;
        let text = engine
            .template
            .render(&turns)
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
        // The template's text starts without BOS; the tokenizer adds exactly one.
        Ok(engine.model.tokenizer().encode(&text, true, true))
    })
    .await?;
    generate(&state, prompt, generation, Kind::Chat).await
}

pub async fn completions(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    state.engine()?;
    let req: CompletionRequest = from_value(&body)?;
    let generation = from_value::<GenerationRequest>(&body)?.validate()?;
    let prompt = match req.prompt.into_input()? {
        PromptInput::Tokens(ids) => {
            let n_vocab = state.engine()?.model.tokenizer().n_vocab();
            check_token_ids(&ids, n_vocab, "prompt")?;
            ids
        }
        PromptInput::Text(text) => {
            blocking(state.clone(), move |state| {
                // As llama-server: BOS added where the vocabulary wants it, control tokens parsed.
                Ok(state.engine()?.model.tokenizer().encode(&text, true, true))
            })
            .await?
        }
    };
    generate(&state, prompt, generation, Kind::Completion).await
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

/// Runs CPU work (templating, tokenizing) on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    state: AppState,
    work: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || work(&state))
        .await
        .map_err(|e| ApiError::Internal(format!("tokenizer task failed: {e}")))?
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// What every response and chunk of one request repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    include_usage: bool,
}

async fn generate(
    state: &AppState,
    prompt: Vec<u32>,
    generation: Generation,
    kind: Kind,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let n_ctx = engine.scheduler.n_ctx();
    if prompt.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    // No silent truncation: at least one token must be generated after the prompt.
    if prompt.len() >= n_ctx {
        return Err(ApiError::bad_param(
            if kind == Kind::Chat { "messages" } else { "prompt" },
            format!(
                "the prompt is {} tokens but the context holds {n_ctx} (the prompt must leave room for at least one generated token); shorten the prompt or start the server with a larger --ctx-size",
                prompt.len()
            ),
        ));
    }
    let meta = Meta {
        id: new_id(kind),
        created: unix_now(),
        model: engine.model_id.clone(),
        kind,
        include_usage: generation.include_usage,
    };
    let stream = generation.stream;
    let (events, mut rx) = unbounded_channel();
    let job = Job {
        prompt,
        generation,
        deadline: Instant::now() + state.http().request_timeout,
        events,
    };
    engine
        .scheduler
        .submit(job)
        .map_err(|refused| match refused {
            Refused::QueueFull { queue } => ApiError::Overloaded {
                queue,
                retry_after: RETRY_AFTER_SECS,
            },
            Refused::ShuttingDown => ApiError::ShuttingDown,
        })?;

    let timeout = state.http().request_timeout.as_secs();
    // Waiting for the first event lets queueing failures be HTTP errors even when streaming.
    let first = rx.recv().await;
    if let Some(Event::Failed(failure)) = first {
        return Err(failure_error(failure, timeout));
    }
    if stream {
        Ok(sse(meta, first, rx, timeout).into_response())
    } else {
        collect(meta, first, rx, timeout).await
    }
}

fn failure_error(failure: JobFailure, timeout_secs: u64) -> ApiError {
    match failure {
        JobFailure::Timeout => ApiError::Timeout { secs: timeout_secs },
        JobFailure::ShuttingDown => ApiError::ShuttingDown,
        JobFailure::Engine(message) => ApiError::Internal(format!("generation failed: {message}")),
    }
}

/// The non-streaming answer: all text, then one JSON body.
async fn collect(
    meta: Meta,
    mut next: Option<Event>,
    mut rx: UnboundedReceiver<Event>,
    timeout: u64,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        match next {
            Some(Event::Text(piece)) => text.push_str(&piece),
            Some(Event::Done { finish, usage }) => {
                return Ok(final_body(&meta, text, finish, usage))
            }
            Some(Event::Failed(failure)) => return Err(failure_error(failure, timeout)),
            None => {
                return Err(ApiError::Internal(
                    "the decode thread dropped a request".into(),
                ))
            }
        }
        next = rx.recv().await;
    }
}

fn final_body(meta: &Meta, text: String, finish: FinishReason, usage: Usage) -> Response {
    match meta.kind {
        Kind::Chat => Json(ChatCompletion {
            id: &meta.id,
            object: "chat.completion",
            created: meta.created,
            model: &meta.model,
            choices: [ChatChoice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant",
                    content: text,
                },
                logprobs: None,
                finish_reason: finish,
            }],
            usage,
        })
        .into_response(),
        Kind::Completion => Json(TextCompletion {
            id: &meta.id,
            object: "text_completion",
            created: meta.created,
            model: &meta.model,
            choices: vec![TextChoice {
                index: 0,
                text: &text,
                logprobs: None,
                finish_reason: Some(finish),
            }],
            usage: Some(Some(usage)),
        })
        .into_response(),
    }
}

/// The streaming answer. Dropping it (the client left) drops `rx`, which cancels the job.
fn sse(
    meta: Meta,
    first: Option<Event>,
    rx: UnboundedReceiver<Event>,
    timeout: u64,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let mut out = VecDeque::new();
    if meta.kind == Kind::Chat {
        // OpenAI opens a chat stream with the role and empty content.
        out.push_back(meta.chunk(Some("assistant"), Some(""), None));
    }
    let state = SseState {
        meta,
        rx,
        next: first,
        out,
        ended: false,
        timeout,
    };
    let events = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.out.pop_front() {
                return Some((Ok(event), st));
            }
            if st.ended {
                return None;
            }
            let event = match st.next.take() {
                Some(event) => Some(event),
                None => st.rx.recv().await,
            };
            st.translate(event);
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

struct SseState {
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    /// An event received before the stream started.
    next: Option<Event>,
    out: VecDeque<SseEvent>,
    ended: bool,
    timeout: u64,
}

impl SseState {
    /// Queues the SSE events for one scheduler event.
    fn translate(&mut self, event: Option<Event>) {
        match event {
            Some(Event::Text(text)) => {
                let chunk = self.meta.chunk(None, Some(&text), None);
                self.out.push_back(chunk);
            }
            Some(Event::Done { finish, usage }) => {
                let last = self.meta.chunk(None, None, Some(finish));
                self.out.push_back(last);
                if self.meta.include_usage {
                    let usage = self.meta.usage_chunk(usage);
                    self.out.push_back(usage);
                }
                self.out.push_back(SseEvent::default().data("[DONE]"));
                self.ended = true;
            }
            Some(Event::Failed(failure)) => {
                self.fail(failure_error(failure, self.timeout));
            }
            None => self.fail(ApiError::Internal(
                "the decode thread dropped a request".into(),
            )),
        }
    }

    /// A failure after the stream started: an `error` event (the SDKs raise it), then the end.
    fn fail(&mut self, error: ApiError) {
        if let ApiError::Internal(detail) = &error {
            tracing::error!("{detail}");
        }
        self.out.push_back(json_event(&error.body()));
        self.ended = true;
    }
}

impl Meta {
    /// One chunk: for chat a `delta`, for completions the `text`.
    fn chunk(
        &self,
        role: Option<&'static str>,
        text: Option<&str>,
        finish: Option<FinishReason>,
    ) -> SseEvent {
        let usage = self.include_usage.then_some(None);
        match self.kind {
            Kind::Chat => json_event(&ChatChunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: vec![ChunkChoice {
                    index: 0,
                    delta: Delta {
                        role,
                        content: text,
                    },
                    logprobs: None,
                    finish_reason: finish,
                }],
                usage,
            }),
            Kind::Completion => json_event(&TextCompletion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: vec![TextChoice {
                    index: 0,
                    text: text.unwrap_or(""),
                    logprobs: None,
                    finish_reason: finish,
                }],
                usage,
            }),
        }
    }

    /// The extra last chunk of `stream_options.include_usage`: no choices, the usage.
    fn usage_chunk(&self, usage: Usage) -> SseEvent {
        match self.kind {
            Kind::Chat => json_event(&ChatChunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: vec![],
                usage: Some(Some(usage)),
            }),
            Kind::Completion => json_event(&TextCompletion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: vec![],
                usage: Some(Some(usage)),
            }),
        }
    }
}

fn json_event(value: &impl Serialize) -> SseEvent {
    // Serializing our own response structs cannot fail (no maps with non-string keys).
    SseEvent::default().data(serde_json::to_string(value).unwrap_or_default())
}

/// `chatcmpl-…` / `cmpl-…`: unique within the process and unlikely to repeat across restarts.
fn new_id(kind: Kind) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    format!("{prefix}-{:x}{n:06x}", unix_now())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
