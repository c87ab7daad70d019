//! What the IQ4_NL and IQ4_XS prefill kernels share: eight activation rows widened to i16 once
//! per tile of blocks for all the weight rows, the grid looked up straight into i16, the
//! eight-row integer reduction, and the per-output chains carried across tiles in the outputs.
//!
//! Why i16: `_mm256_maddubs_epi16` needs an unsigned operand, so the i8 route signs each
//! activation row against each weight block and widens the pair sums with a second madd (four
//! instructions per block and activation row with the load). With the activations widened once
//! per call, a 32-value block against one activation row is two `_mm256_madd_epi16` (their loads
//! folded) and an add. The integer sums are the same: both routes are exact here (|w|, |a| ≤ 127,
//! so maddubs never saturates), and integer addition does not depend on its order.
//!
//! With VNNI the IQ4_NL kernel goes back to bytes: `vpdpbusd` takes unsigned × signed bytes, so
//! the grid is looked up offset by +128 (1..=241, unsigned) against the activations as they are,
//! one instruction per block and activation row, and 128·Σa, computed once per tile entry, is
//! taken off the exact total. IQ4_XS keeps the i16 route (its sub-block scale is multiplied into
//! the weights), with `vpdpwssd` folding each madd and its add.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::quant::blocks::{blocks, Block, KVALUES_IQ4NL};
use crate::quant::isa::Isa;
use crate::quant::simd::{dpwssd_mem, nibbles_32};

/// One entry of a tile: one block's worth (`L` values) of each of the eight activation rows as
/// i16, and their scales (f32), lane k for activation row k.
#[repr(C, align(32))]
pub struct Acts<const L: usize> {
    pub q: [[i16; L]; 8],
    pub d: [f32; 8],
}

/// One entry of the VNNI IQ4_NL tile: a 32-value block of each of the eight activation rows as
/// the signed bytes they are, `128·Σa` of each (what the +128 of [`grid_u8`] adds to the dot),
/// and their scales (f32), lane k for activation row k.
#[repr(C, align(32))]
pub struct ActsI8 {
    pub q: [[i8; 32]; 8],
    pub offset: [i32; 8],
    pub d: [f32; 8],
}

/// [`KVALUES_IQ4NL`] plus 128, as unsigned bytes (1..=241): `vpdpbusd`'s unsigned operand.
const GRID_U8: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// The 32 grid values of 16 bytes of nibbles in the Q4_0 order plus 128, as unsigned bytes:
/// the low nibbles' in bytes 0..16, the high ones' in 16..32.
#[inline(always)]
pub unsafe fn grid_u8(qs: *const u8) -> __m256i {
    _mm256_shuffle_epi8(grid_u8_table(), nibbles_32(qs))
}

/// [`KVALUES_IQ4NL`] plus 128 in both 128-bit halves, for `_mm256_shuffle_epi8`.
#[inline(always)]
pub unsafe fn grid_u8_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(GRID_U8.as_ptr().cast()))
}

/// The 32 grid values of 16 bytes of nibbles in the Q4_0 order, as i16: elements 0..16 (the low
/// nibbles) and 16..32 (the high ones). The lookups run on 128-bit halves, which are single
/// operations on Zen 1.
#[inline(always)]
pub unsafe fn grid_i16(qs: *const u8) -> (__m256i, __m256i) {
    let grid = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    let m4 = _mm_set1_epi8(0x0F);
    let q = _mm_loadu_si128(qs.cast());
    let lo = _mm_shuffle_epi8(grid, _mm_and_si128(q, m4));
    let hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    (_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi))
}

/// Writes 32 signed bytes at `src` as i16 at `dst` (the tile's widening).
#[inline(always)]
pub unsafe fn widen_32(src: *const i8, dst: *mut i16) {
    let q = _mm256_loadu_si256(src.cast());
    _mm256_storeu_si256(dst.cast(), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
    _mm256_storeu_si256(
        dst.add(16).cast(),
        _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)),
    );
}

/// `acc +` [`dot_i16`]: with VNNI two `vpdpwssd` (loads folded), otherwise exactly today's two
/// madds and two adds (the lanes differ between the two, their total does not).
#[inline(always)]
pub unsafe fn acc_dot_i16<I: Isa>(acc: __m256i, w: (__m256i, __m256i), a: *const i16) -> __m256i {
    if I::VNNI {
        dpwssd_mem::<I>(dpwssd_mem::<I>(acc, w.0, a), w.1, a.add(16))
    } else {
        _mm256_add_epi32(acc, dot_i16(w, a))
    }
}

/// `Σ w·a` of 32 values as eight i32 lanes: `w` as [`grid_i16`] gives it, `a` 32 i16.
#[inline(always)]
pub unsafe fn dot_i16(w: (__m256i, __m256i), a: *const i16) -> __m256i {
    let lo = _mm256_madd_epi16(w.0, _mm256_loadu_si256(a.cast()));
    let hi = _mm256_madd_epi16(w.1, _mm256_loadu_si256(a.add(16).cast()));
    _mm256_add_epi32(lo, hi)
}

/// Lane k = the sum of `v[k]`'s eight lanes: eight reductions in nine instructions.
#[inline(always)]
pub unsafe fn sum_lanes_x8(v: [__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // Lanes 0..4: rows 0..4's sums of their lanes 0..4; lanes 4..8: of their lanes 4..8.
    let x = _mm256_hadd_epi32(h01, h23);
    // The same for rows 4..8.
    let y = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_blend_epi32(x, y, 0xF0);
    let hi = _mm256_permute2x128_si256(x, y, 0x21);
    _mm256_add_epi32(lo, hi)
}

/// The f16 `d` in all eight lanes (exact, as every f16 → f32 conversion).
#[inline(always)]
pub unsafe fn broadcast_f16(d: [u8; 2]) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(d)))
}

/// Consecutive weight rows (`row_bytes` each, `n` blocks of `B`) against eight activation rows,
/// `outs[k][r]` = the chain of weight row r and activation row k, lane k of one accumulator.
/// The blocks go in tiles of `T` entries `E` ([`Acts`], or [`ActsI8`] for VNNI's IQ4_NL):
/// `widen(i, entry)` writes block i's activations into a tile entry once for all the weight rows, then `dot(block, entry, acc)` extends each row's eight
/// chains block by block. Between tiles the chains wait in `outs` (f32, so exactly), so every
/// output sees its blocks in order, whatever the width; the first tile starts from +0.0.
#[inline(always)]
pub unsafe fn rows_x8<B: Block, E, const T: usize>(
    rows: &[u8],
    row_bytes: usize,
    n: usize,
    mut outs: [&mut [f32]; 8],
    widen: impl Fn(usize, *mut E),
    dot: impl Fn(&B, &E, __m256) -> __m256,
) {
    assert!(
        row_bytes == n * size_of::<B>() && rows.len().is_multiple_of(row_bytes.max(1)),
        "rows of another width"
    );
    let n_rows = rows.len().checked_div(row_bytes).unwrap_or(0);
    assert!(outs.iter().all(|o| o.len() == n_rows), "outputs of another row count");
    // Uninitialised: only the entries a tile writes are read (the callers' tiles are 24-26 KiB,
    // L1-sized).
    let mut tile = [const { MaybeUninit::<E>::uninit() }; T];
    let mut start = 0;
    while start < n {
        let len = T.min(n - start);
        for (j, e) in tile[..len].iter_mut().enumerate() {
            widen(start + j, e.as_mut_ptr());
        }
        // SAFETY: entries 0..len were written just above.
        let entries = std::slice::from_raw_parts(tile.as_ptr().cast::<E>(), len);
        for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
            let w = blocks::<B>(row).get_unchecked(start..start + len);
            let mut acc = if start == 0 {
                _mm256_setzero_ps()
            } else {
                _mm256_setr_ps(
                    outs[0][r], outs[1][r], outs[2][r], outs[3][r], outs[4][r], outs[5][r],
                    outs[6][r], outs[7][r],
                )
            };
            // Two blocks per iteration: the loop's pointer updates and branch are a tenth of an
            // IQ4_NL block's instructions.
            let (pairs, e_pairs) = (w.chunks_exact(2), entries.chunks_exact(2));
            let (w_rest, e_rest) = (pairs.remainder(), e_pairs.remainder());
            for (b, e) in pairs.zip(e_pairs) {
                acc = dot(&b[0], &e[0], acc);
                acc = dot(&b[1], &e[1], acc);
            }
            if let ([b], [e]) = (w_rest, e_rest) {
                acc = dot(b, e, acc);
            }
            let mut v = [0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), acc);
            for (o, v) in outs.iter_mut().zip(v) {
                // SAFETY: every output holds n_rows values (asserted above) and r < n_rows.
                *o.get_unchecked_mut(r) = v;
            }
        }
        start += len;
    }
}
