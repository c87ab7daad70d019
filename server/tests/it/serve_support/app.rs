//! The server in process: an engine on a real model behind `router(state)`, called with
//! `oneshot` (no socket, no child process), or listening on a loopback port for clients that
//! need one (curl, the Python SDK). Each [`App`] has its own runtime and state, so tests run
//! side by side in one binary.
//!
//! Tests stay plain `#[test]`s: every call blocks on the app's runtime, as calls to a spawned
//! server block on its socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{Body, BodyDataStream};
use axum::http::Request;
use axum::Router;
use futures_util::StreamExt;
use llm_server::engine::{Engine, Slots};
use llm_server::model::{LoadOptions, Model};
use llm_server::serve::{router, AppState, HttpConfig, Ready};
use serde_json::Value;
use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;
use tower::ServiceExt;

use super::{Requests, Response};

/// What `llm-server serve` is given on its command line.
pub struct AppConfig {
    pub model: PathBuf,
    /// `--alias`; the file name when `None`.
    pub alias: Option<String>,
    pub threads: usize,
    pub slots: Slots,
    pub http: HttpConfig,
}

impl Default for AppConfig {
    /// The synthetic model of [`super::synth_model`] with `serve`'s defaults, on one thread.
    fn default() -> AppConfig {
        AppConfig {
            model: super::synth_model(),
            alias: None,
            threads: 1,
            slots: Slots {
                parallel: 1,
                // What the plan picks for the synthetic model: its training context.
                n_ctx: 512,
                queue: 16,
            },
            http: HttpConfig::default(),
        }
    }
}

pub struct App {
    /// Dropped first, with every task holding the state; the engine then stops with it.
    runtime: Runtime,
    state: AppState,
    router: Router,
    config: AppConfig,
}

impl App {
    /// Loads the model and answers.
    pub fn start(config: AppConfig) -> App {
        let app = App::loading(config);
        app.load();
        app
    }

    /// Answers without a model: what a server says while it loads.
    pub fn loading(config: AppConfig) -> App {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let state = AppState::new(config.http.clone());
        App {
            router: router(state.clone()),
            runtime,
            state,
            config,
        }
    }

    /// Loads the model, as `serve` does once it listens.
    pub fn load(&self) {
        let c = &self.config;
        let options = LoadOptions {
            threads: c.threads,
            mlock: false,
        };
        let model = Model::load(&c.model, &options)
            .unwrap_or_else(|e| panic!("cannot load {}: {e}", c.model.display()));
        let counters = self.state.metrics().engine.clone();
        let engine = Engine::start(Arc::new(model), c.slots, counters).unwrap();
        let name = c.alias.clone().unwrap_or_else(|| {
            let name = c.model.file_name().unwrap();
            name.to_string_lossy().into_owned()
        });
        self.state.set_ready(Ready::new(engine, name));
    }

    /// Serves on a free loopback port until the app is dropped.
    pub fn listen(&self) -> SocketAddr {
        let listener = self
            .runtime
            .block_on(async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() });
        let addr = listener.local_addr().unwrap();
        let router = self.router.clone();
        self.runtime
            .spawn(async move { axum::serve(listener, router).await });
        addr
    }

    /// Sends a request from a task of its own; [`Pending::join`] waits for its answer.
    pub fn spawn_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Pending {
        let call = self.call(method, path, headers, body);
        Pending {
            task: self.runtime.spawn(async { read(call.await).await }),
            runtime: self.runtime.handle().clone(),
        }
    }

    /// Sends a POST and returns its body as it streams, once the status and headers are in.
    pub fn stream(&self, path: &str, body: &Value) -> Stream {
        let headers = [("Content-Type", "application/json")];
        let call = self.call("POST", path, &headers, body.to_string().as_bytes());
        let response = self.runtime.block_on(call);
        assert_eq!(response.status(), 200);
        Stream {
            body: response.into_body().into_data_stream(),
            runtime: self.runtime.handle().clone(),
            received: String::new(),
        }
    }

    /// One sample of `/metrics` (a series without labels).
    pub fn metric(&self, name: &str) -> f64 {
        super::metric(&self.get("/metrics").body, name)
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> impl std::future::Future<Output = axum::response::Response> + Send + 'static {
        let mut request = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request.body(Body::from(body.to_vec())).unwrap();
        let router = self.router.clone();
        async move { router.oneshot(request).await.unwrap() }
    }
}

/// A request answered in a task of its own.
pub struct Pending {
    task: JoinHandle<Response>,
    runtime: Handle,
}

impl Pending {
    pub fn join(self) -> Response {
        self.runtime.block_on(self.task).unwrap()
    }
}

/// A streamed body being read; dropping it is a client leaving.
pub struct Stream {
    body: BodyDataStream,
    runtime: Handle,
    /// Everything read so far.
    pub received: String,
}

impl Stream {
    /// Reads until what was received contains `needle`.
    pub fn read_until(&mut self, needle: &str) {
        while !self.received.contains(needle) {
            let chunk = self
                .runtime
                .block_on(self.body.next())
                .unwrap_or_else(|| panic!("the stream ended before {needle:?}: {}", self.received))
                .unwrap();
            self.received.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

async fn read(response: axum::response::Response) -> Response {
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    Response {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

impl Requests for App {
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let call = self.call(method, path, headers, body);
        self.runtime.block_on(async { read(call.await).await })
    }
}
