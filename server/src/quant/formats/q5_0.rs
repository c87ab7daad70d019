//! Q5_0: Q4_0's nibbles plus a fifth bit per value, offset by 16, dotted against Q8_0.

use std::mem::offset_of;

use crate::quant::blocks::{block, QK};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_0::BlockQ8_0;
use crate::quant::scalar;

block!(
    /// Q4_0's nibbles plus a fifth bit per value in `qh` (a little-endian u32, bit i for value i);
    /// values are `q - 16`.
    BlockQ5_0, bytes 22, { d: [u8; 2], qh: [u8; 4], qs: [u8; 16] }
);

impl BlockQ5_0 {
    /// The quants as signed values (-16..15), in element order.
    pub fn values(&self) -> [i8; QK] {
        let qh = u32::from_le_bytes(self.qh);
        let mut v = [0i8; QK];
        for (j, &q) in self.qs.iter().enumerate() {
            let high = |bit: usize| (((qh >> bit) & 1) << 4) as u8;
            v[j] = ((q & 0xF) | high(j)) as i8 - 16;
            v[j + 16] = ((q >> 4) | high(j + 16)) as i8 - 16;
        }
        v
    }
}

pub struct Q5_0;

impl Format for Q5_0 {
    type Block = BlockQ5_0;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockQ5_0, d))];

    fn dequantize(b: &BlockQ5_0, out: &mut [f32]) {
        scalar::dequantize_32(b.d, b.values(), out);
    }
}

impl Weight for Q5_0 {
    fn dot_ref(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
        scalar::dot_32(w, a, |b| (b.d, b.values()))
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::Kernels;
    use crate::quant::isa::Isa;
    use crate::quant::simd::block32::{self, SignedBlock32};
    use crate::quant::simd::{bytes_from_bits_32, nibbles_32};
    use crate::quant::DotOrder;

    impl SignedBlock32 for BlockQ5_0 {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        #[inline(always)]
        unsafe fn quants(&self) -> __m256i {
            // q - 16 = nibble - 16 when the fifth bit is clear: OR-ing 0xF0 into the nibble gives
            // exactly that as a signed byte, and leaves it alone when the bit is set.
            let clear = _mm256_andnot_si256(
                bytes_from_bits_32(u32::from_le_bytes(self.qh)),
                _mm256_set1_epi8(0xF0u8 as i8),
            );
            _mm256_or_si256(nibbles_32(self.qs.as_ptr()), clear)
        }

        const OFFSET: Option<i32> = Some(16);

        #[inline(always)]
        unsafe fn unsigned_quants(&self) -> __m256i {
            // The fifth bit as 16 on the nibble: the quant plus 16.
            let high = _mm256_and_si256(
                bytes_from_bits_32(u32::from_le_bytes(self.qh)),
                _mm256_set1_epi8(0x10),
            );
            _mm256_or_si256(nibbles_32(self.qs.as_ptr()), high)
        }
    }

    impl<I: Isa> Kernels<I> for Q5_0 {
        // Decode's mat-vec: the four-row kernels, each quad requesting the next as it goes.
        block32::free_or_exact_gemv!(BlockQ5_0);

        // [`block32::dot_rows_tiled`]: the activation scales converted once for all the rows.
        block32::tiled_rows!(plain_vec_dot: true);

        #[inline]
        fn dot_1x1(w: &[BlockQ5_0], a: &[BlockQ8_0], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); loads stay
            // inside the blocks borrowed from `w` and `a`.
            unsafe { block32::vec_dot::<I, _>(w, a) }
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ5_0], a: [&[BlockQ8_0]; 4], _order: DotOrder) -> [f32; 4] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe { block32::vec_dot_n::<I, _, _>(w, a) }
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockQ5_0], a: [&[BlockQ8_0]; N], _order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe { block32::vec_dot_n::<I, _, _>(w, a) }
        }

        /// Free, [`block32::vec_dot_4rows_n`] (one pass over the weights for all N activation
        /// rows, summing as [`block32::vec_dot_4rows`] does for one); otherwise each row's exact
        /// chain.
        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[BlockQ5_0]; 4],
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
