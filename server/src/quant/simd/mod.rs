//! AVX2/FMA/F16C helpers the formats' kernels share (compiled in when the target has them; the
//! workspace builds for x86-64-v3). Tricks follow ggml/src/ggml-cpu/arch/x86/quants.c
//! (ggml-org/ggml d99724f):
//! - `_mm256_maddubs_epi16` needs an unsigned operand, so signed×signed products are taken as
//!   `|w| × (a with w's sign)`; `_mm256_madd_epi16` then widens pairs to i32 (or applies a scale).
//! - One float FMA per block (32 values) or super-block (256 values), into independent
//!   accumulators so consecutive blocks do not wait on each other's FMA latency.
//! - K-quant mins and offsets are taken from the activation's `bsums`, never from the quants.
//!
//! Rows need no alignment: every load is unaligned. The float orders (how the per-block products
//! are summed) live by family: [`block32`] for 32-value blocks against Q8_0, [`super_block`] for
//! K-quants against Q8_K, [`float`] for F32/F16/BF16.

use std::arch::x86_64::*;

use super::blocks::{blocks, Block};
use super::isa::Isa;
use super::CACHE_LINE;

pub mod affine32;
pub mod block32;
pub mod float;
pub mod gemv_nibbles;
pub mod grid;
pub mod iq4;
pub mod panel;
pub mod panel_gemm;
pub mod panel_k4;
pub mod panel_k5;
pub mod panel_tiled;
pub mod super_block;

/// Decode's mat-vec by an `R`-row kernel over the `n_rows` rows of `rows` (`row_bytes` each, `n`
/// blocks of `B`) in whole groups of `R`: `kernel(i, group, next)` computes rows i..i+R and
/// stores their results while it requests the lines of the `next` group (see [`request_next`]).
/// Returns how many rows it computed: the groups, or none when the lengths do not fit; the
/// caller takes the rest.
///
/// The rows are streams too short for the hardware prefetcher to ramp up on, and requesting a
/// whole group's lines at once stalls on the core's few miss buffers; requested block by block,
/// [`quads_ahead_of`] quads (at least one group) ahead, the loads keep streaming.
///
/// Its callers, decode's mat-vec entry points, are `#[inline(never)]`: in a function of its own
/// the compiler inlines a kernel's helpers (the maps over the rows) into the loop; inlined into
/// `dot_rows`' dispatch, which holds every order's kernels, they were left as calls, which
/// slows decode markedly.
#[inline(always)]
pub unsafe fn groups_ahead<I: Isa, B: Block, const R: usize>(
    rows: &[u8],
    row_bytes: usize,
    n: usize,
    n_rows: usize,
    mut kernel: impl FnMut(usize, [&[B]; R], Option<[&[B]; R]>),
) -> usize {
    let group = R * row_bytes;
    if row_bytes != n * size_of::<B>() || rows.len() != row_bytes * n_rows {
        return 0;
    }
    let group_rows = |g: usize| -> Option<[&[B]; R]> {
        let bytes = rows.get(g * group..(g + 1) * group)?;
        Some(std::array::from_fn(|r| blocks(&bytes[r * row_bytes..(r + 1) * row_bytes])))
    };
    let ahead = (4 * quads_ahead_of::<I>())
        .div_ceil(R)
        .max(min_bytes_ahead_of::<I, B>().div_ceil(group.max(1)));
    crate::quant::prefetch(&rows[..(ahead * group).min(rows.len())]);
    let groups = n_rows / R;
    for g in 0..groups {
        kernel(R * g, group_rows(g).expect("whole groups"), group_rows(g + ahead));
    }
    R * groups
}

/// How far ahead, in quads of rows, [`groups_ahead`] requests (the eight-row kernels: one group
/// either way, unmeasured on Zen 1-3). The CPUs with VNNI (Zen 4 and 5, Intel from Cascade Lake)
/// honour `prefetcht1` (L2, see [`request_next`]), whose deeper queue keeps two quads in flight
/// (two is clearly faster than one there, and four no faster than two). The rest (Zen 1-3,
/// whose hints all fill L1) keep one: there a second quad's early lines evict the ones being
/// read, and two quads ahead was slower.
#[inline(always)]
pub const fn quads_ahead_of<I: Isa>() -> usize {
    if I::VNNI {
        2
    } else {
        1
    }
}

/// The least distance, in bytes, [`groups_ahead`] requests ahead where the requests go to L2
/// ([`quads_ahead_of`]): with narrow rows two quads are only a few KB, too close to hide the
/// memory's latency (narrow rows, such as the default model's LM head, gain from at least 8 KB;
/// rows already that far apart are unchanged). The L1 hints of Zen 1-3 keep the quads'
/// distance (see above).
///
/// Only the 32-value formats (blocks under a line), where it was measured: for Q4_K's four-row
/// kernel the distance is two quads either way, but computed at run time it changed how LLVM
/// laid out the loop's registers, and the kernel read markedly slower from memory.
#[inline(always)]
const fn min_bytes_ahead_of<I: Isa, B>() -> usize {
    if I::VNNI && size_of::<B>() < CACHE_LINE {
        8192
    } else {
        0
    }
}

/// `f(0)`, `f(1)`, ..., `f(N - 1)` written out, not a loop: in a loop over sub-blocks or chunks
/// LLVM keeps the loop rolled and builds each step's shuffle masks and offsets from the index at
/// run time; called with constants, they are constants (Q4_K's decode kernel, with its scales
/// unpacked in a register, is much faster written out than as a loop).
#[inline(always)]
pub fn unrolled<const N: usize>(mut f: impl FnMut(usize)) {
    const { assert!(N <= 8, "unrolled: up to eight steps") };
    macro_rules! steps {
        ($($k:literal)*) => {
            $(if $k < N {
                f($k);
            })*
        };
    }
    steps!(0 1 2 3 4 5 6 7);
}

/// Requests every cache line of block `b` into L2 ([`crate::quant::prefetch`] over its bytes).
#[inline(always)]
pub fn request_block<B>(b: &B) {
    // SAFETY: the block's own bytes, read only as addresses to prefetch.
    crate::quant::prefetch(unsafe {
        std::slice::from_raw_parts((b as *const B).cast::<u8>(), size_of::<B>())
    });
}

/// Requests block i of each of the `next` rows into L2: what a many-row kernel given
/// [`groups_ahead`]'s next group does as it reads its own block i. Blocks under a line are
/// requested by their last byte every [`blocks_per_request`] blocks (at most a line apart, so no
/// line is skipped), the first block also by its first; larger ones by every line
/// ([`request_block`]).
/// L2, not L1 (`prefetcht1`): on a CPU that honours the hint (Zen 4), four rows' worth of early
/// lines in L1 evict the lines the kernel is reading, so decode is clearly faster with the
/// requests in L2. Zen 1-3 load every hint into L1, so they see no change.
#[inline(always)]
pub unsafe fn request_next<B, const R: usize>(next: Option<[&[B]; R]>, i: usize) {
    if i.is_multiple_of(blocks_per_request::<B>()) {
        request_lines(next, i);
    }
}

/// Blocks between [`request_next`]'s requests: a line's worth, or one for blocks of a line or
/// more.
#[inline(always)]
pub const fn blocks_per_request<B>() -> usize {
    let per_line = CACHE_LINE / size_of::<B>();
    if per_line == 0 {
        1
    } else {
        per_line
    }
}

/// [`request_next`]'s requests for block i, whatever i is: for a loop that steps by
/// [`blocks_per_request`] itself (the remainder test per block cost the eight-row kernel about
/// ten instructions of its ~95 per block).
#[inline(always)]
pub unsafe fn request_lines<B, const R: usize>(next: Option<[&[B]; R]>, i: usize) {
    let Some(next) = next else { return };
    let size = size_of::<B>();
    if size >= CACHE_LINE {
        for x in next {
            // SAFETY (get_unchecked): the kernels assert that the next rows are as long as
            // theirs, and i is below that.
            request_block(x.get_unchecked(i));
        }
    } else {
        for x in next {
            // SAFETY: as above; the offsets stay inside block i, and a prefetch never faults.
            let p = x.as_ptr().add(i).cast::<i8>();
            if i == 0 {
                _mm_prefetch(p, _MM_HINT_T1);
            }
            _mm_prefetch(p.add(size - 1), _MM_HINT_T1);
        }
    }
}

/// Horizontal sum of eight f32 lanes.
#[inline(always)]
pub unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Sum of eight i32 lanes (exact: integer order does not matter).
#[inline(always)]
pub unsafe fn hsum_i32(v: __m256i) -> i32 {
    hsum_i32_128(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256(v, 1),
    ))
}

/// Sum of four i32 lanes.
#[inline(always)]
pub unsafe fn hsum_i32_128(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
}

/// The four sums of eight i32 lanes each, `[Σv0, Σv1, Σv2, Σv3]`.
#[inline(always)]
pub unsafe fn hsum_i32_x4(v: [__m256i; 4]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

#[inline(always)]
pub unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline(always)]
pub unsafe fn load128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// The f16 bits of `R` (≤ 8) blocks' scales as i16 lanes 0..R (the rest 0), for `cvtph`. Packed
/// four to a 64-bit word in general-purpose registers, which are idle in the kernels:
/// `_mm_setr_epi16` from separate addresses is a `vpinsrw` and an unpack per value on the
/// vector shuffle pipe, which the nibble lookups and horizontal adds keep busy.
#[inline(always)]
pub unsafe fn f16_lanes<const R: usize>(h: [[u8; 2]; R]) -> __m128i {
    const { assert!(R <= 8, "f16_lanes: up to eight values") };
    let word = |h: &[[u8; 2]]| {
        h.iter()
            .rev()
            .fold(0u64, |w, h| (w << 16) | u16::from_le_bytes(*h) as u64)
    };
    let (lo, hi) = h.split_at(R.min(4));
    _mm_set_epi64x(word(hi) as i64, word(lo) as i64)
}

/// Sixteen i16 sums of adjacent products of signed bytes `w` and `a`.
#[inline(always)]
pub unsafe fn mul_i8_pairs(w: __m256i, a: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
}

/// Eight i32 sums of four products each of signed bytes `w` and `a`.
#[inline(always)]
pub unsafe fn dot_i8_quads(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(mul_i8_pairs(w, a), _mm256_set1_epi16(1))
}

/// `acc` plus, in each i32 lane, the four products of the lane's unsigned bytes `u` and signed
/// bytes `s`. With VNNI one `vpdpbusd`; otherwise `maddubs`, `madd` and an add, whose i16 pair
/// sums saturate: callers keep `|u₀s₀ + u₁s₁| ≤ 32767` for every pair, so that both give the
/// same exact sums (and hence bit-identical results).
#[inline(always)]
pub unsafe fn dpbusd<I: Isa>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if I::VNNI {
        let mut acc = acc;
        // SAFETY: `I::VNNI` is chosen only where the CPU has AVX512-VNNI and AVX512VL
        // (`isa::select` refuses otherwise); the instruction reads registers only.
        std::arch::asm!(
            "vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
    }
}

/// `acc` plus, in each i32 lane, the two products of the lane's i16 pairs of `a` and `b`: with
/// VNNI one `vpdpwssd`, otherwise `madd` and an add (the same exact sums; no saturation either
/// way, wrapping only where both pairs are -32768·-32768).
#[inline(always)]
pub unsafe fn dpwssd<I: Isa>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    if I::VNNI {
        let mut acc = acc;
        // SAFETY: as in `dpbusd`.
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(ymm_reg) acc,
            a = in(ymm_reg) a,
            b = in(ymm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
}

/// `(a & mask) | b`: with VNNI (which comes with AVX512VL here) one `vpternlogd`, otherwise an
/// `and` and an `or`. Unpacking a quant from a low part and a high part is this per 32 values
/// (eight per super-block in Q6_K's decode kernel), so one instruction fewer there is worth it
/// from L2 and from memory alike.
#[inline(always)]
pub unsafe fn and_or<I: Isa>(a: __m256i, mask: __m256i, b: __m256i) -> __m256i {
    if I::VNNI {
        let mut a = a;
        // SAFETY: as in `dpbusd` (AVX512VL); the instruction reads registers only. 0xEA is the
        // truth table of `(a & mask) | b` with the operands in this order.
        std::arch::asm!(
            "vpternlogd {a}, {mask}, {b}, 0xEA",
            a = inout(ymm_reg) a,
            mask = in(ymm_reg) mask,
            b = in(ymm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
        a
    } else {
        _mm256_or_si256(_mm256_and_si256(a, mask), b)
    }
}

/// [`dpbusd`] with the signed operand read from memory: under VNNI one `vpdpbusd` with the load
/// folded (the shared primitive takes registers only, which costs a separate load per row).
#[inline(always)]
pub unsafe fn dpbusd_mem<I: Isa>(acc: __m256i, u: __m256i, s: *const i8) -> __m256i {
    if I::VNNI {
        let mut acc = acc;
        // SAFETY: `I::VNNI` is chosen only where the CPU has AVX512-VNNI and AVX512VL; the
        // caller gives 32 readable bytes at `s`.
        std::arch::asm!(
            "vpdpbusd {acc}, {u}, ymmword ptr [{s}]",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(reg) s,
            options(pure, readonly, nostack, preserves_flags),
        );
        acc
    } else {
        dpbusd::<I>(acc, u, _mm256_loadu_si256(s.cast()))
    }
}

/// [`dpbusd`] with the signed operand four bytes at `s` repeated in every lane: under VNNI one
/// `vpdpbusd` with an embedded broadcast (`{1to8}`: the load and the broadcast fold into the
/// instruction); otherwise a broadcast load and `dpbusd`.
#[inline(always)]
pub unsafe fn dpbusd_broadcast<I: Isa>(acc: __m256i, u: __m256i, s: *const i8) -> __m256i {
    if I::VNNI {
        let mut acc = acc;
        // SAFETY: as in `dpbusd_mem`; the caller gives 4 readable bytes at `s`.
        std::arch::asm!(
            "vpdpbusd {acc}, {u}, dword ptr [{s}]{{1to8}}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(reg) s,
            options(pure, readonly, nostack, preserves_flags),
        );
        acc
    } else {
        dpbusd::<I>(acc, u, _mm256_set1_epi32(s.cast::<i32>().read_unaligned()))
    }
}

/// [`dpwssd`] with the second operand (16 i16) read from memory, as [`dpbusd_mem`].
#[inline(always)]
pub unsafe fn dpwssd_mem<I: Isa>(acc: __m256i, a: __m256i, b: *const i16) -> __m256i {
    if I::VNNI {
        let mut acc = acc;
        // SAFETY: as in `dpbusd_mem`; the caller gives 32 readable bytes at `b`.
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, ymmword ptr [{b}]",
            acc = inout(ymm_reg) acc,
            a = in(ymm_reg) a,
            b = in(reg) b,
            options(pure, readonly, nostack, preserves_flags),
        );
        acc
    } else {
        dpwssd::<I>(acc, a, _mm256_loadu_si256(b.cast()))
    }
}

/// [`dot_i8_quads`] on the instruction set `I`: with VNNI one `vpdpbusd` of the operands
/// `maddubs` takes there (`|w|` and `a` with `w`'s sign), whose pair sums never saturate
/// (at most 2·128·127), so the lanes are the same integers.
#[inline(always)]
pub unsafe fn signed_quads<I: Isa>(w: __m256i, a: __m256i) -> __m256i {
    if I::VNNI {
        let (u, s) = (_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
        dpbusd::<I>(_mm256_setzero_si256(), u, s)
    } else {
        dot_i8_quads(w, a)
    }
}

/// Low nibbles of 16 bytes in lanes 0..16, high nibbles in lanes 16..32 (the Q4_0 family order).
#[inline(always)]
pub unsafe fn nibbles_32(qs: *const u8) -> __m256i {
    let q = load128(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte i where bit i of `bits` is set, 0 elsewhere.
#[inline(always)]
pub unsafe fn bytes_from_bits_32(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    // Byte i of each group of eight gets every bit but bit i set, so it is all-ones iff bit i was.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}

/// The 16-entry grid of IQ4_NL and IQ4_XS in both 128-bit halves, for `_mm256_shuffle_epi8`.
#[inline(always)]
pub unsafe fn iq4nl_grid() -> __m256i {
    _mm256_broadcastsi128_si256(load128(super::blocks::KVALUES_IQ4NL.as_ptr().cast()))
}

/// `acc + sumi·(d_w·d_a)` with one rounding, as the repacked kernels' `_mm256_fmadd_ps(cvt(iacc),
/// mul(col_scale, row_scale), acc)` does per lane.
#[inline(always)]
pub fn fma_scaled(sumi: i32, d_w: f32, d_a: f32, acc: f32) -> f32 {
    (sumi as f32).mul_add(d_w * d_a, acc)
}

/// [`fma_scaled`] for four activation rows, one per lane.
#[inline(always)]
pub unsafe fn fma_scaled_x4(sumi: __m128i, d_w: f32, d_a: [f32; 4], acc: __m128) -> __m128 {
    let d = _mm_mul_ps(_mm_set1_ps(d_w), _mm_loadu_ps(d_a.as_ptr()));
    _mm_fmadd_ps(_mm_cvtepi32_ps(sumi), d, acc)
}

/// The four f32 lanes of `v`.
#[inline(always)]
pub unsafe fn lanes(v: __m128) -> [f32; 4] {
    let mut out = [0.0; 4];
    _mm_storeu_ps(out.as_mut_ptr(), v);
    out
}
