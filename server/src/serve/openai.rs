//! Request and response bodies of the OpenAI API, as the official SDKs send and parse them.
//! Unknown request fields are ignored (serde's default), as OpenAI does.

use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::sampler::SamplerParams;

/// `POST /v1/chat/completions`: the messages. The generation parameters are read from the
/// same body as a [`GenerationRequest`] (not `#[serde(flatten)]`, which loses field names from
/// error messages).
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
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

/// `POST /v1/completions`: the prompt, beside a [`GenerationRequest`].
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
}

/// A completion prompt: text or token ids, alone or as a one-element list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    TextList(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

/// What the scheduler needs to know about a prompt before tokenizing.
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    pub fn into_input(self) -> Result<PromptInput, ApiError> {
        fn single<T>(mut list: Vec<T>) -> Result<T, ApiError> {
            match list.len() {
                1 => Ok(list.remove(0)),
                n => Err(ApiError::bad_param(
                    "prompt",
                    format!("prompt lists {n} prompts; send one prompt per request"),
                )),
            }
        }
        Ok(match self {
            Prompt::Text(s) => PromptInput::Text(s),
            Prompt::Tokens(t) => PromptInput::Tokens(t),
            Prompt::TextList(l) => PromptInput::Text(single(l)?),
            Prompt::TokenLists(l) => PromptInput::Tokens(single(l)?),
        })
    }
}

/// The generation parameters shared by both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct GenerationRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// OpenAI sends integers; a negative seed (llama.cpp's -1) means "random".
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Validated generation settings.
#[derive(Debug, Clone)]
pub struct Generation {
    pub sampler: SamplerParams,
    /// `None`: until the end of the context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// OpenAI allows at most 4 stop sequences; a few more cost nothing, hundreds would.
const MAX_STOPS: usize = 16;

impl GenerationRequest {
    pub fn validate(self) -> Result<Generation, ApiError> {
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
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) => {
                return Err(ApiError::bad_param(
                    "max_tokens",
                    "max_tokens must be at least 1",
                ))
            }
            other => other.map(|n| n as usize),
        };
        let stop = match self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(list)) => list,
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::bad_param(
                "stop",
                format!(
                    "{} stop sequences given; at most {MAX_STOPS} are accepted",
                    stop.len()
                ),
            ));
        }
        let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
        let seed = match self.seed {
            Some(s) if s >= 0 => s as u64,
            _ => random_seed(),
        };
        Ok(Generation {
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
            stream: self.stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
        })
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token or a stop sequence.
    Stop,
    /// max_tokens reached, or the context is full.
    Length,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

// ---- responses ---------------------------------------------------------------------------

#[derive(Debug, Serialize)]
pub struct ChatCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: [ChatChoice; 1],
    pub usage: Usage,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<()>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    /// Empty in the final usage chunk, one element otherwise.
    pub choices: Vec<ChunkChoice<'a>>,
    /// Present (null until the last chunk) only when `stream_options.include_usage` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Option<()>,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
}

#[derive(Debug, Serialize)]
pub struct TextCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<TextChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Serialize)]
pub struct TextChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<()>,
    pub finish_reason: Option<FinishReason>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: &str) -> Result<ChatRequest, serde_json::Error> {
        serde_json::from_str(json)
    }

    fn generation(json: &str) -> Result<Generation, ApiError> {
        serde_json::from_str::<GenerationRequest>(json)
            .unwrap()
            .validate()
    }

    #[test]
    fn unknown_fields_are_ignored_and_nulls_accepted() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi","name":"x"}],
            "logit_bias":{},"user":"u","temperature":null,"stop":null,"seed":null}"#;
        assert_eq!(chat(body).unwrap().messages.len(), 1);
        let g = generation(body).unwrap();
        assert_eq!(g.sampler.temperature, SamplerParams::default().temperature);
        assert!(g.stop.is_empty());
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let g = generation(r#"{"max_tokens":5,"max_completion_tokens":7}"#).unwrap();
        assert_eq!(g.max_tokens, Some(7));
    }

    #[test]
    fn stop_is_a_string_or_a_list() {
        assert_eq!(generation(r#"{"stop":"\n"}"#).unwrap().stop, vec!["\n"]);
        let many = generation(r#"{"stop":["a","","b"]}"#).unwrap();
        assert_eq!(many.stop, vec!["a", "b"]);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        for (json, param) in [
            (r#"{"messages":[],"n":2}"#, "n"),
            (r#"{"messages":[],"temperature":3}"#, "temperature"),
            (r#"{"messages":[],"top_p":1.5}"#, "top_p"),
            (r#"{"messages":[],"max_tokens":0}"#, "max_tokens"),
        ] {
            match generation(json) {
                Err(ApiError::BadRequest {
                    param: Some(p),
                    message,
                }) => {
                    assert_eq!(p, param);
                    assert!(message.contains(param), "{message}");
                }
                other => panic!("{json}: {other:?}"),
            }
        }
    }

    #[test]
    fn stream_options() {
        let g = generation(r#"{"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert!(g.stream && g.include_usage);
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

    #[test]
    fn usage_chunk_shapes() {
        let chunk = ChatChunk {
            id: "c",
            object: "chat.completion.chunk",
            created: 1,
            model: "m",
            choices: vec![],
            usage: Some(None),
        };
        assert_eq!(
            serde_json::to_value(&chunk).unwrap()["usage"],
            serde_json::Value::Null
        );
        let chunk = ChatChunk {
            usage: None,
            ..chunk
        };
        assert!(serde_json::to_value(&chunk).unwrap().get("usage").is_none());
    }
}
