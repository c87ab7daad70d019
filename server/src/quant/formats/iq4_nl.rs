//! IQ4_NL: Q4_0's nibble order, each nibble indexing a non-uniform grid, dotted against Q8_0.

use std::mem::offset_of;

use crate::quant::blocks::{block, KVALUES_IQ4NL, QK};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_0::BlockQ8_0;
use crate::quant::scalar;

block!(
    /// Q4_0's nibble order, each nibble indexing [`KVALUES_IQ4NL`].
    BlockIq4Nl, bytes 18, { d: [u8; 2], qs: [u8; 16] }
);

impl BlockIq4Nl {
    /// The quants looked up in the grid, in element order.
    pub fn values(&self) -> [i8; QK] {
        let mut v = [0i8; QK];
        for (j, &q) in self.qs.iter().enumerate() {
            v[j] = KVALUES_IQ4NL[(q & 0xF) as usize];
            v[j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
        }
        v
    }
}

pub struct Iq4Nl;

impl Format for Iq4Nl {
    type Block = BlockIq4Nl;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockIq4Nl, d))];

    fn dequantize(b: &BlockIq4Nl, out: &mut [f32]) {
        scalar::dequantize_32(b.d, b.values(), out);
    }
}

impl Weight for Iq4Nl {
    fn dot_ref(w: &[BlockIq4Nl], a: &[BlockQ8_0]) -> f32 {
        scalar::dot_32(w, a, |b| (b.d, b.values()))
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{dot_4xn_by_rows, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::blocks::f16_to_f32;
    use crate::quant::simd::block32::{self, SignedBlock32};
    use crate::quant::simd::panel;
    use crate::quant::simd::iq4::{self, broadcast_f16, dot_i16, grid_i16, sum_lanes_x8, Acts};
    use crate::quant::simd::gemv_nibbles::{self, NibbleBlock};
    use crate::quant::simd::{dot_i8_quads, dpbusd, dpbusd_mem, iq4nl_grid, nibbles_32};
    use crate::quant::DotOrder;

    /// Blocks per tile of [`repacked_rows_x8`]: 48 × 544 bytes of widened activations, 26 KiB.
    const TILE: usize = 48;

    /// Blocks per tile of the VNNI [`repacked_rows_x8`]: 80 × 320 bytes of byte activations, 25 KiB.
    const TILE_I8: usize = 80;

    /// Weight rows against eight activation rows in the repacked order, `outs[k][r]` bit-identical
    /// to [`block32::repacked_n`] of row r and activation row k (its group of four): per block
    /// the exact integer dot, then `acc + sumi·(d_w·d_a)` with one rounding, lane k of one
    /// accumulator for activation row k. Each block's grid lookup runs once for the eight
    /// activation rows, which were widened to i16 once for all the rows ([`iq4::rows_x8`]); the
    /// eight integer dots are reduced together and converted, scaled and added in one
    /// instruction each. With VNNI the activations stay bytes and each block and activation row
    /// is one `vpdpbusd` against the grid offset to unsigned ([`iq4::grid_u8`]); the offset's
    /// `128·Σa`, summed once per tile entry, is taken off the eight exact totals in one
    /// subtraction, so the integers, and everything after them, are the AVX2 ones.
    #[inline(always)]
    unsafe fn repacked_rows_x8<I: Isa>(
        rows: &[u8],
        row_bytes: usize,
        a: [&[BlockQ8_0]; 8],
        outs: [&mut [f32]; 8],
    ) {
        let n = row_bytes / size_of::<BlockIq4Nl>();
        assert!(a.iter().all(|a| a.len() == n), "activations of another width");
        if I::VNNI {
            let widen = |i: usize, e: *mut iq4::ActsI8| {
                for (k, a) in a.iter().enumerate() {
                    // SAFETY: i < n, the activations' length (asserted above); `e` points at a
                    // tile entry.
                    let y = a.get_unchecked(i);
                    std::ptr::addr_of_mut!((*e).q[k]).write(y.qs);
                    (*e).offset[k] = 128 * y.qs.iter().map(|&v| v as i32).sum::<i32>();
                    (*e).d[k] = f16_to_f32(y.d);
                }
            };
            let dot = |b: &BlockIq4Nl, e: &iq4::ActsI8, acc: __m256| {
                let u = iq4::grid_u8(b.qs.as_ptr());
                let biased = sum_lanes_x8(std::array::from_fn(|k| {
                    dpbusd_mem::<I>(_mm256_setzero_si256(), u, e.q[k].as_ptr())
                }));
                let sums = _mm256_sub_epi32(biased, _mm256_loadu_si256(e.offset.as_ptr().cast()));
                let d = _mm256_mul_ps(broadcast_f16(b.d), _mm256_loadu_ps(e.d.as_ptr()));
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc)
            };
            iq4::rows_x8::<BlockIq4Nl, iq4::ActsI8, TILE_I8>(rows, row_bytes, n, outs, widen, dot);
            return;
        }
        let widen = |i: usize, e: *mut Acts<QK>| {
            for (k, a) in a.iter().enumerate() {
                // SAFETY: i < n, the activations' length (asserted above); `e` points at a
                // tile entry.
                let y = a.get_unchecked(i);
                iq4::widen_32(y.qs.as_ptr(), std::ptr::addr_of_mut!((*e).q[k]).cast());
                (*e).d[k] = f16_to_f32(y.d);
            }
        };
        let dot = |b: &BlockIq4Nl, e: &Acts<QK>, acc: __m256| {
            let w = grid_i16(b.qs.as_ptr());
            let sums = sum_lanes_x8(std::array::from_fn(|k| dot_i16(w, e.q[k].as_ptr())));
            let d = _mm256_mul_ps(broadcast_f16(b.d), _mm256_loadu_ps(e.d.as_ptr()));
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc)
        };
        iq4::rows_x8::<BlockIq4Nl, Acts<QK>, TILE>(rows, row_bytes, n, outs, widen, dot);
    }

    impl SignedBlock32 for BlockIq4Nl {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        #[inline(always)]
        unsafe fn quants(&self) -> __m256i {
            _mm256_shuffle_epi8(iq4nl_grid(), nibbles_32(self.qs.as_ptr()))
        }
    }

    impl NibbleBlock for BlockIq4Nl {
        #[inline(always)]
        fn qs(&self) -> &[u8; 16] {
            &self.qs
        }

        #[inline(always)]
        fn offset<I: Isa>() -> i32 {
            if I::VNNI {
                128
            } else {
                0
            }
        }

        /// With VNNI the grid plus 128 ([`iq4::grid_u8_table`]) by `vpdpbusd` into i32 lanes;
        /// otherwise the signed grid by `maddubs` with the sign moved onto the activations (the
        /// i16 pair sums are at most 2·127·127), widened by `madd`. Then two rounds of `phaddd`.
        #[inline(always)]
        unsafe fn sums<I: Isa>(pairs: [(__m256i, __m256i); 4], a_lo: __m256i, a_hi: __m256i) -> __m256i {
            let [p0, p1, p2, p3] = pairs.map(|(lo, hi)| {
                if I::VNNI {
                    let grid = iq4::grid_u8_table();
                    let lo = _mm256_shuffle_epi8(grid, lo);
                    let hi = _mm256_shuffle_epi8(grid, hi);
                    dpbusd::<I>(dpbusd::<I>(_mm256_setzero_si256(), lo, a_lo), hi, a_hi)
                } else {
                    let grid = iq4nl_grid();
                    let lo = _mm256_shuffle_epi8(grid, lo);
                    let hi = _mm256_shuffle_epi8(grid, hi);
                    _mm256_add_epi32(dot_i8_quads(lo, a_lo), dot_i8_quads(hi, a_hi))
                }
            });
            _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3))
        }
    }

    impl<I: Isa> Kernels<I> for Iq4Nl {
        /// Repacked, [`gemv_nibbles::rows_n`]: eight rows for all the streams at a time, the
        /// rest row by row; rows wider than its table, [`gemv_slabs`](crate::quant::gemv_slabs)
        /// (each stream the mat-vec of [`Kernels::rows_x1`] over slabs of rows). The other
        /// orders go row by row.
        #[inline]
        fn rows_xn<const N: usize>(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8_0]; N],
            order: DotOrder,
            outs: &mut [&mut [f32]],
        ) -> usize {
            if order != DotOrder::Repacked {
                return 0;
            }
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); the
            // kernel checks the lengths it relies on.
            match unsafe { gemv_nibbles::rows_n::<I, BlockIq4Nl, N>(rows, row_bytes, a, outs) } {
                0 => crate::quant::gemv_slabs::<Self, I, N>(order, row_bytes, rows, a, outs),
                done => done,
            }
        }

        /// Repacked, [`gemv_nibbles::rows`] eight rows at a time and the rest by
        /// [`block32::repacked_4rows`] quad by quad, each group requesting the next as it goes;
        /// the other orders read rows one by one.
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
                match order {
                    DotOrder::Repacked => {
                        // Eight rows at a time as far as they go (rows wider than its table:
                        // none), the rest four at a time.
                        let done = gemv_nibbles::rows::<I, BlockIq4Nl>(rows, row_bytes, a, out);
                        let (rows, out) = (&rows[done * row_bytes..], &mut out[done..]);
                        done + block32::repacked_rows::<I, BlockIq4Nl>(rows, row_bytes, a, out)
                    }
                    _ => 0,
                }
            }
        }

        /// [`block32::dot_rows_tiled`] in the repacked order (the two-chain vec_dot goes row by
        /// row).
        #[inline]
        fn rows_x4(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8_0]; 4],
            order: DotOrder,
            outs: [&mut [f32]; 4],
        ) {
            block32::dot_rows_tiled::<Self, I, 4>(rows, row_bytes, a, order, outs, false);
        }

        /// Repacked (prefill's order: the model's rows come in eights), [`repacked_rows_x8`];
        /// otherwise as [`Kernels::rows_x4`].
        #[inline]
        fn rows_x8(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8_0]; 8],
            order: DotOrder,
            outs: [&mut [f32]; 8],
        ) {
            match order {
                // SAFETY: the target has AVX2/FMA/F16C; the kernel checks the lengths it
                // relies on.
                DotOrder::Repacked => unsafe { repacked_rows_x8::<I>(rows, row_bytes, a, outs) },
                _ => block32::dot_rows_tiled::<Self, I, 8>(rows, row_bytes, a, order, outs, false),
            }
        }

        /// vec_dot with ggml's two chains ([`block32::vec_dot_pairs`]), or the repacked chain.
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

        #[inline]
        fn dot_1x1(w: &[BlockIq4Nl], a: &[BlockQ8_0], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); loads stay
            // inside the blocks borrowed from `w` and `a`.
            unsafe {
                match order {
                    DotOrder::Repacked => block32::repacked::<I, _>(w, a),
                    _ => block32::vec_dot_pairs::<I, _>(w, a),
                }
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockIq4Nl], a: [&[BlockQ8_0]; 4], order: DotOrder) -> [f32; 4] {
            match order {
                // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked
                // by the caller).
                DotOrder::Repacked => unsafe { block32::repacked_n::<I, _, _>(w, a) },
                _ => <Self as Kernels<I>>::dot_1xn(w, a, order),
            }
        }

        /// Repacked, [`block32::repacked_4rows`] per activation row; otherwise each row's own dots.
        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[BlockIq4Nl]; 4],
            a: [&[BlockQ8_0]; N],
            order: DotOrder,
        ) -> [[f32; 4]; N] {
            match order {
                // SAFETY: as in `dot_1x1`; the kernel checks the rows' lengths.
                DotOrder::Repacked => std::array::from_fn(|t| unsafe { block32::repacked_4rows::<I, _>(w, a[t]) }),
                _ => dot_4xn_by_rows::<Self, I, N>(w, a, order),
            }
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockIq4Nl], a: [&[BlockQ8_0]; N], order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe {
                match order {
                    DotOrder::Repacked => block32::repacked_n::<I, _, _>(w, a),
                    _ => block32::vec_dot_pairs_n::<I, _, _>(w, a),
                }
            }
        }
    }
}
