//! TQ2_0: ternary super-blocks of 256 values stored as two-bit codes (value = code - 1) with one
//! f16 scale, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Value e (chunk c = e/128, shift s = e%128/32, m = e%32) is bits 2s..2s+2 of `qs[32c+m]`,
    /// minus 1 (codes are 0..2; a 3 decodes as 2).
    BlockTq2_0, bytes 66, { qs: [u8; 64], d: [u8; 2] }
);

impl BlockTq2_0 {
    /// The values (-1..2), in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        for (e, v) in v.iter_mut().enumerate() {
            let (c, s, m) = (e / 128, e % 128 / 32, e % 32);
            *v = ((self.qs[32 * c + m] >> (2 * s)) & 3) as i8 - 1;
        }
        v
    }
}

pub struct Tq2_0;

impl Format for Tq2_0 {
    type Block = BlockTq2_0;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockTq2_0, d))];

    fn dequantize(b: &BlockTq2_0, out: &mut [f32]) {
        let d = f16_to_f32(b.d);
        for (y, q) in out.iter_mut().zip(b.values()) {
            *y = q as f32 * d;
        }
    }
}

impl Weight for Tq2_0 {
    /// `ggml_vec_dot_tq2_0_q8_K_generic`: `Σ(v·a)·(d·d_a)` per super-block.
    fn dot_ref(w: &[BlockTq2_0], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            scalar::dot_i8(&b.values(), &y.qs) as f32 * (f16_to_f32(b.d) * y.d())
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{dot_1x4_by_1x1, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::simd::super_block::ternary_dot;
    use crate::quant::simd::load256;
    use crate::quant::DotOrder;

    impl<I: Isa> Kernels<I> for Tq2_0 {
        /// ggml's AVX2 `ggml_vec_dot_tq2_0_q8_K`: the codes (not the values) are dotted in i16
        /// lanes, the activation's bsums subtracted from them (the -1), see [`ternary_dot`].
        #[inline]
        fn dot_1x1(w: &[BlockTq2_0], a: &[BlockQ8K], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            unsafe {
                ternary_dot(w, a, |b, y| {
                    let m3 = _mm256_set1_epi8(3);
                    let mut sum = _mm256_setzero_si256();
                    for c in 0..2 {
                        let q = load256(b.qs.as_ptr().add(32 * c));
                        for s in 0..4 {
                            let shift = _mm_cvtsi32_si128(2 * s as i32);
                            let codes = _mm256_and_si256(_mm256_srl_epi16(q, shift), m3);
                            let act = load256(y.qs.as_ptr().add(128 * c + 32 * s).cast());
                            sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes, act));
                        }
                    }
                    (b.d, sum)
                })
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockTq2_0], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            dot_1x4_by_1x1::<Self, I>(w, a, order)
        }
    }
}
