//! The answer to a generating request: all text in one JSON body, or a stream of server-sent
//! events. What every API shares is here: waiting for the first event (so that queueing
//! failures are HTTP errors even when streaming), holding back text that may be a tool call and
//! reading calls back, failures mid-stream. How one API writes its bodies and events is its
//! [`Wire`]; OpenAI's chat and completions are [`OpenAi`]. Streaming allocates nothing per
//! piece: the text arrives in a reused [`Piece`] and events are written into reused [`Frames`].

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
use crate::serve::openai::tools::{self, Call};
use crate::serve::openai::{
    finish_reason, text_chars, AssistantMessage, ChatChoice, ChatChunk, ChatCompletion,
    ChunkChoice, Delivery, Delta, Logprobs, TextChoice, TextCompletion,
};
use crate::serve::sse::{self, Frames};
use crate::serve::unix_now;

/// How one API writes a finished generation: as one body, or as the events of a stream.
pub trait Wire: Send + 'static {
    /// The whole answer: its text before any calls (`None`: only calls), the text's tokens'
    /// log-probabilities (when asked for), the calls the model made.
    fn body(
        &self,
        content: Option<String>,
        logprobs: &[TokenLogprob],
        calls: Vec<Call>,
        finish: FinishReason,
        usage: Usage,
    ) -> Response;
    /// The events that open a stream, before any text.
    fn open(&mut self, frames: &mut Frames);
    /// A piece of the answer's text, with its tokens' log-probabilities.
    fn text(&mut self, frames: &mut Frames, text: &str, logprobs: &[TokenLogprob]);
    /// The events that end a stream: the calls the model made (none of their text was sent as
    /// text), why it ended, the token counts.
    fn close(&mut self, frames: &mut Frames, calls: Vec<Call>, finish: FinishReason, usage: Usage);
    /// A failure after the stream started; nothing follows it.
    fn fail(&mut self, frames: &mut Frames, error: &ApiError);
}

/// Answers from the events of a submitted job, written by `wire`.
pub async fn answer<W: Wire>(
    wire: W,
    delivery: Delivery,
    mut events: Events,
    timeout_secs: u64,
) -> Result<Response, ApiError> {
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
        Ok(stream(wire, delivery.tools, received, timeout_secs))
    } else {
        collect(wire, delivery.tools, received, timeout_secs).await
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

/// The text of a finished answer split into content and the calls it makes, when tools were
/// offered.
fn content_and_calls(tools: Option<ToolSyntax>, text: String) -> (Option<String>, Vec<Call>) {
    match tools {
        Some(syntax) => tools::parse(syntax, &text),
        None => (Some(text), Vec::new()),
    }
}

/// The non-streaming answer: all text, then one JSON body.
async fn collect<W: Wire>(
    wire: W,
    tools: Option<ToolSyntax>,
    mut rx: Received,
    timeout: u64,
) -> Result<Response, ApiError> {
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
                let (content, calls) = content_and_calls(tools, text);
                return Ok(wire.body(content, &logprobs, calls, finish, usage));
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

/// The streaming answer. Dropping it (the client left) drops the events, which cancels the job.
fn stream<W: Wire>(wire: W, tools: Option<ToolSyntax>, rx: Received, timeout: u64) -> Response {
    let mut st = SseState {
        held: tools.map(|syntax| (syntax, String::new())),
        wire,
        rx,
        frames: Frames::default(),
        ended: false,
        timeout,
        held_logprobs: Vec::new(),
    };
    st.wire.open(&mut st.frames);
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

struct SseState<W> {
    wire: W,
    rx: Received,
    /// The events translated since the last frame left.
    frames: Frames,
    ended: bool,
    timeout: u64,
    /// With tools: the text so far while it may be a call in this syntax (sent as text once it
    /// cannot be, read as calls at the end if it is).
    held: Option<(ToolSyntax, String)>,
    held_logprobs: Vec<TokenLogprob>,
}

impl<W: Wire> SseState<W> {
    /// Writes the events for one engine event.
    fn translate(&mut self, event: Option<Event>) {
        match event {
            Some(Event::Text) => {
                if let Some((syntax, held)) = self.held.as_mut() {
                    held.push_str(&self.rx.piece.text);
                    self.held_logprobs.append(&mut self.rx.piece.logprobs);
                    if tools::may_be_call(*syntax, held) {
                        return;
                    }
                    if let Some((_, text)) = self.held.take() {
                        self.held_text(&text);
                    }
                    return;
                }
                let piece = &self.rx.piece;
                self.wire
                    .text(&mut self.frames, &piece.text, &piece.logprobs);
            }
            Some(Event::End(End::Done { finish, usage })) => {
                let mut calls = Vec::new();
                if let Some((syntax, held)) = self.held.take() {
                    let (content, parsed) = tools::parse(syntax, &held);
                    if parsed.is_empty() {
                        self.held_text(&held);
                    } else if let Some(content) = content {
                        self.wire.text(&mut self.frames, &content, &[]);
                    }
                    calls = parsed;
                }
                self.wire.close(&mut self.frames, calls, finish, usage);
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

    /// The text held while it might have been a tool call, with the log-probabilities held
    /// with it (their buffer kept for the next).
    fn held_text(&mut self, text: &str) {
        let mut logprobs = std::mem::take(&mut self.held_logprobs);
        self.wire.text(&mut self.frames, text, &logprobs);
        logprobs.clear();
        self.held_logprobs = logprobs;
    }

    fn fail(&mut self, error: ApiError) {
        if let ApiError::Internal(detail) = &error {
            tracing::error!("{detail}");
        }
        self.wire.fail(&mut self.frames, &error);
        self.ended = true;
    }
}

/// Which of OpenAI's endpoints is answered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// OpenAI's chat completions and completions.
pub struct OpenAi {
    meta: Meta,
    /// Characters of completion text sent so far (completions' `text_offset`).
    text_offset: usize,
}

impl OpenAi {
    pub fn new(model: &str, vocab: Arc<Model>, kind: Kind, delivery: &Delivery) -> OpenAi {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        OpenAi {
            meta: Meta {
                id: new_id(prefix),
                created: unix_now(),
                model: model.to_owned(),
                kind,
                include_usage: delivery.include_usage,
                logprobs: delivery.logprobs,
                vocab,
            },
            text_offset: 0,
        }
    }
}

/// What every response and chunk of one request repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    include_usage: bool,
    logprobs: bool,
    /// Whose vocabulary holds the tokens' texts (written out with their log-probabilities).
    vocab: Arc<Model>,
}

impl Wire for OpenAi {
    fn body(
        &self,
        content: Option<String>,
        logprobs: &[TokenLogprob],
        calls: Vec<Call>,
        finish: FinishReason,
        usage: Usage,
    ) -> Response {
        let meta = &self.meta;
        let logprobs = meta.logprobs.then(|| meta.logprobs_json(logprobs, 0));
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
                    text: content.as_deref().unwrap_or_default(),
                    logprobs,
                    finish_reason: Some(finish),
                }],
                usage: Some(Some(usage.into())),
            })
            .into_response(),
        }
    }

    fn open(&mut self, frames: &mut Frames) {
        if self.meta.kind == Kind::Chat {
            // OpenAI opens a chat stream with the role and empty content.
            self.meta
                .chunk(frames, Some("assistant"), Some(""), None, None);
        }
    }

    /// The chunk of a piece of text (empty text with only log-probabilities included).
    fn text(&mut self, frames: &mut Frames, text: &str, logprobs: &[TokenLogprob]) {
        let meta = &self.meta;
        let json = meta
            .logprobs
            .then(|| meta.logprobs_json(logprobs, self.text_offset));
        meta.chunk(frames, None, Some(text), json, None);
        if meta.logprobs && meta.kind == Kind::Completion {
            self.text_offset += text_chars(logprobs, meta.vocab.tokenizer());
        }
    }

    fn close(&mut self, frames: &mut Frames, calls: Vec<Call>, finish: FinishReason, usage: Usage) {
        let mut reason = finish_reason(finish);
        if !calls.is_empty() {
            let calls = tools::tool_calls_json(&calls, &self.meta.id);
            self.meta.tool_chunk(frames, calls);
            reason = "tool_calls";
        }
        self.meta.chunk(frames, None, None, None, Some(reason));
        if self.meta.include_usage {
            self.meta.usage_chunk(frames, usage);
        }
        frames.data("[DONE]");
    }

    /// An `error` event (the SDKs raise it).
    fn fail(&mut self, frames: &mut Frames, error: &ApiError) {
        frames.json(&error.body());
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

/// `<prefix>-…` (`chatcmpl-…`, `resp_…` with prefix `resp_`, …): unique within the process and
/// unlikely to repeat across restarts.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Relaxed);
    let sep = if prefix.ends_with('_') { "" } else { "-" };
    format!("{prefix}{sep}{:x}{n:06x}", unix_now())
}
