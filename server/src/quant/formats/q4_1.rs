//! Q4_1: 32 four-bit quants with an f16 scale and an f16 offset per block (value = d·q + m),
//! dotted against Q8_1.

use std::mem::offset_of;

use crate::quant::blocks::{block, QK};
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

    use crate::quant::format::Kernels;
    use crate::quant::isa::Isa;
    use crate::quant::simd::affine32::{affine_kernels, AffineBlock32};
    use crate::quant::simd::nibbles_32;

    impl AffineBlock32 for BlockQ4_1 {
        #[inline(always)]
        fn dm(&self) -> [u8; 4] {
            [self.d[0], self.d[1], self.m[0], self.m[1]]
        }

        #[inline(always)]
        unsafe fn quants(&self) -> __m256i {
            nibbles_32(self.qs.as_ptr())
        }
    }

    /// [`affine32`](crate::quant::simd::affine32)'s kernels, ggml's vec_dot order in every
    /// entry point.
    impl<I: Isa> Kernels<I> for Q4_1 {
        affine_kernels!(BlockQ4_1);
    }
}
