//! Q8_0: 32 signed bytes and an f16 scale per block. A weight format, and the activation format
//! of every 32-value weight block.

use std::mem::offset_of;

use half::f16;

use crate::quant::blocks::{block, QK};
use crate::quant::format::{Activation, Float, Format, Weight};
use crate::quant::scalar;

block!(
    /// `d: f16; qs: [i8; 32]`: value j is `d * qs[j]`.
    BlockQ8_0, bytes 34, { d: [u8; 2], qs: [i8; 32] }
);

pub struct Q8_0;

impl Format for Q8_0 {
    type Block = BlockQ8_0;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockQ8_0, d))];

    fn dequantize(b: &BlockQ8_0, out: &mut [f32]) {
        scalar::dequantize_32(b.d, b.qs, out);
    }
}

impl Activation for Q8_0 {
    const SUM_ROUNDING: f64 = 0.0;

    /// As `quantize_row_q8_0` in ggml/src/ggml-cpu/arch/x86/quants.c (AVX2 branch):
    /// `d = amax/127` stored as f16 (round to nearest even), `id = 127/amax` (not `1/d` as the
    /// portable `_ref` has), and `x*id` rounded half to even (`_mm256_round_ps(_MM_ROUND_NEAREST)`,
    /// not `roundf`), saturated to i8 by the packs. Parity with llama.cpp's logits depends on
    /// this being exact: a value that rounds the other way moves a logit by d_w*d_a.
    fn quantize(x: &[f32], out: &mut [BlockQ8_0]) {
        // SAFETY: the target has AVX2 (this line is compiled only then).
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
        unsafe {
            quantize_avx2(x, out)
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
        quantize_scalar(x, out)
    }
}

/// [`Q8_0::quantize`] value by value: the definition, which the AVX2 form is tested against.
// Where AVX2 is compiled in, only the tests call it (as the definition).
#[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2"), allow(dead_code))]
fn quantize_scalar(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xs, b) in x.chunks_exact(QK).zip(out) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = f16::from_f32(amax / 127.0).to_le_bytes();
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            // `as` saturates, as the i32→i16→i8 packs do.
            *q = (v * id).round_ties_even() as i8;
        }
    }
}

/// [`Q8_0::quantize`] eight lanes at a time, as ggml's AVX2 branch: the same amax (a max of
/// absolute values, exact in any order), the same scalar `d` and `id`, and `x·id` rounded to
/// nearest even by `vroundps`, exactly `round_ties_even`; |x·id| ≤ 127 needs no saturation.
/// Prefill quantises every activation row once per matmul on one thread, where the scalar form
/// was a visible share of a prefill.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
unsafe fn quantize_avx2(x: &[f32], out: &mut [BlockQ8_0]) {
    use std::arch::x86_64::*;
    for (xs, b) in x.chunks_exact(QK).zip(out) {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xs.as_ptr().add(8 * i)));
        let abs = v.map(|v| _mm256_andnot_ps(_mm256_set1_ps(-0.0), v));
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = f16::from_f32(amax / 127.0).to_le_bytes();
        let q = v.map(|v| {
            let r = _mm256_round_ps(
                _mm256_mul_ps(v, _mm256_set1_ps(id)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            _mm256_cvtps_epi32(r)
        });
        // The packs interleave 128-bit halves; the permutation puts the values back in order.
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), ordered);
    }
}

impl Weight for Q8_0 {
    fn dot_ref(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
        scalar::dot_32(w, a, |b| (b.d, b.qs))
    }
}

avx2! {
    use std::arch::x86_64::__m256i;

    use crate::quant::format::Kernels;
    use crate::quant::isa::Isa;
    use crate::quant::simd::block32::{self, SignedBlock32};
    use crate::quant::simd::load256;
    use crate::quant::DotOrder;

    impl SignedBlock32 for BlockQ8_0 {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        #[inline(always)]
        unsafe fn quants(&self) -> __m256i {
            load256(self.qs.as_ptr().cast())
        }
    }

    impl<I: Isa> Kernels<I> for Q8_0 {
        // Decode's mat-vec: the four-row kernels, each quad requesting the next as it goes.
        block32::free_or_exact_gemv!(BlockQ8_0);

        // [`block32::dot_rows_tiled`]: the activation scales converted once for all the rows.
        block32::tiled_rows!(plain_vec_dot: true);

        #[inline]
        fn dot_1x1(w: &[BlockQ8_0], a: &[BlockQ8_0], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); loads stay
            // inside the blocks borrowed from `w` and `a`.
            unsafe { block32::vec_dot::<I, _>(w, a) }
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ8_0], a: [&[BlockQ8_0]; 4], _order: DotOrder) -> [f32; 4] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe { block32::vec_dot_n::<I, _, _>(w, a) }
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockQ8_0], a: [&[BlockQ8_0]; N], _order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe { block32::vec_dot_n::<I, _, _>(w, a) }
        }

        /// Free, [`block32::vec_dot_4rows_n`] (one pass over the weights for all N activation
        /// rows, summing as [`block32::vec_dot_4rows`] does for one); otherwise each row's exact
        /// chain.
        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[BlockQ8_0]; 4],
            a: [&[BlockQ8_0]; N],
            order: DotOrder,
        ) -> [[f32; 4]; N] {
            // SAFETY: as in `dot_1x1`; the kernels check the rows' lengths.
            unsafe {
                match order {
                    DotOrder::Free if N == 1 => std::array::from_fn(|t| block32::vec_dot_4rows::<I, _>(w, a[t])),
                    DotOrder::Free => block32::vec_dot_4rows_n::<I, _, _>(w, a),
                    _ => block32::vec_dot_4rows_exact_n::<I, _, _>(w, a),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantized(x: &[f32; 32]) -> BlockQ8_0 {
        let mut b = [BlockQ8_0 { d: [0; 2], qs: [0; 32] }];
        Q8_0::quantize(x, &mut b);
        b[0]
    }

    /// The AVX2 quantiser gives the scalar definition's blocks, on values whose `x·id` land on
    /// halves (rounded to even) and on random rows with outliers and zero blocks.
    #[test]
    fn avx2_quantizer_equals_the_scalar_definition() {
        let mut state = 0x9e37_79b9_u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let mut x: Vec<f32> = (0..32 * 64).map(|i| next() * if i % 37 == 0 { 30.0 } else { 1.0 }).collect();
        x[..32].fill(0.0);
        // amax 127: id is 1, so these halves must round to even.
        x[32..40].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, -3.5, 126.5]);
        let mut simd = vec![BlockQ8_0 { d: [0; 2], qs: [0; 32] }; 64];
        let mut scalar = simd.clone();
        Q8_0::quantize(&x, &mut simd);
        super::quantize_scalar(&x, &mut scalar);
        for (i, (a, b)) in simd.iter().zip(&scalar).enumerate() {
            assert_eq!((a.d, a.qs), (b.d, b.qs), "block {i}");
        }
    }

    #[test]
    fn zero_block_has_zero_scale_and_quants() {
        let b = quantized(&[0.0; 32]);
        assert_eq!(b.d, [0, 0]);
        assert_eq!(b.qs, [0; 32]);
    }

    #[test]
    fn rounds_halves_to_even_with_id_127_over_amax() {
        // amax = 127 makes id exactly 1, so x*id are the halves themselves.
        let mut x = [0.0f32; 32];
        x[..8].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, -3.5, 126.5]);
        let b = quantized(&x);
        assert_eq!(&b.qs[..8], &[127, 0, 2, 2, 0, -2, -4, 126]); // roundf would give 1, 3, -1, -3, -4, 127
        assert_eq!(f16::from_le_bytes(b.d).to_f32(), 1.0);
    }

    #[test]
    fn stores_d_rounded_to_nearest_even_f16() {
        // amax/127 = 1 + 3·2^-11 lies halfway between the f16 values 1 + 2^-10 (odd mantissa) and
        // 1 + 2^-9 (even): nearest-even picks the latter, truncation the former.
        let mut x = [0.0f32; 32];
        x[0] = 127.0 * (1.0 + 3.0 * 2f32.powi(-11));
        assert_eq!(u16::from_le_bytes(quantized(&x).d), 0x3c02);
    }

    #[test]
    fn extremes() {
        let mut x = [1e-30f32; 32];
        x[3] = -2e-30;
        let b = quantized(&x);
        assert_eq!(
            b.d,
            [0, 0],
            "amax/127 underflows f16 to zero, as in llama.cpp"
        );
        assert_eq!((b.qs[3], b.qs[0]), (-127, 64)); // the quants still use id = 127/amax
        let mut x = [0.0f32; 32];
        x[0] = -3e38;
        x[1] = 1e38;
        let b = quantized(&x);
        assert_eq!((b.qs[0], b.qs[1]), (-127, 42));
        assert_eq!(f16::from_le_bytes(b.d), f16::INFINITY); // 3e38/127 is beyond f16's range
    }
}
