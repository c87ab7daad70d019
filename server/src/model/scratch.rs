//! A session's working memory besides its KV cache: every buffer of one micro-batch of up to
//! [`UBATCH`] tokens, allocated once. [`ScratchLayout`] is the one list of their lengths: the
//! allocation ([`Scratch::new`]) and the memory planner ([`ScratchLayout::bytes`]) both read
//! it, and both destructure it whole, so a buffer added to one and not the other fails to build.

use super::attention;
use super::config::Config;
use super::kv_cache::{MAX_DRAFT, UBATCH};
use super::matmul::Acts;
use super::weights::Weights;

/// RoPE's (cos, sin) of one rotary pair.
pub type CosSin = (f32, f32);

/// Per micro-batch working memory. Shapes in elements, row-major; `ubatch` is [`UBATCH`],
/// `lanes` the widest f16 dot of [`attention`].
pub struct Scratch {
    pub x: Vec<f32>,              // (ubatch, n_embd) residual stream
    pub xn: Vec<f32>,             // (ubatch, n_embd) normalised block input
    pub q: Vec<f32>,              // (ubatch, n_head * head_dim) queries
    pub k: Vec<f32>,              // (ubatch, n_head_kv * head_dim) keys
    pub v: Vec<f32>,              // (ubatch, n_head_kv * head_dim) values
    pub attn: Vec<f32>,           // (ubatch, n_head * head_dim) attention output
    pub o: Vec<f32>,              // (ubatch, n_embd) block output, before the residual
    pub gate: Vec<f32>,           // (ubatch, n_ff) gate, then act(gate) * up
    pub up: Vec<f32>,             // (ubatch, n_ff)
    pub logits: Vec<f32>,         // (1 + MAX_DRAFT, n_vocab) after the last token(s)
    pub scores: Vec<f32>,         // (threads, n_ctx + lanes) one query's scores
    pub qh: Vec<f32>,             // (threads, 1 + lanes, head_dim) f16 query, value lanes
    pub rope_global: Vec<CosSin>, // (ubatch, n_rot / 2) at the global base
    pub rope_local: Vec<CosSin>,  // (ubatch, n_rot / 2) at the local base, or empty
    pub acts: Acts,               // the input in each weight type's dot format
}

/// The lengths of [`Scratch`]'s buffers (in elements; `acts` in bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchLayout {
    x: usize,
    xn: usize,
    q: usize,
    k: usize,
    v: usize,
    attn: usize,
    o: usize,
    gate: usize,
    up: usize,
    logits: usize,
    scores: usize,
    qh: usize,
    rope_global: usize,
    rope_local: usize,
    acts: usize,
}

impl ScratchLayout {
    pub fn new(c: &Config, w: &Weights, threads: usize, n_ctx: usize) -> ScratchLayout {
        let b = UBATCH;
        let rope = b * c.n_rot / 2;
        ScratchLayout {
            x: b * c.n_embd,
            xn: b * c.n_embd,
            q: b * c.q_dim(),
            k: b * c.kv_dim(),
            v: b * c.kv_dim(),
            attn: b * c.q_dim(),
            o: b * c.n_embd,
            gate: b * c.n_ff,
            up: b * c.n_ff,
            logits: (1 + MAX_DRAFT) * c.n_vocab,
            scores: threads * attention::score_row(n_ctx),
            qh: threads * attention::head_scratch(c.head_dim),
            rope_global: rope,
            rope_local: if c.sliding_window.is_some() { rope } else { 0 },
            acts: Acts::bytes_for(w.matrices(), UBATCH),
        }
    }

    /// Bytes [`Scratch::new`] allocates for this layout (the memory planner's figure).
    pub fn bytes(&self) -> u64 {
        let ScratchLayout {
            x,
            xn,
            q,
            k,
            v,
            attn,
            o,
            gate,
            up,
            logits,
            scores,
            qh,
            rope_global,
            rope_local,
            acts,
        } = *self;
        let f32s = x + xn + q + k + v + attn + o + gate + up + logits + scores + qh;
        let pairs = rope_global + rope_local;
        (f32s * size_of::<f32>() + pairs * size_of::<CosSin>() + acts) as u64
    }
}

impl Scratch {
    pub fn new(layout: ScratchLayout, w: &Weights) -> Scratch {
        let ScratchLayout {
            x,
            xn,
            q,
            k,
            v,
            attn,
            o,
            gate,
            up,
            logits,
            scores,
            qh,
            rope_global,
            rope_local,
            acts,
        } = layout;
        let z = |len| resident(0f32, len);
        let acts_buf = Acts::new(w.matrices(), UBATCH);
        debug_assert_eq!(Acts::bytes_for(w.matrices(), UBATCH), acts);
        Scratch {
            x: z(x),
            xn: z(xn),
            q: z(q),
            k: z(k),
            v: z(v),
            attn: z(attn),
            o: z(o),
            gate: z(gate),
            up: z(up),
            logits: z(logits),
            scores: z(scores),
            qh: z(qh),
            rope_global: resident((0.0, 0.0), rope_global),
            rope_local: resident((0.0, 0.0), rope_local),
            acts: acts_buf,
        }
    }
}

/// `len` copies of `zero` in memory that is already resident. A zeroed allocation is the
/// kernel's shared zero page until written, so a session's buffers would otherwise become
/// memory piecemeal, request by request (a second slot's first prompt added ~7 MiB of RssAnon to
/// a running server): touched here, a session holds what the memory plan counts from its start.
pub(super) fn resident<T: Copy>(zero: T, len: usize) -> Vec<T> {
    let mut v = vec![zero; len];
    let per_page = (4096 / size_of::<T>().max(1)).max(1);
    for i in (0..len).step_by(per_page) {
        // SAFETY: i < len. Volatile, so the store is not elided as writing what is already there.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), zero) };
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Gguf;

    /// What a [`Scratch`] holds, counted from its buffers: every field named, so a new one
    /// must be counted here too.
    fn held_bytes(s: &Scratch, acts: usize) -> u64 {
        let Scratch {
            x,
            xn,
            q,
            k,
            v,
            attn,
            o,
            gate,
            up,
            logits,
            scores,
            qh,
            rope_global,
            rope_local,
            acts: _,
        } = s;
        let f32s = [x, xn, q, k, v, attn, o, gate, up, logits, scores, qh];
        let f32s: usize = f32s.iter().map(|b| b.len()).sum();
        let pairs = rope_global.len() + rope_local.len();
        (f32s * 4 + pairs * 8 + acts) as u64
    }

    #[test]
    fn the_planners_bytes_are_the_allocated_bytes() {
        for name in ["synth-gemma3-q8_0.gguf", "synth-llama-q4_k_m.gguf"] {
            let g = Gguf::open(&test_support::synth(name)).unwrap();
            let c = Config::from_gguf(&g).unwrap();
            let w = Weights::load(&g, &c).unwrap();
            let layout = ScratchLayout::new(&c, &w, 3, 200);
            let s = Scratch::new(layout, &w);
            assert_eq!(layout.bytes(), held_bytes(&s, layout.acts), "{name}");
            assert_eq!(
                s.rope_local.is_empty(),
                c.sliding_window.is_none(),
                "{name}"
            );
        }
    }
}
