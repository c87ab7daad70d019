//! Response bodies of the OpenAI API, as the official SDKs parse them.

use serde::Serialize;

use crate::engine::{self, FinishReason};

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
}

impl From<engine::Usage> for Usage {
    fn from(usage: engine::Usage) -> Usage {
        Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
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
    pub logprobs: Option<()>,
    pub finish_reason: &'static str,
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
    pub finish_reason: Option<&'static str>,
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
    pub finish_reason: Option<&'static str>,
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
