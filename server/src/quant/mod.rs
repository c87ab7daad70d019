//! Tensor types and their kernels: a scalar reference per type (the definition tests hold the
//! SIMD kernels to) and AVX2/FMA kernels that do llama.cpp's arithmetic.
//!
//! Matmuls never dequantise weights: the activation row is quantised once per matmul into the
//! weight type's [`vec_dot_type`] (Q8_0 or Q8_K, as llama.cpp does) and dotted in integers.

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

/// Converts `x` into `ty` (one of F32, F16, BF16, Q8_0, Q8_K) in `out`, which must hold exactly
/// `ty.row_bytes(x.len())` bytes. Bit-identical to llama.cpp's x86 AVX2 quantisers.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    let _ = (ty, x, out);
    unimplemented!("kernels land in the next commit")
}

/// Dot product of one weight row of type `w` (n values) with an activation row already in
/// `vec_dot_type(w)`. Uses the AVX2 kernel.
pub fn vec_dot(w: GgmlType, n: usize, w_row: &[u8], act: &[u8]) -> f32 {
    let _ = (w, n, w_row, act);
    unimplemented!("kernels land in the next commit")
}

/// Dequantises one row of type `ty` (e.g. an embedding row) into `out` (length n).
pub fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    let _ = (ty, row, out);
    unimplemented!("kernels land in the next commit")
}
