//! `llm-server serve`: an OpenAI-compatible HTTP API over the engine.
//!
//! The server binds before the model is loaded so that `/health` can say 503 while it loads;
//! the [`Engine`] is installed once, when loading is done. Requests are tokenized on tokio's
//! blocking pool and generated on the scheduler's own thread, never on the async workers.

pub mod auth;
pub mod chat_template;
pub mod error;
mod json;
pub mod metrics;
pub mod openai;
mod routes;
pub mod scheduler;
pub mod sd_notify;
mod stop;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::limits::Cgroup;
use crate::model::Model;
use auth::ApiKeys;
use chat_template::ChatTemplate;
use error::ApiError;
use metrics::Metrics;
use scheduler::Scheduler;

/// Every route, as `/openapi.json` must document it (checked by a test).
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/chat/completions"),
    ("post", "/v1/completions"),
    ("get", "/v1/models"),
    ("post", "/tokenize"),
    ("post", "/detokenize"),
    ("get", "/health"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

/// The OpenAPI description of [`ROUTES`], served at `/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// Settings of the HTTP layer.
#[derive(Clone)]
pub struct HttpConfig {
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Time a request may take, queueing included.
    pub request_timeout: Duration,
    pub api_keys: ApiKeys,
    /// Whether `/health`, `/metrics` and `/openapi.json` need a key too.
    pub protect_probes: bool,
}

/// The loaded model and what serves it.
pub struct Engine {
    pub model: Arc<Model>,
    pub scheduler: Scheduler,
    pub template: ChatTemplate,
    /// The name clients use in `model` (`--alias`, else the file name).
    pub model_id: String,
    /// When the model was loaded (Unix seconds), reported by `/v1/models`.
    pub created: u64,
}

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    engine: OnceLock<Engine>,
    metrics: Arc<Metrics>,
    cgroup: Option<Cgroup>,
    http: HttpConfig,
}

impl AppState {
    pub fn new(http: HttpConfig, metrics: Arc<Metrics>) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                engine: OnceLock::new(),
                metrics,
                cgroup: Cgroup::own(),
                http,
            }),
        }
    }

    /// Makes the model available: `/health` turns 200 and generation routes start working.
    pub fn set_ready(&self, engine: Engine) {
        if self.inner.engine.set(engine).is_err() {
            tracing::error!("set_ready called twice; the first engine stays");
        }
    }

    /// The engine, or 503 while the model loads.
    pub fn engine(&self) -> Result<&Engine, ApiError> {
        self.inner.engine.get().ok_or(ApiError::Loading)
    }

    /// Cancels every queued and running generation (the shutdown deadline passed).
    pub fn cancel_all(&self) {
        if let Some(engine) = self.inner.engine.get() {
            engine.scheduler.stop();
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    fn http(&self) -> &HttpConfig {
        &self.inner.http
    }
}

/// The body limit, as an extension for the JSON extractor's 413 message.
#[derive(Clone, Copy)]
struct BodyLimit(usize);

fn body_limit_of(req: &Request) -> usize {
    req.extensions().get::<BodyLimit>().map_or(0, |l| l.0)
}

/// The application. Layers wrap from the inside out: the last `.layer` sees requests first.
pub fn router(state: AppState) -> Router {
    let http = state.http().clone();
    let require_key = middleware::from_fn_with_state(http.api_keys.clone(), auth::require_key);
    let api = Router::new()
        .route("/v1/chat/completions", post(routes::generate::chat))
        .route("/v1/completions", post(routes::generate::completions))
        .route("/v1/models", get(routes::info::models))
        .route("/tokenize", post(routes::tokens::tokenize))
        .route("/detokenize", post(routes::tokens::detokenize))
        .route_layer(require_key.clone());
    let probes = Router::new()
        .route("/health", get(routes::info::health))
        .route("/metrics", get(routes::info::metrics))
        .route("/openapi.json", get(routes::info::openapi));
    let probes = if http.protect_probes {
        probes.route_layer(require_key)
    } else {
        probes
    };
    api.merge(probes)
        .fallback(routes::info::not_found)
        .method_not_allowed_fallback(routes::info::method_not_allowed)
        .layer(DefaultBodyLimit::max(http.body_limit))
        .layer(Extension(BodyLimit(http.body_limit)))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record_request,
        ))
        .with_state(state)
}

/// Counts every answered request by route and status, and logs it.
async fn record_request(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = req.method().clone();
    let response = next.run(req).await.into_response();
    let status = response.status().as_u16();
    state.metrics().record_request(&route, status);
    tracing::info!(
        "{method} {route} {status} {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/openapi.json` documents exactly the routes the router serves, with the same methods.
    #[test]
    fn openapi_matches_routes() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI_JSON).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut documented: Vec<(String, String)> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, ops)| {
                ops.as_object()
                    .unwrap()
                    .keys()
                    .map(move |method| (method.clone(), path.clone()))
            })
            .collect();
        let mut served: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        documented.sort();
        served.sort();
        assert_eq!(documented, served);
    }
}
