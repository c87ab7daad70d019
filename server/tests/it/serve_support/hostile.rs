//! Helpers for the adversarial tests: attackers on loopback addresses of their own
//! (127.0.0.2 ..= 127.0.0.254), a bystander on 127.0.0.1 probing with a deadline while they
//! attack, and the server's resources read from /proc (peak RSS, its connections, its accept
//! queue). Nothing here talks to an address outside 127.0.0.0/8.

use std::io::{BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{read_head, write_request};

/// The bystander's address: no attacker uses it.
pub const BYSTANDER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// The answer the bystander must get within, while an attack runs and after it.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// Attacker `i`'s address, one of 253 (127.0.0.2 ..= 127.0.0.254): never [`BYSTANDER`].
pub fn attacker(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 2 + (i % 253) as u8)
}

/// A TCP connection from `src` (bound before connecting) to `dst`. `rcvbuf`: a small receive
/// buffer, as a client that means not to read asks for, so that the server's writes stall sooner.
pub fn connect_from(
    src: Ipv4Addr,
    dst: SocketAddr,
    rcvbuf: Option<usize>,
) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    if let Some(size) = rcvbuf {
        socket.set_recv_buffer_size(size)?;
    }
    socket.bind(&SocketAddrV4::new(src, 0).into())?;
    socket.connect_timeout(&dst.into(), DEADLINE)?;
    Ok(socket.into())
}

/// Raises this process's soft open-file limit to its hard limit (attacks hold hundreds of
/// sockets); returns the limit now in force.
pub fn raise_nofile() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write one rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    limit.rlim_cur
}

/// A field of /proc/PID/status, in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from /proc/{pid}/status"))
}

/// The process's peak resident memory so far, in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    status_kib(pid, "VmHWM") << 10
}

/// The rows of /proc/net/tcp: (local address, remote address, state, rx queue).
fn tcp_rows() -> Vec<(SocketAddrV4, SocketAddrV4, u8, u32)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let addr = |s: &str| {
        let (ip, port) = s.split_once(':').unwrap();
        // The address is the kernel's u32 in host order, printed in hex.
        let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).unwrap().swap_bytes());
        SocketAddrV4::new(ip, u16::from_str_radix(port, 16).unwrap())
    };
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let state = u8::from_str_radix(f.get(3)?, 16).ok()?;
            let rx = u32::from_str_radix(f.get(4)?.split_once(':')?.1, 16).ok()?;
            Some((addr(f[1]), addr(f[2]), state, rx))
        })
        .collect()
}

const ESTABLISHED: u8 = 1;
const LISTEN: u8 = 10;

/// The server's established connections (its end: local port `port`), from `from` or from
/// anyone; those waiting in its accept queue included.
pub fn established(port: u16, from: Option<Ipv4Addr>) -> usize {
    tcp_rows()
        .into_iter()
        .filter(|(local, remote, state, _)| {
            *state == ESTABLISHED
                && local.port() == port
                && from.is_none_or(|ip| *remote.ip() == ip)
        })
        .count()
}

/// Connections waiting in the accept queue of the listener on `port`.
pub fn accept_queue(port: u16) -> u32 {
    tcp_rows()
        .into_iter()
        .find(|(local, _, state, _)| *state == LISTEN && local.port() == port)
        .map(|(_, _, _, rx)| rx)
        .expect("no listener on the port")
}

/// One request from [`BYSTANDER`] on a connection of its own, answered in full within
/// [`DEADLINE`]: its status, or why not.
pub fn request_from_bystander(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<u16, String> {
    let started = Instant::now();
    let left = || {
        DEADLINE
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero())
    };
    let mut stream = connect_from(BYSTANDER, addr, None).map_err(|e| format!("connect: {e}"))?;
    let timeout = left().ok_or("no time left after connect")?;
    stream.set_read_timeout(Some(timeout)).unwrap();
    stream.set_write_timeout(Some(timeout)).unwrap();
    write_request(&mut stream, "GET", path, headers, b"").map_err(|e| format!("write: {e}"))?;
    let mut reader = BufReader::new(stream);
    let (status, _) = read_head(&mut reader).map_err(|e| format!("read: {e}"))?;
    let mut rest = Vec::new();
    reader
        .read_to_end(&mut rest)
        .map_err(|e| format!("read the body: {e}"))?;
    match left() {
        Some(_) => Ok(status),
        None => Err(format!("answered after {:?}", started.elapsed())),
    }
}

/// One probe of a [`Bystander`].
#[derive(Debug)]
pub struct Probe {
    /// When it was sent, from the bystander's start.
    pub at: Duration,
    pub took: Duration,
    pub outcome: Result<u16, String>,
}

/// A client that probes the server every `interval` on a thread of its own until stopped.
pub struct Bystander {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Probe>>,
}

impl Bystander {
    pub fn start<F>(interval: Duration, probe: F) -> Bystander
    where
        F: Fn() -> Result<u16, String> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let started = Instant::now();
                let mut probes = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let at = started.elapsed();
                    let outcome = probe();
                    probes.push(Probe {
                        at,
                        took: started.elapsed() - at,
                        outcome,
                    });
                    std::thread::sleep(interval);
                }
                probes
            }
        });
        Bystander { stop, thread }
    }

    /// Stops probing; every probe it made.
    pub fn stop(self) -> Probes {
        self.stop.store(true, Ordering::Relaxed);
        Probes(self.thread.join().unwrap())
    }
}

/// What a [`Bystander`] saw.
#[derive(Debug)]
pub struct Probes(pub Vec<Probe>);

impl Probes {
    /// The longest answer.
    pub fn max_latency(&self) -> Duration {
        self.0.iter().map(|p| p.took).max().unwrap_or_default()
    }

    /// Asserts that there were at least `at_least` probes and every one got `status` within
    /// [`DEADLINE`]; returns the longest answer.
    pub fn assert_answered(&self, status: u16, at_least: usize, what: &str) -> Duration {
        assert!(
            self.0.len() >= at_least,
            "{what}: only {} probes: {:?}",
            self.0.len(),
            self.0
        );
        let failed: Vec<String> = self
            .0
            .iter()
            .filter(|p| p.outcome != Ok(status) || p.took > DEADLINE)
            .map(|p| format!("at {:?}: {:?} in {:?}", p.at, p.outcome, p.took))
            .collect();
        assert!(
            failed.is_empty(),
            "{what}: {} of {} probes not answered {status} within {DEADLINE:?}: {failed:?}",
            failed.len(),
            self.0.len()
        );
        self.max_latency()
    }
}
