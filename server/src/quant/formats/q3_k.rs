//! Q3_K: super-blocks of 256 three-bit quants (two low bits in `qs`, the third in `hmask`) in
//! sixteen sub-blocks of 16 with 6-bit scales, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Value e (half h = e/128, group g = e%128/32, l = e%32) has its low two bits at bit 2g of
    /// `qs[32h+l]` and is `low - 4` unless bit 4h+g of `hmask[l]` is set. Sixteen 6-bit scales,
    /// stored +32, packed in twelve bytes (see [`BlockQ3K::scales`]); `d` last.
    BlockQ3K, bytes 110, { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: [u8; 2] }
);

impl BlockQ3K {
    /// The quants (-4..3), in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        for (e, v) in v.iter_mut().enumerate() {
            let (h, g, l) = (e / 128, e % 128 / 32, e % 32);
            let low = (self.qs[32 * h + l] >> (2 * g)) & 3;
            let high = (self.hmask[l] >> (4 * h + g)) & 1;
            *v = low as i8 - if high == 1 { 0 } else { 4 };
        }
        v
    }

    /// The sixteen scales (-32..31). Scale s has its low four bits in the nibbles of bytes
    /// 0..8 (s < 8: low nibble of byte s; else the high nibble of byte s-8) and its top two bits
    /// at bit 2·(s/4) of byte 8 + s%4 (ggml's kmask unpacking, on u32 words).
    pub fn scales(&self) -> [i8; 16] {
        const LOW4: u32 = 0x0f0f_0f0f;
        const LOW2: u32 = 0x0303_0303;
        let w = |i: usize| u32::from_le_bytes(self.scales[4 * i..4 * i + 4].try_into().unwrap());
        let (a0, a1, a2) = (w(0), w(1), w(2));
        let words = [
            (a0 & LOW4) | ((a2 & LOW2) << 4),
            (a1 & LOW4) | (((a2 >> 2) & LOW2) << 4),
            ((a0 >> 4) & LOW4) | (((a2 >> 4) & LOW2) << 4),
            ((a1 >> 4) & LOW4) | (((a2 >> 6) & LOW2) << 4),
        ];
        let mut out = [0i8; 16];
        for (i, word) in words.into_iter().enumerate() {
            for (o, b) in out[4 * i..4 * i + 4].iter_mut().zip(word.to_le_bytes()) {
                *o = b as i8 - 32;
            }
        }
        out
    }
}

pub struct Q3K;

impl Format for Q3K {
    type Block = BlockQ3K;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockQ3K, d))];

    fn dequantize(b: &BlockQ3K, out: &mut [f32]) {
        let d = f16_to_f32(b.d);
        let values = b.values();
        for ((ys, qs), sc) in out.chunks_exact_mut(16).zip(values.chunks(16)).zip(b.scales()) {
            let dl = d * sc as f32;
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * q as f32;
            }
        }
    }
}

impl Weight for Q3K {
    fn dot_ref(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            let values = b.values();
            let sumi: i32 = (b.scales().iter().enumerate())
                .map(|(s, &sc)| {
                    sc as i32 * scalar::dot_i8(&values[16 * s..16 * s + 16], &y.qs[16 * s..])
                })
                .sum();
            f16_to_f32(b.d) * y.d() * sumi as f32
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{dot_1x4_by_1x1, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::simd::super_block::{scaled_dot, ScaledBlock, Sub16Scales};
    use crate::quant::simd::{load128, load256};
    use crate::quant::DotOrder;

    impl ScaledBlock for BlockQ3K {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        /// As ggml's AVX2 `ggml_vec_dot_q3_K_q8_K`: the two low bits and the "minus 4 where the
        /// high bit is clear" are multiplied apart (maddubs needs unsigned quants) and
        /// subtracted in i16, then scaled per sub-block.
        #[inline(always)]
        unsafe fn sumi(&self, y: &BlockQ8K) -> __m256i {
            let sc = self.scales();
            let scales = Sub16Scales::new(load128(sc.as_ptr().cast()));
            let hbits = load256(self.hmask.as_ptr());
            let m3 = _mm256_set1_epi8(3);
            let four = _mm256_set1_epi8(4);
            let zero = _mm256_setzero_si256();
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let q = load256(self.qs.as_ptr().add(32 * h));
                for g in 0..4 {
                    let shift = _mm_cvtsi32_si128(2 * g as i32);
                    let low = _mm256_and_si256(_mm256_srl_epi16(q, shift), m3);
                    let bit = _mm256_set1_epi8((1u8 << (4 * h + g)) as i8);
                    let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), zero);
                    let minus = _mm256_and_si256(clear, four);
                    let act = load256(y.qs.as_ptr().add(128 * h + 32 * g).cast());
                    let p16 = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(low, act),
                        _mm256_maddubs_epi16(minus, act),
                    );
                    sumi = _mm256_add_epi32(sumi, scales.apply(h, g, p16));
                }
            }
            sumi
        }
    }

    impl<I: Isa> Kernels<I> for Q3K {
        #[inline]
        fn dot_1x1(w: &[BlockQ3K], a: &[BlockQ8K], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            unsafe { scaled_dot(w, a, order) }
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ3K], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            dot_1x4_by_1x1::<Self, I>(w, a, order)
        }
    }
}
