//! Hostile bodies: 2 MiB of one deeply nested or very wide JSON value, or of one prompt, are
//! refused without the server's memory jumping. The body is read straight into the typed request (serde, no
//! `serde_json::Value` tree) and nesting stops at serde_json's recursion limit; a tree of a
//! million values would cost tens of MiB.
//!
//! Measured on a spawned server: its peak resident memory (VmHWM, reset through
//! `/proc/PID/clear_refs` before each body) against what it held before (VmRSS), and its
//! anonymous memory (RssAnon) after.

use crate::serve_support::{synth_model, Requests, Server};
use llm_server::serve::extract::LARGE_BODIES;

/// Just under the default `--body-limit` of 2 MiB, so that the parser, not the limit, refuses.
const SIZE: usize = (2 << 20) - 1024;

/// Peak growth of resident memory allowed for one body: the 2 MiB of the body itself (hyper's
/// buffer and the collected bytes), a chat's copies of its text (the parsed content, the
/// rendered prompt) and the allocator's slack, far below a tree's cost or a tokenizer's.
const PEAK_BOUND: u64 = 10 << 20;

/// Anonymous memory the server may hold after the bodies beyond what it held before: the
/// allocator's small change. Blocks as large as a body are unmapped when freed (`tune_malloc` in
/// main.rs); glibc's default kept some MiB of them in its arenas.
const KEPT_BOUND: u64 = 2 << 20;

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from /proc/{pid}/status"))
}

/// `prefix`, then `unit` repeated to fill the body, then `suffix`.
fn body(prefix: &str, unit: &str, suffix: &str) -> Vec<u8> {
    let n = (SIZE - prefix.len() - suffix.len()) / unit.len();
    let mut b = prefix.as_bytes().to_vec();
    b.extend(unit.as_bytes().repeat(n));
    b.extend(suffix.as_bytes());
    b
}

#[test]
fn deep_and_wide_bodies_are_refused_without_memory_jumping() {
    let s = Server::start(&synth_model(), &[]);
    let pid = s.pid();
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        (
            "deep array",
            "/v1/chat/completions",
            body("", "[", ""),
            // Refused at its first byte: a request is an object.
            "invalid type",
        ),
        (
            "deep prompt",
            "/v1/completions",
            body(r#"{"prompt":"#, "[", ""),
            // A prompt nests at most two arrays deep: the third is refused where it opens.
            "at `prompt[0][0]`",
        ),
        (
            "wide ignored field",
            "/v1/chat/completions",
            body(r#"{"x":["#, "[],", r#"[]],"messages":"no"}"#),
            "messages",
        ),
        (
            "wide messages",
            "/v1/chat/completions",
            body(r#"{"messages":["#, "1,", "1]}"),
            "messages",
        ),
        (
            "wide prompt list",
            "/v1/completions",
            body(r#"{"prompt":["#, r#""a","#, r#""a"]}"#),
            "prompt lists",
        ),
        (
            "long prompt",
            "/v1/completions",
            body(r#"{"prompt":""#, "a", r#""}"#),
            // Refused by its length, before the tokenizer's merge structures (tens of times
            // the text) are built.
            "at least",
        ),
        (
            "long message",
            "/v1/chat/completions",
            body(
                r#"{"messages":[{"role":"user","content":""#,
                "a ",
                r#""}]}"#,
            ),
            "at least",
        ),
        (
            "wide stop list",
            "/v1/completions",
            body(r#"{"prompt":"a","stop":["#, r#""a","#, r#""a"]}"#),
            "stop sequences given",
        ),
    ];
    // Warm up the allocator with an ordinary request.
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        br#"{"prompt":"a","max_tokens":1}"#,
    );
    assert_eq!(r.status, 200);
    let anon_before = status_kib(pid, "RssAnon");
    let mut failures = Vec::new();
    for (name, path, body, expected) in &cases {
        let (rss, file) = (status_kib(pid, "VmRSS"), status_kib(pid, "RssFile"));
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
        let r = s.request("POST", path, &[("Content-Type", "application/json")], body);
        let peak = status_kib(pid, "VmHWM");
        let jump = peak.saturating_sub(rss) << 10;
        // VmHWM counts mapped file pages too: a failure says how much of a jump they were.
        let file_growth = status_kib(pid, "RssFile").saturating_sub(file);
        eprintln!(
            "{name}: {} bytes -> {} {:?}; peak RSS +{:.1} MiB",
            body.len(),
            r.status,
            r.error_message(),
            jump as f64 / 1048576.0
        );
        assert!(r.status == 400 || r.status == 413, "{name}: {}", r.body);
        assert!(r.error_message().contains(expected), "{name}: {}", r.body);
        if jump > PEAK_BOUND {
            failures.push(format!(
                "{name}: peak RSS +{} KiB, of which mapped file pages grew {file_growth} KiB",
                jump >> 10
            ));
        }
    }
    let anon_after = status_kib(pid, "RssAnon");
    eprintln!("RssAnon {anon_before} KiB before, {anon_after} KiB after");
    assert!(failures.is_empty(), "{failures:?}");
    assert!(
        anon_after.saturating_sub(anon_before) << 10 < KEPT_BOUND,
        "RssAnon {anon_before} -> {anon_after} KiB"
    );
    assert_eq!(s.get("/health").status, 200);
}

/// Large bodies are read [`LARGE_BODIES`] at a time: the ninth one in flight is answered 503 with
/// Retry-After before its body is read, small requests go on meanwhile, and once the eight are
/// answered the budget is free again. Without the budget every connection could hold a body and
/// its parse (64 x 2 MiB bodies finishing together took the server from 49 to 332 MiB).
#[test]
fn large_bodies_beyond_the_budget_are_answered_503_before_they_are_read() {
    use std::io::{BufReader, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    use crate::serve_support::read_head;

    let s = Server::start(
        &synth_model(),
        &["--max-connections", "64", "--max-connections-per-ip", "16"],
    );
    let body = body(r#"{"x":["#, "[],", r#"[]],"messages":"no"}"#);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    // Headers only: an admitted request waits for its body, a refused one is answered at once.
    let open = || {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut reader = BufReader::new(c);
        match read_head(&mut reader) {
            Ok((status, headers)) => Err((status, headers)),
            Err(_) => Ok(reader.into_inner()),
        }
    };
    let mut admitted: Vec<TcpStream> = (0..LARGE_BODIES)
        .map(|k| open().unwrap_or_else(|r| panic!("body {k} refused: {r:?}")))
        .collect();
    let (status, headers) = open().expect_err("a ninth large body is admitted");
    assert_eq!(status, 503);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("retry-after") && v == "1"),
        "{headers:?}"
    );
    let small = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        br#"{"prompt":"a","max_tokens":1}"#,
    );
    assert_eq!(
        small.status, 200,
        "a small request while the budget is taken"
    );
    for c in admitted.iter_mut() {
        c.write_all(&body).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (status, _) = read_head(&mut BufReader::new(&*c)).unwrap();
        assert_eq!(status, 400, "an admitted body is read and parsed");
    }
    let again = s.request(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        &body,
    );
    assert_eq!(
        again.status, 400,
        "the budget is free again: {}",
        again.body
    );
    assert!(again.error_message().contains("messages"), "{}", again.body);
}

/// The attack both bounds answer together: 64 connections from 8 addresses (the 1 GB profile's
/// `max_connections`, 8 per address) each send a 2 MiB prompt but its last byte, then all
/// finish at once. Eight are read at a time (the large-body budget), the rest answered 503, and
/// the prompts are refused by their length, not tokenized: the server's memory grows by about
/// the eight bodies. Without the two bounds it grew by
/// 280 MiB (332 MiB of RssAnon from 49), past what the 1 GB profile leaves above the plan.
#[test]
fn many_addresses_finishing_large_prompts_together_stay_within_the_bodies() {
    use std::io::{BufReader, Write};
    use std::time::Duration;

    use crate::serve_support::hostile::{attacker, connect_from, raise_nofile};
    use crate::serve_support::read_head;

    raise_nofile();
    // Room above the 64 for this test's other requests: at the cap a newcomer would evict one
    // of the bodies still arriving (an idle connection), which frees its share of the budget.
    let s = Server::start(
        &synth_model(),
        &["--max-connections", "72", "--max-connections-per-ip", "8"],
    );
    let pid = s.pid();
    let body = body(r#"{"prompt":""#, "a", r#""}"#);
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let anon_before = status_kib(pid, "RssAnon");
    let mut conns = Vec::new();
    for i in 0..64 {
        let mut c = connect_from(attacker(i / 8), s.addr, None).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        // A refused connection is closed without its body being read: its write fails.
        let _ = c.write_all(head.as_bytes());
        let _ = c.write_all(&body[..body.len() - 1]);
        conns.push(c);
    }
    let in_flight = status_kib(pid, "RssAnon").saturating_sub(anon_before);
    let rss = status_kib(pid, "VmRSS");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    for c in conns.iter_mut() {
        let _ = c.write_all(&body[body.len() - 1..]);
    }
    let mut statuses = std::collections::BTreeMap::new();
    for c in &conns {
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let status = read_head(&mut BufReader::new(c)).map_or(0, |(status, _)| status);
        *statuses.entry(status).or_insert(0) += 1;
    }
    let jump = status_kib(pid, "VmHWM").saturating_sub(rss);
    eprintln!(
        "answers {statuses:?}; RssAnon +{in_flight} KiB with the bodies in flight; \
         peak +{jump} KiB as they finished"
    );
    // Eight bodies are read, the rest refused, except those whose headers the server reached
    // only after the eight had finished (the kernel's buffers take a body unread): read then.
    assert!(
        statuses.keys().all(|s| [400, 503].contains(s)),
        "every answer a refusal: {statuses:?}"
    );
    assert!(
        statuses.get(&400) >= Some(&8),
        "eight bodies read: {statuses:?}"
    );
    assert!(
        statuses.get(&503) >= Some(&1),
        "bodies refused: {statuses:?}"
    );
    assert!(
        in_flight < 32 << 10,
        "RssAnon +{in_flight} KiB with the bodies in flight"
    );
    assert!(
        jump < 48 << 10,
        "peak RSS +{jump} KiB as the bodies finished"
    );
    assert_eq!(s.get("/health").status, 200);
}
