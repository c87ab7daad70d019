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
use crate::threads::SharedMut;

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

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod simd;
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
pub(super) use simd::exp8;

/// Query rows one task attends together (the vector kernels' pass; the scalar code takes one).
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
const MAX_ROWS: usize = simd::MAX_ROWS;
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
)))]
const MAX_ROWS: usize = 1;

/// Length of one thread's score rows for a context of `n_ctx`: [`MAX_ROWS`] rows, each padded
/// to whole lane groups.
pub(super) fn score_row(n_ctx: usize) -> usize {
    MAX_ROWS * row_len(n_ctx)
}

/// One score row: the span of cells from the first lane group any query sees to its last.
fn row_len(n_ctx: usize) -> usize {
    n_ctx + F16Dot::MAX_LANES
}

/// Length of one thread's head scratch: the f16-rounded query heads and the value lanes (8
/// lanes for each of [`MAX_ROWS`] heads, or 32 for one).
pub(super) fn head_scratch(head_dim: usize) -> usize {
    (MAX_ROWS + F16Dot::MAX_LANES) * head_dim
}

/// The shapes and arithmetic of one layer's attention heads.
struct Heads {
    hd: usize,
    /// Width of a token's queries (all heads) and of a cell's keys (all KV heads).
    qd: usize,
    kvd: usize,
    /// Query heads per KV head.
    group: usize,
    /// Scales of the query before its f16 rounding and of the score after.
    pre: f32,
    post: f32,
    dot: F16Dot,
}

/// Causal attention of one segment's queries `q` (n, n_head * head_dim) over its cache into `out`
/// (same shape), in llama.cpp's arithmetic (its default, non-flash path): Q is rounded to f16;
/// each score is an FMA chain per lane over the head, summed in the horizontal order of `f16`'s
/// kernel; the softmax is ggml's ([`ops::softmax_ggml`]) over rows aligned to the lanes; the
/// probabilities are rounded to f16 and the values accumulated in the same lanes by cell.
/// Quantised models amplify any last-bit difference here. Local layers see the last `window`
/// positions only. Parallel over tasks of up to [`MAX_ROWS`] query rows of one KV head (the
/// heads of a GQA group, then the next tokens'), which share every key and value load.
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
    let scale = c.attn_scale();
    let (pre, post) = if c.spec.q_prescale {
        (scale, 1.0)
    } else {
        (1.0, scale)
    };
    let h = Heads {
        hd: c.head_dim,
        qd: c.q_dim(),
        kvd: c.kv_dim(),
        group: c.n_head / c.n_head_kv,
        pre,
        post,
        dot: F16Dot::for_tokens(b.llama_rows),
    };
    let threads = b.m.pool.threads();
    let rows = tasks_rows(&h, seg.n, c.n_head, threads);
    let row_len = row_len(b.n_ctx);
    let n_tasks = c.n_head_kv * (seg.n * h.group).div_ceil(rows);
    let (out_p, scores_p, qh_p) = (
        SharedMut::new(out.as_mut_ptr()),
        SharedMut::new(scores.as_mut_ptr()),
        SharedMut::new(qh.as_mut_ptr()),
    );
    // Each chunk gets at least ~32k multiply-adds, so short contexts stay on the calling thread
    // instead of paying a worker's wake-up.
    let chunk = (32 << 10) / ((seg.pos0 + seg.n) * h.hd * rows).max(1);
    b.m.pool
        .for_chunks(n_tasks, chunk.max(1), &|thread, range| {
            // SAFETY: each thread has its own scratch regions (sized by score_row / head_scratch).
            let (sc, scratch) = unsafe {
                (
                    scores_p.slice_mut(thread * score_row(b.n_ctx), score_row(b.n_ctx)),
                    qh_p.slice_mut(thread * head_scratch(h.hd), head_scratch(h.hd)),
                )
            };
            for task in range {
                // SAFETY: tasks write disjoint (token, head) rows of `out`.
                unsafe {
                    task_rows(
                        &h, seg, kv, window, q, out_p, task, rows, sc, row_len, scratch,
                    )
                };
            }
        });
}

/// Query rows per task: [`MAX_ROWS`] when the kernels take that many, fewer when a task each
/// would leave threads idle (decoding one token).
fn tasks_rows(h: &Heads, n: usize, n_head: usize, threads: usize) -> usize {
    if MAX_ROWS == 1 || !supported(h.hd) {
        return 1;
    }
    (n * n_head / threads.max(1)).clamp(1, MAX_ROWS)
}

/// Whether the vector kernels take heads of `head_dim`.
fn supported(head_dim: usize) -> bool {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    return simd::supports(head_dim);
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    {
        let _ = head_dim;
        false
    }
}

/// Task `task` of [`attend`]: rows `task * rows..` of its KV head's rows (token-major, then the
/// group's heads), so consecutive rows share their keys and values.
///
/// # Safety
/// `out` points at the segment's (n, qd) output, and no other task writes these rows.
#[allow(clippy::too_many_arguments)]
unsafe fn task_rows(
    h: &Heads,
    seg: &Segment,
    kv: &LayerKv,
    window: Option<usize>,
    q: &[f32],
    out: SharedMut<f32>,
    task: usize,
    rows: usize,
    sc: &mut [f32],
    row_len: usize,
    scratch: &mut [f32],
) {
    let per_kv = (seg.n * h.group).div_ceil(rows);
    let (kh, first_row) = (task / per_kv, (task % per_kv) * rows);
    let all = (first_row..(first_row + rows).min(seg.n * h.group)).map(|r| {
        let (t, j) = (r / h.group, r % h.group);
        let head = kh * h.group + j;
        let pos = seg.pos0 + t;
        let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let qrow = &q[t * h.qd + head * h.hd..t * h.qd + (head + 1) * h.hd];
        // SAFETY: (t, head) is this task's own output row (the caller's contract).
        let o = out.slice_mut(t * h.qd + head * h.hd, h.hd);
        (first, pos, qrow, o)
    });
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    if supported(h.hd) {
        let (qs, acc) = scratch.split_at_mut(MAX_ROWS * h.hd);
        let mut list: [simd::Row; MAX_ROWS] = std::array::from_fn(|_| simd::Row {
            first: 0,
            pos: 0,
            out: &mut [],
        });
        let mut nr = 0;
        for (first, pos, qrow, o) in all {
            simd::round_query(qrow, h.pre, &mut qs[nr * h.hd..(nr + 1) * h.hd]);
            list[nr] = simd::Row { first, pos, out: o };
            nr += 1;
        }
        simd::pass(h, kv, kh, qs, &mut list[..nr], sc, row_len, acc);
        return;
    }
    for (first, pos, qrow, o) in all {
        head_scalar(h, kv, kh, first, pos, qrow, o, sc, scratch);
    }
}

/// One query row the scalar way (the reference of the vector kernels): scores of `q` against
/// the cells `first..=pos` of KV head `kh` into `sc`, their softmax, the values into `out`.
#[allow(clippy::too_many_arguments)]
fn head_scalar(
    h: &Heads,
    kv: &LayerKv,
    kh: usize,
    first: usize,
    pos: usize,
    q: &[f32],
    out: &mut [f32],
    sc: &mut [f32],
    scratch: &mut [f32],
) {
    let (hd, kvd, lanes) = (h.hd, h.kvd, h.dot.lanes());
    // Rows start on a multiple of the lanes so softmax groups and value lanes fall on the same
    // cells as llama.cpp's; entries outside [first, pos] are masked.
    let base = first - first % lanes;
    let len = (pos + 1 - base).div_ceil(lanes) * lanes;
    let sc = &mut sc[..len];
    let (qv, acc) = scratch.split_at_mut(hd);
    let acc = &mut acc[..lanes * hd];
    for (d, &x) in qv.iter_mut().zip(q) {
        *d = f16::from_f32(x * h.pre).to_f32();
    }
    for (i, s) in sc.iter_mut().enumerate() {
        let p = base + i;
        *s = if p < first || p > pos {
            f32::NEG_INFINITY
        } else {
            let cell = kv.cell(p);
            h.dot
                .dot(qv, &kv.k[cell * kvd + kh * hd..cell * kvd + (kh + 1) * hd])
                * h.post
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
    for (d, o) in out.iter_mut().enumerate() {
        *o = h.dot.reduce(|r| acc[r * hd + d]);
    }
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

#[cfg(test)]
mod tests;
