//! BF16: one little-endian bfloat16 per block; dotted against itself.

use half::bf16;

use crate::quant::blocks::{bf16_to_f32, block};
use crate::quant::format::{Activation, Float, Format, Weight};
use crate::quant::scalar;

block!(
    /// One little-endian bf16 (the top half of an f32).
    BlockBf16, bytes 2, { v: [u8; 2] }
);

impl BlockBf16 {
    #[inline(always)]
    pub fn value(&self) -> f32 {
        bf16_to_f32(self.v)
    }
}

pub struct Bf16;

impl Format for Bf16 {
    type Block = BlockBf16;
    const LEN: usize = 1;
    const FLOATS: &'static [Float] = &[Float::Bf16(0)];

    fn dequantize(b: &BlockBf16, out: &mut [f32]) {
        out[0] = b.value();
    }
}

impl Activation for Bf16 {
    const SUM_ROUNDING: f64 = 0.0;

    /// f32 → bf16 as `ggml_compute_fp32_to_bf16`: round to nearest even on the raw bits, and a
    /// NaN keeps its top bits with the quiet bit forced (so it cannot round into infinity).
    fn quantize(x: &[f32], out: &mut [BlockBf16]) {
        for (v, o) in x.iter().zip(out) {
            let u = v.to_bits();
            let bits = if u & 0x7fff_ffff > 0x7f80_0000 {
                (u >> 16) as u16 | 64
            } else {
                (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
            };
            o.v = bf16::from_bits(bits).to_le_bytes();
        }
    }
}

impl Weight for Bf16 {
    fn dot_ref(w: &[BlockBf16], a: &[BlockBf16]) -> f32 {
        scalar::dot_float(w, a, BlockBf16::value)
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{dot_1x4_by_1x1, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::{simd, DotOrder};

    impl<I: Isa> Kernels<I> for Bf16 {
        #[inline]
        fn dot_1x1(w: &[BlockBf16], a: &[BlockBf16], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); the float
            // dot loads only whole elements inside both slices.
            unsafe {
                simd::float::dot(
                    w,
                    a,
                    // bf16 is the top half of an f32: widen to 32 bits and shift into place.
                    |p| {
                        let wide = _mm256_cvtepu16_epi32(simd::load128(p.cast()));
                        _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
                    },
                    BlockBf16::value,
                )
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockBf16], a: [&[BlockBf16]; 4], order: DotOrder) -> [f32; 4] {
            dot_1x4_by_1x1::<Self, I>(w, a, order)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_matches_ggml() {
        let x = [
            1.0 + 2f32.powi(-8),         // halfway, even neighbour is 1.0
            1.0 + 3.0 * 2f32.powi(-8),   // halfway, even neighbour is 1 + 2^-6
            f32::MAX,                    // rounds up into infinity, as ggml's bit trick does
            f32::from_bits(0x7f80_0001), // signalling NaN: kept NaN and made quiet
            f32::from_bits(0xffff_ffff), // NaN whose rounding would carry out of the exponent
        ];
        let mut out = [BlockBf16 { v: [0; 2] }; 5];
        Bf16::quantize(&x, &mut out);
        let bits = out.map(|b| u16::from_le_bytes(b.v));
        assert_eq!(bits, [0x3f80, 0x3f82, 0x7f80, 0x7fc0, 0xffff]);
    }
}
