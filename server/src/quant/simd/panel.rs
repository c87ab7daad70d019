//! Prefill's matmul for the 32-value formats in the repacked order (Q4_0, IQ4_NL) as a GEMM
//! with weight rows in the lanes.
//!
//! The row kernels of [`block32`](super::block32) put 32 values of one weight row in a register
//! and reduce every (weight row, activation row, block) product horizontally: three rounds of
//! `hadd` per eight products, the largest cost left in them. Here eight weight rows share a
//! register instead: lane r holds four consecutive quants of row r, and one multiply-add of
//! that register by four activation bytes broadcast to every lane (`vpdpbusd` with an embedded
//! broadcast under VNNI, `vpbroadcastd` and `maddubs` on AVX2) advances all eight rows' block
//! sums at once, so after eight of them each lane holds its row's integer block total with no
//! horizontal step. That needs the rows interleaved: a slice of eight rows ("a panel") is
//! transposed into a small buffer on the stack per call, read by every activation row of the
//! call (prefill's micro-batch), never kept — the weights stay zero-copy, the buffer stays in
//! L1, and its cost (one transpose per weight block and call) is shared by up to 32 rows.
//!
//! Each output is the repacked order's chain exactly: per block the integer total
//! `Σ u·a - offset·Σ a` (the same integer however it is summed), then one FMA of it by
//! `d_w·d_a` into the row's float accumulator, block after block. So the results are
//! bit-identical to [`block32::repacked`](super::block32::repacked) and its many-row forms,
//! which the property tests hold this to.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::block32::SignedBlock32;
use super::{dpbusd, dpbusd_broadcast, f16_lanes};
use super::panel_gemm::{gemm, transpose_8x8, PanelKernel, MAX_ACTS, MIN_ACTS, PANEL_ROWS};
use crate::quant::blocks::f16_to_f32;
use crate::quant::formats::q8_0::BlockQ8_0;
use crate::quant::format::WeightRow;
use crate::quant::isa::Isa;
use crate::quant::DotOrder;

/// Blocks of a row per slice (2048 values): a panel's slice is 18 KiB, so it stays in L1 while
/// every activation row reads it; the float accumulators carry each chain across slices.
const SLICE_BLOCKS: usize = 64;

/// Whether [`gemm`] serves blocks `B` on `I`: with VNNI every such format (its quants made
/// unsigned by an offset of at most 128, `vpdpbusd` never saturates); on AVX2 formats whose
/// unsigned quants are below 16 (Q4_0), for which `maddubs`' pair sums of sixteen products
/// still fit i16 (16·15·128 = 30720), so eight of them add up before widening, and formats of
/// signed quants (IQ4_NL), which go [`signed`]'s way.
pub const fn serves<I: Isa, B: SignedBlock32>() -> bool {
    I::VNNI || matches!(B::OFFSET, Some(o) if o <= 8) || signed::<I, B>()
}

/// Whether the panel holds `B`'s quants signed: on AVX2 for formats without an offset of their
/// own. Made unsigned by +128 (up to 255 for IQ4_NL's grid) `maddubs`' pair sums could
/// saturate, so the micro-kernel multiplies `|w|` by the activation with `w`'s sign (`vpsignb`;
/// |w|, |a| ≤ 127 or `|w|` = 128, so a pair sums to at most 32512) and widens every `maddubs`
/// with a `madd`: two multiplies per four weights of eight rows, where Q4_0 takes one, and no
/// offset to take off.
const fn signed<I: Isa, B: SignedBlock32>() -> bool {
    !I::VNNI && B::OFFSET.is_none()
}

/// The offset that makes `B`'s quants as the panel holds them unsigned (its own, 128 for signed
/// quants under VNNI, none for [`signed`] ones).
const fn offset<I: Isa, B: SignedBlock32>() -> i32 {
    match B::OFFSET {
        Some(o) => o,
        None if signed::<I, B>() => 0,
        None => 128,
    }
}

/// `B`'s 32 quants as the panel holds them, in element order: the unsigned bytes `q + offset`,
/// or the quants themselves for [`signed`] ones.
#[inline(always)]
unsafe fn panel_quants<I: Isa, B: SignedBlock32>(b: &B) -> __m256i {
    if B::OFFSET.is_some() {
        b.unsigned_quants()
    } else if signed::<I, B>() {
        b.quants()
    } else {
        _mm256_xor_si256(b.quants(), _mm256_set1_epi8(-128))
    }
}

/// [`Kernels::rows_xbatch`](crate::quant::format::Kernels::rows_xbatch) of a 32-value
/// format `W`: [`gemm`] in the repacked order where `W` lists it, [`serves`] says so and there
/// are at least [`MIN_ACTS`] activation rows; otherwise false, nothing written.
#[inline(always)]
pub fn rows<W, I: Isa>(
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[BlockQ8_0]],
    order: DotOrder,
    outs: &mut [&mut [f32]],
) -> bool
where
    W: WeightRow,
    W::Block: SignedBlock32,
{
    let repacked = order == DotOrder::Repacked && W::ORDERS.contains(&DotOrder::Repacked);
    if !repacked || !serves::<I, W::Block>() || acts.len() < MIN_ACTS {
        return false;
    }
    // SAFETY: the matmul entry points choose `I` for this CPU; `gemm` checks the lengths.
    unsafe { gemm::<I, Repacked32<W::Block>>(rows, row_bytes, acts, outs) };
    true
}

/// The [`PanelKernel`] of the 32-value formats `B` in the repacked order.
struct Repacked32<B>(PhantomData<B>);

impl<I: Isa, B: SignedBlock32> PanelKernel<I> for Repacked32<B> {
    type Block = B;
    type Act = BlockQ8_0;
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
    unsafe fn fill(table: &mut ActTable, acts: &[&[BlockQ8_0]], slice: Range<usize>) {
        table.fill::<I, B>(acts, slice);
    }

    #[inline(always)]
    unsafe fn pack(panel: &mut Panel, rows: [&[B]; PANEL_ROWS], slice: Range<usize>) {
        panel.pack::<I, B>(rows, slice);
    }

    #[inline(always)]
    unsafe fn tile<const M: usize, const TAIL: bool>(
        panel: &Panel,
        acts: &[&[BlockQ8_0]],
        table: &ActTable,
        first_block: usize,
        k0: usize,
        acc: &mut [__m256; MAX_ACTS],
    ) {
        tile::<I, B, M>(panel, acts, table, first_block, k0, acc);
    }
}

/// What the micro-kernel takes from each activation block of a slice, made once per slice and
/// group of rows for all its panels: `d_a` as f32, and `-offset·Σa`, the integer the block's
/// unsigned total starts from.
struct ActTable {
    d: [[MaybeUninit<f32>; SLICE_BLOCKS]; MAX_ACTS],
    base: [[MaybeUninit<i32>; SLICE_BLOCKS]; MAX_ACTS],
}

impl ActTable {
    fn new() -> ActTable {
        ActTable {
            d: [[MaybeUninit::uninit(); SLICE_BLOCKS]; MAX_ACTS],
            base: [[MaybeUninit::uninit(); SLICE_BLOCKS]; MAX_ACTS],
        }
    }

    /// The entries of `acts`' blocks `slice`.
    #[inline(always)]
    fn fill<I: Isa, B: SignedBlock32>(&mut self, acts: &[&[BlockQ8_0]], slice: Range<usize>) {
        for (k, a) in acts.iter().enumerate() {
            for (j, b) in a[slice.clone()].iter().enumerate() {
                self.d[k][j].write(f16_to_f32(b.d));
                // The signed route (offset 0) starts every block's total at 0: no sum to make.
                let base = match offset::<I, B>() {
                    0 => 0,
                    o => -o * b.qs.iter().map(|&q| q as i32).sum::<i32>(),
                };
                self.base[k][j].write(base);
            }
        }
    }

    /// Activation row `k`'s `(d, base)` of the slice's block `j` (written by `fill` for every
    /// row and block it was given).
    #[inline(always)]
    unsafe fn get(&self, k: usize, j: usize) -> (f32, i32) {
        (
            self.d.get_unchecked(k).get_unchecked(j).assume_init(),
            self.base.get_unchecked(k).get_unchecked(j).assume_init(),
        )
    }
}

/// A slice of a panel's eight rows, interleaved: per block, eight registers (register c, lane r:
/// quants 4c..4c+4 of row r, as [`panel_quants`] gives them) and the eight rows' `d_w`.
struct Panel {
    quads: [MaybeUninit<[__m256i; 8]>; SLICE_BLOCKS],
    d: [MaybeUninit<__m256>; SLICE_BLOCKS],
    len: usize,
}

impl Panel {
    fn new() -> Panel {
        Panel {
            quads: [const { MaybeUninit::uninit() }; SLICE_BLOCKS],
            d: [const { MaybeUninit::uninit() }; SLICE_BLOCKS],
            len: 0,
        }
    }

    /// Blocks `slice` of `rows`, interleaved.
    #[inline(always)]
    unsafe fn pack<I: Isa, B: SignedBlock32>(&mut self, rows: [&[B]; PANEL_ROWS], slice: Range<usize>) {
        self.len = slice.len();
        for (j, i) in slice.enumerate() {
            let b = rows.map(|r| r.get_unchecked(i));
            self.quads[j].write(transpose_8x8(b.map(|b| panel_quants::<I, B>(b))));
            self.d[j].write(_mm256_cvtph_ps(f16_lanes(b.map(|b| b.d()))));
        }
    }
}

/// The micro-kernel: activation rows `k0..k0 + M` against the panel, each block's eight
/// registers loaded once for the `M` rows.
#[inline(always)]
unsafe fn tile<I: Isa, B: SignedBlock32, const M: usize>(
    panel: &Panel,
    acts: &[&[BlockQ8_0]],
    table: &ActTable,
    first_block: usize,
    k0: usize,
    acc: &mut [__m256; MAX_ACTS],
) {
    let mut sums: [__m256; M] = std::array::from_fn(|t| *acc.get_unchecked(k0 + t));
    let ones = _mm256_set1_epi16(1);
    for j in 0..panel.len {
        let quads = panel.quads.get_unchecked(j).assume_init_ref();
        let a: [*const i8; M] =
            std::array::from_fn(|t| acts.get_unchecked(k0 + t).get_unchecked(first_block + j).qs.as_ptr());
        let mut s = [_mm256_setzero_si256(); M];
        if I::VNNI {
            for (t, s) in s.iter_mut().enumerate() {
                *s = _mm256_set1_epi32(table.get(k0 + t, j).1);
            }
        }
        for (c, &w) in quads.iter().enumerate() {
            // |w| once for the tile's rows (a byte of -128 gives 128, right as unsigned).
            let abs_w = if signed::<I, B>() { _mm256_sign_epi8(w, w) } else { w };
            for t in 0..M {
                let a4 = a[t].add(4 * c);
                s[t] = if I::VNNI {
                    dpbusd_broadcast::<I>(s[t], w, a4)
                } else if signed::<I, B>() {
                    let a4 = _mm256_set1_epi32(a4.cast::<i32>().read_unaligned());
                    dpbusd::<I>(s[t], abs_w, _mm256_sign_epi8(a4, w))
                } else {
                    // u < 16: every i16 lane sums at most sixteen products (see `serves`).
                    let a4 = _mm256_set1_epi32(a4.cast::<i32>().read_unaligned());
                    _mm256_add_epi16(s[t], _mm256_maddubs_epi16(w, a4))
                };
            }
        }
        let d_w = panel.d.get_unchecked(j).assume_init();
        for t in 0..M {
            let (d_a, base) = table.get(k0 + t, j);
            let sumi = if I::VNNI || signed::<I, B>() {
                s[t]
            } else {
                _mm256_add_epi32(_mm256_madd_epi16(s[t], ones), _mm256_set1_epi32(base))
            };
            let d = _mm256_mul_ps(d_w, _mm256_set1_ps(d_a));
            sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, sums[t]);
        }
    }
    for (t, v) in sums.into_iter().enumerate() {
        *acc.get_unchecked_mut(k0 + t) = v;
    }
}
