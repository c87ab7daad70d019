//! Real clients against the default model: the official `openai` Python SDK and curl, over
//! HTTP to the server in process.

use std::net::SocketAddr;
use std::process::Command;

use crate::serve_support::app::{App, AppConfig};
use llm_server::engine::Slots;
use llm_server::serve::auth::ApiKeys;
use llm_server::serve::HttpConfig;
use serde_json::{json, Value};

/// The default model with a context of 1024, on every CPU as `serve` runs it.
fn default_model(http: HttpConfig) -> AppConfig {
    AppConfig {
        model: test_support::default_model(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        slots: Slots {
            n_ctx: 1024,
            ..AppConfig::default().slots
        },
        http,
        ..AppConfig::default()
    }
}

/// Gemma 3's control tokens: their ids in the default model's `tokenizer.ggml.tokens`.
const BOS: u64 = 2;
const START_OF_TURN: u64 = 105;

#[test]
fn openai_python_sdk() {
    let dir = std::env::temp_dir().join(format!("llm-sdk-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, "sk-test\n").unwrap();
    let s = App::start(default_model(HttpConfig {
        api_keys: ApiKeys::from_file(&keys).unwrap(),
        ..HttpConfig::default()
    }));
    let base = format!("http://{}/v1", s.listen());
    let out = crate::serve_support::python("openai_client.py", &["openai"], &[&base, "sk-test"]);
    std::fs::remove_dir_all(&dir).unwrap();
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("{v:#}");

    assert_eq!(v["model"], "gemma-3-270m-q4_k_m.gguf");
    // Greedy: streamed and plain answers are the same text.
    assert_eq!(v["chat"]["content"], v["chat_stream"]["content"]);
    // The same counts, but the second request found its prompt in the slot's cache.
    let (usage, streamed) = (&v["chat"]["usage"], &v["chat_stream"]["usage"]);
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[field], streamed[field], "{field}");
    }
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        streamed["prompt_tokens_details"]["cached_tokens"],
        prompt_tokens - 1
    );
    assert_eq!(
        v["chat"]["finish_reason"],
        v["chat_stream"]["finish_reason"]
    );
    assert!(!v["chat"]["content"].as_str().unwrap().is_empty());
    assert_eq!(v["completion"]["text"], v["completion_stream"]["text"]);
    assert!(!v["completion"]["text"].as_str().unwrap().is_empty());
    assert_eq!(v["n2_error"]["status"], 400);
}

/// curl sends `-d` bodies as form data unless told the type: the server answers 415 without
/// `Content-Type: application/json` (a cross-site form could otherwise post), so it is given.
fn curl(addr: SocketAddr, path: &str, body: Option<&Value>, extra: &[&str]) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--fail-with-body", "-N"]).args(extra);
    if let Some(body) = body {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
        ]);
    }
    let out = cmd
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "curl {path}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn curl_and_exactly_one_bos() {
    let app = App::start(default_model(HttpConfig::default()));
    let s = app.listen();
    let models: Value = serde_json::from_str(&curl(s, "/v1/models", None, &[])).unwrap();
    assert_eq!(models["data"][0]["meta"]["n_vocab"], 262144);

    let chat =
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0});
    let plain: Value =
        serde_json::from_str(&curl(s, "/v1/chat/completions", Some(&chat), &[])).unwrap();
    let content = plain["choices"][0]["message"]["content"].as_str().unwrap();

    let mut streaming = chat.clone();
    streaming["stream"] = json!(true);
    let sse = curl(s, "/v1/chat/completions", Some(&streaming), &[]);
    let data: Vec<&str> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(*data.last().unwrap(), "[DONE]");
    let streamed: String = data[..data.len() - 1]
        .iter()
        .filter_map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed, content);

    let completion =
        json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0});
    let c: Value =
        serde_json::from_str(&curl(s, "/v1/completions", Some(&completion), &[])).unwrap();
    assert_eq!(c["usage"]["completion_tokens"], 3);

    // The default model has no chat template: the built-in Gemma turns follow one BOS.
    let turns = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n";
    let t: Value = serde_json::from_str(&curl(
        s,
        "/tokenize",
        Some(&json!({"content": turns, "add_special": true})),
        &[],
    ))
    .unwrap();
    let ids: Vec<u64> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect();
    assert_eq!(&ids[..2], &[BOS, START_OF_TURN]);
    assert_eq!(ids.iter().filter(|&&i| i == BOS).count(), 1);
    assert_eq!(plain["usage"]["prompt_tokens"], ids.len());
}
