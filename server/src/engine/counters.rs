//! What the engine counts as it works. The front end creates the counters before the model is
//! loaded (so that they can be read while it loads) and renders them (`/metrics`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Counters {
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
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
}

impl Counters {
    pub fn add_prefill(&self, d: Duration) {
        self.prefill_nanos.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    pub fn add_decode(&self, d: Duration) {
        self.decode_nanos.fetch_add(d.as_nanos() as u64, Relaxed);
    }
}
