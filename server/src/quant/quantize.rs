//! Activation quantisers, bit-identical to what llama.cpp computes on x86 with AVX2.
//!
//! Parity with llama.cpp's logits depends on these being exact, not merely close: a Q8_0 value
//! that rounds the other way moves a logit by d_w*d_a. Each function states which ggml routine it
//! reproduces and where the portable reference differs.

use half::{bf16, f16};

use super::blocks::*;

/// Q8_0 as `quantize_row_q8_0` in ggml/src/ggml-cpu/arch/x86/quants.c (AVX2 branch):
/// `d = amax/127` stored as f16 (round to nearest even), `id = 127/amax` (not `1/d` as the
/// portable `_ref` has), and `x*id` rounded half to even (`_mm256_round_ps(_MM_ROUND_NEAREST)`,
/// not `roundf`), saturated to i8 by the packs.
pub fn q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xs, b) in x.chunks_exact(QK).zip(out) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = f16::from_f32(amax / 127.0).to_le_bytes();
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            // `as` saturates, as the i32→i16→i8 packs do.
            *q = (v * id).round_ties_even() as i8;
        }
    }
}

/// Q8_K as `quantize_row_q8_K_ref` in ggml/src/ggml-quants.c (x86 calls it directly): the scale
/// comes from the signed value of largest magnitude, `iscale = -127/max`, quants are
/// `min(127, nearest_int(iscale*x))` and `d = 1/iscale` (negative when max > 0). An all-zero block
/// gets d = 0 and zero quants; ggml leaves its bsums unwritten there, we store zeros.
pub fn q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    for (xs, b) in x.chunks_exact(QK_K).zip(out) {
        // First element of largest magnitude wins ties, as in ggml's strict `>` scan.
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xs {
            if v.abs() > amax {
                (amax, max) = (v.abs(), v);
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K {
                d: [0; 4],
                qs: [0; QK_K],
                bsums: [0; 32],
            };
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (k, sum) in b.bsums.chunks_exact_mut(2).enumerate() {
            let s: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i32).sum();
            sum.copy_from_slice(&(s as i16).to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

/// ggml's `nearest_int`: adding 1.5·2²³ leaves the integer part, rounded half to even, in the low
/// mantissa bits. Valid for |x| < 2²²; the callers' values are within ±127.
fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// f32 → f16 as F16C's `vcvtps2ph` with rounding mode 0 (nearest even), which ggml uses on x86.
pub fn f16_row(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
    }
}

/// f32 → bf16 as `ggml_compute_fp32_to_bf16`: round to nearest even on the raw bits, and a NaN
/// keeps its top bits with the quiet bit forced (so it cannot round into infinity).
pub fn bf16_row(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        let u = v.to_bits();
        let bits = if u & 0x7fff_ffff > 0x7f80_0000 {
            (u >> 16) as u16 | 64
        } else {
            (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
        };
        o.copy_from_slice(&bf16::from_bits(bits).to_le_bytes());
    }
}

pub fn f32_row(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}
