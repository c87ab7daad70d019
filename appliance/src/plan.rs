//! How much memory the server needs for a profile's model, context and slots.
//!
//! This is the appliance's own conservative estimate, used to check the profile's limits before
//! an image is built. It lives here and nowhere else so it can be replaced by the server's planner
//! (`llm_server::plan`), which knows the exact layout, once that exists: the profile checks call
//! only [`requirement`].

use crate::profile::{Model, Server};

pub const MIB: u64 = 1 << 20;

/// Bytes of one f16 element of the KV cache.
const KV_ELEMENT_BYTES: u64 = 2;
/// Bytes of one f32 activation or logit.
const F32_BYTES: u64 = 4;
/// Embedding-wide f32 rows of activations held per prompt token during prefill: residual, norms,
/// Q/K/V, attention output and the feed-forward intermediates (several embeddings wide). An upper
/// bound for the dense models the server runs, not a measurement.
const ACTIVATION_ROWS_PER_TOKEN: u64 = 16;
/// The process itself: code, the tokenizer's tables, thread stacks, allocator slack.
const RUNTIME_BYTES: u64 = 32 * MIB;

/// The parts of the server's memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// The memory-mapped GGUF file: page cache charged to the server's cgroup.
    pub weights: u64,
    /// Keys and values for every layer, token and slot, all at full context (a sliding-window
    /// ring would need less, so this over-counts).
    pub kv_cache: u64,
    /// Activations for a full-context prefill plus one row of logits per slot.
    pub scratch: u64,
    pub runtime: u64,
}

impl Requirement {
    pub fn total(&self) -> u64 {
        [self.weights, self.kv_cache, self.scratch, self.runtime]
            .iter()
            .fold(0, |acc, &b| acc.saturating_add(b))
    }
}

/// The memory the server needs to serve `model` with the server's context and slots.
pub fn requirement(model: &Model, server: &Server) -> Requirement {
    let ctx = u64::from(server.ctx_size);
    let slots = u64::from(server.parallel);
    let keys_and_values = 2;
    Requirement {
        weights: model.size_bytes,
        kv_cache: product(&[
            keys_and_values,
            model.layers,
            model.kv_heads,
            model.head_dim,
            KV_ELEMENT_BYTES,
            ctx,
            slots,
        ]),
        scratch: product(&[ctx, model.embedding, F32_BYTES, ACTIVATION_ROWS_PER_TOKEN])
            .saturating_add(product(&[slots, model.vocab, F32_BYTES])),
        runtime: RUNTIME_BYTES,
    }
}

/// Saturating, so an absurd profile yields "does not fit" instead of an overflow.
fn product(factors: &[u64]) -> u64 {
    factors.iter().fold(1, |acc, &f| acc.saturating_mul(f))
}
