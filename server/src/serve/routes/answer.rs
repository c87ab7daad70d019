//! The answer to a generating request, as OpenAI gives it: all text in one JSON body, or a
//! stream of server-sent events, a chunk per piece of text.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use serde::Serialize;

use crate::engine::chat_template::ToolSyntax;
use crate::engine::{Event, Events, FinishReason, JobFailure, Usage};
use crate::sampler::TokenLogprob;
use crate::serve::error::ApiError;
use crate::serve::openai::tools;
use crate::serve::openai::{
    chat_logprobs, completion_logprobs, finish_reason, AssistantMessage, ChatChoice, ChatChunk,
    ChatCompletion, ChunkChoice, Delivery, Delta, TextChoice, TextCompletion,
};
use crate::serve::unix_now;

/// Which endpoint is answered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
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
    logprobs: bool,
    tools: Option<ToolSyntax>,
}

/// Answers from the events of a submitted job. Waiting for the first event lets queueing
/// failures (time limit, shutdown) be HTTP errors even when streaming.
pub async fn answer(
    model: &str,
    kind: Kind,
    delivery: Delivery,
    mut events: Events,
    timeout_secs: u64,
) -> Result<Response, ApiError> {
    let meta = Meta {
        id: new_id(kind),
        created: unix_now(),
        model: model.to_owned(),
        kind,
        include_usage: delivery.include_usage,
        logprobs: delivery.logprobs,
        tools: delivery.tools,
    };
    let first = events.recv().await;
    if let Some(Event::Failed(failure)) = first {
        return Err(failure_error(failure, timeout_secs));
    }
    if delivery.stream {
        Ok(sse(meta, first, events, timeout_secs).into_response())
    } else {
        collect(meta, first, events, timeout_secs).await
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
    mut rx: Events,
    timeout: u64,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        match next {
            Some(Event::Text {
                text: piece,
                logprobs: l,
            }) => {
                text.push_str(&piece);
                logprobs.extend(l);
            }
            Some(Event::Done { finish, usage }) => {
                return Ok(final_body(&meta, text, &logprobs, finish, usage))
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

fn final_body(
    meta: &Meta,
    text: String,
    logprobs: &[TokenLogprob],
    finish: FinishReason,
    usage: Usage,
) -> Response {
    let logprobs = meta.logprobs.then(|| match meta.kind {
        Kind::Chat => chat_logprobs(logprobs),
        Kind::Completion => completion_logprobs(logprobs, &mut 0),
    });
    let (content, calls) = match meta.tools {
        Some(syntax) if meta.kind == Kind::Chat => tools::parse(syntax, &text),
        _ => (Some(text.clone()), Vec::new()),
    };
    let (finish, tool_calls) = if calls.is_empty() {
        (finish_reason(finish), None)
    } else {
        let mut entries = tools::tool_calls_json(&calls, &meta.id);
        for e in &mut entries {
            // `index` belongs to streamed deltas only.
            if let Some(o) = e.as_object_mut() {
                o.remove("index");
            }
        }
        ("tool_calls", Some(entries))
    };
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
                    content,
                    tool_calls,
                },
                logprobs,
                finish_reason: finish,
            }],
            usage: usage.into(),
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
                logprobs,
                finish_reason: Some(finish),
            }],
            usage: Some(Some(usage.into())),
        })
        .into_response(),
    }
}

/// The streaming answer. Dropping it (the client left) drops `rx`, which cancels the job.
fn sse(
    meta: Meta,
    first: Option<Event>,
    rx: Events,
    timeout: u64,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let mut out = VecDeque::new();
    if meta.kind == Kind::Chat {
        // OpenAI opens a chat stream with the role and empty content.
        out.push_back(meta.chunk(Some("assistant"), Some(""), None, None));
    }
    let state = SseState {
        meta,
        rx,
        next: first,
        out,
        ended: false,
        timeout,
        text_offset: 0,
        held: None,
        held_logprobs: Vec::new(),
    };
    let mut state = state;
    if state.meta.tools.is_some() {
        state.held = Some(String::new());
    }
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
    rx: Events,
    /// An event received before the stream started.
    next: Option<Event>,
    out: VecDeque<SseEvent>,
    ended: bool,
    timeout: u64,
    /// Characters of completion text sent so far (completions' `text_offset`).
    text_offset: usize,
    /// With tools: the text so far while it may be a tool call (sent as content once it
    /// cannot be, parsed into `tool_calls` at the end if it is one).
    held: Option<String>,
    held_logprobs: Vec<TokenLogprob>,
}

impl SseState {
    /// Queues the SSE events for one engine event.
    fn translate(&mut self, event: Option<Event>) {
        match event {
            Some(Event::Text { text, logprobs }) => {
                if let (Some(held), Some(syntax)) = (self.held.as_mut(), self.meta.tools) {
                    held.push_str(&text);
                    self.held_logprobs.extend(logprobs);
                    if tools::may_be_call(syntax, held) {
                        return;
                    }
                    let text = self.held.take().unwrap_or_default();
                    let logprobs = std::mem::take(&mut self.held_logprobs);
                    return self.translate(Some(Event::Text { text, logprobs }));
                }
                let logprobs = self.meta.logprobs.then(|| match self.meta.kind {
                    Kind::Chat => chat_logprobs(&logprobs),
                    Kind::Completion => completion_logprobs(&logprobs, &mut self.text_offset),
                });
                let chunk = self.meta.chunk(None, Some(&text), logprobs, None);
                self.out.push_back(chunk);
            }
            Some(Event::Done { finish, usage }) => {
                let mut reason = finish_reason(finish);
                if let (Some(held), Some(syntax)) = (self.held.take(), self.meta.tools) {
                    let (content, calls) = tools::parse(syntax, &held);
                    if calls.is_empty() {
                        let logprobs = std::mem::take(&mut self.held_logprobs);
                        self.translate(Some(Event::Text {
                            text: held,
                            logprobs,
                        }));
                    } else {
                        if let Some(content) = content {
                            let chunk = self.meta.chunk(None, Some(&content), None, None);
                            self.out.push_back(chunk);
                        }
                        let calls = tools::tool_calls_json(&calls, &self.meta.id);
                        self.out.push_back(self.meta.tool_chunk(calls));
                        reason = "tool_calls";
                    }
                }
                let last = self.meta.chunk(None, None, None, Some(reason));
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
        logprobs: Option<serde_json::Value>,
        finish: Option<&'static str>,
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
                        tool_calls: None,
                    },
                    logprobs,
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
                    logprobs,
                    finish_reason: finish,
                }],
                usage,
            }),
        }
    }

    /// A chat chunk whose delta is the answer's tool calls, whole (OpenAI splits the
    /// arguments over several deltas; clients concatenate them, so one delta is the same).
    fn tool_chunk(&self, calls: Vec<serde_json::Value>) -> SseEvent {
        json_event(&ChatChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: vec![ChunkChoice {
                index: 0,
                delta: Delta {
                    role: None,
                    content: None,
                    tool_calls: Some(calls),
                },
                logprobs: None,
                finish_reason: None,
            }],
            usage: self.include_usage.then_some(None),
        })
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
                usage: Some(Some(usage.into())),
            }),
            Kind::Completion => json_event(&TextCompletion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: vec![],
                usage: Some(Some(usage.into())),
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
