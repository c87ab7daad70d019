//! Q8_K: the activation format of K-quant weights, 256 signed bytes with an f32 scale and sums of
//! each 16, from which the weights' mins and offsets are taken.

use std::mem::offset_of;

use crate::quant::blocks::{block, QK_K};
use crate::quant::format::{Activation, Float, Format};

block!(
    /// f32 `d`, and `bsums[k]` (i16) = sum of `qs[16k..16k+16]`.
    BlockQ8K, bytes 292, { d: [u8; 4], qs: [i8; 256], bsums: [u8; 32] }
);

impl BlockQ8K {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    #[inline(always)]
    pub fn bsum(&self, k: usize) -> i32 {
        i16::from_le_bytes([self.bsums[2 * k], self.bsums[2 * k + 1]]) as i32
    }
}

pub struct Q8K;

impl Format for Q8K {
    type Block = BlockQ8K;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F32(offset_of!(BlockQ8K, d))];

    fn dequantize(b: &BlockQ8K, out: &mut [f32]) {
        for (y, &q) in out.iter_mut().zip(&b.qs) {
            *y = b.d() * q as f32;
        }
    }
}

impl Activation for Q8K {
    const SUM_ROUNDING: f64 = 0.0;

    /// As `quantize_row_q8_K_ref` in ggml/src/ggml-quants.c (x86 calls it directly): the scale
    /// comes from the signed value of largest magnitude, `iscale = -127/max`, quants are
    /// `min(127, nearest_int(iscale*x))` and `d = 1/iscale` (negative when max > 0). An all-zero
    /// block gets d = 0 and zero quants; ggml leaves its bsums unwritten there, we store zeros.
    fn quantize(x: &[f32], out: &mut [BlockQ8K]) {
        for (xs, b) in x.chunks_exact(QK_K).zip(out) {
            let (amax, max) = largest(xs);
            if amax == 0.0 {
                *b = BlockQ8K {
                    d: [0; 4],
                    qs: [0; QK_K],
                    bsums: [0; 32],
                };
                continue;
            }
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(xs) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (k, sum) in b.bsums.chunks_exact_mut(2).enumerate() {
                let s: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i32).sum();
                sum.copy_from_slice(&(s as i16).to_le_bytes());
            }
            b.d = (1.0 / iscale).to_le_bytes();
        }
    }
}

/// The largest magnitude of `xs` (a multiple of 8 long) and the first value that has it: what
/// ggml's scan with a strict `>` keeps (NaN never wins; 0 for a block of zeros). Eight lanes of
/// maxima first, which the compiler makes one `vmaxps` per eight values, where the scan's
/// running maximum was a chain of scalar compares (80 % of this function's time in perf).
fn largest(xs: &[f32]) -> (f32, f32) {
    let mut lanes = [0f32; 8];
    for chunk in xs.chunks_exact(8) {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    let amax = lanes.into_iter().fold(0.0, |m, a| if a > m { a } else { m });
    // The first value of that magnitude is the one the scan stopped updating at.
    let max = xs.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    (amax, max)
}

/// ggml's `nearest_int`: adding 1.5·2²³ leaves the integer part, rounded half to even, in the low
/// mantissa bits. Valid for |x| < 2²²; the callers' values are within ±127.
fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantized(x: &[f32]) -> BlockQ8K {
        let mut b = [BlockQ8K {
            d: [0; 4],
            qs: [0; QK_K],
            bsums: [0; 32],
        }];
        Q8K::quantize(x, &mut b);
        b[0]
    }

    #[test]
    fn zero_block() {
        let b = quantized(&[0.0; 256]);
        assert_eq!((b.d(), b.qs, b.bsums), (0.0, [0; 256], [0; 32]));
    }

    #[test]
    fn scale_takes_the_sign_of_the_largest_magnitude() {
        // max = 63.5 makes iscale = -127/63.5 = -2 exactly.
        let mut x = [0.0f32; 256];
        x[0] = 63.5;
        x[1] = -31.75;
        let b = quantized(&x);
        assert_eq!(b.d(), -0.5);
        assert_eq!((b.qs[0], b.qs[1]), (-127, 64)); // -2 · -31.75 = 63.5 → 64 (even)
        x[0] = -63.5;
        let b = quantized(&x);
        assert_eq!(b.d(), 0.5);
        assert_eq!((b.qs[0], b.qs[1]), (-127, -64));
        // Ties in magnitude: the first one met sets the sign.
        x[2] = 63.5;
        assert_eq!(quantized(&x).d(), 0.5);
    }

    /// [`largest`] against ggml's scan, on values with ties in magnitude of both signs, NaNs
    /// and zeros.
    #[test]
    fn largest_is_the_first_value_of_largest_magnitude() {
        let scan = |xs: &[f32]| {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in xs {
                if v.abs() > amax {
                    (amax, max) = (v.abs(), v);
                }
            }
            (amax, max)
        };
        let mut state = 7u32;
        for case in 0..400 {
            let xs: Vec<f32> = (0..256)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    match state >> 28 {
                        0 => f32::NAN,
                        1 | 2 => 0.0,
                        // Few distinct magnitudes, so the largest is tied, with either sign.
                        r => (r % 5) as f32 * if state & 0x100 == 0 { 1.0 } else { -1.0 },
                    }
                })
                .collect();
            let (got, want) = (largest(&xs), scan(&xs));
            assert_eq!(got.0.to_bits(), want.0.to_bits(), "case {case}");
            if want.0 > 0.0 {
                assert_eq!(got.1.to_bits(), want.1.to_bits(), "case {case}");
            }
        }
        assert_eq!(largest(&[0.0; 8]).0, 0.0);
        assert_eq!(largest(&[f32::NAN; 8]).0, 0.0);
    }

    #[test]
    fn rounds_halves_to_even_and_sums_groups_of_16() {
        // max = -127 makes iscale exactly 1.
        let mut x = [0.0f32; 256];
        x[..6].copy_from_slice(&[-127.0, 0.5, 1.5, 2.5, -2.5, 3.5]);
        x[16] = 7.0;
        x[255] = -1.0;
        let b = quantized(&x);
        assert_eq!(&b.qs[..6], &[-127, 0, 2, 2, -2, 4]);
        assert_eq!((b.bsum(0), b.bsum(1), b.bsum(15)), (-127 + 6, 7, -1));
        assert_eq!(b.d(), 1.0);
    }
}
