//! TQ1_0: ternary super-blocks of 256 values packed five to a byte (3^5 = 243 < 256) with one f16
//! scale, dotted against Q8_K.
//!
//! A byte holds its trits as a base-3 fraction: multiplying it by 3^n (mod 256) brings trit n to
//! the top, and `(q·3) >> 8` reads it (ggml's `dequantize_row_tq1_0`).

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Values 0..160: trit n of `qs[m]` (m < 32) is value 32n+m; values 160..240: trit n of
    /// `qs[32+m]` (m < 16) is value 160+16n+m; values 240..256: trit n of `qh[j]` (n < 4) is value
    /// 240+4n+j. Each value is its trit minus 1.
    BlockTq1_0, bytes 54, { qs: [u8; 48], qh: [u8; 4], d: [u8; 2] }
);

/// 3^n for the trits of a byte.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// The top trit of `q` (0..2 for any byte).
fn top_trit(q: u8) -> i8 {
    ((q as u16 * 3) >> 8) as i8
}

impl BlockTq1_0 {
    /// The values (-1..1), in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        let mut at = 0;
        for (bytes, trits) in [(&self.qs[..32], 5), (&self.qs[32..], 5), (&self.qh[..], 4)] {
            for &p in &POW3[..trits] {
                for &q in bytes {
                    v[at] = top_trit(q.wrapping_mul(p)) - 1;
                    at += 1;
                }
            }
        }
        v
    }
}

pub struct Tq1_0;

impl Format for Tq1_0 {
    type Block = BlockTq1_0;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockTq1_0, d))];

    fn dequantize(b: &BlockTq1_0, out: &mut [f32]) {
        let d = f16_to_f32(b.d);
        for (y, q) in out.iter_mut().zip(b.values()) {
            *y = q as f32 * d;
        }
    }
}

impl Weight for Tq1_0 {
    /// `ggml_vec_dot_tq1_0_q8_K_generic`: `Σ(v·a)·(d·d_a)` per super-block.
    fn dot_ref(w: &[BlockTq1_0], a: &[BlockQ8K]) -> f32 {
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
    use crate::quant::simd::{load128, load256};
    use crate::quant::DotOrder;

    /// `3·q` per byte, mod 256.
    #[inline(always)]
    unsafe fn times3(q: __m256i) -> __m256i {
        _mm256_add_epi8(q, _mm256_add_epi8(q, q))
    }

    /// `9·q` per byte, mod 256: `8·q` by a 16-bit shift with each byte's carries masked off.
    #[inline(always)]
    unsafe fn times9(q: __m256i) -> __m256i {
        let eight = _mm256_and_si256(_mm256_slli_epi16(q, 3), _mm256_set1_epi8(-8));
        _mm256_add_epi8(eight, q)
    }

    /// [`top_trit`] per byte without a byte multiply: `(q·3) >> 8` is `(q' + (q'+1)/2 + 1)/2 >> 6`
    /// for `q' = q - 1` saturated at 0, i.e. two rounding averages (equal for every byte: see
    /// the test below).
    #[inline(always)]
    unsafe fn top_trits(q: __m256i) -> __m256i {
        let q = _mm256_subs_epu8(q, _mm256_set1_epi8(1));
        let t = _mm256_avg_epu8(q, _mm256_avg_epu8(q, _mm256_setzero_si256()));
        _mm256_and_si256(_mm256_srli_epi16(t, 6), _mm256_set1_epi8(3))
    }

    impl<I: Isa> Kernels<I> for Tq1_0 {
        /// ggml's AVX2 `ggml_vec_dot_tq1_0_q8_K`: trits (values + 1) dotted in i16 lanes in
        /// element order, see [`ternary_dot`].
        #[inline]
        fn dot_1x1(w: &[BlockTq1_0], a: &[BlockQ8K], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            unsafe {
                ternary_dot(w, a, |b, y| {
                    // Values 0..160: the five trits of qs[0..32].
                    let q = load256(b.qs.as_ptr());
                    let (q3, q9) = (times3(q), times9(q));
                    let first = [q, q3, q9, times9(q3), times9(q9)];
                    // Values 160..256: the five trits of qs[32..48], then the four of qh, 16
                    // bytes per trit.
                    let q = _mm256_broadcastsi128_si256(load128(b.qs.as_ptr().add(32)));
                    let (q3, q9) = (times3(q), times9(q));
                    let mut qh = [0u8; 16];
                    for (n, &p) in POW3[..4].iter().enumerate() {
                        for (j, &h) in b.qh.iter().enumerate() {
                            qh[4 * n + j] = h.wrapping_mul(p);
                        }
                    }
                    let upper = |lo: __m256i, hi: __m256i| _mm256_blend_epi32(lo, hi, 0xF0);
                    let second = [
                        upper(q, q3),
                        upper(q9, times9(q3)),
                        _mm256_set_m128i(load128(qh.as_ptr()), _mm256_castsi256_si128(times9(q9))),
                    ];
                    let mut sum = _mm256_setzero_si256();
                    for (i, bytes) in first.into_iter().chain(second).enumerate() {
                        let act = load256(y.qs.as_ptr().add(32 * i).cast());
                        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(top_trits(bytes), act));
                    }
                    (b.d, sum)
                })
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockTq1_0], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            dot_1x4_by_1x1::<Self, I>(w, a, order)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn averaged_top_trit_equals_the_multiply_for_every_byte() {
            let bytes: Vec<u8> = (0..=255).collect();
            for chunk in bytes.chunks(32) {
                let mut out = [0u8; 32];
                // SAFETY: compiled only for AVX2 targets; loads and stores stay in 32-byte arrays.
                unsafe {
                    let t = top_trits(load256(chunk.as_ptr()));
                    _mm256_storeu_si256(out.as_mut_ptr().cast(), t);
                }
                for (&q, &t) in chunk.iter().zip(&out) {
                    assert_eq!(t as i8, top_trit(q), "byte {q}");
                }
            }
        }
    }
}
