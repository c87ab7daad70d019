//! `POST /v1/responses`: OpenAI's Responses API over the chat path. The answer is a `response`
//! object whose `output` holds a `message` item (its `output_text`) and a `function_call` item
//! per call; streamed, it is the SDK's typed events, each numbered by `sequence_number`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::answer::{new_id, Wire};
use super::generate::{generate, prepare_chat};
use crate::engine::{FinishReason, Usage};
use crate::sampler::TokenLogprob;
use crate::serve::error::ApiError;
use crate::serve::extract::JsonBody;
use crate::serve::openai::responses::{Echo, ResponsesRequest};
use crate::serve::openai::tools::Call;
use crate::serve::sse::Frames;
use crate::serve::{unix_now, AppState};

pub async fn create(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    // While the model loads, 503 comes before any complaint about the request's values.
    state.engine()?;
    let (checked, echo) = req.check(&state.http().input.args)?;
    let prepared = prepare_chat(&state, checked, "input").await?;
    let wire = Responses {
        id: new_id("resp_"),
        created: unix_now(),
        model: state.ready()?.model_id.clone(),
        temperature: prepared.generation.sampler.temperature,
        top_p: prepared.generation.sampler.top_p,
        echo,
        sequence: 0,
        message: None,
    };
    generate(&state, prepared, wire, "input").await
}

/// One response's writer.
struct Responses {
    id: String,
    created: u64,
    model: String,
    temperature: f32,
    top_p: f32,
    echo: Echo,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// Once text was streamed: the message item's id and its text so far.
    message: Option<(String, String)>,
}

/// `response.output_text.delta`, written without building a JSON value per token.
#[derive(Serialize)]
struct TextDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    delta: &'a str,
    logprobs: [(); 0],
    sequence_number: u64,
}

const TEXT_DELTA: &str = "response.output_text.delta";

impl Responses {
    /// The `response` object.
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<Usage>) -> Value {
        let echo = &self.echo;
        let done = status != "in_progress";
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": done.then(unix_now),
            "error": null,
            "incomplete_details": (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            "instructions": echo.instructions,
            "max_output_tokens": echo.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": echo.parallel_tool_calls,
            "previous_response_id": null,
            "reasoning": null,
            "store": false,
            "temperature": short(self.temperature),
            "text": echo.text,
            "tool_choice": echo.tool_choice,
            "tools": echo.tools,
            "top_p": short(self.top_p),
            "truncation": "disabled",
            "usage": usage.map(usage_json),
            "metadata": echo.metadata,
        })
    }

    /// An event of type `kind`: `fields` with its type and sequence number.
    fn event(&mut self, frames: &mut Frames, kind: &str, mut fields: Value) {
        fields["type"] = kind.into();
        fields["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        frames.named_json(kind, &fields);
    }

    /// Opens the message item and its text part.
    fn open_message(&mut self, frames: &mut Frames) {
        let item_id = new_id("msg_");
        let item = message_item(&item_id, "in_progress", None);
        self.event(
            frames,
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        );
        self.event(
            frames,
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                "part": output_text("")}),
        );
        self.message = Some((item_id, String::new()));
    }

    /// The `function_call` items of `calls`, after `first` other items.
    fn call_items(&self, calls: &[Call], first: usize) -> Vec<(String, Value)> {
        calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let suffix = format!("{}_{}", &self.id["resp_".len()..], first + i);
                let item_id = format!("fc_{suffix}");
                let item = json!({"id": item_id, "type": "function_call", "status": "completed",
                    "call_id": format!("call_{suffix}"), "name": call.name,
                    "arguments": call.arguments});
                (item_id, item)
            })
            .collect()
    }
}

/// `x` as JSON with the digits it was given in (0.95, not the f32's 0.949999988079071).
fn short(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .map_or(Value::Null, Value::from)
}

fn status(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, status: &str, text: Option<&str>) -> Value {
    let content: Vec<Value> = text.map(output_text).into_iter().collect();
    json!({"id": id, "type": "message", "status": status, "role": "assistant",
        "content": content})
}

/// Responses' usage: the prompt's tokens found in a slot's cache are `cached_tokens`; the
/// others were evaluated and are now in the slot's cache (`cache_write_tokens`).
fn usage_json(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.prompt_tokens - usage.cached_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}

impl Wire for Responses {
    fn body(
        &self,
        content: Option<String>,
        _logprobs: &[TokenLogprob],
        calls: Vec<Call>,
        finish: FinishReason,
        usage: Usage,
    ) -> Response {
        let status = status(finish);
        let mut output = Vec::new();
        if calls.is_empty() || content.as_deref().is_some_and(|c| !c.is_empty()) {
            let text = content.unwrap_or_default();
            output.push(message_item(&new_id("msg_"), status, Some(&text)));
        }
        let first = output.len();
        output.extend(
            self.call_items(&calls, first)
                .into_iter()
                .map(|(_, item)| item),
        );
        Json(self.object(status, output, Some(usage))).into_response()
    }

    fn open(&mut self, frames: &mut Frames) {
        let response = self.object("in_progress", Vec::new(), None);
        self.event(frames, "response.created", json!({"response": response}));
        let response = self.object("in_progress", Vec::new(), None);
        self.event(
            frames,
            "response.in_progress",
            json!({"response": response}),
        );
    }

    fn text(&mut self, frames: &mut Frames, text: &str, _logprobs: &[TokenLogprob]) {
        if text.is_empty() {
            return;
        }
        if self.message.is_none() {
            self.open_message(frames);
        }
        let sequence_number = self.sequence;
        self.sequence += 1;
        let Some((item_id, sent)) = self.message.as_mut() else {
            return;
        };
        sent.push_str(text);
        frames.named_json(
            TEXT_DELTA,
            &TextDelta {
                kind: TEXT_DELTA,
                item_id,
                output_index: 0,
                content_index: 0,
                delta: text,
                logprobs: [],
                sequence_number,
            },
        );
    }

    fn close(&mut self, frames: &mut Frames, calls: Vec<Call>, finish: FinishReason, usage: Usage) {
        let status = status(finish);
        let mut output = Vec::new();
        // An answer of only calls has no message; an empty answer has an empty one.
        if self.message.is_none() && calls.is_empty() {
            self.open_message(frames);
        }
        if let Some((item_id, text)) = self.message.take() {
            let at = json!({"item_id": item_id, "output_index": 0, "content_index": 0});
            let mut done = at.clone();
            done["text"] = text.as_str().into();
            done["logprobs"] = json!([]);
            self.event(frames, "response.output_text.done", done);
            let mut part = at;
            part["part"] = output_text(&text);
            self.event(frames, "response.content_part.done", part);
            let item = message_item(&item_id, status, Some(&text));
            self.event(
                frames,
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            );
            output.push(item);
        }
        let first = output.len();
        for (i, (item_id, item)) in self.call_items(&calls, first).into_iter().enumerate() {
            let output_index = first + i;
            let mut added = item.clone();
            added["status"] = "in_progress".into();
            added["arguments"] = "".into();
            self.event(
                frames,
                "response.output_item.added",
                json!({"output_index": output_index, "item": added}),
            );
            let arguments = &item["arguments"];
            self.event(
                frames,
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": output_index, "delta": arguments}),
            );
            self.event(
                frames,
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": output_index,
                    "arguments": arguments, "name": item["name"]}),
            );
            self.event(
                frames,
                "response.output_item.done",
                json!({"output_index": output_index, "item": item}),
            );
            output.push(item);
        }
        let response = self.object(status, output, Some(usage));
        let kind = match status {
            "incomplete" => "response.incomplete",
            _ => "response.completed",
        };
        self.event(frames, kind, json!({"response": response}));
    }

    /// `response.failed`, the response's `error` saying why.
    fn fail(&mut self, frames: &mut Frames, error: &ApiError) {
        let mut response = self.object("failed", Vec::new(), None);
        response["error"] = json!({"code": "server_error", "message": error.body().error.message});
        self.event(frames, "response.failed", json!({"response": response}));
    }
}
