//! The chat page at `/` end to end: served by the server in process, opened in headless
//! Chromium (Debian's `chromium`), a message typed and sent, the streamed answer awaited, a
//! second one stopped with the Stop button. The test writes a screenshot for a person to look at: `target/chat-page.png`.

use crate::serve_support::app::{App, AppConfig};
use llm_server::engine::Slots;
use serde_json::Value;

#[test]
fn chat_page_streams_an_answer_in_chromium() {
    let chromium = "/usr/bin/chromium";
    assert!(
        std::path::Path::new(chromium).exists(),
        "{chromium} missing: run `cargo xtask setup` (installs Debian's chromium)"
    );
    let app = App::start(AppConfig {
        model: test_support::default_model(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        slots: Slots {
            n_ctx: 1024,
            ..AppConfig::default().slots
        },
        ..AppConfig::default()
    });
    let shot = test_support::workspace_root().join("target/chat-page.png");
    let _ = std::fs::remove_file(&shot);
    let url = format!("http://{}/", app.listen());
    let out = crate::serve_support::python(
        "chat_page.py",
        &[],
        &[&url, shot.to_str().unwrap(), chromium],
    );
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("{v:#}\nscreenshot: {}", shot.display());
    assert_eq!(v["done"], "true", "{v}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert!(!v["answer"].as_str().unwrap().trim().is_empty(), "{v}");
    assert!(
        v["seen_partial"] == true,
        "the answer should appear while streaming: {v}"
    );
    assert_eq!(v["model"], "model: gemma-3-270m-q4_k_m.gguf");
    assert!(v["speed"].as_str().unwrap().ends_with("tok/s"), "{v}");
    assert_eq!(v["send_enabled"], true);
    assert_eq!(v["stop"]["done"], "stopped", "{v}");
    assert_eq!(v["stop"]["send_enabled"], true, "{v}");
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 5_000,
        "{} bytes",
        png.len()
    );
}
