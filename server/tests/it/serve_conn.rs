//! Connection hygiene on a spawned server: slowloris clients are cut off by the header-read
//! timeout without keeping others out, a slow body by the body timeout; connections past
//! `--max-connections` or `--max-connections-per-ip` are shed at once, never queued; idle,
//! never-reading and old connections are closed. The attacks at the appliance's limits are in
//! `hostile_conn`.

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::serve_support::hostile::{attacker, connect_from};
use crate::serve_support::{read_head, synth_model, try_request, write_request, Requests, Server};

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
        // From addresses of their own: one address gets only --max-connections-per-ip.
        .map(|i| Some(connect_from(attacker(i), s.addr, None).unwrap()))
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

/// `n` pipelined `GET /openapi.json` (25 KB each) from `from` with a small receive buffer,
/// never read: the server's writes stall and the connection stays busy until --write-timeout.
fn stalled_reader(addr: std::net::SocketAddr, from: Ipv4Addr) -> TcpStream {
    let mut stream = connect_from(from, addr, Some(4096)).unwrap();
    let request = "GET /openapi.json HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(100);
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// The answer to a connection the server refused at once, read within a second.
fn refused_at_once(addr: std::net::SocketAddr, from: Ipv4Addr) -> String {
    let started = Instant::now();
    let mut stream = connect_from(from, addr, None).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "refused after {took:?}: {answer}"
    );
    answer
}

#[test]
fn connections_past_the_limit_are_shed_not_queued() {
    let s = Server::start(
        &synth_model(),
        &[
            "--max-connections",
            "2",
            "--max-connections-per-ip",
            "1",
            "--header-timeout",
            "30",
            "--write-timeout",
            "2",
        ],
    );
    // Two silent connections take both places; being idle, one gives way to a newcomer at
    // once (before, the newcomer waited in the accept queue for the header timeout).
    let _idle: Vec<TcpStream> = (2..4)
        .map(|x| connect_from(Ipv4Addr::new(127, 0, 0, x), s.addr, None).unwrap())
        .collect();
    thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let r = try_request(s.addr, "GET", "/health", &[], b"").unwrap();
    let took = started.elapsed();
    assert_eq!(r.status, 200);
    assert!(took < Duration::from_secs(1), "answered after {took:?}");

    // Two connections busy with answers their clients do not read: nobody gives way, so a
    // newcomer gets 503 with Retry-After at once, until --write-timeout drops them.
    let stalled: Vec<TcpStream> = (4..6)
        .map(|x| stalled_reader(s.addr, Ipv4Addr::new(127, 0, 0, x)))
        .collect();
    thread::sleep(Duration::from_millis(500));
    let answer = refused_at_once(s.addr, Ipv4Addr::new(127, 0, 0, 6));
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("Retry-After: 1"), "{answer}");
    assert!(answer.contains("no free connection"), "{answer}");
    let started = Instant::now();
    loop {
        if let Ok(r) = try_request(s.addr, "GET", "/health", &[], b"") {
            if r.status == 200 {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the stalled connections were not dropped"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let waited = started.elapsed();
    eprintln!("place free again {waited:?} after the refusal");
    assert!(
        waited >= Duration::from_millis(500),
        "{waited:?}: nothing was busy"
    );
    drop(stalled);
}

#[test]
fn one_address_gets_its_share_and_no_more() {
    let s = Server::start(
        &synth_model(),
        &["--max-connections", "16", "--max-connections-per-ip", "3"],
    );
    let from = Ipv4Addr::new(127, 0, 0, 7);
    let _held: Vec<TcpStream> = (0..3)
        .map(|_| connect_from(from, s.addr, None).unwrap())
        .collect();
    thread::sleep(Duration::from_millis(200));
    let answer = refused_at_once(s.addr, from);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("from your address"), "{answer}");
    // Another address is served.
    let mut other = connect_from(Ipv4Addr::new(127, 0, 0, 8), s.addr, None).unwrap();
    write_request(&mut other, "GET", "/health", &[], b"").unwrap();
    let mut answer = String::new();
    other.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn idle_keep_alive_connections_are_closed_after_the_idle_timeout() {
    let s = Server::start(
        &synth_model(),
        &["--idle-timeout", "1", "--header-timeout", "30"],
    );
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader).unwrap();
    assert_eq!(status, 200);
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    reader.read_exact(&mut vec![0; length]).unwrap();
    // Kept alive, then idle: closed after about a second (not the 30 s header timeout).
    let started = Instant::now();
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    let took = started.elapsed();
    assert!(rest.is_empty());
    assert!(
        (Duration::from_millis(800)..Duration::from_secs(5)).contains(&took),
        "closed after {took:?}"
    );
}

/// Near --max-connection-age a connection takes its last request (`Connection: close`), so
/// that a request begun on it can finish within --request-timeout before the age is reached.
#[test]
fn old_connections_are_drained_then_closed() {
    let s = Server::start(
        &synth_model(),
        &[
            "--request-timeout",
            "1",
            "--max-connection-age",
            "3",
            "--idle-timeout",
            "30",
            "--header-timeout",
            "30",
        ],
    );
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut answers = 0;
    loop {
        if stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .is_err()
        {
            break;
        }
        let Ok((status, headers)) = read_head(&mut reader) else {
            break;
        };
        assert_eq!(status, 200);
        answers += 1;
        let length: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap();
        reader.read_exact(&mut vec![0; length]).unwrap();
        let close = headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("connection") && v == "close");
        let age = started.elapsed();
        // Kept alive for the first 2 s (age 3 - request timeout 1), closed after.
        if close {
            assert!(age >= Duration::from_millis(1900), "closed at {age:?}");
            let mut rest = Vec::new();
            reader.read_to_end(&mut rest).unwrap();
            break;
        }
        assert!(
            age < Duration::from_millis(2500),
            "still kept alive at {age:?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
    assert!(answers >= 5, "{answers} answers");
}

#[test]
fn connection_limits_are_checked_against_each_other() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--max-connections", "4", "--max-connections-per-ip", "4"],
            "--max-connections-per-ip 4 must be below --max-connections 4",
        ),
        (
            &["--max-connection-age", "600"],
            "--max-connection-age 600 must exceed --request-timeout 600",
        ),
        (&["--idle-timeout", "0"], "--idle-timeout"),
        (&["--write-timeout", "0"], "--write-timeout"),
    ];
    for (args, expected) in cases {
        let mut s = Server::spawn(&synth_model(), args);
        let status = s.wait_exit(Duration::from_secs(30));
        assert!(!status.success(), "{args:?}");
        assert!(s.log().contains(expected), "{args:?}: {}", s.log());
    }
}

/// A request in hand is never idle: an answer that takes longer than --idle-timeout to compute
/// (nothing on the wire meanwhile), or to stream, arrives whole.
#[test]
fn long_answers_outlive_the_idle_timeout() {
    let s = Server::start(
        &test_support::default_model(),
        &["--idle-timeout", "1", "--threads", "1"],
    );
    // Enough tokens that the fastest core seen, on one thread, still takes several times the
    // timeout: 120 once finished within it on a CPU whose L3 holds the whole model.
    for stream in [false, true] {
        let started = Instant::now();
        let r = s.post_json(
            "/v1/completions",
            &serde_json::json!({"prompt": "Count from 1 to 500: 1, 2, 3, 4,", "max_tokens": 480,
                                "temperature": 0, "stream": stream}),
        );
        let took = started.elapsed();
        assert_eq!(r.status, 200, "{}", r.body);
        eprintln!("stream {stream}: answered in {took:?}");
        assert!(
            took > Duration::from_millis(1500),
            "answered in {took:?}: too quick to show anything about --idle-timeout 1; ask for more tokens"
        );
        if stream {
            assert_eq!(
                r.sse_data().last().map(String::as_str),
                Some("[DONE]"),
                "{}",
                r.body
            );
        } else {
            assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() > 0);
        }
    }
}
