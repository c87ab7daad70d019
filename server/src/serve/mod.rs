//! `llm-server serve`: an OpenAI-compatible HTTP API over the [`Engine`].
//!
//! The server binds before the model is loaded so that `/health` can say 503 while it loads;
//! the engine is installed once, when loading is done ([`AppState::set_ready`]). Requests are
//! tokenized on tokio's blocking pool and generated on the engine's own thread, never on the
//! async workers.

pub mod anthropic;
pub mod auth;
mod conns;
pub mod error;
pub mod extract;
mod hosts;
pub mod input;
pub mod limit;
pub mod listener;
pub mod metrics;
pub mod openai;
mod routes;
pub mod sd_notify;
mod sse;
pub mod tls;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

use crate::engine::Engine;
use crate::limits::Cgroup;
use auth::ApiKeys;
use error::ApiError;
use metrics::Metrics;

/// Every route the server serves: [`router`] is built from this table, and `/openapi.json` must
/// document exactly these (checked by a test).
pub const ROUTES: &[Route] = &[
    route(Post, "/v1/chat/completions", Api, |m| {
        on(m, routes::generate::chat)
    }),
    route(Post, "/v1/completions", Api, |m| {
        on(m, routes::generate::completions)
    }),
    route(Post, "/v1/responses", Api, |m| {
        on(m, routes::responses::create)
    }),
    route(Post, anthropic::PATH, Api, |m| {
        on(m, routes::messages::create)
    }),
    route(Get, "/v1/models", Api, |m| on(m, routes::info::models)),
    route(Post, "/tokenize", Api, |m| on(m, routes::tokens::tokenize)),
    route(Post, "/detokenize", Api, |m| {
        on(m, routes::tokens::detokenize)
    }),
    route(Post, "/slots/{id_slot}", Api, |m| {
        on(m, routes::slots::action)
    }),
    route(Get, "/metrics", Operator, |m| on(m, routes::info::metrics)),
    route(Get, "/health", Probe, |m| on(m, routes::info::health)),
    route(Get, "/openapi.json", Probe, |m| {
        on(m, routes::info::openapi)
    }),
    route(Get, "/", Page, |m| on(m, routes::ui::page)),
];

/// One row of [`ROUTES`].
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
    /// The handler, served on the method given.
    handler: fn(MethodFilter) -> MethodRouter<AppState>,
}

const fn route(
    method: Method,
    path: &'static str,
    access: Access,
    handler: fn(MethodFilter) -> MethodRouter<AppState>,
) -> Route {
    Route {
        method,
        path,
        access,
        handler,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

impl Method {
    /// As OpenAPI writes it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Method::Get => MethodFilter::GET,
            Method::Post => MethodFilter::POST,
        }
    }
}

/// Who may call a route, and through which of [`limit`]'s buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The API: a key when keys are on, the per-IP bucket, then the key's own bucket.
    Api,
    /// What the server counts is for its operators, not for every client: a key and the
    /// per-IP bucket.
    Operator,
    /// Health and the API's description: open, or as `Operator` with `--auth-probes`.
    Probe,
    /// The chat page: never behind a key (it asks for one).
    Page,
}

use Access::{Api, Operator, Page, Probe};
use Method::{Get, Post};

/// The OpenAPI description of [`ROUTES`], served at `/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// Settings of the HTTP layer.
#[derive(Clone)]
pub struct HttpConfig {
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Time a request may take, queueing included.
    pub request_timeout: Duration,
    /// Time to receive a request's whole body.
    pub body_timeout: Duration,
    pub api_keys: ApiKeys,
    /// Whether `/health` and `/openapi.json` need a key too (`/metrics` does whenever keys are
    /// on).
    pub protect_probes: bool,
    /// `max_tokens` of a request that gives none; `None`: up to the end of the context.
    pub default_max_tokens: Option<usize>,
    /// Answers write control tokens as their text (llama-server's `--special`).
    pub special: bool,
    /// Accept only `Host: localhost`, `127.0.0.1` or `[::1]` (DNS rebinding), set when the
    /// server listens on a loopback address.
    pub loopback_hosts: bool,
    /// Origins allowed by CORS; empty: CORS off (browsers on other origins are refused).
    pub cors_origins: Vec<String>,
    pub rate: limit::RateConfig,
    /// How long the decode thread may work without a heartbeat before it counts as stuck
    /// (`/health` 503, no more watchdog pings).
    pub engine_stall: Duration,
    /// What one request may ask of the server (grammar and text sizes, compiles).
    pub input: input::InputLimits,
}

impl Default for HttpConfig {
    /// As `llm-server serve` starts without options.
    fn default() -> HttpConfig {
        HttpConfig {
            body_limit: 2 << 20,
            request_timeout: Duration::from_secs(600),
            body_timeout: Duration::from_secs(30),
            api_keys: ApiKeys::default(),
            protect_probes: false,
            default_max_tokens: None,
            special: false,
            // The CLI sets it from `--host`; requests in process carry no Host header.
            loopback_hosts: false,
            cors_origins: Vec::new(),
            rate: limit::RateConfig::default(),
            engine_stall: Duration::from_secs(60),
            input: input::InputLimits::default(),
        }
    }
}

/// The engine, and what the API says about its model.
pub struct Ready {
    pub engine: Engine,
    /// The name clients use in `model` (`--alias`, else the file name).
    pub model_id: String,
    /// When the model was loaded (Unix seconds), reported by `/v1/models`.
    pub created: u64,
}

impl Ready {
    /// `engine`, loaded now.
    pub fn new(engine: Engine, model_id: String) -> Ready {
        Ready {
            engine,
            model_id,
            created: unix_now(),
        }
    }
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    ready: OnceLock<Ready>,
    metrics: Metrics,
    cgroup: Option<Cgroup>,
    /// The budget of large request bodies being read, in KiB ([`extract::LARGE_BODIES`]).
    large_bodies: tokio::sync::Semaphore,
    http: HttpConfig,
}

impl AppState {
    pub fn new(http: HttpConfig) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                ready: OnceLock::new(),
                metrics: Metrics::default(),
                cgroup: Cgroup::own(),
                large_bodies: tokio::sync::Semaphore::new(
                    extract::large_body_budget(http.body_limit).div_ceil(1024),
                ),
                http,
            }),
        }
    }

    /// Makes the model available: `/health` turns 200 and generation routes start working.
    pub fn set_ready(&self, ready: Ready) {
        if self.inner.ready.set(ready).is_err() {
            tracing::error!("set_ready called twice; the first engine stays");
        }
    }

    /// The engine and its model's name, or 503 while the model loads.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        self.inner.ready.get().ok_or(ApiError::Loading)
    }

    /// The engine, or 503 while the model loads.
    pub fn engine(&self) -> Result<&Engine, ApiError> {
        Ok(&self.ready()?.engine)
    }

    /// Cancels every queued and running generation (the shutdown deadline passed).
    pub fn cancel_all(&self) {
        if let Some(ready) = self.inner.ready.get() {
            ready.engine.stop();
        }
    }

    /// Whether the server is alive: the model loads, or the decode thread waits for work or
    /// made progress within `--engine-stall-timeout`. Gates the watchdog pings and `/health`.
    pub fn is_alive(&self) -> bool {
        self.inner
            .metrics
            .engine
            .is_alive(self.inner.http.engine_stall)
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub(crate) fn http(&self) -> &HttpConfig {
        &self.inner.http
    }

    /// The KiB of large request bodies that may be read at once ([`extract::LARGE_BODIES`]).
    pub(crate) fn large_bodies(&self) -> &tokio::sync::Semaphore {
        &self.inner.large_bodies
    }
}

/// The application. Layers wrap from the inside out: the last `.layer` sees requests first.
/// A request to the API passes: the request log, the Host guard (on loopback), CORS (when
/// origins are given), the per-IP bucket, the key, the per-key bucket.
pub fn router(state: AppState) -> Router {
    let http = state.http().clone();
    let require_key = middleware::from_fn_with_state(http.api_keys.clone(), auth::require_key);
    let limits = limit::RateLimits::new(http.rate);
    let served = |access: Access| {
        ROUTES
            .iter()
            .filter(|r| r.access == access)
            .fold(Router::new(), |router, r| {
                router.route(r.path, (r.handler)(r.method.filter()))
            })
    };
    let api = served(Api)
        .route_layer(middleware::from_fn_with_state(
            limits.clone(),
            limit::per_key,
        ))
        .route_layer(require_key.clone());
    let metrics = served(Operator).route_layer(require_key.clone());
    let probes = served(Probe);
    let (keyed, open) = if http.protect_probes {
        (
            api.merge(metrics).merge(probes.route_layer(require_key)),
            Router::new(),
        )
    } else {
        (api.merge(metrics), probes)
    };
    // Every route that checks a key passes the per-IP bucket first: guessing keys is limited.
    let keyed = keyed.route_layer(middleware::from_fn_with_state(limits, limit::per_ip));
    let mut app = keyed
        .merge(open)
        .merge(served(Page))
        .fallback(routes::info::not_found)
        .method_not_allowed_fallback(routes::info::method_not_allowed)
        .layer(DefaultBodyLimit::max(http.body_limit));
    if let Some(cors) = cors(&http.cors_origins) {
        app = app.layer(cors);
    }
    if http.loopback_hosts {
        app = app.layer(middleware::from_fn(hosts::loopback_only));
    }
    // Outside every layer that may refuse a request, so that all refusals on Anthropic's
    // route take Anthropic's error shape.
    app = app.layer(middleware::from_fn(anthropic::error_shape));
    app.layer(middleware::from_fn_with_state(
        state.clone(),
        record_request,
    ))
    .with_state(state)
}

/// CORS for `origins` (browsers elsewhere get no CORS headers and so no answer), or none.
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{header, HeaderValue, Method};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(Duration::from_secs(3600)),
    )
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
    crate::hooks::on_request();
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

    /// Guessing keys at `/metrics` spends the per-IP bucket as it does on the API; the open
    /// probes spend nothing.
    #[tokio::test]
    async fn per_ip_bucket_wraps_metrics_but_not_open_probes() {
        use axum::extract::ConnectInfo;
        use tower::ServiceExt;
        let file = std::env::temp_dir().join(format!("llm-router-keys-{}", std::process::id()));
        std::fs::write(&file, "the-key\n").unwrap();
        let api_keys = ApiKeys::from_file(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        let app = router(AppState::new(HttpConfig {
            api_keys,
            rate: limit::RateConfig {
                per_key: 0,
                per_ip: 60,
                burst: 2,
            },
            ..HttpConfig::default()
        }));
        let status = |path: &'static str| {
            let app = app.clone();
            async move {
                let mut request = axum::http::Request::get(path)
                    .header("Authorization", "Bearer guess")
                    .body(axum::body::Body::empty())
                    .unwrap();
                let peer: std::net::SocketAddr = "192.0.2.1:4000".parse().unwrap();
                request.extensions_mut().insert(ConnectInfo(peer));
                app.oneshot(request).await.unwrap().status().as_u16()
            }
        };
        for _ in 0..3 {
            assert_ne!(status("/health").await, 429);
        }
        assert_eq!(status("/metrics").await, 401);
        assert_eq!(status("/v1/models").await, 401);
        assert_eq!(status("/metrics").await, 429);
    }

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
            .map(|r| (r.method.name().to_owned(), r.path.to_owned()))
            .collect();
        documented.sort();
        served.sort();
        assert_eq!(documented, served);
    }
}
