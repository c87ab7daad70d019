//! Decode's mat-vec for Q4_0 and IQ4_NL in the repacked order, eight weight rows per pass, read
//! from the original blocks (no interleaved copy).
//!
//! llama.cpp's `gemv_q4_0_8x8_q8_0` gets its speed from a copy of the matrix with eight rows'
//! blocks interleaved, so that one 256-bit load holds a slice of all eight and its lanes stay
//! per row to the end: no horizontal sums. Read row by row, each row's integer dot is a vector
//! that must be reduced, and the four-row kernel spends about a third of its instructions on
//! that and on sign fix-ups. Here:
//! - the quants are taken unsigned (`u = q + offset`: Q4_0's nibbles, IQ4_NL's grid plus 128
//!   with VNNI): `Σ q·a = Σ u·a − offset·Σ a`, and `offset·Σ a` is made once per activation
//!   block for all the rows, so `maddubs`/`vpdpbusd` multiply `u` by the activations directly;
//! - two rows share a register (row r's 16 bytes in the low half, row r+4's in the high half),
//!   so unpacking the nibbles and multiplying by the activation's first and last 16 values
//!   (broadcast to both halves) costs one set of instructions for two rows;
//! - the eight rows' partial sums are reduced together by horizontal adds that leave the row
//!   sums in lanes in row order (`[r0 r1 r2 r3 | r4 r5 r6 r7]`), and one conversion, multiply
//!   and FMA per block serve the eight rows.
//!
//! Each row's result is exactly [`block32::repacked`](super::block32::repacked)'s: the same
//! integer block totals, scaled by the same `d_w·d_a` and added by one FMA per block in block
//! order. About half the four-row kernel's instructions per weight byte, which is what decode is
//! bound by on one core (the target's Zen 1 splits every 256-bit instruction in two, so the
//! count matters there twice).
//!
//! Each group requests the next group's lines as it goes ([`groups_ahead`], as the four-row
//! kernels do), rather than prefetching blocks ahead within the rows: decode streams the
//! weights from memory, and the requests keep more lines in flight than the rows' own loads.
//! (Figures for this kernel against the four-row one: the commit history and
//! docs/performance.md.)

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::block32::{SignedBlock32, ROWS_MAX_BLOCKS};
use super::{blocks_per_request, f16_lanes, groups_ahead, load128, request_lines};
use crate::quant::blocks::f16_to_f32;
use crate::quant::formats::q8_0::BlockQ8_0;
use crate::quant::isa::Isa;

/// Rows computed per pass.
pub const ROWS: usize = 8;

/// A 32-value block in Q4_0's layout: its scale and sixteen bytes whose low nibbles hold values
/// 0..16 and high nibbles 16..32, each value a quant `q` that the kernel takes as an unsigned
/// `u = q + offset`.
pub trait NibbleBlock: SignedBlock32 {
    /// The sixteen bytes of nibbles.
    fn qs(&self) -> &[u8; 16];
    /// The offset of [`NibbleBlock::sums`]' unsigned values with the kernels of `I`.
    fn offset<I: Isa>() -> i32;
    /// Lanes `[r0 … r7]`: each row's exact `Σ u·a` over one block, from four pairs of rows (r in
    /// the low half, r+4 in the high), each given as its nibbles (`lo`: values 0..16, `hi`:
    /// 16..32), against the activation's values 0..16 (`a_lo`) and 16..32 (`a_hi`), each in both
    /// halves.
    unsafe fn sums<I: Isa>(pairs: [(__m256i, __m256i); 4], a_lo: __m256i, a_hi: __m256i) -> __m256i;
}

/// `out[i]` = row i of `rows` (`B`, `row_bytes` each) · `a`, in the repacked order, for the
/// rows in whole groups of [`ROWS`], each group requesting the next one's lines as it goes
/// ([`groups_ahead`]); returns how many rows it wrote (the caller takes the rest, and rows wider
/// than [`ROWS_MAX_BLOCKS`] blocks, by the four-row kernel).
///
/// # Safety
/// The target must have AVX2/FMA/F16C (the module is compiled only then), and VNNI where `I`
/// says so.
#[inline(always)]
pub unsafe fn rows<I: Isa, B: NibbleBlock>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8_0],
    out: &mut [f32],
) -> usize {
    rows_n::<I, B, 1>(rows, row_bytes, [a], &mut [out])
}

/// [`rows`] for `N` activation rows (a batch of decode streams): `outs[t][i]` = row i · `a[t]`,
/// each bit-identical to [`rows`] with `a[t]` alone, as every row's sum keeps its own chain.
/// Each group's nibbles are loaded and unpacked once for all `N`; returns how many rows it
/// wrote in every `outs[t]`.
///
/// # Safety
/// As for [`rows`].
// Not inlined: see `groups_ahead`.
#[inline(never)]
pub unsafe fn rows_n<I: Isa, B: NibbleBlock, const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    a: [&[BlockQ8_0]; N],
    outs: &mut [&mut [f32]],
) -> usize {
    let (n, n_rows) = (a[0].len(), outs.first().map_or(0, |o| o.len()));
    if n > ROWS_MAX_BLOCKS
        || outs.len() != N
        || a.iter().any(|a| a.len() != n)
        || outs.iter().any(|o| o.len() != n_rows)
    {
        return 0;
    }
    // Per activation block, `-offset·Σa` and its scale: 8 bytes, so the tables of the widest
    // rows stay in L1 beside the weights streaming through. Uninitialised, so a call does not
    // clear what it will not read: entries 0..n are written.
    let mut tables = [const { [const { MaybeUninit::<Act>::uninit() }; ROWS_MAX_BLOCKS] }; N];
    for (table, a) in tables.iter_mut().zip(a) {
        for (t, ab) in table[..n].iter_mut().zip(a) {
            t.write(Act {
                minus_offset: -B::offset::<I>() * ab.qs.iter().map(|&v| v as i32).sum::<i32>(),
                d: f16_to_f32(ab.d),
            });
        }
    }
    // SAFETY: entries 0..n were written just above; MaybeUninit<T> has T's layout.
    let tables: [&[Act]; N] =
        std::array::from_fn(|s| std::slice::from_raw_parts(tables[s].as_ptr().cast::<Act>(), n));
    groups_ahead::<I, B, ROWS>(rows, row_bytes, n, n_rows, |i, w, next| {
        let sums = eight_rows::<I, B, N>(w, next, a, tables);
        for (out, sums) in outs.iter_mut().zip(&sums) {
            out[i..i + ROWS].copy_from_slice(sums);
        }
    })
}

/// What one activation block adds to every row's block total and scale.
#[derive(Clone, Copy)]
struct Act {
    /// `-offset·Σa`, taking the offset's share out of each row's integer total. Negated here
    /// so that the kernel adds a broadcast load (a negation in the loop cost two vector
    /// operations per block).
    minus_offset: i32,
    /// `d_a`.
    d: f32,
}

/// Eight rows of `n` blocks against each of the `N` prepared activations, requesting the
/// `next` group's lines as it reads its own ([`request_lines`], every [`blocks_per_request`]
/// blocks).
#[inline(always)]
unsafe fn eight_rows<I: Isa, B: NibbleBlock, const N: usize>(
    w: [&[B]; ROWS],
    next: Option<[&[B]; ROWS]>,
    a: [&[BlockQ8_0]; N],
    t: [&[Act]; N],
) -> [[f32; ROWS]; N] {
    let n = w[0].len();
    assert!(a.iter().zip(t).all(|(a, t)| a.len() == n && t.len() == n), "activations of another width");
    assert!(w.iter().all(|w| w.len() == n), "rows of unequal length");
    assert!(next.is_none_or(|x| x.iter().all(|x| x.len() == n)), "next rows of unequal length");
    let nibble = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    // Runs of a line's worth of blocks, each run requesting the next group's lines once
    // (`request_lines`; the blocks are in order either way). This loop's speed from memory
    // depends on its shape more than its instruction count shows: written as plain nested
    // loops it reads markedly slower from memory (not from L2), and a `block` that LLVM leaves
    // as a call slower still. Measure any change from memory, in all four instances.
    // The run is written out by a macro, not by `unrolled`'s closure, which LLVM left as a call
    // once several streams made `block` large.
    let run = blocks_per_request::<B>();
    const { assert!(blocks_per_request::<B>() <= 4, "a run longer than the steps below") };
    for start in (0..n).step_by(run) {
        request_lines(next, start);
        macro_rules! steps {
            ($($k:literal)*) => {
                $(if $k < run && start + $k < n {
                    block::<I, B, N>(w, a, t, start + $k, nibble, &mut acc);
                })*
            };
        }
        steps!(0 1 2 3);
    }
    let mut out = [[0.0f32; ROWS]; N];
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm256_storeu_ps(out.as_mut_ptr(), acc);
    }
    out
}

/// Block `i` of eight rows against each activation, added to `acc` (lane r of `acc[s]` is row
/// r's chain against `a[s]`).
#[inline(always)]
unsafe fn block<I: Isa, B: NibbleBlock, const N: usize>(
    w: [&[B]; ROWS],
    a: [&[BlockQ8_0]; N],
    t: [&[Act]; N],
    i: usize,
    nibble: __m256i,
    acc: &mut [__m256; N],
) {
    // SAFETY (get_unchecked): the caller asserted that every row and table has more than i
    // blocks.
    let b = w.map(|w| w.get_unchecked(i));
    // Rows r (low half) and r+4 (high half), their nibbles `lo` (values 0..16) and `hi`.
    let pairs = std::array::from_fn(|r| {
        let q = _mm256_inserti128_si256(
            _mm256_castsi128_si256(load128(b[r].qs().as_ptr())),
            load128(b[r + 4].qs().as_ptr()),
            1,
        );
        (_mm256_and_si256(q, nibble), _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble))
    });
    let d_w = _mm256_cvtph_ps(f16_lanes(b.map(|b| b.d())));
    for s in 0..N {
        let (ab, act) = (a[s].get_unchecked(i), t[s].get_unchecked(i));
        // The activation's values 0..16 and 16..32, each in both 128-bit halves.
        let a_lo = _mm256_broadcastsi128_si256(load128(ab.qs.as_ptr().cast()));
        let a_hi = _mm256_broadcastsi128_si256(load128(ab.qs.as_ptr().add(16).cast()));
        // Less offset·Σa: each row's Σq·a.
        let sums = _mm256_add_epi32(B::sums::<I>(pairs, a_lo, a_hi), _mm256_set1_epi32(act.minus_offset));
        acc[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d_w, _mm256_set1_ps(act.d)), acc[s]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::blocks;
    use crate::quant::formats::iq4_nl::BlockIq4Nl;
    use crate::quant::formats::q4_0::BlockQ4_0;
    use crate::quant::isa::{self, Avx2, Isa, Vnni};
    use crate::quant::random::random_row;
    use crate::quant::simd::block32;
    use crate::quant::GgmlType;

    /// Every row bit-identical to the one-row repacked kernel, on random rows (activation quants
    /// of every value a quantiser writes) with some nibbles at 0 and 15, for widths up to the
    /// table's limit, with a row count that leaves a remainder for the caller; Q4_0 and IQ4_NL,
    /// with both sets of kernels where the CPU has VNNI.
    #[test]
    fn eight_rows_equal_the_repacked_kernel_bit_for_bit() {
        eight_rows_equal_repacked::<Avx2, BlockQ4_0>(GgmlType::Q4_0);
        eight_rows_equal_repacked::<Avx2, BlockIq4Nl>(GgmlType::IQ4_NL);
        if isa::detected() == isa::Choice::Vnni {
            eight_rows_equal_repacked::<Vnni, BlockQ4_0>(GgmlType::Q4_0);
            eight_rows_equal_repacked::<Vnni, BlockIq4Nl>(GgmlType::IQ4_NL);
        }
    }

    fn eight_rows_equal_repacked<I: Isa, B: NibbleBlock>(ty: GgmlType) {
        let mut state = 0x5eed_u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state
        };
        for blocks_per_row in [1, 2, 7, 64, ROWS_MAX_BLOCKS] {
            let n = blocks_per_row * 32;
            let n_rows = 2 * ROWS + 3;
            let row_bytes = ty.row_bytes(n).unwrap();
            let mut weights = random_row(ty, n * n_rows, 1.0, &mut next);
            // Saturate some nibbles at 0 and 15 so the 16-bit bound is exercised.
            for (k, byte) in weights.iter_mut().enumerate() {
                if k % 18 >= 2 && k % 5 == 0 {
                    *byte = if k % 2 == 0 { 0xFF } else { 0x00 };
                }
            }
            let mut act_bytes = random_row(GgmlType::Q8_0, n, 1.0, &mut next);
            // Q8_0's quantiser writes -127..=127; -128 is no activation (and the sign trick of
            // the reference would wrap on it).
            for (k, q) in act_bytes.iter_mut().enumerate() {
                if k % 34 >= 2 && *q == 0x80 {
                    *q = 0x81;
                }
            }
            let act: &[BlockQ8_0] = blocks(&act_bytes);
            let mut out = vec![f32::NAN; n_rows];
            // SAFETY: this module is compiled only for AVX2/FMA/F16C targets; the caller runs
            // `I` only where the CPU has it.
            let done = unsafe { rows::<I, B>(&weights, row_bytes, act, &mut out) };
            assert_eq!(done, 2 * ROWS);
            for (r, got) in out[..done].iter().enumerate() {
                let row: &[B] = blocks(&weights[r * row_bytes..(r + 1) * row_bytes]);
                // SAFETY: as above.
                let want = unsafe { block32::repacked::<I, _>(row, act) };
                assert_eq!(got.to_bits(), want.to_bits(), "row {r} of {blocks_per_row} blocks");
            }
            assert!(out[done..].iter().all(|v| v.is_nan()), "wrote past the groups");
        }
    }
}
