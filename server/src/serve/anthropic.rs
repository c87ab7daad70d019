//! Anthropic's Messages API (`POST /v1/messages`), as the official SDKs send it: the request
//! read into the turns and parameters of a chat (the answer takes the chat completions' path),
//! and errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.
//!
//! Unknown fields are ignored, as chat completions ignores them. `thinking` is ignored too:
//! the model has no separate reasoning to budget.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::engine::chat_template::Turn;
use crate::serve::error::{ApiError, ErrorMessage};
use crate::serve::input::InputArgs;
use serde_json::value::RawValue;

use crate::serve::openai::{
    check_schema_size, read_objects, template_call, Checked, GenerationRequest, JsonSchemaFormat,
    NamedFunction, RawObject, ResponseFormat, Stop, ToolChoiceParam,
};

/// The path whose errors are written in Anthropic's shape.
pub const PATH: &str = "/v1/messages";

/// `POST /v1/messages`.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub messages: Vec<Message>,
    /// Required, as Anthropic requires it.
    pub max_tokens: u32,
    /// Accepted and ignored: this server serves one model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub system: Option<Content>,
    #[serde(default)]
    pub stop_sequences: Option<Stop>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// `[{"name", "description", "input_schema"}]`.
    #[serde(default)]
    pub tools: Option<Vec<RawObject>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// Structured output: `{"format": {"type": "json_schema", "schema": {...}}}`, through
    /// the constrained decoding.
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
}

#[derive(Debug, Deserialize)]
pub struct OutputConfig {
    #[serde(default)]
    pub format: Option<OutputFormat>,
}

#[derive(Debug, Deserialize)]
pub struct OutputFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub schema: Option<Box<RawValue>>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Content,
}

/// A text, or a list of content blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One content block, whatever its `type`: `text`, `tool_use` (a call the model made),
/// `tool_result` (its answer). Fields that do not belong to the block's type are ignored.
#[derive(Debug, Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub tool_use_id: Option<String>,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub is_error: Option<bool>,
}

/// `{"type": "auto" | "any" | "tool" | "none", "name"}`.
#[derive(Debug, Deserialize)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
}

impl MessagesRequest {
    /// The chat to run; values out of range are refused by name.
    pub fn check(self, limits: &InputArgs) -> Result<Checked<Vec<Turn>>, ApiError> {
        // Anthropic's range, narrower than OpenAI's.
        if let Some(t) = self.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
            return Err(ApiError::bad_param(
                "temperature",
                format!("temperature = {t} is out of range: it must be between 0 and 1"),
            ));
        }
        let mut turns = Vec::new();
        if let Some(system) = &self.system {
            let text = text_of(system, "system")?;
            if !text.is_empty() {
                turns.push(turn("system", text));
            }
        }
        if self.messages.is_empty() {
            return Err(ApiError::bad_param(
                "messages",
                "messages is empty: send at least one message",
            ));
        }
        for (i, message) in self.messages.iter().enumerate() {
            read_message(message, i, &mut turns)?;
        }
        if self.messages.last().is_some_and(|m| m.role == "assistant") {
            return Err(ApiError::bad_param(
                "messages",
                "the last message is the assistant's: continuing a prefilled answer is not supported; end with a user message",
            ));
        }
        let tools = read_objects(self.tools.unwrap_or_default(), "tools", "`tools`", limits)?
            .iter()
            .enumerate()
            .map(|(i, tool)| chat_tool(tool, i).map(|t| RawObject::from_map(&t)))
            .collect::<Result<Vec<_>, _>>()?;
        let tool_choice = self.tool_choice.map(tool_choice).transpose()?;
        let response_format =
            match self.output_config.and_then(|c| c.format) {
                None => None,
                Some(OutputFormat {
                    kind,
                    schema: Some(schema),
                }) if kind == "json_schema" => {
                    check_schema_size(
                        &schema,
                        "output_config",
                        "the output_config.format schema",
                        limits,
                    )?;
                    Some(ResponseFormat::JsonSchema {
                        json_schema: JsonSchemaFormat {
                            name: None,
                            schema: Some(schema),
                            strict: None,
                        },
                    })
                }
                Some(_) => return Err(ApiError::bad_param(
                    "output_config",
                    "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                )),
            };
        let forces_call = matches!(&tool_choice, Some(ToolChoiceParam::Named { .. }))
            || matches!(&tool_choice, Some(ToolChoiceParam::Mode(m)) if m == "required");
        if forces_call && response_format.is_some() {
            return Err(ApiError::bad_param(
                "tool_choice",
                "a required tool call and an output_config.format are both given: send one of them",
            ));
        }
        let generation = GenerationRequest {
            max_tokens: Some(self.max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences,
            stream: self.stream.unwrap_or(false),
            tools: (!tools.is_empty()).then_some(tools),
            tool_choice,
            response_format,
            ..GenerationRequest::default()
        };
        generation.check_chat(turns, limits)
    }
}

/// Appends the turns of `message`: its text and calls; each tool result a `tool` turn.
fn read_message(message: &Message, i: usize, turns: &mut Vec<Turn>) -> Result<(), ApiError> {
    let role = match message.role.as_str() {
        r @ ("user" | "assistant") => r,
        other => {
            return Err(ApiError::bad_param(
                "messages",
                format!("messages[{i}] has role `{other}`: a message's role is user or assistant (instructions go in `system`)"),
            ))
        }
    };
    let blocks = match &message.content {
        Content::Text(text) => {
            turns.push(turn(role, text.clone()));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in blocks {
        match (role, block.kind.as_str()) {
            (_, "text") => text.push_str(block.text.as_deref().unwrap_or_default()),
            ("assistant", "tool_use") => {
                let name = block.name.as_deref().unwrap_or_default();
                let input = block.input.clone().unwrap_or_else(|| json!({}));
                calls.push(template_call(block.id.as_deref(), name, &input.to_string()));
            }
            ("user", "tool_result") => {
                let mut result = match &block.content {
                    Some(content) => text_of(content, "messages")?,
                    None => String::new(),
                };
                if block.is_error == Some(true) {
                    result.insert_str(0, "Error: ");
                }
                turns.push(Turn {
                    tool_call_id: block.tool_use_id.clone(),
                    ..turn("tool", result)
                });
            }
            // The model's reasoning from another server: no part of the dialogue a template
            // renders.
            ("assistant", "thinking" | "redacted_thinking") => {}
            (_, kind) => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!("messages[{i}] has a {role} content block of type `{kind}`, which is not supported: this model reads text, tool_use and tool_result blocks"),
                ))
            }
        }
    }
    if !text.is_empty() || !calls.is_empty() {
        turns.push(Turn {
            tool_calls: (!calls.is_empty()).then(|| Value::Array(calls)),
            ..turn(role, text)
        });
    }
    Ok(())
}

fn turn(role: &str, content: String) -> Turn {
    Turn {
        role: role.to_owned(),
        content,
        tool_calls: None,
        tool_call_id: None,
    }
}

/// The text of a string or of text blocks; other blocks are refused, not dropped.
fn text_of(content: &Content, param: &'static str) -> Result<String, ApiError> {
    match content {
        Content::Text(text) => Ok(text.clone()),
        Content::Blocks(blocks) => blocks
            .iter()
            .map(|b| match (b.kind.as_str(), &b.text) {
                ("text", Some(text)) => Ok(text.as_str()),
                (kind, _) => Err(ApiError::bad_param(
                    param,
                    format!(
                        "a {param} block of type `{kind}` is not supported here: send text blocks"
                    ),
                )),
            })
            .collect(),
    }
}

/// An Anthropic client tool in chat completions' shape (which the templates and the call
/// grammar read).
fn chat_tool(tool: &Map<String, Value>, i: usize) -> Result<Map<String, Value>, ApiError> {
    let kind = tool.get("type").and_then(Value::as_str).unwrap_or("custom");
    let name = tool.get("name").and_then(Value::as_str).unwrap_or("");
    let schema = tool.get("input_schema").filter(|s| s.is_object());
    let (true, false, Some(schema)) = (kind == "custom", name.is_empty(), schema) else {
        return Err(ApiError::bad_param(
            "tools",
            format!("tools[{i}] is not a client tool `{{\"name\": ..., \"input_schema\": {{...}}}}`: server tools (type `{kind}`) are not available here"),
        ));
    };
    let mut function = Map::new();
    function.insert("name".into(), name.into());
    if let Some(d) = tool.get("description").filter(|d| !d.is_null()) {
        function.insert("description".into(), d.clone());
    }
    function.insert("parameters".into(), schema.clone());
    let mut chat = Map::new();
    chat.insert("type".into(), "function".into());
    chat.insert("function".into(), Value::Object(function));
    Ok(chat)
}

fn tool_choice(choice: ToolChoice) -> Result<ToolChoiceParam, ApiError> {
    let mode = |m: &str| Ok(ToolChoiceParam::Mode(m.to_owned()));
    match (choice.kind.as_str(), choice.name) {
        ("auto", _) => mode("auto"),
        ("any", _) => mode("required"),
        ("none", _) => mode("none"),
        ("tool", Some(name)) => Ok(ToolChoiceParam::Named {
            function: NamedFunction { name },
        }),
        (kind, _) => Err(ApiError::bad_param(
            "tool_choice",
            format!("tool_choice {{\"type\": \"{kind}\"}} is not one of auto, any, none or {{\"type\": \"tool\", \"name\": ...}}"),
        )),
    }
}

/// Anthropic's error body.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorObject<'a>,
}

#[derive(Debug, Serialize)]
pub struct ErrorObject<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: &'a str,
}

/// The error body Anthropic sends with `status`.
pub fn error_body(status: StatusCode, message: &str) -> ErrorBody<'_> {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        408 | 504 => "timeout_error",
        503 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    ErrorBody {
        kind: "error",
        error: ErrorObject { kind, message },
    }
}

/// Middleware: every error answered on [`PATH`] (the handler's, and the key's, the rate
/// limits', the body limit's on the way) in Anthropic's shape, with the same status and
/// headers.
pub async fn error_shape(req: Request, next: Next) -> Response {
    let ours = req.uri().path() == PATH;
    let response = next.run(req).await;
    if !ours {
        return response;
    }
    let Some(ErrorMessage(message)) = response.extensions().get::<ErrorMessage>().cloned() else {
        return response;
    };
    let (mut parts, _) = response.into_parts();
    let body = serde_json::to_vec(&error_body(parts.status, &message)).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::openai::tools::ToolChoice as Choice;

    fn check(body: Value) -> Result<Checked<Vec<Turn>>, ApiError> {
        // As the server reads bodies: from text (schemas and tools stay raw JSON text).
        serde_json::from_str::<MessagesRequest>(&body.to_string())
            .unwrap()
            .check(&InputArgs::default())
    }

    #[test]
    fn messages_become_turns_with_calls_and_results() {
        let c = check(json!({"max_tokens": 5, "system": [{"type": "text", "text": "S"}],
            "stop_sequences": ["\n\n"], "top_k": 3, "messages": [
            {"role": "user", "content": "What is 1+1?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "text", "text": "Let me add."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "2"}]}, {"type": "text", "text": "So?"}]},
        ]}))
        .unwrap();
        let t = &c.input;
        let roles: Vec<&str> = t.iter().map(|t| t.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(t[2].content, "Let me add.");
        assert_eq!(
            t[2].tool_calls.as_ref().unwrap()[0]["function"]["arguments"]["b"],
            1
        );
        assert_eq!(
            (t[3].tool_call_id.as_deref(), t[3].content.as_str()),
            (Some("toolu_1"), "2")
        );
        assert_eq!(t[4].content, "So?");
        assert_eq!(c.generation.max_tokens, Some(5));
        assert_eq!(c.generation.stop, ["\n\n"]);
        assert_eq!(c.generation.sampler.top_k, 3);
        let c = check(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "integer"}}}}))
        .unwrap();
        assert_eq!(c.constraint.unwrap().0, "response_format");
    }

    #[test]
    fn tools_and_tool_choice() {
        let tools = json!([{"name": "f", "description": "d", "input_schema": {"type": "object"}}]);
        let choice = |c: Value| {
            check(
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                "tools": tools, "tool_choice": c}),
            )
            .map(|c| {
                c.tools
                    .map(|t| (t.choice, t.tools[0]["function"]["parameters"].clone()))
            })
        };
        let (any, params) = choice(json!({"type": "any"})).unwrap().unwrap();
        assert_eq!(any, Choice::Required);
        assert_eq!(params, json!({"type": "object"}));
        assert_eq!(
            choice(json!({"type": "tool", "name": "f"}))
                .unwrap()
                .unwrap()
                .0,
            Choice::Named("f".into())
        );
        assert_eq!(
            choice(json!({"type": "auto"})).unwrap().unwrap().0,
            Choice::Auto
        );
        assert!(choice(json!({"type": "none"})).unwrap().is_none());
        assert!(choice(json!({"type": "tool", "name": "g"})).is_err());
        assert!(choice(json!({"type": "sometimes"})).is_err());
    }

    #[test]
    fn bad_requests_are_refused_by_name() {
        let user = json!([{"role": "user", "content": "x"}]);
        for (body, param) in [
            (json!({"max_tokens": 0, "messages": user}), "max_tokens"),
            (json!({"max_tokens": 5, "messages": []}), "messages"),
            (
                json!({"max_tokens": 5, "messages": user, "temperature": 1.5}),
                "temperature",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "messages",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]}),
                "messages",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "tools": [{"name": "f"}]}),
                "tools",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "output_config": {"format": {"type": "yaml"}}}),
                "output_config",
            ),
        ] {
            match check(body.clone()) {
                Err(ApiError::BadRequest { param: Some(p), .. }) => assert_eq!(p, param, "{body}"),
                other => panic!("{body}: {:?}", other.map(|_| ())),
            }
        }
        let e = serde_json::from_str::<MessagesRequest>(&json!({"messages": user}).to_string())
            .unwrap_err();
        assert!(
            e.to_string().starts_with("missing field `max_tokens`"),
            "{e}"
        );
    }

    #[test]
    fn error_types_follow_the_status() {
        let body = |status: u16| {
            serde_json::to_value(error_body(StatusCode::from_u16(status).unwrap(), "m")).unwrap()
        };
        assert_eq!(
            body(400),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "m"}})
        );
        assert_eq!(body(401)["error"]["type"], "authentication_error");
        assert_eq!(body(429)["error"]["type"], "rate_limit_error");
        assert_eq!(body(503)["error"]["type"], "overloaded_error");
        assert_eq!(body(500)["error"]["type"], "api_error");
    }
}
