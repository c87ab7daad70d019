//! Response bodies of the OpenAI API, as the official SDKs parse them.

use serde::Serialize;

use serde_json::{json, Value};

use crate::engine::{self, FinishReason};
use crate::sampler::{Candidate, TokenLogprob};

/// OpenAI's `finish_reason`.
pub fn finish_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Taken from a slot's cache rather than evaluated.
    pub cached_tokens: usize,
}

impl From<engine::Usage> for Usage {
    fn from(usage: engine::Usage) -> Usage {
        Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
        }
    }
}

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
    pub logprobs: Option<serde_json::Value>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when the answer is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    /// Empty in the final usage chunk, one element otherwise (borrowed: a chunk per token
    /// allocates nothing).
    pub choices: &'a [ChunkChoice<'a>],
    /// Present (null until the last chunk) only when `stream_options.include_usage` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Option<serde_json::Value>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Serialize)]
pub struct TextCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    /// As [`ChatChunk::choices`].
    pub choices: &'a [TextChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Serialize)]
pub struct TextChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<serde_json::Value>,
    pub finish_reason: Option<&'static str>,
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
pub fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let entry = |c: &Candidate| json!({"token": String::from_utf8_lossy(&c.bytes), "logprob": c.logprob, "bytes": c.bytes});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token);
            e["top_logprobs"] = t.top.iter().map(entry).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `logprobs`: parallel lists, and `top_logprobs` as `{token: logprob}` maps.
/// `offset` is the completion's length in characters before these tokens.
pub fn completion_logprobs(tokens: &[TokenLogprob], offset: &mut usize) -> Value {
    let text = |c: &Candidate| String::from_utf8_lossy(&c.bytes).into_owned();
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(*offset);
        *offset += text(&t.token).chars().count();
    }
    json!({
        "tokens": tokens.iter().map(|t| text(&t.token)).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.token.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| {
            t.top.iter().map(|c| (text(c), json!(c.logprob))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_chunk_shapes() {
        let chunk = ChatChunk {
            id: "c",
            object: "chat.completion.chunk",
            created: 1,
            model: "m",
            choices: &[],
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
