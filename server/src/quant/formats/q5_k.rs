//! Q5_K: Q4_K plus a fifth bit per value, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Q4_K plus a fifth bit per value: chunk c (64 values) takes bit 2c of `qh[l]` for value l
    /// and bit 2c+1 for value 32+l.
    BlockQ5K, bytes 176,
    { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }
);

impl BlockQ5K {
    /// The quants (0..31), in element order.
    pub fn values(&self) -> [u8; QK_K] {
        let mut v = [0u8; QK_K];
        for (chunk, qs) in self.qs.chunks_exact(32).enumerate() {
            for (l, (&q, &h)) in qs.iter().zip(&self.qh).enumerate() {
                let high = |bit: usize| ((h >> bit) & 1) << 4;
                v[64 * chunk + l] = (q & 0xF) | high(2 * chunk);
                v[64 * chunk + 32 + l] = (q >> 4) | high(2 * chunk + 1);
            }
        }
        v
    }
}

pub struct Q5K;

impl Format for Q5K {
    type Block = BlockQ5K;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[
        Float::F16(offset_of!(BlockQ5K, d)),
        Float::F16(offset_of!(BlockQ5K, dmin)),
    ];

    fn dequantize(b: &BlockQ5K, out: &mut [f32]) {
        scalar::dequantize_k4(b.d, b.dmin, &b.scales, &b.values(), out);
    }
}

impl Weight for Q5K {
    fn dot_ref(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            scalar::dot_k4(b.d, b.dmin, &b.scales, &b.values(), y)
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{dot_4xn_by_rows, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::simd::{load256, panel_k5};
    use crate::quant::simd::super_block::{k4_dot, k4_dot_n, k4_vec_dot_4rows, K4Block, ScalarMins};
    use crate::quant::DotOrder;

    impl K4Block for BlockQ5K {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        #[inline(always)]
        fn dmin(&self) -> [u8; 2] {
            self.dmin
        }

        #[inline(always)]
        fn scales(&self) -> &[u8; 12] {
            &self.scales
        }

        #[inline(always)]
        unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i) {
            let q = load256(self.qs.as_ptr().add(32 * c));
            let qh = load256(self.qh.as_ptr());
            let m4 = _mm256_set1_epi8(0x0F);
            let bit = _mm256_set1_epi8(1);
            // Bit 2c of qh[l] is value l's fifth bit, bit 2c+1 value 32+l's. Shifting 16-bit
            // lanes by < 8 keeps each byte's own bit 0 after the mask.
            let shift = _mm_cvtsi32_si128(2 * c as i32);
            let h_lo = _mm256_and_si256(_mm256_srl_epi16(qh, shift), bit);
            let shift = _mm_cvtsi32_si128(2 * c as i32 + 1);
            let h_hi = _mm256_and_si256(_mm256_srl_epi16(qh, shift), bit);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h_lo, 4));
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            (lo, _mm256_or_si256(hi, _mm256_slli_epi16(h_hi, 4)))
        }
    }

    impl<I: Isa> Kernels<I> for Q5K {
        /// [`panel_k5::rows`]: the tiled order as a GEMM with weight rows in the lanes.
        #[inline]
        fn rows_xbatch(
            rows: &[u8],
            row_bytes: usize,
            acts: &[&[BlockQ8K]],
            order: DotOrder,
            outs: &mut [&mut [f32]],
        ) -> bool {
            panel_k5::rows::<I>(rows, row_bytes, acts, order, outs)
        }

        /// vec_dot sums the min term in integers, then one scalar FMA ([`ScalarMins`]).
        #[inline]
        fn dot_1x1(w: &[BlockQ5K], a: &[BlockQ8K], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); chunk c
            // reads qs[32c..32c+32] of a 128-byte array (c < 4) and the 32 bytes of qh.
            unsafe { k4_dot::<I, _, ScalarMins>(w, a, order) }
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ5K], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            <Self as Kernels<I>>::dot_1xn(w, a, order)
        }

        /// Decode's mat-vec in the vec_dot order: [`k4_vec_dot_4rows`], four rows' chains at
        /// once; otherwise each row's own dots.
        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[BlockQ5K]; 4],
            a: [&[BlockQ8K]; N],
            order: DotOrder,
        ) -> [[f32; 4]; N] {
            match order {
                // SAFETY: as in `dot_1x1`; the kernel checks the rows' lengths.
                DotOrder::VecDot | DotOrder::Free if N == 1 => unsafe {
                    [k4_vec_dot_4rows::<I, _, ScalarMins>(w, a[0]); N]
                },
                _ => dot_4xn_by_rows::<Self, I, N>(w, a, order),
            }
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockQ5K], a: [&[BlockQ8K]; N], order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe { k4_dot_n::<I, _, ScalarMins, N>(w, a, order) }
        }
    }
}
