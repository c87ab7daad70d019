//! llama.cpp's float orders for 32-value blocks against Q8_0 (Q8_0, Q4_0, Q5_0, IQ4_NL): a format
//! says how its block unpacks to 32 signed bytes ([`SignedBlock32`]); these sum the blocks.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use smallvec::SmallVec;

use super::{dpbusd, f16_lanes, fma_scaled, groups_ahead, request_next, signed_quads, fma_scaled_x4, hsum, hsum_i32, hsum_i32_x4, lanes, load256};
use crate::quant::blocks::{f16_to_f32, Block};
use crate::quant::format::{rows_x4_by_row, Kernels, WeightRow};
use crate::quant::isa::Isa;
use crate::quant::formats::q8_0::{BlockQ8_0, Q8_0};
use crate::quant::DotOrder;

/// A 32-value block whose quants unpack to signed bytes, dotted against Q8_0.
pub trait SignedBlock32: Block {
    fn d(&self) -> [u8; 2];
    /// The 32 quants as signed bytes, in element order.
    unsafe fn quants(&self) -> __m256i;
    /// For a format whose quants are unsigned bytes `u` less an offset (Q4_0: nibbles - 8; Q5_0:
    /// five bits - 16), the offset, with `u < 2·offset ≤ 32`: then `Σ q·a = Σ u·a - offset·Σ a`,
    /// so the many-row kernels multiply `u` by the activations directly (no sign fix-ups) and
    /// take the offset's share from tables made once per activation block: per block for the
    /// repacked order, which only needs each block's integer total, and per four values for
    /// vec_dot's ([`dot_i8_quads`]' lanes).
    const OFFSET: Option<i32> = None;
    /// The `u` of [`SignedBlock32::OFFSET`] (unused where that is `None`).
    #[inline(always)]
    unsafe fn unsigned_quants(&self) -> __m256i {
        self.quants()
    }
}

/// `acc + d_w*d_a*(w·a)` for one 32-value block.
#[inline(always)]
unsafe fn fma_block<I: Isa>(w: &impl SignedBlock32, a: &BlockQ8_0, acc: __m256) -> __m256 {
    fma_unpacked::<I>(w.quants(), f16_to_f32(w.d()), a, acc)
}

/// [`fma_block`] of a weight block already unpacked (`wq`, `d_w`): the same operations, so a
/// block unpacked once for several activation rows gives each the single-row result.
#[inline(always)]
unsafe fn fma_unpacked<I: Isa>(wq: __m256i, d_w: f32, a: &BlockQ8_0, acc: __m256) -> __m256 {
    let sumi = signed_quads::<I>(wq, load256(a.qs.as_ptr().cast()));
    let d = _mm256_set1_ps(d_w * f16_to_f32(a.d));
    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc)
}

/// The offset of VNNI's unsigned route for `B`: the format's own ([`SignedBlock32::OFFSET`]),
/// or 128 for signed quants, which their flipped top bit makes unsigned.
const fn vnni_offset<B: SignedBlock32>() -> i32 {
    match B::OFFSET {
        Some(o) => o,
        None => 128,
    }
}

/// A block's quants `q` as the unsigned bytes `q + vnni_offset` (at most 255) that `vpdpbusd`
/// multiplies by the signed activations.
#[inline(always)]
unsafe fn vnni_unsigned<B: SignedBlock32>(b: &B) -> __m256i {
    if B::OFFSET.is_some() {
        b.unsigned_quants()
    } else {
        _mm256_xor_si256(b.quants(), _mm256_set1_epi8(-128))
    }
}

/// Lane j: `-offset·(a[4j] + … + a[4j+3])` for an activation block's quants `aq`. A `vpdpbusd`
/// of [`vnni_unsigned`] quants by `aq` that starts from it ends at `Σ q·a` over the lane's four
/// values: the lane of [`signed_quads`], exactly (no i16 stage, nothing saturates), so VNNI's
/// kernels sum the same integers as AVX2's with one instruction per weight block and
/// activation row, this once per activation block.
#[inline(always)]
unsafe fn vnni_base<I: Isa, B: SignedBlock32>(aq: __m256i) -> __m256i {
    let offset = _mm256_set1_epi8(vnni_offset::<B>() as u8 as i8);
    let zero = _mm256_setzero_si256();
    _mm256_sub_epi32(zero, dpbusd::<I>(zero, offset, aq))
}

/// ggml's AVX2 `vec_dot_q{8,4,5}_0_q8_0`: one FMA chain over the blocks, then the horizontal
/// sum. The order is not a detail: the sum's last bit moves the next layer's Q8_0 rounding, and
/// quantised Gemma models amplify such flips into logit errors of tenths. One chain still
/// outruns memory (a 34-byte block per 4-cycle FMA latency).
#[inline(always)]
pub unsafe fn vec_dot<I: Isa, B: SignedBlock32>(w: &[B], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, a) in w.iter().zip(a) {
        acc = fma_block::<I>(w, a, acc);
    }
    hsum(acc)
}

/// [`vec_dot`] of one weight row against `N` activation rows at once (prompt processing, a batch
/// of streams): each weight block is unpacked once and feeds `N` FMA chains, one per output, so
/// every output sums in exactly the single-row order.
#[inline(always)]
pub unsafe fn vec_dot_n<I: Isa, B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, wb) in w.iter().enumerate() {
        let (wq, d_w) = (wb.quants(), f16_to_f32(wb.d()));
        for (acc, a) in acc.iter_mut().zip(a) {
            *acc = fma_unpacked::<I>(wq, d_w, &a[b], *acc);
        }
    }
    acc.map(|v| hsum(v))
}

/// The four rows' `d_w·d_a` of one block, lane r for row r: one conversion and one multiply for
/// four rows, each lane the product the single-row kernels form.
#[inline(always)]
unsafe fn scales_4rows<B: SignedBlock32>(b: [&B; 4], d_a: f32) -> __m128 {
    _mm_mul_ps(_mm_cvtph_ps(f16_lanes(b.map(|b| b.d()))), _mm_set1_ps(d_a))
}

/// [`vec_dot`] of four weight rows against `N` activation rows (decode's mat-vec, a batch of
/// streams), each result bit-identical to its own [`vec_dot`] (its own eight-lane chain, the
/// same FMAs): each weight block is unpacked once for all activation rows, each activation
/// block loaded once for the four rows, and the four `d_w·d_a` of an activation row come from
/// one multiply.
#[inline(always)]
pub unsafe fn vec_dot_4rows_exact_n<I: Isa, B: SignedBlock32, const N: usize>(
    w: [&[B]; 4],
    a: [&[BlockQ8_0]; N],
) -> [[f32; 4]; N] {
    let d_a = a.map(f32_scales);
    exact_4rows_n::<I, B, N>(w, None, a, std::array::from_fn(|t| &d_a[t][..]))
}

/// An activation row's block scales as f32, converted once per mat-vec: in the four-row kernels
/// a scalar conversion, a multiply and a broadcast per block and quad of weight rows become
/// one broadcast load. On the stack for rows of up to 16384 values.
#[inline(always)]
fn f32_scales(a: &[BlockQ8_0]) -> SmallVec<[f32; 512]> {
    a.iter().map(|b| f16_to_f32(b.d)).collect()
}

/// The blocks per row of a four-row kernel's operands, after checking that every weight row,
/// `next` row, activation row and scale row has that many: the kernels' unchecked indexing
/// relies on it.
#[inline(always)]
fn quad_blocks<B, const N: usize>(
    w: [&[B]; 4],
    next: Option<[&[B]; 4]>,
    a: [&[BlockQ8_0]; N],
    d_a: [&[f32]; N],
) -> usize {
    let n = w[0].len();
    assert!(
        w.iter().all(|w| w.len() == n)
            && a.iter().all(|a| a.len() == n)
            && d_a.iter().all(|d| d.len() == n),
        "rows of unequal length"
    );
    assert!(next.is_none_or(|x| x.iter().all(|x| x.len() == n)), "next rows of unequal length");
    n
}

/// [`vec_dot_4rows_exact_n`], requesting the `next` quad's block i while it reads its own.
///
/// A format with an [`SignedBlock32::OFFSET`] multiplies its unsigned quants by the activations
/// and starts each lane from `-offset·Σ a` ([`vnni_base`], once per activation block for the
/// four rows): the lanes of [`signed_quads`] exactly, for two multiplies and an add per row in
/// place of two sign fix-ups and two multiplies. Without an offset the unsigned quants would
/// reach 255, whose pair sums saturate `maddubs`, so AVX2 keeps the signs there.
#[inline(always)]
unsafe fn exact_4rows_n<I: Isa, B: SignedBlock32, const N: usize>(
    w: [&[B]; 4],
    next: Option<[&[B]; 4]>,
    a: [&[BlockQ8_0]; N],
    d_a: [&[f32]; N],
) -> [[f32; 4]; N] {
    let n = quad_blocks(w, next, a, d_a);
    let unsigned = I::VNNI || B::OFFSET.is_some();
    let lane = [0, 1, 2, 3].map(|r| _mm256_set1_epi32(r));
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for i in 0..n {
        request_next(next, i);
        // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
        let b = w.map(|w| w.get_unchecked(i));
        let wq = b.map(|b| if unsigned { vnni_unsigned(b) } else { b.quants() });
        let d_w = _mm_cvtph_ps(f16_lanes(b.map(|b| b.d())));
        for t in 0..N {
            let (acc, ab) = (&mut acc[t], a[t].get_unchecked(i));
            let aq = load256(ab.qs.as_ptr().cast());
            let d = _mm256_castps128_ps256(_mm_mul_ps(d_w, _mm_broadcast_ss(d_a[t].get_unchecked(i))));
            let base = if unsigned { vnni_base::<I, B>(aq) } else { _mm256_setzero_si256() };
            for r in 0..4 {
                let sumi = if unsigned {
                    dpbusd::<I>(base, wq[r], aq)
                } else {
                    signed_quads::<I>(wq[r], aq)
                };
                let d_r = _mm256_permutevar8x32_ps(d, lane[r]);
                acc[r] = _mm256_fmadd_ps(d_r, _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
    }
    acc.map(|acc| acc.map(|v| hsum(v)))
}

/// [`repacked`] of four weight rows against one activation row, each row's chain bit-identical
/// to its own [`repacked`]: lane r of one accumulator is row r's chain, so the four integer sums
/// are reduced together ([`hsum_i32_x4`]) and the four FMAs are one.
#[inline(always)]
pub unsafe fn repacked_4rows<I: Isa, B: SignedBlock32>(w: [&[B]; 4], a: &[BlockQ8_0]) -> [f32; 4] {
    repacked_4rows_ahead::<I, B>(w, None, a)
}

/// [`repacked_4rows`], requesting the `next` quad's block i while it reads its own.
#[inline(always)]
unsafe fn repacked_4rows_ahead<I: Isa, B: SignedBlock32>(
    w: [&[B]; 4],
    next: Option<[&[B]; 4]>,
    a: &[BlockQ8_0],
) -> [f32; 4] {
    let n = a.len();
    assert!(w.iter().all(|w| w.len() == n), "rows of unequal length");
    assert!(next.is_none_or(|x| x.iter().all(|x| x.len() == n)), "next rows of unequal length");
    let mut acc = _mm_setzero_ps();
    for (i, ab) in a.iter().enumerate() {
        request_next(next, i);
        // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
        let b = w.map(|w| w.get_unchecked(i));
        let aq = load256(ab.qs.as_ptr().cast());
        let sums = hsum_i32_x4(if I::VNNI {
            let base = vnni_base::<I, B>(aq);
            b.map(|b| dpbusd::<I>(base, vnni_unsigned(b), aq))
        } else {
            b.map(|b| signed_quads::<I>(b.quants(), aq))
        });
        let d = scales_4rows(b, f16_to_f32(ab.d));
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), d, acc);
    }
    lanes(acc)
}

/// Four weight rows against one activation row (decode's mat-vec), not in llama.cpp's order: per
/// block the four rows' integer dots are folded by horizontal adds into one vector (rows 0..4 of
/// the block's first half, then of its second), scaled by the four `d_w·d_a` in one multiply and
/// added with one FMA; the two halves are added at the end. Each activation block is loaded and
/// its scale converted once for four rows, and four rows share one accumulator: on the default
/// model's Q8_0 output matrix this is about half [`vec_dot`]'s instructions per block. The
/// differences from vec_dot's sum are float rounding (relative 1e-7 of the row's magnitude).
#[inline(always)]
pub unsafe fn vec_dot_4rows<I: Isa, B: SignedBlock32>(w: [&[B]; 4], a: &[BlockQ8_0]) -> [f32; 4] {
    let [out] = vec_dot_4rows_n::<I, _, 1>(w, [a]);
    out
}

/// [`vec_dot_4rows`] against `N` activation rows: the four weight blocks are unpacked once per
/// block, and each activation row has its own accumulator that sees the single-row operations.
#[inline(always)]
pub unsafe fn vec_dot_4rows_n<I: Isa, B: SignedBlock32, const N: usize>(
    w: [&[B]; 4],
    a: [&[BlockQ8_0]; N],
) -> [[f32; 4]; N] {
    let d_a = a.map(f32_scales);
    four_rows_free::<I, B, N>(w, None, a, std::array::from_fn(|t| &d_a[t][..]))
}

/// Decode's mat-vec in the repacked order (Q4_0, IQ4_NL) through [`repacked_4rows`]: `out[i]` =
/// row i · `a` for the rows in whole quads, each bit-identical to what [`repacked`] gives it,
/// while every quad requests the next quad's lines as it goes ([`groups_ahead`]). Returns how
/// many rows it wrote; the caller takes the rest.
// Not inlined: see `groups_ahead`.
#[inline(never)]
pub unsafe fn repacked_rows<I: Isa, B: SignedBlock32>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8_0],
    out: &mut [f32],
) -> usize {
    let (n, n_rows) = (a.len(), out.len());
    groups_ahead::<I, _, 4>(rows, row_bytes, n, n_rows, |i, w, next| {
        out[i..i + 4].copy_from_slice(&repacked_4rows_ahead::<I, B>(w, next, a))
    })
}

/// Decode's mat-vec for a format whose four-row kernels are [`vec_dot_4rows`] in the free order
/// and [`vec_dot_4rows_exact_n`] in every other (Q8_0, Q5_0, Q4_0): [`free_or_exact_rows_n`]
/// for one activation row.
#[inline(always)]
pub unsafe fn free_or_exact_rows<I: Isa, B: SignedBlock32>(
    order: DotOrder,
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8_0],
    out: &mut [f32],
) -> usize {
    free_or_exact_rows_n::<I, B, 1>(order, rows, row_bytes, [a], &mut [out])
}

/// Four weight rows at a time against `N` activation rows (one, or a batch of streams):
/// `outs[t][i]` = row i · `a[t]`, each bit-identical to what [`vec_dot_4rows_n`] (free order) or
/// [`vec_dot_4rows_exact_n`] (every other) gives it, and so to the single-row kernels'. Returns
/// how many rows it wrote.
#[inline(never)]
pub unsafe fn free_or_exact_rows_n<I: Isa, B: SignedBlock32, const N: usize>(
    order: DotOrder,
    rows: &[u8],
    row_bytes: usize,
    a: [&[BlockQ8_0]; N],
    outs: &mut [&mut [f32]],
) -> usize {
    let n_rows = outs.first().map_or(0, |o| o.len());
    if outs.len() != N || outs.iter().any(|o| o.len() != n_rows) {
        return 0;
    }
    let mut store = |i: usize, quad: [[f32; 4]; N]| {
        for (o, r) in outs.iter_mut().zip(quad) {
            o[i..i + 4].copy_from_slice(&r);
        }
    };
    let n = a[0].len();
    let scales = a.map(f32_scales);
    let d_a = std::array::from_fn(|t| &scales[t][..]);
    match order {
        DotOrder::Free => groups_ahead::<I, _, 4>(rows, row_bytes, n, n_rows, |i, w, next| {
            store(i, four_rows_free::<I, B, N>(w, next, a, d_a))
        }),
        _ => groups_ahead::<I, _, 4>(rows, row_bytes, n, n_rows, |i, w, next| {
            store(i, exact_4rows_n::<I, B, N>(w, next, a, d_a))
        }),
    }
}

/// [`vec_dot_4rows_n`], requesting the `next` quad's block i while it reads its own block i.
#[inline(always)]
unsafe fn four_rows_free<I: Isa, B: SignedBlock32, const N: usize>(
    w: [&[B]; 4],
    next: Option<[&[B]; 4]>,
    a: [&[BlockQ8_0]; N],
    d_a: [&[f32]; N],
) -> [[f32; 4]; N] {
    let n = quad_blocks(w, next, a, d_a);
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..n {
        request_next(next, i);
        // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
        let b = w.map(|w| w.get_unchecked(i));
        let wq = b.map(|b| if I::VNNI { vnni_unsigned(b) } else { b.quants() });
        let d_w = _mm_cvtph_ps(f16_lanes(b.map(|b| b.d())));
        let d_w = _mm256_set_m128(d_w, d_w);
        for t in 0..N {
            let (acc, ab) = (&mut acc[t], a[t].get_unchecked(i));
            let aq = load256(ab.qs.as_ptr().cast());
            let p = if I::VNNI {
                let base = vnni_base::<I, B>(aq);
                wq.map(|u| dpbusd::<I>(base, u, aq))
            } else {
                wq.map(|q| signed_quads::<I>(q, aq))
            };
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            let d = _mm256_mul_ps(d_w, _mm256_broadcast_ss(d_a[t].get_unchecked(i)));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), d, *acc);
        }
    }
    acc.map(|acc| {
        lanes(_mm_add_ps(
            _mm256_castps256_ps128(acc),
            _mm256_extractf128_ps(acc, 1),
        ))
    })
}

/// As [`vec_dot`] but with ggml's two chains for IQ4_NL (even and odd blocks), summed before the
/// horizontal add; an odd last block is added after it.
#[inline(always)]
pub unsafe fn vec_dot_pairs<I: Isa, B: SignedBlock32>(w: &[B], a: &[BlockQ8_0]) -> f32 {
    let [out] = vec_dot_pairs_n::<I, _, 1>(w, [a]);
    out
}

/// [`vec_dot_pairs`] against `N` activation rows, each weight block unpacked once.
#[inline(always)]
pub unsafe fn vec_dot_pairs_n<I: Isa, B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
) -> [f32; N] {
    let (mut acc1, mut acc2) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    let pairs = w.chunks_exact(2);
    let w_rest = pairs.remainder();
    for (p, w) in pairs.enumerate() {
        let (q0, d0) = (w[0].quants(), f16_to_f32(w[0].d()));
        let (q1, d1) = (w[1].quants(), f16_to_f32(w[1].d()));
        for t in 0..N {
            acc1[t] = fma_unpacked::<I>(q0, d0, &a[t][2 * p], acc1[t]);
            acc2[t] = fma_unpacked::<I>(q1, d1, &a[t][2 * p + 1], acc2[t]);
        }
    }
    let mut sum: [f32; N] = std::array::from_fn(|t| hsum(_mm256_add_ps(acc1[t], acc2[t])));
    if let [last] = w_rest {
        let (q, d) = (last.quants(), f16_to_f32(last.d()));
        for (sum, a) in sum.iter_mut().zip(a) {
            *sum += hsum(fma_unpacked::<I>(q, d, &a[w.len() - 1], _mm256_setzero_ps()));
        }
    }
    sum
}

/// The repacked order (Q4_0, IQ4_NL), as `gemv_q4_b32_8x8_q8_0_lut_avx` and
/// `gemm_q4_b32_8x8_q8_0_lut_avx` (ggml-cpu/arch/x86/repack.cpp) both compute it: per block,
/// the integer dot, then one scalar FMA.
#[inline(always)]
pub unsafe fn repacked<I: Isa, B: SignedBlock32>(w: &[B], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0;
    for (w, a) in w.iter().zip(a) {
        let sumi = hsum_i32(signed_quads::<I>(w.quants(), load256(a.qs.as_ptr().cast())));
        acc = fma_scaled(sumi, f16_to_f32(w.d()), f16_to_f32(a.d), acc);
    }
    acc
}

/// [`repacked`] for `N` (≤ 4) activation rows, each weight block unpacked once; lane t of the
/// accumulator is activation row t's chain (lanes from `N` on stay zero). The same for four rows
/// is llama.cpp's gemm order (it sums as the gemv).
#[inline(always)]
pub unsafe fn repacked_n<I: Isa, B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
) -> [f32; N] {
    const { assert!(N <= 4) };
    let mut acc = _mm_setzero_ps();
    for (i, wb) in w.iter().enumerate() {
        let wq = wb.quants();
        let mut sums = [_mm256_setzero_si256(); 4];
        let mut d_a = [0.0; 4];
        for t in 0..N {
            let y = &a[t][i];
            sums[t] = signed_quads::<I>(wq, load256(y.qs.as_ptr().cast()));
            d_a[t] = f16_to_f32(y.d);
        }
        acc = fma_scaled_x4(hsum_i32_x4(sums), f16_to_f32(wb.d()), d_a, acc);
    }
    let all = lanes(acc);
    std::array::from_fn(|t| all[t])
}

/// The [`Kernels::rows_x4`] and [`Kernels::rows_x8`] of a 32-value format, both
/// [`dot_rows_tiled`] (`plain_vec_dot` as there), written once for the formats' `impl Kernels`.
macro_rules! tiled_rows {
    (plain_vec_dot: $plain:expr) => {
        #[inline]
        fn rows_x4(
            rows: &[u8],
            row_bytes: usize,
            a: [&[$crate::quant::formats::q8_0::BlockQ8_0]; 4],
            order: $crate::quant::DotOrder,
            outs: [&mut [f32]; 4],
        ) {
            $crate::quant::simd::block32::dot_rows_tiled::<Self, I, 4>(
                rows, row_bytes, a, order, outs, $plain,
            );
        }

        #[inline]
        fn rows_x8(
            rows: &[u8],
            row_bytes: usize,
            a: [&[$crate::quant::formats::q8_0::BlockQ8_0]; 8],
            order: $crate::quant::DotOrder,
            outs: [&mut [f32]; 8],
        ) {
            $crate::quant::simd::block32::dot_rows_tiled::<Self, I, 8>(
                rows, row_bytes, a, order, outs, $plain,
            );
        }
    };
}
pub(crate) use tiled_rows;

/// The [`Kernels::rows_x1`] and [`Kernels::rows_xn`] of a 32-value format whose four-row
/// kernels are [`vec_dot_4rows`] in the free order and [`vec_dot_4rows_exact_n`] in every other
/// (Q8_0, Q5_0): [`free_or_exact_rows`] and [`free_or_exact_rows_n`], written once for the
/// formats' `impl Kernels`.
macro_rules! free_or_exact_gemv {
    ($block:ty) => {
        #[inline]
        fn rows_x1(
            rows: &[u8],
            row_bytes: usize,
            a: &[$crate::quant::formats::q8_0::BlockQ8_0],
            order: $crate::quant::DotOrder,
            out: &mut [f32],
        ) -> usize {
            // SAFETY: the target has AVX2/FMA/F16C (the impls are compiled only then); the
            // kernels check the lengths they rely on.
            unsafe {
                $crate::quant::simd::block32::free_or_exact_rows::<I, $block>(
                    order, rows, row_bytes, a, out,
                )
            }
        }

        #[inline]
        fn rows_xn<const N: usize>(
            rows: &[u8],
            row_bytes: usize,
            a: [&[$crate::quant::formats::q8_0::BlockQ8_0]; N],
            order: $crate::quant::DotOrder,
            outs: &mut [&mut [f32]],
        ) -> usize {
            // SAFETY: as above.
            unsafe {
                $crate::quant::simd::block32::free_or_exact_rows_n::<I, $block, N>(
                    order, rows, row_bytes, a, outs,
                )
            }
        }
    };
}
pub(crate) use free_or_exact_gemv;

/// [`Kernels::rows_x4`] (`N` = 4) or [`Kernels::rows_x8`] (`N` = 8, two groups of four
/// computed together) of a 32-value format whose `dot_1x4` is [`repacked_n`] in the repacked
/// order where its row of the table lists that order, and [`vec_dot_n`] in every other order if
/// `plain_vec_dot`: those go through [`rows_n`]; the rest (IQ4_NL's two-chain vec_dot, rows too
/// wide for the table) row by row, four activation rows at a time.
#[inline(always)]
pub fn dot_rows_tiled<W, I: Isa, const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    a: [&[BlockQ8_0]; N],
    order: DotOrder,
    outs: [&mut [f32]; N],
    plain_vec_dot: bool,
) where
    W: Kernels<I> + WeightRow<Act = Q8_0>,
    W::Block: SignedBlock32,
{
    const { assert!(N == 4 || N == 8) };
    let fits = row_bytes / size_of::<W::Block>() <= ROWS_MAX_BLOCKS;
    let repacked = order == DotOrder::Repacked && W::ORDERS.contains(&DotOrder::Repacked);
    // SAFETY: the target has AVX2/FMA/F16C (this module is compiled only then); `rows_n`
    // checks the lengths it relies on.
    match (fits, repacked) {
        (true, true) => unsafe { rows_n::<I, W::Block, true, N>(rows, row_bytes, a, outs) },
        (true, false) if plain_vec_dot => unsafe {
            rows_n::<I, W::Block, false, N>(rows, row_bytes, a, outs)
        },
        _ => {
            let mut outs = outs.into_iter();
            for a in a.chunks_exact(4) {
                let a = [a[0], a[1], a[2], a[3]];
                let o = std::array::from_fn(|_| outs.next().expect("N is 4 or 8"));
                rows_x4_by_row::<W, I>(rows, row_bytes, a, order, o);
            }
        }
    }
}

/// Blocks per activation row that [`rows_n`]'s scale table holds (16384 values): rows of more
/// blocks go through the per-row kernels, in the same order.
pub const ROWS_MAX_BLOCKS: usize = 512;

/// Weight rows (`row_bytes` each) against `N` (4 or 8) activation rows, `outs[k][i]` = row i ·
/// `a[k]` in vec_dot's order ([`vec_dot_n`]) or, with `REPACKED`, the repacked one
/// ([`repacked_n`] per group of four), each output bit-identical to those kernels' (the same
/// chain, the same operations). What changes is what is done once instead of once per weight
/// row and activation row: each weight block is unpacked once for all `N`, and the activation
/// scales are converted into a table up front, which each `d_w·d_a` multiplies (the product the
/// per-row kernels form: an f32 multiply rounds the same either way round). Rows must be at
/// most [`ROWS_MAX_BLOCKS`] wide.
#[inline(always)]
pub unsafe fn rows_n<I: Isa, B: SignedBlock32, const REPACKED: bool, const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    a: [&[BlockQ8_0]; N],
    mut outs: [&mut [f32]; N],
) {
    const { assert!(N == 4 || N == 8) };
    let n = row_bytes / size_of::<B>();
    assert!(
        n <= ROWS_MAX_BLOCKS && row_bytes == n * size_of::<B>() && a.iter().all(|a| a.len() == n),
        "rows too wide, or rows and activations of unequal length"
    );
    let n_rows = rows.len() / row_bytes;
    assert!(outs.iter().all(|o| o.len() == n_rows), "outputs of another row count");
    // Uninitialised, so a call does not clear 16 KiB it will not read: only the first n entries
    // are written, and only they are read.
    let mut table = [const { MaybeUninit::<[f32; N]>::uninit() }; ROWS_MAX_BLOCKS];
    for (i, d) in table[..n].iter_mut().enumerate() {
        d.write(a.map(|a| f16_to_f32(a.get_unchecked(i).d)));
    }
    // SAFETY: entries 0..n were written just above; MaybeUninit<T> has T's layout.
    let d_a = std::slice::from_raw_parts(table.as_ptr().cast::<[f32; N]>(), n);
    // offset·Σa per block and activation row, for the repacked order of an offset format.
    let mut offsets = [const { MaybeUninit::<[i32; N]>::uninit() }; ROWS_MAX_BLOCKS];
    let offset = if REPACKED { B::OFFSET } else { None };
    if let Some(o) = offset {
        for (i, s) in offsets[..n].iter_mut().enumerate() {
            s.write(a.map(|a| o * a.get_unchecked(i).qs.iter().map(|&q| q as i32).sum::<i32>()));
        }
    }
    // SAFETY: as for `d_a`; read only when written (`offset` is Some).
    let offsets = std::slice::from_raw_parts(offsets.as_ptr().cast::<[i32; N]>(), n);
    // offset·(four activations) per lane, block and activation row, for vec_dot's order of an
    // offset format (see `vec_dot_offset_row`); rows wider than the table take `vec_dot_row`.
    let mut quads = [const { MaybeUninit::<[__m256i; N]>::uninit() }; QUAD_OFFSETS_MAX_BLOCKS];
    // With VNNI every format takes this route (`vnni_offset`), the table holding `vnni_base`.
    let quad_offset = match B::OFFSET {
        _ if REPACKED || n > QUAD_OFFSETS_MAX_BLOCKS => None,
        _ if I::VNNI => Some(vnni_offset::<B>()),
        offset => offset,
    };
    if let Some(o) = quad_offset {
        for (i, q) in quads[..n].iter_mut().enumerate() {
            q.write(a.map(|a| {
                let a = a.get_unchecked(i);
                if I::VNNI {
                    vnni_base::<I, B>(load256(a.qs.as_ptr().cast()))
                } else {
                    quad_offsets(a, o)
                }
            }));
        }
    }
    // SAFETY: as for `d_a`; read only when written (`quad_offset` is Some).
    let quads = std::slice::from_raw_parts(quads.as_ptr().cast::<[__m256i; N]>(), n.min(QUAD_OFFSETS_MAX_BLOCKS));
    for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
        let w = super::super::blocks::blocks::<B>(row);
        let out = if N == 8 && matches!(offset, Some(o) if o <= 8) {
            repacked_offset_row8(w, a, d_a, offsets)
        } else if offset.is_some() {
            repacked_offset_row::<_, N>(w, a, d_a, offsets)
        } else if REPACKED {
            repacked_row::<I, _, N>(w, a, d_a)
        } else if quad_offset.is_some() {
            vec_dot_offset_row::<I, _, N>(w, a, d_a, quads)
        } else {
            vec_dot_row::<I, _, N>(w, a, d_a)
        };
        for (o, v) in outs.iter_mut().zip(out) {
            // SAFETY: every output holds n_rows values (asserted above).
            *o.get_unchecked_mut(r) = v;
        }
    }
}

/// Blocks per activation row that [`rows_n`]'s table of lane offsets holds (4096 values, 32 KiB
/// for eight rows): the default model's rows are 640 and 2048 wide.
pub const QUAD_OFFSETS_MAX_BLOCKS: usize = 128;

/// Lane j of [`dot_i8_quads`]'s share of the offset: `o·(a[4j] + … + a[4j+3])` (exact: the
/// pair sums `o·(a+a')` fit maddubs' i16 for `o` ≤ 64).
#[inline(always)]
unsafe fn quad_offsets(a: &BlockQ8_0, o: i32) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(o as i8), load256(a.qs.as_ptr().cast()));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// The `N` (4 or 8) products `d_w·d_a[k]` of one block in one multiply, written to `out`: each
/// lane rounds as the scalar product the per-row kernels form. The caller broadcasts them from
/// memory (a load, where a broadcast from a register is a multiply and a shuffle per row).
#[inline(always)]
pub(crate) unsafe fn scale_products<const N: usize>(d_w: f32, d_a: &[f32; N], out: *mut f32) {
    if N == 8 {
        let d = _mm256_mul_ps(_mm256_set1_ps(d_w), _mm256_loadu_ps(d_a.as_ptr()));
        _mm256_storeu_ps(out, d);
    } else {
        for k in (0..N).step_by(4) {
            let d = _mm_mul_ps(_mm_set1_ps(d_w), _mm_loadu_ps(d_a.as_ptr().add(k)));
            _mm_storeu_ps(out.add(k), d);
        }
    }
}

/// One row of [`rows_n`] in vec_dot's order: an eight-lane FMA chain per activation row. The
/// `N` products `d_w·d_a` of a block are formed in one multiply ([`scale_products`]).
#[inline(always)]
unsafe fn vec_dot_row<I: Isa, B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
    d_a: &[[f32; N]],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut scales = [0f32; 8];
    // Read back through a pointer the optimiser cannot see is `scales`, so that it broadcasts
    // each product from memory instead of rebuilding it by shuffles from the register.
    let scale = std::hint::black_box(scales.as_ptr());
    for (i, (wb, d_a)) in w.iter().zip(d_a).enumerate() {
        let wq = wb.quants();
        scale_products(f16_to_f32(wb.d()), d_a, scales.as_mut_ptr());
        for k in 0..N {
            // SAFETY (get_unchecked): every activation row has w.len() blocks (asserted by
            // the caller) and i < w.len(); `scale` points to `scales`, which holds N ≤ 8.
            let y = a[k].get_unchecked(i);
            let sumi = signed_quads::<I>(wq, load256(y.qs.as_ptr().cast()));
            let d_k = _mm256_broadcast_ss(&*scale.add(k));
            acc[k] = _mm256_fmadd_ps(d_k, _mm256_cvtepi32_ps(sumi), acc[k]);
        }
    }
    acc.map(|v| hsum(v))
}

/// [`vec_dot_row`] of a format with an [`SignedBlock32::OFFSET`]: lane j of each block's integer
/// dot is `Σ u·a - offset·Σ a` over its four values, `quads` holding the second term
/// ([`quad_offsets`]), which is the lane [`dot_i8_quads`] gives, so the chains see the same
/// operations. It takes a multiply-add of the unsigned quants by the activations straight from
/// memory where the signed quants need two sign fix-ups and a load. (Equal while no activation
/// is -128, which `dot_i8_quads` cannot negate and Q8_0's quantiser never writes: |x·127/amax|
/// rounds to at most 127.) With VNNI every format comes here: `quads` holds [`vnni_base`] and
/// one `vpdpbusd` of the [`vnni_unsigned`] quants per block and row gives the same lane.
#[inline(always)]
unsafe fn vec_dot_offset_row<I: Isa, B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
    d_a: &[[f32; N]],
    quads: &[[__m256i; N]],
) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut scales = [0f32; 8];
    // As in `vec_dot_row`.
    let scale = std::hint::black_box(scales.as_ptr());
    for (i, ((wb, d_a), quads)) in w.iter().zip(d_a).zip(quads).enumerate() {
        let wu = if I::VNNI { vnni_unsigned(wb) } else { wb.unsigned_quants() };
        scale_products(f16_to_f32(wb.d()), d_a, scales.as_mut_ptr());
        for k in 0..N {
            // SAFETY (get_unchecked): as in `vec_dot_row`. u < 2·offset ≤ 32 and |a| ≤ 128
            // keep maddubs' pair sums far from i16 saturation.
            let y = load256(a[k].get_unchecked(i).qs.as_ptr().cast());
            let sumi = if I::VNNI {
                dpbusd::<I>(quads[k], wu, y)
            } else {
                let sumi = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, y), ones);
                _mm256_sub_epi32(sumi, quads[k])
            };
            let d_k = _mm256_broadcast_ss(&*scale.add(k));
            acc[k] = _mm256_fmadd_ps(d_k, _mm256_cvtepi32_ps(sumi), acc[k]);
        }
    }
    acc.map(|v| hsum(v))
}

/// One row of [`rows_n`] in the repacked order: lane k of accumulator g is activation row
/// 4g+k's scalar chain, as in [`repacked_n`] for group g.
#[inline(always)]
unsafe fn repacked_row<I: Isa, B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
    d_a: &[[f32; N]],
) -> [f32; N] {
    let mut acc = [_mm_setzero_ps(); 2];
    for (i, (wb, d_a)) in w.iter().zip(d_a).enumerate() {
        let wq = wb.quants();
        let d_w = _mm_set1_ps(f16_to_f32(wb.d()));
        for g in 0..N / 4 {
            // SAFETY (get_unchecked): as in `vec_dot_row`.
            let sums: [__m256i; 4] = std::array::from_fn(|k| {
                signed_quads::<I>(wq, load256(a[4 * g + k].get_unchecked(i).qs.as_ptr().cast()))
            });
            let d = _mm_mul_ps(d_w, _mm_loadu_ps(d_a.as_ptr().add(4 * g)));
            acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum_i32_x4(sums)), d, acc[g]);
        }
    }
    let all = [lanes(acc[0]), lanes(acc[1])];
    std::array::from_fn(|k| all[k / 4][k % 4])
}

/// [`repacked_row`] of a format with an [`SignedBlock32::OFFSET`]: each block's integer total
/// is `Σ u·a - offset·Σ a` (`offsets` holding the second term), the same integer, so the chains
/// see the same operations.
#[inline(always)]
unsafe fn repacked_offset_row<B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
    d_a: &[[f32; N]],
    offsets: &[[i32; N]],
) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm_setzero_ps(); 2];
    for (i, ((wb, d_a), offsets)) in w.iter().zip(d_a).zip(offsets).enumerate() {
        let wu = wb.unsigned_quants();
        let d_w = _mm_set1_ps(f16_to_f32(wb.d()));
        for g in 0..N / 4 {
            // SAFETY (get_unchecked): as in `vec_dot_row`. u < 16 and |a| ≤ 127 keep maddubs'
            // pair sums far from i16 saturation.
            let sums: [__m256i; 4] = std::array::from_fn(|k| {
                let y = load256(a[4 * g + k].get_unchecked(i).qs.as_ptr().cast());
                _mm256_madd_epi16(_mm256_maddubs_epi16(wu, y), ones)
            });
            let off = _mm_loadu_si128(offsets.as_ptr().add(4 * g).cast());
            let sumi = _mm_sub_epi32(hsum_i32_x4(sums), off);
            let d = _mm_mul_ps(d_w, _mm_loadu_ps(d_a.as_ptr().add(4 * g)));
            acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(sumi), d, acc[g]);
        }
    }
    let all = [lanes(acc[0]), lanes(acc[1])];
    std::array::from_fn(|k| all[k / 4][k % 4])
}

/// [`repacked_offset_row`] for eight activation rows of a format whose offset is at most 8
/// (`u` < 16): the eight integer totals of a block are reduced together, first in i16 (three
/// rounds of horizontal adds leave each 128-bit half's sum of 16 products, at most
/// 16·15·128 = 30720, so nothing wraps), then widened and the halves added. The totals are
/// the same integers, and the eight chains' FMAs are one, lane k being row k's.
#[inline(always)]
unsafe fn repacked_offset_row8<B: SignedBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_0]; N],
    d_a: &[[f32; N]],
    offsets: &[[i32; N]],
) -> [f32; N] {
    assert!(N == 8, "eight activation rows");
    let mut acc = _mm256_setzero_ps();
    for (i, ((wb, d_a), offsets)) in w.iter().zip(d_a).zip(offsets).enumerate() {
        let wu = wb.unsigned_quants();
        let d_w = _mm256_set1_ps(f16_to_f32(wb.d()));
        // SAFETY (get_unchecked): as in `vec_dot_row`; maddubs' pair sums are at most
        // 2·15·128, far from i16 saturation.
        let p: [__m256i; 8] = std::array::from_fn(|k| {
            _mm256_maddubs_epi16(wu, load256(a[k].get_unchecked(i).qs.as_ptr().cast()))
        });
        let q01 = _mm256_hadd_epi16(p[0], p[1]);
        let q23 = _mm256_hadd_epi16(p[2], p[3]);
        let q45 = _mm256_hadd_epi16(p[4], p[5]);
        let q67 = _mm256_hadd_epi16(p[6], p[7]);
        let halves = _mm256_hadd_epi16(
            _mm256_hadd_epi16(q01, q23),
            _mm256_hadd_epi16(q45, q67),
        );
        let totals = _mm256_add_epi32(
            _mm256_cvtepi16_epi32(_mm256_castsi256_si128(halves)),
            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(halves, 1)),
        );
        let sumi = _mm256_sub_epi32(totals, _mm256_loadu_si256(offsets.as_ptr().cast()));
        let d = _mm256_mul_ps(d_w, _mm256_loadu_ps(d_a.as_ptr()));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    let mut out = [0.0; N];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::format::Activation;
    use crate::quant::formats::q4_0::BlockQ4_0;
    use crate::quant::formats::q5_0::BlockQ5_0;
    use crate::quant::random::random_row;
    use crate::quant::isa::{Avx2, Vnni};
    use crate::quant::GgmlType;

    /// `n_rows` random rows of `ty` and eight quantised activation rows, `blocks` blocks wide.
    fn rows_and_acts(ty: GgmlType, blocks: usize, n_rows: usize) -> (Vec<u8>, Vec<Vec<BlockQ8_0>>) {
        let mut state = 0x5eed_u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            state
        };
        let rows = random_row(ty, blocks * 32 * n_rows, 1.0, &mut next);
        let acts = (0..8)
            .map(|_| {
                let x: Vec<f32> =
                    (0..blocks * 32).map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect();
                let mut a = vec![BlockQ8_0 { d: [0; 2], qs: [0; 32] }; blocks];
                Q8_0::quantize(&x, &mut a);
                a
            })
            .collect();
        (rows, acts)
    }

    /// Each of [`rows_n`]'s outputs in vec_dot's order against [`vec_dot`] of its row.
    fn rows_n_equals_vec_dot<I: Isa, B: SignedBlock32>(ty: GgmlType, blocks: usize) {
        let n_rows = 3;
        let (rows, acts) = rows_and_acts(ty, blocks, n_rows);
        let row_bytes = blocks * size_of::<B>();
        let a: [&[BlockQ8_0]; 8] = std::array::from_fn(|k| &acts[k][..]);
        let mut outs = vec![vec![f32::NAN; n_rows]; 8];
        let mut it = outs.iter_mut();
        let o: [&mut [f32]; 8] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
        // SAFETY: the test machine has the target's AVX2/FMA/F16C (this module is built only then).
        unsafe { rows_n::<I, B, false, 8>(&rows, row_bytes, a, o) };
        for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
            let w = crate::quant::blocks::blocks::<B>(row);
            for (k, a) in a.iter().enumerate() {
                // SAFETY: as above.
                let want = unsafe { vec_dot::<I, _>(w, a) };
                assert_eq!(outs[k][r].to_bits(), want.to_bits(), "{ty} {blocks} blocks row {r} act {k}");
            }
        }
    }

    /// Rows too wide for the lane-offset table but not for the scale table take the signed
    /// quants (`vec_dot_row`), which the property tests' narrow and very wide rows never reach
    /// for an offset format; both sides of the boundary give vec_dot's bits.
    #[test]
    fn offset_formats_on_both_sides_of_the_lane_offset_table_equal_vec_dot() {
        let vnni = crate::quant::isa::detected() == crate::quant::isa::Choice::Vnni;
        for blocks in [QUAD_OFFSETS_MAX_BLOCKS, QUAD_OFFSETS_MAX_BLOCKS + 1] {
            rows_n_equals_vec_dot::<Avx2, BlockQ5_0>(GgmlType::Q5_0, blocks);
            rows_n_equals_vec_dot::<Avx2, BlockQ4_0>(GgmlType::Q4_0, blocks);
            if vnni {
                // With VNNI the signed Q8_0 takes the lane-offset table too.
                rows_n_equals_vec_dot::<Vnni, BlockQ5_0>(GgmlType::Q5_0, blocks);
                rows_n_equals_vec_dot::<Vnni, BlockQ4_0>(GgmlType::Q4_0, blocks);
                rows_n_equals_vec_dot::<Vnni, BlockQ8_0>(GgmlType::Q8_0, blocks);
            }
        }
    }
}
