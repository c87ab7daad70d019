//! The KV cache of one session: f16 keys and values per layer, allocated once. Global layers
//! hold the whole context; sliding-window layers hold a ring of the window plus one micro-batch
//! (a batch writes all its keys before attending, so the ring must not wrap inside it).

use half::f16;

use super::config::Config;

/// Tokens evaluated together in one pass over the weights during prompt processing.
pub const UBATCH: usize = 32;

/// Tokens llama.cpp evaluates as one batch (its n_batch and n_ubatch, 512 by default): how many
/// activation rows its matmuls see, which decides their float order ([`DotOrder::of`]).
/// A multiple of [`UBATCH`], so micro-batches never straddle two of them.
///
/// [`DotOrder::of`]: crate::quant::DotOrder::of
pub const LLAMA_BATCH: usize = 512;

pub struct LayerKv {
    pub k: Vec<f16>, // (cells, n_head_kv * head_dim)
    pub v: Vec<f16>, // (cells, n_head_kv * head_dim)
    pub cells: usize,
}

impl LayerKv {
    /// The cell that holds position `pos`.
    pub fn cell(&self, pos: usize) -> usize {
        pos % self.cells
    }
}

pub struct KvCache {
    pub layers: Vec<LayerKv>, // (n_layer)
}

/// Cells of layer `il` for a context of `n_ctx`.
pub fn cells(c: &Config, il: usize, n_ctx: usize) -> usize {
    match c.window(il) {
        Some(w) => (w + UBATCH - 1).min(n_ctx),
        None => n_ctx,
    }
}

impl KvCache {
    pub fn new(c: &Config, n_ctx: usize) -> KvCache {
        let layers = (0..c.n_layer)
            .map(|il| {
                let cells = cells(c, il, n_ctx);
                let n = cells * c.kv_dim();
                LayerKv {
                    k: vec![f16::ZERO; n],
                    v: vec![f16::ZERO; n],
                    cells,
                }
            })
            .collect();
        KvCache { layers }
    }

    /// Bytes [`KvCache::new`] allocates (the memory planner's figure).
    pub fn bytes(c: &Config, n_ctx: usize) -> u64 {
        (0..c.n_layer)
            .map(|il| (cells(c, il, n_ctx) * c.kv_dim() * 2 * 2) as u64)
            .sum()
    }
}
