//! The JSON body extractor: the body is read once, straight into the handler's typed request,
//! and every rejection is an OpenAI-shaped 400 (413 when too large).
//!
//! The bytes go to serde straight into `T`: no generic `serde_json::Value` tree is built (a
//! 2 MiB body of `[[[[...` or of a million small values would cost far more as a tree than as
//! bytes), and nesting is bounded by serde_json's recursion limit (128 levels), an error not a
//! stack overflow. The whole body must arrive within `--body-timeout`.
//!
//! The body must be declared JSON (`Content-Type: application/json`, or any `*/*+json`): a web
//! page can make a browser send a "simple" cross-site POST (`text/plain`, a form) without asking
//! the server first, and with keys off that would be enough to generate from any page the
//! user visits. Without it the answer is 415 naming the header to add (`curl -d` alone does not
//! send it). Well-formed JSON of the wrong shape is a 400 with the parser's message (axum's
//! `Json` says 422; clients of an OpenAI API expect 400).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use super::error::ApiError;
use super::AppState;

pub struct JsonBody<T>(pub T);

/// Bodies up to this size are read without asking the large-body budget: one in flight on every
/// connection (`--max-connections` of them) is little.
const SMALL_BODY: usize = 64 << 10;

/// Large bodies that may be read at once, in units of `--body-limit`. Reading a body and parsing
/// it holds about twice its size; with no budget, `--max-connections` clients finishing 2 MiB
/// bodies together (eight addresses suffice on the 1 GB profile) would hold hundreds of MiB, past
/// the box's memory limit. A body over the budget is answered 503 before it is read.
pub const LARGE_BODIES: usize = 8;

/// The large-body budget for bodies of at most `body_limit` bytes, in bytes (its semaphore
/// counts KiB).
pub fn large_body_budget(body_limit: usize) -> usize {
    LARGE_BODIES.saturating_mul(body_limit)
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        json_content_type(req.headers())?;
        let (limit, timeout) = (state.http().body_limit, state.http().body_timeout);
        // A body without a length may grow to the limit. One declared over the limit takes
        // nothing: reading it stops at the limit with 413.
        let declared = content_length(req.headers()).unwrap_or(limit);
        let _budget = if declared > SMALL_BODY && declared <= limit {
            let kib = u32::try_from(declared.div_ceil(1024)).unwrap_or(u32::MAX);
            let permit = state.large_bodies().try_acquire_many(kib);
            Some(permit.map_err(|_| ApiError::BodiesBusy {
                budget: large_body_budget(limit),
                retry_after: 1,
            })?)
        } else {
            None
        };
        let bytes = tokio::time::timeout(timeout, Bytes::from_request(req, state))
            .await
            .map_err(|_| ApiError::BodyTimeout {
                secs: timeout.as_secs(),
            })?
            .map_err(|e| bytes_rejection(e, limit))?;
        parse_body(&bytes).map(JsonBody)
    }
}

/// The request body `bytes` read as `T`, exactly as [`JsonBody`] reads it (public for the
/// fuzz target `request_body`).
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(invalid_body)?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

/// The body's declared `Content-Length`, if it gives a number.
fn content_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// 415 unless the body is declared JSON: `application/json` or a `+json` type, any parameters.
fn json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err(ApiError::UnsupportedMediaType {
            given: "missing".into(),
        });
    };
    let text = value.to_str().unwrap_or_default();
    let essence = text.split(';').next().unwrap_or_default().trim();
    let json = essence.split_once('/').is_some_and(|(kind, sub)| {
        let sub = sub.to_ascii_lowercase();
        let application_json = kind.eq_ignore_ascii_case("application") && sub == "json";
        !kind.is_empty() && (application_json || sub.ends_with("+json"))
    });
    if json {
        return Ok(());
    }
    // Quoted and cut short: the header is the client's text, not ours to echo at length.
    let shown: String = text.chars().take(80).collect();
    Err(ApiError::UnsupportedMediaType {
        given: format!("{shown:?}"),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_json_content_types_are_read() {
        let check = |ct: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(ct) = ct {
                h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            }
            json_content_type(&h)
        };
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/vnd.api+json",
            "application/merge-patch+json;q=1",
        ] {
            check(Some(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("text/json"),
            Some("application/jsonp"),
            Some("json"),
        ] {
            let e = check(bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{bad:?}");
            assert!(
                e.to_string()
                    .contains("-H 'Content-Type: application/json'"),
                "{e}"
            );
        }
    }
}
