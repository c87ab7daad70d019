//! The answer to a generating request, as OpenAI gives it: all text in one JSON body, or a
//! stream of server-sent events, a chunk per piece of text. Streaming allocates nothing per
//! piece: the text arrives in a reused [`Piece`] and chunks are written into reused
//! [`Frames`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;

use crate::engine::chat_template::ToolSyntax;
use crate::engine::{End, Event, Events, FinishReason, JobFailure, Piece, Usage};
use crate::model::Model;
use crate::sampler::TokenLogprob;
use crate::serve::error::ApiError;
use crate::serve::openai::tools;
use crate::serve::openai::{
    finish_reason, text_chars, AssistantMessage, ChatChoice, ChatChunk, ChatCompletion,
    ChunkChoice, Delivery, Delta, Logprobs, TextChoice, TextCompletion,
};
use crate::serve::sse::{self, Frames};
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
    /// Whose vocabulary holds the tokens' texts (written out with their log-probabilities).
    vocab: Arc<Model>,
}

/// Answers from the events of a submitted job. Waiting for the first event lets queueing
/// failures (time limit, shutdown) be HTTP errors even when streaming.
pub async fn answer(
    model: &str,
    vocab: Arc<Model>,
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
        vocab,
    };
    if !delivery.stream {
        events.wake_only_at_end();
    }
    let mut piece = Piece::default();
    let first = events.recv(&mut piece).await;
    if let Some(Event::End(End::Failed(failure))) = first {
        return Err(failure_error(failure, timeout_secs));
    }
    let received = Received {
        events,
        piece,
        first: Some(first),
    };
    if delivery.stream {
        Ok(stream(meta, received, timeout_secs))
    } else {
        collect(meta, received, timeout_secs).await
    }
}

/// A job's events, the first already received (into `piece`).
struct Received {
    events: Events,
    piece: Piece,
    first: Option<Option<Event>>,
}

impl Received {
    /// The next event; with [`Event::Text`] the text is in `self.piece`.
    async fn next(&mut self) -> Option<Event> {
        match self.first.take() {
            Some(first) => first,
            None => self.events.recv(&mut self.piece).await,
        }
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
async fn collect(meta: Meta, mut rx: Received, timeout: u64) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        match rx.next().await {
            Some(Event::Text) if text.is_empty() => {
                // Usually the whole answer in one piece: taken, not copied.
                std::mem::swap(&mut text, &mut rx.piece.text);
                logprobs.append(&mut rx.piece.logprobs);
            }
            Some(Event::Text) => {
                text.push_str(&rx.piece.text);
                logprobs.append(&mut rx.piece.logprobs);
            }
            Some(Event::End(End::Done { finish, usage })) => {
                return Ok(final_body(&meta, text, &logprobs, finish, usage))
            }
            Some(Event::End(End::Failed(failure))) => return Err(failure_error(failure, timeout)),
            None => {
                return Err(ApiError::Internal(
                    "the decode thread dropped a request".into(),
                ))
            }
        }
    }
}

fn final_body(
    meta: &Meta,
    text: String,
    logprobs: &[TokenLogprob],
    finish: FinishReason,
    usage: Usage,
) -> Response {
    let logprobs = meta.logprobs.then(|| meta.logprobs_json(logprobs, 0));
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
            choices: &[TextChoice {
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

/// The streaming answer. Dropping it (the client left) drops the events, which cancels the job.
fn stream(meta: Meta, rx: Received, timeout: u64) -> Response {
    let mut st = SseState {
        held: meta.tools.is_some().then(String::new),
        meta,
        rx,
        frames: Frames::default(),
        ended: false,
        timeout,
        text_offset: 0,
        held_logprobs: Vec::new(),
    };
    if st.meta.kind == Kind::Chat {
        // OpenAI opens a chat stream with the role and empty content.
        st.meta
            .chunk(&mut st.frames, Some("assistant"), Some(""), None, None);
    }
    let frames = stream::unfold(st, |mut st| async move {
        while !st.ended {
            let event = st.rx.next().await;
            st.translate(event);
            // An event may write nothing (text held while it may be a tool call).
            if let Some(frame) = st.frames.take() {
                return Some((frame, st));
            }
        }
        None
    });
    sse::response(frames)
}

struct SseState {
    meta: Meta,
    rx: Received,
    /// The chunks of the events translated since the last frame left.
    frames: Frames,
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
    /// Writes the chunks for one engine event.
    fn translate(&mut self, event: Option<Event>) {
        match event {
            Some(Event::Text) => {
                if let (Some(held), Some(syntax)) = (self.held.as_mut(), self.meta.tools) {
                    held.push_str(&self.rx.piece.text);
                    self.held_logprobs.append(&mut self.rx.piece.logprobs);
                    if tools::may_be_call(syntax, held) {
                        return;
                    }
                    let text = self.held.take().unwrap_or_default();
                    return self.held_chunk(&text);
                }
                // Taken out for the call and put back: moving a `Piece` allocates nothing.
                let piece = std::mem::take(&mut self.rx.piece);
                self.text_chunk(&piece.text, &piece.logprobs);
                self.rx.piece = piece;
            }
            Some(Event::End(End::Done { finish, usage })) => {
                let mut reason = finish_reason(finish);
                if let (Some(held), Some(syntax)) = (self.held.take(), self.meta.tools) {
                    let (content, calls) = tools::parse(syntax, &held);
                    if calls.is_empty() {
                        self.held_chunk(&held);
                    } else {
                        if let Some(content) = content {
                            let frames = &mut self.frames;
                            self.meta.chunk(frames, None, Some(&content), None, None);
                        }
                        let calls = tools::tool_calls_json(&calls, &self.meta.id);
                        self.meta.tool_chunk(&mut self.frames, calls);
                        reason = "tool_calls";
                    }
                }
                self.meta
                    .chunk(&mut self.frames, None, None, None, Some(reason));
                if self.meta.include_usage {
                    self.meta.usage_chunk(&mut self.frames, usage);
                }
                self.frames.data("[DONE]");
                self.ended = true;
            }
            Some(Event::End(End::Failed(failure))) => {
                self.fail(failure_error(failure, self.timeout));
            }
            None => self.fail(ApiError::Internal(
                "the decode thread dropped a request".into(),
            )),
        }
    }

    /// The chunk of a piece of text (empty text with only log-probabilities included).
    fn text_chunk(&mut self, text: &str, logprobs: &[TokenLogprob]) {
        let json = self
            .meta
            .logprobs
            .then(|| self.meta.logprobs_json(logprobs, self.text_offset));
        self.meta
            .chunk(&mut self.frames, None, Some(text), json, None);
        if self.meta.logprobs && self.meta.kind == Kind::Completion {
            self.text_offset += text_chars(logprobs, self.meta.vocab.tokenizer());
        }
    }

    /// [`SseState::text_chunk`] of the text held while it might have been a tool call, with
    /// the log-probabilities held with it (their buffer kept for the next).
    fn held_chunk(&mut self, text: &str) {
        let mut logprobs = std::mem::take(&mut self.held_logprobs);
        self.text_chunk(text, &logprobs);
        logprobs.clear();
        self.held_logprobs = logprobs;
    }

    /// A failure after the stream started: an `error` event (the SDKs raise it), then the end.
    fn fail(&mut self, error: ApiError) {
        if let ApiError::Internal(detail) = &error {
            tracing::error!("{detail}");
        }
        self.frames.json(&error.body());
        self.ended = true;
    }
}

impl Meta {
    /// The choice's `logprobs` for `tokens`, whose text starts `offset` characters into the
    /// completion.
    fn logprobs_json<'a>(&'a self, tokens: &'a [TokenLogprob], offset: usize) -> Logprobs<'a> {
        let vocab = self.vocab.tokenizer();
        match self.kind {
            Kind::Chat => Logprobs::Chat { tokens, vocab },
            Kind::Completion => Logprobs::Completion {
                tokens,
                vocab,
                offset,
            },
        }
    }

    /// One chunk: for chat a `delta`, for completions the `text`.
    fn chunk(
        &self,
        frames: &mut Frames,
        role: Option<&'static str>,
        text: Option<&str>,
        logprobs: Option<Logprobs<'_>>,
        finish: Option<&'static str>,
    ) {
        let usage = self.include_usage.then_some(None);
        match self.kind {
            Kind::Chat => frames.json(&ChatChunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: &[ChunkChoice {
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
            Kind::Completion => frames.json(&TextCompletion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: &[TextChoice {
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
    fn tool_chunk(&self, frames: &mut Frames, calls: Vec<serde_json::Value>) {
        frames.json(&ChatChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: &[ChunkChoice {
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
    fn usage_chunk(&self, frames: &mut Frames, usage: Usage) {
        match self.kind {
            Kind::Chat => frames.json(&ChatChunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: &[],
                usage: Some(Some(usage.into())),
            }),
            Kind::Completion => frames.json(&TextCompletion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: &[],
                usage: Some(Some(usage.into())),
            }),
        }
    }
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
