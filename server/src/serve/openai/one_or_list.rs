//! The request fields that are "one value or a list of them" (`prompt`, `stop`), read without
//! buffering.
//!
//! `#[serde(untagged)]` would first copy the whole value into serde's generic tree to try each
//! variant in turn: a 2 MiB `{"prompt":[1,1,…]}` then costs ~40 MiB before it is refused. These
//! visitors decide the variant from the first token of the value, keep only what the request can
//! use, and stop at the first element past a limit.

use std::fmt;

use serde::de::{self, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A completion prompt: text or token ids, alone or in a list (of which only one is served).
#[derive(Debug)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// A list of prompts: the first, and how many the list held.
    Listed {
        first: PromptInput,
        count: usize,
    },
}

/// The one prompt of a completion request: text to tokenize, or token ids.
#[derive(Debug)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Prompt, D::Error> {
        d.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = Prompt;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, an array of token ids, or an array of one of those")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Prompt, E> {
        Ok(Prompt::Text(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Prompt, E> {
        Ok(Prompt::Text(text))
    }

    /// The first element says which kind of list this is; the rest must be of that kind.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
        let Some(first) = seq.next_element::<PromptItem>()? else {
            return Ok(Prompt::Tokens(Vec::new()));
        };
        match first {
            PromptItem::Token(id) => {
                let mut ids = vec![id];
                while let Some(id) = seq.next_element::<u32>()? {
                    ids.push(id);
                }
                Ok(Prompt::Tokens(ids))
            }
            PromptItem::Text(text) => Ok(Prompt::Listed {
                first: PromptInput::Text(text),
                count: 1 + count_rest::<String, A>(seq)?,
            }),
            PromptItem::Tokens(ids) => Ok(Prompt::Listed {
                first: PromptInput::Tokens(ids),
                count: 1 + count_rest::<TokenIds, A>(seq)?,
            }),
        }
    }
}

/// Reads (and drops) the remaining elements, each checked as a `T`, and counts them.
fn count_rest<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(mut seq: A) -> Result<usize, A::Error> {
    let mut n = 0;
    while seq.next_element::<T>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// The first element of a prompt list.
enum PromptItem {
    Token(u32),
    Text(String),
    Tokens(Vec<u32>),
}

impl<'de> Deserialize<'de> for PromptItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PromptItem, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = PromptItem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a token id, a string or an array of token ids")
            }
            fn visit_u64<E: de::Error>(self, id: u64) -> Result<PromptItem, E> {
                u32::try_from(id)
                    .map(PromptItem::Token)
                    .map_err(|_| E::custom(format!("token id {id} is out of range")))
            }
            fn visit_i64<E: de::Error>(self, id: i64) -> Result<PromptItem, E> {
                Err(E::custom(format!("token id {id} is negative")))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<PromptItem, E> {
                Ok(PromptItem::Text(text.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<PromptItem, A::Error> {
                TokenIdsVisitor
                    .visit_seq(seq)
                    .map(|t| PromptItem::Tokens(t.0))
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}

/// An array of token ids.
struct TokenIds(Vec<u32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TokenIds, D::Error> {
        d.deserialize_seq(TokenIdsVisitor)
    }
}

struct TokenIdsVisitor;

impl<'de> Visitor<'de> for TokenIdsVisitor {
    type Value = TokenIds;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of token ids")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenIds, A::Error> {
        let mut ids = Vec::new();
        while let Some(id) = seq.next_element::<u32>()? {
            ids.push(id);
        }
        Ok(TokenIds(ids))
    }
}

/// OpenAI allows at most 4 stop sequences; a few more cost nothing, hundreds would.
const MAX_STOPS: usize = 16;

/// `stop`: one string or a list of at most [`MAX_STOPS`].
#[derive(Debug, Default)]
pub struct Stop(pub Vec<String>);

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Stop, D::Error> {
        struct StopVisitor;
        impl<'de> Visitor<'de> for StopVisitor {
            type Value = Stop;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a string or an array of at most {MAX_STOPS} strings")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Stop, E> {
                Ok(Stop(vec![text.to_owned()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Stop, A::Error> {
                let mut stops = Vec::new();
                while let Some(text) = seq.next_element::<String>()? {
                    if stops.len() == MAX_STOPS {
                        // Count the rest only to say how many there were.
                        let rest = count_rest::<IgnoredAny, A>(seq)?;
                        return Err(de::Error::custom(format!(
                            "{} stop sequences given; at most {MAX_STOPS} are accepted",
                            MAX_STOPS + 1 + rest
                        )));
                    }
                    stops.push(text);
                }
                Ok(Stop(stops))
            }
        }
        d.deserialize_any(StopVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(json: &str) -> Result<Prompt, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn every_prompt_shape() {
        assert!(matches!(prompt(r#""hi""#), Ok(Prompt::Text(s)) if s == "hi"));
        assert!(matches!(prompt("[1,2,3]"), Ok(Prompt::Tokens(t)) if t == [1, 2, 3]));
        assert!(matches!(prompt("[]"), Ok(Prompt::Tokens(t)) if t.is_empty()));
        assert!(matches!(
            prompt(r#"["a","b"]"#),
            Ok(Prompt::Listed { first: PromptInput::Text(s), count: 2 }) if s == "a"
        ));
        assert!(matches!(
            prompt("[[4,5]]"),
            Ok(Prompt::Listed { first: PromptInput::Tokens(t), count: 1 }) if t == [4, 5]
        ));
    }

    #[test]
    fn mixed_or_invalid_prompts_are_refused() {
        for bad in [
            r#"[1,"a"]"#,
            r#"["a",1]"#,
            r#"[[1],"a"]"#,
            "[-1]",
            "[4294967296]",
            "[1.5]",
            r#"{"a":1}"#,
            "5",
            "[[[1]]]",
        ] {
            assert!(prompt(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stops() {
        let one: Stop = serde_json::from_str(r#""\n""#).unwrap();
        assert_eq!(one.0, ["\n"]);
        let many: Stop = serde_json::from_str(r#"["a","b"]"#).unwrap();
        assert_eq!(many.0, ["a", "b"]);
        let list = format!("[{}]", vec![r#""x""#; 40].join(","));
        let e = serde_json::from_str::<Stop>(&list).unwrap_err().to_string();
        assert!(e.contains("40 stop sequences given; at most 16"), "{e}");
        assert!(serde_json::from_str::<Stop>("[1]").is_err());
    }
}
