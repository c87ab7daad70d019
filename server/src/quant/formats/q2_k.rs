//! Q2_K: super-blocks of 256 two-bit quants in sixteen sub-blocks of 16, each with a 4-bit scale
//! and a 4-bit min, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// `scales[s]`: sub-block s's scale (low nibble) and min (high nibble). Value e (half
    /// h = e/128, group g = e%128/32, l = e%32) is bits 2g..2g+2 of `qs[32h+l]`; value =
    /// `d·scale·q - dmin·min`.
    BlockQ2K, bytes 84, { scales: [u8; 16], qs: [u8; 64], d: [u8; 2], dmin: [u8; 2] }
);

impl BlockQ2K {
    /// The quants (0..3), in element order.
    pub fn values(&self) -> [u8; QK_K] {
        let mut v = [0u8; QK_K];
        for (e, v) in v.iter_mut().enumerate() {
            let (h, g, l) = (e / 128, e % 128 / 32, e % 32);
            *v = (self.qs[32 * h + l] >> (2 * g)) & 3;
        }
        v
    }
}

pub struct Q2K;

impl Format for Q2K {
    type Block = BlockQ2K;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[
        Float::F16(offset_of!(BlockQ2K, d)),
        Float::F16(offset_of!(BlockQ2K, dmin)),
    ];

    fn dequantize(b: &BlockQ2K, out: &mut [f32]) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let values = b.values();
        for ((ys, qs), &sm) in out.chunks_exact_mut(16).zip(values.chunks(16)).zip(&b.scales) {
            let (dl, ml) = (d * (sm & 0xF) as f32, dmin * (sm >> 4) as f32);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * q as f32 - ml;
            }
        }
    }
}

impl Weight for Q2K {
    /// `ggml_vec_dot_q2_K_q8_K_generic`: `d·d_a·Σ scale_s·(q·a)_s - dmin·d_a·Σ min_s·bsum_s`.
    fn dot_ref(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            let values = b.values();
            let (mut sumi, mut summ) = (0i32, 0i32);
            for (s, &sm) in b.scales.iter().enumerate() {
                let dot = scalar::dot_i8(&values[16 * s..16 * s + 16], &y.qs[16 * s..]);
                sumi += (sm & 0xF) as i32 * dot;
                summ += (sm >> 4) as i32 * y.bsum(s);
            }
            y.d() * f16_to_f32(b.d) * sumi as f32 - y.d() * f16_to_f32(b.dmin) * summ as f32
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{dot_1x4_by_1x1, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::simd::super_block::{tiled, Sub16Scales};
    use crate::quant::simd::{hsum, hsum_i32, load128, load256};
    use crate::quant::DotOrder;

    /// A super-block's integer parts as ggml's AVX2 `ggml_vec_dot_q2_K_q8_K` lays them out:
    /// `Σ_s scale_s·(q·a)_s` and `min_2k·bsum_2k + min_2k+1·bsum_2k+1`, each in eight i32 lanes.
    #[inline(always)]
    unsafe fn parts(b: &BlockQ2K, y: &BlockQ8K) -> (__m256i, __m256i) {
        let m4 = _mm_set1_epi8(0x0F);
        let packed = load128(b.scales.as_ptr());
        let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
        let min_sums = _mm256_madd_epi16(mins, load256(y.bsums.as_ptr()));
        let scales = Sub16Scales::new(_mm_and_si128(packed, m4));
        let m3 = _mm256_set1_epi8(3);
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let q = load256(b.qs.as_ptr().add(32 * h));
            for g in 0..4 {
                let shift = _mm_cvtsi32_si128(2 * g as i32);
                let quants = _mm256_and_si256(_mm256_srl_epi16(q, shift), m3);
                let act = load256(y.qs.as_ptr().add(128 * h + 32 * g).cast());
                let p16 = _mm256_maddubs_epi16(quants, act);
                sumi = _mm256_add_epi32(sumi, scales.apply(h, g, p16));
            }
        }
        (sumi, min_sums)
    }

    impl<I: Isa> Kernels<I> for Q2K {
        /// vec_dot: per super-block one FMA of the min lanes by `-d_a·dmin`, then one of the
        /// scaled lanes by `d_a·d`, into the same eight lanes; tiled: `d·sumi - dmin·summ` (the
        /// subtraction fused), then one scalar FMA by `d_a`, as for Q4_K.
        #[inline]
        fn dot_1x1(w: &[BlockQ2K], a: &[BlockQ8K], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            unsafe {
                match order {
                    DotOrder::Tiled => tiled(w, a, |b, y| {
                        let (sumi, min_sums) = parts(b, y);
                        let scaled = f16_to_f32(b.d) * hsum_i32(sumi) as f32;
                        (-f16_to_f32(b.dmin)).mul_add(hsum_i32(min_sums) as f32, scaled)
                    }),
                    _ => {
                        let mut acc = _mm256_setzero_ps();
                        for (b, y) in w.iter().zip(a) {
                            let (sumi, min_sums) = parts(b, y);
                            let neg_dmin = _mm256_set1_ps(-y.d() * f16_to_f32(b.dmin));
                            acc = _mm256_fmadd_ps(neg_dmin, _mm256_cvtepi32_ps(min_sums), acc);
                            let d = _mm256_set1_ps(y.d() * f16_to_f32(b.d));
                            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
                        }
                        hsum(acc)
                    }
                }
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ2K], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            dot_1x4_by_1x1::<Self, I>(w, a, order)
        }
    }
}
