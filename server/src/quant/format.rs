//! What one format is: the traits each file in `formats/` implements, and the two the table
//! implements for it from its row.
//!
//! Every row is a [`Format`] (a block layout and its dequantisation). A weight row adds a
//! [`Weight`] (the scalar reference dot, the definition) and its [`Kernels`] (the AVX2 dots in
//! each of llama.cpp's float orders); the activation format it names is an [`Activation`] (a
//! quantiser bit-identical to llama.cpp's). None of their items has a default, so a format that
//! lacks one does not compile.

use super::blocks::Block;
use super::isa::{Avx2, Isa};
use super::{DotOrder, GgmlType};

/// The table's name for a format (implemented by `formats!`, never by hand).
pub trait Row {
    const TYPE: GgmlType;
}

/// What a weight row of the table says besides its name: the format activations are quantised
/// into before the dot (ggml's `vec_dot_type`) and the float orders other than vec_dot llama.cpp
/// uses for the type on AVX2 (see [`DotOrder::of`]). Implemented by `formats!`.
pub trait WeightRow: Format {
    type Act: Activation;
    const ORDERS: &'static [DotOrder];
}

/// The block of `W`'s activation format.
pub type ActBlock<W> = <<W as WeightRow>::Act as Format>::Block;

/// A block layout (`ggml-common.h`) and how it decodes.
pub trait Format: Row {
    /// The block, as a byte-array struct of alignment 1 (so rows need no alignment).
    type Block: Block;
    /// Values per block (`blck_size`); its bytes are `size_of::<Block>()` (`type_size`).
    const LEN: usize;
    /// The block's float fields (scales, or the values of a float format), so generators of
    /// random blocks for tests and benches can keep them finite.
    const FLOATS: &'static [Float];
    /// Writes the block's `LEN` values into `out`, as ggml's `dequantize_row_*`.
    fn dequantize(b: &Self::Block, out: &mut [f32]);
}

/// A float field of a block at a byte offset.
#[derive(Clone, Copy, Debug)]
pub enum Float {
    F16(usize),
    Bf16(usize),
    F32(usize),
    /// An f16 held in the top nibbles of the four little-endian u16 from the offset, the first
    /// u16's the f16's low nibble (IQ1_M's `d`, spread over its scales).
    F16Nibbles(usize),
}

/// A format activation rows are converted to before they are dotted with weights.
pub trait Activation: Format {
    /// How far, relatively, the block sums a dot takes from this format may be from the sum of
    /// its dequantised values (Q8_1's f16 `s`, by which weights with an offset multiply it); 0
    /// where a format stores none or they are exact (Q8_K's integer `bsums`). Read by the
    /// property tests.
    // Only the property tests read it.
    #[cfg_attr(not(test), allow(dead_code))]
    const SUM_ROUNDING: f64;
    /// Quantises `x` (a whole number of blocks) into `out`, bit-identical to llama.cpp's x86
    /// AVX2 quantiser for the format.
    fn quantize(x: &[f32], out: &mut [Self::Block]);
}

/// A weight format's scalar reference: the definition the SIMD kernels are held to.
pub trait Weight: WeightRow {
    /// Dot product of a weight row with an activation row of as many blocks, in llama.cpp's
    /// integer arithmetic (integer sums per block, one float multiply per block).
    fn dot_ref(w: &[Self::Block], a: &[ActBlock<Self>]) -> f32;
}

/// A weight format's SIMD kernels: AVX2/FMA in each format's file (the workspace targets
/// x86-64-v3); elsewhere the scalar reference stands in for both, in its one order (only the
/// SIMD kernels reproduce llama.cpp's others).
///
/// Each entry point is named by its shape, weight rows x activation rows: `dot_*` take weight
/// rows as block slices, `rows_*` any number R of consecutive weight rows as bytes (the
/// format's own loops over a whole matrix). "Exact" below means bit-identical to
/// [`Kernels::dot_1x1`] of the same rows in the same order, the definition every other entry
/// point is held to; `dot_1x1` itself is [`Weight::dot_ref`] in llama.cpp's float order.
///
/// | entry point   | shape | caller (in `quant`)                              | float order it guarantees                                   | default                           |
/// |---------------|-------|--------------------------------------------------|-------------------------------------------------------------|-----------------------------------|
/// | `dot_1x1`     | 1 x 1 | `vec_dot`; rows left over by the others          | llama.cpp's `order` (vec_dot's for an order the row lacks)  | none: every format writes it      |
/// | `dot_1x4`     | 1 x 4 | `rows_x4`'s default                              | exact, but repacked: llama.cpp's gemm                       | none ([`dot_1x4_by_1x1`] to use)  |
/// | `dot_1xn`     | 1 x N | `dot_rows_multi`; `rows_x8`'s default            | exact in every order                                        | N `dot_1x1`s                      |
/// | `dot_4xn`     | 4 x N | `dot_rows` (N = 1, quads `rows_x1` left); `dot_rows_multi` (free) | free: the format's own, the same for every N; others exact | [`dot_4xn_by_rows`] |
/// | `rows_x1`     | R x 1 | `dot_rows`                                       | each output `dot_4xn`'s                                     | writes no row                     |
/// | `rows_xn`     | R x N | `dot_rows_multi`, first, in every order          | each output `dot_4xn`'s                                     | writes no row                     |
/// | `rows_x4`     | R x 4 | `dot_rows_x4`                                    | each output `dot_1x4`'s                                     | [`rows_x4_by_row`]                |
/// | `rows_x8`     | R x 8 | `dot_rows_x8`                                    | each output what `rows_x4` gives it in its group of four    | [`rows_x8_by_row`]                |
/// | `rows_xbatch` | R x T | `dot_rows_batch`                                 | each output what the groups of 8 and 4 and single rows give | declines (returns false)          |
///
/// N is 2..=4 (`dot_1xn` also 8, for `rows_x8`; `dot_4xn` also 1). Four weight rows by one
/// activation row is `dot_4xn` with N = 1 rather than a method of its own, so the free order's
/// quads in `dot_rows_multi` give each stream what `dot_rows` alone gives it by construction.
pub trait Kernels<I: Isa = Avx2>: Weight {
    /// [`Weight::dot_ref`] in llama.cpp's float order `order`; an order the row does not list
    /// is vec_dot's.
    fn dot_1x1(w: &[Self::Block], a: &[ActBlock<Self>], order: DotOrder) -> f32;
    /// One weight row against four activation rows. In the vec_dot and tiled orders each result
    /// is bit-identical to [`Kernels::dot_1x1`]; repacked, it follows llama.cpp's gemm, which may
    /// sum in another order than its gemv.
    fn dot_1x4(w: &[Self::Block], a: [&[ActBlock<Self>]; 4], order: DotOrder) -> [f32; 4];
    /// Consecutive weight rows (`row_bytes` each) against four activation rows: prefill's
    /// matmul, `outs[k][i]` = row i · `a[k]`, each result bit-identical to
    /// [`Kernels::dot_1x4`] of its row. A format that overrides it keeps each output's chain and
    /// shares, across the rows, the work that depends only on the activations (their scales).
    #[inline(always)]
    fn rows_x4(
        rows: &[u8],
        row_bytes: usize,
        a: [&[ActBlock<Self>]; 4],
        order: DotOrder,
        outs: [&mut [f32]; 4],
    ) {
        rows_x4_by_row::<Self, I>(rows, row_bytes, a, order, outs);
    }
    /// [`Kernels::rows_x4`] for eight activation rows, `outs[k]` bit-identical to what
    /// `rows_x4` gives for activation row k in its group of four (0..4 or 4..8). The default
    /// unpacks each weight block once for all eight ([`Kernels::dot_1xn`]) in the vec_dot and
    /// tiled orders, where every output is its row's [`Kernels::dot_1x1`], and runs the two groups
    /// of four in the others.
    #[inline(always)]
    fn rows_x8(
        rows: &[u8],
        row_bytes: usize,
        a: [&[ActBlock<Self>]; 8],
        order: DotOrder,
        outs: [&mut [f32]; 8],
    ) {
        rows_x8_by_row::<Self, I>(rows, row_bytes, a, order, outs);
    }
    /// Consecutive weight rows against any number of activation rows (prefill's micro-batch):
    /// `outs[t][i]` = row i · `acts[t]`, each output bit-identical to what the groups of eight
    /// and four ([`Kernels::rows_x8`], [`Kernels::rows_x4`]) and the single rows give
    /// it. A format with a kernel for all the activation rows at once (in this order, on this
    /// instruction set) writes every output and returns true; the default writes nothing and
    /// returns false, and [`dot_rows_batch`](super::dot_rows_batch) takes the groups.
    #[inline(always)]
    fn rows_xbatch(
        _rows: &[u8],
        _row_bytes: usize,
        _acts: &[&[ActBlock<Self>]],
        _order: DotOrder,
        _outs: &mut [&mut [f32]],
    ) -> bool {
        false
    }
    /// Decode's mat-vec over consecutive weight rows by a kernel of the format's own that
    /// computes several rows together: `out[i]` = row i · `a` in `order`, each output what
    /// [`Kernels::dot_4xn`] gives it for one activation row. Returns how many of the first rows it wrote (whole
    /// groups); the default writes none, and [`dot_rows`](super::dot_rows) takes the rest four
    /// rows at a time.
    #[inline(always)]
    fn rows_x1(
        _rows: &[u8],
        _row_bytes: usize,
        _a: &[ActBlock<Self>],
        _order: DotOrder,
        _out: &mut [f32],
    ) -> usize {
        0
    }
    /// [`Kernels::rows_x1`] for `N` (2..=4) activation rows (a batch of streams):
    /// `outs[t][i]` = row i · `a[t]` in `order`, each what [`Kernels::dot_4xn`] gives it.
    /// Returns how many of the first rows it wrote (whole quads, or every row); the default
    /// writes none.
    #[inline(always)]
    fn rows_xn<const N: usize>(
        _rows: &[u8],
        _row_bytes: usize,
        _a: [&[ActBlock<Self>]; N],
        _order: DotOrder,
        _outs: &mut [&mut [f32]],
    ) -> usize {
        0
    }
    /// One weight row against `N` (2..=4) activation rows, result t bit-identical to
    /// `dot_1x1(w, a[t], order)` in every order: what [`dot_rows_multi`](super::dot_rows_multi)
    /// runs. A format that overrides it unpacks each weight block once for all `N` rows and
    /// keeps one accumulator per row that sees exactly the single-row operations.
    #[inline(always)]
    fn dot_1xn<const N: usize>(
        w: &[Self::Block],
        a: [&[ActBlock<Self>]; N],
        order: DotOrder,
    ) -> [f32; N] {
        a.map(|a| Self::dot_1x1(w, a, order))
    }
    /// Four weight rows (of equal length) against `N` (1..=4) activation rows: decode's
    /// mat-vec (N = 1) and a batch of decode streams (N > 1). In
    /// [`DotOrder::Free`] a format that overrides it may sum in its own float order, the same
    /// for every N (so a stream's results do not depend on what it is batched with); in every
    /// other order each result must be bit-identical to [`Kernels::dot_1x1`] (so a format
    /// shares the activation's loads and the rows' scale conversions, but keeps each row's
    /// chain). One method for both, so a format cannot give one row and several rows different
    /// orders by overriding only one of them.
    #[inline(always)]
    fn dot_4xn<const N: usize>(
        w: [&[Self::Block]; 4],
        a: [&[ActBlock<Self>]; N],
        order: DotOrder,
    ) -> [[f32; 4]; N] {
        dot_4xn_by_rows::<Self, I, N>(w, a, order)
    }
}

#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
)))]
impl<W: Weight, I: Isa> Kernels<I> for W {
    fn dot_1x1(w: &[Self::Block], a: &[ActBlock<Self>], _order: DotOrder) -> f32 {
        W::dot_ref(w, a)
    }

    fn dot_1x4(w: &[Self::Block], a: [&[ActBlock<Self>]; 4], _order: DotOrder) -> [f32; 4] {
        a.map(|a| W::dot_ref(w, a))
    }
}

/// [`Kernels::dot_1x4`] for formats without a four-row kernel: four [`Kernels::dot_1x1`]s.
#[inline(always)]
pub fn dot_1x4_by_1x1<W: Kernels<I>, I: Isa>(
    w: &[W::Block],
    a: [&[ActBlock<W>]; 4],
    order: DotOrder,
) -> [f32; 4] {
    a.map(|a| W::dot_1x1(w, a, order))
}

/// [`Kernels::dot_4xn`] for formats without a four-row kernel, or in the orders theirs does not
/// cover: each weight row's [`Kernels::dot_1x1`] for one activation row, its
/// [`Kernels::dot_1xn`] (which unpacks each weight block once for all) for several.
#[inline(always)]
pub fn dot_4xn_by_rows<W: Kernels<I> + ?Sized, I: Isa, const N: usize>(
    w: [&[W::Block]; 4],
    a: [&[ActBlock<W>]; N],
    order: DotOrder,
) -> [[f32; 4]; N] {
    if N == 1 {
        std::array::from_fn(|t| w.map(|w| W::dot_1x1(w, a[t], order)))
    } else {
        let per_row = w.map(|w| W::dot_1xn(w, a, order));
        std::array::from_fn(|t| per_row.map(|r| r[t]))
    }
}

/// [`Kernels::rows_x4`] as one [`Kernels::dot_1x4`] per row (the default, and the fallback of
/// the formats' own where their scratch is too small for a row).
#[inline(always)]
pub fn rows_x4_by_row<W: Kernels<I> + ?Sized, I: Isa>(
    rows: &[u8],
    row_bytes: usize,
    a: [&[ActBlock<W>]; 4],
    order: DotOrder,
    outs: [&mut [f32]; 4],
) {
    let [o0, o1, o2, o3] = outs;
    for (i, row) in rows.chunks_exact(row_bytes).enumerate() {
        [o0[i], o1[i], o2[i], o3[i]] = W::dot_1x4(super::blocks::blocks(row), a, order);
    }
}

/// [`Kernels::rows_x8`]'s default (and the fallback of formats that override it for one
/// order): [`Kernels::dot_1xn`] per row in the vec_dot and tiled orders, the two groups of four
/// through [`Kernels::rows_x4`] in the others.
#[inline(always)]
pub fn rows_x8_by_row<W: Kernels<I> + ?Sized, I: Isa>(
    rows: &[u8],
    row_bytes: usize,
    a: [&[ActBlock<W>]; 8],
    order: DotOrder,
    outs: [&mut [f32]; 8],
) {
    match order {
        DotOrder::VecDot | DotOrder::Tiled => {
            rows_by_1xn::<W, I, 8>(rows, row_bytes, a, order, outs)
        }
        _ => {
            let [o0, o1, o2, o3, o4, o5, o6, o7] = outs;
            let [a0, a1, a2, a3, a4, a5, a6, a7] = a;
            W::rows_x4(rows, row_bytes, [a0, a1, a2, a3], order, [o0, o1, o2, o3]);
            W::rows_x4(rows, row_bytes, [a4, a5, a6, a7], order, [o4, o5, o6, o7]);
        }
    }
}

/// Consecutive weight rows against `N` activation rows by one [`Kernels::dot_1xn`] per weight row:
/// `outs[k][i]` = row i · `a[k]`, each its row's `dot` in `order`.
#[inline(always)]
pub fn rows_by_1xn<W: Kernels<I> + ?Sized, I: Isa, const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    a: [&[ActBlock<W>]; N],
    order: DotOrder,
    mut outs: [&mut [f32]; N],
) {
    for (i, row) in rows.chunks_exact(row_bytes).enumerate() {
        let got = W::dot_1xn(super::blocks::blocks(row), a, order);
        for (o, v) in outs.iter_mut().zip(got) {
            o[i] = v;
        }
    }
}
