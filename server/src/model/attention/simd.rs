//! AVX2/F16C attention: the arithmetic of [`super::head_scalar`] bit for bit, for up to
//! [`MAX_ROWS`] query rows of one KV head at once ("a pass"), so that every key and value row
//! loaded and converted from f16 serves all of them.
//!
//! What makes it identical: lane r of an 8-lane FMA chain is lane r of one ymm accumulator (32
//! lanes: four accumulators, lane r in accumulator r / 8), the horizontal sums are the scalar
//! ones' additions in the same order, the exponential is `exp_ggml` lane for lane, the softmax
//! sums its groups of 8 in f64 in cell order, and the value lanes are accumulated cell by cell
//! in cell order, only over each row's unmasked cells.

use std::arch::x86_64::*;

use half::f16;

use super::{F16Dot, Heads};
use crate::model::kv_cache::LayerKv;

/// Query rows attended together.
pub(super) const MAX_ROWS: usize = 4;

/// One query row of a pass: its f16-rounded query (head_dim values), the positions it sees
/// (`first..=pos`) and where its output goes.
pub(super) struct Row<'a> {
    pub first: usize,
    pub pos: usize,
    pub out: &'a mut [f32],
}

impl Row<'_> {
    /// The first cell of its softmax row: `first` rounded down to the lanes.
    fn base(&self, lanes: usize) -> usize {
        self.first - self.first % lanes
    }

    /// Its softmax row's length: whole lane groups up to `pos`.
    fn len(&self, lanes: usize) -> usize {
        (self.pos + 1 - self.base(lanes)).div_ceil(lanes) * lanes
    }
}

/// Whether the kernels handle heads of `head_dim` (whole 32-lane steps, no tail).
pub(super) fn supports(head_dim: usize) -> bool {
    head_dim.is_multiple_of(32) && head_dim > 0
}

/// Attends `rows` (at most [`MAX_ROWS`], queries in `qs`: one f16-rounded head each, in order)
/// over KV head `kh` of `kv`. `scores` holds [`MAX_ROWS`] score rows of `row_len` (the span
/// `min base..max pos` of the rows fits one), `acc` at least `MAX_ROWS * 8 * head_dim` and
/// `32 * head_dim` values.
#[allow(clippy::too_many_arguments)]
pub(super) fn pass(
    h: &Heads,
    kv: &LayerKv,
    kh: usize,
    qs: &[f32],
    rows: &mut [Row],
    scores: &mut [f32],
    row_len: usize,
    acc: &mut [f32],
) {
    let (hd, lanes) = (h.hd, h.dot.lanes());
    let nr = rows.len();
    assert!(nr <= MAX_ROWS && supports(hd) && qs.len() >= nr * hd);
    assert!(scores.len() >= nr * row_len && acc.len() >= (nr * 8).max(32) * hd);
    let base0 = rows.iter().map(|r| r.base(lanes)).min().unwrap_or(0);
    let lo = rows.iter().map(|r| r.first).min().unwrap_or(0);
    let hi = rows.iter().map(|r| r.pos).max().unwrap_or(0);
    for r in rows.iter() {
        assert!(r.pos >= r.first && r.base(lanes) + r.len(lanes) - base0 <= row_len);
        assert!(r.out.len() == hd);
    }
    assert!(kv.k.len() >= kv.cells * h.kvd && kv.v.len() >= kv.cells * h.kvd);
    assert!((kh + 1) * hd <= h.kvd);
    let koff = kh * hd;
    // SAFETY: the cfg of this module guarantees AVX2, FMA and F16C; every pointer below stays
    // inside the slices checked above (cells are `< kv.cells`, score indices `< row_len`).
    unsafe {
        let q: [*const f32; MAX_ROWS] = std::array::from_fn(|j| qs.as_ptr().add(j.min(nr) * hd));
        let sc: [*mut f32; MAX_ROWS] =
            std::array::from_fn(|j| scores.as_mut_ptr().add(j.min(nr) * row_len));
        let out = |j: usize, p: usize| sc[j].add(p - base0);
        let post = h.post;
        // Cell by cell within runs that do not wrap the ring: a key's address is a stride on,
        // not a division away.
        for (from, to) in runs(lo, hi + 1, kv.cells, hi + 1 - lo) {
            let k = kv.k.as_ptr().add(kv.cell(from) * h.kvd + koff);
            let keys = Keys {
                from,
                to,
                k,
                stride: h.kvd,
            };
            match (h.dot, nr) {
                (F16Dot::TinyBlas, 4) => score_cells::<4, 2, 1>(&q, hd, &keys, out, post),
                (F16Dot::TinyBlas, 3) => score_cells::<3, 2, 1>(&q, hd, &keys, out, post),
                (F16Dot::TinyBlas, 2) => score_cells::<2, 4, 1>(&q, hd, &keys, out, post),
                (F16Dot::TinyBlas, 1) => score_cells::<1, 8, 1>(&q, hd, &keys, out, post),
                (F16Dot::VecDot, _) => {
                    let mut j = 0;
                    while j + 2 <= nr {
                        let q2 = [q[j], q[j + 1]];
                        let o2 = |r: usize, p: usize| out(j + r, p);
                        score_cells::<2, 1, 4>(&q2, hd, &keys, o2, post);
                        j += 2;
                    }
                    if j < nr {
                        let o1 = |_: usize, p: usize| out(j, p);
                        score_cells::<1, 2, 4>(&[q[j]], hd, &keys, o1, post);
                    }
                }
                _ => {}
            }
        }
        for (j, r) in rows.iter().enumerate() {
            let (base, len) = (r.base(lanes), r.len(lanes));
            let row = std::slice::from_raw_parts_mut(sc[j].add(base - base0), len);
            row[..r.first - base].fill(f32::NEG_INFINITY);
            row[r.pos + 1 - base..].fill(f32::NEG_INFINITY);
            softmax_f16(row);
        }
        let value = |p: usize| kv.v.as_ptr().add(kv.cell(p) * h.kvd + koff);
        let prob = |j: usize, p: usize| sc[j].add(p - base0).cast_const();
        let a = acc.as_mut_ptr();
        match h.dot {
            F16Dot::TinyBlas => {
                // Zeroed as one memset (32 KiB for four rows of 256).
                std::ptr::write_bytes(a, 0, nr * 8 * hd);
                // Segments of cells where the same rows are unmasked: the boundaries are the
                // rows' first and one-past-last cells.
                let mut cuts = [0usize; 2 * MAX_ROWS];
                for (j, r) in rows.iter().enumerate() {
                    (cuts[2 * j], cuts[2 * j + 1]) = (r.first, r.pos + 1);
                }
                let cuts = &mut cuts[..2 * nr];
                cuts.sort_unstable();
                for w in cuts.windows(2) {
                    let mut act = [0usize; MAX_ROWS];
                    let mut na = 0;
                    for (j, r) in rows.iter().enumerate() {
                        if r.first <= w[0] && w[1] <= r.pos + 1 {
                            act[na] = j;
                            na += 1;
                        }
                    }
                    for (from, to) in runs(w[0], w[1], kv.cells, 8 * 8) {
                        let (v, s) = (value(from), h.kvd);
                        let accs = |i: usize| a.add(act[i] * 8 * hd);
                        let pr = |i: usize| prob(act[i], from);
                        match na {
                            1 => values::<1, 8, 4>(hd, to - from, from, v, s, accs, pr),
                            2 => values::<2, 8, 4>(hd, to - from, from, v, s, accs, pr),
                            3 => values::<3, 8, 2>(hd, to - from, from, v, s, accs, pr),
                            4 => values::<4, 8, 2>(hd, to - from, from, v, s, accs, pr),
                            _ => {}
                        }
                    }
                }
                for (j, r) in rows.iter_mut().enumerate() {
                    reduce::<8>(a.add(j * 8 * hd), hd, r.out.as_mut_ptr());
                }
            }
            F16Dot::VecDot => {
                for (j, r) in rows.iter_mut().enumerate() {
                    std::ptr::write_bytes(a, 0, 32 * hd);
                    for (from, to) in runs(r.first, r.pos + 1, kv.cells, 8 * 32) {
                        let (v, s, pr) = (value(from), h.kvd, |_| prob(j, from));
                        values::<1, 32, 4>(hd, to - from, from, v, s, |_| a, pr);
                    }
                    reduce::<32>(a, hd, r.out.as_mut_ptr());
                }
            }
        }
    }
}

/// `from..to` cut into runs of at most `len` positions whose cells follow each other in a ring
/// of `cells` (no run crosses the ring's end), in order.
fn runs(from: usize, to: usize, cells: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut at = from;
    std::iter::from_fn(move || {
        if at >= to {
            return None;
        }
        let end = to.min(at + len).min((at / cells + 1) * cells);
        let run = (at, end);
        at = end;
        Some(run)
    })
}

/// Rounds `q * pre` to f16 (as f32), 8 values at a time.
pub(super) fn round_query(q: &[f32], pre: f32, out: &mut [f32]) {
    assert!(q.len() == out.len() && q.len().is_multiple_of(8));
    // SAFETY: AVX2/F16C by this module's cfg; indices within the equal-length slices.
    unsafe {
        let pre = _mm256_set1_ps(pre);
        for i in (0..q.len()).step_by(8) {
            let x = _mm256_mul_ps(_mm256_loadu_ps(q.as_ptr().add(i)), pre);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), round_f16(x));
        }
    }
}

#[inline(always)]
unsafe fn round_f16(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

#[inline(always)]
unsafe fn load_f16(p: *const f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}

/// ggml's AVX `hsum` ([`ops::hsum8`](crate::model::ops::hsum8)): lo + hi, lanes 0+2 and 1+3,
/// then the two.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
}

/// [`ops::hsum32_f16_vec`](crate::model::ops::hsum32_f16_vec) of four accumulators.
#[inline(always)]
unsafe fn hsum32(a: [__m256; 4]) -> f32 {
    let x = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    let t = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    // (t0 + t1) + (t2 + t3)
    let u = _mm_add_ps(t, _mm_movehdup_ps(t));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_movehl_ps(u, u)))
}

/// The keys of positions `from..to`, whose cells follow each other: position `from`'s at `k`,
/// the next ones `stride` apart.
struct Keys {
    from: usize,
    to: usize,
    k: *const f16,
    stride: usize,
}

/// Scores of R rows against every key of `keys`, C cells at a time (R·C·A chains in flight),
/// with A 8-lane accumulators per chain (A = 1: 8 lanes, A = 4: 32 lanes).
#[inline(always)]
unsafe fn score_cells<const R: usize, const C: usize, const A: usize>(
    q: &[*const f32],
    hd: usize,
    keys: &Keys,
    out: impl Fn(usize, usize) -> *mut f32,
    post: f32,
) {
    let key = |p: usize| keys.k.add((p - keys.from) * keys.stride);
    let mut p = keys.from;
    while p + C <= keys.to {
        let k: [*const f16; C] = std::array::from_fn(|c| key(p + c));
        let s = dots::<R, C, A>(q, k, hd, post);
        for (r, s) in s.iter().enumerate() {
            for (c, &s) in s.iter().enumerate() {
                *out(r, p + c) = s;
            }
        }
        p += C;
    }
    while p < keys.to {
        let s = dots::<R, 1, A>(q, [key(p)], hd, post);
        for (r, s) in s.iter().enumerate() {
            *out(r, p) = s[0];
        }
        p += 1;
    }
}

/// The R·C dot products of `q` and `k`, each times `post`.
#[inline(always)]
unsafe fn dots<const R: usize, const C: usize, const A: usize>(
    q: &[*const f32],
    k: [*const f16; C],
    hd: usize,
    post: f32,
) -> [[f32; C]; R] {
    let mut acc = [[[_mm256_setzero_ps(); A]; C]; R];
    let mut s = 0;
    while s < hd {
        for a in 0..A {
            let kv: [__m256; C] = std::array::from_fn(|c| load_f16(k[c].add(s + 8 * a)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let qv = _mm256_loadu_ps(q[r].add(s + 8 * a));
                for c in 0..C {
                    acc[c][a] = _mm256_fmadd_ps(qv, kv[c], acc[c][a]);
                }
            }
        }
        s += 8 * A;
    }
    // The scalar dot adds its (empty) f64 tail: `+ 0.0` keeps its sign of zero.
    if A == 1 && R * C <= 8 {
        // Eight chains reduced together, as lanes of one vector.
        let v: [__m256; 8] = std::array::from_fn(|i| {
            if i < R * C {
                acc[i / C][i % C][0]
            } else {
                _mm256_setzero_ps()
            }
        });
        let sums = _mm256_add_ps(hsum8_each(v), _mm256_setzero_ps());
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(
            lanes.as_mut_ptr(),
            _mm256_mul_ps(sums, _mm256_set1_ps(post)),
        );
        return std::array::from_fn(|r| std::array::from_fn(|c| lanes[r * C + c]));
    }
    std::array::from_fn(|r| {
        std::array::from_fn(|c| {
            let sum = if A == 1 {
                hsum8(acc[r][c][0])
            } else {
                hsum32([acc[r][c][0], acc[r][c][1], acc[r][c][2], acc[r][c][3]])
            };
            (sum + 0.0) * post
        })
    })
}

/// Lane i = [`hsum8`] of `v[i]`, the same additions in the same order (each pair's operands
/// may be swapped, which IEEE addition does not notice): all eight as 21 shuffles and adds in
/// place of eight reductions of six each.
#[inline(always)]
unsafe fn hsum8_each(v: [__m256; 8]) -> __m256 {
    // Pairs (a, b) to [ta | tb] with t_i = x_i + x_{i+4}: the 128-bit halves added.
    let t = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    // Lanes 0..4 of the result come from v[0], v[2], v[4], v[6] and 4..8 from the odd ones,
    // so feed them interleaved to get v's order back.
    let (ab, cd) = (t(v[0], v[4]), t(v[1], v[5]));
    let (ef, gh) = (t(v[2], v[6]), t(v[3], v[7]));
    // [ta | tb], [tc | td] to [ua0 ua1 uc0 uc1 | ub0 ub1 ud0 ud1], u0 = t0 + t2, u1 = t1 + t3.
    let u = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    };
    let (abcd, efgh) = (u(ab, cd), u(ef, gh));
    // u0 + u1 of each: [a c e g | b d f h].
    _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(abcd, efgh),
        _mm256_shuffle_ps::<0b11_01_11_01>(abcd, efgh),
    )
}

/// Value lanes of N rows over `n` consecutive cells, the first at position `from` (its values
/// at `v`, the next ones `stride` apart): lane `p % L` of row i gains `prob(i)[p - from] ·
/// v[p]`, one FMA per head element, the row's lanes at `acc(i)` ((L, head_dim) values).
///
/// Lane by lane, D blocks of 8 head elements at a time, so that the N·D accumulators stay in
/// registers over the lane's cells (each lane still takes its cells in order: the same FMA
/// chains as cell by cell) and each value load serves all N rows.
#[inline(always)]
unsafe fn values<const N: usize, const L: usize, const D: usize>(
    hd: usize,
    n: usize,
    from: usize,
    v: *const f16,
    stride: usize,
    acc: impl Fn(usize) -> *mut f32,
    prob: impl Fn(usize) -> *const f32,
) {
    debug_assert!(hd.is_multiple_of(8 * D));
    let accs: [*mut f32; N] = std::array::from_fn(&acc);
    let probs: [*const f32; N] = std::array::from_fn(&prob);
    // The run's first cell in a lane.
    let start_of = |lane: usize| (lane + L - from % L) % L;
    for lane in 0..L {
        let start = start_of(lane);
        // The next lane's cells, requested while this lane reads its own: a lane's cells are L
        // rows of the cache apart, a stride the hardware prefetchers do not follow.
        if lane + 1 < L {
            let mut c = start_of(lane + 1);
            while c < n {
                let row = v.add(c * stride);
                crate::quant::prefetch_l1(std::slice::from_raw_parts(row.cast::<u8>(), 2 * hd));
                c += L;
            }
        }
        if start >= n {
            continue;
        }
        let mut d = 0;
        while d < hd {
            let at = |i: usize, k: usize| accs[i].add(lane * hd + d + 8 * k);
            let mut sum: [[__m256; D]; N] =
                std::array::from_fn(|i| std::array::from_fn(|k| _mm256_loadu_ps(at(i, k))));
            let mut c = start;
            while c < n {
                let row = v.add(c * stride + d);
                let x: [__m256; D] = std::array::from_fn(|k| load_f16(row.add(8 * k)));
                for (i, sum) in sum.iter_mut().enumerate() {
                    let pr = _mm256_broadcast_ss(&*probs[i].add(c));
                    for (s, &x) in sum.iter_mut().zip(&x) {
                        *s = _mm256_fmadd_ps(pr, x, *s);
                    }
                }
                c += L;
            }
            for (i, sum) in sum.iter().enumerate() {
                for (k, &s) in sum.iter().enumerate() {
                    _mm256_storeu_ps(at(i, k), s);
                }
            }
            d += 8 * D;
        }
    }
}

/// `out[d]` = the horizontal sum of the L lanes `acc[r * hd + d]`, 8 elements at a time.
#[inline(always)]
unsafe fn reduce<const L: usize>(acc: *const f32, hd: usize, out: *mut f32) {
    let lane = |r: usize, d: usize| _mm256_loadu_ps(acc.add(r * hd + d));
    let mut d = 0;
    while d < hd {
        let s = if L == 8 {
            // hsum8 lane-wise: t_i = v_i + v_{i+4}, then (t0 + t2) + (t1 + t3).
            let t: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(lane(i, d), lane(i + 4, d)));
            _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]))
        } else {
            // hsum32_f16_vec lane-wise.
            let x: [__m256; 8] = std::array::from_fn(|i| {
                _mm256_add_ps(
                    _mm256_add_ps(lane(i, d), lane(i + 16, d)),
                    _mm256_add_ps(lane(i + 8, d), lane(i + 24, d)),
                )
            });
            let t: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(x[i], x[i + 4]));
            _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]))
        };
        _mm256_storeu_ps(out.add(d), s);
        d += 8;
    }
}

/// [`ops::softmax_ggml`](crate::model::ops::softmax_ggml) of a row of whole groups of 8, each
/// probability then rounded to f16 (as the value pass uses it).
#[inline(always)]
unsafe fn softmax_f16(x: &mut [f32]) {
    debug_assert!(x.len().is_multiple_of(8));
    let p = x.as_mut_ptr();
    let n = x.len();
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..n).step_by(8) {
        m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(i)));
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mv = _mm256_set1_ps(max);
    let mut sum = 0f64;
    for i in (0..n).step_by(8) {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
        _mm256_storeu_ps(p.add(i), e);
        sum += hsum8(e) as f64;
    }
    let inv = _mm256_set1_ps((1.0 / sum) as f32);
    for i in (0..n).step_by(8) {
        let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv);
        _mm256_storeu_ps(p.add(i), round_f16(v));
    }
}

/// [`ops::exp_ggml`](crate::model::ops::exp_ggml) on 8 lanes: the same operations. Where every
/// lane is in the normal range (|n| ≤ 126) that result is returned at once, as ggml does; only
/// otherwise are the far-range forms computed and blended. They are not computed regardless:
/// for n ≤ 0 `s1·s1` underflows, and on Intel every underflowing multiply is a microcode assist
/// of about a hundred cycles (perf put 80 % of SwiGLU's time on it, 8 % of Llama 1B's prefill).
#[inline(always)]
pub(in crate::model) unsafe fn exp8(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let ci = |bits: u32| _mm256_set1_epi32(bits as i32);
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    // fma(-n, a, y) is -(n·a) + y exactly: fnmadd.
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, ci(1f32.to_bits())));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_mul_ps(c(0x3f7f_fff6), b),
    );
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let normal = _mm256_fmadd_ps(j, k, k);
    let in_range = _mm256_cmp_ps::<_CMP_LE_OQ>(abs, _mm256_set1_ps(126.0));
    if _mm256_movemask_ps(in_range) == 0xFF {
        return normal;
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        ci(0x8200_0000),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, ci(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let big = _mm256_mul_ps(s1, s1);
    let mid = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    let far = _mm256_blendv_ps(
        mid,
        big,
        _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(192.0)),
    );
    _mm256_blendv_ps(far, normal, in_range)
}
