//! Scalar reference kernels: the definition of every type's dequantisation and dot product.
//!
//! Each block's bit layout is decoded in exactly one place (the `*_values` functions), which both
//! `dequantize` and `vec_dot` use. The dot products do llama.cpp's arithmetic: integer sums per
//! block (K-quant mins and offsets via the Q8_K `bsums`), then one float multiply per block by
//! `d_weight * d_act`; the SIMD kernels differ only in float summation order.
//! Sources: `dequantize_row_*` in ggml/src/ggml-quants.c and `ggml_vec_dot_*_generic` in
//! ggml/src/ggml-cpu/quants.c (ggml-org/ggml d99724f).

use super::blocks::*;
use super::GgmlType;

/// Q4_0 quants as signed values (-8..7), in element order.
pub fn q4_0_values(b: &BlockQ4_0) -> [i8; QK] {
    let mut v = [0i8; QK];
    for (j, &q) in b.qs.iter().enumerate() {
        v[j] = (q & 0xF) as i8 - 8;
        v[j + 16] = (q >> 4) as i8 - 8;
    }
    v
}

/// Q5_0 quants as signed values (-16..15), in element order.
pub fn q5_0_values(b: &BlockQ5_0) -> [i8; QK] {
    let qh = u32::from_le_bytes(b.qh);
    let mut v = [0i8; QK];
    for (j, &q) in b.qs.iter().enumerate() {
        let high = |bit: usize| (((qh >> bit) & 1) << 4) as u8;
        v[j] = ((q & 0xF) | high(j)) as i8 - 16;
        v[j + 16] = ((q >> 4) | high(j + 16)) as i8 - 16;
    }
    v
}

/// IQ4_NL quants looked up in the non-uniform grid, in element order.
pub fn iq4_nl_values(b: &BlockIq4Nl) -> [i8; QK] {
    let mut v = [0i8; QK];
    for (j, &q) in b.qs.iter().enumerate() {
        v[j] = KVALUES_IQ4NL[(q & 0xF) as usize];
        v[j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
    }
    v
}

/// Q4_K quants (0..15), in element order.
pub fn q4_k_values(b: &BlockQ4K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for (chunk, qs) in b.qs.chunks_exact(32).enumerate() {
        for (l, &q) in qs.iter().enumerate() {
            v[64 * chunk + l] = q & 0xF;
            v[64 * chunk + 32 + l] = q >> 4;
        }
    }
    v
}

/// Q5_K quants (0..31), in element order.
pub fn q5_k_values(b: &BlockQ5K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for (chunk, qs) in b.qs.chunks_exact(32).enumerate() {
        for (l, (&q, &h)) in qs.iter().zip(&b.qh).enumerate() {
            let high = |bit: usize| ((h >> bit) & 1) << 4;
            v[64 * chunk + l] = (q & 0xF) | high(2 * chunk);
            v[64 * chunk + 32 + l] = (q >> 4) | high(2 * chunk + 1);
        }
    }
    v
}

/// Q6_K quants with the offset removed (-32..31), in element order.
pub fn q6_k_values(b: &BlockQ6K) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for half in 0..2 {
        let ql = &b.ql[64 * half..64 * half + 64];
        let qh = &b.qh[32 * half..32 * half + 32];
        let out = &mut v[128 * half..128 * half + 128];
        for l in 0..32 {
            let q = |low: u8, shift: u32| (low | (((qh[l] >> shift) & 3) << 4)) as i8 - 32;
            out[l] = q(ql[l] & 0xF, 0);
            out[l + 32] = q(ql[l + 32] & 0xF, 2);
            out[l + 64] = q(ql[l] >> 4, 4);
            out[l + 96] = q(ql[l + 32] >> 4, 6);
        }
    }
    v
}

/// IQ4_XS quants looked up in the non-uniform grid, in element order.
pub fn iq4_xs_values(b: &BlockIq4Xs) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for (ib, qs) in b.qs.chunks_exact(16).enumerate() {
        for (j, &q) in qs.iter().enumerate() {
            v[32 * ib + j] = KVALUES_IQ4NL[(q & 0xF) as usize];
            v[32 * ib + 16 + j] = KVALUES_IQ4NL[(q >> 4) as usize];
        }
    }
    v
}

/// Dequantises a row of `ty` into `out` (one value per element of the row).
pub fn dequantize(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (y, x) in out.iter_mut().zip(row.chunks_exact(4)) {
                *y = f32::from_le_bytes(x.try_into().unwrap());
            }
        }
        GgmlType::F16 => {
            for (y, x) in out.iter_mut().zip(row.chunks_exact(2)) {
                *y = f16_to_f32([x[0], x[1]]);
            }
        }
        GgmlType::BF16 => {
            for (y, x) in out.iter_mut().zip(row.chunks_exact(2)) {
                *y = bf16_to_f32([x[0], x[1]]);
            }
        }
        GgmlType::Q4_0 => dequantize_32::<BlockQ4_0>(row, out, |b| (b.d, q4_0_values(b))),
        GgmlType::Q5_0 => dequantize_32::<BlockQ5_0>(row, out, |b| (b.d, q5_0_values(b))),
        GgmlType::Q8_0 => dequantize_32::<BlockQ8_0>(row, out, |b| (b.d, b.qs)),
        GgmlType::IQ4_NL => dequantize_32::<BlockIq4Nl>(row, out, |b| (b.d, iq4_nl_values(b))),
        GgmlType::Q4_K => {
            for (b, y) in blocks::<BlockQ4K>(row)
                .iter()
                .zip(out.chunks_exact_mut(QK_K))
            {
                dequantize_k4(b.d, b.dmin, &b.scales, &q4_k_values(b), y);
            }
        }
        GgmlType::Q5_K => {
            for (b, y) in blocks::<BlockQ5K>(row)
                .iter()
                .zip(out.chunks_exact_mut(QK_K))
            {
                dequantize_k4(b.d, b.dmin, &b.scales, &q5_k_values(b), y);
            }
        }
        GgmlType::Q6_K => {
            for (b, y) in blocks::<BlockQ6K>(row)
                .iter()
                .zip(out.chunks_exact_mut(QK_K))
            {
                let d = f16_to_f32(b.d);
                for ((ys, qs), &sc) in y
                    .chunks_exact_mut(16)
                    .zip(q6_k_values(b).chunks(16))
                    .zip(&b.scales)
                {
                    for (y, &q) in ys.iter_mut().zip(qs) {
                        *y = d * sc as f32 * q as f32;
                    }
                }
            }
        }
        GgmlType::IQ4_XS => {
            for (b, y) in blocks::<BlockIq4Xs>(row)
                .iter()
                .zip(out.chunks_exact_mut(QK_K))
            {
                let d = f16_to_f32(b.d);
                let values = iq4_xs_values(b);
                for (ib, (ys, qs)) in y.chunks_exact_mut(32).zip(values.chunks(32)).enumerate() {
                    let dl = d * b.scale(ib) as f32;
                    for (y, &q) in ys.iter_mut().zip(qs) {
                        *y = dl * q as f32;
                    }
                }
            }
        }
        GgmlType::Q8_K => {
            for (b, y) in blocks::<BlockQ8K>(row)
                .iter()
                .zip(out.chunks_exact_mut(QK_K))
            {
                for (y, &q) in y.iter_mut().zip(&b.qs) {
                    *y = b.d() * q as f32;
                }
            }
        }
    }
}

fn dequantize_32<B: Block>(
    row: &[u8],
    out: &mut [f32],
    unpack: impl Fn(&B) -> ([u8; 2], [i8; QK]),
) {
    for (b, y) in blocks::<B>(row).iter().zip(out.chunks_exact_mut(QK)) {
        let (d, values) = unpack(b);
        let d = f16_to_f32(d);
        for (y, q) in y.iter_mut().zip(values) {
            *y = q as f32 * d;
        }
    }
}

/// Q4_K/Q5_K: `y = d*scale*q - dmin*min` per 32-value sub-block.
fn dequantize_k4(
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

/// Dot product of a weight row of type `w` with an activation row in `vec_dot_type(w)`.
pub fn vec_dot(w: GgmlType, w_row: &[u8], act: &[u8]) -> f32 {
    match w {
        GgmlType::F32 => dot_float(w_row, act, 4, |x| f32::from_le_bytes(x.try_into().unwrap())),
        GgmlType::F16 => dot_float(w_row, act, 2, |x| f16_to_f32([x[0], x[1]])),
        GgmlType::BF16 => dot_float(w_row, act, 2, |x| bf16_to_f32([x[0], x[1]])),
        GgmlType::Q4_0 => dot_32::<BlockQ4_0>(w_row, act, |b| (b.d, q4_0_values(b))),
        GgmlType::Q5_0 => dot_32::<BlockQ5_0>(w_row, act, |b| (b.d, q5_0_values(b))),
        GgmlType::Q8_0 => dot_32::<BlockQ8_0>(w_row, act, |b| (b.d, b.qs)),
        GgmlType::IQ4_NL => dot_32::<BlockIq4Nl>(w_row, act, |b| (b.d, iq4_nl_values(b))),
        GgmlType::Q4_K => dot_k::<BlockQ4K>(w_row, act, |b, y| {
            dot_k4(b.d, b.dmin, &b.scales, &q4_k_values(b), y)
        }),
        GgmlType::Q5_K => dot_k::<BlockQ5K>(w_row, act, |b, y| {
            dot_k4(b.d, b.dmin, &b.scales, &q5_k_values(b), y)
        }),
        GgmlType::Q6_K => dot_k::<BlockQ6K>(w_row, act, |b, y| {
            let values = q6_k_values(b);
            let sumi: i32 = (0..16)
                .map(|s| b.scales[s] as i32 * dot_i8(&values[16 * s..16 * s + 16], &y.qs[16 * s..]))
                .sum();
            f16_to_f32(b.d) * y.d() * sumi as f32
        }),
        GgmlType::IQ4_XS => dot_k::<BlockIq4Xs>(w_row, act, |b, y| {
            let values = iq4_xs_values(b);
            let sumi: i32 = (0..8)
                .map(|s| b.scale(s) * dot_i8(&values[32 * s..32 * s + 32], &y.qs[32 * s..]))
                .sum();
            f16_to_f32(b.d) * y.d() * sumi as f32
        }),
        GgmlType::Q8_K => dot_k::<BlockQ8K>(w_row, act, |b, y| {
            b.d() * y.d() * dot_i8(&b.qs, &y.qs) as f32
        }),
    }
}

/// Integer dot product of `w` with the first `w.len()` values of `a`.
fn dot_i8<W: Copy + Into<i32>>(w: &[W], a: &[i8]) -> i32 {
    w.iter().zip(a).map(|(&w, &a)| w.into() * a as i32).sum()
}

fn dot_float(w_row: &[u8], act: &[u8], width: usize, load: impl Fn(&[u8]) -> f32) -> f32 {
    let pairs = w_row.chunks_exact(width).zip(act.chunks_exact(width));
    pairs
        .map(|(w, a)| load(w) as f64 * load(a) as f64)
        .sum::<f64>() as f32
}

fn dot_32<B: Block>(w_row: &[u8], act: &[u8], unpack: impl Fn(&B) -> ([u8; 2], [i8; QK])) -> f32 {
    let pairs = blocks::<B>(w_row).iter().zip(blocks::<BlockQ8_0>(act));
    pairs
        .map(|(b, y)| {
            let (d, values) = unpack(b);
            dot_i8(&values, &y.qs) as f32 * (f16_to_f32(d) * f16_to_f32(y.d))
        })
        .sum()
}

fn dot_k<B: Block>(w_row: &[u8], act: &[u8], block_dot: impl Fn(&B, &BlockQ8K) -> f32) -> f32 {
    let pairs = blocks::<B>(w_row).iter().zip(blocks::<BlockQ8K>(act));
    pairs.map(|(b, y)| block_dot(b, y)).sum()
}

/// Q4_K/Q5_K super-block: `d*d_y*Σ scale_s*(q·y)_s - dmin*d_y*Σ min_s*bsum_s`, the min term taken
/// from the activation's per-16 sums so the quants are never offset.
fn dot_k4(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], values: &[u8; QK_K], y: &BlockQ8K) -> f32 {
    let sm = scales_mins_k4(scales);
    let sumi: i32 = (0..8)
        .map(|s| sm[s] as i32 * dot_i8(&values[32 * s..32 * s + 32], &y.qs[32 * s..]))
        .sum();
    let summ: i32 = (0..8)
        .map(|s| sm[8 + s] as i32 * (y.bsum(2 * s) + y.bsum(2 * s + 1)))
        .sum();
    y.d() * f16_to_f32(d) * sumi as f32 - y.d() * f16_to_f32(dmin) * summ as f32
}
