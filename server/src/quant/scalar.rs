//! The scalar arithmetic several formats' references share, as llama.cpp does it: integer sums
//! per block (K-quant mins and offsets via the Q8_K `bsums`), then one float multiply per block
//! by `d_weight * d_act`; the SIMD kernels differ only in float summation order.
//! Sources: `dequantize_row_*` in ggml/src/ggml-quants.c and `ggml_vec_dot_*_generic` in
//! ggml/src/ggml-cpu/quants.c (ggml-org/ggml d99724f).

use super::blocks::{f16_to_f32, scales_mins_k4, QK, QK_K};
use super::formats::q8_0::BlockQ8_0;
use super::formats::q8_1::BlockQ8_1;
use super::formats::q8_k::BlockQ8K;

/// Integer dot product of `w` with the first `w.len()` values of `a`.
pub fn dot_i8<W: Copy + Into<i32>>(w: &[W], a: &[i8]) -> i32 {
    w.iter().zip(a).map(|(&w, &a)| w.into() * a as i32).sum()
}

/// A float format's dot product, summed in f64 (the reference for any summation order).
pub fn dot_float<B>(w: &[B], a: &[B], value: impl Fn(&B) -> f32) -> f32 {
    let pairs = w.iter().zip(a);
    pairs
        .map(|(w, a)| value(w) as f64 * value(a) as f64)
        .sum::<f64>() as f32
}

/// `y = q * d` for a 32-value block of signed quants.
pub fn dequantize_32(d: [u8; 2], values: [i8; QK], out: &mut [f32]) {
    let d = f16_to_f32(d);
    for (y, q) in out.iter_mut().zip(values) {
        *y = q as f32 * d;
    }
}

/// 32-value blocks of signed quants (`unpack` gives a block's d and quants) against Q8_0.
pub fn dot_32<B>(w: &[B], a: &[BlockQ8_0], unpack: impl Fn(&B) -> ([u8; 2], [i8; QK])) -> f32 {
    let pairs = w.iter().zip(a);
    pairs
        .map(|(b, y)| {
            let (d, values) = unpack(b);
            dot_i8(&values, &y.qs) as f32 * (f16_to_f32(d) * f16_to_f32(y.d))
        })
        .sum()
}

/// `y = d * q + m` for a 32-value block of unsigned quants with an offset (Q4_1, Q5_1).
pub fn dequantize_affine_32(d: [u8; 2], m: [u8; 2], values: [u8; QK], out: &mut [f32]) {
    let (d, m) = (f16_to_f32(d), f16_to_f32(m));
    for (y, q) in out.iter_mut().zip(values) {
        *y = q as f32 * d + m;
    }
}

/// Offset blocks against Q8_1 (`unpack` gives a block's d, m and quants), as
/// `ggml_vec_dot_q{4,5}_1_q8_1_generic`: per block `d_w·d_a·(q·a) + m·s`, the offset's product
/// taken from the activation's `s` (`d_a·Σa`).
pub fn dot_affine_32<B>(
    w: &[B],
    a: &[BlockQ8_1],
    unpack: impl Fn(&B) -> ([u8; 2], [u8; 2], [u8; QK]),
) -> f32 {
    let pairs = w.iter().zip(a);
    pairs
        .map(|(b, y)| {
            let (d, m, values) = unpack(b);
            let sumi = dot_i8(&values, &y.qs);
            f16_to_f32(d) * f16_to_f32(y.d) * sumi as f32 + f16_to_f32(m) * f16_to_f32(y.s)
        })
        .sum()
}

/// The IQ2/IQ3 grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS): a super-block's signed grid values
/// in groups of `group`, group g weighted `d·(0.5 + ls(g))·unit` by its 4-bit scale. ggml's
/// order: the group's factor first, then times each value.
pub fn dequantize_grid(
    d: [u8; 2],
    values: [i8; QK_K],
    group: usize,
    unit: f32,
    ls: impl Fn(usize) -> u32,
    out: &mut [f32],
) {
    let d = f16_to_f32(d);
    for (g, (ys, qs)) in out
        .chunks_exact_mut(group)
        .zip(values.chunks(group))
        .enumerate()
    {
        let dg = d * (0.5 + ls(g) as f32) * unit;
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = dg * q as f32;
        }
    }
}

/// The grid types against Q8_K as ggml's generic dots: per super-block the integer sum of
/// `(2·ls + 1)·(q·a)` over its groups, times `d·d_a`; the row's sum times `factor` (ggml's
/// `0.125` or `0.25`) at the end. `unpack` gives a block's d and values, `ls` its group scales.
pub fn dot_grid<B>(
    w: &[B],
    a: &[BlockQ8K],
    group: usize,
    factor: f32,
    unpack: impl Fn(&B) -> ([u8; 2], [i8; QK_K]),
    ls: impl Fn(&B, usize) -> u32,
) -> f32 {
    let sum = dot_k(w, a, |b, y| {
        let (d, values) = unpack(b);
        let sumi: i32 = (0..QK_K / group)
            .map(|g| {
                let scale = 2 * ls(b, g) as i32 + 1;
                scale * dot_i8(&values[group * g..group * (g + 1)], &y.qs[group * g..])
            })
            .sum();
        f16_to_f32(d) * y.d() * sumi as f32
    });
    factor * sum
}

/// K-quant super-blocks against Q8_K, `block_dot` giving each super-block's float value.
pub fn dot_k<B>(w: &[B], a: &[BlockQ8K], block_dot: impl Fn(&B, &BlockQ8K) -> f32) -> f32 {
    w.iter().zip(a).map(|(b, y)| block_dot(b, y)).sum()
}

/// Q4_K/Q5_K: `y = d*scale*q - dmin*min` per 32-value sub-block.
pub fn dequantize_k4(
    d: [u8; 2],
    dmin: [u8; 2],
    scales: &[u8; 12],
    values: &[u8; QK_K],
    out: &mut [f32],
) {
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    let sm = scales_mins_k4(scales);
    for (s, (ys, qs)) in out.chunks_exact_mut(32).zip(values.chunks(32)).enumerate() {
        let (scale, min) = (d * sm[s] as f32, dmin * sm[8 + s] as f32);
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = scale * q as f32 - min;
        }
    }
}

/// Q4_K/Q5_K super-block: `d*d_y*Σ scale_s*(q·y)_s - dmin*d_y*Σ min_s*bsum_s`, the min term taken
/// from the activation's per-16 sums so the quants are never offset.
pub fn dot_k4(
    d: [u8; 2],
    dmin: [u8; 2],
    scales: &[u8; 12],
    values: &[u8; QK_K],
    y: &BlockQ8K,
) -> f32 {
    let sm = scales_mins_k4(scales);
    let sumi: i32 = (0..8)
        .map(|s| sm[s] as i32 * dot_i8(&values[32 * s..32 * s + 32], &y.qs[32 * s..]))
        .sum();
    let summ: i32 = (0..8)
        .map(|s| sm[8 + s] as i32 * (y.bsum(2 * s) + y.bsum(2 * s + 1)))
        .sum();
    y.d() * f16_to_f32(d) * sumi as f32 - y.d() * f16_to_f32(dmin) * summ as f32
}
