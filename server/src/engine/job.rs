//! What crosses between a front end and the decode thread: the job going in, its output
//! coming out, and why a job was refused.
//!
//! The output travels through a pipe of its own per job rather than a channel of owned events:
//! the decode thread appends each piece of text (and its log-probabilities) to a buffer and
//! wakes the owner, and the owner swaps that buffer for its own emptied one. No token costs an
//! allocation once both buffers have grown, pieces the owner has not read yet merge into one
//! (a client that reads slowly holds one growing text, not a queue of strings), and the text
//! always comes before the end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use super::generation::{FinishReason, Generation, Usage};
use crate::sampler::TokenLogprob;

/// A generation request, tokenized and validated.
pub(super) struct Job {
    pub prompt: Vec<u32>,
    pub generation: Generation,
    /// When the request must be done, queueing included.
    pub deadline: Instant,
    pub output: Output,
}

/// What [`Events::recv`] reports, in order: text (any number of times), then one end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// New completion text (never part of a stop sequence) is in the [`Piece`], with the
    /// log-probabilities of the tokens generated since the last piece (when asked for; a token
    /// whose text is held back, e.g. half a UTF-8 character, comes with a later piece).
    Text,
    End(End),
}

/// How a job ended, as the decode thread reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The job ran to its end.
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    Failed(JobFailure),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobFailure {
    /// The per-request time limit passed.
    Timeout,
    /// The server is shutting down and its deadline for in-flight work passed.
    ShuttingDown,
    /// The engine failed; the message is for the log.
    Engine(String),
}

/// Why [`Engine::submit`](super::Engine::submit) refused a job.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No token to start from.
    EmptyPrompt,
    /// The prompt leaves no room in the context for a generated token (nothing is truncated).
    PromptTooLong {
        tokens: usize,
        n_ctx: usize,
    },
    /// Every slot is busy and the queue is full.
    QueueFull {
        queue: usize,
    },
    ShuttingDown,
}

/// The text [`Events::recv`] hands over: replaced, not appended to, at each [`Event::Text`].
/// Its buffers go back into the pipe at the next call, so keep one per job.
#[derive(Debug, Default)]
pub struct Piece {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

impl Piece {
    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.logprobs.is_empty()
    }

    fn clear(&mut self) {
        self.text.clear();
        self.logprobs.clear();
    }
}

/// One job's pipe, shared by its two ends.
struct Pipe {
    state: Mutex<PipeState>,
    /// Woken by the decode thread after each change; one waiter, the owner.
    wake: Notify,
    /// The owner went away: the job is cancelled.
    closed: AtomicBool,
    /// Whether text wakes the owner (the end always does).
    wake_on_text: AtomicBool,
}

struct PipeState {
    /// Sent and not yet received.
    pending: Piece,
    end: Option<End>,
    /// Nothing more will come: the end was received, or the decode thread let go of the job.
    over: bool,
}

impl Pipe {
    fn lock(&self) -> MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A new job's two ends.
pub(super) fn pipe() -> (Output, Events) {
    let pipe = Arc::new(Pipe {
        state: Mutex::new(PipeState {
            pending: Piece::default(),
            end: None,
            over: false,
        }),
        wake: Notify::new(),
        closed: AtomicBool::new(false),
        wake_on_text: AtomicBool::new(true),
    });
    (Output { pipe: pipe.clone() }, Events { pipe })
}

/// The decode thread's end of a job's pipe. Dropping it without [`Output::end`] makes the
/// owner's [`Events::recv`] return `None`.
pub(super) struct Output {
    pipe: Arc<Pipe>,
}

impl Output {
    /// Appends `text` and moves in `logprobs` (left empty, its capacity kept).
    pub fn text(&self, text: &str, logprobs: &mut Vec<TokenLogprob>) {
        let mut state = self.pipe.lock();
        state.pending.text.push_str(text);
        state.pending.logprobs.append(logprobs);
        drop(state);
        if self.pipe.wake_on_text.load(Ordering::Relaxed) {
            self.pipe.wake.notify_one();
        }
    }

    /// The job's last report.
    pub fn end(&self, end: End) {
        self.pipe.lock().end = Some(end);
        self.pipe.wake.notify_one();
    }

    /// Whether the owner went away (the client disconnected).
    pub fn is_closed(&self) -> bool {
        self.pipe.closed.load(Ordering::Relaxed)
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        self.pipe.lock().over = true;
        self.pipe.wake.notify_one();
    }
}

/// The owner's end of a job's pipe. Dropping it cancels the job: its slot is freed at its
/// next step.
pub struct Events {
    pipe: Arc<Pipe>,
}

impl Events {
    /// From now on text does not wake the owner, only the end does: for an answer sent
    /// whole, where a wake-up per token only costs a context switch on the CPUs that decode.
    /// The text still comes first, merged into one piece.
    pub fn wake_only_at_end(&mut self) {
        self.pipe.wake_on_text.store(false, Ordering::Relaxed);
    }

    /// Waits for what the job reports next. With [`Event::Text`], `piece` holds the text since
    /// the last call; `None`: the decode thread dropped the job without saying how it ended.
    pub async fn recv(&mut self, piece: &mut Piece) -> Option<Event> {
        loop {
            if let Some(event) = self.try_recv(piece) {
                return event;
            }
            // A wake-up between the check and this wait is kept by `Notify` as a permit.
            self.pipe.wake.notified().await;
        }
    }

    /// What [`Events::recv`] returns if something is there; `None`: nothing yet.
    fn try_recv(&mut self, piece: &mut Piece) -> Option<Option<Event>> {
        let mut state = self.pipe.lock();
        if !state.pending.is_empty() {
            // The emptied buffers go back, so neither end allocates once they have grown.
            piece.clear();
            std::mem::swap(&mut state.pending, piece);
            return Some(Some(Event::Text));
        }
        if let Some(end) = state.end.take() {
            state.over = true;
            return Some(Some(Event::End(end)));
        }
        state.over.then_some(None)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.pipe.closed.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(events: &mut Events, piece: &mut Piece) -> Option<Event> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(events.recv(piece))
    }

    #[test]
    fn pieces_merge_and_come_before_the_end() {
        let (output, mut events) = pipe();
        let mut logprobs = Vec::new();
        output.text("Hel", &mut logprobs);
        output.text("lo", &mut logprobs);
        let usage = Usage::default();
        output.end(End::Done {
            finish: FinishReason::Length,
            usage,
        });
        let mut piece = Piece::default();
        assert_eq!(recv(&mut events, &mut piece), Some(Event::Text));
        assert_eq!(piece.text, "Hello");
        let done = Event::End(End::Done {
            finish: FinishReason::Length,
            usage,
        });
        assert_eq!(recv(&mut events, &mut piece), Some(done));
        // After the end the pipe is over, though the decode thread still holds its end.
        assert_eq!(recv(&mut events, &mut piece), None);
        drop(output);
    }

    #[test]
    fn a_piece_is_replaced_not_extended() {
        let (output, mut events) = pipe();
        let mut piece = Piece::default();
        output.text("one", &mut Vec::new());
        assert_eq!(recv(&mut events, &mut piece), Some(Event::Text));
        output.text("two", &mut Vec::new());
        assert_eq!(recv(&mut events, &mut piece), Some(Event::Text));
        assert_eq!(piece.text, "two");
    }

    #[test]
    fn a_dropped_job_ends_the_events_without_an_end() {
        let (output, mut events) = pipe();
        output.text("x", &mut Vec::new());
        drop(output);
        let mut piece = Piece::default();
        assert_eq!(recv(&mut events, &mut piece), Some(Event::Text));
        assert_eq!(recv(&mut events, &mut piece), None);
    }

    #[test]
    fn dropping_the_events_cancels() {
        let (output, events) = pipe();
        assert!(!output.is_closed());
        drop(events);
        assert!(output.is_closed());
    }

    #[test]
    fn an_owner_waking_only_at_the_end_gets_the_text_merged_first() {
        let (output, mut events) = pipe();
        events.wake_only_at_end();
        let sender = std::thread::spawn(move || {
            for word in ["one ", "two"] {
                std::thread::sleep(std::time::Duration::from_millis(20));
                output.text(word, &mut Vec::new());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            output.end(End::Failed(JobFailure::Timeout));
        });
        let mut piece = Piece::default();
        assert_eq!(recv(&mut events, &mut piece), Some(Event::Text));
        assert_eq!(piece.text, "one two");
        let failed = Event::End(End::Failed(JobFailure::Timeout));
        assert_eq!(recv(&mut events, &mut piece), Some(failed));
        sender.join().unwrap();
    }

    #[test]
    fn a_waiting_owner_is_woken_from_another_thread() {
        let (output, mut events) = pipe();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            output.text("late", &mut Vec::new());
            output.end(End::Failed(JobFailure::Timeout));
        });
        let mut piece = Piece::default();
        assert_eq!(recv(&mut events, &mut piece), Some(Event::Text));
        assert_eq!(piece.text, "late");
        let failed = Event::End(End::Failed(JobFailure::Timeout));
        assert_eq!(recv(&mut events, &mut piece), Some(failed));
        sender.join().unwrap();
    }
}
