//! The arithmetic of llama.cpp's repacked kernels, reading the weights where they lie.
//!
//! On AVX2, llama.cpp moves every Q4_0, Q4_K and IQ4_NL matrix whose row count is a multiple of 8
//! into its CPU_REPACK buffer (`ggml_repack_get_optimal_repack_type`, ggml/src/ggml-cpu/
//! repack.cpp), interleaving 8 rows so one kernel computes 8 outputs per pass. Those kernels
//! (`ggml_gemv_*_8x8` for a single activation row, `ggml_gemm_*_8x8` for groups of 4, in
//! ggml/src/ggml-cpu/arch/x86/repack.cpp) sum in another float order than the row-by-row
//! `vec_dot` kernels of [`super::avx2`]: each output is one scalar FMA chain over the blocks, no
//! 8-lane accumulator and horizontal sum. Parity needs that order; it does not need the
//! interleaved copy (the integer block sums are exact in any order), so the weights stay
//! zero-copy and each output is computed from its own row.
//!
//! The activations need no special care: the 4-row quantisers those kernels read
//! (`ggml_quantize_mat_q8_0_4x8`, `ggml_quantize_mat_q8_K_4x8`) produce the same d and quants as
//! the row quantisers (Q8_K may flip the sign of both d and the quants when +max and -max tie,
//! which leaves every product unchanged), and bsums are plain sums.

use std::arch::x86_64::*;

use super::avx2::{
    dot_i8_quads, k4_chunk_sum, k4_scaled_sum, load128, load256, q4_k_chunk, SignedBlock32,
};
use super::blocks::*;

/// Sum of eight i32 lanes (exact: any order gives the same integer).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
}

/// `acc + sumi·(d_w·d_a)` with one rounding, as the kernels' `_mm256_fmadd_ps(cvt(iacc),
/// mul(col_scale, row_scale), acc)` does per lane.
#[inline(always)]
fn fma_scaled(sumi: i32, d_w: f32, d_a: f32, acc: f32) -> f32 {
    (sumi as f32).mul_add(d_w * d_a, acc)
}

/// 32-value blocks (Q4_0, IQ4_NL) against Q8_0, as `gemv_q4_b32_8x8_q8_0_lut_avx` and
/// `gemm_q4_b32_8x8_q8_0_lut_avx` both compute it: per block, the integer dot, then one FMA.
#[inline(always)]
unsafe fn dot_block32<B: SignedBlock32>(w: &[B], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0;
    for (w, a) in w.iter().zip(a) {
        let sumi = hsum_i32(dot_i8_quads(w.quants(), load256(a.qs.as_ptr().cast())));
        acc = fma_scaled(sumi, f16_to_f32(w.d()), f16_to_f32(a.d), acc);
    }
    acc
}

/// [`dot_block32`] for four activation rows, each weight block unpacked once.
#[inline(always)]
unsafe fn dot_block32_x4<B: SignedBlock32>(w: &[B], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    let mut acc = [0.0; 4];
    for (b, wb) in w.iter().enumerate() {
        let wq = wb.quants();
        let dw = f16_to_f32(wb.d());
        for k in 0..4 {
            let ab = &a[k][b];
            let sumi = hsum_i32(dot_i8_quads(wq, load256(ab.qs.as_ptr().cast())));
            acc[k] = fma_scaled(sumi, dw, f16_to_f32(ab.d), acc[k]);
        }
    }
    acc
}

pub fn q4_0_q8_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    // SAFETY: the target has AVX2/FMA/F16C (this module is compiled only then); loads stay
    // inside the blocks borrowed from `w` and `a`.
    unsafe { dot_block32(w, a) }
}

pub fn q4_0_q8_0_x4(w: &[BlockQ4_0], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: as in `q4_0_q8_0`; every activation row holds as many blocks as `w` (checked by
    // the caller).
    unsafe { dot_block32_x4(w, a) }
}

pub fn iq4_nl_q8_0(w: &[BlockIq4Nl], a: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `q4_0_q8_0`.
    unsafe { dot_block32(w, a) }
}

pub fn iq4_nl_q8_0_x4(w: &[BlockIq4Nl], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: as in `q4_0_q8_0_x4`.
    unsafe { dot_block32_x4(w, a) }
}

/// A Q4_K super-block's eight 6-bit scales as i16, in both 128-bit halves (the layout
/// [`k4_scaled_sum`] takes), and its eight mins.
#[inline(always)]
unsafe fn q4_k_scales(b: &BlockQ4K) -> (__m256i, [u8; 8]) {
    let sm = scales_mins_k4(&b.scales);
    let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(load128(sm.as_ptr())));
    (scales, sm[8..].try_into().unwrap())
}

/// `Σ min_s·bsum_s` over sub-blocks `subs` (bsum_s: the activation sum over sub-block s's 32
/// values), the integer the kernels scale by dmin.
#[inline(always)]
fn q4_k_min_sum(mins: &[u8; 8], a: &BlockQ8K, subs: std::ops::Range<usize>) -> i32 {
    subs.map(|s| mins[s] as i32 * (a.bsum(2 * s) + a.bsum(2 * s + 1)))
        .sum()
}

/// Q4_K against Q8_K for one activation row, as `ggml_gemv_q4_K_8x8_q8_K`: per super-block, one
/// FMA of the scaled integer sum by d_w·d_a and one of the min sum by dmin_w·d_a into a second
/// chain, which is subtracted at the end.
pub fn q4_k_q8_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    // SAFETY: as in `q4_0_q8_0`; chunk c reads qs[32c..32c+32] of a 128-byte array (c < 4).
    unsafe {
        let (mut acc, mut acc_min) = (0.0, 0.0);
        for (b, y) in w.iter().zip(a) {
            let (scales, mins) = q4_k_scales(b);
            let sumi = hsum_i32(k4_scaled_sum(scales, y, |c| q4_k_chunk(b, c)));
            acc = fma_scaled(sumi, f16_to_f32(b.d), y.d(), acc);
            let min_sum = q4_k_min_sum(&mins, y, 0..8);
            acc_min = fma_scaled(min_sum, f16_to_f32(b.dmin), y.d(), acc_min);
        }
        acc - acc_min
    }
}

/// Q4_K against four Q8_K activation rows, as `ggml_gemm_q4_K_8x8_q8_K`, which (unlike the
/// gemv) applies the FMAs per 64-value chunk: four per super-block into each chain.
pub fn q4_k_q8_k_x4(w: &[BlockQ4K], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    // SAFETY: as in `q4_k_q8_k`; every activation row holds as many blocks as `w` (checked by
    // the caller).
    unsafe {
        let (mut acc, mut acc_min) = ([0.0; 4], [0.0; 4]);
        for (i, b) in w.iter().enumerate() {
            let (scales, mins) = q4_k_scales(b);
            let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
            for c in 0..4 {
                let quants = q4_k_chunk(b, c);
                for k in 0..4 {
                    let y = &a[k][i];
                    let sumi = hsum_i32(k4_chunk_sum(scales, y, c, quants));
                    acc[k] = fma_scaled(sumi, d, y.d(), acc[k]);
                    let min_sum = q4_k_min_sum(&mins, y, 2 * c..2 * c + 2);
                    acc_min[k] = fma_scaled(min_sum, dmin, y.d(), acc_min[k]);
                }
            }
        }
        [0, 1, 2, 3].map(|k| acc[k] - acc_min[k])
    }
}
