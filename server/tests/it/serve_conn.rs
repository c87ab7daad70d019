//! Connection hygiene on a spawned server: slowloris clients are cut off by the header-read
//! timeout without keeping others out, a slow body by the body timeout, and connections past
//! `--max-connections` wait their turn in the accept queue.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use crate::serve_support::{synth_model, try_request, Requests, Server};

const SLOW_CLIENTS: usize = 200;
const REQUEST: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";

/// Whether the server has closed `stream` (EOF or reset), without blocking.
fn closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            // A 408 or the like before the close: read on.
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

#[test]
fn slowloris_clients_are_timed_out_and_keep_nobody_out() {
    let s = Server::start(&synth_model(), &["--header-timeout", "3"]);
    let mut slow: Vec<Option<TcpStream>> = (0..SLOW_CLIENTS)
        .map(|_| Some(TcpStream::connect(s.addr).unwrap()))
        .collect();
    let started = Instant::now();
    let mut normal = None;
    let mut sent = 0;
    let mut all_closed_at = None;
    while started.elapsed() < Duration::from_secs(30) {
        // One more byte of the headers on every open connection, once a second.
        for conn in slow.iter_mut() {
            let Some(stream) = conn else { continue };
            if stream.write_all(&REQUEST[sent..sent + 1]).is_err() || closed(stream) {
                *conn = None;
            }
        }
        sent += 1;
        let open = slow.iter().filter(|c| c.is_some()).count();
        if sent == 1 {
            assert_eq!(open, SLOW_CLIENTS, "connections closed before the timeout");
            // A normal client while all of them hang on.
            let addr = s.addr;
            normal = Some(thread::spawn(move || {
                let t = Instant::now();
                let r = try_request(addr, "GET", "/v1/models", &[], b"").unwrap();
                (r.status, t.elapsed())
            }));
        }
        if open == 0 {
            all_closed_at = Some(started.elapsed());
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    let (status, took) = normal.unwrap().join().unwrap();
    assert_eq!(status, 200);
    // Answered while the slow ones were still open (they last 3 s).
    assert!(
        took < Duration::from_secs(3),
        "the normal client waited {took:?}"
    );
    let closed_at = all_closed_at.unwrap_or_else(|| {
        panic!(
            "{} of {SLOW_CLIENTS} slow connections still open after 30 s",
            slow.iter().filter(|c| c.is_some()).count()
        )
    });
    eprintln!("{SLOW_CLIENTS} slow clients closed after {closed_at:?} ({sent} bytes each); normal client answered in {took:?}");
    assert!(
        closed_at >= Duration::from_secs(2),
        "closed at {closed_at:?}"
    );
    assert!(
        sent < REQUEST.len(),
        "the headers were complete before the timeout"
    );
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn slow_body_gets_408_and_the_connection_closed() {
    let s = Server::start(&synth_model(), &["--body-timeout", "2"]);
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let started = Instant::now();
    stream
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--body-timeout"), "{answer}");
    assert!(
        (Duration::from_millis(1900)..Duration::from_secs(20)).contains(&took),
        "{took:?}"
    );
}

#[test]
fn connections_past_the_limit_wait_for_a_free_one() {
    let s = Server::start(
        &synth_model(),
        &["--max-connections", "2", "--header-timeout", "3"],
    );
    // Two silent connections take both places until the header timeout closes them.
    let _idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(s.addr).unwrap())
        .collect();
    thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let r = try_request(s.addr, "GET", "/health", &[], b"").unwrap();
    let took = started.elapsed();
    assert_eq!(r.status, 200);
    assert!(
        took >= Duration::from_secs(2),
        "answered in {took:?}: no limit"
    );
}
