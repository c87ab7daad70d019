//! Prefill's matmul for Q5_K in llama.cpp's tiled order as a GEMM with weight rows in the lanes:
//! [`panel_k4`](super::panel_k4)'s panels (the same scales, mins and activation table, the quants
//! one byte each) with the tiled order's float steps.
//!
//! Q5_K is not repacked by llama.cpp, so a batch of at least 8 rows takes its tiled kernel: per
//! super-block the integer totals `Σ_s sc_s·S_s` and `Σ_s m_s·bsum_s`, then
//! `acc + (d·total - dmin·mins)·d_a` in one chain per output ([`k4_tiled_n`]'s steps). Here
//! eight weight rows share a register (lane r holds four quants of one sub-block of row r), so
//! those totals come out per lane with no horizontal sums, and the float steps run on the eight
//! rows at once, each lane the scalar operations of its row: the results are bit-identical to
//! the row kernels, which the property tests and `panel_k4`'s boundary test hold this to.
//!
//! On AVX2 a quant is up to 31, so `maddubs`' pair sums (up to 2·31·127) add up in i16 four
//! registers at a time (31496), where Q4_K's add eight; then one `madd` by the scale. Under VNNI
//! the sub-block sums are `vpdpbusd`s and the scales are applied as in `panel_k4`.
//!
//! [`k4_tiled_n`]: super::super_block

use std::arch::x86_64::*;
use std::ops::Range;

use super::panel_gemm::{rows_in, transpose_8x8, PanelKernel, MAX_ACTS, PANEL_ROWS};
use super::panel_k4::{exact_i32, vnni_chunk_sums, ActTable, Panel, PanelBlock, SLICE_BLOCKS};
use super::super_block::K4Block;
use crate::quant::formats::q5_k::BlockQ5K;
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::isa::Isa;
use crate::quant::DotOrder;

/// [`Kernels::rows_xbatch`](crate::quant::format::Kernels::rows_xbatch) of Q5_K: the GEMM in
/// the tiled order ([`rows_in`]).
#[inline(always)]
pub fn rows<I: Isa>(
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[BlockQ8K]],
    order: DotOrder,
    outs: &mut [&mut [f32]],
) -> bool {
    rows_in::<I, Q5KPanels>(DotOrder::Tiled, rows, row_bytes, acts, order, outs)
}

/// The [`PanelKernel`] of Q5_K in the tiled order: one float chain per output.
struct Q5KPanels;

impl<I: Isa> PanelKernel<I> for Q5KPanels {
    type Block = BlockQ5K;
    type Act = BlockQ8K;
    type Table = ActTable;
    type Panel = Panel;
    type Chains = __m256;
    const SLICE_BLOCKS: usize = SLICE_BLOCKS;

    #[inline(always)]
    fn buffers() -> (ActTable, Panel) {
        (ActTable::new(), Panel::new())
    }

    #[inline(always)]
    fn zero() -> __m256 {
        // SAFETY: AVX is part of the target this module is compiled for.
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn result(chains: __m256) -> __m256 {
        chains
    }

    #[inline(always)]
    unsafe fn fill(table: &mut ActTable, acts: &[&[BlockQ8K]], slice: Range<usize>) {
        table.fill(acts, slice);
    }

    #[inline(always)]
    unsafe fn pack(panel: &mut Panel, rows: [&[BlockQ5K]; PANEL_ROWS], slice: Range<usize>) {
        panel.pack::<I, BlockQ5K>(rows, slice, |b, quads| q5k_quads(b, quads));
    }

    #[inline(always)]
    unsafe fn tile<const M: usize, const TAIL: bool>(
        panel: &Panel,
        acts: &[&[BlockQ8K]],
        table: &ActTable,
        first_block: usize,
        k0: usize,
        acc: &mut [__m256; MAX_ACTS],
    ) {
        tile::<I, M>(panel, acts, table, first_block, k0, acc);
    }
}

/// [`PanelBlock::quads`] of eight rows' super-blocks `b`, at `quads`: each chunk's two
/// sub-blocks unpacked to bytes ([`K4Block::chunk`]) and transposed.
#[inline(always)]
unsafe fn q5k_quads(b: [&BlockQ5K; PANEL_ROWS], quads: *mut __m256i) {
    for c in 0..4 {
        let chunks = b.map(|b| b.chunk(c));
        let lo = transpose_8x8(chunks.map(|(lo, _)| lo));
        let hi = transpose_8x8(chunks.map(|(_, hi)| hi));
        for g in 0..8 {
            quads.add(8 * 2 * c + g).write(lo[g]);
            quads.add(8 * (2 * c + 1) + g).write(hi[g]);
        }
    }
}

/// The micro-kernel: activation rows `k0..k0 + M` against the panel, each register of quants
/// loaded once for the `M` rows; per super-block the tiled order's float steps, lane by lane.
#[inline(always)]
unsafe fn tile<I: Isa, const M: usize>(
    panel: &Panel,
    acts: &[&[BlockQ8K]],
    table: &ActTable,
    first_block: usize,
    k0: usize,
    acc: &mut [__m256; MAX_ACTS],
) {
    let mut sums: [__m256; M] = std::array::from_fn(|t| *acc.get_unchecked(k0 + t));
    for j in 0..panel.len() {
        let w = panel.block(j);
        let a: [*const i8; M] = std::array::from_fn(|t| {
            acts.get_unchecked(k0 + t).get_unchecked(first_block + j).qs.as_ptr()
        });
        let mut total = [_mm256_setzero_si256(); M];
        let mut total_min = [_mm256_setzero_si256(); M];
        for c in 0..4 {
            let sumi = if I::VNNI {
                vnni_chunk_sums::<I, M>(w, a, c).map(|s| exact_i32::<I>(s))
            } else {
                avx2_chunk_sums::<M>(w, a, c)
            };
            for t in 0..M {
                total[t] = _mm256_add_epi32(total[t], sumi[t]);
                let min_sum = _mm256_madd_epi16(w.mins[c], table.sub_sums(k0 + t, j, c));
                total_min[t] = _mm256_add_epi32(total_min[t], min_sum);
            }
        }
        // `(-dmin).mul_add(mins, d·total).mul_add(d_a, acc)` per lane (negation is exact).
        let neg_dmin = _mm256_xor_ps(w.dmin, _mm256_set1_ps(-0.0));
        for t in 0..M {
            let scaled = _mm256_mul_ps(w.d, _mm256_cvtepi32_ps(total[t]));
            let x = _mm256_fmadd_ps(neg_dmin, _mm256_cvtepi32_ps(total_min[t]), scaled);
            sums[t] = _mm256_fmadd_ps(x, _mm256_set1_ps(table.d(k0 + t, j)), sums[t]);
        }
    }
    for (t, v) in sums.into_iter().enumerate() {
        *acc.get_unchecked_mut(k0 + t) = v;
    }
}

/// Chunk `c`'s scaled sums `sc_2c·S_2c + sc_2c+1·S_2c+1` of the panel's eight rows (lanes)
/// against each of the `M` activation super-blocks at `a`, on AVX2: per sub-block, two groups
/// of four `maddubs` of a register of quants by four activation bytes broadcast, added in i16
/// (four pair sums of at most 2·31·127 stay within 31496: no wrap), each group then one `madd`
/// by the scale in both i16 of each lane.
#[inline(always)]
unsafe fn avx2_chunk_sums<const M: usize>(w: &PanelBlock, a: [*const i8; M], c: usize) -> [__m256i; M] {
    let mut out = [_mm256_setzero_si256(); M];
    for h in 0..2 {
        let s = 2 * c + h;
        for (half, quads) in w.quads[s].chunks_exact(4).enumerate() {
            let mut s16 = [_mm256_setzero_si256(); M];
            for (i, &q) in quads.iter().enumerate() {
                let g = 4 * half + i;
                for t in 0..M {
                    let a4 = a[t].add(32 * s + 4 * g).cast::<i32>().read_unaligned();
                    s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(q, _mm256_set1_epi32(a4)));
                }
            }
            for t in 0..M {
                out[t] = _mm256_add_epi32(out[t], _mm256_madd_epi16(s16[t], w.scales[s]));
            }
        }
    }
    out
}
