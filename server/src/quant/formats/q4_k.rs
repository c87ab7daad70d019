//! Q4_K: super-blocks of 256 four-bit quants in eight sub-blocks of 32 with 6-bit scales and
//! mins, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Eight sub-blocks of 32 with 6-bit scales and mins packed in `scales` (see
    /// [`scales_mins_k4`](crate::quant::blocks::scales_mins_k4)); each 64 values use 32 bytes of
    /// `qs`, low nibbles first.
    BlockQ4K, bytes 144, { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qs: [u8; 128] }
);

impl BlockQ4K {
    /// The quants (0..15), in element order.
    pub fn values(&self) -> [u8; QK_K] {
        let mut v = [0u8; QK_K];
        for (chunk, qs) in self.qs.chunks_exact(32).enumerate() {
            for (l, &q) in qs.iter().enumerate() {
                v[64 * chunk + l] = q & 0xF;
                v[64 * chunk + 32 + l] = q >> 4;
            }
        }
        v
    }
}

pub struct Q4K;

impl Format for Q4K {
    type Block = BlockQ4K;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[
        Float::F16(offset_of!(BlockQ4K, d)),
        Float::F16(offset_of!(BlockQ4K, dmin)),
    ];

    fn dequantize(b: &BlockQ4K, out: &mut [f32]) {
        scalar::dequantize_k4(b.d, b.dmin, &b.scales, &b.values(), out);
    }
}

impl Weight for Q4K {
    fn dot_ref(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            scalar::dot_k4(b.d, b.dmin, &b.scales, &b.values(), y)
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use std::mem::MaybeUninit;

    use crate::quant::blocks::{blocks, f16_to_f32};
    use crate::quant::format::{dot_4xn_by_rows, rows_x4_by_row, rows_x8_by_row, Kernels};
    use crate::quant::isa::Isa;
    use crate::quant::simd::super_block::{
        broadcast_i16_mask, check_table_rows, hsum_i32_rows, k4_chunk_min_sums, k4_chunk_sum, k4_chunks, k4_dot_n,
        k4_scaled_sum_of, k4_scaled_sums_x, k4_scales_mins, k4_sub_sums, k4_vec_dot_4rows, lanes8, K4Block,
        LaneMins,
    };
    use crate::quant::simd::panel_k4;
    use crate::quant::simd::{
        dpwssd, fma_scaled, fma_scaled_x4, hsum_i32, hsum_i32_128, hsum_i32_x4, lanes, load256, groups_ahead,
        request_next,
    };
    use crate::quant::DotOrder;

    impl K4Block for BlockQ4K {
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

        /// The low and the high nibbles of qs[32c..32c+32].
        #[inline(always)]
        unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i) {
            let q = load256(self.qs.as_ptr().add(32 * c));
            let m4 = _mm256_set1_epi8(0x0F);
            (
                _mm256_and_si256(q, m4),
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
            )
        }
    }

    impl<I: Isa> Kernels<I> for Q4K {
        /// [`panel_k4::rows`]: the repacked order as a GEMM with weight rows in the lanes.
        #[inline]
        fn rows_xbatch(
            rows: &[u8],
            row_bytes: usize,
            acts: &[&[BlockQ8K]],
            order: DotOrder,
            outs: &mut [&mut [f32]],
        ) -> bool {
            panel_k4::rows::<I>(rows, row_bytes, acts, order, outs)
        }

        /// Repacked, [`gemm_rows`]; otherwise one [`Kernels::dot_1x4`] per row.
        #[inline]
        fn rows_x4(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8K]; 4],
            order: DotOrder,
            outs: [&mut [f32]; 4],
        ) {
            if order == DotOrder::Repacked && fits_gemm_rows(row_bytes) {
                // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then);
                // `gemm_rows` checks the lengths it relies on.
                unsafe { gemm_rows::<I, 4>(rows, row_bytes, a, outs) }
            } else {
                rows_x4_by_row::<Self, I>(rows, row_bytes, a, order, outs);
            }
        }

        /// Repacked, [`gemm_rows`] for both groups of four at once; otherwise the trait's
        /// default ([`rows_x8_by_row`]).
        #[inline]
        fn rows_x8(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8K]; 8],
            order: DotOrder,
            outs: [&mut [f32]; 8],
        ) {
            match order {
                // SAFETY: as in `rows_x4`.
                DotOrder::Repacked if fits_gemm_rows(row_bytes) => unsafe {
                    gemm_rows::<I, 8>(rows, row_bytes, a, outs)
                },
                _ => rows_x8_by_row::<Self, I>(rows, row_bytes, a, order, outs),
            }
        }

        /// Repacked, [`gemv_4rows`] quad by quad, requesting the next quad as it goes
        /// ([`groups_ahead`]). Not inlined, as
        /// [`repacked_rows`](crate::quant::simd::block32::repacked_rows) is not.
        #[inline(never)]
        fn rows_x1(
            rows: &[u8],
            row_bytes: usize,
            a: &[BlockQ8K],
            order: DotOrder,
            out: &mut [f32],
        ) -> usize {
            match order {
                // SAFETY: as in `dot_1x4`; `groups_ahead` checks the lengths.
                DotOrder::Repacked => unsafe {
                    let n_rows = out.len();
                    groups_ahead::<I, _, 4>(rows, row_bytes, a.len(), n_rows, |i, w, next| {
                        out[i..i + 4].copy_from_slice(&gemv_4rows_ahead::<I>(w, next, a))
                    })
                },
                _ => 0,
            }
        }

        /// Repacked, [`gemv_4rows_n`] quad by quad for all the streams, requesting the next
        /// quad as it goes; the rest row by row. The other orders go row by row.
        #[inline]
        fn rows_xn<const N: usize>(
            rows: &[u8],
            row_bytes: usize,
            a: [&[BlockQ8K]; N],
            order: DotOrder,
            outs: &mut [&mut [f32]],
        ) -> usize {
            let n_rows = outs.first().map_or(0, |o| o.len());
            if order != DotOrder::Repacked || outs.len() != N || outs.iter().any(|o| o.len() != n_rows) {
                return 0;
            }
            // SAFETY: as in `dot_1x4`; `groups_ahead` checks the lengths.
            unsafe {
                groups_ahead::<I, _, 4>(rows, row_bytes, a[0].len(), n_rows, |i, w, next| {
                    for (out, sums) in outs.iter_mut().zip(gemv_4rows_n::<I, N>(w, next, a)) {
                        out[i..i + 4].copy_from_slice(&sums);
                    }
                })
            }
        }

        /// vec_dot takes the min term in four float lanes ([`LaneMins`]); repacked is
        /// [`gemv_n`].
        #[inline]
        fn dot_1x1(w: &[BlockQ4K], a: &[BlockQ8K], order: DotOrder) -> f32 {
            let [out] = <Self as Kernels<I>>::dot_1xn(w, [a], order);
            out
        }

        #[inline]
        fn dot_1x4(w: &[BlockQ4K], a: [&[BlockQ8K]; 4], order: DotOrder) -> [f32; 4] {
            match order {
                // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); chunk
                // c reads qs[32c..32c+32] of a 128-byte array (c < 4); every activation row
                // holds as many blocks as `w` (checked by the caller).
                DotOrder::Repacked => unsafe { gemm::<I>(w, a) },
                _ => <Self as Kernels<I>>::dot_1xn(w, a, order),
            }
        }

        /// Repacked, [`gemv_4rows`] per activation row; decode's mat-vec in the vec_dot order
        /// (rows that are no multiple of 8), [`k4_vec_dot_4rows`]; otherwise each row's own dots.
        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[BlockQ4K]; 4],
            a: [&[BlockQ8K]; N],
            order: DotOrder,
        ) -> [[f32; 4]; N] {
            match order {
                // SAFETY: as in `dot_1x1`; the kernel checks the rows' lengths.
                DotOrder::Repacked => std::array::from_fn(|t| unsafe { gemv_4rows::<I>(w, a[t]) }),
                // SAFETY: as above.
                DotOrder::VecDot | DotOrder::Free if N == 1 => unsafe {
                    [k4_vec_dot_4rows::<I, _, LaneMins>(w, a[0]); N]
                },
                _ => dot_4xn_by_rows::<Self, I, N>(w, a, order),
            }
        }

        #[inline]
        fn dot_1xn<const N: usize>(w: &[BlockQ4K], a: [&[BlockQ8K]; N], order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot_1x4`.
            unsafe {
                match order {
                    DotOrder::Repacked => gemv_n::<I, N>(w, a),
                    _ => k4_dot_n::<I, _, LaneMins, N>(w, a, order),
                }
            }
        }
    }

    /// The repacked order for one activation row, as `ggml_gemv_q4_K_8x8_q8_K`: per
    /// super-block, one FMA of the scaled integer sum by d_w·d_a and one of the min sum by
    /// dmin_w·d_a into a second chain, which is subtracted at the end. For `N` activation rows
    /// at once (each its own gemv, the super-block unpacked once).
    #[inline(always)]
    unsafe fn gemv_n<I: Isa, const N: usize>(w: &[BlockQ4K], a: [&[BlockQ8K]; N]) -> [f32; N] {
        let (mut acc, mut acc_min) = ([0.0; N], [0.0; N]);
        for (i, b) in w.iter().enumerate() {
            let (scales, mins) = k4_scales_mins(b);
            let chunks = k4_chunks(b);
            let (d_w, dmin_w) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
            for t in 0..N {
                let y = &a[t][i];
                let sumi = hsum_i32(k4_scaled_sum_of::<I>(scales, y, &chunks));
                acc[t] = fma_scaled(sumi, d_w, y.d(), acc[t]);
                let min_sum = hsum_i32_128(k4_chunk_min_sums(mins, y));
                acc_min[t] = fma_scaled(min_sum, dmin_w, y.d(), acc_min[t]);
            }
        }
        std::array::from_fn(|t| acc[t] - acc_min[t])
    }

    /// [`gemv_n`] of four weight rows against one activation row, each row's two chains
    /// bit-identical to its own gemv: lane r of the accumulators is row r's, so the four rows'
    /// integer sums are reduced together and each super-block takes two vector FMAs for all
    /// four; the activation's sub-block sums and scale are taken once.
    #[inline(always)]
    unsafe fn gemv_4rows<I: Isa>(w: [&[BlockQ4K]; 4], a: &[BlockQ8K]) -> [f32; 4] {
        gemv_4rows_ahead::<I>(w, None, a)
    }

    /// [`gemv_4rows`], requesting the `next` rows' super-block i as it reads its own.
    #[inline(always)]
    unsafe fn gemv_4rows_ahead<I: Isa>(
        w: [&[BlockQ4K]; 4],
        next: Option<[&[BlockQ4K]; 4]>,
        a: &[BlockQ8K],
    ) -> [f32; 4] {
        let n = a.len();
        assert!(w.iter().all(|w| w.len() == n), "rows of unequal length");
        assert!(next.is_none_or(|x| x.iter().all(|x| x.len() == n)), "next rows of unequal length");
        let (mut acc, mut acc_min) = (_mm_setzero_ps(), _mm_setzero_ps());
        for (i, y) in a.iter().enumerate() {
            request_next(next, i);
            // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
            let b = w.map(|w| w.get_unchecked(i));
            let sub_sums = k4_sub_sums(y);
            let scales_mins = b.map(|b| k4_scales_mins(b));
            let sums = k4_scaled_sums_x::<I, _, 4>(scales_mins.map(|(s, _)| s), y, b);
            let mins = scales_mins.map(|(_, m)| _mm_madd_epi16(m, sub_sums));
            let mins = _mm_hadd_epi32(_mm_hadd_epi32(mins[0], mins[1]), _mm_hadd_epi32(mins[2], mins[3]));
            let d_a = _mm_set1_ps(y.d());
            // The four rows' halves as values, not through a `fn` pointer: LLVM left those as
            // calls (eight per super-block, each spilling the vector registers).
            let f16x4 = |h: [[u8; 2]; 4]| {
                let h = h.map(i16::from_le_bytes);
                _mm_mul_ps(_mm_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], 0, 0, 0, 0)), d_a)
            };
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum_i32_x4(sums)), f16x4(b.map(|b| b.d)), acc);
            acc_min = _mm_fmadd_ps(_mm_cvtepi32_ps(mins), f16x4(b.map(|b| b.dmin)), acc_min);
        }
        lanes(_mm_sub_ps(acc, acc_min))
    }

    /// [`gemv_4rows_ahead`] for `N` activation rows (a batch of decode streams), each stream's
    /// four chains bit-identical to its own: the rows' scales, mins and quants are unpacked once
    /// per super-block for all `N`. Row by row within the super-block (all four chunks of one
    /// row, then each stream's sum), so that few vectors are live at once.
    #[inline(always)]
    unsafe fn gemv_4rows_n<I: Isa, const N: usize>(
        w: [&[BlockQ4K]; 4],
        next: Option<[&[BlockQ4K]; 4]>,
        a: [&[BlockQ8K]; N],
    ) -> [[f32; 4]; N] {
        let n = w[0].len();
        assert!(a.iter().all(|a| a.len() == n), "activations of another width");
        assert!(w.iter().all(|w| w.len() == n), "rows of unequal length");
        assert!(next.is_none_or(|x| x.iter().all(|x| x.len() == n)), "next rows of unequal length");
        let (mut acc, mut acc_min) = ([_mm_setzero_ps(); N], [_mm_setzero_ps(); N]);
        for i in 0..n {
            request_next(next, i);
            // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
            let b = w.map(|w| w.get_unchecked(i));
            let y: [&BlockQ8K; N] = std::array::from_fn(|t| a[t].get_unchecked(i));
            let scales_mins = b.map(|b| k4_scales_mins(b));
            let mut sums = [[_mm256_setzero_si256(); 4]; N];
            for r in 0..4 {
                let chunks = k4_chunks(b[r]);
                for t in 0..N {
                    sums[t][r] = k4_scaled_sum_of::<I>(scales_mins[r].0, y[t], &chunks);
                }
            }
            let f16x4 = |h: [[u8; 2]; 4]| {
                let h = h.map(i16::from_le_bytes);
                _mm_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], 0, 0, 0, 0))
            };
            let (d_w, dmin_w) = (f16x4(b.map(|b| b.d)), f16x4(b.map(|b| b.dmin)));
            for t in 0..N {
                let sub_sums = k4_sub_sums(y[t]);
                let mins = scales_mins.map(|(_, m)| _mm_madd_epi16(m, sub_sums));
                let mins = _mm_hadd_epi32(_mm_hadd_epi32(mins[0], mins[1]), _mm_hadd_epi32(mins[2], mins[3]));
                let d_a = _mm_set1_ps(y[t].d());
                acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum_i32_x4(sums[t])), _mm_mul_ps(d_w, d_a), acc[t]);
                acc_min[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(mins), _mm_mul_ps(dmin_w, d_a), acc_min[t]);
            }
        }
        std::array::from_fn(|t| lanes(_mm_sub_ps(acc[t], acc_min[t])))
    }

    /// The repacked order for four activation rows, as `ggml_gemm_q4_K_8x8_q8_K`, which (unlike
    /// the gemv) applies the FMAs per 64-value chunk: four per super-block into each chain. Lane
    /// k of the accumulators is activation row k's chain.
    #[inline(always)]
    unsafe fn gemm<I: Isa>(w: &[BlockQ4K], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
        let (mut acc, mut acc_min) = (_mm_setzero_ps(), _mm_setzero_ps());
        for (i, b) in w.iter().enumerate() {
            let (scales, mins) = k4_scales_mins(b);
            let y = a.map(|a| &a[i]);
            let d_a = y.map(|y| y.d());
            let min_sums = transpose_i32_4x4(y.map(|y| k4_chunk_min_sums(mins, y)));
            for (c, min_sum) in min_sums.into_iter().enumerate() {
                let quants = b.chunk(c);
                let sumi = hsum_i32_x4(y.map(|y| k4_chunk_sum::<I>(scales, y, c, quants)));
                acc = fma_scaled_x4(sumi, f16_to_f32(b.d), d_a, acc);
                acc_min = fma_scaled_x4(min_sum, f16_to_f32(b.dmin), d_a, acc_min);
            }
        }
        lanes(_mm_sub_ps(acc, acc_min))
    }

    /// Super-blocks per row (16384 values) [`gemm_rows`]'s activation table holds; wider rows
    /// take [`gemm`] row by row, in the same order.
    const GEMM_ROWS_MAX_BLOCKS: usize = 64;

    fn fits_gemm_rows(row_bytes: usize) -> bool {
        row_bytes <= GEMM_ROWS_MAX_BLOCKS * size_of::<BlockQ4K>()
    }

    /// What [`gemm`] takes from one super-block of `N` (4 or 8) activation rows, gathered once
    /// for every weight row: lane k is activation row k's (rows 0..4 again in lanes 4..8 when
    /// `N` is 4).
    #[derive(Clone, Copy)]
    struct ActSuperBlock {
        /// The activation scales.
        d: __m256,
        /// Per 64-value chunk c, the i16 pair (bsum of sub-block 2c, of 2c+1) in each i32 lane:
        /// one `madd` by the weight's (min_2c, min_2c+1) gives every row's min sum.
        sub_sums: [__m256i; 4],
    }

    /// [`ActSuperBlock`] of super-block i of the `N` activation rows.
    #[inline(always)]
    unsafe fn act_super_block<const N: usize>(a: [&[BlockQ8K]; N], i: usize) -> ActSuperBlock {
        let row = |k: usize| a[k % N].get_unchecked(i);
        let d: [f32; 8] = std::array::from_fn(|k| row(k).d());
        // Lane c of row k's sub-block sums is its pair for chunk c; transposed, lane k of
        // vector c is row k's.
        let lo = transpose_i32_4x4(std::array::from_fn(|k| k4_sub_sums(row(k))));
        let hi = transpose_i32_4x4(std::array::from_fn(|k| k4_sub_sums(row(4 + k))));
        ActSuperBlock {
            d: _mm256_loadu_ps(d.as_ptr()),
            sub_sums: std::array::from_fn(|c| _mm256_set_m128i(hi[c], lo[c])),
        }
    }

    /// [`Kernels::rows_x4`] (`N` = 4) and [`Kernels::rows_x8`] (`N` = 8) in the repacked
    /// order: every output is [`gemm`]'s for its row and its group of four (the same chains, the
    /// same operations), but each weight super-block's quants, scales and mins are unpacked
    /// once for all `N` activation rows, which share one eight-lane accumulator pair, and the
    /// activations' scales and sub-block sums are gathered once for all the weight rows
    /// ([`ActSuperBlock`]). Rows must be at most [`GEMM_ROWS_MAX_BLOCKS`] wide.
    #[inline(always)]
    unsafe fn gemm_rows<I: Isa, const N: usize>(
        rows: &[u8],
        row_bytes: usize,
        a: [&[BlockQ8K]; N],
        mut outs: [&mut [f32]; N],
    ) {
        const { assert!(N == 4 || N == 8) };
        let (n, _) =
            check_table_rows::<BlockQ4K, _, N>(rows, row_bytes, GEMM_ROWS_MAX_BLOCKS, &a, &outs);
        // Uninitialised, so a call does not clear 10 KiB it will not read: only the first n
        // entries are written, and only they are read.
        let mut table = [const { MaybeUninit::<ActSuperBlock>::uninit() }; GEMM_ROWS_MAX_BLOCKS];
        for (i, t) in table[..n].iter_mut().enumerate() {
            t.write(act_super_block(a, i));
        }
        // SAFETY: entries 0..n were written just above; MaybeUninit<T> has T's layout.
        let acts = std::slice::from_raw_parts(table.as_ptr().cast::<ActSuperBlock>(), n);
        for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
            let out = lanes8(gemm_row::<I, N>(blocks(row), a, acts));
            for (o, v) in outs.iter_mut().zip(out) {
                // SAFETY: every output holds a value per weight row (check_table_rows).
                *o.get_unchecked_mut(r) = v;
            }
        }
    }

    /// One weight row of [`gemm_rows`]: lane k is activation row k's [`gemm`] (of its group of
    /// four).
    #[inline(always)]
    unsafe fn gemm_row<I: Isa, const N: usize>(
        w: &[BlockQ4K],
        a: [&[BlockQ8K]; N],
        acts: &[ActSuperBlock],
    ) -> __m256 {
        let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for (i, (b, t)) in w.iter().zip(acts).enumerate() {
            let (scales, mins) = k4_scales_mins(b);
            let mins = _mm256_broadcastsi128_si256(mins);
            // d_w·d_a and dmin_w·d_a, the products gemm forms per chunk, once per super-block.
            let d = _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(b.d)), t.d);
            let dmin = _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(b.dmin)), t.d);
            // SAFETY (get_unchecked): every activation row has w.len() blocks (asserted by the
            // caller) and i < w.len().
            let y = a.map(|a| a.get_unchecked(i));
            // Written out per chunk (not a loop) so the shuffle masks are constants.
            let mins = (mins, t);
            gemm_chunk::<I, 0, N>(b, y, scales, mins, (d, dmin), (&mut acc, &mut acc_min));
            gemm_chunk::<I, 1, N>(b, y, scales, mins, (d, dmin), (&mut acc, &mut acc_min));
            gemm_chunk::<I, 2, N>(b, y, scales, mins, (d, dmin), (&mut acc, &mut acc_min));
            gemm_chunk::<I, 3, N>(b, y, scales, mins, (d, dmin), (&mut acc, &mut acc_min));
        }
        _mm256_sub_ps(acc, acc_min)
    }

    /// Chunk `C` (64 values) of one super-block `b` of [`gemm_row`] against the activation
    /// rows' super-blocks `y`: the integer sums (scaled by the sub-blocks' `scales`) and min sums
    /// (`mins` with the activations' [`ActSuperBlock`]) of all `N` rows, one FMA into each chain
    /// (`acc`, the scaled sums by `d`; `acc_min`, the min sums by `dmin`).
    #[inline(always)]
    unsafe fn gemm_chunk<I: Isa, const C: usize, const N: usize>(
        b: &BlockQ4K,
        y: [&BlockQ8K; N],
        scales: __m256i,
        (mins, t): (__m256i, &ActSuperBlock),
        (d, dmin): (__m256, __m256),
        (acc, acc_min): (&mut __m256, &mut __m256),
    ) {
        let (lo, hi) = b.chunk(C);
        let sc_lo = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * C as i16));
        let sc_hi = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * C as i16 + 1));
        let sums = y.map(|y| {
            let a_lo = load256(y.qs.as_ptr().add(64 * C).cast());
            let a_hi = load256(y.qs.as_ptr().add(64 * C + 32).cast());
            let p_lo = _mm256_madd_epi16(sc_lo, _mm256_maddubs_epi16(lo, a_lo));
            // VNNI: the high sub-block's madd and the add in one `vpdpwssd` (exact either way:
            // see k4_chunk_sum); Avx2: `add(p_lo, madd(sc_hi, ..))`, as before.
            dpwssd::<I>(p_lo, sc_hi, _mm256_maddubs_epi16(hi, a_hi))
        });
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_i32_rows(sums)), d, *acc);
        // The pair (min_2c, min_2c+1) in every i32 lane.
        let min_pair = _mm256_shuffle_epi8(mins, broadcast_i32_mask(C));
        let min_sum = _mm256_madd_epi16(min_pair, t.sub_sums[C]);
        *acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sum), dmin, *acc_min);
    }

    /// Shuffle mask that broadcasts i32 lane `k` of each 128-bit half.
    #[inline(always)]
    unsafe fn broadcast_i32_mask(k: usize) -> __m256i {
        let b = 4 * k as i32;
        _mm256_set1_epi32(b | ((b + 1) << 8) | ((b + 2) << 16) | ((b + 3) << 24))
    }

    /// Rows become columns: lane j of output i is lane i of input j.
    #[inline(always)]
    unsafe fn transpose_i32_4x4(m: [__m128i; 4]) -> [__m128i; 4] {
        let lo01 = _mm_unpacklo_epi32(m[0], m[1]);
        let lo23 = _mm_unpacklo_epi32(m[2], m[3]);
        let hi01 = _mm_unpackhi_epi32(m[0], m[1]);
        let hi23 = _mm_unpackhi_epi32(m[2], m[3]);
        [
            _mm_unpacklo_epi64(lo01, lo23),
            _mm_unpackhi_epi64(lo01, lo23),
            _mm_unpacklo_epi64(hi01, hi23),
            _mm_unpackhi_epi64(hi01, hi23),
        ]
    }
}
