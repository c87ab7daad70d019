//! Prefill's matmul for Q4_K in the repacked order as a GEMM with weight rows in the lanes, the
//! super-block counterpart of [`panel`](super::panel). Its panels, activation table and VNNI
//! sub-block sums also serve Q5_K's tiled order ([`panel_k5`](super::panel_k5)), whose
//! super-blocks have the same scales and mins.
//!
//! The repacked row kernels of Q4_K (`gemm_rows`) put one weight row's 64-value chunk in a
//! register per activation row and reduce every (weight row, activation row, chunk) product
//! horizontally. Here eight weight rows share a register: lane r holds four consecutive quants
//! of one sub-block of row r, and one multiply-add by four activation bytes broadcast to every
//! lane (`vpdpbusd` with an embedded broadcast under VNNI, `vpbroadcastd` and `maddubs` on AVX2)
//! advances all eight rows' sub-block sums, so after eight of them each lane holds its row's
//! sub-block total with no horizontal step. As in `panel`, eight rows ("a panel") are
//! transposed per slice of super-blocks into a buffer on the stack, with their nibbles already
//! split into bytes and their scales and mins unpacked, and read by every activation row of the
//! call.
//!
//! The outputs follow llama.cpp's grouping of a batch: activation rows in groups of four take
//! the gemm's chain (per 64-value chunk c, `sumi = sc_2c·S_2c + sc_2c+1·S_2c+1` and
//! `m_2c·bsum_2c + m_2c+1·bsum_2c+1`, each FMA'd by `d_w·d_a` and `dmin_w·d_a` into its chain);
//! the last `len % 4` rows take the gemv's (the same integers summed over the super-block, one
//! FMA per chain and super-block). Every integer is exact however it is summed, so the results
//! are bit-identical to `gemm_rows` and `gemv_n` in [`q4_k`](crate::quant::formats::q4_k), which
//! the property tests hold this to.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::panel_gemm::{rows_in, transpose_8x8, PanelKernel, MAX_ACTS, PANEL_ROWS};
use super::super_block::{k4_sub_sums, scales_mins_k4_x86, K4Block};
use super::{dpbusd_broadcast, f16_lanes, load256};
use crate::quant::formats::q4_k::BlockQ4K;
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::isa::Isa;
use crate::quant::DotOrder;

/// Super-blocks of a row per pass (2048 values): a panel's slice is 19.5 KiB, so it stays in L1
/// while every activation row reads it; the float accumulators carry each chain across slices.
pub(super) const SLICE_BLOCKS: usize = 8;


/// [`Kernels::rows_xbatch`](crate::quant::format::Kernels::rows_xbatch) of Q4_K: the GEMM in
/// the repacked order ([`rows_in`]).
#[inline(always)]
pub fn rows<I: Isa>(
    rows: &[u8],
    row_bytes: usize,
    acts: &[&[BlockQ8K]],
    order: DotOrder,
    outs: &mut [&mut [f32]],
) -> bool {
    rows_in::<I, Q4KPanels>(DotOrder::Repacked, rows, row_bytes, acts, order, outs)
}

/// The [`PanelKernel`] of Q4_K in the repacked order: each output in the chain llama.cpp's
/// grouping gives it (the gemm's for the groups of four from the first, the gemv's for the
/// batch's last `len % 4` rows, the driver's tail), as two chains, sums and mins, subtracted at
/// the end.
struct Q4KPanels;

impl<I: Isa> PanelKernel<I> for Q4KPanels {
    type Block = BlockQ4K;
    type Act = BlockQ8K;
    type Table = ActTable;
    type Panel = Panel;
    type Chains = [__m256; 2];
    const SLICE_BLOCKS: usize = SLICE_BLOCKS;

    #[inline(always)]
    fn buffers() -> (ActTable, Panel) {
        (ActTable::new(), Panel::new())
    }

    #[inline(always)]
    fn zero() -> [__m256; 2] {
        // SAFETY: AVX is part of the target this module is compiled for.
        unsafe { [_mm256_setzero_ps(); 2] }
    }

    #[inline(always)]
    unsafe fn result([sums, mins]: [__m256; 2]) -> __m256 {
        _mm256_sub_ps(sums, mins)
    }

    #[inline(always)]
    unsafe fn fill(table: &mut ActTable, acts: &[&[BlockQ8K]], slice: Range<usize>) {
        table.fill(acts, slice);
    }

    #[inline(always)]
    unsafe fn pack(panel: &mut Panel, rows: [&[BlockQ4K]; PANEL_ROWS], slice: Range<usize>) {
        panel.pack::<I, BlockQ4K>(rows, slice, |b, quads| q4k_quads(b, quads));
    }

    #[inline(always)]
    unsafe fn tile<const M: usize, const TAIL: bool>(
        panel: &Panel,
        acts: &[&[BlockQ8K]],
        table: &ActTable,
        first_block: usize,
        k0: usize,
        acc: &mut [[__m256; 2]; MAX_ACTS],
    ) {
        tile::<I, M, TAIL>(panel, acts, table, first_block, k0, acc);
    }
}

/// What the micro-kernel takes from each activation super-block of a slice, made once per slice
/// and group of rows for all its panels: `d_a`, and per chunk c the i16 pair
/// (bsum_2c, bsum_2c+1) of its sub-block sums as one i32, which one `madd` by a lane's pair of
/// mins turns into that row's min sum.
pub(super) struct ActTable {
    d: [[MaybeUninit<f32>; SLICE_BLOCKS]; MAX_ACTS],
    sub_sums: [[MaybeUninit<[i32; 4]>; SLICE_BLOCKS]; MAX_ACTS],
}

impl ActTable {
    #[inline(always)]
    pub(super) fn new() -> ActTable {
        ActTable {
            d: [[MaybeUninit::uninit(); SLICE_BLOCKS]; MAX_ACTS],
            sub_sums: [[MaybeUninit::uninit(); SLICE_BLOCKS]; MAX_ACTS],
        }
    }

    /// The entries of activation rows `acts` and super-blocks `slice` (at most
    /// [`SLICE_BLOCKS`]).
    #[inline(always)]
    pub(super) unsafe fn fill(&mut self, acts: &[&[BlockQ8K]], slice: Range<usize>) {
        for (k, a) in acts.iter().enumerate() {
            for (j, b) in a[slice.clone()].iter().enumerate() {
                self.d[k][j].write(b.d());
                let pairs = self.sub_sums[k][j].as_mut_ptr();
                _mm_storeu_si128(pairs.cast(), k4_sub_sums(b));
            }
        }
    }

    /// Activation row `k`'s `d_a` of the slice's super-block `j` (written by `fill` for every row
    /// and super-block it was given).
    #[inline(always)]
    pub(super) unsafe fn d(&self, k: usize, j: usize) -> f32 {
        self.d.get_unchecked(k).get_unchecked(j).assume_init()
    }

    /// Activation row `k`'s sub-block sum pair of chunk `c` of super-block `j`, in every lane.
    #[inline(always)]
    pub(super) unsafe fn sub_sums(&self, k: usize, j: usize, c: usize) -> __m256i {
        let pairs = self.sub_sums.get_unchecked(k).get_unchecked(j).assume_init_ref();
        _mm256_set1_epi32(*pairs.get_unchecked(c))
    }
}

/// One super-block of a panel's eight rows, interleaved (lane r is row r throughout).
pub(super) struct PanelBlock {
    /// Per sub-block s, eight registers: register g, lane r holds quants 4g..4g+4 of row r's
    /// sub-block s, one per byte.
    pub(super) quads: [[__m256i; 8]; 8],
    /// Per sub-block s, the rows' scales as the micro-kernel applies them: on AVX2 `sc` in both
    /// i16 of the lane (one `madd` of the i16 pair sums gives `sc·S`); under VNNI `sc` as f32.
    pub(super) scales: [__m256i; 8],
    /// Per chunk c, the i16 pair (min_2c, min_2c+1) in each lane.
    pub(super) mins: [__m256i; 4],
    pub(super) d: __m256,
    pub(super) dmin: __m256,
}

/// A slice of a panel's eight rows, one [`PanelBlock`] per super-block.
pub(super) struct Panel {
    blocks: [MaybeUninit<PanelBlock>; SLICE_BLOCKS],
    len: usize,
}

impl Panel {
    #[inline(always)]
    pub(super) fn new() -> Panel {
        Panel {
            blocks: [const { MaybeUninit::uninit() }; SLICE_BLOCKS],
            len: 0,
        }
    }

    /// Packs super-blocks `slice` (at most [`SLICE_BLOCKS`]) of the eight `rows`, their quants
    /// by `quads` (which writes a [`PanelBlock::quads`] from eight super-blocks).
    #[inline(always)]
    pub(super) unsafe fn pack<I: Isa, B: K4Block>(
        &mut self,
        rows: [&[B]; PANEL_ROWS],
        slice: Range<usize>,
        quads: impl Fn([&B; PANEL_ROWS], *mut __m256i),
    ) {
        self.len = slice.len();
        for (j, i) in slice.enumerate() {
            let b = rows.map(|r| r.get_unchecked(i));
            let out = self.blocks[j].as_mut_ptr();
            // SAFETY: `out` points at a PanelBlock's storage; each field is written through
            // its own raw pointer, never read or referenced before it is whole.
            quads(b, std::ptr::addr_of_mut!((*out).quads).cast::<__m256i>());
            pack_scales::<I, B>(b, out);
        }
    }

    /// Super-blocks in the slice.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The slice's super-block `j` (written by `pack` for j < len).
    #[inline(always)]
    pub(super) unsafe fn block(&self, j: usize) -> &PanelBlock {
        self.blocks.get_unchecked(j).assume_init_ref()
    }
}

/// Q4_K's [`PanelBlock::quads`] of eight rows' super-blocks `b`, at `quads`: per chunk of 64
/// values, the 32 bytes of nibbles transposed and split.
#[inline(always)]
unsafe fn q4k_quads(b: [&BlockQ4K; PANEL_ROWS], quads: *mut __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    for c in 0..4 {
        // Byte l of qs[32c..32c+32] holds value l of sub-block 2c (low nibble) and of 2c+1.
        let t = transpose_8x8(b.map(|b| load256(b.qs.as_ptr().add(32 * c))));
        let (lo, hi) = (quads.add(8 * 2 * c), quads.add(8 * (2 * c + 1)));
        for (g, q) in t.into_iter().enumerate() {
            lo.add(g).write(_mm256_and_si256(q, m4));
            hi.add(g).write(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        }
    }
}

/// Writes the scales, mins, `d` and `dmin` of [`PanelBlock`] of eight rows' super-blocks `b`
/// into `out`, field by field (built whole and moved, its 2 KiB of quants would be copied).
#[inline(always)]
unsafe fn pack_scales<I: Isa, B: K4Block>(b: [&B; PANEL_ROWS], out: *mut PanelBlock) {
    // Per row, the eight scales then the eight mins as i16: i32 lane k < 4 is the scale pair of
    // chunk k, lane 4 + k its min pair; transposed, register k holds every row's pair k.
    let pairs = transpose_8x8(b.map(|b| {
        _mm256_cvtepu8_epi16(scales_mins_k4_x86(b.scales()))
    }));
    let scales = std::array::from_fn(|s| scale_lanes::<I>(pairs[s / 2], s % 2));
    // The halves as values, not through a `fn` pointer (which LLVM may leave as calls).
    let f16x8 = |h: [[u8; 2]; 8]| _mm256_cvtph_ps(f16_lanes(h));
    std::ptr::addr_of_mut!((*out).scales).write(scales);
    std::ptr::addr_of_mut!((*out).mins).write([pairs[4], pairs[5], pairs[6], pairs[7]]);
    std::ptr::addr_of_mut!((*out).d).write(f16x8(b.map(|b| b.d())));
    std::ptr::addr_of_mut!((*out).dmin).write(f16x8(b.map(|b| b.dmin())));
}

/// i16 `h` (0 or 1) of each i32 lane of `pair` in the form [`PanelBlock::scales`] keeps.
#[inline(always)]
unsafe fn scale_lanes<I: Isa>(pair: __m256i, h: usize) -> __m256i {
    if I::VNNI {
        let sc = if h == 0 {
            _mm256_and_si256(pair, _mm256_set1_epi32(0xFFFF))
        } else {
            _mm256_srli_epi32(pair, 16)
        };
        _mm256_castps_si256(_mm256_cvtepi32_ps(sc))
    } else if h == 0 {
        _mm256_or_si256(_mm256_and_si256(pair, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(pair, 16))
    } else {
        let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        _mm256_or_si256(_mm256_and_si256(pair, high), _mm256_srli_epi32(pair, 16))
    }
}

/// The micro-kernel: activation rows `k0..k0 + M` against the panel, each register of quants
/// loaded once for the `M` rows. `GEMV`: one FMA per chain and super-block (the gemv's chain),
/// otherwise one per 64-value chunk (the gemm's).
#[inline(always)]
unsafe fn tile<I: Isa, const M: usize, const GEMV: bool>(
    panel: &Panel,
    acts: &[&[BlockQ8K]],
    table: &ActTable,
    first_block: usize,
    k0: usize,
    acc: &mut [[__m256; 2]; MAX_ACTS],
) {
    let mut sums: [__m256; M] = std::array::from_fn(|t| acc.get_unchecked(k0 + t)[0]);
    let mut mins: [__m256; M] = std::array::from_fn(|t| acc.get_unchecked(k0 + t)[1]);
    for j in 0..panel.len() {
        let w = panel.block(j);
        let a: [*const i8; M] = std::array::from_fn(|t| {
            acts.get_unchecked(k0 + t).get_unchecked(first_block + j).qs.as_ptr()
        });
        // d_w·d_a and dmin_w·d_a, the products both chains scale by.
        let d_a: [__m256; M] = std::array::from_fn(|t| _mm256_set1_ps(table.d(k0 + t, j)));
        let d: [__m256; M] = std::array::from_fn(|t| _mm256_mul_ps(w.d, d_a[t]));
        let dmin: [__m256; M] = std::array::from_fn(|t| _mm256_mul_ps(w.dmin, d_a[t]));
        let mut total = [_mm256_setzero_si256(); M];
        let mut total_min = [_mm256_setzero_si256(); M];
        for c in 0..4 {
            let sumi = chunk_sums::<I, M>(w, a, c);
            for t in 0..M {
                let min_sum = _mm256_madd_epi16(w.mins[c], table.sub_sums(k0 + t, j, c));
                if GEMV {
                    total[t] = _mm256_add_epi32(total[t], exact_i32::<I>(sumi[t]));
                    total_min[t] = _mm256_add_epi32(total_min[t], min_sum);
                } else {
                    sums[t] = _mm256_fmadd_ps(exact_f32::<I>(sumi[t]), d[t], sums[t]);
                    mins[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sum), dmin[t], mins[t]);
                }
            }
        }
        if GEMV {
            for t in 0..M {
                sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[t]), d[t], sums[t]);
                mins[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total_min[t]), dmin[t], mins[t]);
            }
        }
    }
    for t in 0..M {
        *acc.get_unchecked_mut(k0 + t) = [sums[t], mins[t]];
    }
}

/// Chunk `c`'s scaled sums `sc_2c·S_2c + sc_2c+1·S_2c+1` of the panel's eight rows (lanes)
/// against each of the `M` activation super-blocks at `a`: as i32 on AVX2, as f32 under VNNI
/// (see [`vnni_chunk_sums`]); [`exact_f32`] and [`exact_i32`] take either form.
#[inline(always)]
unsafe fn chunk_sums<I: Isa, const M: usize>(
    w: &PanelBlock,
    a: [*const i8; M],
    c: usize,
) -> [__m256i; M] {
    if I::VNNI {
        vnni_chunk_sums::<I, M>(w, a, c)
    } else {
        avx2_chunk_sums::<M>(w, a, c)
    }
}

/// [`chunk_sums`] on AVX2: per sub-block, eight `maddubs` of a register of quants by four
/// activation bytes broadcast, added in i16 (each pair sum is at most 2·15·128 in magnitude, so
/// eight of them stay within 30720: no wrap), then one `madd` by the scale in both i16 of each
/// lane gives `sc·S` in i32.
#[inline(always)]
unsafe fn avx2_chunk_sums<const M: usize>(w: &PanelBlock, a: [*const i8; M], c: usize) -> [__m256i; M] {
    let mut out = [_mm256_setzero_si256(); M];
    for h in 0..2 {
        let s = 2 * c + h;
        let mut s16 = [_mm256_setzero_si256(); M];
        for (g, &q) in w.quads[s].iter().enumerate() {
            for t in 0..M {
                let a4 = a[t].add(32 * s + 4 * g).cast::<i32>().read_unaligned();
                s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(q, _mm256_set1_epi32(a4)));
            }
        }
        for t in 0..M {
            out[t] = _mm256_add_epi32(out[t], _mm256_madd_epi16(s16[t], w.scales[s]));
        }
    }
    out
}

/// [`chunk_sums`] under VNNI: per sub-block eight `vpdpbusd`s with an embedded broadcast give
/// `S` in i32, and the scales are applied in f32, which is exact here: `|S| ≤ 32·15·128` and
/// `sc ≤ 63`, so `sc·S` and the sum of two such are integers below 2^24, and
/// `fma(S_hi, sc_hi, S_lo·sc_lo)` is the integer sum's own conversion (no `vpmulld`). The f32
/// bits are returned in an integer register.
#[inline(always)]
pub(super) unsafe fn vnni_chunk_sums<I: Isa, const M: usize>(
    w: &PanelBlock,
    a: [*const i8; M],
    c: usize,
) -> [__m256i; M] {
    let (lo, hi) = (2 * c, 2 * c + 1);
    let mut s_lo = [_mm256_setzero_si256(); M];
    let mut s_hi = [_mm256_setzero_si256(); M];
    for g in 0..8 {
        let (q_lo, q_hi) = (w.quads[lo][g], w.quads[hi][g]);
        for t in 0..M {
            s_lo[t] = dpbusd_broadcast::<I>(s_lo[t], q_lo, a[t].add(32 * lo + 4 * g));
            s_hi[t] = dpbusd_broadcast::<I>(s_hi[t], q_hi, a[t].add(32 * hi + 4 * g));
        }
    }
    let (sc_lo, sc_hi) = (_mm256_castsi256_ps(w.scales[lo]), _mm256_castsi256_ps(w.scales[hi]));
    std::array::from_fn(|t| {
        let p_lo = _mm256_mul_ps(_mm256_cvtepi32_ps(s_lo[t]), sc_lo);
        _mm256_castps_si256(_mm256_fmadd_ps(_mm256_cvtepi32_ps(s_hi[t]), sc_hi, p_lo))
    })
}

/// A [`chunk_sums`] value as f32: the conversion of the i32 (AVX2), the exact f32 itself (VNNI).
#[inline(always)]
pub(super) unsafe fn exact_f32<I: Isa>(v: __m256i) -> __m256 {
    if I::VNNI {
        _mm256_castsi256_ps(v)
    } else {
        _mm256_cvtepi32_ps(v)
    }
}

/// A [`chunk_sums`] value as i32 (under VNNI an integer below 2^24 held exactly in f32, so the
/// conversion back is exact too).
#[inline(always)]
pub(super) unsafe fn exact_i32<I: Isa>(v: __m256i) -> __m256i {
    if I::VNNI {
        _mm256_cvtps_epi32(_mm256_castsi256_ps(v))
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use crate::quant::isa;
    use crate::quant::tests::{
        batch_equals_groups, quantized, random_activations, random_weights, runnable_isas, Rng,
    };
    use crate::quant::{DotOrder, GgmlType};

    use super::MAX_ACTS;

    /// The GEMMs on these panels (Q4_K repacked, Q5_K tiled in `panel_k5`) at their boundaries
    /// against llama.cpp's grouping, bit for bit, on every runnable instruction set: 70 weight
    /// rows (a group of 64 and a partial panel), 19 super-blocks (three slices, the last
    /// partial), a pass of [`MAX_ACTS`] activation rows then five (a gemm tile of four and, for
    /// Q4_K, one gemv row), one more than a pass, and 8..=11 rows (the smallest batch, each
    /// gemv rest).
    #[test]
    fn k4_panel_gemms_equal_grouping() {
        let mut rng = Rng(11);
        for (w, order) in [(GgmlType::Q4_K, DotOrder::Repacked), (GgmlType::Q5_K, DotOrder::Tiled)] {
            let n = 19 * 256;
            let rows: Vec<u8> = (0..70).flat_map(|_| random_weights(w, n, &mut rng)).collect();
            let acts: Vec<Vec<u8>> =
                (0..MAX_ACTS + 5).map(|_| quantized(w, &random_activations(n, &mut rng))).collect();
            for choice in runnable_isas() {
                for n_acts in [MAX_ACTS + 5, 8, 9, 10, 11, MAX_ACTS + 1] {
                    let checked = isa::forced(choice, || {
                        batch_equals_groups(w, order, n, &rows, &acts[..n_acts])
                    });
                    assert!(checked.is_ok(), "{} on {choice}", checked.unwrap_err());
                }
            }
        }
    }
}
