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
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

fn bytes_rejection(e: BytesRejection, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge { limit }
    } else {
        ApiError::bad_request(format!("could not read the request body: {e}"))
    }
}
