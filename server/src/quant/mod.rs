//! Tensor types and their kernels, as ggml's type-traits table in Rust's idiom: one row of the
//! `formats!` table below per type, one file per format under `formats/` holding its block, its
//! scalar reference (the definition tests hold the SIMD kernels to) and its AVX2/FMA kernels,
//! which do llama.cpp's arithmetic in llama.cpp's float orders.
//!
//! Matmuls never dequantise weights: the activation row is quantised once per matmul into the
//! weight type's [`vec_dot_type`] (Q8_0 or Q8_K, as llama.cpp does) and dotted in integers.
//!
//! # Adding a format
//! Add one row to the table and one file, `formats/<module>.rs`, that declares the block with
//! `block!` and implements [`Format`](format::Format) for it and, for a weight,
//! [`Weight`](format::Weight) (the scalar reference) and [`Kernels`](format::Kernels) (the AVX2
//! dots, inside `avx2! { .. }`); a new activation format implements
//! [`Activation`](format::Activation). The row generates the rest: the enum variant, id and
//! name, sizes, `SUPPORTED`, the activation buffer in the matmul, the dispatch of every function
//! here, and the format's place in the property tests and the kernel bench, which walk the table.
//! None of the traits' items has a default, so a format lacking a kernel, a reference or a
//! quantiser does not compile, rather than falling back silently. (A type ggml has that we did
//! not implement is also named in `types.rs` for error messages; a test fails while a row
//! still is.) Q4_1 and Q8_1 were added this way, then Q5_1, Q3_K, Q2_K, TQ2_0, TQ1_0, IQ3_S and
//! the importance-matrix types IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ2_S and IQ1_M.

/// Items compiled only for x86-64-v3 (AVX2, FMA, F16C: the workspace's target); elsewhere the
/// scalar references stand in for the kernels.
macro_rules! avx2 {
    ($($item:item)*) => {
        $(
            #[cfg(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma",
                target_feature = "f16c"
            ))]
            $item
        )*
    };
}

#[macro_use]
mod table;
mod blocks;
mod format;
pub mod isa;
mod scalar;
avx2! {
    mod simd;
}

use blocks::{blocks, blocks_mut};
use format::{ActBlock, Format, Kernels, Weight, WeightRow};
use isa::{with_isa, Isa};
use smallvec::SmallVec;

formats! {
    // Model tensor types. `orders`: llama.cpp's float orders for the type besides vec_dot
    // (see `DotOrder::of`).
    weights {
        // type  ggml id name      format (formats/*.rs) activations  orders
        F32    =  0,  "f32",     f32::F32,        f32::F32,     [];
        F16    =  1,  "f16",     f16::F16,        f16::F16,     [];
        BF16   = 30,  "bf16",    bf16::Bf16,      bf16::Bf16,   [];
        Q4_0   =  2,  "q4_0",    q4_0::Q4_0,      q8_0::Q8_0,   [Repacked];
        Q4_1   =  3,  "q4_1",    q4_1::Q4_1,      q8_1::Q8_1,   [];
        Q5_0   =  6,  "q5_0",    q5_0::Q5_0,      q8_0::Q8_0,   [];
        Q5_1   =  7,  "q5_1",    q5_1::Q5_1,      q8_1::Q8_1,   [];
        Q8_0   =  8,  "q8_0",    q8_0::Q8_0,      q8_0::Q8_0,   [];
        Q2_K   = 10,  "q2_K",    q2_k::Q2K,       q8_k::Q8K,    [Tiled];
        Q3_K   = 11,  "q3_K",    q3_k::Q3K,       q8_k::Q8K,    [Tiled];
        Q4_K   = 12,  "q4_K",    q4_k::Q4K,       q8_k::Q8K,    [Repacked, Tiled];
        Q5_K   = 13,  "q5_K",    q5_k::Q5K,       q8_k::Q8K,    [Tiled];
        Q6_K   = 14,  "q6_K",    q6_k::Q6K,       q8_k::Q8K,    [Tiled];
        TQ1_0  = 34,  "tq1_0",   tq1_0::Tq1_0,    q8_k::Q8K,    [];
        TQ2_0  = 35,  "tq2_0",   tq2_0::Tq2_0,    q8_k::Q8K,    [];
        IQ2_XXS = 16, "iq2_xxs", iq2_xxs::Iq2Xxs, q8_k::Q8K,    [];
        IQ2_XS = 17,  "iq2_xs",  iq2_xs::Iq2Xs,   q8_k::Q8K,    [];
        IQ3_XXS = 18, "iq3_xxs", iq3_xxs::Iq3Xxs, q8_k::Q8K,    [];
        IQ1_S  = 19,  "iq1_s",   iq1_s::Iq1S,     q8_k::Q8K,    [];
        IQ2_S  = 22,  "iq2_s",   iq2_s::Iq2S,     q8_k::Q8K,    [];
        IQ1_M  = 29,  "iq1_m",   iq1_m::Iq1M,     q8_k::Q8K,    [];
        IQ3_S  = 21,  "iq3_s",   iq3_s::Iq3S,     q8_k::Q8K,    [Tiled];
        IQ4_NL = 20,  "iq4_nl",  iq4_nl::Iq4Nl,   q8_0::Q8_0,   [Repacked];
        IQ4_XS = 23,  "iq4_xs",  iq4_xs::Iq4Xs,   q8_k::Q8K,    [Tiled];
    }
    // Formats only activations are quantised into.
    activations {
        Q8_1   =  9,  "q8_1",    q8_1::Q8_1;
        Q8_K   = 15,  "q8_K",    q8_k::Q8K;
    }
}

mod random;
#[cfg(test)]
pub(crate) mod tests;
mod types;

pub use random::random_row;

/// The format activations are converted to before they are dotted with weights of type `w`
/// (ggml's `type_traits_cpu[w].vec_dot_type`).
pub fn vec_dot_type(w: GgmlType) -> GgmlType {
    with_weight!(w, W => act_type::<W>())
}

fn act_type<W: WeightRow>() -> GgmlType {
    <W::Act as format::Row>::TYPE
}

/// Which of llama.cpp's kernel families computes a matmul's products. They sum in different
/// float orders, and a last-bit difference in one layer moves the next layer's quantisation, so
/// parity needs the family llama.cpp picks for every matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DotOrder {
    /// The row-by-row `ggml_vec_dot_*` kernels.
    VecDot,
    /// ggml's tiled K-quant matmul (ggml-cpu/tiled): per super-block `d_w·Σ` then one scalar FMA
    /// by `d_a`, super-block after super-block.
    Tiled,
    /// The CPU_REPACK buffer's `ggml_gemv_*_8x8` (single activation rows) and `ggml_gemm_*_8x8`
    /// (groups of 4) kernels (ggml/src/ggml-cpu/arch/x86/repack.cpp). llama.cpp interleaves 8
    /// rows so one kernel computes 8 outputs per pass, each as one scalar FMA chain over the
    /// blocks, with no 8-lane accumulator and horizontal sum. Parity needs that order; it does
    /// not need the interleaved copy (the integer block sums are exact in any order), so the
    /// weights stay zero-copy and each output is computed from its own row.
    ///
    /// The activations need no special care: the 4-row quantisers those kernels read
    /// (`ggml_quantize_mat_q8_0_4x8`, `ggml_quantize_mat_q8_K_4x8`) produce the same d and quants
    /// as the row quantisers (Q8_K may flip the sign of both d and the quants when +max and -max
    /// tie, which leaves every product unchanged), and bsums are plain sums.
    Repacked,
    /// No order to keep: the matrix's outputs are final (the output matrix, whose results are
    /// the logits), so a rounding difference goes nowhere but into them, where the golden rule
    /// (testdata/README.md) bounds it. Single activation rows take the formats' four-row
    /// kernels ([`Kernels::dot_4xn`](format::Kernels::dot_4xn)); otherwise as vec_dot.
    /// Every other matmul keeps llama.cpp's order: each layer's outputs are quantised again
    /// for the next matmul, and on the default model a last-bit difference there grows into
    /// logit errors of 0.8 (measured with the four-row kernels on every Q5_0/Q8_0 matrix).
    Free,
}

impl DotOrder {
    /// The family llama.cpp on AVX2 uses for a `w` matrix of `rows` outputs multiplied by
    /// `act_rows` activation rows at once, among the orders `w`'s row of the table lists:
    /// - A repacked type is repacked when its rows come in whole groups of 8
    ///   (`ggml_repack_get_optimal_repack_type`, ggml/src/ggml-cpu/repack.cpp). That includes an
    ///   output matrix tied to the embedding: llama.cpp loads the tie as a separate, repackable
    ///   copy (TENSOR_DUPLICATED), while the embedding itself (read by GET_ROWS) is not.
    /// - A tiled type (a K-quant) otherwise takes the tiled kernel over at least 8 activation
    ///   rows (`ggml_tiled_min_batch`).
    /// - Everything else goes row by row through vec_dot.
    pub fn of(w: GgmlType, rows: usize, act_rows: usize) -> DotOrder {
        let orders = with_weight!(w, W => <W as WeightRow>::ORDERS);
        if orders.contains(&DotOrder::Repacked) && rows.is_multiple_of(8) {
            DotOrder::Repacked
        } else if orders.contains(&DotOrder::Tiled) && act_rows >= 8 {
            DotOrder::Tiled
        } else {
            DotOrder::VecDot
        }
    }
}

/// `body` with `$o` bound to `order`, once per order (`with_order!(order, order => ..)`
/// shadows it): each arm binds a constant, so the loops
/// `body` inlines are compiled once per order and the kernels' choice of order (their
/// `match order`) is made outside the loops rather than per row.
macro_rules! with_order {
    ($order:expr, $o:ident => $body:expr) => {
        match $order {
            $crate::quant::DotOrder::VecDot => {
                let $o = $crate::quant::DotOrder::VecDot;
                $body
            }
            $crate::quant::DotOrder::Tiled => {
                let $o = $crate::quant::DotOrder::Tiled;
                $body
            }
            $crate::quant::DotOrder::Repacked => {
                let $o = $crate::quant::DotOrder::Repacked;
                $body
            }
            $crate::quant::DotOrder::Free => {
                let $o = $crate::quant::DotOrder::Free;
                $body
            }
        }
    };
}

/// Converts `x` into the activation format of weights of type `w` ([`vec_dot_type`]) in `out`,
/// which must hold exactly that format's bytes for `x.len()` values. Bit-identical to llama.cpp's
/// x86 AVX2 quantisers.
///
/// Panics when `out` has the wrong length: a bug in the caller, which sizes its scratch buffers
/// from the model's validated shapes.
pub fn quantize_row_for(w: GgmlType, x: &[f32], out: &mut [u8]) {
    check_row_len("quantize_row_for", vec_dot_type(w), x.len(), out.len());
    with_weight!(w, W => quantize_act::<W>(x, out))
}

fn quantize_act<W: WeightRow>(x: &[f32], out: &mut [u8]) {
    <W::Act as format::Activation>::quantize(x, blocks_mut(out));
}

/// Dot product of one weight row of type `w` (n values) with an activation row already in
/// `vec_dot_type(w)`, in the float order `order`. Uses the SIMD kernel.
///
/// Panics when either row does not hold exactly `n` values (a caller bug).
#[inline]
pub fn vec_dot(w: GgmlType, order: DotOrder, n: usize, w_row: &[u8], act: &[u8]) -> f32 {
    check_row_len("vec_dot (weights)", w, n, w_row.len());
    check_row_len("vec_dot (activations)", vec_dot_type(w), n, act.len());
    with_isa!(I => with_weight!(w, W => <W as Kernels<I>>::dot_1x1(blocks(w_row), blocks(act), order)))
}

/// [`vec_dot`] by the scalar reference (the definition; one float order).
pub fn vec_dot_ref(w: GgmlType, n: usize, w_row: &[u8], act: &[u8]) -> f32 {
    check_row_len("vec_dot_ref (weights)", w, n, w_row.len());
    check_row_len("vec_dot_ref (activations)", vec_dot_type(w), n, act.len());
    with_weight!(w, W => W::dot_ref(blocks(w_row), blocks(act)))
}

/// Dots each of the consecutive weight rows in `rows` (type `w`, `n` values each) with one
/// activation row, writing `out[i]` for row i, in the float order `order` (a single-row gemv
/// when repacked). The hot loop of every matmul: lengths are checked once per call, not per row.
pub fn dot_rows(w: GgmlType, order: DotOrder, n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    let row_bytes = w
        .row_bytes(n)
        .filter(|&b| b > 0 && rows.len() == b * out.len());
    let Some(row_bytes) = row_bytes else {
        panic!(
            "dot_rows: {} bytes are not {} {w} rows of {n} values",
            rows.len(),
            out.len()
        );
    };
    check_row_len("dot_rows (activations)", vec_dot_type(w), n, act.len());
    with_isa!(I => with_weight!(w, W => with_order!(order, order => {
        gemv_of::<W, I>(order, row_bytes, rows, blocks(act), out)
    })))
}

/// The rows of [`dot_rows`] by the format's own mat-vec ([`Kernels::rows_x1`]) as far as it
/// goes, the rest by [`rows_4_of`].
#[inline(always)]
fn gemv_of<W: Kernels<I>, I: Isa>(
    order: DotOrder,
    row_bytes: usize,
    rows: &[u8],
    act: &[ActBlock<W>],
    out: &mut [f32],
) {
    let done = W::rows_x1(rows, row_bytes, act, order, out);
    rows_4_of::<W, I>(
        order,
        row_bytes,
        &rows[done * row_bytes..],
        act,
        &mut out[done..],
    );
}

/// The rows of [`dot_rows`], four at a time through the format's four-row kernel
/// ([`Kernels::dot_4xn`] with one activation row), which shares the activation's loads; the last `len % 4` rows one by
/// one. In [`DotOrder::Free`] a row's result depends on its index only, not on how a matmul
/// splits the rows, as long as the split is into multiples of four; in the other orders every
/// row is its own [`Kernels::dot_1x1`].
#[inline(always)]
fn rows_4_of<W: Kernels<I>, I: Isa>(
    order: DotOrder,
    row_bytes: usize,
    rows: &[u8],
    act: &[ActBlock<W>],
    out: &mut [f32],
) {
    let quads = rows.chunks_exact(4 * row_bytes);
    let rest = quads.remainder();
    let mut outs = out.chunks_exact_mut(4);
    for (i, (quad, o)) in quads.zip(&mut outs).enumerate() {
        let ahead = (i + 1) * 4 * row_bytes + PREFETCH_ROWS * row_bytes;
        if let Some(ahead) = rows.get(ahead..ahead + 4 * row_bytes) {
            prefetch(ahead);
        }
        let row = |k: usize| blocks::<W::Block>(&quad[k * row_bytes..(k + 1) * row_bytes]);
        let [got] = W::dot_4xn([row(0), row(1), row(2), row(3)], [act], order);
        o.copy_from_slice(&got);
    }
    for (row, o) in rest.chunks_exact(row_bytes).zip(outs.into_remainder()) {
        *o = W::dot_1x1(blocks(row), act, order);
    }
}

/// How far ahead [`dot_rows`] asks for weight rows. Decode streams every weight from memory once
/// per token; requesting the row two ahead keeps more loads in flight than the hardware
/// prefetcher alone.
const PREFETCH_ROWS: usize = 2;

/// Asks the CPU to start loading `bytes` into L2 (`prefetcht1`), for rows read a while ahead: on
/// Intel a prefetch into L1 holds one of its few fill buffers until the line arrives, which the
/// kernels' own loads then wait for, where L2's queue is deeper. AMD's optimisation guides have
/// the T0/T1/T2 hints all load into L1 before Zen 4, so the appliance's Zen 1 sees no change.
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T1 }>(bytes);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Asks the CPU to load `bytes` into L1 (`prefetcht0`), for lines a kernel reads within a few
/// hundred cycles: prefill's next GEMM panel. Decode's requests go to L2 ([`prefetch`]; see
/// `simd::request_next`).
#[inline(always)]
pub(crate) fn prefetch_l1(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Bytes per cache line on the x86-64 CPUs we run on: the step of the prefetch requests.
pub(crate) const CACHE_LINE: usize = 64;

/// One prefetch per [`CACHE_LINE`] bytes of `bytes` and one for its last byte: the slice need
/// not start a line, so its last line can lie past the last step.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<const HINT: i32>(bytes: &[u8]) {
    let p = bytes.as_ptr().cast::<i8>();
    // SAFETY: a prefetch only hints the cache and never faults; the offsets are in bounds.
    unsafe {
        for offset in (0..bytes.len()).step_by(CACHE_LINE) {
            std::arch::x86_64::_mm_prefetch::<HINT>(p.add(offset));
        }
        if let Some(last) = bytes.len().checked_sub(1) {
            std::arch::x86_64::_mm_prefetch::<HINT>(p.add(last));
        }
    }
}

/// [`dot_rows`] for four activation rows at once: `outs[k][i]` = row i · `acts[k]`, by the
/// format's [`Kernels::rows_x4`]: its four-row kernel ([`Kernels::dot_1x4`]) row by row,
/// or, for the 32-value formats, a kernel tiled over all the rows that converts the activation
/// scales once. In the vec_dot and tiled orders results are bit-identical to four [`dot_rows`]
/// calls; repacked, they follow llama.cpp's gemm, which for Q4_K sums in another order than its
/// gemv.
pub fn dot_rows_x4(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    rows: &[u8],
    acts: [&[u8]; 4],
    outs: [&mut [f32]; 4],
) {
    let row_bytes = checked_rows(
        "dot_rows_x4",
        "dot_rows_x4 (activations)",
        w,
        n,
        rows,
        &acts,
        &outs,
    );
    with_isa!(I => with_weight!(w, W => with_order!(order, order => {
        rows_x4_of::<W, I>(order, row_bytes, rows, acts, outs)
    })))
}

/// [`dot_rows_x4`] for eight activation rows at once, `outs[k]` bit-identical to what
/// `dot_rows_x4` gives for row k in its group of four (0..4 or 4..8), in every order: prefill
/// reads and unpacks each weight block once for eight activation rows where the format can
/// ([`Kernels::rows_x8`]).
pub fn dot_rows_x8(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    rows: &[u8],
    acts: [&[u8]; 8],
    outs: [&mut [f32]; 8],
) {
    let row_bytes = checked_rows(
        "dot_rows_x8",
        "dot_rows_x8 (activations)",
        w,
        n,
        rows,
        &acts,
        &outs,
    );
    with_isa!(I => with_weight!(w, W => with_order!(order, order => {
        rows_x8_of::<W, I>(order, row_bytes, rows, acts, outs)
    })))
}

#[inline(always)]
fn rows_x8_of<W: Kernels<I>, I: Isa>(
    order: DotOrder,
    row_bytes: usize,
    rows: &[u8],
    acts: [&[u8]; 8],
    outs: [&mut [f32]; 8],
) {
    W::rows_x8(
        rows,
        row_bytes,
        acts.map(blocks::<ActBlock<W>>),
        order,
        outs,
    );
}

#[inline(always)]
fn rows_x4_of<W: Kernels<I>, I: Isa>(
    order: DotOrder,
    row_bytes: usize,
    rows: &[u8],
    acts: [&[u8]; 4],
    outs: [&mut [f32]; 4],
) {
    W::rows_x4(
        rows,
        row_bytes,
        acts.map(blocks::<ActBlock<W>>),
        order,
        outs,
    );
}

/// Prefill's matmul: `outs[t][i]` = row i · `acts[t]` for every activation row of a
/// micro-batch, as llama.cpp's matmul groups them (eights and fours from the first, the rest
/// one by one, which matters where its gemm and gemv orders differ): each output is
/// bit-identical to what [`dot_rows_x8`], [`dot_rows_x4`] and [`dot_rows`] give it. Formats with
/// a kernel for the whole batch ([`Kernels::rows_xbatch`]: Q4_0, IQ4_NL and Q4_K repacked,
/// IQ4_XS tiled, Q6_K tiled under VNNI) take it; the others go through those groups.
///
/// Panics as [`dot_rows_multi`] does.
pub fn dot_rows_batch(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    rows: &[u8],
    acts: &[&[u8]],
    outs: &mut [&mut [f32]],
) {
    assert_eq!(
        acts.len(),
        outs.len(),
        "dot_rows_batch: {} activation rows but {} outputs",
        acts.len(),
        outs.len()
    );
    let row_bytes = checked_rows(
        "dot_rows_batch",
        "dot_rows_batch (activations)",
        w,
        n,
        rows,
        acts,
        outs,
    );
    let whole = with_isa!(I => with_weight!(w, W => {
        let acts: SmallVec<[&[ActBlock<W>]; 32]> = acts.iter().map(|a| blocks(a)).collect();
        <W as Kernels<I>>::rows_xbatch(rows, row_bytes, &acts, order, outs)
    }));
    if whole {
        return;
    }
    let mut t = 0;
    while t + 8 <= acts.len() {
        let mut o = outs[t..t + 8].iter_mut();
        let o = std::array::from_fn(|_| &mut **o.next().expect("eight outputs"));
        dot_rows_x8(w, order, n, rows, std::array::from_fn(|i| acts[t + i]), o);
        t += 8;
    }
    while t + 4 <= acts.len() {
        let mut o = outs[t..t + 4].iter_mut();
        let o = std::array::from_fn(|_| &mut **o.next().expect("four outputs"));
        dot_rows_x4(w, order, n, rows, std::array::from_fn(|i| acts[t + i]), o);
        t += 4;
    }
    for (a, o) in acts[t..].iter().zip(&mut outs[t..]) {
        dot_rows(w, order, n, rows, a, o);
    }
}

/// The most activation rows [`dot_rows_multi`] puts through one group of kernels, each weight
/// block read and unpacked once for all of them.
pub const STREAM_GROUP: usize = 4;

/// [`dot_rows`] for several activation rows at once (a batch of decode streams, or the tokens a
/// speculative step verifies): `outs[t][i]` = row i · `acts[t]`, **bit-identical** to
/// `dot_rows(w, order, n, rows, acts[t], outs[t])` for every t and every order, so a stream's
/// results do not depend on what it is batched with. Activation rows go in groups of up to
/// four; in each group every weight block is read and unpacked once for all of them (by
/// [`Kernels::dot_1xn`] and [`Kernels::dot_4xn`] where the format has its own, by one
/// [`Kernels::dot_1x1`] per row elsewhere), which is what makes a second stream cheap.
///
/// Panics when `acts` and `outs` differ in length or a row does not hold `n` values (a caller
/// bug, as for [`dot_rows`]).
///
/// A group is at most [`STREAM_GROUP`] rows: past that, each further group costs the
/// arithmetic of a pass of its own over the same weights.
pub fn dot_rows_multi(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    rows: &[u8],
    acts: &[&[u8]],
    outs: &mut [&mut [f32]],
) {
    assert_eq!(
        acts.len(),
        outs.len(),
        "dot_rows_multi: {} activation rows but {} outputs",
        acts.len(),
        outs.len()
    );
    let row_bytes = checked_rows(
        "dot_rows_multi",
        "dot_rows_multi (activations)",
        w,
        n,
        rows,
        acts,
        outs,
    );
    for (acts, outs) in acts.chunks(STREAM_GROUP).zip(outs.chunks_mut(STREAM_GROUP)) {
        with_isa!(I => with_weight!(w, W => match acts.len() {
            1 => dot_rows(w, order, n, rows, acts[0], outs[0]),
            2 => rows_n_in::<W, I, 2>(order, row_bytes, rows, acts, outs),
            3 => rows_n_in::<W, I, 3>(order, row_bytes, rows, acts, outs),
            _ => rows_n_in::<W, I, 4>(order, row_bytes, rows, acts, outs),
        }))
    }
}

/// One group of [`dot_rows_multi`], the order chosen outside the loops as in [`dot_rows`]: the
/// format's own mat-vec first, as far as it goes ([`Kernels::rows_xn`]: whole quads, or all),
/// then the rest in quads in the free order (so each output is the one a single-row call
/// computes) and row by row in the others (each row's [`Kernels::dot_1xn`], the exact chains of
/// [`Kernels::dot_1x1`]).
#[inline(always)]
fn rows_n_in<W: Kernels<I>, I: Isa, const N: usize>(
    order: DotOrder,
    row_bytes: usize,
    rows: &[u8],
    acts: &[&[u8]],
    outs: &mut [&mut [f32]],
) {
    let acts: [&[ActBlock<W>]; N] = std::array::from_fn(|t| blocks(acts[t]));
    with_order!(order, order => {
        let done = W::rows_xn(rows, row_bytes, acts, order, outs);
        if order == DotOrder::Free {
            rows_4_n_from::<W, I, N>(done, row_bytes, rows, acts, outs)
        } else {
            rows_n_from::<W, I, N>(done, order, row_bytes, rows, acts, outs)
        }
    })
}

/// Weight bytes [`gemv_slabs`] reads per slab: small enough to be in L2 still for the next
/// activation row, large enough that the mat-vec's requests ahead, which stop at a slab's end,
/// start again seldom.
const SLAB_BYTES: usize = 64 << 10;

/// A [`Kernels::rows_xn`] in the repacked order for rows that a format's several-stream
/// mat-vec cannot take (Q4_0's and IQ4_NL's rows wider than `gemv_nibbles::rows_n`'s table),
/// where the one-row dot costs a horizontal sum per block (row by row, a pass of several streams
/// cost more than as many single passes): each activation row takes [`dot_rows`]' own mat-vec
/// ([`gemv_of`]) over one slab of rows after the other, the slab read from memory by the first
/// and from cache by the rest. Exact however the rows are split, as every row is its own
/// [`Kernels::dot_1x1`] in this order. Writes every row; returns their count.
#[inline(always)]
pub(crate) fn gemv_slabs<W: Kernels<I>, I: Isa, const N: usize>(
    order: DotOrder,
    row_bytes: usize,
    rows: &[u8],
    acts: [&[ActBlock<W>]; N],
    outs: &mut [&mut [f32]],
) -> usize {
    let slab = (SLAB_BYTES / row_bytes).max(8).next_multiple_of(8);
    let n_rows = rows.len() / row_bytes;
    for first in (0..n_rows).step_by(slab) {
        let end = (first + slab).min(n_rows);
        let part = &rows[first * row_bytes..end * row_bytes];
        for (act, out) in acts.iter().zip(outs.iter_mut()) {
            gemv_of::<W, I>(order, row_bytes, part, act, &mut out[first..end]);
        }
    }
    n_rows
}

/// [`rows_n_in`]'s loop in the orders other than free, row by row from row `first`.
#[inline(always)]
fn rows_n_from<W: Kernels<I>, I: Isa, const N: usize>(
    first: usize,
    order: DotOrder,
    row_bytes: usize,
    rows: &[u8],
    acts: [&[ActBlock<W>]; N],
    outs: &mut [&mut [f32]],
) {
    for (i, row) in rows.chunks_exact(row_bytes).enumerate().skip(first) {
        if let Some(ahead) =
            rows.get((i + PREFETCH_ROWS) * row_bytes..(i + PREFETCH_ROWS + 1) * row_bytes)
        {
            prefetch(ahead);
        }
        for (o, v) in outs.iter_mut().zip(W::dot_1xn(blocks(row), acts, order)) {
            o[i] = v;
        }
    }
}

/// [`rows_n_in`]'s loop in the free order from row `first` (a whole number of quads): the same
/// quads of weight rows as [`rows_4_of`]'s.
#[inline(always)]
fn rows_4_n_from<W: Kernels<I>, I: Isa, const N: usize>(
    first: usize,
    row_bytes: usize,
    rows: &[u8],
    acts: [&[ActBlock<W>]; N],
    outs: &mut [&mut [f32]],
) {
    let order = DotOrder::Free;
    let quads = rows.chunks_exact(4 * row_bytes);
    let rest = quads.remainder();
    let n_quads = rows.len() / (4 * row_bytes);
    for (q, quad) in quads.enumerate().skip(first / 4) {
        let ahead = (q + 1) * 4 * row_bytes + PREFETCH_ROWS * row_bytes;
        if let Some(ahead) = rows.get(ahead..ahead + 4 * row_bytes) {
            prefetch(ahead);
        }
        let row = |k: usize| blocks::<W::Block>(&quad[k * row_bytes..(k + 1) * row_bytes]);
        let got = W::dot_4xn([row(0), row(1), row(2), row(3)], acts, order);
        for (o, v) in outs.iter_mut().zip(got) {
            o[4 * q..4 * q + 4].copy_from_slice(&v);
        }
    }
    for (r, row) in rest.chunks_exact(row_bytes).enumerate() {
        let i = 4 * n_quads + r;
        for (o, v) in outs.iter_mut().zip(W::dot_1xn(blocks(row), acts, order)) {
            o[i] = v;
        }
    }
}

/// The bytes of one weight row of [`dot_rows_x4`], [`dot_rows_x8`] and [`dot_rows_multi`], after
/// checking that `rows` holds as many `w` rows of `n` values as every output has elements and
/// that every activation row holds `n` values. Panics naming `what` (`acts_what` for an
/// activation row) otherwise: a caller bug.
fn checked_rows(
    what: &str,
    acts_what: &str,
    w: GgmlType,
    n: usize,
    rows: &[u8],
    acts: &[&[u8]],
    outs: &[&mut [f32]],
) -> usize {
    let n_rows = outs.first().map_or(0, |o| o.len());
    let row_bytes = w
        .row_bytes(n)
        .filter(|&b| b > 0 && outs.iter().all(|o| rows.len() == b * o.len()));
    let Some(row_bytes) = row_bytes else {
        panic!(
            "{what}: {} bytes are not {n_rows} {w} rows of {n} values",
            rows.len()
        );
    };
    for a in acts {
        check_row_len(acts_what, vec_dot_type(w), n, a.len());
    }
    row_bytes
}

/// Dequantises one row of type `ty` (e.g. an embedding row) into `out` (length n).
///
/// Panics when `row` does not hold exactly `out.len()` values (a caller bug).
pub fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    check_row_len("dequantize_row", ty, out.len(), row.len());
    with_format!(ty, F => dequantize_blocks::<F>(row, out))
}

fn dequantize_blocks<F: Format>(row: &[u8], out: &mut [f32]) {
    for (b, y) in blocks::<F::Block>(row)
        .iter()
        .zip(out.chunks_exact_mut(F::LEN))
    {
        F::dequantize(b, y);
    }
}

#[inline(always)]
fn check_row_len(what: &str, ty: GgmlType, n: usize, bytes: usize) {
    assert!(
        ty.row_bytes(n) == Some(bytes),
        "{what}: {bytes} bytes is not a {ty} row of {n} values ({ty} has {} values per {}-byte block)",
        ty.block_len(),
        ty.block_bytes(),
    );
}
