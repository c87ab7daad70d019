//! llama.cpp's float order for 32-value blocks with an offset (Q4_1, Q5_1: value = d·q + m, q
//! unsigned) against Q8_1 (`s` = d·Σq), and the many-row kernels that keep it: a format says how
//! its block unpacks ([`AffineBlock32`]); these sum the blocks.
//!
//! ggml's AVX2 `ggml_vec_dot_q{4,5}_1_q8_1` keeps one eight-lane FMA chain of `d_w·d_a·(q·a)`
//! and, apart, one scalar FMA chain of `m_w·s_a`, added after the horizontal sum. llama.cpp
//! repacks neither type, so every matmul sums in that order, and every kernel here gives each
//! output exactly that chain's operations: what the many-row kernels share is the work outside
//! the chains (an activation block's load and scales, a weight block's unpacking, the
//! conversion of four rows' scales, the offsets' FMAs of several outputs in one vector
//! instruction, each lane the scalar FMA).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::block32::{scale_products, ROWS_MAX_BLOCKS};
use super::{dpbusd, dpbusd_mem, groups_ahead, hsum, load256, request_next};
use crate::quant::blocks::{blocks, f16_to_f32, Block};
use crate::quant::formats::q8_1::BlockQ8_1;
use crate::quant::isa::Isa;

/// A 32-value block of unsigned quants with an f16 scale `d` and an f16 offset `m`, in that
/// order at its start, dotted against Q8_1.
pub trait AffineBlock32: Block {
    /// The block's first four bytes: `d` then `m`, both f16.
    fn dm(&self) -> [u8; 4];
    /// The 32 quants (at most 31) as unsigned bytes, in element order.
    unsafe fn quants(&self) -> __m256i;
}

/// Lane j: `Σ u·a` over values 4j..4j+3 of unsigned quants `u` and the signed activations at
/// `a` (32 bytes). `maddubs` and `madd`, or with VNNI one `vpdpbusd`: the same integers, since
/// the pair sums (at most 2·31·128) never saturate i16.
#[inline(always)]
unsafe fn quads<I: Isa>(u: __m256i, a: *const i8) -> __m256i {
    if I::VNNI {
        dpbusd_mem::<I>(_mm256_setzero_si256(), u, a)
    } else {
        let y = _mm256_loadu_si256(a.cast());
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1))
    }
}

/// [`quads`] of an activation already in a register.
#[inline(always)]
unsafe fn quads_reg<I: Isa>(u: __m256i, y: __m256i) -> __m256i {
    if I::VNNI {
        dpbusd::<I>(_mm256_setzero_si256(), u, y)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1))
    }
}

/// `d` and `m` of each block as f32 lanes: lane 2r is block r's `d`, lane 2r+1 its `m`. One
/// conversion for four blocks; the eight f16 are packed in general-purpose registers (see
/// [`super::f16_lanes`]).
#[inline(always)]
unsafe fn dm_lanes<B: AffineBlock32>(b: [&B; 4]) -> __m256 {
    let word = |x: &B, y: &B| {
        (u32::from_le_bytes(x.dm()) as u64) | ((u32::from_le_bytes(y.dm()) as u64) << 32)
    };
    _mm256_cvtph_ps(_mm_set_epi64x(word(b[2], b[3]) as i64, word(b[0], b[1]) as i64))
}

/// ggml's AVX2 `ggml_vec_dot_q4_1_q8_1` (and Q5_1's, the same order): one FMA chain of
/// `d_w·d_a·(q·a)` over the blocks into eight lanes, the offsets' `m·s` summed apart (one scalar
/// FMA per block, as `summs += m*s` compiles on x86-64-v3), added after the horizontal sum.
#[inline(always)]
pub unsafe fn vec_dot<I: Isa, B: AffineBlock32>(w: &[B], a: &[BlockQ8_1]) -> f32 {
    let [out] = vec_dot_n::<I, B, 1>(w, [a]);
    out
}

/// [`vec_dot`] of one weight row against `N` activation rows: each weight block is unpacked
/// once and feeds `N` chains that see the single-row operations.
#[inline(always)]
pub unsafe fn vec_dot_n<I: Isa, B: AffineBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_1]; N],
) -> [f32; N] {
    let n = w.len();
    assert!(a.iter().all(|a| a.len() == n), "rows of unequal length");
    let mut acc = [_mm256_setzero_ps(); N];
    let mut offsets = [0.0f32; N];
    for (i, x) in w.iter().enumerate() {
        let dm = x.dm();
        let (d_w, m_w) = (f16_to_f32([dm[0], dm[1]]), f16_to_f32([dm[2], dm[3]]));
        let u = x.quants();
        for t in 0..N {
            // SAFETY (get_unchecked): every activation row has n blocks (asserted above).
            let y = a[t].get_unchecked(i);
            offsets[t] = m_w.mul_add(f16_to_f32(y.s), offsets[t]);
            let d = _mm256_set1_ps(d_w * f16_to_f32(y.d));
            let sumi = quads::<I>(u, y.qs.as_ptr());
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    std::array::from_fn(|t| hsum(acc[t]) + offsets[t])
}

/// [`vec_dot`] of four weight rows against one activation row, each row's result bit-identical
/// to its own `vec_dot`: the activation block is loaded and its scales converted once for four
/// rows, the four rows' `d` and `m` come from one conversion, the four `d_w·d_a` from one
/// multiply and the four offsets' FMAs are one (lane r row r's scalar chain).
#[inline(always)]
pub unsafe fn vec_dot_4rows<I: Isa, B: AffineBlock32>(w: [&[B]; 4], a: &[BlockQ8_1]) -> [f32; 4] {
    four_rows_ahead::<I, B>(w, None, a)
}

/// [`vec_dot_4rows`], requesting the `next` quad's block i while it reads its own.
#[inline(always)]
unsafe fn four_rows_ahead<I: Isa, B: AffineBlock32>(
    w: [&[B]; 4],
    next: Option<[&[B]; 4]>,
    a: &[BlockQ8_1],
) -> [f32; 4] {
    let n = a.len();
    assert!(w.iter().all(|w| w.len() == n), "rows of unequal length");
    assert!(next.is_none_or(|x| x.iter().all(|x| x.len() == n)), "next rows of unequal length");
    // Lane 2r of the products holds row r's d_w·d_a; lane 2r+1 of the offsets row r's chain.
    let lane = [0, 2, 4, 6].map(|l| _mm256_set1_epi32(l));
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut offsets = _mm256_setzero_ps();
    for (i, y) in a.iter().enumerate() {
        request_next(next, i);
        // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
        let b = w.map(|w| w.get_unchecked(i));
        let dm = dm_lanes(b);
        // The even lanes' d_w·s_a are never read.
        offsets = _mm256_fmadd_ps(dm, _mm256_set1_ps(f16_to_f32(y.s)), offsets);
        let d = _mm256_mul_ps(dm, _mm256_set1_ps(f16_to_f32(y.d)));
        let aq = load256(y.qs.as_ptr().cast());
        for r in 0..4 {
            let sumi = quads_reg::<I>(b[r].quants(), aq);
            let d_r = _mm256_permutevar8x32_ps(d, lane[r]);
            acc[r] = _mm256_fmadd_ps(d_r, _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    let mut off = [0.0f32; 8];
    _mm256_storeu_ps(off.as_mut_ptr(), offsets);
    std::array::from_fn(|r| hsum(acc[r]) + off[2 * r + 1])
}

/// Decode's mat-vec: `out[i]` = row i · `a` for the rows in whole quads, each bit-identical to
/// its [`vec_dot`], while every quad requests the next quad's lines as it goes
/// ([`groups_ahead`]). Returns how many rows it wrote; the caller takes the rest.
// Not inlined: see `groups_ahead`.
#[inline(never)]
pub unsafe fn rows_ahead<I: Isa, B: AffineBlock32>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8_1],
    out: &mut [f32],
) -> usize {
    let (n, n_rows) = (a.len(), out.len());
    groups_ahead::<I, _, 4>(rows, row_bytes, n, n_rows, |i, w, next| {
        out[i..i + 4].copy_from_slice(&four_rows_ahead::<I, B>(w, next, a))
    })
}

/// Prefill's matmul over consecutive weight rows (`row_bytes` each) against `N` (4 or 8)
/// activation rows, `outs[k][i]` = row i · `a[k]` bit-identical to its [`vec_dot`]. Done once
/// instead of once per weight row: the activations' `d` and `s` are converted into tables up
/// front; per weight block, its quants are unpacked once for all `N` rows, the `N` products
/// `d_w·d_a` formed in one multiply and the `N` offsets' FMAs in one instruction. Returns false
/// (writing nothing) for rows wider than [`ROWS_MAX_BLOCKS`], which the caller takes row by row.
#[inline(always)]
pub unsafe fn rows_n<I: Isa, B: AffineBlock32, const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    a: [&[BlockQ8_1]; N],
    mut outs: [&mut [f32]; N],
) -> bool {
    const { assert!(N == 4 || N == 8) };
    let n = row_bytes / size_of::<B>();
    if n > ROWS_MAX_BLOCKS {
        return false;
    }
    assert!(
        row_bytes == n * size_of::<B>() && a.iter().all(|a| a.len() == n),
        "rows and activations of unequal length"
    );
    let n_rows = rows.len() / row_bytes;
    assert!(outs.iter().all(|o| o.len() == n_rows), "outputs of another row count");
    // Uninitialised, so a call does not clear 32 KiB it will not read: only the first n
    // entries are written, and only they are read.
    let mut d_table = [const { MaybeUninit::<[f32; N]>::uninit() }; ROWS_MAX_BLOCKS];
    let mut s_table = [const { MaybeUninit::<[f32; N]>::uninit() }; ROWS_MAX_BLOCKS];
    for i in 0..n {
        d_table[i].write(a.map(|a| f16_to_f32(a.get_unchecked(i).d)));
        s_table[i].write(a.map(|a| f16_to_f32(a.get_unchecked(i).s)));
    }
    // SAFETY: entries 0..n were written just above; MaybeUninit<T> has T's layout.
    let d_a = std::slice::from_raw_parts(d_table.as_ptr().cast::<[f32; N]>(), n);
    let s_a = std::slice::from_raw_parts(s_table.as_ptr().cast::<[f32; N]>(), n);
    for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
        let out = row_n::<I, B, N>(blocks(row), a, d_a, s_a);
        for (o, v) in outs.iter_mut().zip(out) {
            // SAFETY: every output holds n_rows values (asserted above).
            *o.get_unchecked_mut(r) = v;
        }
    }
    true
}

/// One weight row of [`rows_n`].
#[inline(always)]
unsafe fn row_n<I: Isa, B: AffineBlock32, const N: usize>(
    w: &[B],
    a: [&[BlockQ8_1]; N],
    d_a: &[[f32; N]],
    s_a: &[[f32; N]],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    // Lane k: activation row k's offsets chain (lanes from N on stay unread).
    let mut offsets = _mm256_setzero_ps();
    let mut scales = [0f32; 8];
    // Read back through a pointer the optimiser cannot see is `scales`, so that it broadcasts
    // each product from memory instead of rebuilding it by shuffles from the register (as in
    // block32's `vec_dot_row`).
    let scale = std::hint::black_box(scales.as_ptr());
    for (i, ((wb, d_a), s_a)) in w.iter().zip(d_a).zip(s_a).enumerate() {
        let dm = wb.dm();
        let (d_w, m_w) = (f16_to_f32([dm[0], dm[1]]), f16_to_f32([dm[2], dm[3]]));
        let u = wb.quants();
        scale_products(d_w, d_a, scales.as_mut_ptr());
        offsets = if N == 8 {
            _mm256_fmadd_ps(_mm256_set1_ps(m_w), _mm256_loadu_ps(s_a.as_ptr()), offsets)
        } else {
            let lo = _mm_fmadd_ps(
                _mm_set1_ps(m_w),
                _mm_loadu_ps(s_a.as_ptr()),
                _mm256_castps256_ps128(offsets),
            );
            _mm256_castps128_ps256(lo)
        };
        for k in 0..N {
            // SAFETY (get_unchecked): every activation row has w.len() blocks (asserted by
            // the caller) and i < w.len(); `scale` points to `scales`, which holds N ≤ 8.
            let y = a[k].get_unchecked(i);
            let sumi = quads::<I>(u, y.qs.as_ptr());
            let d_k = _mm256_broadcast_ss(&*scale.add(k));
            acc[k] = _mm256_fmadd_ps(d_k, _mm256_cvtepi32_ps(sumi), acc[k]);
        }
    }
    let mut off = [0.0f32; 8];
    _mm256_storeu_ps(off.as_mut_ptr(), offsets);
    std::array::from_fn(|k| hsum(acc[k]) + off[k])
}

/// The [`Kernels`](crate::quant::format::Kernels) of a format whose block is an
/// [`AffineBlock32`] (Q4_1, Q5_1), written once for the formats' `impl Kernels`: every entry
/// point in vec_dot's order, the only one llama.cpp uses for these types (in the free order
/// too, which could differ but has no matrix of these types in the models served).
macro_rules! affine_kernels {
    ($block:ty) => {
        #[inline]
        fn dot_1x1(
            w: &[$block],
            a: &[$crate::quant::formats::q8_1::BlockQ8_1],
            _order: $crate::quant::DotOrder,
        ) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (the impls are compiled only then); loads
            // stay inside the blocks borrowed from `w` and `a`.
            unsafe { $crate::quant::simd::affine32::vec_dot::<I, $block>(w, a) }
        }

        #[inline]
        fn dot_1x4(
            w: &[$block],
            a: [&[$crate::quant::formats::q8_1::BlockQ8_1]; 4],
            _order: $crate::quant::DotOrder,
        ) -> [f32; 4] {
            // SAFETY: as in `dot_1x1`; the kernel checks the activation rows' lengths.
            unsafe { $crate::quant::simd::affine32::vec_dot_n::<I, $block, 4>(w, a) }
        }

        #[inline]
        fn dot_1xn<const N: usize>(
            w: &[$block],
            a: [&[$crate::quant::formats::q8_1::BlockQ8_1]; N],
            _order: $crate::quant::DotOrder,
        ) -> [f32; N] {
            // SAFETY: as in `dot_1x4`.
            unsafe { $crate::quant::simd::affine32::vec_dot_n::<I, $block, N>(w, a) }
        }

        /// One activation row, [`vec_dot_4rows`](crate::quant::simd::affine32::vec_dot_4rows);
        /// several, each weight row's `dot_1xn`.
        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[$block]; 4],
            a: [&[$crate::quant::formats::q8_1::BlockQ8_1]; N],
            order: $crate::quant::DotOrder,
        ) -> [[f32; 4]; N] {
            if N == 1 {
                // SAFETY: as in `dot_1x1`; the kernel checks the rows' lengths.
                std::array::from_fn(|t| unsafe {
                    $crate::quant::simd::affine32::vec_dot_4rows::<I, $block>(w, a[t])
                })
            } else {
                $crate::quant::format::dot_4xn_by_rows::<Self, I, N>(w, a, order)
            }
        }

        #[inline]
        fn rows_x1(
            rows: &[u8],
            row_bytes: usize,
            a: &[$crate::quant::formats::q8_1::BlockQ8_1],
            _order: $crate::quant::DotOrder,
            out: &mut [f32],
        ) -> usize {
            // SAFETY: as in `dot_1x1`; the kernel checks the lengths it relies on.
            unsafe {
                $crate::quant::simd::affine32::rows_ahead::<I, $block>(rows, row_bytes, a, out)
            }
        }

        #[inline]
        fn rows_x4(
            rows: &[u8],
            row_bytes: usize,
            a: [&[$crate::quant::formats::q8_1::BlockQ8_1]; 4],
            order: $crate::quant::DotOrder,
            outs: [&mut [f32]; 4],
        ) {
            let [o0, o1, o2, o3] = outs;
            // SAFETY: as in `dot_1x1`; the kernel checks the lengths it relies on.
            let done = unsafe {
                $crate::quant::simd::affine32::rows_n::<I, $block, 4>(
                    rows,
                    row_bytes,
                    a,
                    [&mut *o0, &mut *o1, &mut *o2, &mut *o3],
                )
            };
            if !done {
                $crate::quant::format::rows_x4_by_row::<Self, I>(
                    rows,
                    row_bytes,
                    a,
                    order,
                    [o0, o1, o2, o3],
                );
            }
        }

        #[inline]
        fn rows_x8(
            rows: &[u8],
            row_bytes: usize,
            a: [&[$crate::quant::formats::q8_1::BlockQ8_1]; 8],
            order: $crate::quant::DotOrder,
            outs: [&mut [f32]; 8],
        ) {
            let [o0, o1, o2, o3, o4, o5, o6, o7] = outs;
            // SAFETY: as in `rows_x4`.
            let done = unsafe {
                $crate::quant::simd::affine32::rows_n::<I, $block, 8>(
                    rows,
                    row_bytes,
                    a,
                    [
                        &mut *o0, &mut *o1, &mut *o2, &mut *o3, &mut *o4, &mut *o5, &mut *o6,
                        &mut *o7,
                    ],
                )
            };
            if !done {
                $crate::quant::format::rows_by_1xn::<Self, I, 8>(
                    rows,
                    row_bytes,
                    a,
                    order,
                    [o0, o1, o2, o3, o4, o5, o6, o7],
                );
            }
        }
    };
}
pub(crate) use affine_kernels;
