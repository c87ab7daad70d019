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
    dot_i8_quads, hsum_i32, hsum_i32_128, k4_chunk_sum, k4_scaled_sum, load128, load256,
    q4_k_chunk, SignedBlock32,
};
use super::blocks::*;

/// `acc + sumi·(d_w·d_a)` with one rounding, as the kernels' `_mm256_fmadd_ps(cvt(iacc),
/// mul(col_scale, row_scale), acc)` does per lane.
#[inline(always)]
fn fma_scaled(sumi: i32, d_w: f32, d_a: f32, acc: f32) -> f32 {
    (sumi as f32).mul_add(d_w * d_a, acc)
}

/// [`fma_scaled`] for four activation rows, one per lane.
#[inline(always)]
unsafe fn fma_scaled_x4(sumi: __m128i, d_w: f32, d_a: [f32; 4], acc: __m128) -> __m128 {
    let d = _mm_mul_ps(_mm_set1_ps(d_w), _mm_loadu_ps(d_a.as_ptr()));
    _mm_fmadd_ps(_mm_cvtepi32_ps(sumi), d, acc)
}

#[inline(always)]
unsafe fn lanes(v: __m128) -> [f32; 4] {
    let mut out = [0.0; 4];
    _mm_storeu_ps(out.as_mut_ptr(), v);
    out
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

/// [`dot_block32`] for four activation rows, each weight block unpacked once; lane k of the
/// accumulator is activation row k's chain.
#[inline(always)]
unsafe fn dot_block32_x4<B: SignedBlock32>(w: &[B], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    for (i, wb) in w.iter().enumerate() {
        let wq = wb.quants();
        let y = a.map(|a| &a[i]);
        let sumi = hsum_i32_x4(y.map(|y| dot_i8_quads(wq, load256(y.qs.as_ptr().cast()))));
        let d_a = y.map(|y| f16_to_f32(y.d));
        acc = fma_scaled_x4(sumi, f16_to_f32(wb.d()), d_a, acc);
    }
    lanes(acc)
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

/// The four sums of eight i32 lanes each, `[Σv0, Σv1, Σv2, Σv3]`.
#[inline(always)]
unsafe fn hsum_i32_x4(v: [__m256i; 4]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

/// A Q4_K super-block's scales and mins, unpacked once: the eight 6-bit scales as i16 in both
/// 128-bit halves (the layout [`k4_scaled_sum`] takes), and the eight mins as i16.
#[inline(always)]
unsafe fn q4_k_scales_mins(b: &BlockQ4K) -> (__m256i, __m128i) {
    let sm = _mm256_cvtepu8_epi16(load128(scales_mins_k4(&b.scales).as_ptr()));
    let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    (scales, _mm256_extracti128_si256(sm, 1))
}

/// `min_2c·bsum_2c + min_2c+1·bsum_2c+1` for the four 64-value chunks c, where bsum_s is the
/// activation sum over sub-block s: the integers the kernels scale by dmin.
#[inline(always)]
unsafe fn q4_k_chunk_min_sums(mins: __m128i, a: &BlockQ8K) -> __m128i {
    let bsums = load256(a.bsums.as_ptr());
    let sub_sums = _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256(bsums, 1),
    );
    _mm_madd_epi16(mins, sub_sums)
}

/// Q4_K against Q8_K for one activation row, as `ggml_gemv_q4_K_8x8_q8_K`: per super-block, one
/// FMA of the scaled integer sum by d_w·d_a and one of the min sum by dmin_w·d_a into a second
/// chain, which is subtracted at the end.
pub fn q4_k_q8_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    // SAFETY: as in `q4_0_q8_0`; chunk c reads qs[32c..32c+32] of a 128-byte array (c < 4).
    unsafe {
        let (mut acc, mut acc_min) = (0.0, 0.0);
        for (b, y) in w.iter().zip(a) {
            let (scales, mins) = q4_k_scales_mins(b);
            let sumi = hsum_i32(k4_scaled_sum(scales, y, |c| q4_k_chunk(b, c)));
            acc = fma_scaled(sumi, f16_to_f32(b.d), y.d(), acc);
            let min_sum = hsum_i32_128(q4_k_chunk_min_sums(mins, y));
            acc_min = fma_scaled(min_sum, f16_to_f32(b.dmin), y.d(), acc_min);
        }
        acc - acc_min
    }
}

/// Q4_K against four Q8_K activation rows, as `ggml_gemm_q4_K_8x8_q8_K`, which (unlike the
/// gemv) applies the FMAs per 64-value chunk: four per super-block into each chain. Lane k of
/// the accumulators is activation row k's chain.
pub fn q4_k_q8_k_x4(w: &[BlockQ4K], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    // SAFETY: as in `q4_k_q8_k`; every activation row holds as many blocks as `w` (checked by
    // the caller).
    unsafe {
        let (mut acc, mut acc_min) = (_mm_setzero_ps(), _mm_setzero_ps());
        for (i, b) in w.iter().enumerate() {
            let (scales, mins) = q4_k_scales_mins(b);
            let y = a.map(|a| &a[i]);
            let d_a = y.map(|y| y.d());
            let min_sums = transpose_i32_4x4(y.map(|y| q4_k_chunk_min_sums(mins, y)));
            for (c, min_sum) in min_sums.into_iter().enumerate() {
                let quants = q4_k_chunk(b, c);
                let sumi = hsum_i32_x4(y.map(|y| k4_chunk_sum(scales, y, c, quants)));
                acc = fma_scaled_x4(sumi, f16_to_f32(b.d), d_a, acc);
                acc_min = fma_scaled_x4(min_sum, f16_to_f32(b.dmin), d_a, acc_min);
            }
        }
        lanes(_mm_sub_ps(acc, acc_min))
    }
}

/// Rows become columns: lane j of output i is lane i of input j.
#[inline(always)]
unsafe fn transpose_i32_4x4(m: [__m128i; 4]) -> [__m128i; 4] {
    let lo01 = _mm_unpacklo_epi32(m[0], m[1]);
    let lo23 = _mm_unpacklo_epi32(m[2], m[3]);
    let hi01 = _mm_unpackhi_epi32(m[0], m[1]);
    let hi23 = _mm_unpackhi_epi32(m[2], m[3]);
    [
        _mm_unpacklo_epi64(lo01, lo23),
        _mm_unpackhi_epi64(lo01, lo23),
        _mm_unpacklo_epi64(hi01, hi23),
        _mm_unpackhi_epi64(hi01, hi23),
    ]
}
