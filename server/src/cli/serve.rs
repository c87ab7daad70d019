//! `llm-server serve`: check the memory plan, bind, load the model, serve until SIGTERM.

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use llm_server::engine::slot_store::SlotStore;
use llm_server::engine::{Counters, Engine, Slots, DECODE_THREAD};
use llm_server::exit::{Refusal, Status};
use llm_server::gguf::Gguf;
use llm_server::model::{LoadOptions, Model};
use llm_server::serve::auth::ApiKeys;
use llm_server::serve::input::{InputArgs, InputLimits};
use llm_server::serve::limit::RateConfig;
use llm_server::serve::listener::{ConnArgs, ConnLimits};
use llm_server::serve::{listener, router, sd_notify, tls, AppState, HttpConfig, Ready};
use tokio::sync::Notify;

use super::plan::{Checked, Sizing};
use super::CliResult;
use llm_server::limits::{Fit, HumanBytes};

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
    /// Threads for the forward pass [default: the physical cores, at most the CPUs the cgroup's
    /// quota grants; the start-up log says which].
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
    /// Require the key for /health and /openapi.json too (/metrics needs it whenever keys are on).
    #[arg(long, requires = "api_key_file")]
    auth_probes: bool,
    /// TLS certificate chain (PEM, leaf first); with --tls-key the port speaks only HTTPS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Requests per minute per API key (token bucket; 0 = no limit). Over it: 429 + Retry-After.
    #[arg(long, default_value_t = RateConfig::default().per_key)]
    rate_limit_key: u32,
    /// Requests per minute per client IP address (token bucket; 0 = no limit).
    #[arg(long, default_value_t = RateConfig::default().per_ip)]
    rate_limit_ip: u32,
    /// Requests a rate-limit bucket holds: how many may come at once after a quiet spell.
    #[arg(long, default_value_t = RateConfig::default().burst, value_parser = clap::value_parser!(u32).range(1..))]
    rate_burst: u32,
    /// Connections open at once; past it an idle one gives way to a new one, or the new one
    /// gets 503 and is closed (none waits in the kernel's accept queue).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    #[command(flatten)]
    conn: ConnArgs,
    /// Seconds a client has to send a request's headers (and, with TLS, finish the handshake).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout: u64,
    /// Seconds a client has to send a request's body.
    #[arg(long, default_value_t = HttpConfig::default().body_timeout.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout: u64,
    /// max_tokens of a request that gives none (default: up to the end of the context).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    default_max_tokens: Option<u64>,
    /// Write the control tokens the model generates (Gemma's `<start_of_turn>`, ChatML's
    /// `<|im_start|>`) into answers as their text; without it they are nothing, as in
    /// llama-server (`--special`). A token that ends the generation is never written.
    #[arg(long)]
    special: bool,
    /// An origin browsers may call the API from (repeatable), e.g. https://app.example;
    /// none: CORS off.
    #[arg(long = "cors-origin", value_name = "ORIGIN", value_parser = cors_origin)]
    cors_origins: Vec<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = HttpConfig::default().body_limit)]
    body_limit: usize,
    /// Seconds a request may take, waiting in the queue included.
    #[arg(long, default_value_t = HttpConfig::default().request_timeout.as_secs())]
    request_timeout: u64,
    /// Seconds in-flight requests get to finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10)]
    shutdown_timeout: u64,
    /// Seconds the decode thread may work without progress before /health says 503 and the
    /// systemd watchdog pings stop (a long prompt chunk on a slow CPU must fit well inside).
    #[arg(long, default_value_t = HttpConfig::default().engine_stall.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    engine_stall_timeout: u64,
    /// Directory of saved slots (llama-server's flag): each slot's conversation and KV cache is
    /// restored from it at start, saved to it on SIGTERM/SIGINT and when idle, and
    /// `POST /slots/{id}?action=save|restore|erase` works on files inside it.
    #[arg(long, value_name = "DIR")]
    slot_save_path: Option<PathBuf>,
    /// With --slot-save-path: seconds a slot whose conversation changed stays idle before it
    /// is saved (0: only on a graceful stop).
    #[arg(long, default_value_t = 60, requires = "slot_save_path")]
    slot_save_idle: u64,
    /// Start even when the memory plan does not fit the limits (only warn).
    #[arg(long)]
    ignore_memory_plan: bool,
    /// Seconds to wait, when the memory plan fits every ceiling (cgroup limits, the host's RAM)
    /// but not what the host has free now, for other processes to free it; then exit with
    /// status 75 (EX_TEMPFAIL), which a systemd unit restarts, instead of 2.
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    wait_for_memory: u64,
    #[command(flatten)]
    input: InputArgs,
}

impl Serve {
    pub fn run(self) -> CliResult {
        init_logging();
        exit_on_engine_panic();
        let limits = self.conn.limits(
            self.max_connections,
            Duration::from_secs(self.header_timeout),
            Duration::from_secs(self.request_timeout),
        )?;
        let gguf = Gguf::open(&self.model)?;
        let mut checked = Checked::new(&gguf, self.sizing)?;
        let mut fit = checked.fit();
        if fit == Fit::Later && !self.ignore_memory_plan {
            fit = wait_for_memory(&mut checked, Duration::from_secs(self.wait_for_memory));
        }
        let table = checked.table(&self.model.display().to_string());
        match fit {
            Fit::Now => tracing::info!("\n{table}"),
            _ if self.ignore_memory_plan => tracing::warn!(
                "the memory plan does not fit; starting anyway (--ignore-memory-plan):\n{table}"
            ),
            Fit::Later => {
                eprint!("{table}");
                return Err(Refusal {
                    status: Status::MemoryShort,
                    message: format!(
                        "refusing to start: the memory plan fits but the host does not have it \
                         free (waited {} s, --wait-for-memory); status {} asks systemd to \
                         restart the server later (--ignore-memory-plan starts anyway)",
                        self.wait_for_memory,
                        Status::MemoryShort.code()
                    ),
                }
                .into());
            }
            Fit::Never => {
                eprint!("{table}");
                return Err(Refusal {
                    status: Status::DoesNotFit,
                    message: "refusing to start: the memory plan does not fit \
                              (--ignore-memory-plan starts anyway)"
                        .into(),
                }
                .into());
            }
        }
        let api_keys = match &self.api_key_file {
            Some(path) => ApiKeys::from_file(path)?,
            None => ApiKeys::default(),
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
            _ => None,
        };
        if api_keys.is_empty() && self.rate_limit_key > 0 {
            tracing::warn!("--rate-limit-key has no effect without --api-key-file");
        }
        let http = HttpConfig {
            body_limit: self.body_limit,
            request_timeout: Duration::from_secs(self.request_timeout),
            body_timeout: Duration::from_secs(self.body_timeout),
            api_keys,
            protect_probes: self.auth_probes,
            default_max_tokens: self.default_max_tokens.map(|n| n as usize),
            special: self.special,
            loopback_hosts: self.host.is_loopback(),
            cors_origins: self.cors_origins.clone(),
            rate: RateConfig {
                per_key: self.rate_limit_key,
                per_ip: self.rate_limit_ip,
                burst: self.rate_burst,
            },
            engine_stall: Duration::from_secs(self.engine_stall_timeout),
            input: InputLimits::new(self.input.clone()),
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // HTTP is light work next to decoding: a small runtime leaves the CPUs to the model.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cpus.min(2))
            .max_blocking_threads(cpus.max(2))
            .thread_name("http")
            .enable_all()
            .build()?;
        runtime.block_on(self.serve(gguf, checked, http, tls, limits))
    }

    async fn serve(
        self,
        gguf: Gguf,
        checked: Checked,
        http: HttpConfig,
        tls: Option<tokio_rustls::TlsAcceptor>,
        limits: ConnLimits,
    ) -> CliResult {
        let store = self.slot_store()?;
        let addr = SocketAddr::new(self.host, self.port);
        let listener = listener::bind(addr).map_err(|e| {
            format!("cannot listen on {addr}: {e}; choose another --port or --host")
        })?;
        tracing::info!(
            "listening on {}://{}; loading the model",
            if tls.is_some() { "https" } else { "http" },
            listener.local_addr()?
        );

        let state = AppState::new(http);
        let load_failed = Arc::new(Notify::new());
        let loader = Loader {
            model_id: self.alias.clone().unwrap_or_else(|| file_name(&self.model)),
            options: LoadOptions {
                threads: self.forward_threads(),
                mlock: self.mlock,
            },
            slots: Slots {
                parallel: checked.plan.parallel,
                n_ctx: checked.plan.n_ctx,
                queue: self.queue,
            },
            store,
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
            // The timer only paces the pings; whether one is sent is the decode thread's
            // heartbeat's say. A stuck engine stops them, and systemd restarts the service.
            let state = state.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                let mut was_alive = true;
                loop {
                    tick.tick().await;
                    let alive = state.is_alive();
                    if alive {
                        notify_systemd("WATCHDOG=1");
                    } else if was_alive {
                        tracing::error!("the decode thread is stuck: no more watchdog pings");
                    }
                    was_alive = alive;
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
        listener::serve(listener, router(state.clone()), tls, limits, shutdown).await;
        // Anything still queued (e.g. on connections that closed) is released with the engine.
        let _ = tokio::task::spawn_blocking(move || state.cancel_all()).await;
        tracing::info!("stopped");
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("stopped because the model could not be loaded (see the log above)".into());
        }
        Ok(())
    }
}

impl Serve {
    /// The forward pass's threads, logged with where the number came from.
    fn forward_threads(&self) -> usize {
        let threads = match self.threads {
            Some(n) => llm_server::threads::DefaultThreads {
                threads: n.max(1),
                reason: "--threads".into(),
            },
            None => llm_server::threads::default_threads(),
        };
        tracing::info!("forward pass on {threads}");
        threads.threads
    }

    /// The slot store of --slot-save-path, its directory created if missing.
    fn slot_store(&self) -> Result<Option<SlotStore>, String> {
        let Some(dir) = &self.slot_save_path else {
            return Ok(None);
        };
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "--slot-save-path {}: cannot create the directory: {e}; give a writable directory",
                dir.display()
            )
        })?;
        Ok(Some(SlotStore {
            dir: dir.clone(),
            idle_save: (self.slot_save_idle > 0).then(|| Duration::from_secs(self.slot_save_idle)),
        }))
    }
}

/// A panic on the decode thread ends the process: queued requests would otherwise wait for ever
/// on a thread that is gone. Panics elsewhere (a request's task) stay that request's failure.
fn exit_on_engine_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if std::thread::current().name() == Some(DECODE_THREAD) {
            tracing::error!(
                "the decode thread panicked: exiting with status {} to be restarted",
                Status::EnginePanic.code()
            );
            Status::EnginePanic.exit();
        }
    }));
}

/// What loading needs, moved to a blocking thread.
struct Loader {
    model_id: String,
    options: LoadOptions,
    slots: Slots,
    store: Option<SlotStore>,
}

impl Loader {
    fn load(
        self,
        gguf: Gguf,
        counters: Arc<Counters>,
    ) -> Result<Ready, Box<dyn std::error::Error>> {
        let started = std::time::Instant::now();
        let model = Arc::new(Model::from_gguf(gguf, &self.options)?);
        let engine = Engine::start_with_store(model, self.slots, counters, self.store)?;
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

/// An origin as browsers send it: scheme, host and optional port, nothing else.
fn cors_origin(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .ok_or_else(|| format!("{s:?} is not an origin: write it as https://host[:port]"))?;
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) || !s.is_ascii() {
        return Err(format!(
            "{s:?} is not an origin: scheme, host and port only, as https://app.example:8443"
        ));
    }
    Ok(s.to_owned())
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Waits up to `wait` for the host to free the memory the plan needs beyond what it has free,
/// re-reading the limits every second; how it ends. Under systemd the unit's status says what it
/// waits for, and the start timeout and the watchdog are pushed on meanwhile.
fn wait_for_memory(checked: &mut Checked, wait: Duration) -> Fit {
    let start = std::time::Instant::now();
    let need = HumanBytes(checked.plan.total());
    let mut logged = None;
    loop {
        let fit = checked.fit();
        if fit != Fit::Later {
            if logged.is_some() {
                tracing::info!("waited {:.0?} for memory", start.elapsed());
            }
            return fit;
        }
        if start.elapsed() >= wait {
            return fit;
        }
        let free = checked.limits.limits.iter().find(|l| l.transient);
        let free = HumanBytes(free.map_or(0, |l| l.bytes));
        // Every 30 s, not every second: the journal of a box short of memory is small too.
        if logged.is_none_or(|at: std::time::Instant| at.elapsed() >= Duration::from_secs(30)) {
            tracing::warn!(
                "waiting up to {} s for memory: the plan needs {need}, the host has {free} free",
                wait.as_secs()
            );
            logged = Some(std::time::Instant::now());
        }
        notify_systemd(&format!(
            "STATUS=waiting for memory: the plan needs {need}, {free} free\n\
             EXTEND_TIMEOUT_USEC=30000000\nWATCHDOG=1"
        ));
        std::thread::sleep(Duration::from_secs(1));
        checked.recheck();
    }
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
