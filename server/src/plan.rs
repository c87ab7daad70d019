//! The memory plan: everything the server will hold, computed from the GGUF header before any
//! weight is read, so a plan that cannot fit is refused with numbers instead of OOM-killed later.

use crate::gguf::{Gguf, Metadata};
use crate::model::{Config, KvCache, ModelError, Session, Weights};
use crate::sampler::Sampler;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    pub n_ctx: usize,
    pub parallel: usize,
    /// Tensor bytes: file-backed, reclaimable page cache (never anonymous, never in zram).
    pub weights_bytes: u64,
    /// KV caches of all slots (anonymous).
    pub kv_bytes: u64,
    /// Per-slot activations, logits, sampler buffers and the most a grammar may hold
    /// ([`crate::grammar::GRAMMAR_STATE_BYTES`]) (anonymous).
    pub scratch_bytes: u64,
    /// Vocabulary and its lookup tables, and the grammar engine's compiled copy of it
    /// (anonymous).
    pub vocab_bytes: u64,
}

impl MemoryPlan {
    /// The plan for serving `g` with `parallel` sessions of `n_ctx` tokens.
    pub fn for_model_file(
        g: &Gguf,
        n_ctx: usize,
        parallel: usize,
    ) -> Result<MemoryPlan, ModelError> {
        let config = Config::from_gguf(g)?;
        let weights = Weights::load(g, &config)?;
        let threads = crate::threads::default_threads().threads;
        let parallel = parallel.max(1);
        let sampler = Sampler::bytes(config.n_vocab);
        // Every slot may generate under a grammar: its worst case is planned, not found.
        let per_slot = Session::scratch_bytes(&config, &weights, threads, n_ctx)
            + sampler
            + crate::grammar::GRAMMAR_STATE_BYTES;
        Ok(MemoryPlan {
            n_ctx,
            parallel,
            weights_bytes: g.tensors.iter().map(|t| t.size as u64).sum(),
            kv_bytes: parallel as u64 * KvCache::bytes(&config, n_ctx),
            scratch_bytes: parallel as u64 * per_slot,
            vocab_bytes: vocab_bytes(&g.metadata),
        })
    }

    /// Anonymous memory: what must fit beside the page cache the weights occupy.
    pub fn anonymous_bytes(&self) -> u64 {
        self.kv_bytes + self.scratch_bytes + self.vocab_bytes
    }

    pub fn total(&self) -> u64 {
        self.weights_bytes + self.anonymous_bytes()
    }

    /// The largest context (a multiple of 256, at most `n_ctx_max`) whose plan fits in
    /// `budget` bytes, if any does.
    pub fn largest_fitting(
        g: &Gguf,
        parallel: usize,
        n_ctx_max: usize,
        budget: u64,
    ) -> Result<Option<MemoryPlan>, ModelError> {
        let mut best = None;
        let (mut lo, mut hi) = (1usize, n_ctx_max / 256);
        while lo <= hi {
            let mid = (lo + hi) / 2;
            let plan = Self::for_model_file(g, mid * 256, parallel)?;
            if plan.total() <= budget {
                best = Some(plan);
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        Ok(best)
    }
}

/// Anonymous bytes per vocabulary token of the grammar engine's compiled vocabulary
/// (llguidance's token trie, built at the first constrained request and kept for the server's
/// life: `grammar::factory`). Measured: a first `response_format` request on Gemma 3 270M
/// (262144 tokens) grew the server's RssAnon by 46 MiB, i.e. 184 bytes per token (commit
/// 75166ea, which also dropped the precomputed slices that cost +63 MiB more).
pub const GRAMMAR_BYTES_PER_TOKEN: u64 = 184;

/// The vocabulary's strings plus per-token table overhead (ids, scores, types, hash entries),
/// plus the grammar engine's copy: every server may get a constrained request, so it is
/// planned, not discovered at the first one.
fn vocab_bytes(md: &Metadata) -> u64 {
    let strings = md.strings("tokenizer.ggml.tokens").unwrap_or(&[]);
    let merges = md.strings("tokenizer.ggml.merges").unwrap_or(&[]);
    let text: usize = strings.iter().chain(merges).map(|s| s.len()).sum();
    let tables = (text + (strings.len() + merges.len()) * 96) as u64;
    tables + strings.len() as u64 * GRAMMAR_BYTES_PER_TOKEN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_grows_with_context_and_slots_and_counts_the_sliding_window_ring() {
        let g = Gguf::open(&test_support::synth("synth-gemma3-q8_0.gguf")).unwrap();
        let a = MemoryPlan::for_model_file(&g, 256, 1).unwrap();
        let b = MemoryPlan::for_model_file(&g, 512, 1).unwrap();
        let c = MemoryPlan::for_model_file(&g, 512, 2).unwrap();
        assert_eq!(a.weights_bytes, b.weights_bytes);
        // 6 layers, 1 KV head of 64: 5 local layers hold a ring of the window (8), a micro-batch
        // but one and the rewind cells, one global layer the whole context; K and V at 2 bytes.
        let per_cell = 64 * 2 * 2;
        let ring = 8 + crate::model::UBATCH - 1 + crate::model::REWIND;
        assert_eq!(a.kv_bytes, ((5 * ring + 256) * per_cell) as u64);
        assert_eq!(b.kv_bytes, ((5 * ring + 512) * per_cell) as u64);
        assert_eq!(c.kv_bytes, 2 * b.kv_bytes);
        assert!(c.scratch_bytes > b.scratch_bytes && b.total() > a.total());
        let fit = MemoryPlan::largest_fitting(&g, 1, 4096, b.total())
            .unwrap()
            .unwrap();
        assert_eq!(fit.n_ctx, 512);
        assert!(MemoryPlan::largest_fitting(&g, 1, 4096, 1000)
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_vocabulary_counts_the_grammar_engines_trie() {
        let g = Gguf::open(&test_support::synth("synth-gemma3-q8_0.gguf")).unwrap();
        let tokens = g.metadata.strings("tokenizer.ggml.tokens").unwrap();
        let plan = MemoryPlan::for_model_file(&g, 256, 1).unwrap();
        let text: u64 = tokens.iter().map(|t| t.len() as u64).sum();
        // Merges aside, the tables cost the text and 96 bytes a token; the trie 184 more.
        let merges = g.metadata.strings("tokenizer.ggml.merges").unwrap_or(&[]);
        let merge_bytes: u64 = merges.iter().map(|m| m.len() as u64 + 96).sum();
        let n = tokens.len() as u64;
        assert_eq!(plan.vocab_bytes, text + n * (96 + 184) + merge_bytes);
        // 46 MiB for the 262144-token Gemma 3 vocabulary, as measured.
        assert_eq!(262144 * GRAMMAR_BYTES_PER_TOKEN, 46 << 20);
    }
}
