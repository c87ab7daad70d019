//! A JSON body extractor whose every rejection is an OpenAI-shaped 400 (413 when too large).
//!
//! axum's `Json` answers 415 without `Content-Type: application/json` (which `curl -d` does not
//! send) and 422 for well-formed JSON of the wrong shape; clients of an OpenAI API expect 400
//! with the parser's message either way.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;

pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let limit = super::body_limit_of(&req);
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| bytes_rejection(e, limit))?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(invalid_body)?;
        de.end()
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
        Ok(JsonBody(value))
    }
}

/// Reads `T` out of an already parsed body; several views of one body can be taken this way
/// (e.g. the messages and the generation parameters of a chat request).
pub fn from_value<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(invalid_body)
}

/// The parser's message, prefixed with the field it is about (`messages[0].content: ...`).
fn invalid_body<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> ApiError {
    let path = e.path().to_string();
    if path == "." {
        ApiError::bad_request(format!("invalid JSON body: {}", e.inner()))
    } else {
        ApiError::bad_request(format!("invalid JSON body at `{path}`: {}", e.inner()))
    }
}

fn bytes_rejection(e: BytesRejection, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge { limit }
    } else {
        ApiError::bad_request(format!("could not read the request body: {e}"))
    }
}
