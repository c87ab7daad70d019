//! Constrained decoding through the official `openai` SDK against the default model: 20 JSON
//! schemas (plain and streamed, chat and completions) whose answers must parse and validate
//! with `jsonschema`, `json_object`, a GBNF grammar, and a 400 naming an unsupported keyword;
//! schemas without bounds whose answers still close (issue 44); control tokens kept out of text.

use crate::serve_support::app::{App, AppConfig};
use llm_server::engine::Slots;
use serde_json::Value;

fn default_model() -> AppConfig {
    AppConfig {
        model: test_support::default_model(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        slots: Slots {
            n_ctx: 1024,
            ..AppConfig::default().slots
        },
        ..AppConfig::default()
    }
}

#[test]
fn json_schemas_grammars_with_the_openai_sdk() {
    let app = App::start(default_model());
    let base = format!("http://{}/v1", app.listen());
    let out =
        crate::serve_support::python("structured_client.py", &["openai", "jsonschema"], &[&base]);
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("{v:#}");
    let schemas = v["schemas"].as_array().unwrap();
    assert_eq!(schemas.len(), 20);
    for r in schemas {
        // Every schema is bounded, so the grammar ends each answer within max_tokens.
        assert_eq!(r["finish"], "stop", "{r}");
        assert_eq!(r["error"], Value::Null, "{r}");
    }
    assert!(schemas.iter().any(|r| r["stream"] == true));
    assert!(schemas.iter().any(|r| r["endpoint"] == "completions"));
    // `json_object` bounds nothing: the answer is a whole object, or max_tokens ran out and
    // finish_reason says so (never a "stop" on broken JSON).
    let obj = &v["json_object"];
    match obj["finish"].as_str() {
        Some("stop") => assert_eq!(obj["ok"], true, "{obj}"),
        Some("length") => assert_eq!(obj["completion_tokens"], 200, "{obj}"),
        other => panic!("finish_reason {other:?}: {obj}"),
    }
    assert_eq!(v["unsupported"]["status"], 400);
    let message = v["unsupported"]["message"].as_str().unwrap();
    assert!(message.contains("uniqueItems"), "{message}");
    let text = v["gbnf"]["text"].as_str().unwrap();
    assert!(text == "yes." || text == "no.", "{text:?}");
    assert_eq!(v["gbnf"]["finish"], "stop");
    check_logprobs(&v["logprobs"]);
}

/// `logprobs=True, top_logprobs=5` at temperature 0: five alternatives per token, sorted, the
/// chosen token first among them; streamed the same.
fn check_logprobs(v: &Value) {
    let chat = &v["chat"];
    let tokens = chat["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty(), "{v}");
    let mut text = String::new();
    for t in tokens {
        let top = t["top"].as_array().unwrap();
        assert_eq!(top.len(), 5, "{t}");
        let lps: Vec<f64> = top.iter().map(|a| a["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{t}");
        assert!(lps.iter().all(|&l| l <= 0.0), "{t}");
        assert_eq!(
            top[0]["token"], t["token"],
            "greedy picks the most likely: {t}"
        );
        assert_eq!(top[0]["logprob"], t["logprob"], "{t}");
        text.push_str(t["token"].as_str().unwrap());
    }
    assert_eq!(text, chat["content"].as_str().unwrap());
    // The streamed request found its prompt in the slot's cache: its first token's logits come
    // from a one-row pass instead of the prompt's batch, the same but for float order (the
    // golden rule's 0.05); every later token is computed as in the first request.
    let (streamed, plain) = (
        v["chat_stream"]["tokens"].as_array().unwrap(),
        chat["tokens"].as_array().unwrap(),
    );
    assert_eq!(streamed.len(), plain.len());
    for (s, p) in streamed.iter().zip(plain) {
        assert_eq!(s["token"], p["token"]);
        let (a, b) = (
            s["logprob"].as_f64().unwrap(),
            p["logprob"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= 0.05, "{s} vs {p}");
    }
    assert_eq!(v["chat_stream"]["content"], chat["content"]);
    let c = &v["completion"];
    let n = c["tokens"].as_array().unwrap().len();
    assert_eq!(n, 6, "{c}");
    assert_eq!(c["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(c["text_offset"][0], 0);
    for top in c["top_logprobs"].as_array().unwrap() {
        assert_eq!(top.as_object().unwrap().len(), 3, "{c}");
    }
}

/// The log-probabilities the server reports are the log-softmax of the engine's own logits
/// (no penalties; temperature 0 reads as 1): the prompt given as token ids, the first token's
/// alternatives compared with a direct evaluation.
#[test]
fn logprobs_match_the_engines_logits() {
    use llm_server::model::{LoadOptions, Model};
    let model = Model::load(&test_support::default_model(), &LoadOptions::default()).unwrap();
    let prompt = model
        .tokenizer()
        .encode("The capital of France is", true, true);
    let mut session = model.new_session(64);
    let logits = session.eval(&model, &prompt).unwrap().to_vec();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));

    let app = App::start(default_model());
    let body =
        serde_json::json!({"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 4});
    let r = crate::serve_support::try_request(
        app.listen(),
        "POST",
        "/v1/completions",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .unwrap()
    .json();
    let lp = &r["choices"][0]["logprobs"];
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert_eq!(top.len(), 4, "{lp}");
    for &id in &order[..4] {
        let piece = String::from_utf8_lossy(model.tokenizer().piece(id as u32, true)).into_owned();
        let got = top[&piece]
            .as_f64()
            .unwrap_or_else(|| panic!("{piece:?} missing: {lp}"));
        let want = logits[id] as f64 - lse;
        assert!((got - want).abs() < 1e-3, "{piece:?}: {got} vs {want}");
    }
    let chosen = lp["token_logprobs"][0].as_f64().unwrap();
    assert!((chosen - (logits[order[0]] as f64 - lse)).abs() < 1e-3);
}

/// The cost of a grammar's mask per token against a decode step of the default model, the
/// figure the issue asks for (goal: at most 10 %). Measured over a greedy JSON-schema answer:
/// each step times `Constraint::mask` and `Session::eval` apart. The bound asserted is looser
/// than the goal (other tests share the CPUs); the figures are printed.
#[test]
fn grammar_mask_cost_per_token() {
    use llm_server::grammar::{Constraint, Spec};
    use llm_server::model::{LoadOptions, Model};
    use llm_server::sampler::{Sampler, SamplerParams};
    use std::time::{Duration, Instant};

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = Model::load(
        &test_support::default_model(),
        &LoadOptions {
            threads,
            ..Default::default()
        },
    )
    .unwrap();
    let tok = model.tokenizer();
    let schema = serde_json::json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "tags", "age"], "additionalProperties": false});
    let started = Instant::now();
    let mut c = Constraint::new(tok, &Spec::JsonSchema(schema)).unwrap();
    let first_compile = started.elapsed();
    let mut session = model.new_session(512);
    let mut history = tok.encode("A person, as JSON: ", true, true);
    let mut sampler = Sampler::new(SamplerParams::greedy(), tok.n_vocab());
    let mut logits = session.eval(&model, &history).unwrap().to_vec();
    let (mut mask_time, mut eval_time, mut steps) = (Duration::ZERO, Duration::ZERO, 0u32);
    loop {
        let t = Instant::now();
        let mask = c.mask().unwrap();
        mask_time += t.elapsed();
        let token = sampler.sample_allowed(&logits, &history, Some(&mask));
        if tok.is_eog(token) || steps == 80 {
            break;
        }
        c.accept(token).unwrap();
        history.push(token);
        steps += 1;
        if c.is_done() {
            break;
        }
        let t = Instant::now();
        logits = session.eval(&model, &[token]).unwrap().to_vec();
        eval_time += t.elapsed();
    }
    let out = tok.decode(&history, false);
    let mask_ms = mask_time.as_secs_f64() * 1e3 / (steps + 1) as f64;
    let eval_ms = eval_time.as_secs_f64() * 1e3 / steps.max(1) as f64;
    eprintln!(
        "grammar mask {mask_ms:.3} ms/token vs decode step {eval_ms:.2} ms/token ({:.1} %) over {steps} tokens, {threads} threads; first compile (vocabulary trie) {:.0} ms\n{out}",
        100.0 * mask_ms / eval_ms,
        first_compile.as_secs_f64() * 1e3
    );
    assert!(steps > 10, "{out}");
    assert!(
        mask_ms < 0.5 * eval_ms,
        "mask {mask_ms:.3} ms vs decode {eval_ms:.2} ms"
    );
}

/// Tools with the `openai` SDK on the default model (Gemma 3: the documented prompt format):
/// `tool_choice="required"` gives a call whose arguments validate, streamed as deltas too; a
/// named function is the one called; `auto` answers; a `tool` message is accepted.
#[test]
fn tool_calls_with_the_openai_sdk() {
    let app = App::start(default_model());
    let base = format!("http://{}/v1", app.listen());
    let out = crate::serve_support::python("tools_client.py", &["openai", "jsonschema"], &[&base]);
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("{v:#}");
    for case in ["required", "required_stream"] {
        let r = &v[case];
        assert_eq!(r["finish"], "tool_calls", "{case}: {r}");
        let calls = r["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{case}: {r}");
        assert!(
            matches!(calls[0]["name"].as_str(), Some("get_weather" | "get_time")),
            "{r}"
        );
        assert_eq!(calls[0]["error"], Value::Null, "{case}: {r}");
    }
    // Greedy: the streamed call is the plain one.
    let (plain, streamed) = (
        &v["required"]["calls"][0],
        &v["required_stream"]["calls"][0],
    );
    assert_eq!(plain["name"], streamed["name"]);
    assert_eq!(plain["arguments"], streamed["arguments"]);
    assert_eq!(v["named"]["name"], "get_time");
    assert_eq!(v["named"]["finish"], "tool_calls");
    assert_eq!(v["named"]["error"], Value::Null);
    assert_eq!(v["auto"]["has_content_or_calls"], true, "{}", v["auto"]);
    assert!(
        v["after_tool"]["content"].is_string(),
        "{}",
        v["after_tool"]
    );
}

/// Issue 44: `{"population": {"type": "integer"}}` at temperature 0.7 made the default base model
/// write digits until max_tokens. With numbers bounded as llama.cpp bounds them (16 digits a
/// part), a schema of unbounded integer, number and string fields gives valid JSON within 120
/// tokens on every seed, through the `openai` SDK against `llm-server serve`.
#[test]
fn unbounded_numbers_close_within_120_tokens() {
    let server = crate::serve_support::Server::start(
        &test_support::default_model(),
        &["--ctx-size", "1024"],
    );
    let base = format!("http://{}/v1", server.addr);
    let out = crate::serve_support::python(
        "schema_bounds_client.py",
        &["openai", "jsonschema"],
        &[&base],
    );
    let v: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("{e}: {out}\nserver log:\n{}", server.log()));
    eprintln!("{v:#}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    for r in results {
        assert_eq!(r["error"], Value::Null, "{r}");
        assert_eq!(r["finish"], "stop", "{r}");
        assert!(r["completion_tokens"].as_u64().unwrap() <= 120, "{r}");
    }
    assert!(results.iter().any(|r| r["endpoint"] == "completions"));
    assert!(results.iter().any(|r| r["endpoint"] == "chat"));
}
