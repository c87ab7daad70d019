//! What prefill's GEMMs with weight rows in the lanes share: the driver that walks a matmul's
//! rows in panels of eight and its blocks in slices, the tiling constants and the 8×8 transpose.
//! Each format family supplies its side as a [`PanelKernel`]: [`panel`](super::panel) (Q4_0,
//! IQ4_NL repacked), [`panel_k4`](super::panel_k4) (Q4_K repacked),
//! [`panel_k5`](super::panel_k5) (Q5_K tiled, on `panel_k4`'s panels) and
//! [`panel_tiled`](super::panel_tiled) (IQ4_XS, Q6_K tiled).
//!
//! The driver, per pass of at most [`MAX_ACTS`] activation rows and group of
//! [`GROUP_PANELS`] panels: for each slice of blocks, the activation table once, then each panel
//! packed (transposed into a stack buffer that stays in L1) and every activation row run against
//! it in tiles of [`TILE_ACTS`]; the float chains carry across slices, and each output's eight
//! lanes are stored at the end of the group. The order of every float operation is the
//! kernel's, so a kernel that keeps its format's chain keeps it through the driver.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::quant::blocks::{blocks, Block};
use crate::quant::isa::Isa;
use crate::quant::DotOrder;

/// Weight rows per panel: one per i32 lane of a 256-bit register.
pub(super) const PANEL_ROWS: usize = 8;
/// Panels per group of rows, whose accumulators (16 or 32 KiB) live on the stack together.
const GROUP_PANELS: usize = 8;
/// Activation rows per pass (prefill's micro-batch, `kv_cache::UBATCH`); more go in turns. A
/// multiple of [`TILE_ACTS`], so every pass but the last holds whole tiles and a batch's last
/// `len % 4` rows (where llama.cpp's Q4_K gemv takes over from its gemm) all fall at the end of
/// the last pass.
pub(crate) const MAX_ACTS: usize = 64;
/// Activation rows that share each load of a panel's register (the micro-kernel's tile).
const TILE_ACTS: usize = 4;
/// Activation rows below which the GEMMs decline: the transpose of a panel costs about as much
/// as five activation rows' work on it, so fewer rows take the row kernels.
pub const MIN_ACTS: usize = 8;

/// One format family's side of the GEMM: its activation table, its packed panel and its
/// micro-kernel. `I` is the instruction set the kernel is compiled for.
pub(super) trait PanelKernel<I: Isa> {
    /// The weight block.
    type Block: Block;
    /// The activation block (Q8_0 or Q8_K).
    type Act;
    /// What the micro-kernel takes from each activation block of a slice, made once per slice
    /// and group of rows for all its panels.
    type Table;
    /// A slice of a panel's eight rows, interleaved.
    type Panel;
    /// An output's float chains, eight rows in the lanes (one register, or Q4_K's two).
    type Chains: Copy;
    /// Blocks of a row per slice: a packed slice must stay in L1 while every activation row
    /// reads it.
    const SLICE_BLOCKS: usize;

    /// Both buffers, uninitialised (filled in place per slice: returned by value they would be
    /// copied, 18–25 KiB each time).
    fn buffers() -> (Self::Table, Self::Panel);
    fn zero() -> Self::Chains;
    /// The outputs of eight rows from their chains.
    unsafe fn result(chains: Self::Chains) -> __m256;
    /// The table's entries for activation rows `acts` and blocks `slice`.
    unsafe fn fill(table: &mut Self::Table, acts: &[&[Self::Act]], slice: Range<usize>);
    /// Blocks `slice` of the eight `rows`, interleaved into `panel`.
    unsafe fn pack(panel: &mut Self::Panel, rows: [&[Self::Block]; PANEL_ROWS], slice: Range<usize>);
    /// The micro-kernel: activation rows `k0..k0 + M` against the packed slice, whose first
    /// block is block `first_block` of the rows; `acc[k]` holds row k's chains. `TAIL`: these
    /// are the batch's last `len % TILE_ACTS` rows.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const M: usize, const TAIL: bool>(
        panel: &Self::Panel,
        acts: &[&[Self::Act]],
        table: &Self::Table,
        first_block: usize,
        k0: usize,
        acc: &mut [Self::Chains; MAX_ACTS],
    );
}

/// [`Kernels::rows_xbatch`](crate::quant::format::Kernels::rows_xbatch) by [`gemm`] with `K`,
/// a kernel that serves every row of its format: when `order` is `keeps`, the order `K` keeps,
/// and there are at least [`MIN_ACTS`] activation rows; otherwise false, nothing written.
#[inline(always)]
pub(super) fn rows_in<I: Isa, K: PanelKernel<I>>(
    keeps: DotOrder,
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[K::Act]],
    order: DotOrder,
    outs: &mut [&mut [f32]],
) -> bool {
    if order != keeps || acts.len() < MIN_ACTS {
        return false;
    }
    // SAFETY: the matmul entry points choose `I` for this CPU; `gemm` checks the lengths.
    unsafe { gemm::<I, K>(rows, row_bytes, acts, outs) };
    true
}

/// Weight rows (`row_bytes` each, of `K::Block`s) against the activation rows `acts`:
/// `outs[t][i]` = row i · `acts[t]` in `K`'s order.
///
/// # Safety
/// The CPU must have what `I` needs (the matmul entry points choose `I` so) and `K` must serve
/// these rows (each family's `serves`).
#[inline(always)]
pub(super) unsafe fn gemm<I: Isa, K: PanelKernel<I>>(
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[K::Act]],
    outs: &mut [&mut [f32]],
) {
    let n_blocks = row_bytes / size_of::<K::Block>();
    let n_rows = rows.len() / row_bytes;
    assert!(
        row_bytes == n_blocks * size_of::<K::Block>()
            && rows.len() == n_rows * row_bytes
            && acts.len() == outs.len()
            && acts.iter().all(|a| a.len() == n_blocks)
            && outs.iter().all(|o| o.len() == n_rows),
        "gemm: rows, activations and outputs of unequal lengths"
    );
    let row = |i: usize| blocks::<K::Block>(&rows[i * row_bytes..(i + 1) * row_bytes]);
    let block = size_of::<K::Block>();
    let group_rows = GROUP_PANELS * PANEL_ROWS;
    let slices = |b0: usize| b0..(b0 + K::SLICE_BLOCKS).min(n_blocks);
    // The bytes of blocks `slice` of the (at most eight) rows from `lo`: what packing a panel
    // reads.
    let panel_bytes = |lo: usize, slice: Range<usize>| -> [&[u8]; PANEL_ROWS] {
        std::array::from_fn(|r| {
            let start = (lo + r).min(n_rows - 1) * row_bytes;
            &rows[start + slice.start * block..start + slice.end * block]
        })
    };
    let (mut table, mut packed) = K::buffers();
    for (acts, outs) in acts.chunks(MAX_ACTS).zip(outs.chunks_mut(MAX_ACTS)) {
        for first in (0..n_rows).step_by(group_rows) {
            let rows_here = (n_rows - first).min(group_rows);
            let panels = rows_here.div_ceil(PANEL_ROWS);
            let mut acc = [[K::zero(); MAX_ACTS]; GROUP_PANELS];
            for b0 in (0..n_blocks).step_by(K::SLICE_BLOCKS) {
                let slice = slices(b0);
                K::fill(&mut table, acts, slice.clone());
                for (p, acc) in acc[..panels].iter_mut().enumerate() {
                    // A partial last panel repeats its last row; those lanes are not written out.
                    let panel: [&[K::Block]; PANEL_ROWS] = std::array::from_fn(|r| {
                        row(first + (p * PANEL_ROWS + r).min(rows_here - 1))
                    });
                    K::pack(&mut packed, panel, slice.clone());
                    // The panel packed next: the group's next, or its first in the next slice,
                    // or the next group's first.
                    let next = if p + 1 < panels {
                        Some(panel_bytes(first + (p + 1) * PANEL_ROWS, slice.clone()))
                    } else if slice.end < n_blocks {
                        Some(panel_bytes(first, slices(slice.end)))
                    } else if first + group_rows < n_rows {
                        Some(panel_bytes(first + group_rows, slices(0)))
                    } else {
                        None
                    };
                    run_tiles::<I, K>(&packed, acts, &table, slice.start, acc, next);
                }
            }
            for (p, acc) in acc[..panels].iter().enumerate() {
                let lo = first + p * PANEL_ROWS;
                let len = (n_rows - lo).min(PANEL_ROWS);
                for (o, &chains) in outs.iter_mut().zip(acc) {
                    let lanes = K::result(chains);
                    if len == PANEL_ROWS {
                        // A whole panel: one store (a copy of a variable length calls memcpy).
                        _mm256_storeu_ps(o[lo..lo + PANEL_ROWS].as_mut_ptr(), lanes);
                    } else {
                        let mut buf = [0f32; PANEL_ROWS];
                        _mm256_storeu_ps(buf.as_mut_ptr(), lanes);
                        o[lo..lo + len].copy_from_slice(&buf[..len]);
                    }
                }
            }
        }
    }
}

/// Every activation row against one packed slice, [`TILE_ACTS`] at a time, the last few
/// (fewer than four) in a smaller tile; meanwhile the rows of the `next` panel are requested,
/// one per tile (all at once would stall on the core's few miss buffers).
#[inline(always)]
unsafe fn run_tiles<I: Isa, K: PanelKernel<I>>(
    panel: &K::Panel,
    acts: &[&[K::Act]],
    table: &K::Table,
    first_block: usize,
    acc: &mut [K::Chains; MAX_ACTS],
    next: Option<[&[u8]; PANEL_ROWS]>,
) {
    let next = next.as_ref().map_or(&[][..], |n| &n[..]);
    let mut k = 0;
    while k + TILE_ACTS <= acts.len() {
        if let Some(row) = next.get(k / TILE_ACTS) {
            // The rows of a panel are too short a stream (one slice of eight rows) for the
            // hardware prefetcher to ramp up on: unrequested, packing waits on memory for each.
            crate::quant::prefetch_l1(row);
        }
        K::tile::<TILE_ACTS, false>(panel, acts, table, first_block, k, acc);
        k += TILE_ACTS;
    }
    next.iter().skip(k / TILE_ACTS).for_each(|row| crate::quant::prefetch_l1(row));
    match acts.len() - k {
        3 => K::tile::<3, true>(panel, acts, table, first_block, k, acc),
        2 => K::tile::<2, true>(panel, acts, table, first_block, k, acc),
        1 => K::tile::<1, true>(panel, acts, table, first_block, k, acc),
        _ => {}
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
