//! `POST /slots/{id}?action=save|restore|erase`, in llama-server's shapes: a slot's
//! conversation (tokens and KV cache) written to, or read from, `{"filename": ...}` inside
//! `--slot-save-path`, or forgotten. Without `--slot-save-path` the answer is 501, as
//! llama-server's. The action waits for its slot to be free (at most the request timeout).

use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::engine::slot_store::{check_file_name, SlotAction, SlotError, SlotOutcome};
use crate::serve::error::ApiError;
use crate::serve::extract::JsonBody;
use crate::serve::AppState;

#[derive(Deserialize)]
pub struct SlotRequest {
    filename: Option<String>,
}

pub async fn action(
    State(state): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    if !engine.has_slot_store() {
        return Ok(slot_error(SlotError::NotEnabled));
    }
    let slot: usize = id.parse().map_err(|_| {
        ApiError::bad_param(
            "id_slot",
            format!("invalid slot id {id:?}: give a slot number, e.g. /slots/0"),
        )
    })?;
    let action = parse_action(req.uri().query())?;
    // Erase needs no body (llama-server's clients send none); the others name a file.
    let has_body = req.headers().contains_key(header::CONTENT_TYPE)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v != "0");
    let filename = if has_body {
        let JsonBody(body) = JsonBody::<SlotRequest>::from_request(req, &state).await?;
        body.filename
    } else {
        None
    };
    let file = match (action, filename) {
        (SlotAction::Erase, _) => String::new(),
        (_, None) => {
            return Err(ApiError::bad_param(
                "filename",
                "`filename` is required: {\"filename\": \"chat.kv\"}",
            ))
        }
        (_, Some(name)) => {
            check_file_name(&name).map_err(|e| ApiError::bad_param("filename", e.to_string()))?;
            name
        }
    };
    let wait = state.http().request_timeout;
    let result = super::blocking(&state, "slot action", move |engine| {
        Ok(engine
            .slot_action(slot, action, file.clone(), wait)
            .map(|o| (o, file)))
    })
    .await?;
    let (outcome, file) = match result {
        Ok(ok) => ok,
        Err(e) => return Ok(slot_error(e)),
    };
    let body = match outcome {
        SlotOutcome::Saved { moved, ms } => json!({
            "id_slot": slot,
            "filename": file,
            "n_saved": moved.tokens,
            "n_written": moved.bytes,
            "timings": {"save_ms": ms},
        }),
        SlotOutcome::Restored { moved, ms } => json!({
            "id_slot": slot,
            "filename": file,
            "n_restored": moved.tokens,
            "n_read": moved.bytes,
            "timings": {"restore_ms": ms},
        }),
        SlotOutcome::Erased { tokens } => json!({"id_slot": slot, "n_erased": tokens}),
    };
    Ok(Json(body).into_response())
}

fn parse_action(query: Option<&str>) -> Result<SlotAction, ApiError> {
    let value = query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("action="));
    match value {
        Some("save") => Ok(SlotAction::Save),
        Some("restore") => Ok(SlotAction::Restore),
        Some("erase") => Ok(SlotAction::Erase),
        _ => Err(ApiError::bad_param(
            "action",
            "invalid action: add ?action=save, ?action=restore or ?action=erase",
        )),
    }
}

/// A failed action in the API's error shape (501, 507 and 503 are not among [`ApiError`]'s).
fn slot_error(e: SlotError) -> Response {
    let (status, kind) = match &e {
        SlotError::NotEnabled => (StatusCode::NOT_IMPLEMENTED, "not_supported_error"),
        SlotError::NoSuchSlot { .. } | SlotError::NoFile(_) | SlotError::BadFile { .. } => {
            (StatusCode::BAD_REQUEST, "invalid_request_error")
        }
        SlotError::NoSpace { .. } => (StatusCode::INSUFFICIENT_STORAGE, "server_error"),
        SlotError::Busy | SlotError::ShuttingDown => {
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable_error")
        }
        SlotError::TimedOut => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
        SlotError::Io { .. } => {
            tracing::error!("slot action: {e}");
            (StatusCode::INTERNAL_SERVER_ERROR, "server_error")
        }
    };
    let body = json!({"error": {
        "message": e.to_string(),
        "type": kind,
        "param": null,
        "code": null,
    }});
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        let headers = response.headers_mut();
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    response
}
