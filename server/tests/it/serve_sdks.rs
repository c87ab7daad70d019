//! OpenAI's Responses API and Anthropic's Messages API, held by their official Python SDKs
//! (`openai`, `anthropic`) against the `llm-server` binary serving the default model, greedy,
//! behind an API key.

use serde_json::Value;

use crate::serve_support::{python, Server};

/// The binary on the default model with a key; the key file's folder is removed with it.
struct Served {
    server: Server,
    dir: std::path::PathBuf,
}

const KEY: &str = "sk-sdk-test";

impl Served {
    fn start(name: &str) -> Served {
        let dir = std::env::temp_dir().join(format!("llm-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = dir.join("keys");
        std::fs::write(&keys, format!("{KEY}\n")).unwrap();
        let keys = keys.display().to_string();
        let server = Server::start(
            &test_support::default_model(),
            &["--api-key-file", &keys, "--ctx-size", "1024"],
        );
        Served { server, dir }
    }

    /// Runs `script` against the server and reads the JSON it prints.
    fn run(&self, script: &str, modules: &[&str], base: &str) -> Value {
        let out = python(script, modules, &[base, KEY]);
        let v: Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{e}: {out}\nserver log:\n{}", self.server.log()));
        eprintln!("{v:#}");
        assert!(
            !self.server.log().contains("panicked"),
            "{}",
            self.server.log()
        );
        v
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

fn types(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(text).collect()
}

#[test]
fn openai_sdk_responses() {
    let s = Served::start("responses");
    let v = s.run(
        "responses_client.py",
        &["openai", "jsonschema"],
        &format!("http://{}/v1", s.server.addr),
    );

    let plain = &v["plain"];
    assert!(text(&plain["id"]).starts_with("resp_"));
    assert_eq!(plain["status"], "completed", "{plain}");
    assert_eq!(types(&plain["types"]), ["message"]);
    assert!(!text(&plain["text"]).trim().is_empty());
    let usage = &plain["usage"];
    let input = usage["input_tokens"].as_u64().unwrap();
    assert!(input > 5, "{usage}");
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(input + usage["output_tokens"].as_u64().unwrap())
    );
    // Greedy: the same answer again, its prompt (all but the last token) from the cache.
    assert_eq!(v["again"]["text"], plain["text"]);
    let again = &v["again"]["usage"];
    assert_eq!(again["input_tokens"].as_u64(), Some(input));
    assert_eq!(
        again["input_tokens_details"]["cached_tokens"].as_u64(),
        Some(input - 1)
    );
    let cut = &v["cut"];
    assert_eq!(cut["status"], "incomplete", "{cut}");
    assert_eq!(cut["reason"], "max_output_tokens");
    assert_eq!(cut["output_tokens"], 3);
    assert!(text(&plain["text"]).starts_with(text(&cut["text"])));
    // Input items make the same prompt as a string.
    assert_eq!(v["as_items"]["text"], plain["text"]);

    // The schema held (checked by jsonschema in the script too).
    let schema = &v["json_schema"];
    assert_eq!(schema["status"], "completed");
    assert_eq!(schema["format"], "json_schema");
    assert!(schema["value"]["population"].is_u64(), "{schema}");

    let tool = &v["tool"];
    assert_eq!(types(&tool["types"]), ["function_call"]);
    assert_eq!(tool["calls"][0]["name"], "get_weather");
    assert!(text(&tool["calls"][0]["call_id"]).starts_with("call_"));
    assert!(tool["calls"][0]["arguments"]["city"].is_string(), "{tool}");
    let after = &v["after_tool"];
    assert_eq!(types(&after["types"]), ["message"]);
    assert!(!text(&after["text"]).is_empty());

    // Streamed: the SDK's event sequence, numbered; the deltas are the final text, which is the
    // plain answer's.
    let stream = &v["stream"];
    let events: Vec<&str> = stream["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| text(&e["type"]))
        .collect();
    let deltas = events
        .iter()
        .filter(|e| **e == "response.output_text.delta")
        .count();
    assert!(deltas >= 1, "{events:?}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(events, expected);
    let numbers: Vec<u64> = stream["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(stream["deltas"], stream["text"]);
    assert_eq!(stream["text"], plain["text"]);
    assert_eq!(stream["status"], "completed");
    assert_eq!(stream["usage"]["input_tokens"].as_u64(), Some(input));

    let stream_tool = &v["stream_tool"];
    let events = stream_tool["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| text(&e["type"])).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(types(&stream_tool["types"]), ["function_call"]);
    let args: Value = serde_json::from_str(text(&stream_tool["args"])).unwrap();
    assert_eq!(args, stream_tool["calls"][0]);
    assert_eq!(args, tool["calls"][0]["arguments"]);

    for (param, why) in [
        ("store", "store: true is not supported"),
        (
            "previous_response_id",
            "previous_response_id is not supported",
        ),
    ] {
        let refused = &v["refused"][param];
        assert_eq!(refused["status"], 400, "{param}: {refused}");
        assert_eq!(refused["param"], param);
        let message = text(&refused["message"]);
        assert!(
            message.contains(why) && message.contains("stateless"),
            "{message}"
        );
    }
}

#[test]
fn anthropic_sdk_messages() {
    let s = Served::start("messages");
    let v = s.run(
        "anthropic_client.py",
        &["anthropic", "jsonschema"],
        &format!("http://{}", s.server.addr),
    );

    let plain = &v["plain"];
    assert!(text(&plain["id"]).starts_with("msg_"));
    assert_eq!(plain["stop_reason"], "end_turn", "{plain}");
    assert_eq!(plain["stop_sequence"], Value::Null);
    assert_eq!(types(&plain["types"]), ["text"]);
    let answer = text(&plain["text"]);
    assert!(answer.chars().count() >= 4, "{answer:?}");
    let usage = &plain["usage"];
    let input = usage["input_tokens"].as_u64().unwrap();
    assert!(input > 5, "{usage}");
    assert_eq!(usage["cache_read_input_tokens"], 0);
    assert!(usage["output_tokens"].as_u64().unwrap() >= 1);

    let stop = &v["stop"];
    let sequence = text(&stop["stop"]);
    assert!(!sequence.is_empty());
    assert_eq!(stop["stop_reason"], "stop_sequence", "{stop}");
    assert_eq!(stop["stop_sequence"], sequence);
    assert_eq!(stop["text"], answer[..answer.find(sequence).unwrap()]);

    let cut = &v["max_tokens"];
    assert_eq!(cut["stop_reason"], "max_tokens", "{cut}");
    assert_eq!(cut["output_tokens"], 2);
    assert!(answer.starts_with(text(&cut["text"])));

    let tool = &v["tool"];
    assert_eq!(tool["stop_reason"], "tool_use");
    assert_eq!(types(&tool["types"]), ["tool_use"]);
    assert_eq!(tool["uses"][0]["name"], "get_weather");
    assert!(text(&tool["uses"][0]["id"]).starts_with("toolu_"));
    assert!(tool["uses"][0]["input"]["city"].is_string(), "{tool}");
    let after = &v["after_tool"];
    assert_eq!(types(&after["types"]), ["text"]);
    assert!(!text(&after["text"]).is_empty());

    // Streamed: the events the SDK makes of ours, the text the same as the plain answer's; its
    // prompt was cached by the plain requests before.
    let stream = &v["stream"];
    let events = types(&stream["events"]);
    assert_eq!(events.first(), Some(&"message_start"), "{events:?}");
    assert_eq!(events[1], "content_block_start");
    assert!(events.contains(&"text"), "{events:?}");
    assert_eq!(
        events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert_eq!(stream["text_stream"], stream["text"]);
    assert_eq!(stream["text"], plain["text"]);
    assert_eq!(v["text_stream"], plain["text"]);
    assert_eq!(stream["stop_reason"], "end_turn");
    let cached = stream["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(cached, input - 1, "{}", stream["usage"]);
    assert_eq!(stream["usage"]["input_tokens"], 1);

    let stream_tool = &v["stream_tool"];
    assert_eq!(stream_tool["stop_reason"], "tool_use");
    assert_eq!(types(&stream_tool["types"]), ["tool_use"]);
    assert!(types(&stream_tool["events"]).contains(&"input_json"));
    assert_eq!(stream_tool["inputs"][0], tool["uses"][0]["input"]);

    let missing = &v["errors"]["no_max_tokens"];
    assert_eq!(missing["status"], 400, "{missing}");
    assert_eq!(missing["body"]["type"], "error");
    assert_eq!(missing["body"]["error"]["type"], "invalid_request_error");
    let message = text(&missing["body"]["error"]["message"]);
    assert!(message.contains("missing field `max_tokens`"), "{message}");
    let wrong = &v["errors"]["wrong_key"];
    assert_eq!(wrong["status"], 401, "{wrong}");
    assert_eq!(wrong["body"]["error"]["type"], "authentication_error");
    assert!(text(&wrong["body"]["error"]["message"]).contains("x-api-key"));
}
