//! A bounded load test: 64 concurrent clients against 2 slots and a queue of 16. Every request
//! is answered in full or with 503, the server stays up, and its RSS does not grow.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::serve_support::{try_request, Requests, Server};
use serde_json::json;

const CLIENTS: usize = 64;
const ANSWERED: usize = 500;
const EARLY: usize = 50;
const MAX_TOKENS: u64 = 2;

/// The server's RSS from /proc (not from /metrics: scraping must not disturb the figure).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn sixty_four_clients_two_slots_queue_sixteen() {
    // The default model, as on the appliance: its RSS (~300 MiB, mostly the mapped weights) is
    // what the 5 % bound is about. A 12 MiB server on the tiny model moves 5 % while its
    // allocator warms up (measured: +0.7 MiB by request 500, then flat to request 3000).
    let s = Server::start(
        &test_support::default_model(),
        &[
            "--parallel",
            "2",
            "--queue",
            "16",
            "--ctx-size",
            "512",
            "--threads",
            "1",
        ],
    );
    let (addr, pid) = (s.addr, s.pid());
    let answered = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));
    let rss_early = Arc::new(Mutex::new(None));
    let started = Instant::now();

    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (answered, rejected, rss_early) =
                (answered.clone(), rejected.clone(), rss_early.clone());
            thread::spawn(move || {
                let mut i = 0;
                while answered.load(SeqCst) < ANSWERED {
                    // Different prompts and seeds, so that slots do different work.
                    let body = json!({"prompt": format!("Client {client} asks question {i}:"),
                                      "max_tokens": MAX_TOKENS, "seed": client * 1000 + i});
                    i += 1;
                    let r = try_request(
                        addr,
                        "POST",
                        "/v1/completions",
                        &[],
                        body.to_string().as_bytes(),
                    )
                    .expect("the server dropped a connection");
                    match r.status {
                        200 => {
                            let v = r.json();
                            let usage = &v["usage"];
                            let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
                            // In full: either all tokens, or an end-of-generation token.
                            match finish {
                                "length" => {
                                    assert_eq!(usage["completion_tokens"], MAX_TOKENS, "{v}")
                                }
                                "stop" => assert!(
                                    usage["completion_tokens"].as_u64().unwrap() < MAX_TOKENS
                                ),
                                other => panic!("finish_reason {other}"),
                            }
                            let n = answered.fetch_add(1, SeqCst) + 1;
                            if n == EARLY {
                                *rss_early.lock().unwrap() = Some(rss_bytes(pid));
                            }
                        }
                        503 => {
                            assert_eq!(r.header("retry-after"), Some("1"));
                            rejected.fetch_add(1, SeqCst);
                            // Retry-After says 1 s (its smallest unit); waiting that long would
                            // leave the slots idle between waves, so retry sooner.
                            thread::sleep(Duration::from_millis(100));
                        }
                        other => panic!("status {other}: {}", r.body),
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let elapsed = started.elapsed();
    let rss_late = rss_bytes(pid);
    let rss_early = rss_early.lock().unwrap().unwrap();
    let (answered, rejected) = (answered.load(SeqCst), rejected.load(SeqCst));
    let growth = rss_late as f64 / rss_early as f64 - 1.0;
    eprintln!(
        "{answered} answered, {rejected} rejected with 503 in {elapsed:.1?}; RSS after {EARLY}: {:.1} MiB, after {answered}: {:.1} MiB ({:+.2} %)",
        rss_early as f64 / 1048576.0,
        rss_late as f64 / 1048576.0,
        growth * 100.0
    );
    assert!(answered >= ANSWERED);
    assert!(
        rejected > 0,
        "64 clients never overflowed 2 slots + 16 queued: the queue bound is not enforced"
    );
    assert!(
        growth.abs() <= 0.05,
        "RSS changed by {:.2} %",
        growth * 100.0
    );

    // Still up and idle.
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.metric("llm_busy_slots"), 0.0);
    assert_eq!(s.metric("llm_queue_depth"), 0.0);
}
