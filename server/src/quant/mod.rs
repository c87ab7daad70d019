//! Tensor types and their kernels: a scalar reference per type (the definition tests hold the
//! SIMD kernels to) and AVX2/FMA kernels that do llama.cpp's arithmetic.
//!
//! Matmuls never dequantise weights: the activation row is quantised once per matmul into the
//! weight type's [`vec_dot_type`] (Q8_0 or Q8_K, as llama.cpp does) and dotted in integers.

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx2;
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx2_repacked;
mod blocks;
mod quantize;
pub mod reference;
#[cfg(test)]
mod tests;
mod types;

pub use types::GgmlType;

/// The format activations are converted to before they are dotted with weights of type `w`
/// (ggml's `type_traits_cpu[w].vec_dot_type`).
pub fn vec_dot_type(w: GgmlType) -> GgmlType {
    match w {
        GgmlType::F32 => GgmlType::F32,
        GgmlType::F16 => GgmlType::F16,
        GgmlType::BF16 => GgmlType::BF16,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => GgmlType::Q8_0,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS | GgmlType::Q8_K => {
            GgmlType::Q8_K
        }
    }
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
    /// (groups of 4) kernels; see `avx2_repacked`.
    Repacked,
}

impl DotOrder {
    /// The family llama.cpp on AVX2 uses for a `w` matrix of `rows` outputs multiplied by
    /// `act_rows` activation rows at once:
    /// - Q4_0, Q4_K and IQ4_NL matrices whose rows come in whole groups of 8 are repacked
    ///   (`ggml_repack_get_optimal_repack_type`, ggml/src/ggml-cpu/repack.cpp). That includes an
    ///   output matrix tied to the embedding: llama.cpp loads the tie as a separate, repackable
    ///   copy (TENSOR_DUPLICATED), while the embedding itself (read by GET_ROWS) is not.
    /// - Other K-quant matmuls over at least 8 activation rows take the tiled kernel
    ///   (`ggml_tiled_min_batch`).
    /// - Everything else goes row by row through vec_dot.
    pub fn of(w: GgmlType, rows: usize, act_rows: usize) -> DotOrder {
        match w {
            GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::IQ4_NL if rows % 8 == 0 => {
                DotOrder::Repacked
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
                if act_rows >= 8 =>
            {
                DotOrder::Tiled
            }
            _ => DotOrder::VecDot,
        }
    }
}

/// Converts `x` into `ty` (one of F32, F16, BF16, Q8_0, Q8_K) in `out`, which must hold exactly
/// `ty.row_bytes(x.len())` bytes. Bit-identical to llama.cpp's x86 AVX2 quantisers.
///
/// Panics when `out` has the wrong length or `ty` is a weight-only type: both are bugs in the
/// caller, which sizes its scratch buffers from the model's validated shapes.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    check_row_len("quantize_row", ty, x.len(), out.len());
    match ty {
        GgmlType::F32 => quantize::f32_row(x, out),
        GgmlType::F16 => quantize::f16_row(x, out),
        GgmlType::BF16 => quantize::bf16_row(x, out),
        GgmlType::Q8_0 => quantize::q8_0(x, blocks::blocks_mut(out)),
        GgmlType::Q8_K => quantize::q8_k(x, blocks::blocks_mut(out)),
        _ => panic!("quantize_row: {ty} is a weight format, not an activation format"),
    }
}

/// Dot product of one weight row of type `w` (n values) with an activation row already in
/// `vec_dot_type(w)`, in the float order `order`. Uses the AVX2 kernel.
///
/// Panics when either row does not hold exactly `n` values (a caller bug).
#[inline]
pub fn vec_dot(w: GgmlType, order: DotOrder, n: usize, w_row: &[u8], act: &[u8]) -> f32 {
    check_row_len("vec_dot (weights)", w, n, w_row.len());
    check_row_len("vec_dot (activations)", vec_dot_type(w), n, act.len());
    simd_dot(w, order, w_row, act)
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
    // `simd_dot` is inlined, so its match is resolved outside this loop.
    for (i, (row, o)) in rows.chunks_exact(row_bytes).zip(out.iter_mut()).enumerate() {
        if let Some(ahead) =
            rows.get((i + PREFETCH_ROWS) * row_bytes..(i + PREFETCH_ROWS + 1) * row_bytes)
        {
            prefetch(ahead);
        }
        *o = simd_dot(w, order, row, act);
    }
}

/// How far ahead [`dot_rows`] asks for weight rows. Decode streams every weight from memory once
/// per token; requesting the row two ahead keeps more loads in flight than the hardware
/// prefetcher alone (measured on the default model, 1 thread, alternating runs: decode +7 to +24 %,
/// median +11 %).
const PREFETCH_ROWS: usize = 2;

/// Asks the CPU to start loading `bytes` into cache, one request per 64-byte line.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch only hints the cache and never faults; the address is in bounds.
        unsafe {
            std::arch::x86_64::_mm_prefetch(line.as_ptr().cast(), std::arch::x86_64::_MM_HINT_T0)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// [`dot_rows`] for four activation rows at once: `outs[k][i]` = row i · `acts[k]`. Types with a
/// four-row kernel (the weight unpacking is shared) use it; the rest loop. In the vec_dot order
/// results are bit-identical to four [`dot_rows`] calls; repacked, they follow llama.cpp's gemm,
/// which for Q4_K sums in another order than its gemv.
pub fn dot_rows_x4(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    rows: &[u8],
    acts: [&[u8]; 4],
    outs: [&mut [f32]; 4],
) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        type Kernel = fn(&[u8], [&[u8]; 4]) -> [f32; 4];
        use blocks::blocks as b;
        let kernel: Option<Kernel> = match (order, w) {
            (DotOrder::Repacked, GgmlType::Q4_0) => {
                Some(|r, a| avx2_repacked::q4_0_q8_0_x4(b(r), a.map(b)))
            }
            (DotOrder::Repacked, GgmlType::IQ4_NL) => {
                Some(|r, a| avx2_repacked::iq4_nl_q8_0_x4(b(r), a.map(b)))
            }
            (DotOrder::Repacked, GgmlType::Q4_K) => {
                Some(|r, a| avx2_repacked::q4_k_q8_k_x4(b(r), a.map(b)))
            }
            (_, GgmlType::Q8_0) => Some(|r, a| avx2::q8_0_q8_0_x4(b(r), a.map(b))),
            (_, GgmlType::Q4_0) => Some(|r, a| avx2::q4_0_q8_0_x4(b(r), a.map(b))),
            (_, GgmlType::Q5_0) => Some(|r, a| avx2::q5_0_q8_0_x4(b(r), a.map(b))),
            _ => None,
        };
        if let Some(kernel) = kernel {
            let row_bytes = w
                .row_bytes(n)
                .filter(|&b| b > 0 && outs.iter().all(|o| rows.len() == b * o.len()));
            let Some(row_bytes) = row_bytes else {
                panic!(
                    "dot_rows_x4: {} bytes are not {} {w} rows of {n} values",
                    rows.len(),
                    outs[0].len()
                );
            };
            for a in acts {
                check_row_len("dot_rows_x4 (activations)", vec_dot_type(w), n, a.len());
            }
            let [o0, o1, o2, o3] = outs;
            for (i, row) in rows.chunks_exact(row_bytes).enumerate() {
                [o0[i], o1[i], o2[i], o3[i]] = kernel(row, acts);
            }
            return;
        }
    }
    for (a, o) in acts.into_iter().zip(outs) {
        dot_rows(w, order, n, rows, a, o);
    }
}

/// Dequantises one row of type `ty` (e.g. an embedding row) into `out` (length n).
///
/// Panics when `row` does not hold exactly `out.len()` values (a caller bug).
pub fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    check_row_len("dequantize_row", ty, out.len(), row.len());
    reference::dequantize(ty, row, out);
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

/// The SIMD kernel for `w` in the float order `order`, rows already checked: the repacked
/// kernel where `order` asks for one, else vec_dot's (which also does the tiled order). Compiled
/// for x86-64-v3 (the workspace's target); elsewhere the scalar reference stands in.
#[inline(always)]
fn simd_dot(w: GgmlType, order: DotOrder, w_row: &[u8], act: &[u8]) -> f32 {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        use blocks::blocks as b;
        match (order, w) {
            (DotOrder::Repacked, GgmlType::Q4_0) => avx2_repacked::q4_0_q8_0(b(w_row), b(act)),
            (DotOrder::Repacked, GgmlType::IQ4_NL) => avx2_repacked::iq4_nl_q8_0(b(w_row), b(act)),
            (DotOrder::Repacked, GgmlType::Q4_K) => avx2_repacked::q4_k_q8_k(b(w_row), b(act)),
            (_, GgmlType::F32) => avx2::f32_f32(w_row, act),
            (_, GgmlType::F16) => avx2::f16_f16(w_row, act),
            (_, GgmlType::BF16) => avx2::bf16_bf16(w_row, act),
            (_, GgmlType::Q8_0) => avx2::q8_0_q8_0(b(w_row), b(act)),
            (_, GgmlType::Q4_0) => avx2::q4_0_q8_0(b(w_row), b(act)),
            (_, GgmlType::Q5_0) => avx2::q5_0_q8_0(b(w_row), b(act)),
            (_, GgmlType::IQ4_NL) => avx2::iq4_nl_q8_0(b(w_row), b(act)),
            (_, GgmlType::Q4_K) => avx2::q4_k_q8_k(b(w_row), b(act), order),
            (_, GgmlType::Q5_K) => avx2::q5_k_q8_k(b(w_row), b(act), order),
            (_, GgmlType::Q6_K) => avx2::q6_k_q8_k(b(w_row), b(act), order),
            (_, GgmlType::IQ4_XS) => avx2::iq4_xs_q8_k(b(w_row), b(act), order),
            // Activation-only format: never a weight of a model we load.
            (_, GgmlType::Q8_K) => reference::vec_dot(w, w_row, act),
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    {
        let _ = order; // the reference has one order; only the AVX2 kernels reproduce the others
        reference::vec_dot(w, w_row, act)
    }
}
