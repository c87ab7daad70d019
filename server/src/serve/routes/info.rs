//! `/health`, `/metrics`, `/v1/models`, `/openapi.json` and the JSON 404/405.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::serve::error::ApiError;
use crate::serve::{AppState, OPENAPI_JSON};

/// 200 once the model is loaded, 503 (with `Retry-After`) while it loads, 503 when the decode
/// thread is stuck or gone.
pub async fn health(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    state.engine()?;
    if !state.is_alive() {
        return Err(ApiError::EngineStuck {
            secs: state.http().engine_stall.as_secs(),
        });
    }
    Ok(Json(json!({"status": "ok"})))
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics().render(state.inner.cgroup.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The one model this server serves, with llama-server's `meta` figures.
pub async fn models(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let ready = state.ready()?;
    let model = ready.engine.model();
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": ready.model_id,
            "object": "model",
            "created": ready.created,
            "owned_by": "llm-server",
            "meta": {
                "name": model.name(),
                "n_vocab": model.tokenizer().n_vocab(),
                "n_ctx_train": model.n_ctx_train(),
                "n_ctx": ready.engine.n_ctx(),
                "size": model.gguf().bytes().len(),
            }
        }]
    })))
}

pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

/// 404 without the path (see [`ApiError::NotFound`]).
pub async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// 405 without the method or the path: neither is echoed back (see [`ApiError::NotFound`]).
pub async fn method_not_allowed() -> Response {
    let message = "this method is not allowed on this route; see GET /openapi.json for the API";
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}});
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use axum::http::header::RETRY_AFTER;

    use super::*;
    use crate::serve::HttpConfig;

    /// Before the engine is installed every model route says 503 "loading" with Retry-After.
    #[tokio::test]
    async fn health_and_models_are_503_while_loading() {
        let state = AppState::new(HttpConfig::default());
        for response in [
            health(State(state.clone())).await.into_response(),
            models(State(state.clone())).await.into_response(),
        ] {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(response.headers().contains_key(RETRY_AFTER));
        }
    }
}
