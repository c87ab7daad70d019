//! The request of OpenAI's Responses API (`POST /v1/responses`), as the official SDKs send it,
//! read into the turns and parameters of a chat: the answer takes the chat completions' path.
//!
//! The server keeps nothing between requests, so what needs a stored response is refused by
//! name: `previous_response_id`, `conversation`, `background`, a stored `prompt`, and an
//! explicit `store: true`. OpenAI stores by default when `store` is left out, but the SDKs then
//! send nothing, and refusing every request that omits it would refuse every client; the
//! response says `"store": false`, which is what happened. Other unknown fields are ignored,
//! as chat completions ignores them.

use std::fmt;

use serde::de::{self, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Map, Value};

use crate::engine::chat_template::Turn;
use crate::serve::error::ApiError;
use crate::serve::input::InputArgs;

use crate::serve::openai::{
    check_schema_size, read_objects, template_call, Checked, ContentPart, GenerationRequest,
    JsonSchemaFormat, MessageContent, NamedFunction, RawObject, ResponseFormat, ToolChoiceParam,
};

/// `POST /v1/responses`.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub input: Input,
    #[serde(default)]
    pub instructions: Option<String>,
    /// Accepted and ignored: this server serves one model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub text: Option<TextConfig>,
    /// Responses' flat function tools: `{"type": "function", "name", "description",
    /// "parameters", "strict"}`.
    #[serde(default)]
    pub tools: Option<Vec<RawObject>>,
    #[serde(default)]
    pub tool_choice: Option<ResponsesToolChoice>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Echoed in the response, as OpenAI does.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub background: Option<bool>,
    #[serde(default)]
    pub conversation: Option<IgnoredAny>,
    #[serde(default)]
    pub prompt: Option<IgnoredAny>,
}

/// `input`: a text (one user message) or a list of items.
#[derive(Debug)]
pub enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

/// One item of `input`, whatever its `type`: a message (the default), a `function_call` the
/// model made, or the `function_call_output` that answers it. Fields that do not belong to
/// the item's type are ignored.
#[derive(Debug, Deserialize)]
pub struct InputItem {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// JSON text, as OpenAI sends it.
    #[serde(default)]
    pub arguments: Option<String>,
    #[serde(default)]
    pub output: Option<MessageContent>,
}

#[derive(Debug, Deserialize)]
pub struct TextConfig {
    #[serde(default)]
    pub format: Option<TextFormat>,
}

/// `text.format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        // A tree, not raw text: an internally tagged enum buffers its fields, which a RawValue
        // cannot be read from. Its size is checked before it is compiled or echoed.
        schema: Option<Value>,
        #[serde(default)]
        strict: Option<bool>,
    },
}

/// `tool_choice`: "auto", "none", "required" or `{"type": "function", "name": ...}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ResponsesToolChoice {
    Mode(String),
    Typed {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        name: Option<String>,
    },
}

/// What the response repeats of its request, as OpenAI's does.
#[derive(Debug, Clone)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    /// The tools as given (Responses' flat shape).
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub text: Value,
    pub metadata: Value,
    pub parallel_tool_calls: bool,
}

impl ResponsesRequest {
    /// The chat to run and what its response repeats; refuses what needs stored state, and
    /// values out of range, by name.
    pub fn check(self, limits: &InputArgs) -> Result<(Checked<Vec<Turn>>, Echo), ApiError> {
        self.refuse_state()?;
        if self.max_output_tokens == Some(0) {
            return Err(ApiError::bad_param(
                "max_output_tokens",
                "max_output_tokens must be at least 1",
            ));
        }
        let format = self.text.and_then(|t| t.format);
        if let Some(TextFormat::JsonSchema {
            schema: Some(schema),
            ..
        }) = &format
        {
            let text = serde_json::value::to_raw_value(schema)
                .map_err(|e| ApiError::bad_param("text", format!("text.format.schema: {e}")))?;
            check_schema_size(&text, "text", "the text.format schema", limits)?;
        }
        let response_format = match format.clone() {
            None | Some(TextFormat::Text) => None,
            Some(TextFormat::JsonObject) => Some(ResponseFormat::JsonObject),
            Some(TextFormat::JsonSchema { schema: None, .. }) => {
                return Err(ApiError::bad_param(
                    "text",
                    "text.format of type json_schema has no `schema`: give the JSON schema the answer must follow",
                ))
            }
            Some(TextFormat::JsonSchema {
                name,
                schema,
                strict,
            }) => Some(ResponseFormat::JsonSchema {
                json_schema: JsonSchemaFormat {
                    name,
                    schema: schema
                        .map(|s| serde_json::value::to_raw_value(&s))
                        .transpose()
                        .map_err(|e| {
                            ApiError::bad_param("text", format!("text.format.schema: {e}"))
                        })?,
                    strict,
                },
            }),
        };
        let given_tools = read_objects(self.tools.unwrap_or_default(), "tools", "`tools`", limits)?;
        let tools = chat_tools(&given_tools)?
            .iter()
            .map(RawObject::from_map)
            .collect::<Vec<_>>();
        let (tool_choice, choice_echo) = tool_choice(self.tool_choice)?;
        let forces_call = matches!(&tool_choice, Some(ToolChoiceParam::Named { .. }))
            || matches!(&tool_choice, Some(ToolChoiceParam::Mode(m)) if m == "required");
        if forces_call && response_format.is_some() && !tools.is_empty() {
            return Err(ApiError::bad_param(
                "tool_choice",
                "a required tool call and a JSON text.format are both given: send one of them",
            ));
        }
        let turns = turns(self.instructions.as_deref(), self.input)?;
        let echo = Echo {
            instructions: self.instructions,
            max_output_tokens: self.max_output_tokens,
            tools: given_tools.into_iter().map(Value::Object).collect(),
            tool_choice: choice_echo,
            text: json!({"format": format_echo(format.as_ref())}),
            metadata: self.metadata.map_or_else(|| json!({}), Value::Object),
            parallel_tool_calls: self.parallel_tool_calls.unwrap_or(true),
        };
        let generation = GenerationRequest {
            max_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            stream: self.stream.unwrap_or(false),
            response_format,
            tools: (!tools.is_empty()).then_some(tools),
            tool_choice,
            ..GenerationRequest::default()
        };
        Ok((generation.check_chat(turns, limits)?, echo))
    }

    /// Refuses what only a server that keeps responses could do.
    fn refuse_state(&self) -> Result<(), ApiError> {
        const WHY: &str = "this server is stateless and keeps no responses; send the whole conversation in `input` instead";
        let refused = if self.previous_response_id.is_some() {
            Some((
                "previous_response_id",
                "previous_response_id is not supported",
            ))
        } else if self.store == Some(true) {
            Some((
                "store",
                "store: true is not supported (send store: false or leave it out)",
            ))
        } else if self.background == Some(true) {
            Some(("background", "background: true is not supported"))
        } else if self.conversation.is_some() {
            Some(("conversation", "conversation is not supported"))
        } else if self.prompt.is_some() {
            Some(("prompt", "stored prompts (prompt) are not supported"))
        } else {
            None
        };
        match refused {
            Some((param, what)) => Err(ApiError::bad_param(param, format!("{what}: {WHY}"))),
            None => Ok(()),
        }
    }
}

/// The `text.format` a response reports.
fn format_echo(format: Option<&TextFormat>) -> Value {
    match format {
        None | Some(TextFormat::Text) => json!({"type": "text"}),
        Some(TextFormat::JsonObject) => json!({"type": "json_object"}),
        Some(TextFormat::JsonSchema {
            name,
            schema,
            strict,
        }) => json!({"type": "json_schema", "name": name.as_deref().unwrap_or("response"),
            "schema": schema, "strict": strict.unwrap_or(false)}),
    }
}

/// Responses' flat function tools in chat completions' shape (which the templates and the call
/// grammar read).
fn chat_tools(tools: &[Map<String, Value>]) -> Result<Vec<Map<String, Value>>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::bad_param(
                    "tools",
                    format!("tools[{i}] is of type `{kind}`: only function tools (`{{\"type\": \"function\", \"name\": ...}}`) can be called here"),
                ));
            }
            let name = tool.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                return Err(ApiError::bad_param(
                    "tools",
                    format!("tools[{i}] has no `name`"),
                ));
            }
            let mut function = Map::new();
            function.insert("name".into(), name.into());
            for key in ["description", "parameters"] {
                if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                    function.insert(key.into(), v.clone());
                }
            }
            let mut chat = Map::new();
            chat.insert("type".into(), "function".into());
            chat.insert("function".into(), Value::Object(function));
            Ok(chat)
        })
        .collect()
}

/// `tool_choice` as chat completions reads it, and as the response reports it.
fn tool_choice(
    choice: Option<ResponsesToolChoice>,
) -> Result<(Option<ToolChoiceParam>, Value), ApiError> {
    match choice {
        None => Ok((None, json!("auto"))),
        Some(ResponsesToolChoice::Mode(mode)) => {
            let echo = json!(mode);
            Ok((Some(ToolChoiceParam::Mode(mode)), echo))
        }
        Some(ResponsesToolChoice::Typed {
            kind,
            name: Some(name),
        }) if kind == "function" => {
            let echo = json!({"type": "function", "name": name});
            Ok((
                Some(ToolChoiceParam::Named {
                    function: NamedFunction { name },
                }),
                echo,
            ))
        }
        Some(ResponsesToolChoice::Typed { kind, .. }) => Err(ApiError::bad_param(
            "tool_choice",
            format!("tool_choice of type `{kind}` is not supported: send \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": ...}}"),
        )),
    }
}

/// The chat's turns: `instructions` as the system turn, then the items.
fn turns(instructions: Option<&str>, input: Input) -> Result<Vec<Turn>, ApiError> {
    let mut turns = Vec::new();
    if let Some(text) = instructions.filter(|t| !t.is_empty()) {
        turns.push(turn("system", text.to_owned()));
    }
    let items = match input {
        Input::Text(text) => {
            turns.push(turn("user", text));
            return Ok(turns);
        }
        Input::Items(items) => items,
    };
    if items.is_empty() {
        return Err(ApiError::bad_param(
            "input",
            "input is an empty list: send at least one message",
        ));
    }
    for (i, item) in items.into_iter().enumerate() {
        match item.kind.as_deref().unwrap_or("message") {
            "message" => {
                let role = match item.role.as_deref() {
                    Some(r @ ("user" | "assistant" | "system")) => r,
                    // Chat templates know one kind of instructions.
                    Some("developer") => "system",
                    other => {
                        return Err(ApiError::bad_param(
                            "input",
                            format!("input[{i}] has role {other:?}: a message's role is user, assistant, system or developer"),
                        ))
                    }
                };
                let content = text_of(item.content.as_ref(), i)?;
                // Instructions and leading system messages make one system turn: templates
                // take one.
                match turns.last_mut() {
                    Some(last) if role == "system" && last.role == "system" => {
                        last.content.push_str("\n\n");
                        last.content.push_str(&content);
                    }
                    _ => turns.push(turn(role, content)),
                }
            }
            "function_call" => {
                let Some(name) = item.name.as_deref().filter(|n| !n.is_empty()) else {
                    return Err(ApiError::bad_param(
                        "input",
                        format!("input[{i}] is a function_call without a `name`"),
                    ));
                };
                let call = template_call(
                    item.call_id.as_deref(),
                    name,
                    item.arguments.as_deref().unwrap_or("{}"),
                );
                // The calls of one answer, and the message before them, are one turn.
                match turns.last_mut() {
                    Some(last) if last.role == "assistant" => {
                        match last.tool_calls.get_or_insert_with(|| json!([])) {
                            Value::Array(calls) => calls.push(call),
                            other => *other = json!([call]),
                        }
                    }
                    _ => turns.push(Turn {
                        tool_calls: Some(json!([call])),
                        ..turn("assistant", String::new())
                    }),
                }
            }
            "function_call_output" => {
                let output = text_of(item.output.as_ref(), i)?;
                turns.push(Turn {
                    tool_call_id: item.call_id,
                    ..turn("tool", output)
                });
            }
            // The model's reasoning from another server: opaque, and no part of the dialogue
            // a template renders.
            "reasoning" => {}
            other => {
                return Err(ApiError::bad_param(
                    "input",
                    format!("input[{i}] is of type `{other}`, which is not supported: send messages, function_call and function_call_output items"),
                ))
            }
        }
    }
    Ok(turns)
}

fn turn(role: &str, content: String) -> Turn {
    Turn {
        role: role.to_owned(),
        content,
        tool_calls: None,
        tool_call_id: None,
    }
}

/// The text of a message's content or of a call's output; parts other than text are refused,
/// not dropped.
fn text_of(content: Option<&MessageContent>, i: usize) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(MessageContent::Text(text)) => Ok(text.clone()),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .map(|ContentPart { kind, text }| match (kind.as_str(), text) {
                ("input_text" | "output_text" | "text", Some(t)) => Ok(t.as_str()),
                (kind, _) => Err(ApiError::bad_param(
                    "input",
                    format!("input[{i}] has a content part of type `{kind}`, which is not supported: this model reads text only"),
                )),
            })
            .collect(),
    }
}

/// A string, or a list whose elements keep their place in error paths (`input[2].content`),
/// which an untagged enum would lose.
impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Input, D::Error> {
        struct InputVisitor;
        impl<'de> Visitor<'de> for InputVisitor {
            type Value = Input;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of input items")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Input, E> {
                Ok(Input::Text(text.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Input, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Input::Items(items))
            }
        }
        d.deserialize_any(InputVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::openai::tools::ToolChoice;

    fn check(body: Value) -> Result<(Checked<Vec<Turn>>, Echo), ApiError> {
        // As the server reads bodies: from text (schemas and tools stay raw JSON text).
        serde_json::from_str::<ResponsesRequest>(&body.to_string())
            .unwrap()
            .check(&InputArgs::default())
    }

    fn param_of(result: Result<(Checked<Vec<Turn>>, Echo), ApiError>) -> &'static str {
        match result {
            Err(ApiError::BadRequest { param: Some(p), .. }) => p,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn a_string_is_one_user_turn_after_the_instructions() {
        let (c, echo) =
            check(json!({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9}))
                .unwrap();
        let roles: Vec<&str> = c.input.iter().map(|t| t.role.as_str()).collect();
        assert_eq!(roles, ["system", "user"]);
        assert_eq!(c.input[1].content, "Hi");
        assert_eq!(c.generation.max_tokens, Some(9));
        assert_eq!(echo.tool_choice, "auto");
        assert_eq!(echo.text, json!({"format": {"type": "text"}}));
    }

    #[test]
    fn items_become_turns_with_calls_and_their_outputs() {
        let (c, _) = check(json!({"instructions": "A", "input": [
            {"role": "developer", "content": "B"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_text", "text": "y"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "2"},
            {"type": "reasoning", "summary": []},
        ]}))
        .unwrap();
        let t = &c.input;
        assert_eq!(t.len(), 4, "{t:?}");
        assert_eq!(
            (t[0].role.as_str(), t[0].content.as_str()),
            ("system", "A\n\nB")
        );
        assert_eq!(t[1].content, "xy");
        assert_eq!(t[2].content, "Let me see.");
        let calls = t[2].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["function"]["arguments"]["a"], 1);
        assert_eq!(calls[1]["function"]["name"], "g");
        assert_eq!(t[3].role, "tool");
        assert_eq!(t[3].tool_call_id.as_deref(), Some("c1"));
    }

    #[test]
    fn formats_and_tools_take_the_chat_path() {
        let (c, echo) = check(
            json!({"input": "x", "text": {"format": {"type": "json_schema",
            "name": "n", "strict": true, "schema": {"type": "integer"}}}}),
        )
        .unwrap();
        assert_eq!(c.constraint.unwrap().0, "response_format");
        assert_eq!(echo.text["format"]["schema"], json!({"type": "integer"}));
        let (c, echo) = check(json!({"input": "x", "tool_choice": "required", "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}]}))
        .unwrap();
        let tools = c.tools.unwrap();
        assert_eq!(tools.choice, ToolChoice::Required);
        assert_eq!(tools.tools[0]["function"]["name"], "f");
        assert_eq!(echo.tools[0]["name"], "f");
        let (c, _) = check(
            json!({"input": "x", "tool_choice": {"type": "function", "name": "f"},
            "tools": [{"type": "function", "name": "f"}]}),
        )
        .unwrap();
        assert_eq!(c.tools.unwrap().choice, ToolChoice::Named("f".into()));
    }

    #[test]
    fn state_and_bad_values_are_refused_by_name() {
        for (body, param) in [
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (json!({"input": "x", "store": true}), "store"),
            (json!({"input": "x", "background": true}), "background"),
            (
                json!({"input": "x", "conversation": "conv_1"}),
                "conversation",
            ),
            (json!({"input": "x", "prompt": {"id": "p"}}), "prompt"),
            (
                json!({"input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (json!({"input": "x", "temperature": 3}), "temperature"),
            (
                json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}),
                "text",
            ),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools",
            ),
            (
                json!({"input": "x", "tools": [{"type": "function"}]}),
                "tools",
            ),
            (
                json!({"input": "x", "tool_choice": {"type": "file_search"}}),
                "tool_choice",
            ),
            (
                json!({"input": "x", "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"input": "x", "tool_choice": "required", "tools": [{"type": "function", "name": "f"}],
                "text": {"format": {"type": "json_object"}}}),
                "tool_choice",
            ),
            (json!({"input": []}), "input"),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input",
            ),
            (
                json!({"input": [{"type": "image_generation_call"}]}),
                "input",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input",
            ),
            (
                json!({"input": [{"type": "function_call", "arguments": "{}"}]}),
                "input",
            ),
        ] {
            assert_eq!(param_of(check(body.clone())), param, "{body}");
        }
        // What the SDK sends when store is not given, and store: false, are fine.
        check(json!({"input": "x", "store": false, "previous_response_id": null})).unwrap();
    }

    #[test]
    fn input_errors_keep_their_path() {
        let body = r#"{"input": [{"role": "user", "content": "a"}, {"role": 5}]}"#;
        let mut de = serde_json::Deserializer::from_str(body);
        let err = serde_path_to_error::deserialize::<_, ResponsesRequest>(&mut de).unwrap_err();
        assert_eq!(err.path().to_string(), "input[1].role");
        let err = serde_json::from_str::<ResponsesRequest>(r#"{"input": 5}"#).unwrap_err();
        assert!(
            err.to_string()
                .contains("a string or a list of input items"),
            "{err}"
        );
        let err = serde_json::from_str::<ResponsesRequest>("{}").unwrap_err();
        assert!(
            err.to_string().starts_with("missing field `input`"),
            "{err}"
        );
    }
}
