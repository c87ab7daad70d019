//! Q6_K: super-blocks of 256 six-bit quants in sixteen sub-blocks of 16 with signed 8-bit scales,
//! dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Sixteen sub-blocks of 16 with signed 8-bit scales; 6-bit quants offset by 32; `d` last.
    BlockQ6K, bytes 210, { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: [u8; 2] }
);

impl BlockQ6K {
    /// The quants with the offset removed (-32..31), in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        for half in 0..2 {
            let ql = &self.ql[64 * half..64 * half + 64];
            let qh = &self.qh[32 * half..32 * half + 32];
            let out = &mut v[128 * half..128 * half + 128];
            for l in 0..32 {
                let q = |low: u8, shift: u32| (low | (((qh[l] >> shift) & 3) << 4)) as i8 - 32;
                out[l] = q(ql[l] & 0xF, 0);
                out[l + 32] = q(ql[l + 32] & 0xF, 2);
                out[l + 64] = q(ql[l] >> 4, 4);
                out[l + 96] = q(ql[l + 32] >> 4, 6);
            }
        }
        v
    }
}

pub struct Q6K;

impl Format for Q6K {
    type Block = BlockQ6K;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockQ6K, d))];

    fn dequantize(b: &BlockQ6K, out: &mut [f32]) {
        let d = f16_to_f32(b.d);
        for ((ys, qs), &sc) in out
            .chunks_exact_mut(16)
            .zip(b.values().chunks(16))
            .zip(&b.scales)
        {
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = d * sc as f32 * q as f32;
            }
        }
    }
}

impl Weight for Q6K {
    fn dot_ref(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            let values = b.values();
            let sumi: i32 = (0..16)
                .map(|s| {
                    let dot = scalar::dot_i8(&values[16 * s..16 * s + 16], &y.qs[16 * s..]);
                    b.scales[s] as i32 * dot
                })
                .sum();
            f16_to_f32(b.d) * y.d() * sumi as f32
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use std::mem::MaybeUninit;

    use crate::quant::blocks::blocks;
    use crate::quant::format::{rows_by_1xn, Kernels};
    use crate::quant::isa::{Avx2, Isa};
    use crate::quant::simd::super_block::{
        broadcast_i16_pair_mask, check_table_rows, hsum_i32_rows, lanes8, scaled_dot, scaled_dot_n, scaled_rows, ScaledBlock,
    };
    use crate::quant::simd::{and_or, dpwssd, load128, load256, panel_tiled};
    use crate::quant::DotOrder;

    impl ScaledBlock for BlockQ6K {
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
    impl panel_tiled::TiledBlock for BlockQ6K {
        const SUB_LEN: usize = 16;
        const OFFSET: i32 = 32;
        const AVX2: panel_tiled::Avx2Quants = panel_tiled::Avx2Quants::Offset;

        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        /// The stored quants (value + 32), as [`BlockQ6K::quants`] unpacks them.
        #[inline(always)]
        unsafe fn quants<I: Isa>(&self) -> [__m256i; 8] {
            BlockQ6K::quants::<I>(self)
        }

        #[inline(always)]
        unsafe fn scales_i32(&self) -> [__m256i; 2] {
            let s = load128(self.scales.as_ptr().cast());
            [_mm256_cvtepi8_epi32(s), _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(s, s))]
        }
    }

    impl BlockQ6K {
        /// The six-bit quants (+32) of 32-value group g (< 8) in `[g]`: half h = g / 4 reads
        /// ql[64h..64h+64] and qh[32h..32h+32].
        #[inline(always)]
        unsafe fn quants<I: Isa>(&self) -> [__m256i; 8] {
            let m4 = _mm256_set1_epi8(0x0F);
            let mut out = [_mm256_setzero_si256(); 8];
            for half in 0..2 {
                let ql0 = load256(self.ql.as_ptr().add(64 * half));
                let ql1 = load256(self.ql.as_ptr().add(64 * half + 32));
                let qh = load256(self.qh.as_ptr().add(32 * half));
                // Group k's two bits sit at bits 2k..2k+2 of qh and belong at bits 4..6: mask
                // them in place, then one 16-bit shift moves them (the mask keeps a byte's bits
                // from crossing into its neighbour). Group 2's are already in place.
                let bits = |mask: i8| _mm256_and_si256(qh, _mm256_set1_epi8(mask));
                let high = [
                    _mm256_slli_epi16(bits(0x03), 4),
                    _mm256_slli_epi16(bits(0x0C), 2),
                    bits(0x30),
                    _mm256_srli_epi16(bits(0xC0u8 as i8), 2),
                ];
                out[4 * half] = and_or::<I>(ql0, m4, high[0]);
                out[4 * half + 1] = and_or::<I>(ql1, m4, high[1]);
                out[4 * half + 2] = and_or::<I>(_mm256_srli_epi16(ql0, 4), m4, high[2]);
                out[4 * half + 3] = and_or::<I>(_mm256_srli_epi16(ql1, 4), m4, high[3]);
            }
            out
        }

        /// `Σ_s scale_s·((q-32)·a)_s` against `N` activation super-blocks, the quants and scales
        /// unpacked once.
        #[inline(always)]
        unsafe fn sumi_n<I: Isa, const N: usize>(&self, y: [&BlockQ8K; N]) -> [__m256i; N] {
            let quants = self.quants::<I>();
            // The sixteen scales as i16, then scales 0..8 and 8..16 each in both 128-bit
            // halves: one shuffle per group gives its two (one per half).
            let scales = _mm256_cvtepi8_epi16(load128(self.scales.as_ptr().cast()));
            let halves = [
                _mm256_permute2x128_si256(scales, scales, 0x00),
                _mm256_permute2x128_si256(scales, scales, 0x11),
            ];
            // -32·scale_s as i16 (|·| ≤ 4096, and with |bsum| ≤ 2048 a pair of products stays
            // far inside i32), so one madd per row gives the whole offset term.
            let neg_offset_scales =
                _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), scales), 5);
            // The quants are stored +32; remove 32·Σ scale_s·bsum_s once instead of per value.
            let mut sumi = [[_mm256_setzero_si256(); N]; 2];
            for (s, y) in sumi[0].iter_mut().zip(y) {
                *s = _mm256_madd_epi16(load256(y.bsums.as_ptr()), neg_offset_scales);
            }
            // Group by group, every row's sum in a register: the group's quants and scales are
            // loaded once for all `N` (the sums are exact integers, so the order is free). The
            // even and the odd groups go to two sums, so each chain is four `vpdpwssd` long.
            for (g, &q) in quants.iter().enumerate() {
                let sc = _mm256_shuffle_epi8(halves[g / 4], broadcast_i16_pair_mask(g % 4));
                for (s, y) in sumi[g % 2].iter_mut().zip(y) {
                    let act = load256(y.qs.as_ptr().add(32 * g).cast());
                    // The quants are < 64 and the activations in -128..=127: a maddubs pair
                    // stays within ±16128 (no saturation), so `vpdpwssd` (VNNI) sums exactly
                    // what Avx2's `add(s, madd(sc, ..))` does.
                    *s = dpwssd::<I>(*s, sc, _mm256_maddubs_epi16(q, act));
                }
            }
            std::array::from_fn(|k| _mm256_add_epi32(sumi[0][k], sumi[1][k]))
        }
    }

    impl<I: Isa> Kernels<I> for Q6K {
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
                    scaled_rows::<I, _, 1>(rows, row_bytes, a, order, out, |[b]: [&BlockQ6K; 1], y| b.sumi_n::<I, 1>([y]))
                } else {
                    scaled_rows::<I, _, 1>(rows, row_bytes, a, order, out, |[b]: [&BlockQ6K; 1], y| [b.sumi(y)])
                }
            }
        }

        #[inline]
        fn dot_1x1(w: &[BlockQ6K], a: &[BlockQ8K], order: DotOrder) -> f32 {
            if I::VNNI {
                // `scaled_dot` with this ISA's sums.
                let [out] = <Self as Kernels<I>>::dot_1xn(w, [a], order);
                return out;
            }
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`. (Avx2 keeps this call: through
            // `dot_1xn` the compiler lays out its callers' loops otherwise, in more instructions.)
            unsafe { scaled_dot(w, a, order) }
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ6K], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            <Self as Kernels<I>>::dot_1xn(w, a, order)
        }

        /// Tiled, [`tiled_rows`]; otherwise [`Kernels::dot_1xn`] per row (what the trait's
        /// default comes to for a format whose `dot_1x4` is its `dot_1xn`).
        #[inline]
        fn rows_x8(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8K]; 8],
            order: DotOrder,
            outs: [&mut [f32]; 8],
        ) {
            if order == DotOrder::Tiled && row_bytes <= TILED_ROWS_MAX_BLOCKS * size_of::<BlockQ6K>() {
                // SAFETY: as in `dot_1xn`; `tiled_rows` checks the lengths it relies on.
                unsafe { tiled_rows::<I>(rows, row_bytes, a, outs) }
            } else {
                rows_by_1xn::<Self, I, 8>(rows, row_bytes, a, order, outs);
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
            panel_tiled::rows::<I, BlockQ6K>(rows, row_bytes, acts, order, outs)
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockQ6K], a: [&[BlockQ8K]; N], order: DotOrder) -> [f32; N] {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`, and every activation row holds
            // as many blocks as `w` (checked by the caller).
            unsafe { scaled_dot_n(w, a, order, |b, y| b.sumi_n::<I, N>(y)) }
        }
    }

    /// Super-blocks per row (16384 values) [`tiled_rows`]' scale table holds; wider rows take
    /// [`Kernels::dot_1xn`] row by row, in the same order.
    const TILED_ROWS_MAX_BLOCKS: usize = 64;

    /// [`Kernels::rows_x8`] in the tiled order: each output is its row's tiled chain (see
    /// [`tiled`](crate::quant::simd::super_block::tiled)), lane k of one accumulator holding
    /// activation row k's, so the eight rows' integer sums are reduced together and each
    /// super-block takes one multiply by d_w and one FMA by d_a for all eight. The activation
    /// scales are gathered once for all the weight rows. Rows must be at most
    /// [`TILED_ROWS_MAX_BLOCKS`] wide.
    #[inline(always)]
    unsafe fn tiled_rows<I: Isa>(
        rows: &[u8],
        row_bytes: usize,
        a: [&[BlockQ8K]; 8],
        mut outs: [&mut [f32]; 8],
    ) {
        let (n, _) =
            check_table_rows::<BlockQ6K, _, 8>(rows, row_bytes, TILED_ROWS_MAX_BLOCKS, &a, &outs);
        // Uninitialised, so a call does not clear 2 KiB it will not read: only the first n
        // entries are written, and only they are read.
        let mut table = [const { MaybeUninit::<__m256>::uninit() }; TILED_ROWS_MAX_BLOCKS];
        for (i, d) in table[..n].iter_mut().enumerate() {
            let d_a: [f32; 8] = std::array::from_fn(|k| a[k].get_unchecked(i).d());
            d.write(_mm256_loadu_ps(d_a.as_ptr()));
        }
        // SAFETY: entries 0..n were written just above; MaybeUninit<T> has T's layout.
        let d_a = std::slice::from_raw_parts(table.as_ptr().cast::<__m256>(), n);
        for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
            let mut acc = _mm256_setzero_ps();
            for (i, (b, &d_a)) in blocks::<BlockQ6K>(row).iter().zip(d_a).enumerate() {
                // SAFETY (get_unchecked): every activation row has n blocks (asserted above).
                let sums = b.sumi_n::<I, 8>(a.map(|a| a.get_unchecked(i)));
                let d_w = _mm256_set1_ps(f16_to_f32(b.d));
                let scaled = _mm256_mul_ps(d_w, _mm256_cvtepi32_ps(hsum_i32_rows(sums)));
                acc = _mm256_fmadd_ps(scaled, d_a, acc);
            }
            for (o, v) in outs.iter_mut().zip(lanes8(acc)) {
                // SAFETY: every output holds a value per weight row (check_table_rows).
                *o.get_unchecked_mut(r) = v;
            }
        }
    }
}
