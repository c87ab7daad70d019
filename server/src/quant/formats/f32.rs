//! F32: one little-endian f32 per block; dotted against itself.

use crate::quant::blocks::block;
use crate::quant::format::{Activation, Float, Format, Weight};
use crate::quant::scalar;

block!(
    /// One little-endian f32.
    BlockF32, bytes 4, { v: [u8; 4] }
);

impl BlockF32 {
    #[inline(always)]
    pub fn value(&self) -> f32 {
        f32::from_le_bytes(self.v)
    }
}

pub struct F32;

impl Format for F32 {
    type Block = BlockF32;
    const LEN: usize = 1;
    const FLOATS: &'static [Float] = &[Float::F32(0)];

    fn dequantize(b: &BlockF32, out: &mut [f32]) {
        out[0] = b.value();
    }
}

impl Activation for F32 {
    const SUM_ROUNDING: f64 = 0.0;

    fn quantize(x: &[f32], out: &mut [BlockF32]) {
        for (v, o) in x.iter().zip(out) {
            o.v = v.to_le_bytes();
        }
    }
}

impl Weight for F32 {
    fn dot_ref(w: &[BlockF32], a: &[BlockF32]) -> f32 {
        scalar::dot_float(w, a, BlockF32::value)
    }
}

avx2! {
    use std::arch::x86_64::_mm256_loadu_ps;

    use crate::quant::format::{dot_1x4_by_1x1, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::{simd, DotOrder};

    impl<I: Isa> Kernels<I> for F32 {
        #[inline]
        fn dot_1x1(w: &[BlockF32], a: &[BlockF32], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); the float
            // dot loads only whole elements inside both slices.
            unsafe { simd::float::dot(w, a, |p| _mm256_loadu_ps(p.cast()), BlockF32::value) }
        }

        #[inline]
        fn dot_1x4(w: &[BlockF32], a: [&[BlockF32]; 4], order: DotOrder) -> [f32; 4] {
            dot_1x4_by_1x1::<Self, I>(w, a, order)
        }
    }
}
