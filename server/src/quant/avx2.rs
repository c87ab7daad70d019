//! AVX2/FMA/F16C dot-product kernels (compiled in when the target has them; the workspace builds
//! for x86-64-v3). Same integer arithmetic as [`super::reference`]; tricks follow
//! ggml/src/ggml-cpu/arch/x86/quants.c (ggml-org/ggml d99724f):
//! - `_mm256_maddubs_epi16` needs an unsigned operand, so signed×signed products are taken as
//!   `|w| × (a with w's sign)`; `_mm256_madd_epi16` then widens pairs to i32 (or applies a scale).
//! - One float FMA per block (32 values) or super-block (256 values), into independent
//!   accumulators so consecutive blocks do not wait on each other's FMA latency.
//! - K-quant mins and offsets are taken from the activation's `bsums`, never from the quants.
//!
//! Rows need no alignment: every load is unaligned.

use std::arch::x86_64::*;

use super::blocks::*;
use super::DotOrder;

/// Horizontal sum of eight f32 lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Sum of eight i32 lanes (exact: integer order does not matter).
#[inline(always)]
pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
    hsum_i32_128(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256(v, 1),
    ))
}

/// Sum of four i32 lanes.
#[inline(always)]
pub(super) unsafe fn hsum_i32_128(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
}

#[inline(always)]
pub(super) unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline(always)]
pub(super) unsafe fn load128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// Sixteen i16 sums of adjacent products of signed bytes `w` and `a`.
#[inline(always)]
unsafe fn mul_i8_pairs(w: __m256i, a: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
}

/// Eight i32 sums of four products each of signed bytes `w` and `a`.
#[inline(always)]
pub(super) unsafe fn dot_i8_quads(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(mul_i8_pairs(w, a), _mm256_set1_epi16(1))
}

/// Low nibbles of 16 bytes in lanes 0..16, high nibbles in lanes 16..32 (the Q4_0 family order).
#[inline(always)]
unsafe fn nibbles_32(qs: *const u8) -> __m256i {
    let q = load128(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte i where bit i of `bits` is set, 0 elsewhere.
#[inline(always)]
unsafe fn bytes_from_bits_32(bits: u32) -> __m256i {
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

/// A 32-value block whose quants unpack to signed bytes, dotted against Q8_0.
pub(super) trait SignedBlock32: Block {
    fn d(&self) -> [u8; 2];
    /// The 32 quants as signed bytes, in element order.
    unsafe fn quants(&self) -> __m256i;
}

impl SignedBlock32 for BlockQ8_0 {
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn quants(&self) -> __m256i {
        load256(self.qs.as_ptr().cast())
    }
}

impl SignedBlock32 for BlockQ4_0 {
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn quants(&self) -> __m256i {
        _mm256_sub_epi8(nibbles_32(self.qs.as_ptr()), _mm256_set1_epi8(8))
    }
}

impl SignedBlock32 for BlockQ5_0 {
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn quants(&self) -> __m256i {
        // q - 16 = nibble - 16 when the fifth bit is clear: OR-ing 0xF0 into the nibble gives
        // exactly that as a signed byte, and leaves it alone when the bit is set.
        let clear = _mm256_andnot_si256(
            bytes_from_bits_32(u32::from_le_bytes(self.qh)),
            _mm256_set1_epi8(0xF0u8 as i8),
        );
        _mm256_or_si256(nibbles_32(self.qs.as_ptr()), clear)
    }
}

impl SignedBlock32 for BlockIq4Nl {
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn quants(&self) -> __m256i {
        let grid = _mm256_broadcastsi128_si256(load128(KVALUES_IQ4NL.as_ptr().cast()));
        _mm256_shuffle_epi8(grid, nibbles_32(self.qs.as_ptr()))
    }
}

/// `acc + d_w*d_a*(w·a)` for one 32-value block.
#[inline(always)]
unsafe fn fma_block32<B: SignedBlock32>(w: &B, a: &BlockQ8_0, acc: __m256) -> __m256 {
    let sumi = dot_i8_quads(w.quants(), load256(a.qs.as_ptr().cast()));
    let d = _mm256_set1_ps(f16_to_f32(w.d()) * f16_to_f32(a.d));
    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc)
}

/// Dot product of 32-value weight blocks with Q8_0 activations: one FMA chain over the blocks,
/// then the horizontal sum, exactly as ggml's AVX2 `vec_dot_q{8,4,5}_0_q8_0`. The order is not
/// a detail: the sum's last bit moves the next layer's Q8_0 rounding, and quantised Gemma
/// models amplify such flips into logit errors of tenths. One chain still outruns memory
/// (a 34-byte block per 4-cycle FMA latency).
#[inline(always)]
unsafe fn dot_block32<B: SignedBlock32>(w: &[B], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, a) in w.iter().zip(a) {
        acc = fma_block32(w, a, acc);
    }
    hsum(acc)
}

/// [`dot_block32`] of one weight row against four activation rows at once (prompt
/// processing): each weight block is unpacked once and feeds four FMA chains, one per output,
/// so every output sums in exactly the single-row order.
#[inline(always)]
unsafe fn dot_block32_x4<B: SignedBlock32>(w: &[B], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for (b, wb) in w.iter().enumerate() {
        let wq = wb.quants();
        let dw = f16_to_f32(wb.d());
        for k in 0..4 {
            let ab = &a[k][b];
            let sumi = dot_i8_quads(wq, load256(ab.qs.as_ptr().cast()));
            let d = _mm256_set1_ps(dw * f16_to_f32(ab.d));
            acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[k]);
        }
    }
    acc.map(|v| hsum(v))
}

pub fn q8_0_q8_0_x4(w: &[BlockQ8_0], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: as in `q8_0_q8_0`; every activation row holds as many blocks as `w` (checked by
    // the caller).
    unsafe { dot_block32_x4(w, a) }
}

pub fn q4_0_q8_0_x4(w: &[BlockQ4_0], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: as in `q8_0_q8_0_x4`.
    unsafe { dot_block32_x4(w, a) }
}

pub fn q5_0_q8_0_x4(w: &[BlockQ5_0], a: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: as in `q8_0_q8_0_x4`.
    unsafe { dot_block32_x4(w, a) }
}

/// As [`dot_block32`] but with ggml's two chains for IQ4_NL (even and odd blocks), summed
/// before the horizontal add; an odd last block is added after it.
#[inline(always)]
unsafe fn dot_block32_pairs<B: SignedBlock32>(w: &[B], a: &[BlockQ8_0]) -> f32 {
    let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (w2, a2) = (w.chunks_exact(2), a.chunks_exact(2));
    let (w_rest, a_rest) = (w2.remainder(), a2.remainder());
    for (w, a) in w2.zip(a2) {
        acc1 = fma_block32(&w[0], &a[0], acc1);
        acc2 = fma_block32(&w[1], &a[1], acc2);
    }
    let mut sum = hsum(_mm256_add_ps(acc1, acc2));
    for (w, a) in w_rest.iter().zip(a_rest) {
        sum += hsum(fma_block32(w, a, _mm256_setzero_ps()));
    }
    sum
}

pub fn q8_0_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    // SAFETY: the target has AVX2/FMA/F16C (this module is compiled only then); loads stay
    // inside the blocks borrowed from `w` and `a`.
    unsafe { dot_block32(w, a) }
}

pub fn q4_0_q8_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `q8_0_q8_0`.
    unsafe { dot_block32(w, a) }
}

pub fn q5_0_q8_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `q8_0_q8_0`.
    unsafe { dot_block32(w, a) }
}

pub fn iq4_nl_q8_0(w: &[BlockIq4Nl], a: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `q8_0_q8_0`.
    unsafe { dot_block32_pairs(w, a) }
}

/// Shuffle mask that broadcasts i16 lane `k` of each 128-bit half.
#[inline(always)]
unsafe fn broadcast_i16_mask(k: i16) -> __m256i {
    _mm256_set1_epi16(((2 * k + 1) << 8) | (2 * k))
}

/// `Σ_s scale_s · (q·a)_s` over a super-block whose quants are unsigned bytes < 64, for Q4_K and
/// Q5_K: `chunk(c)` gives the 64 quants of chunk c as (values 0..32, values 32..64).
#[inline(always)]
pub(super) unsafe fn k4_scaled_sum(
    scales: __m256i,
    a: &BlockQ8K,
    chunk: impl Fn(usize) -> (__m256i, __m256i),
) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for c in 0..4 {
        sumi = _mm256_add_epi32(sumi, k4_chunk_sum(scales, a, c, chunk(c)));
    }
    sumi
}

/// `scale_2c·(q·a)_2c + scale_2c+1·(q·a)_2c+1` as eight i32 partial sums: chunk c (64 values)
/// of a super-block whose quants are unsigned bytes < 64, given as (values 0..32, 32..64), with
/// `scales` as in [`k4_scaled_sum`].
#[inline(always)]
pub(super) unsafe fn k4_chunk_sum(
    scales: __m256i,
    a: &BlockQ8K,
    c: usize,
    (lo, hi): (__m256i, __m256i),
) -> __m256i {
    let a_lo = load256(a.qs.as_ptr().add(64 * c).cast());
    let a_hi = load256(a.qs.as_ptr().add(64 * c + 32).cast());
    let sc_lo = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * c as i16));
    let sc_hi = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * c as i16 + 1));
    let p_lo = _mm256_madd_epi16(sc_lo, _mm256_maddubs_epi16(lo, a_lo));
    let p_hi = _mm256_madd_epi16(sc_hi, _mm256_maddubs_epi16(hi, a_hi));
    _mm256_add_epi32(p_lo, p_hi)
}

/// How a Q4_K/Q5_K super-block's min term, `-dmin·d_a·Σ min_s·(bsum_2s + bsum_2s+1)`, is summed.
/// ggml's AVX2 kernels differ here, and the last bit of the result depends on it.
trait MinTerm {
    unsafe fn zero() -> Self;
    /// Adds one super-block's term: `neg_dmin` = -dmin·d_a, `mins` = the four i32 lanes of
    /// `min_s·(bsum_2s + bsum_2s+1)` summed pairwise.
    unsafe fn add(&mut self, neg_dmin: f32, mins: __m128i);
    unsafe fn total(&self) -> f32;
}

/// Q4_K: one FMA per super-block into four float lanes, summed at the end.
struct LaneMins(__m128);

impl MinTerm for LaneMins {
    #[inline(always)]
    unsafe fn zero() -> Self {
        LaneMins(_mm_setzero_ps())
    }

    #[inline(always)]
    unsafe fn add(&mut self, neg_dmin: f32, mins: __m128i) {
        self.0 = _mm_fmadd_ps(_mm_set1_ps(neg_dmin), _mm_cvtepi32_ps(mins), self.0);
    }

    #[inline(always)]
    unsafe fn total(&self) -> f32 {
        let m = _mm_add_ps(self.0, _mm_movehl_ps(self.0, self.0));
        _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
    }
}

/// Q5_K: the lanes are summed in integers first, then one scalar FMA per super-block (what
/// `summs += dmin * hsum` compiles to in ggml's x86-64-v3 build).
struct ScalarMins(f32);

impl MinTerm for ScalarMins {
    #[inline(always)]
    unsafe fn zero() -> Self {
        ScalarMins(0.0)
    }

    #[inline(always)]
    unsafe fn add(&mut self, neg_dmin: f32, mins: __m128i) {
        self.0 = neg_dmin.mul_add(hsum_i32_128(mins) as f32, self.0);
    }

    #[inline(always)]
    unsafe fn total(&self) -> f32 {
        self.0
    }
}

/// A Q4_K/Q5_K super-block's integer parts: `Σ_s scale_s·(q·a)_s` in ggml's eight vec_dot lanes
/// and `min_s·(bsum_2s + bsum_2s+1)` summed pairwise into four lanes.
#[inline(always)]
unsafe fn k4_parts(
    packed: &[u8; 12],
    y: &BlockQ8K,
    chunk: impl Fn(usize) -> (__m256i, __m256i),
) -> (__m256i, __m128i) {
    let sm = scales_mins_k4(packed);
    // Lanes 0..8: scales, 8..16: mins, as i16.
    let scales_mins = _mm256_cvtepu8_epi16(load128(sm.as_ptr()));
    let bsums = load256(y.bsums.as_ptr());
    let bsums32 = _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256(bsums, 1),
    );
    let mins = _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), bsums32);
    let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(scales_mins));
    (k4_scaled_sum(scales, y, chunk), mins)
}

/// Q4_K/Q5_K in ggml's vec_dot order: per super-block, the scale part is `d·d_a·sumi` (one FMA
/// into eight lanes) and the min part goes to `M`; the result is `hsum(scale lanes) + min total`.
#[inline(always)]
unsafe fn dot_k4<B: Block, M: MinTerm>(
    w: &[B],
    a: &[BlockQ8K],
    fields: impl Fn(&B) -> ([u8; 2], [u8; 2], &[u8; 12]),
    chunk: impl Fn(&B, usize) -> (__m256i, __m256i),
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut min_term = M::zero();
    for (b, y) in w.iter().zip(a) {
        let (d, dmin, packed) = fields(b);
        let (sumi, mins) = k4_parts(packed, y, |c| chunk(b, c));
        min_term.add(-y.d() * f16_to_f32(dmin), mins);
        let d = _mm256_set1_ps(y.d() * f16_to_f32(d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) + min_term.total()
}

/// Q4_K/Q5_K in ggml's tiled order (see [`dot_tiled`]): the super-block's value before the
/// activation scale is `d·sumi - dmin·summ`, the subtraction fused.
#[inline(always)]
unsafe fn dot_k4_tiled<B: Block>(
    w: &[B],
    a: &[BlockQ8K],
    fields: impl Fn(&B) -> ([u8; 2], [u8; 2], &[u8; 12]),
    chunk: impl Fn(&B, usize) -> (__m256i, __m256i),
) -> f32 {
    dot_tiled(w, a, |b, y| {
        let (d, dmin, packed) = fields(b);
        let (sumi, mins) = k4_parts(packed, y, |c| chunk(b, c));
        let scaled = f16_to_f32(d) * hsum_i32(sumi) as f32;
        (-f16_to_f32(dmin)).mul_add(hsum_i32_128(mins) as f32, scaled)
    })
}

/// The float order of ggml's tiled K-quant matmul (ggml-cpu/tiled, which llama.cpp uses instead
/// of vec_dot when a matmul has at least 8 activation rows): each super-block's integer total is
/// converted once and scaled by the weight's d (`block`), then one scalar FMA by the
/// activation's d adds it to the output, super-block after super-block.
#[inline(always)]
unsafe fn dot_tiled<B>(w: &[B], a: &[BlockQ8K], block: impl Fn(&B, &BlockQ8K) -> f32) -> f32 {
    let mut acc = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        acc = block(b, y).mul_add(y.d(), acc);
    }
    acc
}

/// Mins-free K-quants (Q6_K, IQ4_XS) in ggml's vec_dot order: one FMA of the super-block's eight
/// integer lanes by `d_w·d_a`, then the horizontal sum.
#[inline(always)]
unsafe fn dot_vec_lanes<B>(
    w: &[B],
    a: &[BlockQ8K],
    d: impl Fn(&B) -> [u8; 2],
    sumi: impl Fn(&B, &BlockQ8K) -> __m256i,
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(f16_to_f32(d(b)) * y.d());
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi(b, y)), acc);
    }
    hsum(acc)
}

/// Mins-free K-quants in either of llama.cpp's orders.
#[inline(always)]
unsafe fn dot_k<B>(
    w: &[B],
    a: &[BlockQ8K],
    order: DotOrder,
    d: impl Fn(&B) -> [u8; 2],
    sumi: impl Fn(&B, &BlockQ8K) -> __m256i,
) -> f32 {
    match order {
        DotOrder::Tiled => dot_tiled(w, a, |b, y| f16_to_f32(d(b)) * hsum_i32(sumi(b, y)) as f32),
        _ => dot_vec_lanes(w, a, d, sumi),
    }
}

pub fn q4_k_q8_k(w: &[BlockQ4K], a: &[BlockQ8K], order: DotOrder) -> f32 {
    fn fields(b: &BlockQ4K) -> ([u8; 2], [u8; 2], &[u8; 12]) {
        (b.d, b.dmin, &b.scales)
    }
    // SAFETY: as in `q8_0_q8_0`; chunk c reads qs[32c..32c+32] of a 128-byte array (c < 4).
    let chunk = |b: &BlockQ4K, c: usize| unsafe { q4_k_chunk(b, c) };
    // SAFETY: as in `q8_0_q8_0`.
    unsafe {
        match order {
            DotOrder::Tiled => dot_k4_tiled(w, a, fields, chunk),
            _ => dot_k4::<_, LaneMins>(w, a, fields, chunk),
        }
    }
}

/// The 64 quants of chunk c (< 4) of a Q4_K super-block as (values 0..32, values 32..64): the
/// low and the high nibbles of qs[32c..32c+32].
#[inline(always)]
pub(super) unsafe fn q4_k_chunk(b: &BlockQ4K, c: usize) -> (__m256i, __m256i) {
    let q = load256(b.qs.as_ptr().add(32 * c));
    let m4 = _mm256_set1_epi8(0x0F);
    (
        _mm256_and_si256(q, m4),
        _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
    )
}

pub fn q5_k_q8_k(w: &[BlockQ5K], a: &[BlockQ8K], order: DotOrder) -> f32 {
    fn fields(b: &BlockQ5K) -> ([u8; 2], [u8; 2], &[u8; 12]) {
        (b.d, b.dmin, &b.scales)
    }
    let chunk = |b: &BlockQ5K, c: usize| {
        // SAFETY: as in `q4_k_q8_k`; qh is 32 bytes.
        unsafe {
            let q = load256(b.qs.as_ptr().add(32 * c));
            let qh = load256(b.qh.as_ptr());
            let m4 = _mm256_set1_epi8(0x0F);
            let bit = _mm256_set1_epi8(1);
            // Bit 2c of qh[l] is value l's fifth bit, bit 2c+1 value 32+l's. Shifting 16-bit
            // lanes by < 8 keeps each byte's own bit 0 after the mask.
            let shift = _mm_cvtsi32_si128(2 * c as i32);
            let h_lo = _mm256_and_si256(_mm256_srl_epi16(qh, shift), bit);
            let shift = _mm_cvtsi32_si128(2 * c as i32 + 1);
            let h_hi = _mm256_and_si256(_mm256_srl_epi16(qh, shift), bit);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h_lo, 4));
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            (lo, _mm256_or_si256(hi, _mm256_slli_epi16(h_hi, 4)))
        }
    };
    // SAFETY: as in `q8_0_q8_0`.
    unsafe {
        match order {
            DotOrder::Tiled => dot_k4_tiled(w, a, fields, chunk),
            _ => dot_k4::<_, ScalarMins>(w, a, fields, chunk),
        }
    }
}

/// Shuffle mask giving bytes [2g; 8] ++ [2g+1; 8]: the two Q6_K scales of 32-value group g.
#[inline(always)]
unsafe fn q6_scale_pair_mask(g: usize) -> __m128i {
    let byte = |i: usize| (i as i64) * 0x0101_0101_0101_0101;
    _mm_set_epi64x(byte(2 * g + 1), byte(2 * g))
}

/// A Q6_K super-block's `Σ_s scale_s·((q-32)·a)_s` in ggml's eight vec_dot lanes.
#[inline(always)]
unsafe fn q6_k_sumi(b: &BlockQ6K, y: &BlockQ8K) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let scales = load128(b.scales.as_ptr().cast());
    // The quants are stored +32; remove 32·Σ scale_s·bsum_s once instead of per value.
    let offset = _mm256_madd_epi16(load256(y.bsums.as_ptr()), _mm256_cvtepi8_epi16(scales));
    let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
    for half in 0..2 {
        let ql0 = load256(b.ql.as_ptr().add(64 * half));
        let ql1 = load256(b.ql.as_ptr().add(64 * half + 32));
        let qh = load256(b.qh.as_ptr().add(32 * half));
        let high = |shift: i32| {
            let s = _mm_cvtsi32_si128(shift);
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s), m2), 4)
        };
        let quants = [
            _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
            _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)),
        ];
        for (g, q) in quants.into_iter().enumerate() {
            let group = 4 * half + g;
            let act = load256(y.qs.as_ptr().add(32 * group).cast());
            let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, q6_scale_pair_mask(group)));
            let p = _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, act));
            sumi = _mm256_add_epi32(sumi, p);
        }
    }
    sumi
}

pub fn q6_k_q8_k(w: &[BlockQ6K], a: &[BlockQ8K], order: DotOrder) -> f32 {
    // SAFETY: as in `q8_0_q8_0`; half h reads ql[64h..64h+64] and qh[32h..32h+32].
    unsafe { dot_k(w, a, order, |b| b.d, |b, y| q6_k_sumi(b, y)) }
}

/// An IQ4_XS super-block's `Σ_s (ls_s-32)·(v·a)_s` in ggml's eight vec_dot lanes (even and odd
/// sub-blocks in two accumulators, as ggml has them; integer, so only the lanes matter).
#[inline(always)]
unsafe fn iq4_xs_sumi(b: &BlockIq4Xs, y: &BlockQ8K) -> __m256i {
    let grid = _mm256_broadcastsi128_si256(load128(KVALUES_IQ4NL.as_ptr().cast()));
    let mut sumi = _mm256_setzero_si256();
    for s in 0..8 {
        let q = _mm256_shuffle_epi8(grid, nibbles_32(b.qs.as_ptr().add(16 * s)));
        let act = load256(y.qs.as_ptr().add(32 * s).cast());
        let scale = _mm256_set1_epi16(b.scale(s) as i16);
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(mul_i8_pairs(q, act), scale));
    }
    sumi
}

pub fn iq4_xs_q8_k(w: &[BlockIq4Xs], a: &[BlockQ8K], order: DotOrder) -> f32 {
    // SAFETY: as in `q8_0_q8_0`; sub-block s reads qs[16s..16s+16] (s < 8).
    unsafe { dot_k(w, a, order, |b| b.d, |b, y| iq4_xs_sumi(b, y)) }
}

/// Float dot product, 32 values per iteration into four accumulators; `load8` converts eight
/// elements at a byte pointer to f32 and `load1` one element (for the tail).
#[inline(always)]
unsafe fn dot_float(
    w: &[u8],
    a: &[u8],
    width: usize,
    load8: impl Fn(*const u8) -> __m256,
    load1: impl Fn(&[u8]) -> f32,
) -> f32 {
    let n = w.len().min(a.len()) / width;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let off = (i + 8 * k) * width;
            *acc = _mm256_fmadd_ps(load8(wp.add(off)), load8(ap.add(off)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load8(wp.add(i * width)), load8(ap.add(i * width)), acc[0]);
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        let r = j * width..(j + 1) * width;
        sum += load1(&w[r.clone()]) * load1(&a[r]);
    }
    sum
}

pub fn f32_f32(w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as in `q8_0_q8_0`; `dot_float` loads only whole elements inside both slices.
    unsafe {
        dot_float(
            w,
            a,
            4,
            |p| _mm256_loadu_ps(p.cast()),
            |x| f32::from_le_bytes(x.try_into().unwrap()),
        )
    }
}

pub fn f16_f16(w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as in `f32_f32`.
    unsafe {
        dot_float(
            w,
            a,
            2,
            |p| _mm256_cvtph_ps(load128(p)),
            |x| f16_to_f32([x[0], x[1]]),
        )
    }
}

pub fn bf16_bf16(w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as in `f32_f32`.
    unsafe {
        dot_float(
            w,
            a,
            2,
            // bf16 is the top half of an f32: widen to 32 bits and shift into place.
            |p| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16)),
            |x| bf16_to_f32([x[0], x[1]]),
        )
    }
}
