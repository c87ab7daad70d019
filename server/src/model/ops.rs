//! Element-wise and row operations of the forward pass, each doing llama.cpp's arithmetic
//! (accumulation types, rounding points) so logits agree to well within 0.05.

use std::sync::OnceLock;

use half::f16;

/// `out = x / sqrt(mean(x²) + eps) * w`. Squares are rounded to f32 and summed in f64, and the
/// two multiplications are rounded separately, as ggml's `rms_norm` followed by `mul` does.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * w;
    }
}

/// [`rms_norm`] in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, &w) in x.iter_mut().zip(w) {
        *v = (*v * scale) * w;
    }
}

fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// cos/sin of every rotary pair for one position, computed as `ggml_rope_cache_init` does:
/// theta starts at the position and is stepped by repeated multiplication (not `powf` per
/// pair), and optional per-pair frequency factors divide it (Llama 3 `rope_freqs`).
pub fn rope_cache(
    pos: usize,
    n_rot: usize,
    base: f32,
    freq_factors: Option<&[f32]>,
    cs: &mut [(f32, f32)],
) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for (i, c) in cs[..n_rot / 2].iter_mut().enumerate() {
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let t = theta / ff;
        *c = (t.cos(), t.sin());
        theta *= theta_scale;
    }
}

/// One rotated pair, with the FMAs GCC contracts ggml's `x0*cos - x1*sin` and
/// `x0*sin + x1*cos` into when it builds llama.cpp (`-ffp-contract=fast` is its default):
/// quantised models amplify the last-bit difference of unfused arithmetic into logit errors of
/// hundredths (Llama) to tenths (Gemma).
#[inline]
fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c))
}

/// Rotates one head in place with the pairs' (cos, sin).
pub fn rope_neox(head: &mut [f32], n_rot: usize, cs: &[(f32, f32)]) {
    let half = n_rot / 2;
    for (i, &(c, s)) in cs[..half].iter().enumerate() {
        let (x0, x1) = (head[i], head[i + half]);
        (head[i], head[i + half]) = rotate(x0, x1, c, s);
    }
}

pub fn rope_normal(head: &mut [f32], n_rot: usize, cs: &[(f32, f32)]) {
    for (i, &(c, s)) in cs[..n_rot / 2].iter().enumerate() {
        let (x0, x1) = (head[2 * i], head[2 * i + 1]);
        (head[2 * i], head[2 * i + 1]) = rotate(x0, x1, c, s);
    }
}

/// ggml's GELU-tanh table: the f16 result for every f16 input. ggml's CPU backend evaluates
/// GELU through it (`GGML_GELU_FP16`); exact tanh would differ from llama.cpp by up to ~0.07.
fn gelu_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const COEF_A: f32 = 0.044715;
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                // GCC contracts `1 + a*x*x` into an FMA when it builds ggml (-ffp-contract=fast);
                // without it the f32 Gemma model is off by 1e-3 where an entry rounds the other way.
                let inner = (COEF_A * x).mul_add(x, 1.0);
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh());
                f16::from_f32(y)
            })
            .collect()
    })
}

/// `gate = gelu(gate) * up`, as ggml's `geglu`.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[f16::from_f32(x).to_bits() as usize].to_f32() * u
        };
    }
}

/// `gate = silu(gate) * up` over one row, as ggml's `ggml_vec_swiglu_f32` on AVX2: groups of 8
/// from the row's start take its vectorised exponential ([`exp_ggml`]), the tail libm's `expf`.
/// libm's exponential differs from ggml's in the last bit of many values; on real weights a
/// last-bit difference here flips a quant of the down projection's Q8 input now and then, and
/// outlier features grow that into logit errors of tenths (SmolLM2-135M-Instruct's chat prompt).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let whole = gate.len() / 8 * 8;
    let (body, tail) = gate.split_at_mut(whole);
    swiglu_body(body, &up[..whole]);
    for (g, &u) in tail.iter_mut().zip(&up[whole..]) {
        let x = *g;
        *g = x / (1.0 + (-x).exp()) * u;
    }
}

/// [`swiglu`] over whole groups of 8: `x / (1 + exp(0 - x)) * u`, the exponential ggml's.
fn swiglu_body(gate: &mut [f32], up: &[f32]) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    // SAFETY: the target has AVX2/FMA (this line is compiled only then); the loads and stores
    // stay inside `gate` and `up`, both whole groups of 8 long.
    unsafe {
        use std::arch::x86_64::*;
        let one = _mm256_set1_ps(1.0);
        for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
            let x = _mm256_loadu_ps(g.as_ptr());
            let e = super::attention::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = x / (1.0 + exp_ggml(0.0 - x)) * u;
    }
}

/// Builds the GELU table ahead of the first token so the decode loop never allocates.
pub fn warm_up() {
    gelu_table();
}

/// ggml's vectorised `expf` (an Arm optimized-routines polynomial, max error 1.45 + 0.5 ulp),
/// lane for lane: llama.cpp's attention softmax uses it, and quantised models amplify its last
/// bit (through the next layer's Q8 rounding) into visible logit differences.
pub fn exp_ggml(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 1.5 · 2^23: adding it leaves round(x · log2 e) in the low bits
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g = if n <= 0.0 { 0x8200_0000u32 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// Sum of 8 lanes in the order of ggml's AVX horizontal add: lo + hi, then lanes 0+2 and 1+3,
/// then the two.
pub fn hsum8(v: &[f32; 8]) -> f32 {
    let t: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    (t[0] + t[2]) + (t[1] + t[3])
}

/// Sum of 32 lanes as ggml's `ggml_vec_dot_f16` reduces its four 8-lane accumulators on AVX2
/// (`GGML_F16_VEC_REDUCE`): accumulator 0 + 2 and 1 + 3, those two added, the halves added,
/// then two horizontal adds.
pub fn hsum32_f16_vec(v: &[f32; 32]) -> f32 {
    let x: [f32; 8] = std::array::from_fn(|i| (v[i] + v[i + 16]) + (v[i + 8] + v[i + 24]));
    let t: [f32; 4] = std::array::from_fn(|i| x[i] + x[i + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// Softmax as ggml's `soft_max` op computes it on AVX2: exponentials by [`exp_ggml`] in groups
/// of 8 whose horizontal sums accumulate in f64 (a scalar `expf` tail), then one multiply by
/// the f32 reciprocal of the sum. Entries of `-inf` (masked) come out as exactly 0.
pub fn softmax_ggml(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    let mut groups = x.chunks_exact_mut(8);
    for g in &mut groups {
        let mut lanes = [0f32; 8];
        for (l, v) in lanes.iter_mut().zip(g.iter_mut()) {
            *v = exp_ggml(*v - max);
            *l = *v;
        }
        sum += hsum8(&lanes) as f64;
    }
    for v in groups.into_remainder() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_row_is_the_weight() {
        let x = [3.0f32; 8];
        let w = [0.5f32; 8];
        let mut out = [0f32; 8];
        rms_norm(&x, &w, 0.0, &mut out);
        assert!(out.iter().all(|&v| (v - 0.5).abs() < 1e-6), "{out:?}");
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm_later() {
        let mut cs = [(0f32, 0f32); 4];
        let orig = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        rope_cache(0, 8, 10_000.0, None, &mut cs);
        let mut h = orig;
        rope_neox(&mut h, 8, &cs);
        assert_eq!(h, orig);
        rope_cache(17, 8, 10_000.0, None, &mut cs);
        for rot in [rope_neox, rope_normal] {
            let mut h = orig;
            rot(&mut h, 8, &cs);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = h.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3 && h != orig);
        }
    }

    #[test]
    fn geglu_matches_gelu_tanh_through_f16() {
        let mut g = [-11.0f32, -1.0, 0.0, 0.5, 2.0, 12.0];
        geglu(&mut g, &[1.0; 6]);
        assert_eq!(g[0], 0.0);
        assert_eq!(g[2], 0.0);
        assert_eq!(g[5], 12.0);
        assert!((g[1] - -0.158_808).abs() < 1e-3, "{}", g[1]);
        assert!((g[4] - 1.954_597).abs() < 2e-3, "{}", g[4]);
    }

    #[test]
    fn swiglu_takes_ggmls_exponential_in_groups_of_8_and_libms_in_the_tail() {
        let n = 8 * 40 + 5;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.731).sin() * 12.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.377).cos() * 3.0).collect();
        let mut got = x.clone();
        swiglu(&mut got, &up);
        for (i, ((&x, &u), &got)) in x.iter().zip(&up).zip(&got).enumerate() {
            let e = if i < n / 8 * 8 {
                exp_ggml(0.0 - x)
            } else {
                (-x).exp()
            };
            let want = x / (1.0 + e) * u;
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}: x {x}");
            let exact = x as f64 / (1.0 + (-x as f64).exp()) * u as f64;
            assert!((got as f64 - exact).abs() <= 1e-6 * (1.0 + exact.abs()));
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, -1e30];
        softmax_ggml(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6 && x[3] == 0.0);
        let mut long: Vec<f32> = (0..21).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        let expect: Vec<f64> = {
            let e: Vec<f64> = long.iter().map(|&v| (v as f64).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        };
        softmax_ggml(&mut long);
        for (got, want) in long.iter().zip(expect) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn exp_ggml_is_within_two_ulp_of_exp_and_flushes_the_extremes() {
        for i in -1000..1000 {
            let x = i as f32 * 0.087;
            let (got, want) = (exp_ggml(x), (x as f64).exp());
            assert!(
                ((got as f64 - want) / want).abs() < 2.5e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp_ggml(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_ggml(-200.0), 0.0);
        assert_eq!(exp_ggml(0.0), 1.0);
    }
}
