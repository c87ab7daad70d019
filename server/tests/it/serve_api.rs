//! `llm-server serve` with the tiny synthetic Gemma 3 model: response shapes, every error
//! status, slots, queue, auth and the OpenAPI document in process against the router; then,
//! against the spawned binary, what needs a process: disconnects, signals and systemd's
//! notifications. The default model and the official SDK are in `serve_clients.rs`.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::serve_support::app::{App, AppConfig, Stream};
use crate::serve_support::{read_head, synth_model, write_request, Requests, Server};
use llm_server::engine::Slots;
use llm_server::serve::auth::ApiKeys;
use llm_server::serve::HttpConfig;
use serde_json::{json, Value};

/// The synthetic model's context (its training context).
const N_CTX: usize = 512;

/// For tests that need a generation to outlast them: a context beyond the synthetic model's
/// training context (allowed, with a note in the plan) and that many tokens to generate take
/// seconds even if decoding gets much faster.
const LONG_CTX: usize = 8192;
const LONG_GENERATION: u32 = 8000;

fn app(config: AppConfig) -> App {
    App::start(config)
}

fn server(args: &[&str]) -> Server {
    Server::start(&synth_model(), args)
}

/// Greedy, so that streamed and non-streamed runs can be compared.
fn chat_body(max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "anything",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": true},
        "user": "unknown fields are ignored",
    })
}

#[test]
fn chat_non_streamed_and_streamed_agree() {
    let s = app(AppConfig::default());
    let r = s.post_json("/v1/chat/completions", &chat_body(6, false));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], "synth-gemma3-q8_0.gguf");
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["total_tokens"], prompt_tokens + 6);
    let content = choice["message"]["content"].as_str().unwrap().to_owned();

    // The prompt is the built-in Gemma format (the file has no template) after exactly one BOS.
    let expected =
        "<start_of_turn>user\nBe brief.\n\nHello there<end_of_turn>\n<start_of_turn>model\n";
    let t = s.post_json(
        "/tokenize",
        &json!({"content": expected, "add_special": true}),
    );
    let ids = t.json()["tokens"].as_array().unwrap().clone();
    assert_eq!(ids.len() as u64, prompt_tokens);

    let r = s.post_json("/v1/chat/completions", &chat_body(6, true));
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let data = r.sse_data();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        streamed, content,
        "greedy stream differs from the non-streamed answer"
    );
    let id = &chunks[0]["id"];
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(&c["id"], id);
    }
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["usage"], Value::Null);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    assert_eq!(usage["usage"]["prompt_tokens"], prompt_tokens);
}

#[test]
fn completions_stop_sequences_and_token_prompts() {
    let s = app(AppConfig::default());
    let complete = |extra: Value| {
        let mut body = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = s.post_json("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let free = complete(json!({}));
    assert_eq!(free["object"], "text_completion");
    let text = free["choices"][0]["text"].as_str().unwrap().to_owned();
    assert!(
        text.chars().count() >= 6,
        "too little text to pick a stop sequence: {text:?}"
    );

    // A stop sequence taken from the free run: the answer must end right before it.
    let stop: String = text.chars().skip(3).take(3).collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let stopped = complete(json!({"stop": [stop.clone(), "\u{1F600}never"]}));
    assert_eq!(stopped["choices"][0]["text"], cut);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // The same prompt as token ids gives the same text.
    let ids = s
        .post_json(
            "/tokenize",
            &json!({"content": "Once upon a time", "add_special": true}),
        )
        .json()["tokens"]
        .clone();
    let by_ids = complete(json!({"prompt": ids}));
    assert_eq!(by_ids["choices"][0]["text"], text.as_str());

    // Streamed completions carry the same text.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": true}),
    );
    let data = r.sse_data();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(streamed, text);
}

#[test]
fn tokenize_detokenize_models_health_metrics() {
    let s = app(AppConfig {
        alias: Some("tiny".into()),
        ..AppConfig::default()
    });
    let ids = s
        .post_json("/tokenize", &json!({"content": "Hello world"}))
        .json()["tokens"]
        .clone();
    let back = s.post_json("/detokenize", &json!({"tokens": ids}));
    assert_eq!(back.json()["content"], "Hello world");
    let pieces = s
        .post_json("/tokenize", &json!({"content": "Hi", "with_pieces": true}))
        .json();
    assert!(
        pieces["tokens"][0]["piece"].is_string() && pieces["tokens"][0]["id"].is_u64(),
        "{pieces}"
    );

    let models = s.get("/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["meta"]["n_ctx"], N_CTX);

    assert_eq!(s.get("/health").json(), json!({"status": "ok"}));
    s.post_json("/v1/completions", &json!({"prompt": "a", "max_tokens": 2}));
    let metrics = s.get("/metrics");
    assert!(metrics
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    for name in [
        "llm_requests_total{route=\"/v1/completions\",status=\"200\"} 1",
        "llm_generated_tokens_total 2",
        "llm_prefill_seconds_total ",
        "llm_decode_seconds_total ",
        "llm_queue_depth 0",
        "llm_busy_slots 0",
        "process_resident_memory_bytes ",
        "process_major_page_faults_total ",
        "process_memory_maps ",
        "cgroup_memory_current_bytes ",
        "cgroup_memory_peak_bytes ",
        "cgroup_memory_oom_kill_events_total ",
    ] {
        assert!(
            metrics.body.contains(name),
            "{name} missing:\n{}",
            metrics.body
        );
    }
}

#[test]
fn bad_requests_get_400_with_the_cause() {
    let s = app(AppConfig::default());
    let json = [("Content-Type", "application/json")];
    let raw = |body: &str| s.request("POST", "/v1/chat/completions", &json, body.as_bytes());

    let r = raw(r#"{"messages": [}"#);
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("invalid JSON"), "{}", r.body);
    // Well-formed JSON of the wrong shape is 400 too (axum's default would be 422).
    let r = raw(r#"{"messages": 5}"#);
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("at `messages`"), "{}", r.body);
    let r = raw(r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}"#);
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("at `max_tokens`"), "{}", r.body);

    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "n");

    let r = s.post_json("/v1/completions", &json!({"prompt": "x", "temperature": 7}));
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("temperature"));

    // A prompt longer than the context: refused, naming both numbers (no silent truncation).
    let long: Vec<u32> = (0..600).map(|i| 300 + i % 100).collect();
    let r = s.post_json("/v1/completions", &json!({"prompt": long}));
    assert_eq!(r.status, 400);
    let message = r.error_message();
    assert!(
        message.contains("600") && message.contains(&N_CTX.to_string()),
        "{message}"
    );
    let r = s.post_json("/v1/completions", &json!({"prompt": [1, 99999]}));
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("99999"));

    // Neither answer echoes what the client sent (issue 42: a 60 KB path came back whole).
    let r = s.get("/v1/nothing-here");
    assert_eq!(r.status, 404);
    let message = r.error_message();
    assert!(message.contains("GET /openapi.json"), "{message}");
    assert!(!r.body.contains("nothing-here"), "{}", r.body);
    let r = s.get("/v1/chat/completions");
    assert_eq!(r.status, 405);
    assert!(
        r.error_message().contains("GET /openapi.json"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("completions"), "{}", r.body);
}

#[test]
fn oversized_body_gets_413() {
    let s = app(AppConfig {
        http: HttpConfig {
            body_limit: 4096,
            ..HttpConfig::default()
        },
        ..AppConfig::default()
    });
    let content = "a".repeat(5000);
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": content}]}),
    );
    assert_eq!(r.status, 413);
    assert!(r.error_message().contains("4096"), "{}", r.body);
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "short", "max_tokens": 1}),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn api_keys() {
    let dir = std::env::temp_dir().join(format!("llm-serve-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, "# test keys\nsk-one\nsk-two\n").unwrap();
    let keys = ApiKeys::from_file(&keys).unwrap();
    let body = br#"{"prompt": "a", "max_tokens": 1}"#;

    let with_keys = |protect_probes| {
        app(AppConfig {
            http: HttpConfig {
                api_keys: keys.clone(),
                protect_probes,
                ..HttpConfig::default()
            },
            ..AppConfig::default()
        })
    };
    let s = with_keys(false);
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        body,
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = s.request(
        "POST",
        "/v1/completions",
        &[
            ("Authorization", "Bearer sk-wrong"),
            ("Content-Type", "application/json"),
        ],
        body,
    );
    assert_eq!(r.status, 401);
    let r = s.request(
        "POST",
        "/v1/completions",
        &[
            ("Authorization", "Bearer sk-two"),
            ("Content-Type", "application/json"),
        ],
        body,
    );
    assert_eq!(r.status, 200);
    assert_eq!(s.get("/v1/models").status, 401);
    // Probes stay public by default; what the server counts does not.
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.get("/openapi.json").status, 200);
    assert_eq!(s.get("/metrics").status, 401);
    let r = s.request(
        "GET",
        "/metrics",
        &[("Authorization", "Bearer sk-one")],
        b"",
    );
    assert_eq!(r.status, 200);
    drop(s);

    let s = with_keys(true);
    assert_eq!(s.get("/health").status, 401);
    assert_eq!(s.get("/metrics").status, 401);
    let r = s.request("GET", "/health", &[("Authorization", "Bearer sk-one")], b"");
    assert_eq!(r.status, 200);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A streamed completion of `max_tokens`, greedy.
fn stream_body(max_tokens: u32) -> Value {
    json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "stream": true})
}

/// Starts a streamed completion long enough to hold a slot and returns it once the first token
/// arrived.
fn hold_slot_in_process(s: &App) -> Stream {
    let mut stream = s.stream("/v1/completions", &stream_body(LONG_GENERATION));
    stream.read_until("\"text\"");
    stream
}

/// Polls `ok` until it holds; the time it took.
fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}

#[test]
fn full_queue_gets_503_with_retry_after() {
    let s = app(AppConfig {
        slots: Slots {
            parallel: 1,
            queue: 1,
            n_ctx: LONG_CTX,
        },
        ..AppConfig::default()
    });
    let holder = hold_slot_in_process(&s);
    let body = json!({"prompt": "b", "max_tokens": 2});
    let queued = s.spawn_request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    wait_for("second request queued", Duration::from_secs(10), || {
        s.metric("llm_queue_depth") == 1.0
    });
    let r = s.post_json("/v1/completions", &json!({"prompt": "c", "max_tokens": 2}));
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "server_overloaded");
    drop(holder);
    let queued = queued.join();
    assert_eq!(
        queued.status, 200,
        "the queued request is served once the slot frees"
    );
}

#[test]
fn request_time_limit() {
    let s = app(AppConfig {
        http: HttpConfig {
            request_timeout: Duration::from_secs(1),
            ..HttpConfig::default()
        },
        slots: Slots {
            n_ctx: LONG_CTX,
            ..AppConfig::default().slots
        },
        ..AppConfig::default()
    });
    let started = Instant::now();
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "Once", "max_tokens": LONG_GENERATION, "temperature": 0}),
    );
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(r.error_message().contains("time limit of 1 s"));
    // Far below the minute the 8000 tokens would take; room for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(s.metric("llm_busy_slots"), 0.0);
}

#[test]
fn health_is_503_until_loaded_then_openapi_matches_the_routes() {
    // Before the model is loaded /health is 503, in the error shape with Retry-After.
    let s = App::loading(AppConfig::default());
    let r = s.get("/health");
    assert_eq!(r.status, 503);
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.json()["error"]["code"], "model_loading");
    s.load();
    assert_eq!(s.get("/health").status, 200);

    let doc = s.get("/openapi.json").json();
    assert_eq!(doc["openapi"], "3.1.0");
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            let r = s.request(&method.to_uppercase(), path, &[], b"{}");
            assert!(
                r.status != 404 && r.status != 405,
                "{method} {path} documented but answers {}",
                r.status
            );
        }
    }
    let path = std::env::temp_dir().join(format!("llm-openapi-{}.json", std::process::id()));
    std::fs::write(&path, doc.to_string()).unwrap();
    crate::serve_support::python(
        "check_openapi.py",
        &["openapi_spec_validator"],
        &[path.to_str().unwrap()],
    );
    std::fs::remove_file(&path).unwrap();
}

// ---- the spawned binary ------------------------------------------------------------------

/// As [`hold_slot_in_process`], on a connection to a spawned server.
fn hold_slot(s: &Server) -> BufReader<TcpStream> {
    stream_from_first_token(s, LONG_GENERATION)
}

/// Starts a streamed completion of `max_tokens` and returns its connection after the first token.
fn stream_from_first_token(s: &Server, max_tokens: u32) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(s.addr).unwrap();
    let body = stream_body(max_tokens);
    write_request(
        &mut stream,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let (status, _) = read_head(&mut reader).unwrap();
    assert_eq!(status, 200);
    let mut line = String::new();
    while !line.contains("\"text\"") {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    reader
}

#[test]
fn disconnecting_client_frees_its_slot_within_a_second() {
    let s = server(&["--parallel", "1", "--ctx-size", &LONG_CTX.to_string()]);
    let stream = hold_slot(&s);
    assert_eq!(s.metric("llm_busy_slots"), 1.0);
    drop(stream);
    let took = wait_for(
        "slot freed after disconnect",
        Duration::from_secs(1),
        || s.metric("llm_busy_slots") == 0.0,
    );
    eprintln!("slot freed {took:?} after the client disconnected");
    assert_eq!(s.metric("llm_cancelled_total"), 1.0);
    // A client waiting for a non-streamed answer that gives up frees the slot as well.
    let mut waiting = TcpStream::connect(s.addr).unwrap();
    let body = json!({"prompt": "Once", "max_tokens": LONG_GENERATION});
    write_request(
        &mut waiting,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
    .unwrap();
    wait_for("request running", Duration::from_secs(10), || {
        s.metric("llm_busy_slots") == 1.0
    });
    drop(waiting);
    let took = wait_for(
        "slot freed after a non-streaming client left",
        Duration::from_secs(1),
        || s.metric("llm_busy_slots") == 0.0,
    );
    eprintln!("slot freed {took:?} after the non-streaming client left");
    assert_eq!(s.metric("llm_cancelled_total"), 2.0);
    // The freed slot serves the next request.
    let r = s.post_json("/v1/completions", &json!({"prompt": "a", "max_tokens": 2}));
    assert_eq!(r.status, 200);
}

#[test]
fn sigterm_finishes_in_flight_work_and_exits_0() {
    let s = server(&[]);
    let stream = stream_from_first_token(&s, 300);
    let status = s.terminate(Duration::from_secs(15));
    assert!(status.success(), "exit status {status}");
    // The stream that was running when SIGTERM came ran to its end.
    let rest: Vec<String> = stream.lines().map_while(Result::ok).collect();
    let data: Vec<&str> = rest
        .iter()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{rest:?}");
    let last: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
}

#[test]
fn sigterm_cancels_work_past_the_deadline() {
    let s = server(&[
        "--shutdown-timeout",
        "1",
        "--ctx-size",
        &LONG_CTX.to_string(),
    ]);
    let holder = hold_slot(&s);
    let started = Instant::now();
    let status = s.terminate(Duration::from_secs(15));
    assert!(status.success(), "exit status {status}");
    // The deadline is 1 s; finishing the held generation (8000 tokens) would take over a minute.
    // 8 s leaves room for a loaded machine (3 s was missed at a load of 10) and tells them apart.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    // The stream ends with an error event naming the shutdown, not silently.
    let rest: String = holder
        .lines()
        .map_while(Result::ok)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(rest.contains("shutting down"), "{rest}");
}

#[test]
fn systemd_notify_ready_watchdog_stopping_and_plain_logs() {
    let dir = std::env::temp_dir().join(format!("llm-serve-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let env = [
        ("NOTIFY_SOCKET", socket_path.as_path()),
        ("WATCHDOG_USEC", Path::new("200000")),
    ];
    let s = Server::spawn_with_env(&synth_model(), &[], &env);
    let mut buf = [0u8; 256];
    let mut next = || {
        let n = socket
            .recv(&mut buf)
            .expect("no notification from the server");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };

    // READY=1 only once the model is loaded: /health is 200 by then.
    let mut seen = Vec::new();
    while !seen.iter().any(|m| m == "READY=1") {
        seen.push(next());
    }
    assert_eq!(s.get("/health").status, 200);
    // Pings every WATCHDOG_USEC / 2 = 100 ms: three within 2 s (room for a loaded machine; a
    // server pinging at some other period, such as the unit's 60 s, takes far longer).
    let started = Instant::now();
    let mut pings = 0;
    while pings < 3 {
        if next() == "WATCHDOG=1" {
            pings += 1;
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "3 pings took {:?}",
        started.elapsed()
    );

    let log = s.log();
    let pid = s.pid();
    let status = s.terminate(Duration::from_secs(10));
    assert!(status.success(), "exit status {status}");
    let mut rest = Vec::new();
    while let Ok(n) = socket.recv(&mut buf) {
        rest.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        if rest.last().unwrap() == "STOPPING=1" {
            break;
        }
    }
    assert_eq!(
        rest.last().map(String::as_str),
        Some("STOPPING=1"),
        "pid {pid}: {rest:?}"
    );
    // stderr is a file here, not a terminal: no colour escapes in the log.
    assert!(log.contains("ready") && !log.contains('\u{1b}'), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}
