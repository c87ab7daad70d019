//! llama.cpp's float orders for K-quant super-blocks (256 values) against Q8_K: a format says how
//! its super-block's integer parts come out ([`K4Block`] for the Q4_K/Q5_K layout with scales
//! and mins, [`ScaledBlock`] for the mins-free Q6_K, Q3_K and IQ4_XS); these sum them in the
//! vec_dot or the tiled order. The 16-value sub-blocks of Q2_K and Q3_K share [`Sub16Scales`].

use std::arch::x86_64::*;

use super::{dpwssd, hsum, hsum_i32, hsum_i32_128, load256, request_block, unrolled};
use crate::quant::blocks::{blocks, f16_to_f32, Block};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::isa::Isa;
use crate::quant::DotOrder;

/// A Q4_K/Q5_K-layout super-block: f16 `d` and `dmin`, twelve packed 6-bit scales and mins
/// (see [`scales_mins_k4`](crate::quant::blocks::scales_mins_k4)), quants that unpack to
/// unsigned bytes < 64.
pub trait K4Block {
    fn d(&self) -> [u8; 2];
    fn dmin(&self) -> [u8; 2];
    fn scales(&self) -> &[u8; 12];
    /// The 64 quants of chunk c (< 4) as (values 0..32, values 32..64).
    unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i);
}

/// A mins-free K-quant super-block (Q6_K, IQ4_XS): f16 `d` and the integer sum
/// `Σ_s scale_s·(q·a)_s` in ggml's eight vec_dot lanes.
pub trait ScaledBlock {
    fn d(&self) -> [u8; 2];
    unsafe fn sumi(&self, a: &BlockQ8K) -> __m256i;
}

/// Shuffle mask that broadcasts i16 lane `k` of each 128-bit half.
#[inline(always)]
pub unsafe fn broadcast_i16_mask(k: i16) -> __m256i {
    _mm256_set1_epi16(((2 * k + 1) << 8) | (2 * k))
}

/// Shuffle mask that broadcasts i16 lane `2p` over the low 128-bit half and lane `2p + 1` over
/// the high one (`p` < 4): the scales of two consecutive sub-blocks, one per half.
#[inline(always)]
pub unsafe fn broadcast_i16_pair_mask(p: usize) -> __m256i {
    let half = |k: usize| _mm256_castsi256_si128(broadcast_i16_mask(k as i16));
    _mm256_set_m128i(half(2 * p + 1), half(2 * p))
}

/// The sums of the eight i32 lanes of each of `N` (4 or 8) vectors: lane k is Σ v[k] (for
/// `N` = 4, lanes 4..8 repeat lanes 0..4).
#[inline(always)]
pub unsafe fn hsum_i32_rows<const N: usize>(v: [__m256i; N]) -> __m256i {
    let quad = |q: usize| {
        let (a, b) = (_mm256_hadd_epi32(v[q], v[q + 1]), _mm256_hadd_epi32(v[q + 2], v[q + 3]));
        // Lane k: the low half's sum of v[q + k]; lane 4 + k: the high half's.
        _mm256_hadd_epi32(a, b)
    };
    let h0 = quad(0);
    let h1 = if N == 8 { quad(4) } else { h0 };
    _mm256_add_epi32(
        _mm256_permute2x128_si256(h0, h1, 0x20),
        _mm256_permute2x128_si256(h0, h1, 0x31),
    )
}

/// The eight f32 lanes of `v`.
#[inline(always)]
pub unsafe fn lanes8(v: __m256) -> [f32; 8] {
    let mut out = [0.0; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), v);
    out
}

/// A [`K4Block`] super-block's 256 quants, as its four [`K4Block::chunk`]s.
#[inline(always)]
pub unsafe fn k4_chunks(b: &impl K4Block) -> [(__m256i, __m256i); 4] {
    [b.chunk(0), b.chunk(1), b.chunk(2), b.chunk(3)]
}

/// `Σ_s scale_s · (q·a)_s` over a [`K4Block`] super-block whose quants [`k4_chunks`] unpacked,
/// `scales` holding the eight scales as i16 in both 128-bit halves.
#[inline(always)]
pub unsafe fn k4_scaled_sum_of<I: Isa>(
    scales: __m256i,
    a: &BlockQ8K,
    chunks: &[(__m256i, __m256i); 4],
) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    unrolled::<4>(|c| sumi = k4_chunk_step::<I>(sumi, scales, a, c, chunks[c]));
    sumi
}

/// [`k4_scaled_sum_of`] for `R` super-blocks against one activation super-block, chunk by
/// chunk across the blocks: the `R` chains interleave, so each one's `vpdpwssd` latency hides
/// behind the others' work instead of leaving the scheduler to find it across a whole block's
/// instructions; each chunk's activations are loaded once. Integer sums, so every lane is what
/// [`k4_scaled_sum_of`] gives its block.
#[inline(always)]
pub unsafe fn k4_scaled_sums_x<I: Isa, B: K4Block, const R: usize>(
    scales: [__m256i; R],
    a: &BlockQ8K,
    b: [&B; R],
) -> [__m256i; R] {
    let mut sums = [_mm256_setzero_si256(); R];
    unrolled::<4>(|c| {
        for r in 0..R {
            sums[r] = k4_chunk_step::<I>(sums[r], scales[r], a, c, b[r].chunk(c));
        }
    });
    sums
}

/// A [`K4Block`] super-block's scales and mins, unpacked once: the eight 6-bit scales as i16 in
/// both 128-bit halves (the layout [`k4_scaled_sum_of`] takes), and the eight mins as i16.
#[inline(always)]
pub unsafe fn k4_scales_mins(b: &impl K4Block) -> (__m256i, __m128i) {
    let sm = _mm256_cvtepu8_epi16(scales_mins_k4_x86(b.scales()));
    let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    (scales, _mm256_extracti128_si256(sm, 1))
}

/// [`scales_mins_k4`](crate::quant::blocks::scales_mins_k4) in one register (eight scales,
/// then eight mins), by byte shuffles and masks: it runs per row and super-block in Q4_K/Q5_K
/// decode, where the scalar unpacking's shifts, inserts and round trip through the stack cost
/// as much as a chunk's products.
#[inline(always)]
pub unsafe fn scales_mins_k4_x86(packed: &[u8; 12]) -> __m128i {
    // Bytes 0..12 of `packed`, four zeros.
    let word2 = i32::from_le_bytes([packed[8], packed[9], packed[10], packed[11]]);
    let x = _mm_insert_epi32(_mm_loadl_epi64(packed.as_ptr().cast()), word2, 2);
    // Lanes: scales 0..4 from bytes 0..4, scales 4..8 from 8..12 (low nibbles), mins 0..4 from
    // 4..8, mins 4..8 from 8..12 (high nibbles).
    let a = _mm_shuffle_epi8(x, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    // The top two bits of scales 4..8 and mins 4..8 are those of bytes 0..4 and 4..8.
    let b = _mm_shuffle_epi8(x, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    let low = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    let high_nibbles = _mm_and_si128(
        _mm_srli_epi16(a, 4),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15),
    );
    // Bits 6..8 of each byte to bits 4..6 (the 16-bit shift's bits from the byte above are
    // masked off).
    let top = _mm_and_si128(
        _mm_srli_epi16(b, 2),
        _mm_setr_epi8(0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30),
    );
    _mm_or_si128(_mm_or_si128(low, high_nibbles), top)
}

/// `min_2c·bsum_2c + min_2c+1·bsum_2c+1` for the four 64-value chunks c, where bsum_s is the
/// activation sum over sub-block s: the integers the kernels scale by dmin.
#[inline(always)]
pub unsafe fn k4_chunk_min_sums(mins: __m128i, a: &BlockQ8K) -> __m128i {
    _mm_madd_epi16(mins, k4_sub_sums(a))
}

/// The activation's sums over its eight 32-value sub-blocks, as i16 (the pairs of its 16-value
/// `bsums` added): what [`k4_chunk_min_sums`] multiplies the mins by.
#[inline(always)]
pub unsafe fn k4_sub_sums(a: &BlockQ8K) -> __m128i {
    let bsums = load256(a.bsums.as_ptr());
    _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256(bsums, 1),
    )
}

/// `scale_2c·(q·a)_2c + scale_2c+1·(q·a)_2c+1` as eight i32 partial sums: chunk c (64 values)
/// given as (values 0..32, 32..64), with `scales` as in [`k4_scaled_sum_of`].
///
/// The quants are < 32 (unsigned) and the activations in -128..=127, so each `maddubs` pair
/// stays within ±7936 (no saturation) and `vpdpwssd` sums exactly what `madd`+`add` do.
#[inline(always)]
pub unsafe fn k4_chunk_sum<I: Isa>(
    scales: __m256i,
    a: &BlockQ8K,
    c: usize,
    (lo, hi): (__m256i, __m256i),
) -> __m256i {
    let (sc_lo, sc_hi, m_lo, m_hi) = k4_chunk_products(scales, a, c, (lo, hi));
    // Avx2: `add(madd(sc_lo, m_lo), madd(sc_hi, m_hi))`, as before VNNI.
    dpwssd::<I>(_mm256_madd_epi16(sc_lo, m_lo), sc_hi, m_hi)
}

/// `acc` + [`k4_chunk_sum`] as the kernels of `I` add a chunk to a block's sum: with VNNI one
/// chain of two `vpdpwssd`s (each the scale's madd and the add in one), otherwise `madd`s and an
/// add (the Avx2 kernels keep their own association of the adds). The same exact lane sums, in
/// another (integer, so immaterial) order.
#[inline(always)]
unsafe fn k4_chunk_step<I: Isa>(
    acc: __m256i,
    scales: __m256i,
    a: &BlockQ8K,
    c: usize,
    chunk: (__m256i, __m256i),
) -> __m256i {
    if I::VNNI {
        let (sc_lo, sc_hi, m_lo, m_hi) = k4_chunk_products(scales, a, c, chunk);
        dpwssd::<I>(dpwssd::<I>(acc, sc_lo, m_lo), sc_hi, m_hi)
    } else {
        _mm256_add_epi32(acc, k4_chunk_sum::<I>(scales, a, c, chunk))
    }
}

/// Chunk c's two sub-block scales (broadcast as i16) and its quant·activation pair sums (i16).
#[inline(always)]
unsafe fn k4_chunk_products(
    scales: __m256i,
    a: &BlockQ8K,
    c: usize,
    (lo, hi): (__m256i, __m256i),
) -> (__m256i, __m256i, __m256i, __m256i) {
    let a_lo = load256(a.qs.as_ptr().add(64 * c).cast());
    let a_hi = load256(a.qs.as_ptr().add(64 * c + 32).cast());
    let sc_lo = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * c as i16));
    let sc_hi = _mm256_shuffle_epi8(scales, broadcast_i16_mask(2 * c as i16 + 1));
    let m_lo = _mm256_maddubs_epi16(lo, a_lo);
    let m_hi = _mm256_maddubs_epi16(hi, a_hi);
    (sc_lo, sc_hi, m_lo, m_hi)
}

/// How a Q4_K/Q5_K super-block's min term, `-dmin·d_a·Σ min_s·(bsum_2s + bsum_2s+1)`, is summed.
/// ggml's AVX2 kernels differ here, and the last bit of the result depends on it.
pub trait MinTerm {
    unsafe fn zero() -> Self;
    /// Adds one super-block's term: `neg_dmin` = -dmin·d_a, `mins` = the four i32 lanes of
    /// `min_s·(bsum_2s + bsum_2s+1)` summed pairwise.
    unsafe fn add(&mut self, neg_dmin: f32, mins: __m128i);
    unsafe fn total(&self) -> f32;
}

/// Q4_K: one FMA per super-block into four float lanes, summed at the end.
pub struct LaneMins(__m128);

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
pub struct ScalarMins(f32);

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

/// Q4_K/Q5_K in either of llama.cpp's non-repacked orders, the min term summed as `M` in the
/// vec_dot order.
#[inline(always)]
pub unsafe fn k4_dot<I: Isa, B: K4Block, M: MinTerm>(
    w: &[B],
    a: &[BlockQ8K],
    order: DotOrder,
) -> f32 {
    let [out] = k4_dot_n::<I, B, M, 1>(w, [a], order);
    out
}

/// [`k4_dot`] against `N` activation rows, each super-block's scales, mins and quants unpacked
/// once; every output sees the single-row operations.
#[inline(always)]
pub unsafe fn k4_dot_n<I: Isa, B: K4Block, M: MinTerm, const N: usize>(
    w: &[B],
    a: [&[BlockQ8K]; N],
    order: DotOrder,
) -> [f32; N] {
    match order {
        DotOrder::Tiled => k4_tiled_n::<I, B, N>(w, a),
        _ => k4_vec_dot_n::<I, B, M, N>(w, a),
    }
}

/// Q4_K/Q5_K in ggml's vec_dot order: per super-block, the scale part is `d·d_a·sumi` (one FMA
/// into eight lanes) and the min part goes to `M`; the result is `hsum(scale lanes) + min total`.
/// One chain of each per activation row.
#[inline(always)]
unsafe fn k4_vec_dot_n<I: Isa, B: K4Block, M: MinTerm, const N: usize>(
    w: &[B],
    a: [&[BlockQ8K]; N],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut min_term: [M; N] = std::array::from_fn(|_| M::zero());
    for (i, b) in w.iter().enumerate() {
        let (scales, mins) = k4_scales_mins(b);
        let chunks = k4_chunks(b);
        let (d_w, dmin_w) = (f16_to_f32(b.d()), f16_to_f32(b.dmin()));
        for t in 0..N {
            let y = &a[t][i];
            let sumi = k4_scaled_sum_of::<I>(scales, y, &chunks);
            min_term[t].add(-y.d() * dmin_w, k4_chunk_min_sums(mins, y));
            let d = _mm256_set1_ps(y.d() * d_w);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    std::array::from_fn(|t| hsum(acc[t]) + min_term[t].total())
}

/// [`k4_vec_dot_n`] of four weight rows against one activation row (decode's mat-vec): each
/// row's chains as its own, but the activation's loads and sub-block sums are taken once per
/// super-block for the four, and the four rows' integer sums interleave chunk by chunk
/// ([`k4_scaled_sums_x`]), so one row's `madd` latency hides behind the others' products.
#[inline(always)]
pub unsafe fn k4_vec_dot_4rows<I: Isa, B: K4Block, M: MinTerm>(
    w: [&[B]; 4],
    a: &[BlockQ8K],
) -> [f32; 4] {
    let n = a.len();
    assert!(w.iter().all(|w| w.len() == n), "rows of unequal length");
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut min_term: [M; 4] = std::array::from_fn(|_| M::zero());
    for (i, y) in a.iter().enumerate() {
        // SAFETY (get_unchecked): every row has n blocks (asserted above) and i < n.
        let b = w.map(|w| w.get_unchecked(i));
        let scales_mins = b.map(|b| k4_scales_mins(b));
        let sums = k4_scaled_sums_x::<I, B, 4>(scales_mins.map(|(s, _)| s), y, b);
        let sub_sums = k4_sub_sums(y);
        for r in 0..4 {
            let (d_w, dmin_w) = (f16_to_f32(b[r].d()), f16_to_f32(b[r].dmin()));
            let mins = _mm_madd_epi16(scales_mins[r].1, sub_sums);
            min_term[r].add(-y.d() * dmin_w, mins);
            let d = _mm256_set1_ps(y.d() * d_w);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums[r]), acc[r]);
        }
    }
    std::array::from_fn(|r| hsum(acc[r]) + min_term[r].total())
}

/// Q4_K/Q5_K in ggml's tiled order (see [`tiled`]) against `N` activation rows: the
/// super-block's value before the activation scale is `d·sumi - dmin·summ`, the subtraction
/// fused. Its scales, mins and quants are unpacked once for all `N`; each output's chain is the
/// single row's.
#[inline(always)]
unsafe fn k4_tiled_n<I: Isa, B: K4Block, const N: usize>(w: &[B], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let mut acc = [0.0f32; N];
    for (i, b) in w.iter().enumerate() {
        let (scales, mins) = k4_scales_mins(b);
        let chunks = k4_chunks(b);
        let (d_w, dmin_w) = (f16_to_f32(b.d()), f16_to_f32(b.dmin()));
        for (acc, a) in acc.iter_mut().zip(a) {
            let y = &a[i];
            let scaled = d_w * hsum_i32(k4_scaled_sum_of::<I>(scales, y, &chunks)) as f32;
            let mins = hsum_i32_128(k4_chunk_min_sums(mins, y)) as f32;
            *acc = (-dmin_w).mul_add(mins, scaled).mul_add(y.d(), *acc);
        }
    }
    acc
}

/// The sixteen scales of a super-block of 16-value sub-blocks (Q2_K, Q3_K) as ggml's AVX2 kernels
/// hold them: the i16 scales of 128-value half h in both 128-bit lanes of `self.0[h]`.
pub struct Sub16Scales([__m256i; 2]);

impl Sub16Scales {
    /// From the sixteen scales as signed bytes.
    #[inline(always)]
    pub unsafe fn new(scales: __m128i) -> Self {
        let all = _mm256_cvtepi8_epi16(scales);
        let (lo, hi) = (
            _mm256_castsi256_si128(all),
            _mm256_extracti128_si256(all, 1),
        );
        Sub16Scales([_mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi)])
    }

    /// Eight i32 sums of `p16` (sixteen i16 products of one 32-value group: group g of half h,
    /// sub-block 8h+2g in the low 128 bits, 8h+2g+1 in the high) times each sub-block's scale.
    #[inline(always)]
    pub unsafe fn apply(&self, h: usize, g: usize, p16: __m256i) -> __m256i {
        // i16 lane 2g of the low 128 bits there, lane 2g+1 of the high ones here.
        let lane = |k: usize| (((2 * k + 1) << 8) | (2 * k)) as i16;
        let mask = _mm256_set_m128i(_mm_set1_epi16(lane(2 * g + 1)), _mm_set1_epi16(lane(2 * g)));
        _mm256_madd_epi16(_mm256_shuffle_epi8(self.0[h], mask), p16)
    }
}

/// The float order of ggml's tiled K-quant matmul (ggml-cpu/tiled, which llama.cpp uses instead
/// of vec_dot when a matmul has at least 8 activation rows): each super-block's integer total is
/// converted once and scaled by the weight's d (`block`), then one scalar FMA by the
/// activation's d adds it to the output, super-block after super-block.
#[inline(always)]
pub unsafe fn tiled<B>(w: &[B], a: &[BlockQ8K], block: impl Fn(&B, &BlockQ8K) -> f32) -> f32 {
    let mut acc = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        acc = block(b, y).mul_add(y.d(), acc);
    }
    acc
}

/// Mins-free K-quants in either of llama.cpp's non-repacked orders: vec_dot is one FMA of the
/// super-block's eight integer lanes by `d_w·d_a`, then the horizontal sum.
#[inline(always)]
pub unsafe fn scaled_dot<B: ScaledBlock>(w: &[B], a: &[BlockQ8K], order: DotOrder) -> f32 {
    let [out] = scaled_dot_n(w, [a], order, |b, [y]| [b.sumi(y)]);
    out
}

/// [`scaled_dot`] against `N` activation rows: `sumi` gives a super-block's integer lanes
/// ([`ScaledBlock::sumi`]) for all `N` rows at once, so a format can unpack its quants once.
#[inline(always)]
pub unsafe fn scaled_dot_n<B: ScaledBlock, const N: usize>(
    w: &[B],
    a: [&[BlockQ8K]; N],
    order: DotOrder,
    sumi: impl Fn(&B, [&BlockQ8K; N]) -> [__m256i; N],
) -> [f32; N] {
    let d_w = |b: &B| f16_to_f32(b.d());
    match order {
        // The tiled order per output (see [`tiled`]), the super-block unpacked once for all `N`.
        DotOrder::Tiled => {
            let mut acc = [0.0f32; N];
            for (i, b) in w.iter().enumerate() {
                let y: [&BlockQ8K; N] = std::array::from_fn(|t| &a[t][i]);
                for (t, s) in sumi(b, y).into_iter().enumerate() {
                    acc[t] = tiled_step(d_w(b), s, y[t], acc[t]);
                }
            }
            acc
        }
        _ => {
            let mut acc = [_mm256_setzero_ps(); N];
            for (i, b) in w.iter().enumerate() {
                let y: [&BlockQ8K; N] = std::array::from_fn(|t| &a[t][i]);
                for (t, s) in sumi(b, y).into_iter().enumerate() {
                    acc[t] = vec_dot_step(d_w(b), s, y[t], acc[t]);
                }
            }
            acc.map(|v| hsum(v))
        }
    }
}

/// One super-block of the tiled order: `acc + (d_w·Σ sumi)·d_a`.
#[inline(always)]
unsafe fn tiled_step(d_w: f32, sumi: __m256i, y: &BlockQ8K, acc: f32) -> f32 {
    (d_w * hsum_i32(sumi) as f32).mul_add(y.d(), acc)
}

/// One super-block of the vec_dot order: the eight lanes `acc + sumi·(d_w·d_a)`.
#[inline(always)]
unsafe fn vec_dot_step(d_w: f32, sumi: __m256i, y: &BlockQ8K, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_set1_ps(d_w * y.d()), _mm256_cvtepi32_ps(sumi), acc)
}

/// Decode's mat-vec for a mins-free K-quant: `out[i]` = row i · `a`, each exactly
/// [`scaled_dot`]'s, `R` rows at a time: `sumi` gives a super-block's integer lanes for `R`
/// weight rows at once, so a format can interleave their chains and keep the multiply pipes
/// busy (from L2; from memory the rows' loads bound it either way). IQ4_XS, with its
/// sub-blocks in pairs (`formats/iq4_xs.rs`), runs two rows at a time with VNNI (faster than
/// four; without VNNI two spill vectors, so one). As it reads super-block j, it requests super-block j of the rows [`rows_ahead_of`] (at
/// least `R`) ahead. Returns how many rows it wrote (all, or none when the lengths do not
/// fit).
// Not inlined: see `groups_ahead`.
#[inline(never)]
pub unsafe fn scaled_rows<I: Isa, B: ScaledBlock + Block, const R: usize>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8K],
    order: DotOrder,
    out: &mut [f32],
    sumi: impl Fn([&B; R], &BlockQ8K) -> [__m256i; R],
) -> usize {
    if row_bytes != a.len() * size_of::<B>() || rows.len() != row_bytes * out.len() {
        return 0;
    }
    let n_rows = out.len();
    let row = |i: usize| rows.get(i * row_bytes..(i + 1) * row_bytes).map(blocks::<B>);
    let ahead = rows_ahead_of::<I>().max(R);
    crate::quant::prefetch(&rows[..row_bytes * ahead.min(n_rows)]);
    for i in (0..n_rows).step_by(R) {
        // A last group short of `R` repeats its last row; only the real rows are written.
        let w = std::array::from_fn(|r| row((i + r).min(n_rows - 1)).expect("in bounds"));
        let got = scaled_rows_ahead(w, std::array::from_fn(|r| row(i + ahead + r)), a, order, &sumi);
        for (o, got) in out[i..].iter_mut().zip(got) {
            *o = got;
        }
    }
    n_rows
}

/// [`scaled_dot`] of `R` rows, each in its own chain, requesting super-block i of the `ahead`
/// rows as it reads its own i.
#[inline(always)]
unsafe fn scaled_rows_ahead<B: ScaledBlock, const R: usize>(
    w: [&[B]; R],
    ahead: [Option<&[B]>; R],
    a: &[BlockQ8K],
    order: DotOrder,
    sumi: &impl Fn([&B; R], &BlockQ8K) -> [__m256i; R],
) -> [f32; R] {
    let step = |i: usize, y: &BlockQ8K| {
        for x in ahead.iter().filter_map(|x| x.and_then(|x| x.get(i))) {
            request_block(x);
        }
        // SAFETY (get_unchecked): every row has a.len() blocks (`scaled_rows` checked the
        // lengths) and i < a.len().
        let b = w.map(|w| w.get_unchecked(i));
        (b, sumi(b, y))
    };
    match order {
        DotOrder::Tiled => {
            let mut acc = [0.0f32; R];
            for (i, y) in a.iter().enumerate() {
                let (b, s) = step(i, y);
                for r in 0..R {
                    acc[r] = tiled_step(f16_to_f32(b[r].d()), s[r], y, acc[r]);
                }
            }
            acc
        }
        _ => {
            let mut acc = [_mm256_setzero_ps(); R];
            for (i, y) in a.iter().enumerate() {
                let (b, s) = step(i, y);
                for r in 0..R {
                    acc[r] = vec_dot_step(f16_to_f32(b[r].d()), s[r], y, acc[r]);
                }
            }
            acc.map(|v| hsum(v))
        }
    }
}

/// How many rows ahead [`scaled_rows`] requests lines: the rows are read one after another, so
/// this is the distance in the matrix's one stream (two 2048-wide Q6_K rows: 3.4 KB). The CPUs
/// with VNNI put the requests in L2 ([`super::quads_ahead_of`]), whose deeper queue wants twice
/// that (on a large Q6_K LM head four rows ahead beat two, and eight was no better than four).
#[inline(always)]
const fn rows_ahead_of<I: Isa>() -> usize {
    if I::VNNI {
        4
    } else {
        2
    }
}

/// The ternary types' order (TQ1_0, TQ2_0; ggml's AVX2 `ggml_vec_dot_tq{1,2}_0_q8_K`): `codes`
/// gives a super-block's f16 d and the dot of its codes (values + 1) with the activations as
/// sixteen i16 lanes, pairs of bytes in element order; the activation's sixteen bsums are
/// subtracted lane by lane (removing the +1), the pairs widened to eight i32 lanes, and one FMA
/// by `d·d_a` per super-block adds them to eight float lanes.
#[inline(always)]
pub unsafe fn ternary_dot<B>(
    w: &[B],
    a: &[BlockQ8K],
    codes: impl Fn(&B, &BlockQ8K) -> ([u8; 2], __m256i),
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let (d, sum16) = codes(b, y);
        let sum16 = _mm256_sub_epi16(sum16, load256(y.bsums.as_ptr()));
        let sumi = _mm256_madd_epi16(sum16, _mm256_set1_epi16(1));
        // ggml writes `sum + cvt(sumi)·d` as a multiply and an add; the x86-64-v3 build fuses
        // them (of the two, the FMA is the one nearer llama.cpp's logits).
        let d = _mm256_set1_ps(y.d() * f16_to_f32(d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    hsum(acc)
}

/// What the multi-row kernels that build a per-call table of the activations (one entry per
/// super-block, at most `max_blocks`) rely on: weight rows of `row_bytes` holding whole `B`
/// blocks, no more than `max_blocks` of them, activation rows of as many blocks, and outputs of
/// as many values as there are weight rows. Returns (blocks per row, weight rows).
#[inline(always)]
pub fn check_table_rows<B, A, const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    max_blocks: usize,
    a: &[&[A]; N],
    outs: &[&mut [f32]; N],
) -> (usize, usize) {
    let n = row_bytes / size_of::<B>();
    assert!(
        n <= max_blocks && row_bytes == n * size_of::<B>() && a.iter().all(|a| a.len() == n),
        "rows too wide, or rows and activations of unequal length"
    );
    let n_rows = rows.len() / row_bytes;
    assert!(outs.iter().all(|o| o.len() == n_rows), "outputs of another row count");
    (n, n_rows)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::quant::blocks::scales_mins_k4;

    proptest! {
        /// The shuffle unpacking gives [`scales_mins_k4`]'s bytes for any packing.
        #[test]
        fn scales_mins_k4_x86_is_scales_mins_k4(packed in any::<[u8; 12]>()) {
            let mut got = [0u8; 16];
            // SAFETY: the crate is built for x86-64-v3 (SSSE3, SSE4.1).
            unsafe { _mm_storeu_si128(got.as_mut_ptr().cast(), scales_mins_k4_x86(&packed)) };
            prop_assert_eq!(got, scales_mins_k4(&packed));
        }
    }
}
