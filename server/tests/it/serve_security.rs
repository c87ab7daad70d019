//! What a public endpoint needs: API keys (scheme without regard to case, wrong keys of any
//! length refused), `/metrics` behind the key, the Host guard on loopback, CORS only for the
//! origins given, and token-bucket rate limits answering 429 with Retry-After.

use std::time::{Duration, Instant};

use llm_server::serve::auth::ApiKeys;
use llm_server::serve::HttpConfig;

use crate::serve_support::app::{App, AppConfig};
use crate::serve_support::{synth_model, Requests, Server};

const BODY: &[u8] = br#"{"prompt": "a", "max_tokens": 1}"#;

/// A key file in a directory of its own, removed when dropped.
struct KeyFile {
    dir: std::path::PathBuf,
}

impl KeyFile {
    fn new(name: &str, text: &str) -> KeyFile {
        let dir = std::env::temp_dir().join(format!("llm-sec-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keys"), text).unwrap();
        KeyFile { dir }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.join("keys")
    }

    fn arg(&self) -> String {
        self.path().display().to_string()
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn with_auth(s: &impl Requests, auth: &str) -> u16 {
    let headers = [
        ("Authorization", auth),
        ("Content-Type", "application/json"),
    ];
    s.request("POST", "/v1/completions", &headers, BODY).status
}

#[test]
fn keys_refused_unless_exact_scheme_case_free() {
    let file = KeyFile::new("keys", "# keys\nsk-0123456789abcdef\n");
    let s = App::start(AppConfig {
        http: HttpConfig {
            api_keys: ApiKeys::from_file(&file.path()).unwrap(),
            ..HttpConfig::default()
        },
        ..AppConfig::default()
    });
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        BODY,
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    // Same length, one character off; shorter; longer; a prefix of the key; empty.
    for wrong in [
        "Bearer sk-0123456789abcdeF",
        "Bearer sk-0123",
        "Bearer sk-0123456789abcdef0",
        "Bearer sk-0123456789abcde",
        "Bearer ",
        "Basic sk-0123456789abcdef",
        "sk-0123456789abcdef",
    ] {
        assert_eq!(with_auth(&s, wrong), 401, "{wrong}");
    }
    for right in [
        "Bearer sk-0123456789abcdef",
        "bearer sk-0123456789abcdef",
        "BEARER sk-0123456789abcdef",
    ] {
        assert_eq!(with_auth(&s, right), 200, "{right}");
    }
    assert_eq!(s.get("/metrics").status, 401);
    let r = s.request(
        "GET",
        "/metrics",
        &[("Authorization", "bearer sk-0123456789abcdef")],
        b"",
    );
    assert_eq!(r.status, 200);
}

/// Bound to loopback, the server answers only requests addressed to a loopback name.
#[test]
fn loopback_server_refuses_foreign_host_headers() {
    let s = Server::start(&synth_model(), &[]);
    let port = s.addr.port().to_string();
    for host in [
        "localhost".to_string(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = s.request("GET", "/v1/models", &[("Host", &host)], b"");
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
    for host in [
        "evil.example".to_string(),
        format!("evil.example:{port}"),
        format!("localhost.evil.example:{port}"),
    ] {
        let r = s.request("GET", "/v1/models", &[("Host", &host)], b"");
        assert_eq!(r.status, 403, "{host}: {}", r.body);
        assert!(r.error_message().contains("DNS rebinding"), "{}", r.body);
    }
}

#[test]
fn cors_only_for_listed_origins() {
    let preflight = |s: &App, origin: &str| {
        s.request(
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization,content-type",
                ),
            ],
            b"",
        )
    };
    let off = App::loading(AppConfig::default());
    let r = preflight(&off, "https://app.example");
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");
    let on = App::loading(AppConfig {
        http: HttpConfig {
            cors_origins: vec!["https://app.example".into()],
            ..HttpConfig::default()
        },
        ..AppConfig::default()
    });
    let r = preflight(&on, "https://app.example");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let allowed = r.header("access-control-allow-headers").unwrap_or("");
    assert!(allowed.contains("authorization"), "{r:?}");
    let r = preflight(&on, "https://evil.example");
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");
}

/// `--cors-origin` must be an origin, not a URL with a path; a bad one exits 1.
#[test]
fn bad_cors_origin_exits_1() {
    let mut s = Server::spawn(&synth_model(), &["--cors-origin", "https://app.example/x"]);
    assert_eq!(s.wait_exit(Duration::from_secs(60)).code(), Some(1));
    assert!(s.log().contains("not an origin"), "{}", s.log());
}

/// Takes requests until one is refused with 429; returns how many passed and its Retry-After.
fn until_429(s: &Server, headers: &[(&str, &str)]) -> (usize, u64) {
    for passed in 0..100 {
        let r = s.request("GET", "/v1/models", headers, b"");
        if r.status == 429 {
            assert!(r.error_message().contains("rate limit"), "{}", r.body);
            let retry_after = r
                .header("retry-after")
                .expect("Retry-After")
                .parse()
                .unwrap();
            return (passed, retry_after);
        }
        assert_ne!(r.status, 503, "429, not 503, for a rate limit");
    }
    panic!("no 429 in 100 requests:\n{}", s.log());
}

/// Waits out Retry-After, then expects the request through.
fn recovers(s: &Server, headers: &[(&str, &str)], retry_after: u64, expected: u16) {
    std::thread::sleep(Duration::from_secs(retry_after));
    let r = s.request("GET", "/v1/models", headers, b"");
    assert_eq!(r.status, expected, "after Retry-After: {}", r.body);
}

#[test]
fn rate_limits_answer_429_with_retry_after_then_recover() {
    let file = KeyFile::new("rate", "sk-a\nsk-b\n");
    let key = file.arg();
    // 60 a minute: a token a second, after a burst of 3.
    let s = Server::start(
        &synth_model(),
        &[
            "--api-key-file",
            &key,
            "--rate-limit-key",
            "60",
            "--rate-burst",
            "3",
        ],
    );
    let a = [("Authorization", "Bearer sk-a")];
    let started = Instant::now();
    let (passed, retry_after) = until_429(&s, &a);
    // Refilled by at most one token a second while the burst was spent.
    let refilled = started.elapsed().as_secs() as usize + 1;
    assert!((3..=3 + refilled).contains(&passed), "{passed} passed");
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    // Another key has its own bucket; the probes have none.
    let b = [("Authorization", "Bearer sk-b")];
    assert_eq!(s.request("GET", "/v1/models", &b, b"").status, 200);
    assert_eq!(s.get("/health").status, 200);
    recovers(&s, &a, retry_after, 200);
    drop(s);

    // Per client address, before the key is checked: guessing keys is limited too.
    let s = Server::start(
        &synth_model(),
        &[
            "--api-key-file",
            &key,
            "--rate-limit-ip",
            "30",
            "--rate-burst",
            "2",
        ],
    );
    let wrong = [("Authorization", "Bearer sk-guess")];
    let (passed, retry_after) = until_429(&s, &wrong);
    assert!((2..=3).contains(&passed), "{passed} passed");
    // 30 a minute: a token every 2 s.
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    // The right key from the same address is refused as well until the bucket refills (the
    // wait is this refusal's own: the token a slow loop may have taken meanwhile moved it).
    let r = s.request("GET", "/v1/models", &a, b"");
    assert_eq!(r.status, 429);
    let retry_after = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    recovers(&s, &a, retry_after, 200);
}

/// `--default-max-tokens` caps a request that gives no max_tokens; one that gives it wins.
#[test]
fn default_max_tokens_applies_when_the_request_gives_none() {
    let s = App::start(AppConfig {
        http: HttpConfig {
            default_max_tokens: Some(3),
            ..HttpConfig::default()
        },
        ..AppConfig::default()
    });
    let ask = |body: serde_json::Value| {
        let r = s.post_json("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        (
            v["usage"]["completion_tokens"].as_u64().unwrap(),
            v["choices"][0]["finish_reason"]
                .as_str()
                .unwrap()
                .to_owned(),
        )
    };
    let prompt = "Once upon a time";
    assert_eq!(
        ask(serde_json::json!({"prompt": prompt, "temperature": 0})),
        (3, "length".to_owned())
    );
    assert_eq!(
        ask(serde_json::json!({"prompt": prompt, "temperature": 0, "max_tokens": 6})),
        (6, "length".to_owned())
    );
}
