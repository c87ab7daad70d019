//! The serving path allocates a bounded amount per request, not per token: a real server (the
//! router behind the accept loop, on a loopback port) answers the same request for 16 and for
//! 64 tokens, and the 48 extra tokens may cost only a few allocations on the server's threads
//! (tokio's workers, the decode thread, the blocking pool), with and without the tokens'
//! log-probabilities and 5 alternatives each. The client runs on a thread the counting
//! allocator ignores, so only the server is counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use llm_server::engine::{Counters, Engine, Slots};
use llm_server::model::{LoadOptions, Model};
use llm_server::serve::listener::{serve, ConnLimits};
use llm_server::serve::{router, AppState, HttpConfig, Ready};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the client's thread: what it allocates is not the server's.
    static IGNORED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    // `try_with`: a thread being torn down has no thread-locals left; count it.
    if !IGNORED.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A served model on a loopback port, for as long as it lives.
struct Server {
    addr: SocketAddr,
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    fn start() -> Server {
        let model = Model::load(
            &test_support::default_model(),
            &LoadOptions {
                threads: 1,
                mlock: false,
            },
        )
        .unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let state = AppState::new(HttpConfig::default());
        let slots = Slots {
            parallel: 1,
            n_ctx: 1024,
            queue: 4,
        };
        let counters: Arc<Counters> = state.metrics().engine.clone();
        let engine = Engine::start(Arc::new(model), slots, counters).unwrap();
        state.set_ready(Ready::new(engine, "m".into()));
        let app = router(state);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnLimits {
            max_connections: 4,
            max_per_client: 2,
            header_timeout: Duration::from_secs(30),
            ..ConnLimits::default()
        };
        runtime.spawn(serve(listener, app, None, limits, std::future::pending()));
        Server {
            addr,
            _runtime: runtime,
        }
    }

    /// Sends `body` to `path` and reads the whole answer (the connection closes after it).
    /// Returns the raw response and the allocations the server made meanwhile.
    fn post(&self, path: &str, body: &str) -> (String, usize) {
        std::thread::scope(|s| {
            s.spawn(|| {
                IGNORED.set(true);
                let request = format!(
                    "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let mut response = Vec::with_capacity(1 << 20);
                let mut socket = TcpStream::connect(self.addr).unwrap();
                let before = ALLOCATIONS.load(Ordering::SeqCst);
                socket.write_all(request.as_bytes()).unwrap();
                socket.read_to_end(&mut response).unwrap();
                // The server may still be finishing its side after closing the connection
                // (dropping the connection's task and the job); let it settle so that all of
                // its work for this request is counted.
                std::thread::sleep(Duration::from_millis(200));
                let after = ALLOCATIONS.load(Ordering::SeqCst);
                (String::from_utf8(response).unwrap(), after - before)
            })
            .join()
            .unwrap()
        })
    }
}

/// Which endpoint a measured request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

/// Which request is measured.
#[derive(Clone, Copy, Debug)]
struct Shape {
    endpoint: Endpoint,
    stream: bool,
    /// With the log-probabilities of each token and its 5 most likely alternatives.
    logprobs: bool,
}

/// Alternatives asked for per token (what clients commonly ask; OpenAI allows up to 20).
const TOP_LOGPROBS: usize = 5;

impl Shape {
    fn path(self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
        }
    }

    fn body(self, max_tokens: usize) -> String {
        // Prompts the default model answers at length at temperature 0 (the test checks that
        // every request ran to `max_tokens`).
        let input = match self.endpoint {
            Endpoint::Chat => {
                r#""messages":[{"role":"user","content":"Write a long story about a dragon who learns to bake bread."}]"#
            }
            Endpoint::Completion => r#""prompt":"The history of the city began long ago, when""#,
        };
        let usage = if self.stream {
            r#","stream_options":{"include_usage":true}"#
        } else {
            ""
        };
        let logprobs = match (self.logprobs, self.endpoint) {
            (false, _) => String::new(),
            (true, Endpoint::Chat) => format!(r#","logprobs":true,"top_logprobs":{TOP_LOGPROBS}"#),
            (true, Endpoint::Completion) => format!(r#","logprobs":{TOP_LOGPROBS}"#),
        };
        let stream = self.stream;
        format!(
            r#"{{{input},"max_tokens":{max_tokens},"temperature":0,"stream":{stream}{usage}{logprobs}}}"#
        )
    }

    /// Checks that `response` is what this shape asks for: streamed or not, and with the
    /// log-probabilities of each of the `max_tokens` tokens and `TOP_LOGPROBS` alternatives
    /// when asked for them. (Run after the request's allocations were counted.)
    fn check(self, response: &str, max_tokens: usize) {
        let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let bodies: Vec<serde_json::Value> = if self.stream {
            // Each event whole in one chunk of the chunked body, after the chunk's size line.
            let events: Vec<&str> = body
                .split("\n\n")
                .filter_map(|e| e.split_once("data: ").map(|(_, data)| data))
                .collect();
            assert_eq!(events.last(), Some(&"[DONE]"), "{self:?}: {response}");
            events[..events.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect()
        } else {
            vec![serde_json::from_str(body).unwrap()]
        };
        // Each token's alternatives: chat has a list per token, completions a map.
        let mut tops = Vec::new();
        for body in &bodies {
            let Some(logprobs) = body["choices"].get(0).map(|c| &c["logprobs"]) else {
                continue; // the usage chunk
            };
            if logprobs.is_null() {
                continue;
            }
            match self.endpoint {
                Endpoint::Chat => {
                    for entry in logprobs["content"].as_array().unwrap() {
                        tops.push(entry["top_logprobs"].as_array().unwrap().len());
                    }
                }
                Endpoint::Completion => {
                    for top in logprobs["top_logprobs"].as_array().unwrap() {
                        tops.push(top.as_object().unwrap().len());
                    }
                }
            }
        }
        let expected = if self.logprobs {
            vec![TOP_LOGPROBS; max_tokens]
        } else {
            Vec::new()
        };
        assert_eq!(tops, expected, "{self:?}: {response}");
    }
}

/// Allocations of one request for `max_tokens`, after checking that it generated them all.
fn allocations(server: &Server, shape: Shape, max_tokens: usize) -> usize {
    let (response, allocations) = server.post(shape.path(), &shape.body(max_tokens));
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "{shape:?}: {response}"
    );
    let tokens = format!(r#""completion_tokens":{max_tokens},"#);
    assert!(
        response.contains(&tokens),
        "{shape:?} did not generate {max_tokens} tokens: {response}"
    );
    shape.check(&response, max_tokens);
    allocations
}

/// Tokens of the short and the long request: what they differ by is the per-token cost.
const SHORT: usize = 16;
const LONG: usize = 64;

/// Allocations the 48 extra tokens may cost: a third per token, room for buffers that grow by
/// doubling (before the text pipe and the reused SSE buffer it was about 8 per streamed token
/// and 1 per token of a whole answer; with top-5 log-probabilities, before they were written
/// from borrowed structs, 25 to 104 per token).
const MAX_EXTRA: usize = (LONG - SHORT) / 3;

/// Each figure is the least of this many runs: what the runtime does besides the request
/// (a blocking-pool thread started, a timer) only ever adds.
const RUNS: usize = 2;

#[test]
fn serving_allocations_do_not_grow_with_tokens() {
    let server = Server::start();
    let mut shapes = Vec::new();
    for logprobs in [false, true] {
        for stream in [true, false] {
            for endpoint in [Endpoint::Chat, Endpoint::Completion] {
                shapes.push(Shape {
                    endpoint,
                    stream,
                    logprobs,
                });
            }
        }
    }
    let mut failures = Vec::new();
    for shape in shapes {
        // Once unmeasured: lazily made tables, pool threads and buffers that then stay.
        allocations(&server, shape, LONG);
        let least = |tokens| {
            (0..RUNS)
                .map(|_| allocations(&server, shape, tokens))
                .min()
                .unwrap()
        };
        let short = least(SHORT);
        let long = least(LONG);
        let per_token = (long as f64 - short as f64) / (LONG - SHORT) as f64;
        eprintln!(
            "{shape:?}: {short} allocations for {SHORT} tokens, {long} for {LONG}: \
             {per_token:.2} per extra token"
        );
        if long > short + MAX_EXTRA {
            failures.push(format!(
                "{shape:?}: {long} allocations for {LONG} tokens vs {short} for {SHORT}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "allocations grow with the tokens generated (more than {MAX_EXTRA} for {} extra): {failures:?}",
        LONG - SHORT
    );
}
