//! Q5_1: Q4_1 plus a fifth bit per value (32 four-bit quants, a 32-bit mask of high bits, an f16
//! scale and an f16 offset per block: value = d·q + m), dotted against Q8_1.

use std::mem::offset_of;

use crate::quant::blocks::{block, QK};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_1::BlockQ8_1;
use crate::quant::scalar;

block!(
    /// `d: f16; m: f16; qh: u32; qs: [u8; 16]`: value j is `d * ((qs[j] & 15) | bit j of qh << 4)
    /// + m`, value j+16 is `d * ((qs[j] >> 4) | bit j+16 of qh << 4) + m`.
    BlockQ5_1, bytes 24, { d: [u8; 2], m: [u8; 2], qh: [u8; 4], qs: [u8; 16] }
);

impl BlockQ5_1 {
    /// The quants (0..31), in element order.
    pub fn values(&self) -> [u8; QK] {
        let qh = u32::from_le_bytes(self.qh);
        let high = |bit: usize| (((qh >> bit) & 1) << 4) as u8;
        let mut v = [0u8; QK];
        for (j, &q) in self.qs.iter().enumerate() {
            v[j] = (q & 0xF) | high(j);
            v[j + 16] = (q >> 4) | high(j + 16);
        }
        v
    }
}

pub struct Q5_1;

impl Format for Q5_1 {
    type Block = BlockQ5_1;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[
        Float::F16(offset_of!(BlockQ5_1, d)),
        Float::F16(offset_of!(BlockQ5_1, m)),
    ];

    fn dequantize(b: &BlockQ5_1, out: &mut [f32]) {
        scalar::dequantize_affine_32(b.d, b.m, b.values(), out);
    }
}

impl Weight for Q5_1 {
    /// `ggml_vec_dot_q5_1_q8_1_generic` (scalar.rs).
    fn dot_ref(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
        scalar::dot_affine_32(w, a, |b| (b.d, b.m, b.values()))
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::Kernels;
    use crate::quant::isa::Isa;
    use crate::quant::simd::affine32::{affine_kernels, AffineBlock32};
    use crate::quant::simd::{bytes_from_bits_32, nibbles_32};

    impl AffineBlock32 for BlockQ5_1 {
        #[inline(always)]
        fn dm(&self) -> [u8; 4] {
            [self.d[0], self.d[1], self.m[0], self.m[1]]
        }

        #[inline(always)]
        unsafe fn quants(&self) -> __m256i {
            let high = bytes_from_bits_32(u32::from_le_bytes(self.qh));
            _mm256_or_si256(nibbles_32(self.qs.as_ptr()), _mm256_and_si256(high, _mm256_set1_epi8(0x10)))
        }
    }

    /// [`affine32`](crate::quant::simd::affine32)'s kernels, ggml's vec_dot order (Q4_1's) in
    /// every entry point.
    impl<I: Isa> Kernels<I> for Q5_1 {
        affine_kernels!(BlockQ5_1);
    }
}
