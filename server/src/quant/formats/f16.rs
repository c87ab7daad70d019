//! F16: one little-endian IEEE half per block; dotted against itself.

use half::f16;

use crate::quant::blocks::{block, f16_to_f32};
use crate::quant::format::{Activation, Float, Format, Weight};
use crate::quant::scalar;

block!(
    /// One little-endian f16.
    BlockF16, bytes 2, { v: [u8; 2] }
);

impl BlockF16 {
    #[inline(always)]
    pub fn value(&self) -> f32 {
        f16_to_f32(self.v)
    }
}

pub struct F16;

impl Format for F16 {
    type Block = BlockF16;
    const LEN: usize = 1;
    const FLOATS: &'static [Float] = &[Float::F16(0)];

    fn dequantize(b: &BlockF16, out: &mut [f32]) {
        out[0] = b.value();
    }
}

impl Activation for F16 {
    const SUM_ROUNDING: f64 = 0.0;

    /// f32 → f16 as F16C's `vcvtps2ph` with rounding mode 0 (nearest even), which ggml uses on x86.
    fn quantize(x: &[f32], out: &mut [BlockF16]) {
        for (v, o) in x.iter().zip(out) {
            o.v = f16::from_f32(*v).to_le_bytes();
        }
    }
}

impl Weight for F16 {
    fn dot_ref(w: &[BlockF16], a: &[BlockF16]) -> f32 {
        scalar::dot_float(w, a, BlockF16::value)
    }
}

avx2! {
    use std::arch::x86_64::_mm256_cvtph_ps;

    use crate::quant::format::{dot_1x4_by_1x1, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::{simd, DotOrder};

    impl<I: Isa> Kernels<I> for F16 {
        #[inline]
        fn dot_1x1(w: &[BlockF16], a: &[BlockF16], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); the float
            // dot loads only whole elements inside both slices.
            unsafe {
                simd::float::dot(w, a, |p| _mm256_cvtph_ps(simd::load128(p.cast())), BlockF16::value)
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockF16], a: [&[BlockF16]; 4], order: DotOrder) -> [f32; 4] {
            dot_1x4_by_1x1::<Self, I>(w, a, order)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_rounds_to_nearest_even_and_overflows_to_infinity() {
        let x = [
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            65520.0,
            -1e-8,
        ];
        let mut out = [BlockF16 { v: [0; 2] }; 4];
        F16::quantize(&x, &mut out);
        let bits = out.map(|b| u16::from_le_bytes(b.v));
        assert_eq!(bits, [0x3c00, 0x3c02, 0x7c00, 0x8000]);
    }
}
