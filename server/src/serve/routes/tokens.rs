//! `POST /tokenize` and `POST /detokenize`, in llama-server's shapes.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

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
) -> Result<Json<Value>, ApiError> {
    state.engine()?;
    let tokens = super::blocking(&state, "tokenize", move |engine| {
        let tokenizer = engine.model().tokenizer();
        let ids = tokenizer.encode(&req.content, req.add_special, req.parse_special);
        Ok(if req.with_pieces {
            with_pieces(tokenizer, &ids)
        } else {
            json!(ids)
        })
    })
    .await?;
    Ok(Json(json!({ "tokens": tokens })))
}

/// `[{id, piece}, ...]`; a piece that is part of a UTF-8 character is given as its bytes.
fn with_pieces(tokenizer: &Tokenizer, ids: &[u32]) -> Value {
    let pieces = ids.iter().map(|&id| {
        let bytes = tokenizer.piece(id, true);
        let piece = match std::str::from_utf8(bytes) {
            Ok(text) => json!(text),
            Err(_) => json!(bytes),
        };
        json!({"id": id, "piece": piece})
    });
    Value::Array(pieces.collect())
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let tokenizer = state.engine()?.model().tokenizer();
    super::generate::check_token_ids(&req.tokens, tokenizer.n_vocab(), "tokens")?;
    Ok(Json(
        json!({ "content": tokenizer.decode(&req.tokens, true) }),
    ))
}
