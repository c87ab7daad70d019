//! The connection layer against hostile clients (issue 42): the real binary with the
//! appliance's limits (`--max-connections 64 --header-timeout 10 --body-timeout 30`, eight
//! connections per address, keys on, the per-IP rate limit), attacked from loopback addresses
//! of the attackers' own (127.0.0.2 ..= 127.0.0.254) while a bystander on 127.0.0.1 asks for
//! `/v1/models` with its key. Each attack asserts that the process lives, that the bystander
//! is answered within 2 s while it runs and afterwards, and that peak RSS stays within the
//! plan plus [`PROCESS_MARGIN`]. Where an attack is about one timeout, that timeout is short
//! so that the test takes seconds.
//!
//! The appliance's per-key rate limit is left off: the bystander's own probes would spend its
//! bucket, and no attack here holds a key it could spend.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::serve_support::hostile::{
    accept_queue, attacker, connect_from, established, peak_rss, raise_nofile,
    request_from_bystander, Bystander, DEADLINE,
};
use crate::serve_support::{binary, synth_model, Server};
use crate::serve_tls::{https, wait_ready_https, Cert};

const KEY: &str = "sk-hostile-conn-test";

/// How often the bystander asks: under the per-IP rate (120 a minute) with room to spare.
const PROBE_EVERY: Duration = Duration::from_millis(600);

/// How long each attack runs with the bystander probing, and how long it probes after.
const ATTACK: Duration = Duration::from_secs(5);
const AFTER: Duration = Duration::from_secs(2);

/// Peak RSS allowed beyond the plan (which counts weights, KV cache, scratch and vocabulary):
/// the process itself (code, libc, tokio's and the decode threads' stacks, rustls; ~15 MiB at
/// start) and 64 connections, each with hyper's read buffer of at most 408 KiB (its default
/// `max_buf_size`, reached by a 60 KB request line) and a few KiB queued to write: ~26 MiB.
const PROCESS_MARGIN: u64 = 48 << 20;

/// A file holding [`KEY`], removed when dropped.
struct KeyFile(PathBuf);

impl KeyFile {
    fn new(name: &str) -> KeyFile {
        let path =
            std::env::temp_dir().join(format!("llm-hostile-{name}-{}.keys", std::process::id()));
        std::fs::write(&path, format!("{KEY}\n")).unwrap();
        KeyFile(path)
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The appliance's connection limits with keys on, `overrides` replacing some values.
fn appliance_args(keys: &KeyFile, overrides: &[(&str, &str)]) -> Vec<String> {
    let mut args: Vec<(String, String)> = [
        ("--max-connections", "64"),
        ("--header-timeout", "10"),
        ("--body-timeout", "30"),
        ("--max-connections-per-ip", "8"),
        ("--rate-limit-ip", "120"),
        ("--rate-burst", "10"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (flag, value) in overrides {
        match args.iter_mut().find(|(k, _)| k == flag) {
            Some(arg) => arg.1 = value.to_string(),
            None => args.push((flag.to_string(), value.to_string())),
        }
    }
    args.push(("--api-key-file".into(), keys.0.display().to_string()));
    args.into_iter().flat_map(|(k, v)| [k, v]).collect()
}

fn start(keys: &KeyFile, overrides: &[(&str, &str)]) -> Server {
    let args = appliance_args(keys, overrides);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&synth_model(), &args)
}

/// The memory plan of the synth model as `serve` makes it (default sizing), in bytes.
fn plan_bytes() -> u64 {
    let out = std::process::Command::new(binary())
        .args(["plan", "--json", "--model"])
        .arg(synth_model())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    plan["total_bytes"].as_u64().unwrap()
}

/// The bystander's keyed request, on a connection of its own from 127.0.0.1.
fn keyed_probe(addr: SocketAddr) -> impl Fn() -> Result<u16, String> + Send + 'static {
    move || {
        request_from_bystander(
            addr,
            "/v1/models",
            &[("Authorization", &format!("Bearer {KEY}"))],
        )
    }
}

/// Asserts the server is alive and within its memory bound; prints what was measured.
fn check_after(s: &mut Server, what: &str, during: Duration, after: Duration) {
    assert!(
        s.exited().is_none(),
        "{what}: the server died:\n{}",
        s.log()
    );
    let peak = peak_rss(s.pid());
    let bound = plan_bytes() + PROCESS_MARGIN;
    eprintln!(
        "{what}: bystander answered within {during:?} during the attack, {after:?} after; \
         peak RSS {:.1} MiB (bound {:.1} MiB)",
        peak as f64 / 1048576.0,
        bound as f64 / 1048576.0
    );
    assert!(
        peak <= bound,
        "{what}: peak RSS {peak} > {bound} (plan + margin)"
    );
}

/// Probes during `attack` (which runs until the flag is set), then for [`AFTER`] more;
/// asserts every probe was answered 200 within the deadline; the longest answer during and after.
fn with_bystander(
    s: &Server,
    what: &str,
    attack: impl FnOnce(&AtomicBool) + Send,
) -> (Duration, Duration) {
    let stop = AtomicBool::new(false);
    let during = Bystander::start(PROBE_EVERY, keyed_probe(s.addr));
    thread::scope(|scope| {
        scope.spawn(|| attack(&stop));
        thread::sleep(ATTACK);
        stop.store(true, Ordering::Relaxed);
    });
    let during = during.stop();
    let after = Bystander::start(PROBE_EVERY, keyed_probe(s.addr));
    thread::sleep(AFTER);
    let after = after.stop();
    let n = (ATTACK.as_millis() / (PROBE_EVERY + DEADLINE).as_millis()) as usize;
    (
        during.assert_answered(200, n, &format!("{what}, during")),
        after.assert_answered(200, 1, &format!("{what}, after")),
    )
}

/// Issue 42, row 1: one address opens as many connections as it can and pipelines
/// `GET /<60 KB path>` into each, never reading an answer. It gets eight; every answer stalls
/// once its socket buffers are full, and `--write-timeout` drops the connection.
#[test]
fn never_reading_pipelined_clients_from_one_address_are_capped_and_dropped() {
    raise_nofile();
    let keys = KeyFile::new("pipelined");
    // Short write and header timeouts: the attack is about them (a connection that has not
    // stalled when the attack stops waits for the rest of its request).
    let mut s = start(
        &keys,
        &[("--write-timeout", "2"), ("--header-timeout", "3")],
    );
    let (addr, port, from) = (s.addr, s.addr.port(), attacker(0));
    let request = format!(
        "GET /{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "a".repeat(60_000)
    );
    let opened = AtomicUsize::new(0);
    let most_admitted = AtomicUsize::new(0);
    let held: std::sync::Mutex<Vec<TcpStream>> = Default::default();
    let (during, after) = with_bystander(&s, "never-reading pipelined", |stop| {
        // Up to 64 sockets at a time, each written to until it blocks; a socket the server
        // closed is replaced.
        let mut sockets: Vec<(TcpStream, usize)> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            while sockets.len() < 64 {
                // A small receive buffer: the server's answers stall sooner.
                let Ok(stream) = connect_from(from, addr, Some(4096)) else {
                    break;
                };
                stream.set_nonblocking(true).unwrap();
                sockets.push((stream, 0));
                opened.fetch_add(1, Ordering::Relaxed);
            }
            sockets.retain_mut(|(stream, sent)| loop {
                match stream.write(&request.as_bytes()[*sent..]) {
                    Ok(n) => *sent = (*sent + n) % request.len(),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
                    Err(_) => break false,
                }
            });
            let admitted = established(port, Some(from));
            most_admitted.fetch_max(admitted, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(20));
        }
        *held.lock().unwrap() = sockets.into_iter().map(|(s, _)| s).collect();
    });
    let held = held.into_inner().unwrap();
    // The attacker still holds its sockets, unread: the server has let go of every one.
    // Within the header timeout (3 s) plus the write timeout (2 s).
    let released = Instant::now();
    let deadline = released + Duration::from_secs(8);
    while established(port, Some(from)) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} of the attacker's connections still open 8 s after the attack, {} held:\n{}",
            established(port, Some(from)),
            held.len(),
            s.log()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let opened = opened.into_inner();
    let most = most_admitted.into_inner();
    eprintln!(
        "the attacker opened {opened} connections, at most {most} open on the server's side at \
         once, all closed {:?} after the attack",
        released.elapsed()
    );
    assert!(opened > 64, "the attacker opened only {opened}");
    // Eight admitted; a few more may sit in the accept queue for the moment of a sample.
    assert!(most <= 8 + 4, "{most} connections from one address");
    check_after(&mut s, "never-reading pipelined", during, after);
    drop(held);
}

/// What a slow attacker sends before it stalls: headers cut short, or a body cut short
/// (without and with a key), from 253 addresses, three connections each, each sending one more
/// byte every 300 ms and reconnecting when the server drops it.
#[test]
fn slow_headers_and_bodies_from_many_addresses_queue_nobody() {
    raise_nofile();
    let keys = KeyFile::new("slow");
    let mut s = start(&keys, &[]);
    let (addr, port) = (s.addr, s.addr.port());
    let starts = [
        "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ".to_owned(),
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\n\r\n{\"prompt\": \""
            .to_owned(),
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"prompt\": \""
        ),
    ];
    let reconnects = AtomicUsize::new(0);
    let queue_samples: std::sync::Mutex<Vec<u32>> = Default::default();
    let most_open = AtomicUsize::new(0);
    let (during, after) = with_bystander(&s, "slow headers and bodies", |stop| {
        thread::scope(|scope| {
            for group in 0..8 {
                let (starts, reconnects, stop) = (&starts, &reconnects, stop);
                scope.spawn(move || {
                    let addresses: Vec<usize> = (group * 32..(group + 1) * 32)
                        .filter(|i| *i < 253)
                        .collect();
                    let mut conns: Vec<(usize, usize, Option<TcpStream>)> = addresses
                        .iter()
                        .flat_map(|&i| (0..3).map(move |kind| (i, kind, None)))
                        .collect();
                    while !stop.load(Ordering::Relaxed) {
                        for (i, kind, conn) in conns.iter_mut() {
                            let alive = conn.as_mut().is_some_and(|c| c.write_all(b"a").is_ok());
                            if !alive {
                                if conn.take().is_some() {
                                    reconnects.fetch_add(1, Ordering::Relaxed);
                                }
                                if let Ok(mut c) = connect_from(attacker(*i), addr, None) {
                                    if c.write_all(starts[*kind].as_bytes()).is_ok() {
                                        *conn = Some(c);
                                    }
                                }
                            }
                        }
                        thread::sleep(Duration::from_millis(300));
                    }
                });
            }
            while !stop.load(Ordering::Relaxed) {
                queue_samples.lock().unwrap().push(accept_queue(port));
                most_open.fetch_max(established(port, None), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(50));
            }
        });
    });
    let queue = queue_samples.into_inner().unwrap();
    let open = most_open.into_inner();
    let waiting = queue.iter().filter(|&&n| n > 8).count();
    eprintln!(
        "slow clients: {} connections dropped and reopened; at most {open} established on the \
         server's side; accept queue at most {}, over 8 in {waiting} of {} samples",
        reconnects.into_inner(),
        queue.iter().max().unwrap_or(&0),
        queue.len()
    );
    // Everyone is accepted at once: the kernel's queue holds bursts of reconnections for a
    // moment, never a crowd waiting for a place (before: hundreds, for the header timeout).
    assert!(
        waiting * 5 <= queue.len(),
        "the accept queue held over 8 connections in {waiting} of {} samples: {queue:?}",
        queue.len()
    );
    check_after(&mut s, "slow headers and bodies", during, after);
}

/// Keyless clients from 16 addresses send requests as fast as they can: wrong keys to the API
/// and to `/metrics`, and no key. Guessing is IP-limited on `/metrics` too.
#[test]
fn keyless_flood_is_refused_and_rate_limited_on_every_keyed_route() {
    raise_nofile();
    let keys = KeyFile::new("flood");
    let mut s = start(&keys, &[]);
    let addr = s.addr;
    let statuses: std::sync::Mutex<Vec<(String, u16)>> = Default::default();
    let (during, after) = with_bystander(&s, "keyless flood", |stop| {
        thread::scope(|scope| {
            for i in 0..16 {
                let statuses = &statuses;
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    let paths = ["/v1/models", "/metrics", "/tokenize"];
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let path = paths[n % paths.len()];
                        let auth = if n % 2 == 0 { "Bearer sk-guess" } else { "" };
                        n += 1;
                        let Ok(mut c) = connect_from(attacker(i), addr, None) else {
                            continue;
                        };
                        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                        let request = format!(
                            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: {auth}\r\n\r\n"
                        );
                        let mut answer = Vec::new();
                        if c.write_all(request.as_bytes()).is_ok() && c.read_to_end(&mut answer).is_ok() {
                            let status = String::from_utf8_lossy(&answer)
                                .split(' ')
                                .nth(1)
                                .and_then(|s| s.parse().ok())
                                .unwrap_or(0);
                            seen.push((path.to_owned(), status));
                        }
                    }
                    statuses.lock().unwrap().extend(seen);
                });
            }
        });
    });
    let statuses = statuses.into_inner().unwrap();
    let count = |path: &str, status: u16| {
        statuses
            .iter()
            .filter(|(p, s)| p == path && *s == status)
            .count()
    };
    eprintln!(
        "flood: {} requests; /metrics 401 x{} 429 x{}; /v1/models 401 x{} 429 x{}",
        statuses.len(),
        count("/metrics", 401),
        count("/metrics", 429),
        count("/v1/models", 401),
        count("/v1/models", 429)
    );
    assert!(
        statuses.iter().all(|(_, s)| [401, 405, 429].contains(s)),
        "{statuses:?}"
    );
    // Each address had ten tries (the burst) and then waited: guesses at /metrics too.
    assert!(
        count("/metrics", 429) > 0,
        "no guess at /metrics was rate-limited"
    );
    assert!(
        count("/metrics", 401) + count("/v1/models", 401) <= 16 * (10 + 12),
        "too many guesses got through"
    );
    check_after(&mut s, "keyless flood", during, after);
}

/// A TLS port fed garbage: a handshake record of random bytes, a ClientHello with bytes
/// flipped, a record header promising 64 KiB then trickling, and plain junk; from 32 addresses.
#[test]
fn malformed_tls_is_dropped_and_keeps_nobody_out() {
    raise_nofile();
    let keys = KeyFile::new("tls");
    let cert = Arc::new(Cert::new("hostile"));
    let cert_args = cert.args();
    let overrides: Vec<(&str, &str)> = cert_args
        .chunks(2)
        .map(|pair| (pair[0].as_str(), pair[1].as_str()))
        .collect();
    let args = appliance_args(&keys, &overrides);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut s = Server::spawn(&synth_model(), &args);
    wait_ready_https(&s, &cert);
    let addr = s.addr;
    let hello = client_hello();
    let probe = {
        let cert = cert.clone();
        move || {
            let request = format!(
                "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n"
            );
            let started = Instant::now();
            let status = https(addr, &cert, &request)
                .map(|(status, _)| status)
                .map_err(|e| e.to_string())?;
            if started.elapsed() > DEADLINE {
                return Err(format!("answered after {:?}", started.elapsed()));
            }
            Ok(status)
        }
    };
    let sent = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let during = Bystander::start(PROBE_EVERY, probe.clone());
    thread::scope(|scope| {
        for t in 0..4 {
            let (hello, sent, stop) = (&hello, &sent, &stop);
            scope.spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut trickling: Vec<TcpStream> = Vec::new();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let from = attacker(t as usize * 8 + n % 8);
                    n += 1;
                    let Ok(mut c) = connect_from(from, addr, None) else {
                        continue;
                    };
                    let bytes: Vec<u8> = match n % 4 {
                        0 => {
                            let mut b = vec![0x16, 0x03, 0x01, 0x02, 0x00];
                            b.extend((0..512).map(|_| next() as u8));
                            b
                        }
                        1 => {
                            let mut b = hello.clone();
                            for _ in 0..4 {
                                let at = 5 + next() as usize % (b.len() - 5);
                                b[at] ^= 1 << (next() % 8);
                            }
                            b
                        }
                        2 => vec![0x16, 0x03, 0x01, 0xff, 0xff, 0x01],
                        _ => (0..256).map(|_| next() as u8 | 0x80).collect(),
                    };
                    if c.write_all(&bytes).is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    if n % 4 == 2 {
                        trickling.push(c);
                    } else {
                        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
                        let _ = c.read(&mut [0u8; 64]);
                    }
                    trickling.retain_mut(|c| c.write_all(&[next() as u8]).is_ok());
                    thread::sleep(Duration::from_millis(2));
                }
            });
        }
        thread::sleep(ATTACK);
        stop.store(true, Ordering::Relaxed);
    });
    let during = during.stop();
    let after = Bystander::start(PROBE_EVERY, probe);
    thread::sleep(AFTER);
    let after = after.stop();
    let n = (ATTACK.as_millis() / (PROBE_EVERY + DEADLINE).as_millis()) as usize;
    let during = during.assert_answered(200, n, "malformed TLS, during");
    let after = after.assert_answered(200, 1, "malformed TLS, after");
    eprintln!("malformed TLS: {} garbage openings sent", sent.into_inner());
    check_after(&mut s, "malformed TLS", during, after);
}

/// The first flight of a real TLS client (a ClientHello for `localhost`).
fn client_hello() -> Vec<u8> {
    use tokio_rustls::rustls::{self, pki_types::ServerName, ClientConfig, RootCertStore};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    assert_eq!(hello[0], 0x16);
    hello
}
