//! The attention block of one layer over one micro-batch: pre-norm, Q/K/V projections, per-head
//! norms and RoPE, the keys and values into the cache, causal attention over the cache, output
//! projection and post-norm. What differs by architecture comes from its
//! [`ArchSpec`](super::arch::ArchSpec) row, through the config and the weights present.

use half::f16;

use super::arch::RopeStyle;
use super::kv_cache::{KvCache, LayerKv};
use super::ops;
use super::scratch::{CosSin, Scratch};
use super::session::{Batch, Segment};
use super::weights::Layer;

/// `s.o = post_norm(wo · attention(rope(qk_norm(q, k)), v))` with q, k, v projected from
/// `norm(s.x)`, for the batch's tokens at layer `il`. The projections take every row of the
/// batch at once; each segment's keys and values go into its own cache (`kvs`, one per segment),
/// which its queries attend over.
pub(super) fn block(b: &Batch, il: usize, l: &Layer, kvs: &mut [&mut KvCache], s: &mut Scratch) {
    let c = &b.m.config;
    let n = b.n;

    b.rms_norm(&s.x, &l.attn_norm, &mut s.xn);
    s.acts.invalidate();
    for (mat, bias, out) in [
        (&l.wq, &l.bq, &mut s.q),
        (&l.wk, &l.bk, &mut s.k),
        (&l.wv, &l.bv, &mut s.v),
    ] {
        b.matmul(&mut s.acts, mat, &s.xn, out, b.llama_rows);
        if let Some(bias) = bias {
            for row in out[..n * mat.rows].chunks_exact_mut(mat.rows) {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
        }
    }

    let window = c.window(il);
    let rope = if window.is_some() {
        &s.rope_local
    } else {
        &s.rope_global
    };
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    norm_and_rotate(b, &mut s.q[..n * qd], l.q_norm.as_deref(), rope);
    norm_and_rotate(b, &mut s.k[..n * kvd], l.k_norm.as_deref(), rope);

    for (seg, kv) in b.segments.iter().zip(kvs.iter_mut()) {
        let kv = &mut kv.layers[il];
        for t in (0..seg.n).filter(|t| seg.pos0 + t >= seg.kept) {
            let cell = kv.cell(seg.pos0 + t) * kvd;
            let row = (seg.row0 + t) * kvd..(seg.row0 + t + 1) * kvd;
            for (dst, &x) in kv.k[cell..cell + kvd].iter_mut().zip(&s.k[row.clone()]) {
                *dst = f16::from_f32(x);
            }
            for (dst, &x) in kv.v[cell..cell + kvd].iter_mut().zip(&s.v[row]) {
                *dst = f16::from_f32(x);
            }
        }
        let rows = seg.row0 * qd..(seg.row0 + seg.n) * qd;
        attend(
            b,
            seg,
            kv,
            window,
            &s.q[rows.clone()],
            &mut s.attn[rows],
            &mut s.scores,
            &mut s.qh,
        );
    }

    s.acts.invalidate();
    b.matmul(&mut s.acts, &l.wo, &s.attn, &mut s.o, b.llama_rows);
    b.post_norm(l.post_attn_norm.as_deref(), &mut s.o);
}

/// Per-head RMSNorm (where the layer has its weight), then RoPE, of every head of every token
/// in `x` (n tokens of whole heads).
fn norm_and_rotate(b: &Batch, x: &mut [f32], norm: Option<&[f32]>, rope: &[CosSin]) {
    let c = &b.m.config;
    let half = c.n_rot / 2;
    let rotate = match c.spec.rope {
        RopeStyle::Neox => ops::rope_neox,
        RopeStyle::Normal => ops::rope_normal,
    };
    let width = x.len() / b.n;
    for (t, token) in x.chunks_exact_mut(width).enumerate() {
        let cs = &rope[t * half..(t + 1) * half];
        for head in token.chunks_exact_mut(c.head_dim) {
            if let Some(w) = norm {
                ops::rms_norm_inplace(head, w, c.norm_eps);
            }
            rotate(head, c.n_rot, cs);
        }
    }
}

/// Length of one thread's score row for a context of `n_ctx` (padded to whole lane groups).
pub(super) fn score_row(n_ctx: usize) -> usize {
    n_ctx + F16Dot::MAX_LANES
}

/// Length of one thread's head scratch: the f16-rounded query head and the value lanes.
pub(super) fn head_scratch(head_dim: usize) -> usize {
    (1 + F16Dot::MAX_LANES) * head_dim
}

/// A raw pointer shared by attention tasks that write disjoint (token, head) slices.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: each task writes only its own (token, head) output slice and its own thread's scratch.
unsafe impl Sync for SharedMut {}
unsafe impl Send for SharedMut {}

/// Causal attention of one segment's queries `q` (n, n_head * head_dim) over its cache into `out`
/// (same shape), parallel over (token, head), in llama.cpp's arithmetic (its default, non-flash
/// path): Q is rounded to f16; each score is an FMA chain per lane over the head, summed in the
/// horizontal order of `f16`'s kernel; the softmax is ggml's ([`ops::softmax_ggml`]) over rows
/// aligned to the lanes; the probabilities are rounded to f16 and the values accumulated in the
/// same lanes by cell. Quantised models amplify any last-bit difference here. Local layers see
/// the last `window` positions only.
#[allow(clippy::too_many_arguments)]
fn attend(
    b: &Batch,
    seg: &Segment,
    kv: &LayerKv,
    window: Option<usize>,
    q: &[f32],
    out: &mut [f32],
    scores: &mut [f32],
    qh: &mut [f32],
) {
    let c = &b.m.config;
    let (n, pos0) = (seg.n, seg.pos0);
    let (hd, qd, kvd) = (c.head_dim, c.q_dim(), c.kv_dim());
    let group = c.n_head / c.n_head_kv;
    let scale = c.attn_scale();
    let (pre, post) = if c.spec.q_prescale {
        (scale, 1.0)
    } else {
        (1.0, scale)
    };
    let f16 = F16Dot::for_tokens(b.llama_rows);
    let row = score_row(b.n_ctx);
    let lanes = f16.lanes();
    let per_thread = head_scratch(hd);
    let (out_p, scores_p, qh_p) = (
        SharedMut(out.as_mut_ptr()),
        SharedMut(scores.as_mut_ptr()),
        SharedMut(qh.as_mut_ptr()),
    );
    // Each chunk gets at least ~32k multiply-adds, so short contexts stay on the calling thread
    // instead of paying a worker's wake-up.
    let chunk = (32 << 10) / ((pos0 + n) * hd).max(1);
    b.m.pool
        .for_chunks(n * c.n_head, chunk.max(1), &|thread, range| {
            let (out_p, scores_p, qh_p) = (out_p, scores_p, qh_p);
            for task in range {
                let (t, h) = (task / c.n_head, task % c.n_head);
                let pos = pos0 + t;
                let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                // Rows start on a multiple of the lanes so softmax groups and value lanes fall on
                // the same cells as llama.cpp's; entries outside [first, pos] are masked.
                let base = first - first % lanes;
                let len = (pos + 1 - base).div_ceil(lanes) * lanes;
                // SAFETY: per-thread scratch regions and per-(t, h) output slices are disjoint.
                let (sc, qv, acc, o) = unsafe {
                    let scratch = qh_p.0.add(thread * per_thread);
                    (
                        std::slice::from_raw_parts_mut(scores_p.0.add(thread * row), len),
                        std::slice::from_raw_parts_mut(scratch, hd),
                        std::slice::from_raw_parts_mut(scratch.add(hd), lanes * hd),
                        std::slice::from_raw_parts_mut(out_p.0.add(t * qd + h * hd), hd),
                    )
                };
                let qsrc = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                for (d, &x) in qv.iter_mut().zip(qsrc) {
                    *d = f16::from_f32(x * pre).to_f32();
                }
                let kh = h / group;
                for (i, s) in sc.iter_mut().enumerate() {
                    let p = base + i;
                    *s = if p < first || p > pos {
                        f32::NEG_INFINITY
                    } else {
                        let cell = kv.cell(p);
                        f16.dot(qv, &kv.k[cell * kvd + kh * hd..cell * kvd + (kh + 1) * hd]) * post
                    };
                }
                ops::softmax_ggml(sc);
                acc.iter_mut().for_each(|v| *v = 0.0);
                for (i, &p) in sc.iter().enumerate() {
                    let at = base + i;
                    if at < first || at > pos {
                        continue; // a zero probability adds exactly nothing
                    }
                    let p = f16::from_f32(p).to_f32();
                    let cell = kv.cell(at);
                    let v = &kv.v[cell * kvd + kh * hd..cell * kvd + (kh + 1) * hd];
                    let lane = &mut acc[(i % lanes) * hd..(i % lanes + 1) * hd];
                    for (a, &v) in lane.iter_mut().zip(v) {
                        *a = p.mul_add(v.to_f32(), *a);
                    }
                }
                for (d, o) in o.iter_mut().enumerate() {
                    *o = f16.reduce(|r| acc[r * hd + d]);
                }
            }
        });
}

/// How llama.cpp's non-flash attention multiplies its f16 matrices (K·Q and V·P): through
/// tinyBLAS, which declines single-column products (`n < 2`), or else ggml's `ggml_vec_dot_f16`.
/// Both chain FMAs per lane (lane r takes elements r, r + lanes, …) but with different lane
/// counts and horizontal sums, so the last bits of every score depend on which one runs.
#[derive(Clone, Copy)]
enum F16Dot {
    /// tinyBLAS: 8 lanes, ggml's `hsum` order.
    TinyBlas,
    /// `ggml_vec_dot_f16`: four 8-lane accumulators over steps of 32, i.e. 32 lanes.
    VecDot,
}

impl F16Dot {
    const MAX_LANES: usize = 32;

    /// The kernel for a llama.cpp batch of `tokens` tokens (one query column per token).
    fn for_tokens(tokens: usize) -> F16Dot {
        if tokens < 2 {
            F16Dot::VecDot
        } else {
            F16Dot::TinyBlas
        }
    }

    fn lanes(self) -> usize {
        match self {
            F16Dot::TinyBlas => 8,
            F16Dot::VecDot => 32,
        }
    }

    /// The horizontal sum of lanes `lane(0..self.lanes())`.
    #[inline]
    fn reduce(self, lane: impl Fn(usize) -> f32) -> f32 {
        match self {
            F16Dot::TinyBlas => ops::hsum8(&std::array::from_fn(lane)),
            F16Dot::VecDot => ops::hsum32_f16_vec(&std::array::from_fn(lane)),
        }
    }

    /// `q · k`, on values already rounded to f16.
    fn dot(self, q: &[f32], k: &[f16]) -> f32 {
        // A constant lane count per kernel, so each chain compiles to vector FMAs.
        let (sum, tail) = match self {
            F16Dot::TinyBlas => {
                let (lanes, tail) = lane_sums::<8>(q, k);
                (self.reduce(|r| lanes[r]), tail)
            }
            F16Dot::VecDot => {
                let (lanes, tail) = lane_sums::<32>(q, k);
                (self.reduce(|r| lanes[r]), tail)
            }
        };
        // Heads of a multiple of 32 (every supported model) have no tail; ggml adds one in f64.
        (f64::from(sum) + tail) as f32
    }
}

/// FMA chains of `q · k` in N lanes (lane r takes elements r, r + N, …), and the products of the
/// elements past the last whole group of N summed in f64.
fn lane_sums<const N: usize>(q: &[f32], k: &[f16]) -> ([f32; N], f64) {
    let mut lanes = [0f32; N];
    let (qs, ks) = (q.chunks_exact(N), k.chunks_exact(N));
    let tail = qs
        .remainder()
        .iter()
        .zip(ks.remainder())
        .map(|(&q, k)| f64::from(q * k.to_f32()))
        .sum();
    for (qc, kc) in qs.zip(ks) {
        for r in 0..N {
            lanes[r] = qc[r].mul_add(kc[r].to_f32(), lanes[r]);
        }
    }
    (lanes, tail)
}
