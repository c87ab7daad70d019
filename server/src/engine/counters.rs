//! What the engine counts as it works. The front end creates the counters before the model is
//! loaded (so that they can be read while it loads) and renders them (`/metrics`).
//!
//! The decode thread's heartbeat is here too: it beats once per round over the slots (one
//! prompt chunk or one token each) and says when it waits for work, so that liveness can be
//! told from the thread itself, not from a timer that would tick on while it hangs.

use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct Counters {
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens taken from a slot's cache instead of evaluated.
    pub cached_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Forward passes that evaluated generated tokens, one of every slot generating at the time.
    pub decode_passes: AtomicU64,
    /// Tokens drafted by prompt lookup and verified, and how many of them were taken.
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// Time spent evaluating prompts.
    pub prefill_nanos: AtomicU64,
    /// Time spent evaluating generated tokens.
    pub decode_nanos: AtomicU64,
    /// Generations stopped because their owner went away (a client disconnected).
    pub cancelled: AtomicU64,
    /// Jobs waiting for a slot.
    pub queue_depth: AtomicU64,
    /// Slots generating.
    pub busy_slots: AtomicU64,
    pub slots: AtomicU64,
    /// When the decode thread last beat, in [`monotonic_nanos`]; 0: it never ran.
    last_beat: AtomicU64,
    /// Whether the decode thread is waiting for work (idle and alive).
    waiting: AtomicBool,
}

/// Nanoseconds on a monotonic clock shared by the process.
fn monotonic_nanos() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    // +1: a beat is never 0, the value of "never beat".
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// What the decode thread is doing, as its heartbeat tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Not started (the model loads) or waiting for work.
    Idle,
    /// Working, last beat this long ago.
    Working(Duration),
}

impl Counters {
    pub fn add_prefill(&self, d: Duration) {
        self.prefill_nanos.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    pub fn add_decode(&self, d: Duration) {
        self.decode_nanos.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    /// Called by the decode thread once per round, holding no lock: it is alive and making
    /// progress.
    pub fn beat(&self) {
        crate::hooks::on_beat();
        self.last_beat.store(monotonic_nanos(), Relaxed);
    }

    /// Runs `wait` (the decode thread's wait for work) marked as idle.
    pub fn idle<T>(&self, wait: impl FnOnce() -> T) -> T {
        self.waiting.store(true, Release);
        let woken = wait();
        // The fresh beat is visible to whoever sees `waiting` false (Release / Acquire), so
        // a reader never takes the time before the wait for a working thread's last beat.
        self.last_beat.store(monotonic_nanos(), Relaxed);
        self.waiting.store(false, Release);
        woken
    }

    pub fn liveness(&self) -> Liveness {
        if self.waiting.load(Acquire) {
            return Liveness::Idle;
        }
        let last = self.last_beat.load(Relaxed);
        if last == 0 {
            return Liveness::Idle;
        }
        Liveness::Working(Duration::from_nanos(monotonic_nanos().saturating_sub(last)))
    }

    /// Whether the decode thread is idle, or working and beat within `limit`.
    pub fn is_alive(&self, limit: Duration) -> bool {
        match self.liveness() {
            Liveness::Idle => true,
            Liveness::Working(since) => since <= limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_tells_idle_working_and_stuck() {
        let c = Counters::default();
        assert_eq!(c.liveness(), Liveness::Idle);
        c.beat();
        assert!(matches!(c.liveness(), Liveness::Working(_)));
        assert!(c.is_alive(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!c.is_alive(Duration::from_millis(10)));
        // Waiting for work is alive however long it lasts.
        c.idle(|| {
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(c.liveness(), Liveness::Idle);
            assert!(c.is_alive(Duration::from_millis(10)));
        });
        assert!(c.is_alive(Duration::from_millis(10)));
    }
}
