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
use std::mem::MaybeUninit;

use super::block32::SignedBlock32;
use super::dpbusd_broadcast;
use crate::quant::blocks::{blocks, f16_to_f32};
use crate::quant::formats::q8_0::BlockQ8_0;
use crate::quant::format::WeightRow;
use crate::quant::isa::Isa;
use crate::quant::DotOrder;

/// Weight rows per panel: one per i32 lane of a 256-bit register. (This and the tiling constants
/// below are shared by the super-block GEMMs, `panel_k4` and `panel_tiled`.)
pub(super) const PANEL_ROWS: usize = 8;
/// Blocks of a row per pass (2048 values): a panel's slice is 18 KiB, so it stays in L1 while
/// every activation row reads it; the float accumulators carry each chain across slices.
const SLICE_BLOCKS: usize = 64;
/// Panels per group of rows, whose accumulators (8 KiB) live on the stack together.
pub(super) const GROUP_PANELS: usize = 8;
/// Activation rows per pass (prefill's micro-batch, `kv_cache::UBATCH`); more go in turns.
pub(super) const MAX_ACTS: usize = 32;
/// Activation rows that share each load of a panel's register (the micro-kernel's tile).
pub(super) const TILE_ACTS: usize = 4;

/// Whether [`gemm`] serves blocks `B` on `I`: with VNNI every such format (its quants made
/// unsigned by an offset of at most 128, `vpdpbusd` never saturates); on AVX2 only formats whose
/// unsigned quants are below 16 (Q4_0), for which `maddubs`' pair sums of sixteen products
/// still fit i16 (16·15·128 = 30720), so eight of them add up before widening.
pub const fn serves<I: Isa, B: SignedBlock32>() -> bool {
    I::VNNI || matches!(B::OFFSET, Some(o) if o <= 8)
}

/// The offset that makes `B`'s quants unsigned (its own, or 128 for signed quants).
const fn offset<B: SignedBlock32>() -> i32 {
    match B::OFFSET {
        Some(o) => o,
        None => 128,
    }
}

/// `B`'s 32 quants as the unsigned bytes `q + offset`, in element order.
#[inline(always)]
unsafe fn unsigned<B: SignedBlock32>(b: &B) -> __m256i {
    if B::OFFSET.is_some() {
        b.unsigned_quants()
    } else {
        _mm256_xor_si256(b.quants(), _mm256_set1_epi8(-128))
    }
}

/// Activation rows below which [`rows`] declines: the transpose of a panel costs about as much
/// as five activation rows' work on it, so fewer rows take the row kernels.
pub const MIN_ACTS: usize = 8;

/// [`Kernels::dot_batch_rows`](crate::quant::format::Kernels::dot_batch_rows) of a 32-value
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
    unsafe { gemm::<I, W::Block>(rows, row_bytes, acts, outs) };
    true
}

/// Weight rows (`row_bytes` each, of blocks `B`) against the activation rows `acts`:
/// `outs[t][i]` = row i · `acts[t]` in the repacked order. The caller checks [`serves`] and the
/// lengths (every activation row as wide as a weight row, every output one value per row).
///
/// # Safety
/// The CPU must have what `I` needs (the matmul entry points choose `I` so).
#[inline(always)]
pub unsafe fn gemm<I: Isa, B: SignedBlock32>(
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[BlockQ8_0]],
    outs: &mut [&mut [f32]],
) {
    let n_blocks = row_bytes / size_of::<B>();
    let n_rows = rows.len() / row_bytes;
    assert!(
        row_bytes == n_blocks * size_of::<B>()
            && acts.len() == outs.len()
            && acts.iter().all(|a| a.len() == n_blocks)
            && outs.iter().all(|o| o.len() == n_rows),
        "gemm: rows, activations and outputs of unequal lengths"
    );
    let row = |i: usize| blocks::<B>(&rows[i * row_bytes..(i + 1) * row_bytes]);
    // Filled in place (returned by value they would be copied: 34 KiB per slice).
    let mut table = ActTable::new();
    let mut packed = Panel::new();
    for (acts, outs) in acts.chunks(MAX_ACTS).zip(outs.chunks_mut(MAX_ACTS)) {
        let group_rows = GROUP_PANELS * PANEL_ROWS;
        for first in (0..n_rows).step_by(group_rows) {
            let rows_here = (n_rows - first).min(group_rows);
            let panels = rows_here.div_ceil(PANEL_ROWS);
            let mut acc = [[_mm256_setzero_ps(); MAX_ACTS]; GROUP_PANELS];
            for b0 in (0..n_blocks).step_by(SLICE_BLOCKS) {
                let slice = b0..(b0 + SLICE_BLOCKS).min(n_blocks);
                table.fill::<B>(acts, slice.clone());
                for (p, acc) in acc[..panels].iter_mut().enumerate() {
                    // A partial last panel repeats its last row; those lanes are not written out.
                    let panel: [&[B]; PANEL_ROWS] = std::array::from_fn(|r| {
                        row(first + (p * PANEL_ROWS + r).min(rows_here - 1))
                    });
                    packed.pack(panel, slice.clone());
                    run_tiles::<I>(&packed, acts, &table, slice.start, acc);
                }
            }
            for (p, acc) in acc[..panels].iter().enumerate() {
                let lo = first + p * PANEL_ROWS;
                let len = (n_rows - lo).min(PANEL_ROWS);
                for (o, acc) in outs.iter_mut().zip(acc) {
                    let o = &mut o[lo..lo + len];
                    if len == PANEL_ROWS {
                        // SAFETY: `o` holds the eight values stored.
                        _mm256_storeu_ps(o.as_mut_ptr(), *acc);
                    } else {
                        let mut lanes = [0f32; PANEL_ROWS];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), *acc);
                        for (o, v) in o.iter_mut().zip(lanes) {
                            *o = v;
                        }
                    }
                }
            }
        }
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
    fn fill<B: SignedBlock32>(&mut self, acts: &[&[BlockQ8_0]], slice: std::ops::Range<usize>) {
        for (k, a) in acts.iter().enumerate() {
            for (j, b) in a[slice.clone()].iter().enumerate() {
                self.d[k][j].write(f16_to_f32(b.d));
                let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
                self.base[k][j].write(-offset::<B>() * sum);
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
/// quants 4c..4c+4 of row r, unsigned) and the eight rows' `d_w`.
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
    unsafe fn pack<B: SignedBlock32>(&mut self, rows: [&[B]; PANEL_ROWS], slice: std::ops::Range<usize>) {
        self.len = slice.len();
        for (j, i) in slice.enumerate() {
            let b = rows.map(|r| r.get_unchecked(i));
            self.quads[j].write(transpose_8x8(b.map(|b| unsigned(b))));
            let h = b.map(|b| i16::from_le_bytes(b.d()));
            let h = _mm_setr_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
            self.d[j].write(_mm256_cvtph_ps(h));
        }
    }
}

/// Rows become columns: i32 lane c of output r is lane r of input c, and back.
#[inline(always)]
pub(super) unsafe fn transpose_8x8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    // u_c, lanes 0..4 of each half: rows 0..4 (or 4..8) of column c (low half) and c+4.
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256(u0, u4, 0x20),
        _mm256_permute2x128_si256(u1, u5, 0x20),
        _mm256_permute2x128_si256(u2, u6, 0x20),
        _mm256_permute2x128_si256(u3, u7, 0x20),
        _mm256_permute2x128_si256(u0, u4, 0x31),
        _mm256_permute2x128_si256(u1, u5, 0x31),
        _mm256_permute2x128_si256(u2, u6, 0x31),
        _mm256_permute2x128_si256(u3, u7, 0x31),
    ]
}

/// Every activation row against one packed panel, [`TILE_ACTS`] at a time (the last few in a
/// smaller tile); `acc[k]` is activation row k's eight chains.
#[inline(always)]
unsafe fn run_tiles<I: Isa>(
    panel: &Panel,
    acts: &[&[BlockQ8_0]],
    table: &ActTable,
    first_block: usize,
    acc: &mut [__m256; MAX_ACTS],
) {
    let mut k = 0;
    while k + TILE_ACTS <= acts.len() {
        tile::<I, TILE_ACTS>(panel, acts, table, first_block, k, acc);
        k += TILE_ACTS;
    }
    match acts.len() - k {
        3 => tile::<I, 3>(panel, acts, table, first_block, k, acc),
        2 => tile::<I, 2>(panel, acts, table, first_block, k, acc),
        1 => tile::<I, 1>(panel, acts, table, first_block, k, acc),
        _ => {}
    }
}

/// The micro-kernel: activation rows `k0..k0 + M` against the panel, each block's eight
/// registers loaded once for the `M` rows.
#[inline(always)]
unsafe fn tile<I: Isa, const M: usize>(
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
            for t in 0..M {
                let a4 = a[t].add(4 * c);
                s[t] = if I::VNNI {
                    dpbusd_broadcast::<I>(s[t], w, a4)
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
            let sumi = if I::VNNI {
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
