//! Q4_0: 32 four-bit quants offset by 8 and an f16 scale per block, dotted against Q8_0.

use std::mem::offset_of;

use crate::quant::blocks::{block, QK};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_0::BlockQ8_0;
use crate::quant::scalar;

block!(
    /// `d: f16; qs: [u8; 16]`: value j is `(qs[j] & 15) - 8`, value j+16 is `(qs[j] >> 4) - 8`.
    BlockQ4_0, bytes 18, { d: [u8; 2], qs: [u8; 16] }
);

impl BlockQ4_0 {
    /// The quants as signed values (-8..7), in element order.
    pub fn values(&self) -> [i8; QK] {
        let mut v = [0i8; QK];
        for (j, &q) in self.qs.iter().enumerate() {
            v[j] = (q & 0xF) as i8 - 8;
            v[j + 16] = (q >> 4) as i8 - 8;
        }
        v
    }
}

pub struct Q4_0;

impl Format for Q4_0 {
    type Block = BlockQ4_0;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockQ4_0, d))];

    fn dequantize(b: &BlockQ4_0, out: &mut [f32]) {
        scalar::dequantize_32(b.d, b.values(), out);
    }
}

impl Weight for Q4_0 {
    fn dot_ref(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
        scalar::dot_32(w, a, |b| (b.d, b.values()))
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::Kernels;
    use crate::quant::isa::Isa;
    use crate::quant::simd::block32::{self, SignedBlock32};
    use crate::quant::simd::gemv_nibbles::{self, NibbleBlock};
    use crate::quant::simd::panel;
    use crate::quant::simd::nibbles_32;
    use crate::quant::DotOrder;

    impl SignedBlock32 for BlockQ4_0 {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        #[inline(always)]
        unsafe fn quants(&self) -> __m256i {
            _mm256_sub_epi8(nibbles_32(self.qs.as_ptr()), _mm256_set1_epi8(8))
        }

        const OFFSET: Option<i32> = Some(8);

        #[inline(always)]
        unsafe fn unsigned_quants(&self) -> __m256i {
            nibbles_32(self.qs.as_ptr())
        }
    }

    impl NibbleBlock for BlockQ4_0 {
        #[inline(always)]
        fn qs(&self) -> &[u8; 16] {
            &self.qs
        }

        #[inline(always)]
        fn offset<I: Isa>() -> i32 {
            8
        }

        /// `maddubs` of the nibbles by the activations into i16 lanes, reduced by three rounds
        /// of `phaddw`: exact, because 16 products of a nibble (≤ 15) and an activation
        /// (|a| ≤ 127) are at most 30480 < 2¹⁵. (Not VNNI's `vpdpbusd` into i32 lanes: it was no
        /// faster from L2 and slower from memory.)
        #[inline(always)]
        unsafe fn sums<I: Isa>(pairs: [(__m256i, __m256i); 4], a_lo: __m256i, a_hi: __m256i) -> __m256i {
            let [p0, p1, p2, p3] = pairs.map(|(lo, hi)| {
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_lo), _mm256_maddubs_epi16(hi, a_hi))
            });
            let h = _mm256_hadd_epi16(_mm256_hadd_epi16(p0, p1), _mm256_hadd_epi16(p2, p3));
            _mm256_madd_epi16(h, _mm256_set1_epi16(1))
        }
    }

    impl<I: Isa> Kernels<I> for Q4_0 {
        // [`block32::dot_rows_tiled`]: the activation scales converted once for all the rows.
        block32::tiled_rows!(plain_vec_dot: true);

        /// [`panel::rows`]: the repacked order as a GEMM with weight rows in the lanes.
        #[inline]
        fn rows_xbatch(
            rows: &[u8],
            row_bytes: usize,
            acts: &[&[BlockQ8_0]],
            order: DotOrder,
            outs: &mut [&mut [f32]],
        ) -> bool {
            panel::rows::<Self, I>(rows, row_bytes, acts, order, outs)
        }

        /// Repacked, [`gemv_nibbles::rows`], eight rows at a time; otherwise
        /// [`Kernels::dot_4xn`]' kernels quad by quad, each requesting the next as it goes
        /// ([`block32::repacked_rows`], [`block32::free_or_exact_rows`]). (Not eight rows where
        /// the order is free: there several activation rows take `dot_4xn`, whose order a
        /// single row must share.)
        #[inline]
        fn rows_x1(
            rows: &[u8],
            row_bytes: usize,
            a: &[BlockQ8_0],
            order: DotOrder,
            out: &mut [f32],
        ) -> usize {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); the
            // kernels check the lengths they rely on.
            unsafe {
                // Eight rows at a time as far as they go (rows wider than its table: none),
                // the rest four at a time.
                let done = match order {
                    DotOrder::Repacked => gemv_nibbles::rows::<I, BlockQ4_0>(rows, row_bytes, a, out),
                    _ => 0,
                };
                let (rows, out) = (&rows[done * row_bytes..], &mut out[done..]);
                done + match order {
                    DotOrder::Repacked => {
                        block32::repacked_rows::<I, BlockQ4_0>(rows, row_bytes, a, out)
                    }
                    _ => block32::free_or_exact_rows::<I, BlockQ4_0>(order, rows, row_bytes, a, out),
                }
            }
        }

        /// [`block32::free_or_exact_rows_n`]: quads for a batch of streams, each requesting the
        /// next as it goes; repacked, [`gemv_nibbles::rows_n`] (eight rows for all the streams
        /// at a time, the rest row by row), and for rows wider than its table
        /// [`gemv_slabs`](crate::quant::gemv_slabs) (each stream [`Kernels::rows_x1`]' mat-vec
        /// over slabs of rows).
        #[inline]
        fn rows_xn<const N: usize>(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8_0]; N],
            order: DotOrder,
            outs: &mut [&mut [f32]],
        ) -> usize {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); the
            // kernels check the lengths they rely on.
            unsafe {
                if order != DotOrder::Repacked {
                    return block32::free_or_exact_rows_n::<I, BlockQ4_0, N>(order, rows, row_bytes, a, outs);
                }
                match gemv_nibbles::rows_n::<I, BlockQ4_0, N>(rows, row_bytes, a, outs) {
                    0 => crate::quant::gemv_slabs::<Self, I, N>(order, row_bytes, rows, a, outs),
                    done => done,
                }
            }
        }

        #[inline]
        fn dot_1x1(w: &[BlockQ4_0], a: &[BlockQ8_0], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); loads stay
            // inside the blocks borrowed from `w` and `a`.
            unsafe {
                match order {
                    DotOrder::Repacked => block32::repacked::<I, _>(w, a),
                    _ => block32::vec_dot::<I, _>(w, a),
                }
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ4_0], a: [&[BlockQ8_0]; 4], order: DotOrder) -> [f32; 4] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe {
                match order {
                    DotOrder::Repacked => block32::repacked_n::<I, _, _>(w, a),
                    _ => block32::vec_dot_n::<I, _, _>(w, a),
                }
            }
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockQ4_0], a: [&[BlockQ8_0]; N], order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe {
                match order {
                    DotOrder::Repacked => block32::repacked_n::<I, _, _>(w, a),
                    _ => block32::vec_dot_n::<I, _, _>(w, a),
                }
            }
        }

        /// Free, [`block32::vec_dot_4rows_n`] (one pass over the weights for all N activation
        /// rows, summing as [`block32::vec_dot_4rows`] does for one); otherwise each row's exact
        /// chain.
        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[BlockQ4_0]; 4],
            a: [&[BlockQ8_0]; N],
            order: DotOrder,
        ) -> [[f32; 4]; N] {
            // SAFETY: as in `dot_1x1`; the kernels check the rows' lengths.
            unsafe {
                match order {
                    DotOrder::Free if N == 1 => std::array::from_fn(|t| block32::vec_dot_4rows::<I, _>(w, a[t])),
                    DotOrder::Free => block32::vec_dot_4rows_n::<I, _, _>(w, a),
                    DotOrder::Repacked => std::array::from_fn(|t| block32::repacked_4rows::<I, _>(w, a[t])),
                    _ => block32::vec_dot_4rows_exact_n::<I, _, _>(w, a),
                }
            }
        }
    }
}
