//! Q8_1: Q8_0 plus the block's sum `s = d·Σq`, the activation format of weights with an offset
//! (Q4_1, Q5_1), whose dot takes the offset's product from `s` instead of from the quants.

use std::mem::offset_of;

use half::f16;

use crate::quant::blocks::{block, QK};
use crate::quant::format::{Activation, Float, Format};
use crate::quant::formats::q8_0::{BlockQ8_0, Q8_0};
use crate::quant::scalar;

block!(
    /// `d: f16; s: f16; qs: [i8; 32]`: value j is `d * qs[j]`, and `s` is `d * Σ qs` (f16).
    BlockQ8_1, bytes 36, { d: [u8; 2], s: [u8; 2], qs: [i8; 32] }
);

pub struct Q8_1;

impl Format for Q8_1 {
    type Block = BlockQ8_1;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[
        Float::F16(offset_of!(BlockQ8_1, d)),
        Float::F16(offset_of!(BlockQ8_1, s)),
    ];

    fn dequantize(b: &BlockQ8_1, out: &mut [f32]) {
        scalar::dequantize_32(b.d, b.qs, out);
    }
}

impl Activation for Q8_1 {
    /// `s` is rounded to f16 from `amax/127·Σq`, the values' sum from d rounded to f16: two
    /// roundings of 2^-11 apart.
    const SUM_ROUNDING: f64 = 1.0 / 1024.0;

    /// As `quantize_row_q8_1` in ggml/src/ggml-cpu/arch/x86/quants.c (AVX2 branch): d and the
    /// quants as its Q8_0 twin computes them, and `s` = f16(`d·Σq`) with the unrounded
    /// `d = amax/127`.
    fn quantize(x: &[f32], out: &mut [BlockQ8_1]) {
        for (xs, b) in x.chunks_exact(QK).zip(out) {
            let mut q8_0 = [BlockQ8_0 {
                d: [0; 2],
                qs: [0; QK],
            }];
            Q8_0::quantize(xs, &mut q8_0);
            let [BlockQ8_0 { d, qs }] = q8_0;
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            let s = f16::from_f32(amax / 127.0 * sum as f32).to_le_bytes();
            *b = BlockQ8_1 { d, s, qs };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::f16_to_f32;

    #[test]
    fn s_is_d_times_the_sum_of_the_quants() {
        // amax = 127 makes d exactly 1, so s is the quants' sum.
        let mut x = [0.0f32; 32];
        x[..4].copy_from_slice(&[127.0, -0.5, 2.5, -100.25]);
        let mut b = [BlockQ8_1 {
            d: [0; 2],
            s: [0; 2],
            qs: [0; 32],
        }];
        Q8_1::quantize(&x, &mut b);
        assert_eq!(&b[0].qs[..4], &[127, 0, 2, -100]);
        assert_eq!((f16_to_f32(b[0].d), f16_to_f32(b[0].s)), (1.0, 29.0));
    }
}
