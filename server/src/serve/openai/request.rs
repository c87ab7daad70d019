//! Request bodies of the OpenAI API, as the official SDKs send them, and their checks. Unknown
//! fields are ignored, as OpenAI does.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::engine::chat_template::{ToolSyntax, Turn};
use crate::engine::Generation;
use crate::grammar::Spec;
use crate::sampler::SamplerParams;
use crate::serve::error::ApiError;
use crate::serve::input::{InputArgs, MAX_STOP_BYTES};
use crate::serve::openai::tools::{ToolChoice, ToolRequest};

pub use super::one_or_list::{Prompt, PromptInput, Stop};

/// `POST /v1/chat/completions`.
#[derive(Debug)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub generation: GenerationRequest,
}

/// `POST /v1/completions`.
#[derive(Debug)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    pub generation: GenerationRequest,
}

/// A generating request after its checks: its input, what the engine is to do, and how the
/// answer is sent.
pub struct Checked<I> {
    pub input: I,
    pub generation: Generation,
    pub delivery: Delivery,
    /// The output's required form, and the parameter that asked for it (for errors).
    pub constraint: Option<(&'static str, Spec)>,
    /// The functions the model may call (chat only; none with `tool_choice: "none"`).
    pub tools: Option<ToolRequest>,
}

/// How the answer is sent.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    /// As server-sent events, a chunk per piece of text.
    pub stream: bool,
    /// A last chunk with the token counts (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Each choice and chunk carries the tokens' log-probabilities.
    pub logprobs: bool,
    /// Tools are offered: calls in this syntax are read back into `tool_calls`.
    pub tools: Option<ToolSyntax>,
}

impl ChatRequest {
    /// The request's values checked, within `limits`.
    pub fn check(self, limits: &InputArgs) -> Result<Checked<Vec<Turn>>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_param(
                "messages",
                "messages is empty: send at least one message",
            ));
        }
        // Calls' arguments are read into trees for the template: as big as a tool list may be.
        let arguments = self
            .messages
            .iter()
            .flat_map(|m| m.tool_calls.iter().flatten())
            .map(|c| c.function.arguments.len())
            .max();
        if let Some(bytes) = arguments {
            limits.check_grammar_size(
                "messages",
                "a tool call's `arguments` in `messages`",
                bytes,
            )?;
        }
        let turns = self
            .messages
            .iter()
            .map(|m| {
                Ok(Turn {
                    role: m.role.clone(),
                    content: m.text()?,
                    tool_calls: m.template_tool_calls(),
                    tool_call_id: m.tool_call_id.clone(),
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        self.generation.check_chat(turns, limits)
    }
}

impl GenerationRequest {
    /// Checks the parameters of a chat whose `turns` are read: as chat completions', and as
    /// the Responses and Anthropic requests' once translated into them.
    pub fn check_chat(
        mut self,
        turns: Vec<Turn>,
        limits: &InputArgs,
    ) -> Result<Checked<Vec<Turn>>, ApiError> {
        let tools = tool_request(self.tools.take(), self.tool_choice.take(), limits)?;
        let (generation, delivery, constraint) = self.check(limits)?;
        if tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto) && constraint.is_some() {
            return Err(ApiError::bad_param(
                "tool_choice",
                "a required tool call and a response_format/grammar are both given: send one of them",
            ));
        }
        Ok(Checked {
            input: turns,
            generation,
            delivery,
            constraint,
            tools,
        })
    }
}

impl CompletionRequest {
    /// The request's values checked, within `limits`.
    pub fn check(self, limits: &InputArgs) -> Result<Checked<PromptInput>, ApiError> {
        if self.generation.tools.is_some() {
            return Err(ApiError::bad_param(
                "tools",
                "tools are for /v1/chat/completions; completions continue text",
            ));
        }
        let (generation, delivery, constraint) = self.generation.check(limits)?;
        Ok(Checked {
            input: self.prompt.into_input()?,
            generation,
            delivery,
            constraint,
            tools: None,
        })
    }
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant message's calls, as OpenAI returned them.
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A `tool` message answers this call.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct MessageToolCall {
    #[serde(default)]
    pub id: Option<String>,
    pub function: CalledFunction,
}

#[derive(Debug, Deserialize)]
pub struct CalledFunction {
    pub name: String,
    /// JSON text, as OpenAI sends it.
    #[serde(default)]
    pub arguments: String,
}

/// A message's content: a string, or a list of parts of which we can read the text ones.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl ChatMessage {
    /// The calls as chat templates read them: arguments as an object (text that is no JSON
    /// object stays text).
    fn template_tool_calls(&self) -> Option<serde_json::Value> {
        let calls = self.tool_calls.as_ref()?;
        Some(serde_json::Value::Array(
            calls
                .iter()
                .map(|c| template_call(c.id.as_deref(), &c.function.name, &c.function.arguments))
                .collect(),
        ))
    }

    /// The message's text; parts other than text (images, audio) are refused, not dropped.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(MessageContent::Text(s)) => Ok(s.clone()),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    (kind, _) => Err(ApiError::bad_param(
                        "messages",
                        format!("content part of type `{kind}` is not supported: this model reads text only"),
                    )),
                })
                .collect(),
        }
    }
}

/// One call of an assistant turn as chat templates read it: arguments (JSON text) as an
/// object; text that is no JSON object stays text.
pub fn template_call(id: Option<&str>, name: &str, arguments: &str) -> serde_json::Value {
    let args = serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| arguments.into());
    serde_json::json!({"id": id, "type": "function",
        "function": {"name": name, "arguments": args}})
}

impl Prompt {
    pub fn into_input(self) -> Result<PromptInput, ApiError> {
        match self {
            Prompt::Text(s) => Ok(PromptInput::Text(s)),
            Prompt::Tokens(t) => Ok(PromptInput::Tokens(t)),
            Prompt::Listed { first, count: 1 } => Ok(first),
            Prompt::Listed { count, .. } => Err(ApiError::bad_param(
                "prompt",
                format!("prompt lists {count} prompts; send one prompt per request"),
            )),
        }
    }
}

/// Declares [`GenerationRequest`] and the reader of its fields from one list, so that a field
/// cannot be declared and never read.
macro_rules! generation_request {
    ($($(#[$doc:meta])* $field:ident: $ty:ty,)*) => {
        /// The generation parameters both generating endpoints take, in the same JSON object as
        /// the endpoint's own field (`messages`, `prompt`).
        #[derive(Debug, Default)]
        pub struct GenerationRequest {
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl GenerationRequest {
            #[cfg(test)]
            const FIELDS: &[&str] = &[$(stringify!($field)),*];

            /// Reads the value of `key` if it is one of the parameters; false if it is not.
            fn read<'de, A: MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<bool, A::Error> {
                $(if key == stringify!($field) {
                    self.$field = map.next_value()?;
                    return Ok(true);
                })*
                Ok(false)
            }
        }
    };
}

generation_request! {
    /// Accepted and ignored: this server serves one model.
    model: Option<String>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    /// OpenAI sends integers; a negative seed (llama.cpp's -1) means "random".
    seed: Option<i64>,
    stop: Option<Stop>,
    n: Option<u32>,
    stream: bool,
    stream_options: Option<StreamOptions>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`.
    response_format: Option<ResponseFormat>,
    /// A GBNF grammar (llama.cpp's syntax) the output must follow.
    grammar: Option<String>,
    /// Chat: `true`/`false`; completions: how many alternatives per token.
    logprobs: Option<LogprobsParam>,
    /// Chat: alternatives per token, with `logprobs: true`.
    top_logprobs: Option<u32>,
    /// Chat: OpenAI's `[{"type": "function", "function": {name, description, parameters}}]`,
    /// kept as JSON text until its size is checked (`--max-grammar-bytes`).
    tools: Option<Vec<RawObject>>,
    /// Chat: "auto", "none", "required" or `{"type": "function", "function": {"name": ...}}`.
    tool_choice: Option<ToolChoiceParam>,
    /// llama-server's extension: `false` evaluates the whole prompt instead of reusing the
    /// longest prefix a slot has cached.
    cache_prompt: Option<bool>,
    /// `false` turns prompt-lookup speculative decoding off for this request (it changes
    /// speed only, never the output).
    speculative: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceParam {
    Mode(String),
    Named { function: NamedFunction },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// A JSON object kept as its text: a request's schemas and tools are read into trees only once
/// their size is known to be within the limit (a 2 MiB body of `[{"a":0},...]` costs ~90 times
/// its size as a tree).
#[derive(Debug)]
pub struct RawObject(Box<RawValue>);

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        if !raw.get().starts_with('{') {
            return Err(de::Error::invalid_type(
                de::Unexpected::Other(raw.get().get(..1).unwrap_or("nothing")),
                &"a JSON object",
            ));
        }
        Ok(RawObject(raw))
    }
}

impl RawObject {
    /// `object`, kept as its text.
    pub fn from_map(object: &serde_json::Map<String, serde_json::Value>) -> RawObject {
        // A map of JSON values always serializes: its keys are strings.
        RawObject(serde_json::value::to_raw_value(object).unwrap_or_default())
    }
}

/// The objects of `raw` read into trees, once their total size (as a JSON list) is within
/// --max-grammar-bytes; `what` names them in the 413 (as `param` names them in the 400).
pub fn read_objects(
    raw: Vec<RawObject>,
    param: &'static str,
    what: &'static str,
    limits: &InputArgs,
) -> Result<Vec<serde_json::Map<String, serde_json::Value>>, ApiError> {
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let bytes = raw.iter().map(|t| t.0.get().len() + 1).sum::<usize>() + 1;
    limits.check_grammar_size(param, what, bytes)?;
    raw.iter()
        .map(|t| serde_json::from_str(t.0.get()))
        .collect::<Result<_, _>>()
        .map_err(|e| ApiError::bad_param(param, format!("{param}: {e}")))
}

/// A schema kept as its text, within --max-grammar-bytes.
pub fn check_schema_size(
    schema: &RawValue,
    param: &'static str,
    what: &'static str,
    limits: &InputArgs,
) -> Result<(), ApiError> {
    limits.check_grammar_size(param, what, schema.get().len())
}

/// Checks `tools` (each a function with a name, all of them within --max-grammar-bytes) and
/// `tool_choice` against them.
fn tool_request(
    tools: Option<Vec<RawObject>>,
    choice: Option<ToolChoiceParam>,
    limits: &InputArgs,
) -> Result<Option<ToolRequest>, ApiError> {
    let tools = tools.unwrap_or_default();
    // As the list's JSON text: the objects, the commas between them and the brackets.
    let bytes = tools.iter().map(|t| t.0.get().len() + 1).sum::<usize>() + 1;
    if !tools.is_empty() {
        limits.check_grammar_size("tools", "`tools`", bytes)?;
    }
    let tools: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| serde_json::from_str(t.0.get()))
        .collect::<Result<_, _>>()
        .map_err(|e| ApiError::bad_param("tools", format!("tools: {e}")))?;
    for (i, tool) in tools.iter().enumerate() {
        let named = tool["function"]["name"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        if tool["type"] != "function" || !named {
            return Err(ApiError::bad_param(
                "tools",
                format!("tools[{i}] is not {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}: only functions can be called"),
            ));
        }
        if !matches!(
            tool["function"].get("parameters"),
            None | Some(serde_json::Value::Object(_))
        ) {
            return Err(ApiError::bad_param(
                "tools",
                format!("tools[{i}].function.parameters must be a JSON schema object"),
            ));
        }
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(ToolChoiceParam::Mode(m)) => match m.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => return Ok(None),
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!(
                    "tool_choice `{other}` is not one of auto, none, required or a named function"
                ),
                ))
            }
        },
        Some(ToolChoiceParam::Named { function }) => {
            if !tools
                .iter()
                .any(|t| t["function"]["name"] == function.name.as_str())
            {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!(
                        "tool_choice names `{}`, which is not among the tools",
                        function.name
                    ),
                ));
            }
            ToolChoice::Named(function.name)
        }
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto => Ok(None),
            _ => Err(ApiError::bad_param(
                "tool_choice",
                "tool_choice asks for a call but no tools are given",
            )),
        };
    }
    Ok(Some(ToolRequest { tools, choice }))
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum LogprobsParam {
    Flag(bool),
    Count(u32),
}

/// OpenAI's limit on `top_logprobs`.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// OpenAI's `response_format`.
#[derive(Debug)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format` as sent, read as a plain struct: an internally tagged enum would buffer
/// the schema as a tree before [`RawValue`] could keep it as text.
#[derive(Deserialize)]
struct ResponseFormatFields {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    json_schema: Option<JsonSchemaFormat>,
}

impl<'de> Deserialize<'de> for ResponseFormat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const KINDS: &[&str] = &["text", "json_object", "json_schema"];
        let fields = ResponseFormatFields::deserialize(d)?;
        match (fields.kind.as_str(), fields.json_schema) {
            ("text", _) => Ok(ResponseFormat::Text),
            ("json_object", _) => Ok(ResponseFormat::JsonObject),
            ("json_schema", Some(json_schema)) => Ok(ResponseFormat::JsonSchema { json_schema }),
            ("json_schema", None) => Err(de::Error::missing_field("json_schema")),
            (other, _) => Err(de::Error::unknown_variant(other, KINDS)),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub name: Option<String>,
    /// Kept as JSON text until its size is checked (`--max-grammar-bytes`).
    #[serde(default)]
    pub schema: Option<Box<RawValue>>,
    /// Accepted; the schema is always enforced, strict or not.
    #[serde(default)]
    pub strict: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

impl GenerationRequest {
    /// The engine's settings, the answer's delivery and the output's required form; refuses
    /// values out of range by name.
    #[allow(clippy::type_complexity)]
    pub fn check(
        self,
        limits: &InputArgs,
    ) -> Result<(Generation, Delivery, Option<(&'static str, Spec)>), ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::bad_param(
                "n",
                format!("n = {n}: this server returns one choice per request; send {n} requests instead"),
            ));
        }
        let defaults = SamplerParams::default();
        let temperature = in_range("temperature", self.temperature, 0.0, 2.0)?;
        let top_p = in_range("top_p", self.top_p, 0.0, 1.0)?;
        let min_p = in_range("min_p", self.min_p, 0.0, 1.0)?;
        let presence = in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        let frequency = in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        let repeat = in_range("repeat_penalty", self.repeat_penalty, 0.0, 10.0)?;
        // Logits are divided by it: 0 would make them infinite (NaN once multiplied by 0).
        if repeat.is_some_and(|r| r <= 0.0) {
            return Err(ApiError::bad_param(
                "repeat_penalty",
                "repeat_penalty = 0 is out of range: it must be greater than 0 and at most 10 (1 turns it off)",
            ));
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) => {
                return Err(ApiError::bad_param(
                    "max_tokens",
                    "max_tokens must be at least 1",
                ))
            }
            other => other.map(|n| n as usize),
        };
        // At most MAX_STOPS: the reader of `stop` refuses more.
        let stop: Vec<String> = self
            .stop
            .unwrap_or_default()
            .0
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::bad_param(
                "stop",
                format!(
                    "a stop sequence of {} bytes was given; each may be at most {MAX_STOP_BYTES} bytes",
                    long.len()
                ),
            ));
        }
        let seed = match self.seed {
            Some(s) if s >= 0 => s as u64,
            _ => random_seed(),
        };
        let generation = Generation {
            sampler: SamplerParams {
                temperature: temperature.unwrap_or(defaults.temperature),
                top_k: self.top_k.map_or(defaults.top_k, |k| k as usize),
                top_p: top_p.unwrap_or(defaults.top_p),
                min_p: min_p.unwrap_or(defaults.min_p),
                repeat_penalty: repeat.unwrap_or(defaults.repeat_penalty),
                presence_penalty: presence.unwrap_or(defaults.presence_penalty),
                frequency_penalty: frequency.unwrap_or(defaults.frequency_penalty),
                repeat_last_n: defaults.repeat_last_n,
                seed,
            },
            max_tokens,
            stop,
            constraint: None,
            logprobs: None,
            cache_prompt: self.cache_prompt.unwrap_or(true),
            speculative: self.speculative.unwrap_or(true),
            // The server's setting (`serve --special`), applied when the job is submitted.
            special: false,
        };
        let delivery = Delivery {
            stream: self.stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            logprobs: false,
            tools: None,
        };
        let constraint = output_form(self.response_format, self.grammar, limits)?;
        let generation = Generation {
            logprobs: logprobs(self.logprobs, self.top_logprobs)?,
            ..generation
        };
        let delivery = Delivery {
            logprobs: generation.logprobs.is_some(),
            ..delivery
        };
        Ok((generation, delivery, constraint))
    }
}

/// How many alternatives per token to report, if log-probabilities are asked for at all.
fn logprobs(logprobs: Option<LogprobsParam>, top: Option<u32>) -> Result<Option<usize>, ApiError> {
    let n = match (logprobs, top) {
        (None | Some(LogprobsParam::Flag(false)), Some(n)) if n > 0 => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        (None | Some(LogprobsParam::Flag(false)), _) => return Ok(None),
        (Some(LogprobsParam::Flag(true)), top) => top.unwrap_or(0),
        (Some(LogprobsParam::Count(n)), _) => n,
    };
    if n > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_param(
            "top_logprobs",
            format!("{n} alternatives per token asked for; at most {MAX_TOP_LOGPROBS} are given"),
        ));
    }
    Ok(Some(n as usize))
}

/// What `response_format` and `grammar` ask of the output (at most one of them), each within
/// --max-grammar-bytes.
fn output_form(
    format: Option<ResponseFormat>,
    grammar: Option<String>,
    limits: &InputArgs,
) -> Result<Option<(&'static str, Spec)>, ApiError> {
    if let Some(g) = &grammar {
        limits.check_grammar_size("grammar", "`grammar`", g.len())?;
    }
    let format = match format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(Spec::JsonObject),
        Some(ResponseFormat::JsonSchema { json_schema }) => match json_schema.schema {
            Some(schema) => {
                limits.check_grammar_size(
                    "response_format",
                    "the `response_format` JSON schema",
                    schema.get().len(),
                )?;
                let schema = serde_json::from_str(schema.get())
                    .map_err(|e| ApiError::bad_param("response_format", e.to_string()))?;
                Some(Spec::JsonSchema(schema))
            }
            None => {
                return Err(ApiError::bad_param(
                    "response_format",
                    "response_format.json_schema has no `schema`: give the JSON schema the answer must follow",
                ))
            }
        },
    };
    match (format, grammar) {
        (Some(_), Some(_)) => Err(ApiError::bad_param(
            "grammar",
            "both grammar and a JSON response_format are given: send one of them",
        )),
        (Some(spec), None) => Ok(Some(("response_format", spec))),
        (None, Some(g)) => Ok(Some(("grammar", Spec::Gbnf(g)))),
        (None, None) => Ok(None),
    }
}

fn in_range(
    param: &'static str,
    value: Option<f32>,
    lo: f32,
    hi: f32,
) -> Result<Option<f32>, ApiError> {
    match value {
        Some(v) if !(lo..=hi).contains(&v) => Err(ApiError::bad_param(
            param,
            format!("{param} = {v} is out of range: it must be between {lo} and {hi}"),
        )),
        other => Ok(other),
    }
}

/// A seed for requests that did not give one: different for every request.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded per process and perturbed per instance: enough for sampling.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

// ---- reading a generating request in one pass --------------------------------------------
//
// Not `#[serde(flatten)]`: flatten buffers the fields it hands on, and their errors lose the
// field's name (`invalid JSON body at `max_tokens`: ...` would lose `at `max_tokens``).

impl<'de> Deserialize<'de> for ChatRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (messages, generation) =
            d.deserialize_map(WithGeneration::new("ChatRequest", "messages"))?;
        Ok(ChatRequest {
            messages,
            generation,
        })
    }
}

impl<'de> Deserialize<'de> for CompletionRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (prompt, generation) =
            d.deserialize_map(WithGeneration::new("CompletionRequest", "prompt"))?;
        Ok(CompletionRequest { prompt, generation })
    }
}

/// Reads an object of one required field `field` (of type `T`) beside the generation
/// parameters. A repeated field keeps its last value, as JSON objects read into maps do.
struct WithGeneration<T> {
    /// For "expected struct …" messages.
    name: &'static str,
    field: &'static str,
    value: PhantomData<T>,
}

impl<T> WithGeneration<T> {
    fn new(name: &'static str, field: &'static str) -> Self {
        WithGeneration {
            name,
            field,
            value: PhantomData,
        }
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for WithGeneration<T> {
    type Value = (T, GenerationRequest);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "struct {}", self.name)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut value = None;
        let mut generation = GenerationRequest::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == self.field {
                value = Some(map.next_value()?);
            } else if !generation.read(&key, &mut map)? {
                map.next_value::<IgnoredAny>()?;
            }
        }
        let value = value.ok_or_else(|| de::Error::missing_field(self.field))?;
        Ok((value, generation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: &str) -> Result<ChatRequest, serde_json::Error> {
        serde_json::from_str(json)
    }

    fn generation(json: &str) -> Result<(Generation, Delivery), ApiError> {
        chat(json)
            .unwrap()
            .generation
            .check(&InputArgs::default())
            .map(|(g, d, _)| (g, d))
    }

    #[test]
    fn tools_and_tool_choice() {
        let tools = r#""tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]"#;
        let check = |extra: &str| {
            chat(&format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],{extra}}}"#
            ))
            .unwrap()
            .check(&InputArgs::default())
            .map(|c| c.tools.map(|t| t.choice))
        };
        assert_eq!(check(tools).unwrap(), Some(ToolChoice::Auto));
        assert_eq!(
            check(&format!(r#"{tools},"tool_choice":"none""#)).unwrap(),
            None
        );
        assert_eq!(
            check(&format!(r#"{tools},"tool_choice":"required""#)).unwrap(),
            Some(ToolChoice::Required)
        );
        assert_eq!(
            check(&format!(
                r#"{tools},"tool_choice":{{"type":"function","function":{{"name":"f"}}}}"#
            ))
            .unwrap(),
            Some(ToolChoice::Named("f".into()))
        );
        for bad in [
            format!(r#"{tools},"tool_choice":{{"type":"function","function":{{"name":"g"}}}}"#),
            format!(r#"{tools},"tool_choice":"sometimes""#),
            r#""tool_choice":"required""#.to_string(),
            r#""tools":[{"type":"retrieval"}]"#.to_string(),
            format!(
                r#"{tools},"tool_choice":"required","response_format":{{"type":"json_object"}}"#
            ),
        ] {
            assert!(check(&bad).is_err(), "{bad}");
        }
        let msgs = r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"2"}]}"#;
        let turns = chat(msgs)
            .unwrap()
            .check(&InputArgs::default())
            .unwrap()
            .input;
        assert_eq!(
            turns[0].tool_calls.as_ref().unwrap()[0]["function"]["arguments"]["x"],
            1
        );
        assert_eq!(turns[1].tool_call_id.as_deref(), Some("c1"));
    }

    #[test]
    fn logprobs_flags_and_counts() {
        let n = |json: &str| generation(json).map(|(g, _)| g.logprobs);
        assert_eq!(n(r#"{"messages":[]}"#).unwrap(), None);
        assert_eq!(n(r#"{"messages":[],"logprobs":false}"#).unwrap(), None);
        assert_eq!(n(r#"{"messages":[],"logprobs":true}"#).unwrap(), Some(0));
        assert_eq!(
            n(r#"{"messages":[],"logprobs":true,"top_logprobs":5}"#).unwrap(),
            Some(5)
        );
        assert_eq!(n(r#"{"messages":[],"logprobs":3}"#).unwrap(), Some(3));
        assert!(n(r#"{"messages":[],"logprobs":true,"top_logprobs":21}"#).is_err());
        assert!(n(r#"{"messages":[],"top_logprobs":2}"#).is_err());
    }

    #[test]
    fn response_format_and_grammar() {
        let form = |json: &str| {
            chat(json)
                .unwrap()
                .generation
                .check(&InputArgs::default())
                .map(|(_, _, f)| f)
        };
        assert_eq!(
            form(r#"{"messages":[],"response_format":{"type":"text"}}"#).unwrap(),
            None
        );
        assert_eq!(
            form(r#"{"messages":[],"response_format":{"type":"json_object"}}"#).unwrap(),
            Some(("response_format", Spec::JsonObject))
        );
        let schema = r#"{"messages":[],"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"integer"}}}}"#;
        assert_eq!(
            form(schema).unwrap(),
            Some((
                "response_format",
                Spec::JsonSchema(serde_json::json!({"type":"integer"}))
            ))
        );
        assert_eq!(
            form(r#"{"messages":[],"grammar":"root ::= \"a\""}"#).unwrap(),
            Some(("grammar", Spec::Gbnf("root ::= \"a\"".into())))
        );
        for bad in [
            r#"{"messages":[],"response_format":{"type":"json_schema","json_schema":{"name":"n"}}}"#,
            r#"{"messages":[],"response_format":{"type":"json_object"},"grammar":"root ::= \"a\""}"#,
        ] {
            assert!(
                matches!(form(bad), Err(ApiError::BadRequest { .. })),
                "{bad}"
            );
        }
        assert!(chat(r#"{"messages":[],"response_format":{"type":"yaml"}}"#).is_err());
    }

    #[test]
    fn unknown_fields_are_ignored_and_nulls_accepted() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi","name":"x"}],
            "logit_bias":{},"user":"u","temperature":null,"stop":null,"seed":null}"#;
        assert_eq!(chat(body).unwrap().messages.len(), 1);
        let (g, _) = generation(body).unwrap();
        assert_eq!(g.sampler.temperature, SamplerParams::default().temperature);
        assert!(g.stop.is_empty());
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let (g, _) =
            generation(r#"{"messages":[],"max_tokens":5,"max_completion_tokens":7}"#).unwrap();
        assert_eq!(g.max_tokens, Some(7));
    }

    #[test]
    fn stop_is_a_string_or_a_list() {
        let (one, _) = generation(r#"{"messages":[],"stop":"\n"}"#).unwrap();
        assert_eq!(one.stop, vec!["\n"]);
        let (many, _) = generation(r#"{"messages":[],"stop":["a","","b"]}"#).unwrap();
        assert_eq!(many.stop, vec!["a", "b"]);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        for (json, param) in [
            (r#"{"messages":[],"n":2}"#, "n"),
            (r#"{"messages":[],"temperature":3}"#, "temperature"),
            (r#"{"messages":[],"top_p":1.5}"#, "top_p"),
            (r#"{"messages":[],"max_tokens":0}"#, "max_tokens"),
            // Logits are divided by it (issue 42: 0 gave infinite logits).
            (r#"{"messages":[],"repeat_penalty":0}"#, "repeat_penalty"),
            (r#"{"messages":[],"repeat_penalty":-0.0}"#, "repeat_penalty"),
        ] {
            match generation(json) {
                Err(ApiError::BadRequest {
                    param: Some(p),
                    message,
                }) => {
                    assert_eq!(p, param);
                    assert!(message.contains(param), "{message}");
                }
                other => panic!("{json}: {:?}", other.map(|_| ())),
            }
        }
    }

    /// Stop sequences are capped in length, grammars, schemas and tool lists in size: each
    /// refusal names its limit (and its option, for the sizes).
    #[test]
    fn long_stops_and_large_grammars_are_refused_by_name() {
        let long = "x".repeat(MAX_STOP_BYTES + 1);
        let e = generation(&format!(r#"{{"messages":[],"stop":["a","{long}"]}}"#)).unwrap_err();
        assert!(e.to_string().contains(&MAX_STOP_BYTES.to_string()), "{e}");
        let ok = "x".repeat(MAX_STOP_BYTES);
        generation(&format!(r#"{{"messages":[],"stop":"{ok}"}}"#)).unwrap();

        let limits = InputArgs {
            max_grammar_bytes: 100,
            ..InputArgs::default()
        };
        let check = |extra: String| {
            chat(&format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],{extra}}}"#
            ))
            .unwrap()
            .check(&limits)
            .map(|_| ())
        };
        let big = "a".repeat(100);
        let tool = |desc: &str| {
            format!(r#"{{"type":"function","function":{{"name":"f","description":"{desc}"}}}}"#)
        };
        for (extra, param) in [
            (format!(r#""grammar":"root ::= \"{big}\"""#), "grammar"),
            (
                format!(
                    r#""response_format":{{"type":"json_schema","json_schema":{{"schema":{{"description":"{big}"}}}}}}"#
                ),
                "response_format",
            ),
            (format!(r#""tools":[{}]"#, tool(&big)), "tools"),
            (format!(r#""tools":[{},{}]"#, tool("a"), tool("b")), "tools"),
        ] {
            match check(extra.clone()) {
                Err(ApiError::FieldTooLarge { param: p, flag, .. }) => {
                    assert_eq!((p, flag), (param, "--max-grammar-bytes"), "{extra}")
                }
                other => panic!("{extra}: {:?}", other.err()),
            }
        }
        check(format!(r#""grammar":"root ::= \"{}\"""#, &big[..80])).unwrap();
        check(format!(r#""tools":[{}]"#, tool("a"))).unwrap();
    }

    #[test]
    fn stream_options() {
        let (_, d) =
            generation(r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true}}"#)
                .unwrap();
        assert!(d.stream && d.include_usage);
    }

    /// Every parameter is read from the body: a value of the wrong type is refused by name.
    #[test]
    fn every_parameter_is_read() {
        assert_eq!(GenerationRequest::FIELDS.len(), 23);
        for field in GenerationRequest::FIELDS {
            // `[[]]` is of no parameter's type.
            let body = format!(r#"{{"messages":[],"{field}":[[]]}}"#);
            let mut de = serde_json::Deserializer::from_str(&body);
            let err = serde_path_to_error::deserialize::<_, ChatRequest>(&mut de).unwrap_err();
            assert!(err.path().to_string().starts_with(field), "{field}: {err}");
        }
    }

    /// `/openapi.json` documents every parameter that is read.
    #[test]
    fn every_parameter_is_in_the_openapi_spec() {
        let spec: serde_json::Value =
            serde_json::from_str(include_str!("../openapi.json")).unwrap();
        let documented = &spec["components"]["schemas"]["GenerationParameters"]["properties"];
        for field in GenerationRequest::FIELDS {
            assert!(
                documented.get(field).is_some(),
                "{field} is not in openapi.json"
            );
        }
    }

    #[test]
    fn a_repeated_field_keeps_its_last_value() {
        let (g, _) = generation(r#"{"messages":[],"max_tokens":5,"max_tokens":7}"#).unwrap();
        assert_eq!(g.max_tokens, Some(7));
    }

    #[test]
    fn missing_input_and_wrong_shapes() {
        let e = chat(r#"{"max_tokens":5}"#).unwrap_err();
        assert!(e.to_string().starts_with("missing field `messages`"), "{e}");
        let e = chat("5").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid type: integer `5`, expected struct ChatRequest"),
            "{e}"
        );
        let e = serde_json::from_str::<CompletionRequest>("{}").unwrap_err();
        assert!(e.to_string().starts_with("missing field `prompt`"), "{e}");
    }

    #[test]
    fn content_parts() {
        let req = chat(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#).unwrap();
        assert_eq!(req.messages[0].text().unwrap(), "ab");
        let img = chat(r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#).unwrap();
        assert!(img.messages[0].text().is_err());
    }

    #[test]
    fn prompts() {
        let p: CompletionRequest = serde_json::from_str(r#"{"prompt":["one"]}"#).unwrap();
        assert!(matches!(p.prompt.into_input(), Ok(PromptInput::Text(s)) if s == "one"));
        let p: CompletionRequest = serde_json::from_str(r#"{"prompt":[1,2,3]}"#).unwrap();
        assert!(matches!(p.prompt.into_input(), Ok(PromptInput::Tokens(t)) if t == [1, 2, 3]));
        let p: CompletionRequest = serde_json::from_str(r#"{"prompt":["a","b"]}"#).unwrap();
        assert!(p.prompt.into_input().is_err());
    }
}
