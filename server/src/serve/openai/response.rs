//! Response bodies of the OpenAI API, as the official SDKs parse them.

use std::fmt::{self, Display, Write as _};

use serde::ser::{SerializeMap, SerializeStruct, Serializer};
use serde::Serialize;
use serde_json::Value;

use crate::engine::{self, FinishReason};
use crate::sampler::{Candidate, TokenLogprob};
use crate::tokenizer::Tokenizer;

/// OpenAI's `finish_reason`.
pub fn finish_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop | FinishReason::StopSequence(_) => "stop",
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
    pub choices: [ChatChoice<'a>; 1],
    pub usage: Usage,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice<'a> {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<Logprobs<'a>>,
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
    pub logprobs: Option<Logprobs<'a>>,
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
    pub logprobs: Option<Logprobs<'a>>,
    pub finish_reason: Option<&'static str>,
}

/// Where a token's bytes come from: the model's vocabulary (a table in tests).
pub trait TokenBytes {
    fn bytes(&self, id: u32) -> &[u8];
}

impl TokenBytes for Tokenizer {
    fn bytes(&self, id: u32) -> &[u8] {
        // With control tokens' texts, as they were generated.
        self.piece(id, true)
    }
}

/// A choice's `logprobs`, written straight from the engine's [`TokenLogprob`]s and the
/// vocabulary (no JSON value built, no token text copied).
#[derive(Clone, Copy)]
pub enum Logprobs<'a> {
    /// `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
    Chat {
        tokens: &'a [TokenLogprob],
        vocab: &'a dyn TokenBytes,
    },
    /// Parallel lists, and `top_logprobs` as `{token: logprob}` maps; `text_offset` counts
    /// characters from `offset`, the completion's length before these tokens.
    Completion {
        tokens: &'a [TokenLogprob],
        vocab: &'a dyn TokenBytes,
        offset: usize,
    },
}

impl fmt::Debug for Logprobs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (Logprobs::Chat { tokens, .. } | Logprobs::Completion { tokens, .. }) = self;
        f.debug_struct("Logprobs").field("tokens", tokens).finish()
    }
}

/// Characters of completion text `tokens` make (what completions' `text_offset` counts).
pub fn text_chars(tokens: &[TokenLogprob], vocab: &dyn TokenBytes) -> usize {
    tokens
        .iter()
        .map(|t| Lossy(vocab.bytes(t.token.id)).chars().count())
        .sum()
}

impl Serialize for Logprobs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Logprobs::Chat { tokens, vocab } => {
                let mut o = s.serialize_struct("ChatLogprobs", 2)?;
                let entries = tokens.iter().map(|t| ChatEntry {
                    candidate: t.token,
                    top: Some(&t.top),
                    vocab,
                });
                o.serialize_field("content", &Seq::new(entries))?;
                o.serialize_field("refusal", &None::<()>)?;
                o.end()
            }
            Logprobs::Completion {
                tokens,
                vocab,
                offset,
            } => {
                let text = |t: &TokenLogprob| Lossy(vocab.bytes(t.token.id));
                let offsets = tokens.iter().scan(offset, |at, t| {
                    let start = *at;
                    *at += text(t).chars().count();
                    Some(start)
                });
                let mut o = s.serialize_struct("CompletionLogprobs", 4)?;
                o.serialize_field("tokens", &Seq::new(tokens.iter().map(text)))?;
                let logprobs = tokens.iter().map(|t| wide(t.token.logprob));
                o.serialize_field("token_logprobs", &Seq::new(logprobs))?;
                let tops = tokens.iter().map(|t| TopMap { top: &t.top, vocab });
                o.serialize_field("top_logprobs", &Seq::new(tops))?;
                o.serialize_field("text_offset", &Seq::new(offsets))?;
                o.end()
            }
        }
    }
}

/// A log-probability as it goes on the wire: as an f64, which is what serde_json's `Value`
/// held when the answer was built from one, so the digits stay those clients have seen
/// (non-finite becomes null either way).
fn wide(logprob: f32) -> f64 {
    f64::from(logprob)
}

/// One entry of chat's `content`: the chosen token with its alternatives, or an alternative
/// (`top: None`).
struct ChatEntry<'a> {
    candidate: Candidate,
    top: Option<&'a [Candidate]>,
    vocab: &'a dyn TokenBytes,
}

impl Serialize for ChatEntry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes = self.vocab.bytes(self.candidate.id);
        let mut o = s.serialize_struct("ChatEntry", 3 + usize::from(self.top.is_some()))?;
        o.serialize_field("token", &Lossy(bytes))?;
        o.serialize_field("logprob", &wide(self.candidate.logprob))?;
        o.serialize_field("bytes", bytes)?;
        if let Some(top) = self.top {
            let entries = top.iter().map(|&candidate| ChatEntry {
                candidate,
                top: None,
                vocab: self.vocab,
            });
            o.serialize_field("top_logprobs", &Seq::new(entries))?;
        }
        o.end()
    }
}

/// Completions' alternatives for one token, `{text: logprob}` in order. Tokens whose texts
/// are the same (two partial characters both read as U+FFFD) share one key, at the first's
/// place with the last's log-probability, as a JSON map built from the list had it.
struct TopMap<'a> {
    top: &'a [Candidate],
    vocab: &'a dyn TokenBytes,
}

impl Serialize for TopMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = |c: &Candidate| Lossy(self.vocab.bytes(c.id));
        let mut map = s.serialize_map(None)?;
        for (i, c) in self.top.iter().enumerate() {
            let key = text(c);
            let same = |other: &&Candidate| text(other).same_text(&key);
            if self.top[..i].iter().any(|o| same(&o)) {
                continue;
            }
            let last = self.top[i..].iter().rfind(same).unwrap_or(c);
            map.serialize_entry(&key, &wide(last.logprob))?;
        }
        map.end()
    }
}

/// A JSON list of what an iterator yields, written as it yields (`collect_seq` without needing
/// `&self` to own the iterator).
struct Seq<I>(std::cell::Cell<Option<I>>);

impl<I> Seq<I> {
    fn new(items: I) -> Seq<I> {
        Seq(std::cell::Cell::new(Some(items)))
    }
}

impl<I> Serialize for Seq<I>
where
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.take() {
            Some(items) => s.collect_seq(items),
            None => Err(serde::ser::Error::custom("a list serialised twice")),
        }
    }
}

/// A token's bytes as text: a part of a UTF-8 character becomes U+FFFD, as
/// `String::from_utf8_lossy` makes it, written out without building the string.
struct Lossy<'a>(&'a [u8]);

impl Lossy<'_> {
    fn chars(&self) -> impl Iterator<Item = char> + '_ {
        self.0.utf8_chunks().flat_map(|chunk| {
            let bad = (!chunk.invalid().is_empty()).then_some(char::REPLACEMENT_CHARACTER);
            chunk.valid().chars().chain(bad)
        })
    }

    fn same_text(&self, other: &Lossy<'_>) -> bool {
        self.0 == other.0 || self.chars().eq(other.chars())
    }
}

impl Display for Lossy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_char(char::REPLACEMENT_CHARACTER)?;
            }
        }
        Ok(())
    }
}

impl Serialize for Lossy<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A vocabulary of a few pieces, some of them parts of a UTF-8 character.
    struct Table(Vec<&'static [u8]>);

    impl TokenBytes for Table {
        fn bytes(&self, id: u32) -> &[u8] {
            self.0[id as usize]
        }
    }

    fn vocab() -> Table {
        Table(vec![
            b"Hello",
            b" wor\"ld\"",
            b"\xe2\x82", // "€" but its last byte
            b"\xac",     // the last byte alone
            b"\xe2",     // another partial character: the same text as token 2
            "né\n".as_bytes(),
            b"",
        ])
    }

    fn candidate(id: u32, logprob: f32) -> Candidate {
        Candidate { id, logprob }
    }

    /// Tokens whose alternatives hold partial characters (two reading as the same U+FFFD),
    /// quotes, a newline, an empty piece, an awkward float and a non-finite log-probability.
    fn tokens() -> Vec<TokenLogprob> {
        let top = |c: &[(u32, f32)]| c.iter().map(|&(id, l)| candidate(id, l)).collect();
        vec![
            TokenLogprob {
                token: candidate(0, -0.123_456_79),
                top: top(&[(0, -0.123_456_79), (2, -1.5), (4, -2.25), (1, -3.0)]),
            },
            TokenLogprob {
                token: candidate(3, -7.1),
                top: top(&[(5, -0.01), (6, f32::NEG_INFINITY), (3, -7.1)]),
            },
            TokenLogprob {
                token: candidate(1, 0.0),
                top: top(&[]),
            },
        ]
    }

    /// The answer as it was built before it was written straight out: a `serde_json::Value`
    /// (kept here as the wire format's reference).
    fn chat_value(tokens: &[TokenLogprob], vocab: &Table) -> Value {
        let entry = |c: &Candidate| {
            let bytes = vocab.bytes(c.id);
            json!({"token": String::from_utf8_lossy(bytes), "logprob": c.logprob, "bytes": bytes})
        };
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

    fn completion_value(tokens: &[TokenLogprob], vocab: &Table, offset: &mut usize) -> Value {
        let text = |c: &Candidate| String::from_utf8_lossy(vocab.bytes(c.id)).into_owned();
        let mut offsets = Vec::new();
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

    #[test]
    fn logprobs_are_written_byte_for_byte_as_the_json_values_were() {
        let vocab = vocab();
        let tokens = tokens();
        let chat = Logprobs::Chat {
            tokens: &tokens,
            vocab: &vocab,
        };
        let written = serde_json::to_string(&chat).unwrap();
        let reference = serde_json::to_string(&chat_value(&tokens, &vocab)).unwrap();
        assert_eq!(written, reference);
        // Partial characters are U+FFFD in `token`, the raw bytes in `bytes`.
        let partial = "{\"token\":\"\u{fffd}\",\"logprob\":-1.5,\"bytes\":[226,130]}";
        assert!(written.contains(partial), "{written}");

        let completion = Logprobs::Completion {
            tokens: &tokens,
            vocab: &vocab,
            offset: 7,
        };
        let written = serde_json::to_string(&completion).unwrap();
        let mut offset = 7;
        let reference = completion_value(&tokens, &vocab, &mut offset);
        assert_eq!(written, serde_json::to_string(&reference).unwrap());
        // Tokens 2 and 4 read the same: one key, at the first's place, with the last's value.
        let parsed: Value = serde_json::from_str(&written).unwrap();
        let top = parsed["top_logprobs"][0].as_object().unwrap();
        let keys: Vec<&str> = top.keys().map(String::as_str).collect();
        assert_eq!(keys, ["Hello", "\u{fffd}", " wor\"ld\""]);
        assert_eq!(top["\u{fffd}"], -2.25);
        assert_eq!(parsed["text_offset"], json!([7, 12, 13]));
        assert_eq!(offset, 7 + text_chars(&tokens, &vocab));
        assert_eq!(text_chars(&tokens, &vocab), 5 + 1 + 8);
    }

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
