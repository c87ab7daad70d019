//! Q5_1: Q4_1 plus a fifth bit per value (32 four-bit quants, a 32-bit mask of high bits, an f16
//! scale and an f16 offset per block: value = d·q + m), dotted against Q8_1.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK};
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
    use crate::quant::simd::{bytes_from_bits_32, hsum, load256, nibbles_32};
    use crate::quant::DotOrder;

    impl<I: Isa> Kernels<I> for Q5_1 {
        /// ggml's AVX2 `ggml_vec_dot_q5_1_q8_1`, Q4_1's order: one FMA chain of `d_w·d_a·(q·a)`
        /// over the blocks into eight lanes, the offsets' `m·s` summed apart by scalar FMAs and
        /// added after the horizontal sum.
        #[inline]
        fn dot(w: &[BlockQ5_1], a: &[BlockQ8_1], order: DotOrder) -> f32 {
            let [out] = <Self as Kernels<I>>::dot_n(w, [a], order);
            out
        }

        /// [`Kernels::dot`] against `N` activation rows, each block unpacked once.
        #[inline]
        fn dot_n<const N: usize>(w: &[BlockQ5_1], a: [&[BlockQ8_1]; N], _order: DotOrder) -> [f32; N] {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); loads stay
            // inside the blocks borrowed from `w` and `a`, which hold as many blocks as `w`
            // (checked by the caller).
            unsafe {
                let mut acc = [_mm256_setzero_ps(); N];
                let mut offsets = [0.0f32; N];
                let fifth = _mm256_set1_epi8(0x10);
                for (i, x) in w.iter().enumerate() {
                    let (d_w, m_w) = (f16_to_f32(x.d), f16_to_f32(x.m));
                    let high = _mm256_and_si256(bytes_from_bits_32(u32::from_le_bytes(x.qh)), fifth);
                    // Unsigned quants (0..31) are maddubs' unsigned operand as they are.
                    let quants = _mm256_or_si256(nibbles_32(x.qs.as_ptr()), high);
                    for t in 0..N {
                        let y = &a[t][i];
                        offsets[t] = m_w.mul_add(f16_to_f32(y.s), offsets[t]);
                        let d = _mm256_set1_ps(d_w * f16_to_f32(y.d));
                        let products = _mm256_maddubs_epi16(quants, load256(y.qs.as_ptr().cast()));
                        let sumi = _mm256_madd_epi16(products, _mm256_set1_epi16(1));
                        acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
                    }
                }
                std::array::from_fn(|t| hsum(acc[t]) + offsets[t])
            }
        }

        #[inline]
        fn dot_x4(w: &[BlockQ5_1], a: [&[BlockQ8_1]; 4], order: DotOrder) -> [f32; 4] {
            <Self as Kernels<I>>::dot_n(w, a, order)
        }
    }
}
