//! Slots saved to disk (`serve --slot-save-path`), with the tiny synthetic Gemma 3: a long
//! prompt's cache survives a graceful restart (the same prompt after it is read from the cache
//! and answered exactly as before), files that do not fit (another model, truncated) are
//! refused, deleted and logged, a changed slot is saved when idle, and
//! `POST /slots/{id}?action=save|restore|erase` works behind the API key.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::serve_support::app::{App, AppConfig};
use crate::serve_support::{cached, prompt_tokens, synth_model, Requests, Server};
use serde_json::{json, Value};

const KEY: &str = "sk-slots";

/// A prompt of several hundred tokens.
fn long_prompt() -> Value {
    let text = "The tide rises over the grey stones of the harbour, and the gulls call. ".repeat(8);
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0})
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("llm-slot-save-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    fn slot0(&self) -> PathBuf {
        self.0.join("slot-0.kv")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(model: &Path, dir: &Dir, extra: &[&str]) -> Server {
    let mut args = vec!["-c", "1024", "--slot-save-path", dir.path()];
    args.extend_from_slice(extra);
    Server::start(model, &args)
}

fn ask(s: &impl Requests, body: &Value, headers: &[(&str, &str)]) -> Value {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &h,
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn answer(v: &Value) -> &str {
    v["choices"][0]["message"]["content"].as_str().unwrap()
}

/// Runs the long prompt in a fresh server over `dir` and stops it with SIGTERM; returns the
/// answer.
fn cold_run_then_stop(dir: &Dir) -> Value {
    let s = start(&synth_model(), dir, &[]);
    let cold = ask(&s, &long_prompt(), &[]);
    assert_eq!(cached(&cold), 0);
    assert!(prompt_tokens(&cold) >= 300, "{cold}");
    assert!(
        !dir.slot0().exists(),
        "saved before the stop or the idle time"
    );
    let log_before = s.log();
    let status = s.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status}\n{log_before}");
    assert!(dir.slot0().exists(), "nothing saved on SIGTERM");
    cold
}

#[test]
fn a_long_prompt_is_read_from_the_cache_after_a_graceful_restart() {
    let dir = Dir::new("restart");
    let cold = cold_run_then_stop(&dir);
    let size = std::fs::metadata(dir.slot0()).unwrap().len();
    // Its tokens' rows at most: n_past ≤ prompt + answer, 1 KV head of the synthetic model.
    assert!(size > 10_000, "{size} bytes");

    let s = start(&synth_model(), &dir, &[]);
    assert!(s.log().contains("slot 0: restored"), "{}", s.log());
    let warm = ask(&s, &long_prompt(), &[]);
    // All of the prompt but its last token, whose logits are computed.
    assert_eq!(cached(&warm), prompt_tokens(&warm) - 1, "{warm}");
    assert_eq!(
        answer(&warm),
        answer(&cold),
        "the restored cache answers differently"
    );
    assert_eq!(
        s.metric("llm_prompt_tokens_total"),
        1.0,
        "one prompt token evaluated"
    );
}

#[test]
fn a_file_from_another_model_is_refused_deleted_and_the_server_starts_cold() {
    let dir = Dir::new("other-model");
    cold_run_then_stop(&dir);
    let other = test_support::synth("synth-llama-q4_0.gguf");
    let s = start(&other, &dir, &[]);
    let log = s.log();
    let line = log
        .lines()
        .find(|l| l.contains("refusing"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(
        line.contains("slot-0.kv") && line.contains("another model") && line.contains("deleted it"),
        "{line}"
    );
    assert!(!dir.slot0().exists(), "the refused file is still there");
    assert_eq!(s.metric("llm_prompt_tokens_cached_total"), 0.0);
}

#[test]
fn a_truncated_or_corrupt_file_is_refused_deleted_and_the_server_starts_cold() {
    let dir = Dir::new("truncated");
    cold_run_then_stop(&dir);
    let bytes = std::fs::read(dir.slot0()).unwrap();
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    let cases: [(&[u8], &str); 3] = [
        (&bytes[..bytes.len() - 100], "truncated"),
        (&bytes[..30], "not a slot file"),
        (&flipped, "corrupt"),
    ];
    for (contents, reason) in cases {
        std::fs::write(dir.slot0(), contents).unwrap();
        let s = start(&synth_model(), &dir, &[]);
        let log = s.log();
        assert!(
            log.lines()
                .any(|l| l.contains("refusing") && l.contains(reason) && l.contains("slot-0.kv")),
            "{reason}:\n{log}"
        );
        assert!(!dir.slot0().exists(), "{reason}: the file is still there");
        let v = ask(&s, &long_prompt(), &[]);
        assert_eq!(cached(&v), 0, "{reason}: {v}");
    }
}

#[test]
fn a_changed_slot_is_saved_when_idle() {
    let dir = Dir::new("idle");
    let s = start(&synth_model(), &dir, &["--slot-save-idle", "1"]);
    let v = ask(&s, &long_prompt(), &[]);
    // The file appears a moment before the server logs the save: wait for both.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(dir.slot0().exists() && s.log().contains("slot 0: saved")) {
        assert!(Instant::now() < deadline, "not saved:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Saved once: nothing changed since.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.log().matches("slot 0: saved").count(), 1, "{}", s.log());
    assert!(prompt_tokens(&v) > 0);
}

fn slot_action(s: &Server, path: &str, body: Option<Value>, key: Option<&str>) -> (u16, Value) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = Vec::new();
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    if !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    let r = s.request("POST", path, &headers, body.as_bytes());
    let v = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

#[test]
fn slots_are_saved_erased_and_restored_through_the_api_behind_the_key() {
    let dir = Dir::new("api");
    let keys = dir.0.join("keys");
    std::fs::write(&keys, format!("{KEY}\n")).unwrap();
    let files = Dir::new("api-files");
    let s = start(
        &synth_model(),
        &files,
        &["--api-key-file", keys.to_str().unwrap()],
    );
    let auth = format!("Bearer {KEY}");
    let first = ask(&s, &long_prompt(), &[("Authorization", &auth)]);
    let file = json!({"filename": "chat.kv"});

    let (status, _) = slot_action(&s, "/slots/0?action=save", Some(file.clone()), None);
    assert_eq!(status, 401, "no key");

    let (status, saved) = slot_action(&s, "/slots/0?action=save", Some(file.clone()), Some(KEY));
    assert_eq!(status, 200, "{saved}");
    assert_eq!(saved["id_slot"], 0);
    assert_eq!(saved["filename"], "chat.kv");
    let n = saved["n_saved"].as_u64().unwrap();
    assert!(n >= prompt_tokens(&first), "{saved}");
    let written = std::fs::metadata(files.0.join("chat.kv")).unwrap().len();
    assert_eq!(saved["n_written"].as_u64(), Some(written));
    assert!(saved["timings"]["save_ms"].is_number());

    let (status, erased) = slot_action(&s, "/slots/0?action=erase", None, Some(KEY));
    assert_eq!(status, 200, "{erased}");
    assert_eq!(erased["n_erased"].as_u64(), Some(n));

    let (status, restored) =
        slot_action(&s, "/slots/0?action=restore", Some(file.clone()), Some(KEY));
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["n_restored"].as_u64(), Some(n));
    assert_eq!(restored["n_read"].as_u64(), Some(written));
    let again = ask(&s, &long_prompt(), &[("Authorization", &auth)]);
    assert_eq!(cached(&again), prompt_tokens(&again) - 1, "{again}");
    assert_eq!(answer(&again), answer(&first));

    // Names outside the directory, or not plain, are refused before anything is touched.
    let long = "a".repeat(200);
    for bad in [
        "../escape.kv",
        "a/b.kv",
        ".hidden",
        "",
        "/etc/passwd",
        long.as_str(),
    ] {
        let (status, v) = slot_action(
            &s,
            "/slots/0?action=save",
            Some(json!({"filename": bad})),
            Some(KEY),
        );
        assert_eq!(status, 400, "{bad:?}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("filename"),
            "{v}"
        );
    }
    assert!(!dir.0.parent().unwrap().join("escape.kv").exists());
    let cases = [
        (
            "/slots/0?action=restore",
            Some(json!({"filename": "never.kv"})),
            "never.kv",
        ),
        ("/slots/0?action=save", None, "`filename` is required"),
        ("/slots/0?action=fly", Some(file.clone()), "invalid action"),
        ("/slots/0", Some(file.clone()), "invalid action"),
        (
            "/slots/7?action=save",
            Some(file.clone()),
            "slot 7 does not exist",
        ),
        (
            "/slots/x?action=save",
            Some(file.clone()),
            "invalid slot id",
        ),
    ];
    for (path, body, says) in cases {
        let (status, v) = slot_action(&s, path, body, Some(KEY));
        assert_eq!(status, 400, "{path}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{path}: {v}"
        );
    }
    // A file that is not a slot file is refused by restore, and kept (it is the client's).
    std::fs::write(files.0.join("junk.kv"), b"not a slot").unwrap();
    let (status, v) = slot_action(
        &s,
        "/slots/0?action=restore",
        Some(json!({"filename": "junk.kv"})),
        Some(KEY),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a slot file"),
        "{v}"
    );
    assert!(files.0.join("junk.kv").exists());
}

#[test]
fn without_a_slot_save_path_slot_actions_are_not_supported() {
    let app = App::start(AppConfig::default());
    let r = app.post_json("/slots/0?action=save", &json!({"filename": "a.kv"}));
    assert_eq!(r.status, 501, "{}", r.body);
    let v = r.json();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--slot-save-path"),
        "{v}"
    );
}
