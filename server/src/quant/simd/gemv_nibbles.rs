//! Decode's mat-vec for Q4_0 in the repacked order, eight weight rows per pass, read from the
//! original blocks (no interleaved copy).
//!
//! llama.cpp's `gemv_q4_0_8x8_q8_0` gets its speed from a copy of the matrix with eight rows'
//! blocks interleaved, so that one 256-bit load holds a slice of all eight and its lanes stay
//! per row to the end: no horizontal sums. Read row by row, each row's integer dot is a vector
//! that must be reduced, and the four-row kernel spends about a third of its instructions on
//! that and on sign fix-ups. Here:
//! - the quants are taken unsigned (the nibbles `u`, 0..15): `Σ q·a = Σ u·a − 8·Σ a`, and
//!   `8·Σ a` is made once per activation block for all the rows, so `maddubs` multiplies the
//!   nibbles by the activations directly;
//! - two rows share a register (row r's 16 bytes in the low half, row r+1's in the high half),
//!   so unpacking the nibbles and multiplying by the activation's first and last 16 values
//!   (broadcast to both halves) costs one set of instructions for two rows;
//! - the eight rows' 16-bit partial sums are reduced together by three rounds of `phaddw`, which
//!   leave row sums in lanes (`[r0 r2 r4 r6 | r1 r3 r5 r7]`): they stay exact, because 16
//!   products of a nibble (≤ 15) and an activation (|a| ≤ 127) are at most 30480 < 2¹⁵.
//!
//! Each row's result is exactly [`block32::repacked`](super::block32::repacked)'s: the same
//! integer block totals, scaled by the same `d_w·d_a` and added by one FMA per block in block
//! order. About half the four-row kernel's instructions per weight byte, which is what decode is
//! bound by on one core (the target's Zen 1 splits every 256-bit instruction in two, so the
//! count matters there twice).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::block32::ROWS_MAX_BLOCKS;
use super::load128;
use crate::quant::prefetch;
use crate::quant::blocks::{blocks, f16_to_f32};
use crate::quant::formats::q4_0::BlockQ4_0;
use crate::quant::formats::q8_0::BlockQ8_0;

/// Rows computed per pass.
pub const ROWS: usize = 8;

/// `out[i]` = row i of `rows` (Q4_0, `row_bytes` each) · `a`, in the repacked order, for the
/// rows in whole groups of [`ROWS`]; returns how many rows it wrote (the caller takes the rest,
/// and rows wider than [`ROWS_MAX_BLOCKS`] blocks, by the four-row kernel).
///
/// # Safety
/// The target must have AVX2/FMA/F16C (the module is compiled only then).
// Not inlined: see `quads_ahead`.
#[inline(never)]
pub unsafe fn rows(rows: &[u8], row_bytes: usize, a: &[BlockQ8_0], out: &mut [f32]) -> usize {
    let n = a.len();
    let block = size_of::<BlockQ4_0>();
    if n > ROWS_MAX_BLOCKS || row_bytes != n * block || rows.len() != row_bytes * out.len() {
        return 0;
    }
    // Per activation block, `8·Σa` and its scale: 8 bytes, so the table of the widest rows
    // stays in L1 beside the weights streaming through. Uninitialised, so a call does not clear
    // what it will not read: entries 0..n are written.
    let mut table = [const { MaybeUninit::<Act>::uninit() }; ROWS_MAX_BLOCKS];
    for (t, ab) in table[..n].iter_mut().zip(a) {
        let q = _mm256_loadu_si256(ab.qs.as_ptr().cast());
        let sum = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(8), q),
            _mm256_set1_epi16(1),
        );
        t.write(Act {
            offset: super::hsum_i32(sum),
            d: f16_to_f32(ab.d),
        });
    }
    // SAFETY: entries 0..n were written just above; MaybeUninit<T> has T's layout.
    let table = std::slice::from_raw_parts(table.as_ptr().cast::<Act>(), n);
    let group = ROWS * row_bytes;
    let groups = out.len() / ROWS;
    let group_rows = |g: usize| -> Option<[&[BlockQ4_0]; ROWS]> {
        let bytes = rows.get(g * group..(g + 1) * group)?;
        Some(std::array::from_fn(|r| blocks(&bytes[r * row_bytes..(r + 1) * row_bytes])))
    };
    // The first group's first lines; from there each group requests its own and the next's.
    if groups > 0 {
        for r in 0..ROWS {
            prefetch(&rows[r * row_bytes..r * row_bytes + row_bytes.min(AHEAD * block)]);
        }
    }
    for (g, out) in out.chunks_exact_mut(ROWS).enumerate() {
        let w = group_rows(g).expect("whole groups");
        out.copy_from_slice(&eight_rows(w, group_rows(g + 1), a, table));
    }
    groups * ROWS
}

/// Blocks ahead of the one being read that each row's cache lines are requested: far enough
/// for a load from memory (~100 ns) at the ~20 ns one block of eight rows takes, near enough
/// not to evict what is still to be read.
const AHEAD: usize = 16;

/// What one activation block adds to every row's block total and scale.
#[derive(Clone, Copy)]
struct Act {
    /// `8·Σa`, the offset's share of each row's integer total.
    offset: i32,
    /// `d_a`.
    d: f32,
}

/// Eight rows of `n` blocks against the prepared activation, requesting the lines [`AHEAD`]
/// blocks on as it goes, in these rows and then in the `next` group's. Rows are short streams
/// (a 2048-wide Q4_0 row is 18 lines), too short for the hardware prefetcher to ramp up on,
/// and requesting a whole group's lines at once stalls on the core's few miss buffers; so
/// eight lines, one per row, every third block (54 bytes, under a line: none is skipped).
#[inline(always)]
unsafe fn eight_rows(
    w: [&[BlockQ4_0]; ROWS],
    next: Option<[&[BlockQ4_0]; ROWS]>,
    a: &[BlockQ8_0],
    t: &[Act],
) -> [f32; ROWS] {
    let n = a.len();
    assert!(t.len() == n, "table of another width");
    assert!(w.iter().all(|w| w.len() == n), "rows of unequal length");
    assert!(next.is_none_or(|x| x.iter().all(|x| x.len() == n)), "next rows of unequal length");
    let nibble = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    for (i, (ab, act)) in a.iter().zip(t).enumerate() {
        if i % 3 == 0 {
            let ahead = i + AHEAD;
            let target = if ahead < n { Some((w, ahead)) } else { next.map(|x| (x, ahead - n)) };
            if let Some((rows, j)) = target.filter(|&(_, j)| j < n) {
                for row in rows {
                    // SAFETY: j < n, the rows' length; a prefetch never faults.
                    _mm_prefetch(row.as_ptr().add(j).cast(), _MM_HINT_T0);
                }
            }
        }
        // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
        let b = w.map(|w| w.get_unchecked(i));
        // The activation's values 0..16 and 16..32, each in both 128-bit halves.
        let a_lo = _mm256_broadcastsi128_si256(load128(ab.qs.as_ptr().cast()));
        let a_hi = _mm256_broadcastsi128_si256(load128(ab.qs.as_ptr().add(16).cast()));
        // Rows r and r+1: sixteen i16 lanes, eight per row, each the sum of four products.
        let pair = |r: usize| {
            let q = _mm256_inserti128_si256(
                _mm256_castsi128_si256(load128(b[r].qs.as_ptr())),
                load128(b[r + 1].qs.as_ptr()),
                1,
            );
            let lo = _mm256_and_si256(q, nibble);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
            _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, a_lo),
                _mm256_maddubs_epi16(hi, a_hi),
            )
        };
        let h = _mm256_hadd_epi16(
            _mm256_hadd_epi16(pair(0), pair(2)),
            _mm256_hadd_epi16(pair(4), pair(6)),
        );
        // Lanes [r0 r2 r4 r6 | r1 r3 r5 r7]: each row's Σu·a, less 8·Σa.
        let sums = _mm256_sub_epi32(
            _mm256_madd_epi16(h, _mm256_set1_epi16(1)),
            _mm256_set1_epi32(act.offset),
        );
        let d = [0, 2, 4, 6, 1, 3, 5, 7].map(|r| i16::from_le_bytes(b[r].d));
        let d_w = _mm256_cvtph_ps(_mm_setr_epi16(
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
        ));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d_w, _mm256_set1_ps(act.d)), acc);
    }
    let mut lanes = [0.0f32; ROWS];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    [0, 4, 1, 5, 2, 6, 3, 7].map(|lane| lanes[lane])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::isa::Avx2;
    use crate::quant::random::random_row;
    use crate::quant::simd::block32;
    use crate::quant::GgmlType;

    /// Every row bit-identical to the one-row repacked kernel, on random rows (activation quants
    /// of every value a quantiser writes) with some nibbles at 0 and 15, for widths up to the
    /// table's limit, with a row count that leaves a remainder for the caller.
    #[test]
    fn eight_rows_equal_the_repacked_kernel_bit_for_bit() {
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
            let row_bytes = GgmlType::Q4_0.row_bytes(n).unwrap();
            let mut weights = random_row(GgmlType::Q4_0, n * n_rows, 1.0, &mut next);
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
            // SAFETY: this module is compiled only for AVX2/FMA/F16C targets.
            let done = unsafe { rows(&weights, row_bytes, act, &mut out) };
            assert_eq!(done, 2 * ROWS);
            for (r, got) in out[..done].iter().enumerate() {
                let row: &[BlockQ4_0] = blocks(&weights[r * row_bytes..(r + 1) * row_bytes]);
                // SAFETY: as above.
                let want = unsafe { block32::repacked::<Avx2, _>(row, act) };
                assert_eq!(got.to_bits(), want.to_bits(), "row {r} of {blocks_per_row} blocks");
            }
            assert!(out[done..].iter().all(|v| v.is_nan()), "wrote past the groups");
        }
    }
}
