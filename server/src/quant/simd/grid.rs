//! What the grid types' kernels share (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M: a
//! super-block of 256 values in eight sub-blocks of 32, each value a byte of a grid entry looked
//! up by an index, with a sign and a sub-block scale): a format says how one sub-block unpacks
//! ([`GridBlock::sub`]) and how its float order sums a super-block ([`GridBlock::step`]); the
//! kernels here unpack each weight sub-block once for every activation row they take.
//!
//! The grid lookups (scalar loads, no gather: a gather is slower on the AMD cores this runs on)
//! and the sign expansion are most of a sub-block's work against one activation row; against
//! four or eight rows (prefill) they are done once and each row costs a sign, a `maddubs`, a
//! `madd` and an add. Every lane holds the integers the formats' single-row kernels hold (the
//! same products, `maddubs` of the magnitudes and the signed activations, in the same pairs and
//! quads), so each output is bit-identical to theirs. The unit grids (IQ1_S, IQ1_M) take the
//! batch a cheaper way to the same lane integers: a `maddubs` of the bytes `q·scale + 15`, four
//! sub-blocks summed in i16, the offset and IQ1_M's shifts from activation sums made once per row.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{hsum, hsum_i32, load256, unrolled};
use crate::quant::blocks::{blocks, Block, KSIGNS};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::DotOrder;

/// One sub-block (32 values) unpacked: `|value|` as unsigned bytes, a byte per value whose sign
/// is the value's (never 0 where the value is not 0: `_mm256_sign_epi8` puts it on the
/// activation), the scale as sixteen i16 (lanes 0..8 for values 0..16, 8..16 for 16..32), and
/// for IQ1_M the per-group shift signs (±1 bytes).
#[derive(Clone, Copy)]
pub struct Sub {
    pub mag: __m256i,
    pub sign: __m256i,
    pub scale: __m256i,
    pub shift: __m256i,
}

/// One super-block's integer sums against one activation super-block: `sumi` in the eight lanes
/// of the format's single-row kernel, and `extra` the shift part where the format has one
/// (IQ1_S: per-sub-block lanes whose total is what counts; IQ1_M: lanes as its kernel's).
#[derive(Clone, Copy)]
pub struct Sums {
    pub sumi: __m256i,
    pub extra: __m256i,
}

/// One output's float chain: eight lanes (`v`, and `x` for a second lane chain) or one scalar
/// (`s`), as the format's order uses them.
#[derive(Clone, Copy)]
pub struct Acc {
    pub v: __m256,
    pub x: __m256,
    pub s: f32,
}

impl Acc {
    #[inline(always)]
    unsafe fn zero() -> Acc {
        Acc {
            v: _mm256_setzero_ps(),
            x: _mm256_setzero_ps(),
            s: 0.0,
        }
    }
}

/// A grid type's super-block. The defaults are the plain case: no head, and vec_dot's eight
/// lanes scaled by the super-block's `d` and, at the end, by [`GridBlock::LANES_SCALE`].
pub trait GridBlock {
    /// IQ1_M: each sub-block's shift part has lanes of its own ([`Sub::shift`]), a sign per
    /// eight values.
    const SHIFT_LANES: bool = false;
    /// IQ1_S, IQ1_M: grid values in -1..=1 and scales in 1..=15, so [`rows_batch`] dots a
    /// sub-block as the bytes `q·scale + 15` ([`UnitWeights`]).
    const UNIT_GRID: bool = false;
    /// The factor of the lane total at the end in the default [`GridBlock::finish`] (the
    /// formats' `dot_1x1` apply it there: 0.125 for IQ2, 0.25 for IQ3_XXS).
    const LANES_SCALE: f32 = 1.0;
    /// What the super-block prepares once for every activation row: IQ1_S's shift weights, as
    /// i16 lanes against the activation's block sums.
    #[inline(always)]
    unsafe fn head(&self) -> __m256i {
        _mm256_setzero_si256()
    }
    /// The shift part that comes from the activation's block sums (IQ1_S), as i32 lanes.
    #[inline(always)]
    unsafe fn head_sums(_head: &__m256i, _y: &BlockQ8K) -> __m256i {
        _mm256_setzero_si256()
    }
    /// Sub-block s (0..8) unpacked.
    unsafe fn sub(&self, s: usize) -> Sub;
    /// The super-block's scale `d`.
    fn d_f32(&self) -> f32;
    /// Adds the super-block's sums against `y` to one output's chain, in `order`.
    #[inline(always)]
    unsafe fn step(&self, acc: &mut Acc, sums: Sums, y: &BlockQ8K, _order: DotOrder) {
        vec_dot_step(acc, self.d_f32(), sums.sumi, y);
    }
    /// The output from its chain.
    #[inline(always)]
    unsafe fn finish(acc: &Acc, _order: DotOrder) -> f32 {
        Self::LANES_SCALE * lanes_total(acc)
    }
}

/// `sums` + sub-block `sub` · the 32 activations `act`.
#[inline(always)]
unsafe fn acc_sub<B: GridBlock>(sums: &mut Sums, sub: &Sub, act: __m256i) {
    let products = _mm256_maddubs_epi16(sub.mag, _mm256_sign_epi8(act, sub.sign));
    sums.sumi = _mm256_add_epi32(sums.sumi, _mm256_madd_epi16(products, sub.scale));
    if B::SHIFT_LANES {
        let shifts = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_sign_epi8(act, sub.shift));
        sums.extra = _mm256_add_epi32(sums.extra, _mm256_madd_epi16(shifts, sub.scale));
    }
}

/// Super-block `b` against `N` activation super-blocks: their sums added to their chains `acc`.
/// `head` and `sub(s)` are `b`'s head and sub-block s unpacked, each once for all `N` rows:
/// on the spot (`dot_n`) or read back from a copy unpacked once for many groups (`rows_batch`).
#[inline(always)]
unsafe fn add_block<B: GridBlock, const N: usize>(
    b: &B,
    head: &__m256i,
    sub: impl Fn(usize) -> Sub,
    y: [&BlockQ8K; N],
    acc: &mut [Acc],
    order: DotOrder,
) {
    let mut sums: [Sums; N] = std::array::from_fn(|t| Sums {
        sumi: _mm256_setzero_si256(),
        extra: B::head_sums(head, y[t]),
    });
    unrolled::<8>(|s| {
        let sub = sub(s);
        for (sums, y) in sums.iter_mut().zip(y) {
            acc_sub::<B>(sums, &sub, load256(y.qs.as_ptr().add(32 * s).cast()));
        }
    });
    for t in 0..N {
        b.step(&mut acc[t], sums[t], y[t], order);
    }
}

/// One weight row against `N` activation rows (of as many super-blocks), each result the
/// format's single-row order: what `dot_1x4` and `dot_1xn` run, and through them prefill's
/// `rows_x4` and `rows_x8`.
#[inline(always)]
pub unsafe fn dot_n<B: GridBlock, const N: usize>(
    w: &[B],
    a: [&[BlockQ8K]; N],
    order: DotOrder,
) -> [f32; N] {
    assert!(
        a.iter().all(|a| a.len() == w.len()),
        "activation rows of another length"
    );
    let mut acc = [Acc::zero(); N];
    for (i, b) in w.iter().enumerate() {
        // SAFETY (get_unchecked): every activation row has w.len() blocks (asserted above).
        let y: [&BlockQ8K; N] = std::array::from_fn(|t| a[t].get_unchecked(i));
        add_block(b, &b.head(), |s| b.sub(s), y, &mut acc, order);
    }
    acc.map(|acc| B::finish(&acc, order))
}

/// Activation rows [`rows_batch`] takes at a time: their chains (96 bytes each) and one
/// super-block of each (292 bytes) stay in L1 while a weight block is dotted with all of them.
const BATCH: usize = 64;

/// Prefill's micro-batch (at least 16 activation rows; fewer are left to the groups of eight and
/// four, and it returns false): `outs[t][r]` = weight row r · `acts[t]`, each the format's
/// single-row order (what the groups and single rows give it: in the orders grid types have,
/// every output is its row's `dot_1x1`). Each weight super-block is unpacked once for up to
/// [`BATCH`] activation rows (into L1, then read back per group of eight), not once per
/// group, and each weight row is read once per [`BATCH`] rows.
#[inline(always)]
pub unsafe fn rows_batch<B: GridBlock + Block>(
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[BlockQ8K]],
    order: DotOrder,
    outs: &mut [&mut [f32]],
) -> bool {
    let n = row_bytes / size_of::<B>();
    if acts.len() < 16
        || row_bytes != n * size_of::<B>()
        || acts.len() != outs.len()
        || acts.iter().any(|a| a.len() != n)
    {
        return false;
    }
    let n_rows = rows.len() / row_bytes;
    assert!(
        rows.len() == n_rows * row_bytes && outs.iter().all(|o| o.len() == n_rows),
        "rows and outputs of unequal counts"
    );
    if B::UNIT_GRID {
        unit_rows_batch::<B>(rows, row_bytes, n, acts, order, outs);
        return true;
    }
    let mut acc = [Acc::zero(); BATCH];
    for (acts, outs) in acts.chunks(BATCH).zip(outs.chunks_mut(BATCH)) {
        let len = acts.len();
        for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
            acc[..len].fill(Acc::zero());
            for (i, b) in blocks::<B>(row).iter().enumerate() {
                let subs: [Sub; 8] = std::array::from_fn(|s| b.sub(s));
                let head = b.head();
                // SAFETY (get_unchecked): every activation row has n blocks (checked above).
                let y = |t: usize| acts.get_unchecked(t).get_unchecked(i);
                let mut t = 0;
                while t + 8 <= len {
                    add_block::<B, 8>(b, &head, |s| subs[s], std::array::from_fn(|k| y(t + k)), &mut acc[t..t + 8], order);
                    t += 8;
                }
                while t + 4 <= len {
                    add_block::<B, 4>(b, &head, |s| subs[s], std::array::from_fn(|k| y(t + k)), &mut acc[t..t + 4], order);
                    t += 4;
                }
                while t < len {
                    add_block::<B, 1>(b, &head, |s| subs[s], [y(t)], &mut acc[t..t + 1], order);
                    t += 1;
                }
            }
            for (o, acc) in outs.iter_mut().zip(&acc[..len]) {
                o[r] = B::finish(acc, order);
            }
        }
    }
    true
}

/// [`rows_batch`] of the unit grids ([`GridBlock::UNIT_GRID`]), `n` super-blocks a row: each
/// activation super-block's [`unit_acts`] made once per pass of [`BATCH`] rows, each weight
/// row's [`unit_weights`] once per pass (into L1), then every group of eight (four, one)
/// activation rows runs along the whole row, the rows' blocks read in order.
#[inline(always)]
unsafe fn unit_rows_batch<B: GridBlock + Block>(
    rows: &[u8],
    row_bytes: usize,
    n: usize,
    acts: &[&[BlockQ8K]],
    order: DotOrder,
    outs: &mut [&mut [f32]],
) {
    UNIT_SCRATCH.with_borrow_mut(|(sums, weights)| {
        for (acts, outs) in acts.chunks(BATCH).zip(outs.chunks_mut(BATCH)) {
            sums.clear();
            sums.extend(acts.iter().flat_map(|a| a.iter().map(|y| unit_acts(y))));
            for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
                let row = blocks::<B>(row);
                weights.clear();
                weights.extend(row.iter().map(|b| (unit_weights(b), b.head())));
                let mut t = 0;
                while t < acts.len() {
                    let group = match acts.len() - t {
                        8.. => 8,
                        4..8 => 4,
                        _ => 1,
                    };
                    let (a, u) = (&acts[t..t + group], &sums[t * n..(t + group) * n]);
                    let o = &mut outs[t..t + group];
                    match group {
                        8 => unit_group::<B, 8>(row, weights, a, u, order, o, r),
                        4 => unit_group::<B, 4>(row, weights, a, u, order, o, r),
                        _ => unit_group::<B, 1>(row, weights, a, u, order, o, r),
                    }
                    t += group;
                }
            }
        }
    })
}

/// [`unit_rows_batch`]'s copies: a pass's [`unit_acts`], and a row's [`unit_weights`] and heads.
type UnitScratch = (Vec<UnitActs>, Vec<(UnitWeights, __m256i)>);

thread_local! {
    /// [`UnitScratch`], kept per thread so that a call allocates only when a wider matrix or a
    /// larger batch than the thread has seen comes.
    static UNIT_SCRATCH: RefCell<UnitScratch> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `N` activation rows (their [`unit_acts`] `u`, `n` a row) against one weight row `row` (its
/// [`unit_weights`] and heads `w`): `outs[t][r]` each in the format's single-row order.
#[inline(always)]
unsafe fn unit_group<B: GridBlock, const N: usize>(
    row: &[B],
    w: &[(UnitWeights, __m256i)],
    acts: &[&[BlockQ8K]],
    u: &[UnitActs],
    order: DotOrder,
    outs: &mut [&mut [f32]],
    r: usize,
) {
    let n = row.len();
    assert!(
        w.len() == n && acts.len() == N && u.len() == N * n && outs.len() == N,
        "unit_group: {N} rows of {n} super-blocks"
    );
    let mut acc = [Acc::zero(); N];
    for (i, (b, (w, head))) in row.iter().zip(w).enumerate() {
        // SAFETY (get_unchecked): every activation row has n blocks (rows_batch checked) and
        // n entries in `u` (asserted above).
        let y = std::array::from_fn(|t| acts.get_unchecked(t).get_unchecked(i));
        let u = std::array::from_fn(|t| u.get_unchecked(t * n + i));
        add_unit_block::<B, N>(b, w, head, y, u, &mut acc, order);
    }
    for (o, acc) in outs.iter_mut().zip(&acc) {
        o[r] = B::finish(acc, order);
    }
}

/// A unit grid's super-block as [`rows_batch`] dots it ([`GridBlock::UNIT_GRID`]): `offset[s]`
/// the 32 bytes `q·scale + 15` of sub-block s (unsigned, at most 30: `maddubs` against the
/// activations gives pairs within ±7680, so four sub-blocks sum in i16 exactly), `pairs` the
/// shift part's coefficients ([`GridBlock::SHIFT_LANES`]): vector p has in i16 lanes 2j and
/// 2j + 1 the signed scales (scale times shift sign) of i32 lane j of sub-blocks 2p and 2p + 1,
/// each constant over the four values of its lane.
struct UnitWeights {
    offset: [__m256i; 8],
    pairs: [__m256i; 4],
}

#[inline(always)]
unsafe fn unit_weights<B: GridBlock>(b: &B) -> UnitWeights {
    let subs: [Sub; 8] = std::array::from_fn(|s| b.sub(s));
    // The scales as bytes (values 0..16 the low half's, 16..32 the high half's), each by its
    // value's sign: q·scale, as q is -1, 0 or 1.
    let offset = std::array::from_fn(|s| {
        let scale = _mm256_packs_epi16(subs[s].scale, subs[s].scale);
        _mm256_add_epi8(_mm256_sign_epi8(scale, subs[s].sign), _mm256_set1_epi8(15))
    });
    // The shift bytes are 0x01 or 0xFF: as i16 positive or negative.
    let signed = |s: usize| _mm256_sign_epi16(subs[s].scale, subs[s].shift);
    let pairs = std::array::from_fn(|p| {
        if B::SHIFT_LANES {
            _mm256_blend_epi16::<0xAA>(signed(2 * p), signed(2 * p + 1))
        } else {
            _mm256_setzero_si256()
        }
    });
    UnitWeights { offset, pairs }
}

/// An activation super-block's sums for the unit grids: entries 0..4 its sums of four (i32 lane
/// j of sub-block s: the sum of values 4j..4j + 4, within ±512) as i16 in
/// [`UnitWeights::pairs`]' layout, vector p lanes 2j and 2j + 1 those of sub-blocks 2p and
/// 2p + 1; entry 4 lane j `-15·Σ_s` of them (what the `+ 15` of [`UnitWeights::offset`] adds).
type UnitActs = [__m256i; 5];

#[inline(always)]
unsafe fn unit_acts(y: &BlockQ8K) -> UnitActs {
    let quads: [__m256i; 8] = std::array::from_fn(|s| {
        let act = load256(y.qs.as_ptr().add(32 * s).cast());
        _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(1), act),
            _mm256_set1_epi16(1),
        )
    });
    let total = quads.iter().fold(_mm256_setzero_si256(), |t, &q| _mm256_add_epi32(t, q));
    std::array::from_fn(|p| match p {
        4 => _mm256_sub_epi32(total, _mm256_slli_epi32::<4>(total)),
        _ => _mm256_blend_epi16::<0xAA>(quads[2 * p], _mm256_slli_epi32::<16>(quads[2 * p + 1])),
    })
}

/// [`add_block`] for the unit grids, with `w` = `b`'s [`unit_weights`] and `u[t]` = `y[t]`'s
/// [`unit_acts`]: the same integer lanes as [`acc_sub`] sums (lane j of the grid part
/// `Σ_s scale·Σ q·a` = `Σ_s Σ (q·scale + 15)·a − 15·Σ_s Σ a`; of the shift part
/// `Σ_s ±scale·Σ a` by one `madd` per pair of sub-blocks), given Q8_K quants (within ±127,
/// where the single-row kernels' sign flips are exact): a sub-block costs each activation row
/// one `maddubs` and one i16 add, not a sign, two `maddubs`, two `madd`s and two adds.
#[inline(always)]
unsafe fn add_unit_block<B: GridBlock, const N: usize>(
    b: &B,
    w: &UnitWeights,
    head: &__m256i,
    y: [&BlockQ8K; N],
    u: [&UnitActs; N],
    acc: &mut [Acc],
    order: DotOrder,
) {
    let ones = _mm256_set1_epi16(1);
    let mut sumi: [__m256i; N] = std::array::from_fn(|t| u[t][4]);
    for half in 0..2 {
        let mut pairs = [_mm256_setzero_si256(); N];
        for s in 4 * half..4 * half + 4 {
            let offset = w.offset[s];
            for (pairs, y) in pairs.iter_mut().zip(y) {
                let act = load256(y.qs.as_ptr().add(32 * s).cast());
                *pairs = _mm256_add_epi16(*pairs, _mm256_maddubs_epi16(offset, act));
            }
        }
        for (sumi, pairs) in sumi.iter_mut().zip(pairs) {
            *sumi = _mm256_add_epi32(*sumi, _mm256_madd_epi16(pairs, ones));
        }
    }
    for t in 0..N {
        let extra = if B::SHIFT_LANES {
            (0..4).fold(_mm256_setzero_si256(), |e, p| {
                _mm256_add_epi32(e, _mm256_madd_epi16(u[t][p], w.pairs[p]))
            })
        } else {
            B::head_sums(head, y[t])
        };
        b.step(&mut acc[t], Sums { sumi: sumi[t], extra }, y[t], order);
    }
}

/// Four weight rows against one activation row (decode's mat-vec): each activation sub-block
/// is loaded once for the four rows, whose chains interleave; each result the format's
/// single-row order.
#[inline(always)]
pub unsafe fn dot_4x1<B: GridBlock>(w: [&[B]; 4], a: &[BlockQ8K], order: DotOrder) -> [f32; 4] {
    assert!(
        w.iter().all(|w| w.len() == a.len()),
        "weight rows of another length"
    );
    let mut acc = [Acc::zero(); 4];
    for (i, y) in a.iter().enumerate() {
        // SAFETY (get_unchecked): every weight row has a.len() blocks (asserted above).
        let b = w.map(|w| w.get_unchecked(i));
        let mut sums = b.map(|b| Sums {
            sumi: _mm256_setzero_si256(),
            extra: B::head_sums(&b.head(), y),
        });
        unrolled::<8>(|s| {
            let act = load256(y.qs.as_ptr().add(32 * s).cast());
            for (sums, b) in sums.iter_mut().zip(b) {
                acc_sub::<B>(sums, &b.sub(s), act);
            }
        });
        for r in 0..4 {
            b[r].step(&mut acc[r], sums[r], y, order);
        }
    }
    acc.map(|acc| B::finish(&acc, order))
}

/// The vec_dot order's step of the mins-free K-quants: the eight lanes `v + sumi·(d_w·d_a)`.
#[inline(always)]
pub unsafe fn vec_dot_step(acc: &mut Acc, d_w: f32, sumi: __m256i, y: &BlockQ8K) {
    acc.v = _mm256_fmadd_ps(_mm256_set1_ps(d_w * y.d()), _mm256_cvtepi32_ps(sumi), acc.v);
}

/// The tiled order's step: `s + (d_w·Σ sumi)·d_a`.
#[inline(always)]
pub unsafe fn tiled_step(acc: &mut Acc, d_w: f32, sumi: __m256i, y: &BlockQ8K) {
    acc.s = (d_w * hsum_i32(sumi) as f32).mul_add(y.d(), acc.s);
}

/// The sum of the eight lanes `v` (the vec_dot order's result).
#[inline(always)]
pub unsafe fn lanes_total(acc: &Acc) -> f32 {
    hsum(acc.v)
}

/// The sum of the eight lanes `x`.
#[inline(always)]
pub unsafe fn shift_lanes_total(acc: &Acc) -> f32 {
    hsum(acc.x)
}

/// ggml's `keven_signs_q2xs`: entry i the eight signs of [`KSIGNS`]`[i]` as bytes, -1 where the
/// bit is set and 1 elsewhere (what `_mm256_sign_epi8` takes), byte j for bit j.
pub static SIGNS_PM1: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if (KSIGNS[i] >> j) & 1 == 1 { 0xFF } else { 0x01 };
            t[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

/// The ±1 sign bytes of four groups of eight, each by a 7-bit index into [`KSIGNS`]: `aux`
/// holds index l in bits `7l..7l+7`.
#[inline(always)]
pub unsafe fn ksigns_x4(aux: u32) -> __m256i {
    let s = |l: u32| SIGNS_PM1[((aux >> (7 * l)) & 127) as usize] as i64;
    _mm256_set_epi64x(s(3), s(2), s(1), s(0))
}

/// The ±1 sign bytes of 32 values from their 32 sign bits (bit i set: value i negative).
#[inline(always)]
pub unsafe fn signs_from_bits(bits: u32) -> __m256i {
    _mm256_or_si256(super::bytes_from_bits_32(bits), _mm256_set1_epi8(1))
}

/// The scales of a sub-block whose halves (16 values each) have scales `lo` and `hi`.
#[inline(always)]
pub unsafe fn half_scales(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// The [`Kernels`](crate::quant::format::Kernels) entry points a grid type takes from here:
/// `dot_1x4` and `dot_1xn` by [`dot_n`] (and through them the default `rows_x4` and `rows_x8`),
/// `rows_xbatch` by [`rows_batch`],
/// `dot_4xn` for one activation row by [`dot_4x1`], for several each row's `dot_1xn`. Written
/// inside the format's `impl<$isa: Isa> Kernels<$isa>`, beside its own `dot_1x1` (the float order
/// these are held to).
macro_rules! grid_kernels {
    ($isa:ident) => {
        #[inline]
        fn dot_1x4(
            w: &[Self::Block],
            a: [&[$crate::quant::formats::q8_k::BlockQ8K]; 4],
            order: $crate::quant::DotOrder,
        ) -> [f32; 4] {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); the kernel
            // checks the lengths its loads rely on.
            unsafe { $crate::quant::simd::grid::dot_n(w, a, order) }
        }

        #[inline]
        fn dot_1xn<const N: usize>(
            w: &[Self::Block],
            a: [&[$crate::quant::formats::q8_k::BlockQ8K]; N],
            order: $crate::quant::DotOrder,
        ) -> [f32; N] {
            // SAFETY: as in `dot_1x4`.
            unsafe { $crate::quant::simd::grid::dot_n(w, a, order) }
        }

        /// Prefill's micro-batch by [`grid::rows_batch`](crate::quant::simd::grid::rows_batch).
        #[inline]
        fn rows_xbatch(
            rows: &[u8],
            row_bytes: usize,
            acts: &[&[$crate::quant::formats::q8_k::BlockQ8K]],
            order: $crate::quant::DotOrder,
            outs: &mut [&mut [f32]],
        ) -> bool {
            // SAFETY: as in `dot_1x4`.
            unsafe { $crate::quant::simd::grid::rows_batch::<Self::Block>(rows, row_bytes, acts, order, outs) }
        }

        #[inline]
        fn dot_4xn<const N: usize>(
            w: [&[Self::Block]; 4],
            a: [&[$crate::quant::formats::q8_k::BlockQ8K]; N],
            order: $crate::quant::DotOrder,
        ) -> [[f32; 4]; N] {
            if N == 1 {
                // SAFETY: as in `dot_1x4`.
                let out = unsafe { $crate::quant::simd::grid::dot_4x1(w, a[0], order) };
                [out; N]
            } else {
                $crate::quant::format::dot_4xn_by_rows::<Self, $isa, N>(w, a, order)
            }
        }
    };
}
pub(crate) use grid_kernels;
