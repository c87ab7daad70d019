//! The open connections, counted per client ([`client_key`]) and in all, and what each one is
//! doing: when it last moved a byte, and whether it has a request in hand. The accept loop asks
//! [`Conns::admit`] about every new connection: past the per-client cap it is refused; at the
//! global cap an idle connection (one the server has read from) of the client holding the most
//! gives way to it (half-sent headers, a TLS handshake, keep-alive between requests: nothing is
//! lost), and only when no connection can give way is the newcomer refused.
//!
//! Why evict rather than refuse at the global cap: clients from many addresses, each sending its
//! headers slowly, would otherwise hold every place for as long as `--header-timeout` and send
//! everyone else away, for ever if they reconnect. A client with a complete request in hand is
//! never evicted, so an honest client that sends its request at once keeps its place.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Sleep;

use super::limit::{client_key, ClientKey};

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its client holds `--max-connections-per-ip` already.
    PerClient,
    /// `--max-connections` are open and every one has a request in hand.
    Full,
}

/// The table of open connections; one per listener.
pub struct Conns {
    max_total: usize,
    max_per_client: usize,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    per_client: HashMap<ClientKey, usize>,
    open: HashMap<u64, Arc<ConnState>>,
    next_id: u64,
}

impl Table {
    /// Forgets connection `id` (closed, or evicted and about to close); false if it was gone.
    fn remove(&mut self, id: u64) -> bool {
        let Some(conn) = self.open.remove(&id) else {
            return false;
        };
        if let Some(n) = self.per_client.get_mut(&conn.key) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&conn.key);
            }
        }
        true
    }

    fn count(&self, key: &ClientKey) -> usize {
        self.per_client.get(key).copied().unwrap_or(0)
    }
}

impl Conns {
    pub fn new(max_total: usize, max_per_client: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max_total: max_total.max(1),
            max_per_client: max_per_client.max(1),
            table: Mutex::new(Table::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table stays consistent across a panic (each change is one statement).
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `ip`, evicting an idle one if the server is full, or says why
    /// not. The returned [`Slot`] holds the place until dropped.
    pub fn admit(self: &Arc<Conns>, ip: std::net::IpAddr) -> Result<Slot, Refusal> {
        let key = client_key(ip);
        let mut table = self.lock();
        let mine = table.count(&key);
        if mine >= self.max_per_client {
            return Err(Refusal::PerClient);
        }
        if table.open.len() >= self.max_total {
            // The idle connection of the client holding the most, least recently active first
            // (by the instant of its last byte: a connection accepted a moment ago has moved
            // none yet and is not the stalest); only a client holding more than the newcomer's
            // gives way (no one can push out clients lighter than itself).
            let victim = table
                .open
                .values()
                .filter(|c| c.looked_at() && !c.is_busy())
                .map(|c| (table.count(&c.key), std::cmp::Reverse(c.last_io()), c))
                .filter(|(n, _, _)| *n > mine)
                .max_by_key(|(n, last, _)| (*n, *last))
                .map(|(_, _, c)| c.clone());
            let Some(victim) = victim else {
                return Err(Refusal::Full);
            };
            table.remove(victim.id);
            victim.evicted.notify_one();
        }
        let id = table.next_id;
        table.next_id += 1;
        let state = Arc::new(ConnState {
            id,
            key,
            started: Instant::now(),
            last_io: AtomicU64::new(0),
            looked_at: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            write_stalled: AtomicBool::new(false),
            evicted: Notify::new(),
        });
        table.open.insert(id, state.clone());
        *table.per_client.entry(key).or_default() += 1;
        Ok(Slot {
            conns: self.clone(),
            state,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.lock().open.len()
    }
}

/// One admitted connection's place in the table, given back when dropped.
pub struct Slot {
    conns: Arc<Conns>,
    pub state: Arc<ConnState>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conns.lock().remove(self.state.id);
    }
}

/// What a connection is doing, shared by its IO, its requests and the table.
pub struct ConnState {
    id: u64,
    pub key: ClientKey,
    pub started: Instant,
    /// Milliseconds after `started` when a byte last moved either way.
    last_io: AtomicU64,
    /// Whether the server has tried to read from it yet. Until then it is not idle but unheard:
    /// in a flood the accept loop can admit (and evict) hundreds of connections before a task
    /// reads the request an honest client sent with its first packet.
    looked_at: AtomicBool,
    /// Requests received whole and not yet answered to the last byte.
    busy: AtomicUsize,
    /// An answer waits for the client to read (a write could not proceed).
    write_stalled: AtomicBool,
    /// Told when the table has given this connection's place to another.
    pub evicted: Notify,
}

impl ConnState {
    fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_io.fetch_max(ms, Ordering::Relaxed);
    }

    /// Whether a read has been tried: only then can the connection give way to another.
    fn looked_at(&self) -> bool {
        self.looked_at.load(Ordering::Relaxed)
    }

    fn last_io_ms(&self) -> u64 {
        self.last_io.load(Ordering::Relaxed)
    }

    /// When a byte last moved either way.
    pub fn last_io(&self) -> Instant {
        self.started + Duration::from_millis(self.last_io_ms())
    }

    /// Whether a request is in hand (received whole, answer not yet sent) or an answer waits
    /// for the client to read it: then --write-timeout, not idleness, decides.
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed) > 0 || self.write_stalled.load(Ordering::Relaxed)
    }
}

/// One request's mark on its connection: the connection counts as busy from when the request
/// has arrived whole ([`Request::received`]) until every holder is dropped (the request body
/// and the response body, once sent).
pub struct Request {
    conn: Arc<ConnState>,
    received: AtomicBool,
}

impl Request {
    pub fn new(conn: Arc<ConnState>) -> Arc<Request> {
        Arc::new(Request {
            conn,
            received: AtomicBool::new(false),
        })
    }

    /// The request has arrived whole: from now on its connection is not idle.
    pub fn received(&self) {
        if !self.received.swap(true, Ordering::Relaxed) {
            self.conn.busy.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if *self.received.get_mut() {
            self.conn.busy.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A request or response body that holds its request's [`Request`] mark until dropped; a
/// request body also marks the request received when it ends.
pub struct Marked<B> {
    body: B,
    mark: Arc<Request>,
    is_request: bool,
}

impl<B: http_body::Body + Unpin> Marked<B> {
    pub fn request(body: B, mark: Arc<Request>) -> Marked<B> {
        if body.is_end_stream() {
            mark.received();
        }
        Marked {
            body,
            mark,
            is_request: true,
        }
    }

    pub fn response(body: B, mark: Arc<Request>) -> Marked<B> {
        Marked {
            body,
            mark,
            is_request: false,
        }
    }
}

impl<B> http_body::Body for Marked<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if self.is_request && (matches!(polled, Poll::Ready(None)) || self.body.is_end_stream()) {
            self.mark.received();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket, noting every byte moved in [`ConnState`], and failing a write that
/// makes no progress for `write_timeout` (a client that does not read its answers: without
/// this its connection, and its place, would be held for ever).
pub struct TimedIo<S> {
    inner: S,
    state: Arc<ConnState>,
    write_timeout: Duration,
    /// Armed when a write could not proceed; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> TimedIo<S> {
    pub fn new(inner: S, state: Arc<ConnState>, write_timeout: Duration) -> TimedIo<S> {
        TimedIo {
            inner,
            state,
            write_timeout,
            stalled: None,
        }
    }

    /// The outcome of a write-side poll: progress disarms the timer, no progress arms it (or
    /// fails once it has run out).
    fn on_write<T>(
        &mut self,
        polled: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
        progress: bool,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                if progress {
                    if self.stalled.take().is_some() {
                        self.state.write_stalled.store(false, Ordering::Relaxed);
                    }
                    self.state.touch();
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let (timeout, state) = (self.write_timeout, &self.state);
                let stalled = self.stalled.get_or_insert_with(|| {
                    state.write_stalled.store(true, Ordering::Relaxed);
                    Box::pin(tokio::time::sleep(timeout))
                });
                match stalled.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {timeout:?} (--write-timeout)"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.touch();
        }
        self.state.looked_at.store(true, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        let progress = matches!(polled, Poll::Ready(Ok(n)) if n > 0);
        self.on_write(polled, cx, progress)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        let progress = matches!(polled, Poll::Ready(Ok(n)) if n > 0);
        self.on_write(polled, cx, progress)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.on_write(polled, cx, false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.on_write(polled, cx, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    /// Admits a connection from `ip` whose socket the server has then read from.
    fn admit_read(conns: &Arc<Conns>, ip: std::net::IpAddr) -> Result<Slot, Refusal> {
        let slot = conns.admit(ip)?;
        slot.state.looked_at.store(true, Ordering::Relaxed);
        Ok(slot)
    }

    #[test]
    fn per_client_cap_counts_a_slash_64_as_one() {
        let conns = Conns::new(10, 2);
        let _a = conns.admit(ip("2001:db8::1")).unwrap();
        let _b = conns.admit(ip("2001:db8::2")).unwrap();
        assert_eq!(
            conns.admit(ip("2001:db8::3")).err(),
            Some(Refusal::PerClient)
        );
        let _c = conns.admit(ip("2001:db8:0:1::1")).unwrap();
        let _d = conns.admit(ip("::ffff:192.0.2.1")).unwrap();
        let _e = conns.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(conns.admit(ip("192.0.2.1")).err(), Some(Refusal::PerClient));
        drop(_e);
        let _e = conns.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(conns.open(), 5);
    }

    #[test]
    fn at_the_cap_the_heaviest_idle_client_gives_way_and_busy_ones_never() {
        let conns = Conns::new(4, 3);
        let heavy: Vec<Slot> = (0..3)
            .map(|_| admit_read(&conns, ip("10.0.0.1")).unwrap())
            .collect();
        let light = admit_read(&conns, ip("10.0.0.2")).unwrap();
        // A newcomer pushes out one of the heavy client's idle connections.
        let newcomer = admit_read(&conns, ip("10.0.0.3")).unwrap();
        let evicted: Vec<&Slot> = heavy
            .iter()
            .filter(|s| !conns.lock().open.contains_key(&s.state.id))
            .collect();
        assert_eq!(evicted.len(), 1);
        assert_eq!(conns.open(), 4);
        // Busy connections stay; a client as light as every idle one pushes nobody out.
        let marks: Vec<Arc<Request>> = heavy
            .iter()
            .chain([&light, &newcomer])
            .map(|s| {
                let m = Request::new(s.state.clone());
                m.received();
                m
            })
            .collect();
        assert_eq!(
            admit_read(&conns, ip("10.0.0.4")).err(),
            Some(Refusal::Full)
        );
        drop(marks);
        // Idle again: 10.0.0.1 holds 2, more than the newcomer's 0.
        let _n = admit_read(&conns, ip("10.0.0.4")).unwrap();
        // A second idle one of 10.0.0.1 went; now every client holds one: nobody gives way to
        // a client that holds one already, but does to one that holds none.
        assert_eq!(
            admit_read(&conns, ip("10.0.0.2")).err(),
            Some(Refusal::Full)
        );
        let _m = admit_read(&conns, ip("10.0.0.5")).unwrap();
        assert_eq!(conns.open(), 4);
    }

    /// Among clients holding as many, the connection whose last byte is oldest gives way, not
    /// one accepted a moment ago that has not sent its request yet (each connection counts its
    /// activity from its own start: compared as such, the newest looked the stalest, and a
    /// bystander's fresh connection was pushed out by an attacker's newcomer).
    #[test]
    fn a_connection_accepted_a_moment_ago_is_not_the_stalest() {
        let conns = Conns::new(2, 3);
        let old = admit_read(&conns, ip("10.0.0.1")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        old.state.touch();
        std::thread::sleep(Duration::from_millis(40));
        let fresh = admit_read(&conns, ip("10.0.0.2")).unwrap();
        let _newcomer = admit_read(&conns, ip("10.0.0.3")).unwrap();
        let table = conns.lock();
        assert!(!table.open.contains_key(&old.state.id));
        assert!(table.open.contains_key(&fresh.state.id));
    }

    /// A connection the server has not read from yet is not idle, however stale it looks: in a
    /// flood the accept loop runs ahead of the connection tasks, and an honest client's request
    /// sent with its first packet was pushed out unread (a bystander's probe was reset in
    /// `hostile_conn::slow_headers_and_bodies_from_many_addresses_queue_nobody`).
    #[test]
    fn a_connection_not_yet_read_from_never_gives_way() {
        let conns = Conns::new(2, 3);
        let unread = conns.admit(ip("10.0.0.1")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let read = admit_read(&conns, ip("10.0.0.2")).unwrap();
        read.state.touch();
        let newcomer = conns.admit(ip("10.0.0.3")).unwrap();
        let table = conns.lock();
        assert!(table.open.contains_key(&unread.state.id));
        assert!(!table.open.contains_key(&read.state.id));
        drop(table);
        // Now only unread connections are open: the next newcomer is refused, not let in.
        drop(newcomer);
        let _other = conns.admit(ip("10.0.0.4")).unwrap();
        assert_eq!(conns.admit(ip("10.0.0.5")).err(), Some(Refusal::Full));
    }
}
