//! Q4_1: 32 four-bit quants with an f16 scale and an f16 offset per block (value = d·q + m),
//! dotted against Q8_1.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_1::BlockQ8_1;
use crate::quant::scalar;

block!(
    /// `d: f16; m: f16; qs: [u8; 16]`: value j is `d * (qs[j] & 15) + m`, value j+16 is
    /// `d * (qs[j] >> 4) + m`.
    BlockQ4_1, bytes 20, { d: [u8; 2], m: [u8; 2], qs: [u8; 16] }
);

impl BlockQ4_1 {
    /// The quants (0..15), in element order.
    pub fn values(&self) -> [u8; QK] {
        let mut v = [0u8; QK];
        for (j, &q) in self.qs.iter().enumerate() {
            v[j] = q & 0xF;
            v[j + 16] = q >> 4;
        }
        v
    }
}

pub struct Q4_1;

impl Format for Q4_1 {
    type Block = BlockQ4_1;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[
        Float::F16(offset_of!(BlockQ4_1, d)),
        Float::F16(offset_of!(BlockQ4_1, m)),
    ];

    fn dequantize(b: &BlockQ4_1, out: &mut [f32]) {
        scalar::dequantize_affine_32(b.d, b.m, b.values(), out);
    }
}

impl Weight for Q4_1 {
    /// `ggml_vec_dot_q4_1_q8_1_generic` (scalar.rs).
    fn dot_ref(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
        scalar::dot_affine_32(w, a, |b| (b.d, b.m, b.values()))
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{dot_x4_by_rows, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::simd::{hsum, load256, nibbles_32};
    use crate::quant::DotOrder;

    impl<I: Isa> Kernels<I> for Q4_1 {
        /// ggml's AVX2 `ggml_vec_dot_q4_1_q8_1`: one FMA chain of `d_w·d_a·(q·a)` over the
        /// blocks into eight lanes, the offsets' `m·s` summed apart (one scalar FMA per block, as
        /// `summs += m*s` compiles on x86-64-v3), added after the horizontal sum.
        #[inline]
        fn dot(w: &[BlockQ4_1], a: &[BlockQ8_1], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); loads stay
            // inside the blocks borrowed from `w` and `a`.
            unsafe {
                let mut acc = _mm256_setzero_ps();
                let mut offsets = 0.0f32;
                for (x, y) in w.iter().zip(a) {
                    offsets = f16_to_f32(x.m).mul_add(f16_to_f32(y.s), offsets);
                    let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
                    // The quants are unsigned, so they can be maddubs' unsigned operand as they
                    // are.
                    let products = _mm256_maddubs_epi16(
                        nibbles_32(x.qs.as_ptr()),
                        load256(y.qs.as_ptr().cast()),
                    );
                    let sumi = _mm256_madd_epi16(products, _mm256_set1_epi16(1));
                    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
                }
                hsum(acc) + offsets
            }
        }

        #[inline]
        fn dot_x4(w: &[BlockQ4_1], a: [&[BlockQ8_1]; 4], order: DotOrder) -> [f32; 4] {
            dot_x4_by_rows::<Self, I>(w, a, order)
        }
    }
}
