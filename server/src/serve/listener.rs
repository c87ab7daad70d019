//! The accept loop. `axum::serve` gives hyper no timer, so hyper's header-read timeout never
//! fires (slowloris: a client sending its headers one byte at a time holds a connection for
//! ever); here each connection is served by hyper's HTTP/1 builder with tokio's timer, over TLS
//! when configured.
//!
//! Every connection is accepted at once, whatever the load: one left in the kernel's accept
//! queue is out of reach of every timeout, and a queue full of slow clients holds everyone else
//! back. The table of open connections ([`Conns`]) then admits it, lets an idle one give way to
//! it, or refuses it (a short 503 and close). An admitted connection is held to a header
//! timeout, an idle limit between requests, a write-progress timeout, a lifetime cap, and TCP
//! keepalive with `TCP_USER_TIMEOUT`, so that no client, reading or not, alive or not, keeps
//! its place for long without using it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::{sleep_until, Instant};
use tokio_rustls::TlsAcceptor;
use tower_service::Service;

use super::conns::{ConnState, Conns, Marked, Refusal, Request, TimedIo};

/// The connection options of `llm-server serve` beyond `--max-connections` and
/// `--header-timeout`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ConnArgs {
    /// Connections one client may hold at once (an IPv4 address, or an IPv6 /64); more are
    /// refused at once with 503. Must be below --max-connections, so that one client cannot
    /// take every place.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_ip: u32,
    /// Seconds a keep-alive connection may sit idle (no request in hand, no byte either way)
    /// before it is closed. The wait for the next request's headers is also bounded by
    /// --header-timeout.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: u64,
    /// Seconds a write to a client may make no progress (the client does not read its answer)
    /// before the connection is dropped; also the TCP_USER_TIMEOUT for unacknowledged data.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub write_timeout: u64,
    /// Seconds a connection may live; must exceed --request-timeout. In its last
    /// --request-timeout seconds it takes no new request (answers say `Connection: close`),
    /// so a request begun on it can finish.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connection_age: u64,
}

/// File descriptors kept for everything but client connections: the listener, the model file,
/// epoll, the runtime's and the log's descriptors, metrics reading /proc and the cgroup files,
/// and connections on their way out (evicted or refused, not yet closed).
const FD_RESERVE: u64 = 64;

/// Connection flags that contradict each other, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnArgsError {
    #[error(
        "--max-connections-per-ip {per_ip} must be below --max-connections {total}: otherwise one \
         client address can take every connection; lower it or raise --max-connections"
    )]
    PerIpNotBelowTotal { per_ip: u32, total: u32 },
    #[error(
        "--max-connection-age {age} must exceed --request-timeout {request}: a connection must \
         outlive the longest request; raise it or lower --request-timeout"
    )]
    AgeNotAboveRequest { age: u64, request: u64 },
}

impl ConnArgs {
    /// The limits every connection is held to, checked against each other and against the
    /// process's file descriptor limit, which is raised to its hard maximum first (an open
    /// connection is a descriptor; the soft limit is often 1024).
    pub fn limits(
        &self,
        max_connections: u32,
        header_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<ConnLimits, ConnArgsError> {
        if self.max_connections_per_ip >= max_connections {
            return Err(ConnArgsError::PerIpNotBelowTotal {
                per_ip: self.max_connections_per_ip,
                total: max_connections,
            });
        }
        if self.max_connection_age <= request_timeout.as_secs() {
            return Err(ConnArgsError::AgeNotAboveRequest {
                age: self.max_connection_age,
                request: request_timeout.as_secs(),
            });
        }
        let mut max_connections = max_connections as usize;
        match raise_fd_limit() {
            Ok(limit) => {
                let room = limit.saturating_sub(FD_RESERVE).max(1) as usize;
                if max_connections > room {
                    tracing::warn!(
                        "--max-connections {max_connections} lowered to {room}: the open-file \
                         limit is {limit} and {FD_RESERVE} are kept for the server itself \
                         (raise LimitNOFILE)"
                    );
                    max_connections = room;
                }
            }
            Err(e) => tracing::warn!("cannot read or raise the open-file limit: {e}"),
        }
        let max_age = Duration::from_secs(self.max_connection_age);
        Ok(ConnLimits {
            max_connections,
            max_per_client: (self.max_connections_per_ip as usize)
                .min(max_connections - 1)
                .max(1),
            header_timeout,
            idle_timeout: Duration::from_secs(self.idle_timeout),
            write_timeout: Duration::from_secs(self.write_timeout),
            max_age,
            drain_after: max_age.saturating_sub(request_timeout),
        })
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one; returns the soft limit now in force.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        } else {
            tracing::warn!(
                "cannot raise the open-file limit from {} to {}: {}",
                limit.rlim_cur,
                limit.rlim_max,
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(limit.rlim_cur)
}

/// What every connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections open at once; past it an idle one gives way or the newcomer is refused.
    pub max_connections: usize,
    /// Connections one client ([`super::limit::client_key`]) may hold at once.
    pub max_per_client: usize,
    /// Time to receive a request's headers (and, with TLS, to finish the handshake), counted
    /// from the first byte awaited, idle keep-alive time included.
    pub header_timeout: Duration,
    /// Time without a request in hand and without a byte either way.
    pub idle_timeout: Duration,
    /// Time a write may make no progress.
    pub write_timeout: Duration,
    /// A connection's whole life.
    pub max_age: Duration,
    /// Age from which a connection takes no new request.
    pub drain_after: Duration,
}

impl Default for ConnLimits {
    /// As `llm-server serve` starts without options.
    fn default() -> ConnLimits {
        ConnLimits {
            max_connections: 256,
            max_per_client: 8,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_age: Duration::from_secs(900),
            drain_after: Duration::from_secs(300),
        }
    }
}

/// TCP keepalive on every connection: a peer that vanished (no FIN, no RST) during a long
/// request is noticed after about `KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES`.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// The answer to a connection that is refused, before it is closed.
fn refusal(why: Refusal) -> &'static [u8] {
    match why {
        Refusal::PerClient => {
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 74\r\n\r\n\
too many connections from your address: use fewer at once (or keep-alive)\n"
        }
        Refusal::Full => {
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 53\r\n\r\n\
the server has no free connection; retry in a second\n"
        }
    }
}

/// Listens on `addr` with a backlog of 1024 rather than the usual 128: a burst of connections
/// waits there only for the moment the accept loop takes to sort them, and a full backlog drops
/// SYNs (the client retries after a second, then three).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for open connections to
/// finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let conns = Conns::new(limits.max_connections, limits.max_per_client);
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and the like: a busy loop would not cure it, a pause may (idle
                    // connections time out meanwhile).
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let mut admitted = conns.admit(peer.ip());
        // In a burst this loop runs ahead of the connections it spawned, and one whose task has
        // not yet read from it cannot give way (an honest first request may wait unread in
        // it): a table full of those refuses everyone. Let them run, then ask again.
        for _ in 0..3 {
            if admitted.as_ref().err() != Some(&Refusal::Full) {
                break;
            }
            tokio::task::yield_now().await;
            admitted = conns.admit(peer.ip());
        }
        let slot = match admitted {
            Ok(slot) => slot,
            Err(why) => {
                tracing::debug!("{peer}: refused: {why:?}");
                refuse(&stream, (tls.is_none()).then(|| refusal(why)));
                continue;
            }
        };
        keepalive(&stream, limits.write_timeout);
        let (app, tls, http, watcher) =
            (app.clone(), tls.clone(), http.clone(), graceful.watcher());
        tokio::spawn(async move {
            let state = slot.state.clone();
            let conn = connection(stream, peer, app, tls, http, watcher, limits, state.clone());
            tokio::select! {
                () = conn => {}
                why = expiry(&state, &limits) => tracing::debug!("{peer}: closed: {why}"),
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answers a refused connection (plain text means nothing on a TLS port: there the close
/// alone says it) and leaves it to be closed: one try, never a wait, for the answer fits any
/// socket buffer. The end of writing is sent with the answer, and what the client sent is read
/// away, so that the close is a FIN after the answer rather than a reset that may discard it.
fn refuse(stream: &TcpStream, answer: Option<&[u8]>) {
    // Direct calls on the socket: tokio's try_write would wait for the reactor to report the
    // new socket writable.
    let socket = socket2::SockRef::from(stream);
    if let Some(answer) = answer {
        let _ = socket.send(answer);
    }
    let _ = socket.shutdown(std::net::Shutdown::Write);
    let mut sink = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    // Bounded: a client cannot keep the accept loop here by sending faster than it reads.
    for _ in 0..16 {
        if !matches!(socket.recv(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
}

/// TCP keepalive and `TCP_USER_TIMEOUT` (unacknowledged data for `user_timeout` closes the
/// connection), so that a peer that vanished releases its place.
fn keepalive(stream: &TcpStream, user_timeout: Duration) {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let set = socket
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| socket.set_tcp_user_timeout(Some(user_timeout)))
        .and_then(|()| socket.set_tcp_nodelay(true));
    if let Err(e) = set {
        tracing::debug!("cannot set the socket options of a connection: {e}");
    }
}

/// Resolves when the connection is to be dropped: idle too long, too old, or its place given
/// to another. Says which.
async fn expiry(state: &ConnState, limits: &ConnLimits) -> &'static str {
    let end_of_life = sleep_until(Instant::from_std(state.started + limits.max_age));
    tokio::pin!(end_of_life);
    loop {
        // While a request is in hand its handler and --request-timeout are in charge.
        let idle_since = if state.is_busy() {
            std::time::Instant::now()
        } else {
            state.last_io()
        };
        let check = sleep_until(Instant::from_std(idle_since + limits.idle_timeout));
        tokio::select! {
            () = &mut end_of_life => return "--max-connection-age reached",
            () = state.evicted.notified() => return "its place went to a new connection (the server is full)",
            () = check => {
                if !state.is_busy() && state.last_io().elapsed() >= limits.idle_timeout {
                    return "idle for --idle-timeout";
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    tls: Option<TlsAcceptor>,
    http: http1::Builder,
    watcher: Watcher,
    limits: ConnLimits,
    state: Arc<ConnState>,
) {
    let Some(tls) = tls else {
        let io = TimedIo::new(stream, state.clone(), limits.write_timeout);
        return http_connection(io, peer, app, http, watcher, limits, state).await;
    };
    let handshake_timeout = limits.header_timeout;
    let handshake = async {
        if !super::tls::is_tls(&mut stream).await? {
            return Ok(None);
        }
        let io = TimedIo::new(stream, state.clone(), limits.write_timeout);
        tls.accept(io).await.map(Some)
    };
    match tokio::time::timeout(handshake_timeout, handshake).await {
        Ok(Ok(Some(stream))) => {
            http_connection(stream, peer, app, http, watcher, limits, state).await
        }
        Ok(Ok(None)) => tracing::info!("{peer}: plain HTTP on the TLS port, told to use https"),
        Ok(Err(e)) => tracing::info!("{peer}: TLS handshake failed: {e}"),
        Err(_) => tracing::info!("{peer}: no TLS handshake within {handshake_timeout:?}"),
    }
}

async fn http_connection<S>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    http: http1::Builder,
    watcher: Watcher,
    limits: ConnLimits,
    state: Arc<ConnState>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        // The request counts as in hand from its last byte to its answer's last byte.
        let mark = Request::new(state.clone());
        let mut request = request.map(|body| Marked::request(body, mark.clone()));
        // The client's address, for the per-IP rate limit and the log (as axum's ConnectInfo).
        request.extensions_mut().insert(ConnectInfo(peer));
        let draining = state.started.elapsed() >= limits.drain_after;
        let answer = app.clone().call(request);
        async move {
            let mut response = answer.await?;
            if draining {
                // The connection nears --max-connection-age: this is its last request.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(response.map(|body| Marked::response(body, mark)))
        }
    });
    let conn = http.serve_connection(TokioIo::new(stream), service);
    if let Err(e) = watcher.watch(conn).await {
        // Timeouts, resets and malformed requests: the client's trouble, not the server's.
        tracing::debug!("{peer}: connection ended: {e}");
    }
}
