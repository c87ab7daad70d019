//! `POST /tokenize` and `POST /detokenize`, in llama-server's shapes.
//!
//! Both texts are capped by --max-tokenize-bytes, both run on the blocking pool, and answers
//! are written straight to JSON text: a `serde_json::Value` per token (`{id, piece}`) cost
//! ~300 bytes each, so 1.95 MB of private-use characters (three byte tokens per character)
//! took the server from 68 to 692 MiB.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};

use crate::serve::error::ApiError;
use crate::serve::extract::JsonBody;
use crate::serve::AppState;
use crate::tokenizer::Tokenizer;

#[derive(Deserialize)]
pub struct TokenizeRequest {
    content: String,
    /// Add BOS where the vocabulary asks for it.
    #[serde(default)]
    add_special: bool,
    /// Turn control-token texts such as `<start_of_turn>` into their ids.
    #[serde(default = "yes")]
    parse_special: bool,
    /// Return `{id, piece}` objects instead of bare ids.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Response, ApiError> {
    state.engine()?;
    state
        .http()
        .input
        .check_tokenize_size("content", "`content`", req.content.len())?;
    let body = super::blocking(&state, "tokenize", move |engine| {
        let tokenizer = engine.model().tokenizer();
        let ids = tokenizer.encode(&req.content, req.add_special, req.parse_special);
        drop(req.content);
        let tokens = Tokens {
            tokenizer,
            ids: &ids,
            with_pieces: req.with_pieces,
        };
        serde_json::to_vec(&Tokenized { tokens })
            .map_err(|e| ApiError::Internal(format!("writing tokens: {e}")))
    })
    .await?;
    Ok(json_response(body))
}

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[derive(Serialize)]
struct Tokenized<'a> {
    tokens: Tokens<'a>,
}

/// The ids, or with `with_pieces` `[{id, piece}, ...]` where a piece that is part of a UTF-8
/// character is given as its bytes; written as they are serialized, nothing per token kept.
struct Tokens<'a> {
    tokenizer: &'a Tokenizer,
    ids: &'a [u32],
    with_pieces: bool,
}

impl Serialize for Tokens<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !self.with_pieces {
            return self.ids.serialize(s);
        }
        let mut seq = s.serialize_seq(Some(self.ids.len()))?;
        for &id in self.ids {
            seq.serialize_element(&Piece {
                id,
                bytes: self.tokenizer.piece(id, true),
            })?;
        }
        seq.end()
    }
}

struct Piece<'a> {
    id: u32,
    bytes: &'a [u8],
}

impl Serialize for Piece<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("id", &self.id)?;
        match std::str::from_utf8(self.bytes) {
            Ok(text) => map.serialize_entry("piece", text)?,
            Err(_) => map.serialize_entry("piece", self.bytes)?,
        }
        map.end()
    }
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    state.engine()?;
    let limits = state.http().input.clone();
    let body = super::blocking(&state, "detokenize", move |engine| {
        let tokenizer = engine.model().tokenizer();
        super::generate::check_token_ids(&req.tokens, tokenizer.n_vocab(), "tokens")?;
        // The pieces' bytes are checked before the text is built from them (it is at most
        // three times as long: an invalid byte becomes a 3-byte U+FFFD), the text after.
        let what = "the text of `tokens`";
        let bytes: usize = req
            .tokens
            .iter()
            .map(|&id| tokenizer.piece(id, true).len())
            .sum();
        limits.check_tokenize_size("tokens", what, bytes)?;
        let content = tokenizer.decode(&req.tokens, true);
        limits.check_tokenize_size("tokens", what, content.len())?;
        serde_json::to_vec(&Detokenized { content: &content })
            .map_err(|e| ApiError::Internal(format!("writing text: {e}")))
    })
    .await?;
    Ok(json_response(body))
}

#[derive(Serialize)]
struct Detokenized<'a> {
    content: &'a str,
}
