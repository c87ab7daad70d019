//! The one place where failures become HTTP responses, in OpenAI's error shape:
//! `{"error": {"message", "type", "param", "code"}}`, which the official SDKs parse.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// Why a request failed. Each variant's message names the cause and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON or a value out of range.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<&'static str>,
    },
    #[error("the request body is larger than the limit of {limit} bytes; send a shorter prompt or raise --body-limit")]
    TooLarge { limit: usize },
    /// A field over its size limit (`--max-grammar-bytes`, `--max-tokenize-bytes`).
    #[error("{what} is {bytes} bytes, over the limit of {limit} bytes; send less or raise {flag}")]
    FieldTooLarge {
        param: &'static str,
        /// The value, in words (`the response_format schema`).
        what: &'static str,
        bytes: usize,
        limit: usize,
        flag: &'static str,
    },
    #[error("the request body's Content-Type is {given}; send JSON with `-H 'Content-Type: application/json'`")]
    UnsupportedMediaType { given: String },
    #[error("missing or invalid API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`) with a key from the server's --api-key-file")]
    Unauthorized,
    /// The path is not echoed: a client would get back whatever it sent (a 60 KB path), and a
    /// page may show the answer to someone else.
    #[error("no route for this method and path; see GET /openapi.json for the API")]
    NotFound,
    #[error("too many requests: over the rate limit of this {by}; retry after {retry_after} s")]
    RateLimited { by: &'static str, retry_after: u64 },
    #[error(
        "the request body did not arrive within {secs} s; send it at once or raise --body-timeout"
    )]
    BodyTimeout { secs: u64 },
    #[error("Host header {host:?} refused: this server listens on loopback and answers only Host localhost, 127.0.0.1 or [::1] (DNS rebinding guard)")]
    BadHost { host: String },
    #[error("the model is still loading; retry in a few seconds")]
    Loading,
    #[error("the server is busy: every slot is generating and the queue of {queue} requests is full; retry after {retry_after} s")]
    Overloaded { queue: usize, retry_after: u64 },
    #[error("the server is busy: it is already receiving its limit of {budget} bytes of large request bodies ({} times --body-limit); retry after {retry_after} s or send a smaller body", super::extract::LARGE_BODIES)]
    BodiesBusy { budget: usize, retry_after: u64 },
    #[error("the server is busy: {compiles} grammar compile(s) already running and none finished within {waited} s (--grammar-compiles, --grammar-timeout); retry after {retry_after} s")]
    CompilesBusy {
        compiles: u32,
        waited: u64,
        retry_after: u64,
    },
    #[error("the request did not finish within the server's time limit of {secs} s; ask for fewer tokens (max_tokens) or raise --request-timeout")]
    Timeout { secs: u64 },
    #[error(
        "the engine thread is stuck (no progress for {secs} s); the watchdog restarts the server"
    )]
    EngineStuck { secs: u64 },
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A failure of ours: logged in full, reported without details.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    /// A bad value of the request field `param`.
    pub fn bad_param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } | ApiError::FieldTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::BadHost { .. } => StatusCode::FORBIDDEN,
            ApiError::EngineStuck { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Loading
            | ApiError::Overloaded { .. }
            | ApiError::BodiesBusy { .. }
            | ApiError::CompilesBusy { .. }
            | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. }
            | ApiError::TooLarge { .. }
            | ApiError::FieldTooLarge { .. }
            | ApiError::UnsupportedMediaType { .. }
            | ApiError::NotFound
            | ApiError::BodyTimeout { .. }
            | ApiError::BadHost { .. } => "invalid_request_error",
            ApiError::RateLimited { .. } => "rate_limit_error",
            ApiError::EngineStuck { .. } => "server_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::Loading
            | ApiError::Overloaded { .. }
            | ApiError::BodiesBusy { .. }
            | ApiError::CompilesBusy { .. }
            | ApiError::ShuttingDown => "unavailable_error",
            ApiError::Timeout { .. } => "timeout_error",
            ApiError::Internal(_) => "server_error",
        }
    }

    /// OpenAI's `error.code`: a stable machine-readable name.
    fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::Unauthorized => Some("invalid_api_key"),
            ApiError::TooLarge { .. } | ApiError::FieldTooLarge { .. } => Some("request_too_large"),
            ApiError::UnsupportedMediaType { .. } => Some("unsupported_media_type"),
            ApiError::Overloaded { .. }
            | ApiError::BodiesBusy { .. }
            | ApiError::CompilesBusy { .. } => Some("server_overloaded"),
            ApiError::Loading => Some("model_loading"),
            ApiError::RateLimited { .. } => Some("rate_limit_exceeded"),
            _ => None,
        }
    }

    /// The error object, also sent as an SSE event when a stream fails after it started.
    pub fn body(&self) -> ErrorBody {
        let message = match self {
            ApiError::Internal(_) => "internal server error; the server log has the details".into(),
            other => other.to_string(),
        };
        ErrorBody {
            error: ErrorObject {
                message,
                kind: self.kind(),
                param: match self {
                    ApiError::BadRequest { param, .. } => *param,
                    ApiError::FieldTooLarge { param, .. } => Some(*param),
                    _ => None,
                },
                code: self.code(),
            },
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Debug, Serialize)]
pub struct ErrorObject {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

/// The message of an error response, kept in its extensions so that a route whose API has
/// another error shape (Anthropic's) can write it in that shape.
#[derive(Debug, Clone)]
pub struct ErrorMessage(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            tracing::error!("{detail}");
        }
        let body = self.body();
        let message = ErrorMessage(body.error.message.clone());
        let mut response = (self.status(), Json(body)).into_response();
        response.extensions_mut().insert(message);
        let headers = response.headers_mut();
        match &self {
            ApiError::Overloaded { retry_after, .. }
            | ApiError::BodiesBusy { retry_after, .. }
            | ApiError::CompilesBusy { retry_after, .. }
            | ApiError::RateLimited { retry_after, .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            ApiError::Loading | ApiError::ShuttingDown => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // The rest of a slow body is not read: the connection cannot carry another request.
            ApiError::BodyTimeout { .. } => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overloaded_is_503_with_retry_after() {
        let r = ApiError::Overloaded {
            queue: 16,
            retry_after: 2,
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn body_has_openai_shape() {
        let body = serde_json::to_value(ApiError::bad_param("n", "n must be 1").body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "n must be 1", "type": "invalid_request_error", "param": "n", "code": null}})
        );
    }

    #[test]
    fn internal_details_stay_in_the_log() {
        let body = ApiError::Internal("secret path /x".into()).body();
        assert!(!body.error.message.contains("/x"));
    }
}
