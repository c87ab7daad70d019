//! A streamed generation from the host: its server-sent events, when each arrived, and the
//! `usage` of the last. For a model whose output cannot be golden (synthetic weights), what is
//! checked is that tokens stream back one event at a time and `usage` counts them.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use serde_json::{json, Value};

use super::api::ok_json;
use super::GENERATION_TIMEOUT;
use crate::http::Api;

/// What one streamed request gave.
pub struct Streamed {
    /// Events that carried text, with when each arrived.
    pub pieces: Vec<(String, Instant)>,
    pub completion_tokens: u64,
    pub prompt_tokens: u64,
    pub asked: Instant,
    pub done: Instant,
}

impl Streamed {
    pub fn text(&self) -> String {
        self.pieces.iter().map(|(t, _)| t.as_str()).collect()
    }

    /// Generated tokens per second after the first (the prompt's prefill excluded), if more
    /// than one event came.
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        let (first, last) = (self.pieces.first()?.1, self.pieces.last()?.1);
        let secs = last.duration_since(first).as_secs_f64();
        (self.completion_tokens > 1 && secs > 0.0)
            .then(|| (self.completion_tokens - 1) as f64 / secs)
    }

    /// From asking to the first text.
    pub fn to_first(&self) -> Option<Duration> {
        Some(self.pieces.first()?.1.duration_since(self.asked))
    }
}

/// POSTs `body` to `path` with `stream` and `include_usage` set, and checks the stream: text
/// came in at least one event, no more events than `usage.completion_tokens`, which is at most
/// `max_tokens`.
pub fn generate(api: &Api, path: &str, mut body: Value) -> Result<Streamed> {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let max_tokens = body["max_tokens"].as_u64();
    let asked = Instant::now();
    let response = api.post(path, &body, GENERATION_TIMEOUT)?;
    let done = Instant::now();
    if response.status != 200 {
        ok_json(response)?;
        unreachable!("ok_json fails on any status but 200");
    }
    let (pieces, usage) = events(&response.body)?;
    let pieces = pieces
        .into_iter()
        .scan(0, |from, (text, raw)| {
            let at = match response.arrival_of(&raw, *from) {
                Some((at, end)) => {
                    *from = end;
                    at
                }
                None => done,
            };
            Some((text, at))
        })
        .collect::<Vec<_>>();
    let count = |key: &str| usage.as_ref().and_then(|u| u[key].as_u64()).unwrap_or(0);
    let streamed = Streamed {
        completion_tokens: count("completion_tokens"),
        prompt_tokens: count("prompt_tokens"),
        pieces,
        asked,
        done,
    };
    ensure!(
        usage.is_some(),
        "the stream ended without a usage chunk: {}",
        response.body
    );
    ensure!(
        !streamed.pieces.is_empty() && streamed.completion_tokens > 0,
        "no text streamed back ({} tokens counted): {}",
        streamed.completion_tokens,
        response.body
    );
    ensure!(
        streamed.pieces.len() as u64 <= streamed.completion_tokens
            && max_tokens.is_none_or(|m| streamed.completion_tokens <= m),
        "{} text events but usage counts {} tokens (max_tokens {max_tokens:?})",
        streamed.pieces.len(),
        streamed.completion_tokens
    );
    Ok(streamed)
}

/// Text events: each one's text and its raw JSON (to find when it arrived).
type Pieces = Vec<(String, String)>;

/// The text of each `data:` event that carries some (a completion's `text` or a chat's
/// `delta.content`) with the event's raw JSON, and the last `usage` seen; `[DONE]` ends it.
fn events(body: &str) -> Result<(Pieces, Option<Value>)> {
    let mut pieces = Vec::new();
    let mut usage = None;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let event: Value = serde_json::from_str(data)
            .map_err(|e| anyhow::anyhow!("a stream event is not JSON ({e}): {data}"))?;
        if event["usage"].is_object() {
            usage = Some(event["usage"].clone());
        }
        let choice = &event["choices"][0];
        let text = choice["text"]
            .as_str()
            .or_else(|| choice["delta"]["content"].as_str())
            .unwrap_or_default();
        if !text.is_empty() {
            pieces.push((text.to_owned(), data.to_owned()));
        }
    }
    Ok((pieces, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_text_events_and_the_usage() {
        let body = "data: {\"choices\":[{\"text\":\" the\"}],\"usage\":null}\n\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\" city\"}}]}\n\n\
                    data: {\"choices\":[{\"text\":\"\"}]}\n\n\
                    data: {\"choices\":[],\"usage\":{\"completion_tokens\":2,\"prompt_tokens\":5}}\n\n\
                    data: [DONE]\n\n";
        let (pieces, usage) = events(body).unwrap();
        let texts: Vec<&str> = pieces.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(texts, [" the", " city"]);
        assert_eq!(usage.unwrap()["completion_tokens"], 2);
        assert!(events("data: {nope\n").is_err());
    }
}
