//! Server-sent events written by hand into one reused buffer, so that a streamed token costs
//! no allocation: each event's JSON is serialised straight after its `data: `, and what one
//! step wrote leaves as one body frame sharing the buffer's memory, which the next step writes
//! over once the connection has sent (and dropped) it. The bytes on the wire are those of
//! axum's `Sse` with `KeepAlive::default()`: `data: <line>\n\n` per event, `:\n\n` after 15 s
//! without one, `text/event-stream` and `no-cache`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, BytesMut};
use futures_util::Stream;
use serde::Serialize;
use tokio::time::{Instant, Sleep};

/// Room made before each event: a chunk of a few tokens and its envelope fit without growing.
const EVENT_ROOM: usize = 1024;
/// The buffer's first size: room for several events still held by a slow connection before a
/// new buffer is needed.
const BUFFER: usize = 16 * 1024;
/// As axum's default keep-alive: an empty comment after this long without an event.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(15);
const KEEP_ALIVE: &[u8] = b":\n\n";

/// Events being written, taken out as body frames.
pub struct Frames {
    buf: BytesMut,
}

impl Default for Frames {
    fn default() -> Frames {
        Frames {
            buf: BytesMut::with_capacity(BUFFER),
        }
    }
}

impl Frames {
    /// Appends one event whose data is `value` as JSON (one line: serde_json writes no raw
    /// newline, which would end the event early).
    pub fn json(&mut self, value: &impl Serialize) {
        self.start();
        let mut writer = (&mut self.buf).writer();
        // Our response structs always serialise (no maps with non-string keys), and writing
        // into memory cannot fail.
        let _ = serde_json::to_writer(&mut writer, value);
        self.buf.put_slice(b"\n\n");
    }

    /// Appends one event named `name` (an `event: <name>` line, which Anthropic's SDK reads
    /// and OpenAI's Responses API sends) whose data is `value` as JSON.
    pub fn named_json(&mut self, name: &str, value: &impl Serialize) {
        self.buf.reserve(EVENT_ROOM);
        self.buf.put_slice(b"event: ");
        self.buf.put_slice(name.as_bytes());
        self.buf.put_slice(b"\n");
        self.json(value);
    }

    /// Appends one event whose data is `line` (which holds no newline).
    pub fn data(&mut self, line: &str) {
        self.start();
        self.buf.put_slice(line.as_bytes());
        self.buf.put_slice(b"\n\n");
    }

    fn start(&mut self) {
        // Reclaims the front of the buffer when every earlier frame has been dropped.
        self.buf.reserve(EVENT_ROOM);
        self.buf.put_slice(b"data: ");
    }

    /// Everything appended since the last call, as one frame; `None` when nothing was.
    pub fn take(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }
}

/// The streaming response: the frames of `frames`, with keep-alive comments in the pauses.
/// Dropping the response (the client left) drops `frames`.
pub fn response(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let body = KeepAlive::new(frames, KEEP_ALIVE_EVERY);
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// `frames`, and a comment whenever none came for `every` (proxies and clients drop
/// connections that stay silent, e.g. through a long prompt).
struct KeepAlive<S> {
    frames: Pin<Box<S>>,
    timer: Pin<Box<Sleep>>,
    every: Duration,
}

impl<S> KeepAlive<S> {
    fn new(frames: S, every: Duration) -> KeepAlive<S> {
        KeepAlive {
            frames: Box::pin(frames),
            timer: Box::pin(tokio::time::sleep(every)),
            every,
        }
    }
}

impl<S: Stream<Item = Bytes>> Stream for KeepAlive<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let frame = match self.frames.as_mut().poll_next(cx) {
            Poll::Ready(Some(frame)) => frame,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                ready!(self.timer.as_mut().poll(cx));
                Bytes::from_static(KEEP_ALIVE)
            }
        };
        let next = Instant::now() + self.every;
        self.timer.as_mut().reset(next);
        Poll::Ready(Some(Ok(frame)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[test]
    fn events_are_data_lines_and_frames_are_what_was_written_since_the_last() {
        let mut frames = Frames::default();
        assert_eq!(frames.take(), None);
        frames.json(&serde_json::json!({"a": "x\ny"}));
        frames.data("[DONE]");
        let first = frames.take().unwrap();
        assert_eq!(&first[..], b"data: {\"a\":\"x\\ny\"}\n\ndata: [DONE]\n\n");
        frames.data("z");
        assert_eq!(&frames.take().unwrap()[..], b"data: z\n\n");
        frames.named_json("ping", &serde_json::json!({"type": "ping"}));
        assert_eq!(
            &frames.take().unwrap()[..],
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n"
        );
        // A frame still held elsewhere keeps its bytes while the buffer is written again.
        assert_eq!(&first[..6], b"data: ");
    }

    #[test]
    fn the_buffer_is_reused_once_frames_are_dropped() {
        let mut frames = Frames::default();
        let mut start = None;
        for i in 0..100 {
            frames.data(&"x".repeat(500));
            let frame = frames.take().unwrap();
            if i == 0 {
                start = Some(frame.as_ptr());
            }
            // Every frame lies in the first buffer: writing wrapped around, nothing new was
            // allocated.
            let offset = frame.as_ptr() as usize - start.unwrap() as usize;
            assert!(offset < BUFFER, "frame {i} at {offset}");
        }
    }

    #[tokio::test]
    async fn a_pause_gets_a_keep_alive_comment_then_the_frames_go_on() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let frames =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            );
        let mut body = KeepAlive::new(frames, Duration::from_millis(30));
        tx.send(Bytes::from_static(b"data: 1\n\n")).await.unwrap();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], b"data: 1\n\n");
        // Nothing for a while: the comment, as axum's keep-alive.
        assert_eq!(&body.next().await.unwrap().unwrap()[..], b":\n\n");
        tx.send(Bytes::from_static(b"data: 2\n\n")).await.unwrap();
        drop(tx);
        assert_eq!(&body.next().await.unwrap().unwrap()[..], b"data: 2\n\n");
        assert!(body.next().await.is_none());
    }
}
