//! `llm-server serve`: check the memory plan, bind, load the model, serve until SIGTERM.

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use llm_server::engine::{Counters, Engine, Slots};
use llm_server::gguf::Gguf;
use llm_server::model::{LoadOptions, Model};
use llm_server::serve::auth::ApiKeys;
use llm_server::serve::{router, sd_notify, AppState, HttpConfig, Ready};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use super::plan::{Checked, Sizing, EXIT_DOES_NOT_FIT};
use super::CliResult;

#[derive(clap::Args)]
pub struct Serve {
    /// The GGUF model file.
    #[arg(long, short)]
    model: PathBuf,
    #[command(flatten)]
    sizing: Sizing,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests that may wait for a slot; beyond this the answer is 503 with Retry-After.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Threads for the forward pass (default: all CPUs).
    #[arg(long, short)]
    threads: Option<usize>,
    /// Lock the weights in RAM.
    #[arg(long)]
    mlock: bool,
    /// The model's name in the API (default: the file name).
    #[arg(long)]
    alias: Option<String>,
    /// File of API keys, one per line; requests then need `Authorization: Bearer <key>`.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Require the key for /health, /metrics and /openapi.json too.
    #[arg(long, requires = "api_key_file")]
    auth_probes: bool,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = HttpConfig::default().body_limit)]
    body_limit: usize,
    /// Seconds a request may take, waiting in the queue included.
    #[arg(long, default_value_t = HttpConfig::default().request_timeout.as_secs())]
    request_timeout: u64,
    /// Seconds in-flight requests get to finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10)]
    shutdown_timeout: u64,
    /// Start even when the memory plan does not fit the limits (only warn).
    #[arg(long)]
    ignore_memory_plan: bool,
}

impl Serve {
    pub fn run(self) -> CliResult {
        init_logging();
        let gguf = Gguf::open(&self.model)?;
        let checked = Checked::new(&gguf, self.sizing)?;
        let table = checked.table(&self.model.display().to_string());
        if !checked.fits() {
            if !self.ignore_memory_plan {
                eprint!("{table}");
                eprintln!("llm-server: refusing to start: the memory plan does not fit (--ignore-memory-plan starts anyway)");
                // Exit before any thread or socket exists: nothing to clean up.
                std::process::exit(EXIT_DOES_NOT_FIT);
            }
            tracing::warn!(
                "the memory plan does not fit; starting anyway (--ignore-memory-plan):\n{table}"
            );
        } else {
            tracing::info!("\n{table}");
        }
        let api_keys = match &self.api_key_file {
            Some(path) => ApiKeys::from_file(path)?,
            None => ApiKeys::default(),
        };
        let http = HttpConfig {
            body_limit: self.body_limit,
            request_timeout: Duration::from_secs(self.request_timeout),
            api_keys,
            protect_probes: self.auth_probes,
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // HTTP is light work next to decoding: a small runtime leaves the CPUs to the model.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cpus.min(2))
            .max_blocking_threads(cpus.max(2))
            .thread_name("http")
            .enable_all()
            .build()?;
        let code = runtime.block_on(self.serve(gguf, checked, http, cpus))?;
        if code == ExitCode::SUCCESS {
            Ok(())
        } else {
            Err("stopped because the model could not be loaded (see the log above)".into())
        }
    }

    async fn serve(
        self,
        gguf: Gguf,
        checked: Checked,
        http: HttpConfig,
        cpus: usize,
    ) -> Result<ExitCode, Box<dyn std::error::Error>> {
        let addr = SocketAddr::new(self.host, self.port);
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            format!("cannot listen on {addr}: {e}; choose another --port or --host")
        })?;
        tracing::info!(
            "listening on http://{}; loading the model",
            listener.local_addr()?
        );

        let state = AppState::new(http);
        let load_failed = Arc::new(Notify::new());
        let loader = Loader {
            model_id: self.alias.clone().unwrap_or_else(|| file_name(&self.model)),
            options: LoadOptions {
                threads: self.threads.unwrap_or(cpus).max(1),
                mlock: self.mlock,
            },
            slots: Slots {
                parallel: checked.plan.parallel,
                n_ctx: checked.plan.n_ctx,
                queue: self.queue,
            },
        };
        tokio::task::spawn_blocking({
            let (state, load_failed) = (state.clone(), load_failed.clone());
            let counters = state.metrics().engine.clone();
            move || match loader.load(gguf, counters) {
                Ok(ready) => {
                    state.set_ready(ready);
                    notify_systemd("READY=1");
                    tracing::info!("ready");
                }
                Err(e) => {
                    tracing::error!("cannot load the model: {e}");
                    load_failed.notify_one();
                }
            }
        });
        if let Some(interval) = sd_notify::watchdog_interval() {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                loop {
                    tick.tick().await;
                    notify_systemd("WATCHDOG=1");
                }
            });
        }

        let stopping = Arc::new(Notify::new());
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let shutdown = {
            let (stopping, failed) = (stopping.clone(), failed.clone());
            async move {
                tokio::select! {
                    signal = termination_signal() => tracing::info!("{signal}: stopping; no new connections"),
                    _ = load_failed.notified() => failed.store(true, std::sync::atomic::Ordering::Relaxed),
                }
                notify_systemd("STOPPING=1");
                stopping.notify_one();
            }
        };
        // In-flight requests get the deadline, then are cancelled (their clients get an error).
        let deadline = Duration::from_secs(self.shutdown_timeout);
        tokio::spawn({
            let state = state.clone();
            async move {
                stopping.notified().await;
                tokio::time::sleep(deadline).await;
                tracing::warn!(
                    "shutdown deadline of {deadline:?} passed: cancelling in-flight requests"
                );
                state.cancel_all();
            }
        });
        axum::serve(listener, router(state.clone()))
            .with_graceful_shutdown(shutdown)
            .await?;
        // Anything still queued (e.g. on connections that closed) is released with the engine.
        let _ = tokio::task::spawn_blocking(move || state.cancel_all()).await;
        tracing::info!("stopped");
        Ok(if failed.load(std::sync::atomic::Ordering::Relaxed) {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// What loading needs, moved to a blocking thread.
struct Loader {
    model_id: String,
    options: LoadOptions,
    slots: Slots,
}

impl Loader {
    fn load(
        self,
        gguf: Gguf,
        counters: Arc<Counters>,
    ) -> Result<Ready, Box<dyn std::error::Error>> {
        let started = std::time::Instant::now();
        let model = Arc::new(Model::from_gguf(gguf, &self.options)?);
        let engine = Engine::start(model, self.slots, counters)?;
        let model = engine.model();
        tracing::info!(
            "loaded {} in {:.2} s: {} slots x {} tokens, {} threads, chat template: {}",
            model.name(),
            started.elapsed().as_secs_f64(),
            self.slots.parallel,
            self.slots.n_ctx,
            model.threads(),
            if model.chat_template().is_some() {
                "the model's"
            } else {
                "built-in Gemma"
            },
        );
        Ok(Ready::new(engine, self.model_id))
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn notify_systemd(state: &str) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!("cannot notify systemd ({state}): {e}");
    }
}

/// Resolves on SIGTERM (systemd's stop) or SIGINT (Ctrl-C), naming which.
async fn termination_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the server with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Logs to stderr through `tracing`: colours only on a terminal (journald shows escape codes
/// verbatim), level from `RUST_LOG` as `target=level` pairs, default `info`.
fn init_logging() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let filter: Targets = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
    let on_terminal = std::io::stderr().is_terminal();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(on_terminal)
        .with_target(false);
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
}
