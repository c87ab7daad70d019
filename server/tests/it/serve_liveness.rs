//! Liveness that tells the truth: the watchdog pings follow the decode thread's heartbeat, not
//! a timer; a stuck decode thread turns `/health` to 503 and stops the pings (so systemd
//! restarts the service), and a panic on it ends the process with a status systemd restarts.
//!
//! The stall and the panic are injected through `LLM_SERVER_TEST_ENGINE_HOOK`
//! (server/src/bin/llm-server-test-hooks.rs, the binary these tests start): a file named in the
//! server's environment that the decode thread reads at each heartbeat. No request can reach
//! it; the test writes the file.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::serve_support::{synth_model, try_request, Requests, Server};

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("llm-live-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Counts `WATCHDOG=1` datagrams arriving within `window`.
fn pings_within(socket: &UnixDatagram, window: Duration) -> usize {
    let deadline = Instant::now() + window;
    let mut buf = [0u8; 256];
    let mut pings = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return pings;
        }
        socket.set_read_timeout(Some(left)).unwrap();
        match socket.recv(&mut buf) {
            Ok(n) if &buf[..n] == b"WATCHDOG=1" => pings += 1,
            Ok(_) => {}
            Err(_) => return pings,
        }
    }
}

/// A completion sent from a thread of its own (it may never be answered).
fn send_completion(s: &Server) {
    let addr = s.addr;
    thread::spawn(move || {
        let _ = try_request(
            addr,
            "POST",
            "/v1/completions",
            &[("Content-Type", "application/json")],
            br#"{"prompt": "Hello", "max_tokens": 8}"#,
        );
    });
}

#[test]
fn stalled_engine_fails_health_and_stops_the_watchdog() {
    let dir = Dir::new("stall");
    let socket_path = dir.0.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let hook = dir.0.join("hook");
    let env = [
        ("NOTIFY_SOCKET", socket_path.as_path()),
        // A ping every 100 ms while alive.
        ("WATCHDOG_USEC", Path::new("200000")),
        ("LLM_SERVER_TEST_ENGINE_HOOK", hook.as_path()),
    ];
    let s = Server::start_with_env(
        &synth_model(),
        &["--engine-stall-timeout", "1", "--request-timeout", "30"],
        &env,
    );
    // Idle for longer than the stall limit is still alive: waiting for work is not stuck.
    assert!(pings_within(&socket, Duration::from_millis(1500)) >= 3);
    assert_eq!(s.get("/health").status, 200);
    assert!(pings_within(&socket, Duration::from_secs(1)) >= 3);
    // Working: alive too.
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        br#"{"prompt": "Hi", "max_tokens": 4}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(pings_within(&socket, Duration::from_secs(1)) >= 3);

    // The decode thread hangs at its next heartbeat, with a job in hand.
    std::fs::write(&hook, "stall").unwrap();
    send_completion(&s);
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        let r = s.get("/health");
        if r.status != 200 {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "/health stayed 200:\n{}",
            s.log()
        );
        thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.error_message().contains("stuck"), "{}", r.body);
    // The pings have stopped: systemd's watchdog fires (here: none in 2 s, 20 periods).
    let _ = pings_within(&socket, Duration::from_millis(300));
    assert_eq!(pings_within(&socket, Duration::from_secs(2)), 0);
    assert!(s.log().contains("no more watchdog pings"), "{}", s.log());
}

#[test]
fn engine_panic_ends_the_process_with_a_restartable_status() {
    let dir = Dir::new("panic");
    let hook = dir.0.join("hook");
    let env = [("LLM_SERVER_TEST_ENGINE_HOOK", hook.as_path())];
    let mut s = Server::start_with_env(&synth_model(), &[], &env);
    std::fs::write(&hook, "panic").unwrap();
    send_completion(&s);
    let status = s.wait_exit(Duration::from_secs(30));
    // Not 1, 2 or 3, which systemd is told not to restart.
    assert_eq!(status.code(), Some(70), "{}", s.log());
    assert!(s.log().contains("decode thread panicked"), "{}", s.log());
}
