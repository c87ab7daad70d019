//! Prefill's matmul for the mins-free K-quants IQ4_XS and Q6_K in llama.cpp's tiled order as a
//! GEMM with weight rows in the lanes (the super-block counterpart of [`panel`](super::panel)).
//!
//! The tiled row kernels (`tiled_rows_x8` in `formats/iq4_xs.rs`, `tiled_rows` in
//! `formats/q6_k.rs`) hold 32 values of one weight row per register and need, per super-block
//! and (weight row, activation row), a horizontal reduction of eight i32 lanes; their
//! multiply-adds take i16 operands (16 products per instruction). Here eight weight rows share
//! a register instead: lane r holds four consecutive quants of row r, and one multiply-add of
//! that register by four activation bytes broadcast to every lane advances all eight rows'
//! sub-block sums at once (32 products per instruction), so each lane ends the super-block
//! holding its row's integer total, no horizontal step. As in `panel`, a slice of eight rows ("a
//! panel") is transposed into a small stack buffer per call and read by every activation row of
//! the call (prefill's micro-batch): the weights stay zero-copy and the buffer stays in L1.
//!
//! Per sub-block s (IQ4_XS: 32 values, scale `ls_s - 32`; Q6_K: 16 values, a signed byte scale)
//! and lane:
//! - VNNI: a `vpdpbusd` per quad of the quants made unsigned (IQ4_XS: grid value + 128,
//!   1..=241; Q6_K: as stored, 0..=63, i.e. + 32) by broadcast activation quads, starting from
//!   `-offset·Σa_s`, gives `S_s = Σ v·a` exactly (no saturation); one `vpmulld` by the row's
//!   scale then adds `scale_s·S_s` to the super-block's i32 total.
//! - AVX2, IQ4_XS ([`Avx2Quants::Signed`]): `maddubs` needs an unsigned operand whose pair sums
//!   fit i16, which `v + 128` breaks (241·127·2), so the signs move to the activations as in
//!   ggml: `maddubs(|v|, a·sgn v)` (the grid has no zero, and Q8_K activations are never -128),
//!   pairs within ±32258; then `madd` by the row's scale in both i16 halves of its lane applies
//!   the scale to the pair sums for free.
//! - AVX2, Q6_K ([`Avx2Quants::Offset`]): the stored quants (0..=63) are unsigned already, so
//!   `maddubs` takes them as they are; its pair sums (within ±16002) of two quads add up in i16
//!   before one `madd` by the scale, and the offset comes off once per super-block and lane,
//!   `-32·Σ_s scale_s·bsum_s`, as one `madd` per two sub-blocks (`-32·scale` and the bsums are
//!   both within i16). Two and a half instructions per quad and activation row, where the row
//!   kernel takes two multiplies per 32 values of one row plus its unpack and horizontal sums.
//!
//! Each output is the tiled order's chain exactly: per super-block the integer total
//! `Σ_s scale_s·(v·a)_s` (the same integer however it is summed), converted once, multiplied by
//! `d_w`, then one FMA by `d_a` into the output's float accumulator, super-block after
//! super-block (see [`tiled`](super::super_block::tiled)). So the results are bit-identical to
//! the row kernels, which the property tests hold this to.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::panel_gemm::{rows_in, transpose_8x8, PanelKernel, MAX_ACTS, PANEL_ROWS};
use super::{dpbusd_broadcast, f16_lanes};
use crate::quant::blocks::{Block, QK_K};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::isa::Isa;
use crate::quant::DotOrder;

/// Super-blocks of a row per pass (2048 values): a panel's slice is at most 20.3 KiB (2 KiB of
/// quants, up to 512 bytes of scales and 32 of `d` per super-block), so it stays in L1 while
/// every activation row reads it; the float accumulators carry each chain across slices.
const SLICE_BLOCKS: usize = 8;
/// Registers of quads per super-block (256 values, four per lane).
const QUADS: usize = QK_K / 4;
/// The most sub-blocks a super-block has (Q6_K's sixteen).
const MAX_SUBS: usize = 16;

/// How the AVX2 micro-kernel multiplies a format's quants (VNNI has one way for all,
/// `vpdpbusd` on the unsigned quants).
pub enum Avx2Quants {
    /// Signed quants, |v| ≤ 127 and never 0, scales within i16: `maddubs(|v|, a·sgn v)`.
    Signed,
    /// Quants plus [`TiledBlock::OFFSET`], below 64, in sub-blocks of 16 (one Q8_K bsum each):
    /// `maddubs(v + offset, a)`, two quads summed in i16, and the offset taken off per
    /// super-block from the bsums.
    Offset,
}

/// A mins-free K-quant super-block as this GEMM reads it: sub-blocks of `SUB_LEN` values, each
/// with an integer scale, whose total the tiled order scales by the f16 `d`.
pub trait TiledBlock: Block {
    /// Values per sub-block (32 or 16).
    const SUB_LEN: usize;
    /// What [`TiledBlock::quants`] adds to each value under VNNI (its quants then unsigned).
    const OFFSET: i32;
    /// How the AVX2 micro-kernel multiplies its quants.
    const AVX2: Avx2Quants;
    fn d(&self) -> [u8; 2];
    /// The 256 values in element order, 32 per register: plus [`TiledBlock::OFFSET`] as
    /// unsigned bytes for VNNI and [`Avx2Quants::Offset`], signed for [`Avx2Quants::Signed`].
    unsafe fn quants<I: Isa>(&self) -> [__m256i; 8];
    /// The sub-blocks' scales as i32, lane s of register h holding sub-block 8h + s's.
    unsafe fn scales_i32(&self) -> [__m256i; 2];
}

/// Whether `I`'s micro-kernel is the AVX2 one for [`Avx2Quants::Offset`] quants.
const fn avx2_offset<I: Isa, B: TiledBlock>() -> bool {
    const { assert!(!matches!(B::AVX2, Avx2Quants::Offset) || (B::SUB_LEN == 16 && B::OFFSET <= 32)) };
    !I::VNNI && matches!(B::AVX2, Avx2Quants::Offset)
}

/// [`Kernels::rows_xbatch`](crate::quant::format::Kernels::rows_xbatch) of a mins-free
/// K-quant: the GEMM in the tiled order ([`rows_in`]).
#[inline(always)]
pub fn rows<I: Isa, B: TiledBlock>(
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[BlockQ8K]],
    order: DotOrder,
    outs: &mut [&mut [f32]],
) -> bool {
    rows_in::<I, Tiled<B>>(DotOrder::Tiled, rows, row_bytes, acts, order, outs)
}

/// The [`PanelKernel`] of the mins-free K-quants `B` in the tiled order.
struct Tiled<B>(PhantomData<B>);

impl<I: Isa, B: TiledBlock> PanelKernel<I> for Tiled<B> {
    type Block = B;
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
        table.fill::<I, B>(acts, slice);
    }

    #[inline(always)]
    unsafe fn pack(panel: &mut Panel, rows: [&[B]; PANEL_ROWS], slice: Range<usize>) {
        panel.pack::<I, B>(rows, slice);
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
        tile::<I, B, M>(panel, acts, table, first_block, k0, acc);
    }
}

/// What the micro-kernel takes from each activation super-block of a slice, made once per slice
/// and group of rows for all its panels: `d_a`, and (VNNI) per sub-block `-offset·Σa`, the
/// integer the sub-block's unsigned sum starts from (from the block's `bsums`, exact sums of its
/// quants).
struct ActTable {
    d: [[MaybeUninit<f32>; SLICE_BLOCKS]; MAX_ACTS],
    base: [[MaybeUninit<[i32; MAX_SUBS]>; SLICE_BLOCKS]; MAX_ACTS],
}

impl ActTable {
    fn new() -> ActTable {
        ActTable {
            d: [[MaybeUninit::uninit(); SLICE_BLOCKS]; MAX_ACTS],
            base: [[MaybeUninit::uninit(); SLICE_BLOCKS]; MAX_ACTS],
        }
    }

    /// The entries of `acts`' super-blocks `slice`.
    #[inline(always)]
    fn fill<I: Isa, B: TiledBlock>(&mut self, acts: &[&[BlockQ8K]], slice: Range<usize>) {
        let t = self;
        for (k, a) in acts.iter().enumerate() {
            for (j, b) in a[slice.clone()].iter().enumerate() {
                t.d[k][j].write(b.d());
                if I::VNNI {
                    // Each bsum covers 16 values: one per Q6_K sub-block, two per IQ4_XS one.
                    let per = B::SUB_LEN / 16;
                    t.base[k][j].write(std::array::from_fn(|s| {
                        if s < QK_K / B::SUB_LEN {
                            -B::OFFSET * (per * s..per * (s + 1)).map(|i| b.bsum(i)).sum::<i32>()
                        } else {
                            0
                        }
                    }));
                }
            }
        }
    }

    /// Activation row `k`'s `d` of the slice's super-block `j` (written by `fill` for every row
    /// and super-block it was given).
    #[inline(always)]
    unsafe fn d(&self, k: usize, j: usize) -> f32 {
        self.d.get_unchecked(k).get_unchecked(j).assume_init()
    }

    /// Activation row `k`'s `-offset·Σa` of sub-block `s` of the slice's super-block `j` (VNNI).
    #[inline(always)]
    unsafe fn base(&self, k: usize, j: usize, s: usize) -> i32 {
        *self.base.get_unchecked(k).get_unchecked(j).assume_init_ref().get_unchecked(s)
    }
}

/// A slice of a panel's eight rows, interleaved: per super-block, 64 registers (register c,
/// lane r: values 4c..4c+4 of row r, as [`TiledBlock::quants`] gives them), per sub-block s the
/// eight rows' scales (VNNI: an i32 per lane; AVX2: the scale in both i16 halves of the lane,
/// for `madd`), for [`Avx2Quants::Offset`] per pair of sub-blocks i the rows'
/// `-offset·scale` of sub-blocks 2i and 2i + 1 in the two i16 halves of the lane, and the
/// eight rows' `d`.
struct Panel {
    quads: [MaybeUninit<[__m256i; QUADS]>; SLICE_BLOCKS],
    scales: [MaybeUninit<[__m256i; MAX_SUBS]>; SLICE_BLOCKS],
    offset_scales: [MaybeUninit<[__m256i; MAX_SUBS / 2]>; SLICE_BLOCKS],
    d: [MaybeUninit<__m256>; SLICE_BLOCKS],
    len: usize,
}

impl Panel {
    fn new() -> Panel {
        Panel {
            quads: [const { MaybeUninit::uninit() }; SLICE_BLOCKS],
            scales: [const { MaybeUninit::uninit() }; SLICE_BLOCKS],
            offset_scales: [const { MaybeUninit::uninit() }; SLICE_BLOCKS],
            d: [const { MaybeUninit::uninit() }; SLICE_BLOCKS],
            len: 0,
        }
    }

    /// Super-blocks `slice` of `rows`, interleaved.
    #[inline(always)]
    unsafe fn pack<I: Isa, B: TiledBlock>(&mut self, rows: [&[B]; PANEL_ROWS], slice: Range<usize>) {
        let p = self;
        p.len = slice.len();
        for (j, i) in slice.enumerate() {
            let b = rows.map(|r| r.get_unchecked(i));
            let quads = p.quads[j].as_mut_ptr().cast::<[__m256i; 8]>();
            let values = b.map(|b| b.quants::<I>());
            for g in 0..QK_K / 32 {
                quads.add(g).write(transpose_8x8(values.map(|v| v[g])));
            }
            let scales = panel_scales::<I, B>(b);
            if avx2_offset::<I, B>() {
                p.offset_scales[j].write(offset_scales::<B>(&scales));
            }
            p.scales[j].write(scales);
            p.d[j].write(_mm256_cvtph_ps(f16_lanes(b.map(|b| b.d()))));
        }
    }
}

/// The eight rows' scales, register s holding sub-block s's in lane r (row r): each row's scales
/// unpacked together ([`TiledBlock::scales_i32`]) and transposed, eight sub-blocks at a time. For
/// AVX2 each lane holds the scale in both its i16 halves.
#[inline(always)]
unsafe fn panel_scales<I: Isa, B: TiledBlock>(b: [&B; PANEL_ROWS]) -> [__m256i; MAX_SUBS] {
    let by_row = b.map(|b| b.scales_i32());
    let lo = transpose_8x8(by_row.map(|s| s[0]));
    let hi = if B::SUB_LEN == 16 { transpose_8x8(by_row.map(|s| s[1])) } else { lo };
    let mut out: [__m256i; MAX_SUBS] = std::array::from_fn(|s| if s < 8 { lo[s] } else { hi[s - 8] });
    if !I::VNNI {
        let low = _mm256_set1_epi32(0xFFFF);
        out = out.map(|v| _mm256_or_si256(_mm256_and_si256(v, low), _mm256_slli_epi32(v, 16)));
    }
    out
}

/// Per pair i of sub-blocks, `-offset·scale` of sub-blocks 2i and 2i + 1 in the low and high
/// i16 of each lane, from the panel's AVX2 `scales` (the scale in both halves). |scale| ≤ 128 and
/// offset ≤ 32, so the products fit i16.
#[inline(always)]
unsafe fn offset_scales<B: TiledBlock>(scales: &[__m256i; MAX_SUBS]) -> [__m256i; MAX_SUBS / 2] {
    let neg = _mm256_set1_epi16(-B::OFFSET as i16);
    let low = _mm256_set1_epi32(0xFFFF);
    std::array::from_fn(|i| {
        let even = _mm256_and_si256(_mm256_mullo_epi16(scales[2 * i], neg), low);
        let odd = _mm256_andnot_si256(low, _mm256_mullo_epi16(scales[2 * i + 1], neg));
        _mm256_or_si256(even, odd)
    })
}

/// The micro-kernel: activation rows `k0..k0 + M` against the panel, each register of the panel
/// loaded once for the `M` rows; per super-block the tiled order's float step.
#[inline(always)]
unsafe fn tile<I: Isa, B: TiledBlock, const M: usize>(
    panel: &Panel,
    acts: &[&[BlockQ8K]],
    table: &ActTable,
    first_block: usize,
    k0: usize,
    acc: &mut [__m256; MAX_ACTS],
) {
    let mut sums: [__m256; M] = std::array::from_fn(|t| *acc.get_unchecked(k0 + t));
    for j in 0..panel.len {
        let quads = panel.quads.get_unchecked(j).assume_init_ref();
        let scales = panel.scales.get_unchecked(j).assume_init_ref();
        let a: [*const i8; M] = std::array::from_fn(|t| {
            acts.get_unchecked(k0 + t).get_unchecked(first_block + j).qs.as_ptr()
        });
        let mut total = [_mm256_setzero_si256(); M];
        if avx2_offset::<I, B>() {
            // -offset·Σ_s scale_s·bsum_s: the bsums of sub-blocks 2i and 2i + 1 are the two
            // i16 of one little-endian i32, so one broadcast and `madd` take a pair.
            let offset_scales = panel.offset_scales.get_unchecked(j).assume_init_ref();
            for (t, total) in total.iter_mut().enumerate() {
                let bsums =
                    acts.get_unchecked(k0 + t).get_unchecked(first_block + j).bsums.as_ptr().cast::<i32>();
                for (i, &os) in offset_scales.iter().enumerate() {
                    let pair = _mm256_set1_epi32(bsums.add(i).read_unaligned());
                    *total = _mm256_add_epi32(*total, _mm256_madd_epi16(os, pair));
                }
            }
        }
        for (s, &scale) in scales[..QK_K / B::SUB_LEN].iter().enumerate() {
            let a_s = a.map(|a| a.add(B::SUB_LEN * s));
            let quads = quads.as_ptr().add(B::SUB_LEN / 4 * s);
            if I::VNNI {
                let base = std::array::from_fn(|t| table.base(k0 + t, j, s));
                sub_block_vnni::<I, M>(quads, B::SUB_LEN / 4, scale, a_s, base, &mut total);
            } else if avx2_offset::<I, B>() {
                sub_block_avx2_offset::<M>(quads, scale, a_s, &mut total);
            } else {
                sub_block_avx2::<M>(quads, B::SUB_LEN / 4, scale, a_s, &mut total);
            }
        }
        let d_w = panel.d.get_unchecked(j).assume_init();
        for t in 0..M {
            let x = _mm256_mul_ps(d_w, _mm256_cvtepi32_ps(total[t]));
            sums[t] = _mm256_fmadd_ps(x, _mm256_set1_ps(table.d(k0 + t, j)), sums[t]);
        }
    }
    for (t, v) in sums.into_iter().enumerate() {
        *acc.get_unchecked_mut(k0 + t) = v;
    }
}

/// `total[t] += scale·S`, S the sub-block's `Σ v·a` per lane: a `vpdpbusd` per register of the
/// `n` unsigned quads (`v + offset`) by activation row t's quads at `a[t]`, from `base[t]` =
/// `-offset·Σa`. |S| ≤ 32·127·128 (IQ4_XS) or 16·32·128 (Q6_K), `|scale·S|` below 2^24 and the
/// total below 2^28: `vpmulld` and the adds are exact.
#[inline(always)]
unsafe fn sub_block_vnni<I: Isa, const M: usize>(
    quads: *const __m256i,
    n: usize,
    scale: __m256i,
    a: [*const i8; M],
    base: [i32; M],
    total: &mut [__m256i; M],
) {
    let mut s: [__m256i; M] = base.map(|b| _mm256_set1_epi32(b));
    for c in 0..n {
        let w = *quads.add(c);
        for t in 0..M {
            s[t] = dpbusd_broadcast::<I>(s[t], w, a[t].add(4 * c));
        }
    }
    for t in 0..M {
        total[t] = _mm256_add_epi32(total[t], _mm256_mullo_epi32(s[t], scale));
    }
}

/// `total[t] += scale·Σ v·a` per lane on AVX2: per quad `maddubs(|v|, a·sgn v)` (pairs within
/// ±2·127·127, no saturation; exact as the grid has no zero and `a` is never -128), then `madd`
/// by `scale` (in both i16 halves of each lane), which sums the pair and scales it.
#[inline(always)]
unsafe fn sub_block_avx2<const M: usize>(
    quads: *const __m256i,
    n: usize,
    scale: __m256i,
    a: [*const i8; M],
    total: &mut [__m256i; M],
) {
    for c in 0..n {
        let w = *quads.add(c);
        let abs = _mm256_abs_epi8(w);
        for t in 0..M {
            let a4 = _mm256_set1_epi32(a[t].add(4 * c).cast::<i32>().read_unaligned());
            let p = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(a4, w));
            total[t] = _mm256_add_epi32(total[t], _mm256_madd_epi16(p, scale));
        }
    }
}

/// `total[t] += scale·Σ (v + offset)·a` per lane on AVX2 for a sub-block of four quads of
/// [`Avx2Quants::Offset`] quants (below 64): `maddubs` of each quad by the activation quad (pairs
/// within ±63·127·2), two quads' pairs summed in i16 (within ±32004), then `madd` by `scale` (in
/// both i16 halves of each lane), which sums the pair and scales it. The offset's share is taken
/// off per super-block in [`tile`].
#[inline(always)]
unsafe fn sub_block_avx2_offset<const M: usize>(
    quads: *const __m256i,
    scale: __m256i,
    a: [*const i8; M],
    total: &mut [__m256i; M],
) {
    let broadcast = |a: *const i8| _mm256_set1_epi32(a.cast::<i32>().read_unaligned());
    for c in [0, 2] {
        let [w0, w1] = [*quads.add(c), *quads.add(c + 1)];
        for t in 0..M {
            let a0 = broadcast(a[t].add(4 * c));
            let a1 = broadcast(a[t].add(4 * c + 4));
            let p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, a0), _mm256_maddubs_epi16(w1, a1));
            total[t] = _mm256_add_epi32(total[t], _mm256_madd_epi16(p, scale));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::quant::tests::{
        batch_equals_groups, quantized, random_activations, random_weights, runnable_isas, Rng,
    };
    use crate::quant::{isa, DotOrder, GgmlType};

    use super::MAX_ACTS;

    /// The GEMM at its boundaries against llama.cpp's grouping, bit for bit: 70 weight rows (a
    /// group of 64 and a partial panel), 19 super-blocks (two full slices of eight and a partial
    /// one), a pass of [`MAX_ACTS`] activation rows then five (a tile of four and one).
    #[test]
    fn wide_rows_many_panels_equal_grouping() {
        let mut rng = Rng(11);
        for w in [GgmlType::IQ4_XS, GgmlType::Q6_K] {
            let n = 19 * 256;
            let rows: Vec<u8> = (0..70).flat_map(|_| random_weights(w, n, &mut rng)).collect();
            let acts: Vec<Vec<u8>> =
                (0..MAX_ACTS + 5).map(|_| quantized(w, &random_activations(n, &mut rng))).collect();
            for choice in runnable_isas() {
                let checked =
                    isa::forced(choice, || batch_equals_groups(w, DotOrder::Tiled, n, &rows, &acts));
                assert!(checked.is_ok(), "{w}: {} on {choice}", checked.unwrap_err());
            }
        }
    }
}
