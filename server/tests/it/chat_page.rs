//! The chat page at `/` end to end: served by the server in process on the appliance's
//! instruct model (SmolLM2-135M-Instruct) behind an API key, opened in headless Chromium
//! (Debian's `chromium`). Two questions are asked greedily and their streamed answers awaited,
//! the page is reloaded, the Markdown renderer is fed hostile input, an answer is stopped, and
//! "New chat" clears the conversation. The test writes the screenshot README shows:
//! `target/chat-page.png`, copied by hand to `server/ui/chat-page.png`.

use llm_server::engine::Slots;
use llm_server::serve::auth::ApiKeys;
use llm_server::serve::HttpConfig;
use serde_json::{json, Value};

use crate::serve_support::app::{App, AppConfig};

const KEY: &str = "sk-chat-page-0123456789";
const N_CTX: usize = 1024;

/// The page's context figure, "context: <used> / <n_ctx> tokens", as numbers.
fn context_figure(text: &Value) -> (u64, u64) {
    let text = text.as_str().unwrap();
    let figures = text
        .strip_prefix("context: ")
        .and_then(|t| t.strip_suffix(" tokens"))
        .and_then(|t| t.split_once(" / "))
        .unwrap_or_else(|| panic!("not a context figure: {text:?}"));
    let number = |s: &str| {
        s.parse()
            .unwrap_or_else(|e| panic!("{e}: {s:?} in {text:?}"))
    };
    (number(figures.0), number(figures.1))
}

/// One greedy answer: finished, streamed, and the context figure is the usage the server
/// reported in that very response (prompt + completion tokens, of the slot's n_ctx).
fn check_answer(answer: &Value) -> u64 {
    assert_eq!(answer["done"], "true", "{answer}");
    assert_eq!(
        answer["seen_partial"], true,
        "the answer should appear while streaming: {answer}"
    );
    let usage = &answer["reported_usage"];
    let reported =
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap();
    let (used, n_ctx) = context_figure(&answer["context"]);
    assert_eq!(used, reported, "{answer}");
    assert_eq!(n_ctx, N_CTX as u64, "{answer}");
    assert!(used > 0 && used <= n_ctx, "{answer}");
    used
}

#[test]
fn chat_page_streams_an_answer_in_chromium() {
    let chromium = "/usr/bin/chromium";
    assert!(
        std::path::Path::new(chromium).exists(),
        "{chromium} missing: run `cargo xtask setup` (installs Debian's chromium)"
    );
    let dir = std::env::temp_dir().join(format!("llm-chat-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("{KEY}\n")).unwrap();
    let app = App::start(AppConfig {
        model: test_support::smollm2_model(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        slots: Slots {
            n_ctx: N_CTX,
            ..AppConfig::default().slots
        },
        http: HttpConfig {
            api_keys: ApiKeys::from_file(&keys).unwrap(),
            ..HttpConfig::default()
        },
        ..AppConfig::default()
    });
    let shot = test_support::workspace_root().join("target/chat-page.png");
    // Not there when cargo builds elsewhere (CARGO_TARGET_DIR).
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&shot);
    let url = format!("http://{}/", app.listen());
    let out = crate::serve_support::python(
        "chat_page.py",
        &[],
        &[&url, shot.to_str().unwrap(), chromium, KEY],
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("{v:#}\nscreenshot: {}", shot.display());

    // Without the key the page says what the server answered; with it, the model's name.
    assert!(
        v["model_without_key"].as_str().unwrap().contains("API key"),
        "{v}"
    );
    assert_eq!(v["model"], "model: SmolLM2-135M-Instruct.Q4_1.gguf");

    let france = &v["france"];
    check_answer(france);
    assert!(
        france["answer"].as_str().unwrap().contains("Paris"),
        "{france}"
    );
    assert!(v["speed"].as_str().unwrap().ends_with("tok/s"), "{v}");
    assert_eq!(v["send_enabled"], true);

    // The real answer's fenced code became a code block (no fence left as text), its
    // `names` inline code.
    let code = &v["code"];
    let used = check_answer(code);
    let blocks = code["pre_code"].as_array().unwrap();
    assert_eq!(blocks.len(), 1, "{code}");
    let block = blocks[0].as_str().unwrap();
    assert!(block.contains("def ") && block.contains("return"), "{code}");
    assert!(!code["answer"].as_str().unwrap().contains("```"), "{code}");
    assert!(code["inline_code"].as_u64().unwrap() > 0, "{code}");

    // After a reload: the same messages and context figure; localStorage holds the
    // conversation and nothing with the key, even though an older page's key was planted there.
    let reload = &v["reload"];
    assert_eq!(reload["after"], reload["before"], "{reload}");
    assert_eq!(reload["after"].as_array().unwrap().len(), 4, "{reload}");
    assert_eq!(reload["pre_code"], 1, "{reload}");
    assert_eq!(context_figure(&reload["context"]), (used, N_CTX as u64));
    let local = reload["storage"]["local"].as_object().unwrap();
    for (name, value) in local {
        assert!(
            !name.contains(KEY) && !value.as_str().unwrap().contains(KEY),
            "the API key is in localStorage: {name} = {value}"
        );
    }
    let stored: Value = serde_json::from_str(local["llm-chat"].as_str().unwrap()).unwrap();
    let roles: Vec<&str> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m.as_object().unwrap().len(), 2, "{m}");
            assert!(m["content"].is_string(), "{m}");
            m["role"].as_str().unwrap()
        })
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert_eq!(
        stored["messages"][0]["content"],
        "Which city is the capital of France?"
    );
    assert_eq!(stored["used"], used);
    assert_eq!(
        reload["storage"]["session"]["llm-api-key"], KEY,
        "the key stays for this tab: {reload}"
    );

    // Hostile Markdown: no element from the text, no handler ran, the HTML shows as text,
    // only the https link is a link, and fenced code is a <pre><code>.
    let r = &v["render"];
    assert_eq!(r["pwned"], "undefined", "{r}");
    assert_eq!(r["injected"], 0, "{r}");
    assert_eq!(r["on_attributes"], json!([]), "{r}");
    let text = r["text"].as_str().unwrap();
    for literal in [
        r#"<img src=x onerror="window.pwned=1">"#,
        "[x](javascript:alert(1))",
    ] {
        assert!(text.contains(literal), "{literal} not shown as text: {r}");
    }
    assert_eq!(r["pre_code"], json!(["<script>window.pwned=2</script>"]));
    assert_eq!(r["pre_lang"], json!(["html"]));
    assert_eq!(
        r["links"],
        json!([{"href": "https://example.com/a?b=1&c=2", "rel": "noopener noreferrer", "target": "_blank"}])
    );
    assert_eq!(r["strong"], json!(["<b>bold</b>"]));
    assert_eq!(r["em"], json!(["<i>it</i>"]));
    assert_eq!(
        r["inline_code"],
        json!([r#"<svg onload="window.pwned=3">"#])
    );
    assert_eq!(
        r["ul"],
        json!([
            r#"one <iframe src="javascript:window.pwned=4"></iframe>"#,
            "two"
        ])
    );
    assert_eq!(
        r["ol"],
        json!([["first", "second"]]),
        "one list across the blank line"
    );
    assert_eq!(r["paragraphs"], 3, "{r}");
    assert_eq!(v["render_unclosed"], json!(["def f(<b>"]));
    // 8 quotes deep, then the remaining 4992 '>' and " deep" as text.
    assert_eq!(v["render_deep_quote"], json!({"quotes": 8, "text": 4997}));

    assert_eq!(v["stop"]["done"], "stopped", "{v}");
    assert_eq!(v["stop"]["send_enabled"], true, "{v}");

    let new_chat = &v["new_chat"];
    assert_eq!(new_chat["messages"], json!([]), "{new_chat}");
    assert_eq!(new_chat["stored"], Value::Null, "{new_chat}");
    assert_eq!(new_chat["after_reload"], json!([]), "{new_chat}");
    assert!(
        new_chat["context"]
            .as_str()
            .unwrap()
            .starts_with("context: – /"),
        "{new_chat}"
    );

    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 5_000,
        "{} bytes",
        png.len()
    );
}
