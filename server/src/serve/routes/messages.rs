//! `POST /v1/messages`: Anthropic's Messages API over the chat path. The answer is a `message`
//! whose `content` holds a text block and a `tool_use` block per call; streamed, it is
//! Anthropic's named events (`message_start`, `content_block_*`, `message_delta`,
//! `message_stop`). Errors take Anthropic's shape ([`anthropic::error_shape`]).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::answer::{new_id, Wire};
use super::generate::{generate, prepare_chat};
use crate::engine::{FinishReason, Usage};
use crate::sampler::TokenLogprob;
use crate::serve::anthropic::{self, MessagesRequest};
use crate::serve::error::ApiError;
use crate::serve::extract::JsonBody;
use crate::serve::openai::tools::Call;
use crate::serve::sse::Frames;
use crate::serve::AppState;

pub async fn create(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, ApiError> {
    // While the model loads, 503 comes before any complaint about the request's values.
    state.engine()?;
    let prepared = prepare_chat(&state, req.check(&state.http().input.args)?, "messages").await?;
    let wire = Messages {
        id: new_id("msg_"),
        model: state.ready()?.model_id.clone(),
        stops: prepared.generation.stop.clone(),
        prompt_tokens: prepared.prompt.len(),
        blocks: 0,
        text_open: false,
    };
    generate(&state, prepared, wire, "messages").await
}

/// One message's writer.
struct Messages {
    id: String,
    model: String,
    /// The request's stop sequences: the one found is named in `stop_sequence`.
    stops: Vec<String>,
    prompt_tokens: usize,
    /// Content blocks started so far.
    blocks: usize,
    /// Whether the text block is started and not yet stopped.
    text_open: bool,
}

/// `content_block_delta` of text, written without building a JSON value per token.
#[derive(Serialize)]
struct TextDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    delta: TextDeltaBody<'a>,
}

#[derive(Serialize)]
struct TextDeltaBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

impl Messages {
    /// Why the answer ended, and which stop sequence ended it.
    fn stop_reason(&self, calls: &[Call], finish: FinishReason) -> (&'static str, Option<&str>) {
        match finish {
            _ if !calls.is_empty() => ("tool_use", None),
            FinishReason::Length => ("max_tokens", None),
            FinishReason::StopSequence(i) => {
                ("stop_sequence", self.stops.get(i).map(String::as_str))
            }
            FinishReason::Stop => ("end_turn", None),
        }
    }

    /// The `tool_use` blocks of `calls`.
    fn tool_uses(&self, calls: &[Call]) -> Vec<Value> {
        calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let input: Value =
                    serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
                json!({"type": "tool_use", "id": format!("toolu_{}_{i}", &self.id["msg_".len()..]),
                    "name": call.name, "input": input})
            })
            .collect()
    }

    fn event(frames: &mut Frames, kind: &str, mut fields: Value) {
        fields["type"] = kind.into();
        frames.named_json(kind, &fields);
    }

    fn stop_block(&mut self, frames: &mut Frames, index: usize) {
        Self::event(frames, "content_block_stop", json!({"index": index}));
    }
}

/// Anthropic's usage: `input_tokens` are those read afresh, `cache_read_input_tokens` those
/// found in a slot's cache (their sum is the prompt).
fn usage_json(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    })
}

impl Wire for Messages {
    fn body(
        &self,
        content: Option<String>,
        _logprobs: &[TokenLogprob],
        calls: Vec<Call>,
        finish: FinishReason,
        usage: Usage,
    ) -> Response {
        let (stop_reason, stop_sequence) = self.stop_reason(&calls, finish);
        let mut blocks: Vec<Value> = content
            .filter(|c| !c.is_empty())
            .map(|text| json!({"type": "text", "text": text}))
            .into_iter()
            .collect();
        blocks.extend(self.tool_uses(&calls));
        Json(json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage_json(usage),
        }))
        .into_response()
    }

    fn open(&mut self, frames: &mut Frames) {
        // The prompt's size is known now; how much of it a slot had cached, at the end.
        let usage = json!({"input_tokens": self.prompt_tokens, "output_tokens": 0});
        let message = json!({"id": self.id, "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage});
        Self::event(frames, "message_start", json!({"message": message}));
        Self::event(frames, "ping", json!({}));
    }

    fn text(&mut self, frames: &mut Frames, text: &str, _logprobs: &[TokenLogprob]) {
        if text.is_empty() {
            return;
        }
        if !self.text_open {
            Self::event(
                frames,
                "content_block_start",
                json!({"index": self.blocks, "content_block": {"type": "text", "text": ""}}),
            );
            self.text_open = true;
            self.blocks += 1;
        }
        const DELTA: &str = "content_block_delta";
        frames.named_json(
            DELTA,
            &TextDelta {
                kind: DELTA,
                index: self.blocks - 1,
                delta: TextDeltaBody {
                    kind: "text_delta",
                    text,
                },
            },
        );
    }

    fn close(&mut self, frames: &mut Frames, calls: Vec<Call>, finish: FinishReason, usage: Usage) {
        if self.text_open {
            self.text_open = false;
            self.stop_block(frames, self.blocks - 1);
        }
        for mut block in self.tool_uses(&calls) {
            let index = self.blocks;
            self.blocks += 1;
            let input = block["input"].take();
            block["input"] = json!({});
            Self::event(
                frames,
                "content_block_start",
                json!({"index": index, "content_block": block}),
            );
            Self::event(
                frames,
                "content_block_delta",
                json!({"index": index, "delta": {"type": "input_json_delta",
                    "partial_json": input.to_string()}}),
            );
            self.stop_block(frames, index);
        }
        let (stop_reason, stop_sequence) = self.stop_reason(&calls, finish);
        Self::event(
            frames,
            "message_delta",
            json!({"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": usage_json(usage)}),
        );
        Self::event(frames, "message_stop", json!({}));
    }

    /// An `error` event in Anthropic's shape (the SDK raises it).
    fn fail(&mut self, frames: &mut Frames, error: &ApiError) {
        let message = error.body().error.message;
        frames.named_json("error", &anthropic::error_body(error.status(), &message));
    }
}
