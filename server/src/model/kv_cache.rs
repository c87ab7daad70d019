//! The KV cache of one session: f16 keys and values per layer, allocated once. Global layers
//! hold the whole context; sliding-window layers hold a ring of the window plus one micro-batch
//! (a batch writes all its keys before attending, so the ring must not wrap inside it) plus
//! [`REWIND`] cells, so that a conversation can be resumed a little before its end.

use half::f16;

use super::config::Config;

/// Tokens evaluated together in one pass over the weights during prompt processing. Each pass
/// packs every weight panel of prefill's GEMMs once (quant/simd/panel_gemm.rs) and reads the
/// keys and values once per layer, so a larger micro-batch spreads both over more tokens: 64
/// read 1B-shaped prompts clearly faster than 32; 128 was no faster and doubles the per-token
/// buffers (~5 MiB at 64 for 1B shapes).
pub const UBATCH: usize = 64;

/// Tokens llama.cpp evaluates as one batch (its n_batch and n_ubatch, 512 by default): how many
/// activation rows its matmuls see, which decides their float order ([`DotOrder::of`]).
/// A multiple of [`UBATCH`], so micro-batches never straddle two of them.
///
/// [`DotOrder::of`]: crate::quant::DotOrder::of
pub const LLAMA_BATCH: usize = 512;

/// Positions a cached conversation can be rewound by and resumed in a sliding-window layer. A
/// chat's next turn usually shares the whole cache (the prompt, then the answer as generated),
/// but a client that trims the answer's whitespace, or an answer cut by a stop sequence, diverges
/// a few tokens before its end; past the window, a ring has overwritten what an earlier position
/// needs. 128 cells cost 64 KiB per sliding layer of a one-KV-head Gemma 3 (~1 MiB per slot of
/// the default model), against the window's 512 cells: a full-size window cache (llama.cpp's
/// `--swa-full`) would make any rewind possible but costs 8 MiB per layer at 8192 tokens.
pub const REWIND: usize = 128;

/// Drafted tokens a session verifies in one pass ([`decode_batch`](super::decode_batch)): its
/// logits buffer holds one row more. A pass that rejects them is undone by a rewind, which
/// [`REWIND`] must allow.
pub const MAX_DRAFT: usize = 4;
const _: () = assert!(MAX_DRAFT <= REWIND && MAX_DRAFT < UBATCH);

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

    /// Whether, with positions `0..n_past` written, evaluation can resume at position `n` with a
    /// window of `window` (`None`: every position is attended to): every position the token at
    /// `n` attends to and that comes before `n` must still be in its cell, i.e. not overwritten
    /// by one `cells` later. (Positions from `n` on are written again before they are read.)
    pub fn can_resume(&self, window: Option<usize>, n_past: usize, n: usize) -> bool {
        let first = window.map_or(0, |w| (n + 1).saturating_sub(w));
        n == 0 || first + self.cells >= n_past
    }
}

pub struct KvCache {
    pub layers: Vec<LayerKv>, // (n_layer)
}

/// Cells of layer `il` for a context of `n_ctx`.
pub fn cells(c: &Config, il: usize, n_ctx: usize) -> usize {
    match c.window(il) {
        Some(w) => (w + UBATCH - 1 + REWIND).min(n_ctx),
        None => n_ctx,
    }
}

impl KvCache {
    /// Whether every layer can resume at `n` with `0..n_past` written ([`LayerKv::can_resume`]).
    pub fn can_resume(&self, c: &Config, n_past: usize, n: usize) -> bool {
        self.layers
            .iter()
            .enumerate()
            .all(|(il, l)| l.can_resume(c.window(il), n_past, n))
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(cells: usize) -> LayerKv {
        LayerKv {
            k: Vec::new(),
            v: Vec::new(),
            cells,
        }
    }

    #[test]
    fn a_ring_resumes_only_where_the_window_before_it_is_intact() {
        // A window of 8 in a ring of 40 cells; positions 0..100 written: 60..100 remain.
        let ring = layer(40);
        let w = Some(8);
        assert!(ring.can_resume(w, 100, 100), "at the end");
        // Resuming at 67 reads 60..67: all intact. At 66 it would need 59, overwritten by 99.
        assert!(ring.can_resume(w, 100, 67));
        assert!(!ring.can_resume(w, 100, 66));
        assert!(ring.can_resume(w, 100, 0), "from the start nothing is read");
        // Nothing overwritten yet: anywhere.
        assert!(ring.can_resume(w, 40, 1));
        assert!(
            !ring.can_resume(w, 41, 1),
            "position 0 went when 40 was written"
        );
        // A global layer holds every position.
        assert!(layer(512).can_resume(None, 512, 1));
        assert!(!layer(100).can_resume(None, 101, 5));
    }
}
