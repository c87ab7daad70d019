//! Slots through the API with the tiny synthetic Gemma 3. The prompt cache: a slot keeps its
//! conversation after a request, the next request that shares a prefix with it evaluates only the
//! rest (`usage.prompt_tokens_details.cached_tokens`, `/metrics`), `cache_prompt: false` turns it
//! off, and with two slots each conversation comes back to its own. Batching: slots generating
//! at once share each pass over the weights and answer exactly as each would alone. Speculative
//! decoding: drafted tokens verified in one pass leave the output exactly as without them.

use crate::serve_support::app::{App, AppConfig};
use crate::serve_support::{cached, prompt_tokens, Requests, Server};
use llm_server::engine::Slots;
use serde_json::{json, Value};
use std::time::Duration;

fn chat(messages: Value) -> Value {
    json!({"messages": messages, "max_tokens": 8, "temperature": 0})
}

fn ask(s: &App, body: &Value) -> Value {
    let r = s.post_json("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// A server of two slots of 512 tokens.
fn two_slots() -> App {
    App::start(AppConfig {
        slots: Slots {
            parallel: 2,
            n_ctx: 512,
            queue: 4,
        },
        ..AppConfig::default()
    })
}

fn answer(v: &Value) -> &str {
    v["choices"][0]["message"]["content"].as_str().unwrap()
}

#[test]
fn a_repeated_request_evaluates_only_its_last_token() {
    let s = App::start(AppConfig::default());
    let body = chat(json!([{"role": "user", "content": "Tell me about the sea and the sky"}]));
    let first = ask(&s, &body);
    assert_eq!(cached(&first), 0, "nothing was cached yet");
    let evaluated = s.metric("llm_prompt_tokens_total");
    assert_eq!(evaluated, prompt_tokens(&first) as f64);

    let second = ask(&s, &body);
    let n = prompt_tokens(&second);
    assert_eq!(n, prompt_tokens(&first));
    assert_eq!(cached(&second), n - 1, "all but the last prompt token");
    assert_eq!(s.metric("llm_prompt_tokens_total"), evaluated + 1.0);
    assert_eq!(s.metric("llm_prompt_tokens_cached_total"), (n - 1) as f64);
    assert_eq!(answer(&second), answer(&first), "greedy answers differ");

    // Off for one request: everything is evaluated again, and the answer is the same.
    let mut off = body.clone();
    off["cache_prompt"] = json!(false);
    let third = ask(&s, &off);
    assert_eq!(cached(&third), 0);
    assert_eq!(
        s.metric("llm_prompt_tokens_total"),
        evaluated + 1.0 + n as f64
    );
    assert_eq!(answer(&third), answer(&first));
}

#[test]
fn the_next_turn_of_a_chat_reuses_the_whole_conversation() {
    let s = App::start(AppConfig::default());
    let mut messages = vec![
        json!({"role": "system", "content": "Answer in one line."}),
        json!({"role": "user", "content": "What is the capital of France?"}),
    ];
    let first = ask(&s, &chat(json!(messages)));
    let reply = answer(&first).to_owned();
    messages.push(json!({"role": "assistant", "content": reply}));
    messages.push(json!({"role": "user", "content": "And of Spain?"}));
    let second = ask(&s, &chat(json!(messages)));
    // The first turn's prompt at least; its answer too where the text tokenizes back alike.
    assert!(
        cached(&second) >= prompt_tokens(&first),
        "cached {} of {}, the first prompt had {}",
        cached(&second),
        prompt_tokens(&second),
        prompt_tokens(&first)
    );
    let evaluated = prompt_tokens(&second) - cached(&second);
    assert_eq!(
        s.metric("llm_prompt_tokens_total"),
        (prompt_tokens(&first) + evaluated) as f64
    );
}

#[test]
fn two_conversations_on_two_slots_each_keep_their_own() {
    let s = two_slots();
    let a = chat(
        json!([{"role": "user", "content": "Alpha alpha alpha, a long question about apples and pears"}]),
    );
    let b = chat(
        json!([{"role": "user", "content": "Beta beta, another question entirely about rivers"}]),
    );
    ask(&s, &a);
    ask(&s, &b);
    // Each goes back to the slot holding it, though b was served last.
    for body in [&a, &b, &a, &b] {
        let v = ask(&s, body);
        assert_eq!(cached(&v), prompt_tokens(&v) - 1, "{body}");
    }
}

#[test]
fn a_repeated_request_finds_its_slot_though_the_answer_outgrew_the_prompt() {
    // Two slots, one empty: the cache holding the prompt and an answer longer than it must
    // still be preferred to the empty slot (a regenerate button, a retried request).
    let s = two_slots();
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 128,
                      "temperature": 0});
    let first = ask(&s, &body);
    let n = prompt_tokens(&first);
    let generated = first["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        generated > n,
        "the answer ({generated}) must outgrow the prompt ({n})"
    );
    let second = ask(&s, &body);
    assert_eq!(cached(&second), n - 1, "all but the last prompt token");
    assert_eq!(answer(&second), answer(&first), "greedy answers differ");
}

#[test]
fn concurrent_requests_answer_exactly_as_alone() {
    let s = App::start(AppConfig {
        threads: 2,
        slots: Slots {
            parallel: 3,
            n_ctx: 512,
            queue: 4,
        },
        ..AppConfig::default()
    });
    // Prompts of different lengths, so one slot is still reading its prompt while another
    // generates, and each generates at its own positions.
    let bodies: Vec<Value> = [
        "Hi",
        "Write a long story about a lighthouse keeper and the storm that came in the night",
        "Count: one two three four five six seven eight nine ten eleven twelve thirteen",
    ]
    .iter()
    .map(|q| {
        json!({"messages": [{"role": "user", "content": q}], "max_tokens": 40,
               "temperature": 0, "cache_prompt": false})
    })
    .collect();
    let alone: Vec<String> = bodies
        .iter()
        .map(|b| answer(&ask(&s, b)).to_owned())
        .collect();
    // Read before the requests go out: the tiny model can generate tokens before a read after.
    let (tokens_before, passes_before) = (
        s.metric("llm_generated_tokens_total"),
        s.metric("llm_decode_passes_total"),
    );
    let pending: Vec<_> = bodies
        .iter()
        .map(|b| {
            let body = b.to_string();
            let headers = [("content-type", "application/json")];
            s.spawn_request("POST", "/v1/chat/completions", &headers, body.as_bytes())
        })
        .collect();
    let mut generated = 0.0;
    for ((p, want), body) in pending.into_iter().zip(&alone).zip(&bodies) {
        let r = p.join();
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(answer(&v), want, "{body}");
        generated += v["usage"]["completion_tokens"].as_f64().unwrap();
    }
    assert_eq!(
        s.metric("llm_generated_tokens_total") - tokens_before,
        generated
    );
    // Each request's first token comes from its prompt's pass; the others from passes that
    // the slots generating at the same time shared.
    let passes = s.metric("llm_decode_passes_total") - passes_before;
    assert!(
        passes < generated - bodies.len() as f64,
        "{passes} passes for {generated} tokens: the slots were not batched"
    );
}

/// The golden prompts (testdata/README.md) on the default model: prompt-lookup drafts are
/// verified and taken where the text repeats itself, and the greedy text is the same as without.
#[test]
fn speculative_decoding_leaves_greedy_output_unchanged() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(test_support::testdata("gemma-3-270m-q4_k_m.golden.json"))
            .unwrap(),
    )
    .unwrap();
    let s = App::start(AppConfig {
        model: test_support::default_model(),
        threads: 2,
        ..AppConfig::default()
    });
    let (mut generated, mut passes) = (0.0, 0.0);
    for p in golden["prompts"].as_array().unwrap() {
        let body = |speculative: bool| {
            json!({"prompt": p["prompt_text"], "max_tokens": 32, "temperature": 0,
                   "speculative": speculative, "cache_prompt": false})
        };
        let plain = s.post_json("/v1/completions", &body(false)).json();
        let before = s.metric("llm_decode_passes_total");
        let drafted = s.post_json("/v1/completions", &body(true)).json();
        passes += s.metric("llm_decode_passes_total") - before;
        generated += drafted["usage"]["completion_tokens"].as_f64().unwrap();
        assert_eq!(
            drafted["choices"][0]["text"], plain["choices"][0]["text"],
            "{}",
            p["name"]
        );
    }
    let accepted = s.metric("llm_draft_accepted_total");
    assert!(accepted > 0.0, "no drafted token was ever taken");
    assert!(s.metric("llm_draft_tokens_total") >= accepted);
    // One pass per token after the first (or per token, the end token's included), less one
    // for every drafted token taken.
    assert!(
        passes <= generated - accepted,
        "{passes} passes for {generated} tokens with {accepted} drafted ones taken"
    );

    // Sampled: each token is drawn from the logits after the tokens taken before it, with the
    // same random numbers, so a seeded answer is the same too.
    let sampled = |speculative: bool| {
        let body = json!({"prompt": "Name one Linux command:", "max_tokens": 32,
                          "temperature": 0.8, "seed": 7, "speculative": speculative,
                          "cache_prompt": false});
        s.post_json("/v1/completions", &body).json()["choices"][0]["text"].clone()
    };
    assert_eq!(sampled(true), sampled(false));
}

/// CPU time (user + system) of every thread of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces, so split after its ')'): utime
    // and stime are the 14th and 15th of the line, the 12th and 13th after the name.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// An idle server burns no CPU: the decode thread waits on its condition variable and the
/// forward pass's workers park after a request (they spin only ~200 µs between dispatches).
#[test]
fn an_idle_server_uses_no_cpu() {
    let s = Server::start(
        &test_support::default_model(),
        &["--threads", "2", "--parallel", "2"],
    );
    let body = json!({"prompt": "Hello", "max_tokens": 8, "temperature": 0});
    assert_eq!(s.post_json("/v1/completions", &body).status, 200);
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_ticks(s.pid());
    let idle = Duration::from_secs(30);
    std::thread::sleep(idle);
    let used = cpu_ticks(s.pid()) - before;
    // Clock ticks are 1/100 s on Linux (USER_HZ): 1 % of 30 s is 30 ticks.
    // SAFETY: sysconf reads a constant of the system.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let limit = idle.as_secs() * ticks_per_s / 100;
    assert!(
        used <= limit,
        "{used} ticks of CPU in {idle:?} idle (limit {limit}, 1 %)"
    );
}
