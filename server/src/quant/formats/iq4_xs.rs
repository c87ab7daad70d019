//! IQ4_XS: IQ4_NL's grid in super-blocks of 256 with eight 6-bit sub-block scales, dotted
//! against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, KVALUES_IQ4NL, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Eight sub-blocks of 32 with 6-bit scales (low 4 bits in `scales_l`, high 2 in the
    /// little-endian u16 `scales_h`), offset by 32; nibbles as in IQ4_NL.
    BlockIq4Xs, bytes 136,
    { d: [u8; 2], scales_h: [u8; 2], scales_l: [u8; 4], qs: [u8; 128] }
);

impl BlockIq4Xs {
    /// The signed scale (`ls - 32`) of sub-block `ib` (0..8).
    #[inline(always)]
    pub fn scale(&self, ib: usize) -> i32 {
        let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = (u16::from_le_bytes(self.scales_h) >> (2 * ib)) & 3;
        (low as i32 | (high as i32) << 4) - 32
    }

    /// The quants looked up in the grid, in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        for (ib, qs) in self.qs.chunks_exact(16).enumerate() {
            for (j, &q) in qs.iter().enumerate() {
                v[32 * ib + j] = KVALUES_IQ4NL[(q & 0xF) as usize];
                v[32 * ib + 16 + j] = KVALUES_IQ4NL[(q >> 4) as usize];
            }
        }
        v
    }
}

pub struct Iq4Xs;

impl Format for Iq4Xs {
    type Block = BlockIq4Xs;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockIq4Xs, d))];

    fn dequantize(b: &BlockIq4Xs, out: &mut [f32]) {
        let d = f16_to_f32(b.d);
        let values = b.values();
        for (ib, (ys, qs)) in out.chunks_exact_mut(32).zip(values.chunks(32)).enumerate() {
            let dl = d * b.scale(ib) as f32;
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * q as f32;
            }
        }
    }
}

impl Weight for Iq4Xs {
    fn dot_ref(w: &[BlockIq4Xs], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            let values = b.values();
            let sumi: i32 = (0..8)
                .map(|s| b.scale(s) * scalar::dot_i8(&values[32 * s..32 * s + 32], &y.qs[32 * s..]))
                .sum();
            f16_to_f32(b.d) * y.d() * sumi as f32
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::{rows_by_1xn, Kernels};
    use crate::quant::isa::{Avx2, Isa};
    use crate::quant::simd::super_block::{
        broadcast_i16_mask, broadcast_i16_pair_mask, scaled_dot, scaled_dot_n, scaled_rows, ScaledBlock,
    };
    use crate::quant::simd::iq4::{self, broadcast_f16, grid_i16, sum_lanes_x8, Acts};
    use crate::quant::simd::{dpwssd, iq4nl_grid, load256, mul_i8_pairs, nibbles_32, panel_tiled, unrolled};
    use crate::quant::DotOrder;

    /// Super-blocks per tile of [`tiled_rows_x8`]: 6 × 4128 bytes of widened activations, 24 KiB.
    const TILE: usize = 6;

    /// Weight rows against eight activation rows in the tiled order, `outs[k][r]` bit-identical
    /// to [`Kernels::dot_1x1`] of row r and activation row k: per super-block the exact integer
    /// `Σ_s (ls_s-32)·(v·a)_s`, then `acc + (d·sumi)·d_a`. Each sub-block's grid lookup runs
    /// once for the eight activation rows, its scale multiplied into the i16 quants (|v·ls| ≤
    /// 127·32, |a| ≤ 127: far from overflow), so each activation row's part is two madds and two
    /// adds on activations widened to i16 once for all the rows ([`iq4::rows_x8`]); the eight
    /// integer totals are reduced together and finished with one conversion, one multiply and
    /// one FMA for the eight.
    #[inline(always)]
    unsafe fn tiled_rows_x8<I: Isa>(
        rows: &[u8],
        row_bytes: usize,
        a: [&[BlockQ8K]; 8],
        outs: [&mut [f32]; 8],
    ) {
        let n = row_bytes / size_of::<BlockIq4Xs>();
        assert!(a.iter().all(|a| a.len() == n), "activations of another width");
        let widen = |i: usize, e: *mut Acts<QK_K>| {
            for (k, a) in a.iter().enumerate() {
                // SAFETY: i < n, the activations' length (asserted above); `e` points at a
                // tile entry.
                let y = a.get_unchecked(i);
                let q = std::ptr::addr_of_mut!((*e).q[k]).cast::<i16>();
                for c in 0..QK_K / 32 {
                    iq4::widen_32(y.qs.as_ptr().add(32 * c), q.add(32 * c));
                }
                (*e).d[k] = y.d();
            }
        };
        let dot = |b: &BlockIq4Xs, e: &Acts<QK_K>, acc: __m256| {
            let scales = b.scales16();
            let mut sumi = [_mm256_setzero_si256(); 8];
            unrolled::<8>(|s| {
                let (lo, hi) = grid_i16(b.qs.as_ptr().add(16 * s));
                let scale = _mm256_shuffle_epi8(scales, broadcast_i16_mask(s as i16));
                let w = (_mm256_mullo_epi16(lo, scale), _mm256_mullo_epi16(hi, scale));
                for (sumi, q) in sumi.iter_mut().zip(&e.q) {
                    *sumi = iq4::acc_dot_i16::<I>(*sumi, w, q.as_ptr().add(32 * s));
                }
            });
            let x = _mm256_mul_ps(broadcast_f16(b.d), _mm256_cvtepi32_ps(sum_lanes_x8(sumi)));
            _mm256_fmadd_ps(x, _mm256_loadu_ps(e.d.as_ptr()), acc)
        };
        iq4::rows_x8::<BlockIq4Xs, Acts<QK_K>, TILE>(rows, row_bytes, n, outs, widen, dot);
    }

    impl ScaledBlock for BlockIq4Xs {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        #[inline(always)]
        unsafe fn sumi(&self, y: &BlockQ8K) -> __m256i {
            let [s] = self.sumi_n::<Avx2, 1>([y]);
            s
        }
    }

    /// What the tiled GEMM with weight rows in the lanes reads ([`panel_tiled`]).
    impl panel_tiled::TiledBlock for BlockIq4Xs {
        const SUB_LEN: usize = 32;
        const OFFSET: i32 = 128;
        const AVX2: panel_tiled::Avx2Quants = panel_tiled::Avx2Quants::Signed;

        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        /// Sub-block s's grid values from qs[16s..16s+16] (plus 128 for VNNI, [`iq4::grid_u8`]).
        #[inline(always)]
        unsafe fn quants<I: Isa>(&self) -> [__m256i; 8] {
            std::array::from_fn(|s| {
                let qs = self.qs.as_ptr().add(16 * s);
                if I::VNNI {
                    iq4::grid_u8(qs)
                } else {
                    _mm256_shuffle_epi8(iq4nl_grid(), nibbles_32(qs))
                }
            })
        }

        #[inline(always)]
        unsafe fn scales_i32(&self) -> [__m256i; 2] {
            let s = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(self.scales16()));
            [s, s]
        }
    }

    impl BlockIq4Xs {
        /// The eight signed scales ([`BlockIq4Xs::scale`]) as i16 lanes, in both 128-bit halves
        /// (for [`broadcast_i16_mask`]): unpacked together, not one by one in scalar code.
        #[inline(always)]
        unsafe fn scales16(&self) -> __m256i {
            let l = _mm_cvtsi32_si128(i32::from_le_bytes(self.scales_l));
            let m4 = _mm_set1_epi8(0x0F);
            // Bytes 2i and 2i+1: the low and the high nibble of scales_l[i].
            let low = _mm_unpacklo_epi8(_mm_and_si128(l, m4), _mm_and_si128(_mm_srli_epi16(l, 4), m4));
            // Lane ib: scales_h shifted left by 14 - 2ib (a multiply by a power of two), so its
            // bits 2ib and 2ib+1 land on 14 and 15, then right by 10 onto bits 4 and 5.
            let h = _mm_set1_epi16(i16::from_le_bytes(self.scales_h));
            let shifts = _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1);
            let high = _mm_and_si128(_mm_srli_epi16(_mm_mullo_epi16(h, shifts), 10), _mm_set1_epi16(0x30));
            let scales = _mm_sub_epi16(_mm_or_si128(_mm_cvtepu8_epi16(low), high), _mm_set1_epi16(32));
            _mm256_broadcastsi128_si256(scales)
        }

        /// [`ScaledBlock::sumi`] of `R` super-blocks (weight rows) against one activation
        /// super-block, the rows' chains interleaved; each row's lanes are its
        /// [`BlockIq4Xs::sumi_n`]'s.
        ///
        /// Sub-blocks go in pairs, as the nibbles lie: one 32-byte load holds sub-blocks 2p and
        /// 2p+1, so one mask and one shift give the low nibbles of both (one vector) and the
        /// high nibbles of both (another), with no cross-lane insert. The activations are
        /// regrouped to match (two permutes per pair, shared by the `R` rows), and one shuffle
        /// gives both sub-blocks' scales, one per 128-bit half. The low and the high nibbles
        /// sum in two chains; at the end each chain's halves are added, which gives
        /// `sumi_n`'s lanes (low nibbles' groups in lanes 0..4, high ones' in 4..8) with the
        /// same integers. Per pair and row that is 13 vector operations, against 18 for two
        /// sub-blocks one at a time.
        #[inline(always)]
        unsafe fn sumi_rows<I: Isa, const R: usize>(b: [&Self; R], y: &BlockQ8K) -> [__m256i; R] {
            let grid = iq4nl_grid();
            let m4 = _mm256_set1_epi8(0x0F);
            let scales = b.map(|b| b.scales16());
            let mut low = [_mm256_setzero_si256(); R];
            let mut high = [_mm256_setzero_si256(); R];
            let acc = |acc: __m256i, q: __m256i, act: __m256i, scale: __m256i| {
                if I::VNNI {
                    dpwssd::<I>(acc, mul_i8_pairs(q, act), scale)
                } else {
                    _mm256_add_epi32(acc, _mm256_madd_epi16(mul_i8_pairs(q, act), scale))
                }
            };
            unrolled::<4>(|p| {
                let act = y.qs.as_ptr().add(64 * p).cast::<u8>();
                let (a0, a1) = (load256(act), load256(act.add(32)));
                // Elements 0..16 of sub-blocks 2p and 2p+1, then their elements 16..32.
                let act_low = _mm256_permute2x128_si256(a0, a1, 0x20);
                let act_high = _mm256_permute2x128_si256(a0, a1, 0x31);
                let mask = broadcast_i16_pair_mask(p);
                for r in 0..R {
                    let q = load256(b[r].qs.as_ptr().add(32 * p));
                    let q_low = _mm256_shuffle_epi8(grid, _mm256_and_si256(q, m4));
                    let q_high = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
                    let scale = _mm256_shuffle_epi8(scales[r], mask);
                    low[r] = acc(low[r], q_low, act_low, scale);
                    high[r] = acc(high[r], q_high, act_high, scale);
                }
            });
            std::array::from_fn(|r| {
                _mm256_add_epi32(
                    _mm256_permute2x128_si256(low[r], high[r], 0x20),
                    _mm256_permute2x128_si256(low[r], high[r], 0x31),
                )
            })
        }

        /// `Σ_s (ls_s-32)·(v·a)_s` against `N` activation super-blocks (integer, so only the
        /// lanes matter); sub-block s reads qs[16s..16s+16], looked up once for all `N`.
        #[inline(always)]
        unsafe fn sumi_n<I: Isa, const N: usize>(&self, y: [&BlockQ8K; N]) -> [__m256i; N] {
            let grid = iq4nl_grid();
            let scales = self.scales16();
            let mut sumi = [_mm256_setzero_si256(); N];
            for s in 0..8 {
                let q = _mm256_shuffle_epi8(grid, nibbles_32(self.qs.as_ptr().add(16 * s)));
                let scale = _mm256_shuffle_epi8(scales, broadcast_i16_mask(s as i16));
                for (sumi, y) in sumi.iter_mut().zip(y) {
                    let act = load256(y.qs.as_ptr().add(32 * s).cast());
                    // With VNNI the madd and the add are one `vpdpwssd`, its lanes the same.
                    *sumi = if I::VNNI {
                        dpwssd::<I>(*sumi, mul_i8_pairs(q, act), scale)
                    } else {
                        _mm256_add_epi32(*sumi, _mm256_madd_epi16(mul_i8_pairs(q, act), scale))
                    };
                }
            }
            sumi
        }
    }

    impl<I: Isa> Kernels<I> for Iq4Xs {
        /// [`scaled_rows`]: row by row, each row's [`Kernels::dot_1x1`], requesting the rows ahead
        /// as it goes.
        #[inline]
        fn rows_x1(
            rows: &[u8],
            row_bytes: usize,
            a: &[BlockQ8K],
            order: DotOrder,
            out: &mut [f32],
        ) -> usize {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then);
            // `scaled_rows` checks the lengths it relies on.
            unsafe {
                if I::VNNI {
                    scaled_rows::<I, _, 2>(rows, row_bytes, a, order, out, |b, y| BlockIq4Xs::sumi_rows::<I, 2>(b, y))
                } else {
                    // Two rows spill vectors without VNNI's fused multiply-add.
                    scaled_rows::<I, _, 1>(rows, row_bytes, a, order, out, |b, y| BlockIq4Xs::sumi_rows::<I, 1>(b, y))
                }
            }
        }

        #[inline]
        fn dot_1x1(w: &[BlockIq4Xs], a: &[BlockQ8K], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            // With VNNI through `sumi_n` (the trait's `sumi` is the AVX2 one): the same code as
            // `scaled_dot`, whose `sumi` is `sumi_n` of one row.
            unsafe {
                if I::VNNI {
                    let [out] = scaled_dot_n(w, [a], order, |b, y| b.sumi_n::<I, 1>(y));
                    out
                } else {
                    scaled_dot(w, a, order)
                }
            }
        }

        #[inline]
        fn dot_1x4(w: &[BlockIq4Xs], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            <Self as Kernels<I>>::dot_1xn(w, a, order)
        }

        /// Tiled (prefill's order), [`tiled_rows_x8`]; otherwise each row's [`Kernels::dot_1xn`]
        /// (every order but tiled is vec_dot's here).
        #[inline]
        fn rows_x8(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8K]; 8],
            order: DotOrder,
            outs: [&mut [f32]; 8],
        ) {
            match order {
                // SAFETY: the target has AVX2/FMA/F16C; the kernel checks the lengths it
                // relies on.
                DotOrder::Tiled => unsafe { tiled_rows_x8::<I>(rows, row_bytes, a, outs) },
                _ => rows_by_1xn::<Self, I, 8>(rows, row_bytes, a, order, outs),
            }
        }

        /// [`panel_tiled::rows`]: the tiled order as a GEMM with weight rows in the lanes.
        #[inline]
        fn rows_xbatch(
            rows: &[u8],
            row_bytes: usize,
            acts: &[&[BlockQ8K]],
            order: DotOrder,
            outs: &mut [&mut [f32]],
        ) -> bool {
            panel_tiled::rows::<I, BlockIq4Xs>(rows, row_bytes, acts, order, outs)
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockIq4Xs], a: [&[BlockQ8K]; N], order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot_1x1`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe { scaled_dot_n(w, a, order, |b, y| b.sumi_n::<I, N>(y)) }
        }
    }
}
