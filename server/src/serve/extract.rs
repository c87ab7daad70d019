//! The JSON body extractor: the body is read once, straight into the handler's typed request,
//! and every rejection is an OpenAI-shaped 400 (413 when too large).
//!
//! The bytes go to serde straight into `T`: no generic `serde_json::Value` tree is built (a
//! 2 MiB body of `[[[[...` or of a million small values would cost far more as a tree than as
//! bytes), and nesting is bounded by serde_json's recursion limit (128 levels), an error not a
//! stack overflow. The whole body must arrive within `--body-timeout`.
//!
//! axum's `Json` answers 415 without `Content-Type: application/json` (which `curl -d` does not
//! send) and 422 for well-formed JSON of the wrong shape; clients of an OpenAI API expect 400
//! with the parser's message either way.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use super::error::ApiError;
use super::AppState;

pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let (limit, timeout) = (state.http().body_limit, state.http().body_timeout);
        let bytes = tokio::time::timeout(timeout, Bytes::from_request(req, state))
            .await
            .map_err(|_| ApiError::BodyTimeout {
                secs: timeout.as_secs(),
            })?
            .map_err(|e| bytes_rejection(e, limit))?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(invalid_body)?;
        de.end()
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
        Ok(JsonBody(value))
    }
}

/// The parser's message, prefixed with the field it is about (`messages[0].content: ...`).
fn invalid_body(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let message = parser_message(e.inner());
    if path == "." {
        ApiError::bad_request(format!("invalid JSON body: {message}"))
    } else {
        ApiError::bad_request(format!("invalid JSON body at `{path}`: {message}"))
    }
}

/// A value of the wrong type or a missing field is named by its path, and serde_json's byte
/// position would only repeat it; a syntax error keeps its position, there is no field to name.
fn parser_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.classify() != Category::Data {
        return text;
    }
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(message) => message.to_owned(),
        None => text,
    }
}

fn bytes_rejection(e: BytesRejection, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge { limit }
    } else {
        ApiError::bad_request(format!("could not read the request body: {e}"))
    }
}
