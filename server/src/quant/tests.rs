//! Agreement tests over every row of the format table: SIMD kernels against the scalar
//! reference, the reference's integer dot products against its own dequantisation, the
//! activation formats' round trip, and the repacked kernels against a written-out llama.cpp spec.
//! (Each quantiser's rounding rules on hand-picked values are tested in its format's file.)

use half::f16;
use proptest::prelude::*;

use super::blocks::{blocks, scales_mins_k4};
use super::formats::{iq4_nl::BlockIq4Nl, q4_0::BlockQ4_0, q4_k::BlockQ4K};
use super::formats::{q4_1::BlockQ4_1, q5_1::BlockQ5_1};
use super::formats::{q8_0::BlockQ8_0, q8_1::BlockQ8_1, q8_k::BlockQ8K};
use super::simd::panel_gemm::MAX_ACTS;
use super::*;

/// Every weight type of the table.
const WEIGHT_TYPES: [GgmlType; GgmlType::SUPPORTED.len()] = GgmlType::SUPPORTED;

/// A small deterministic generator (SplitMix64), so proptest only has to shrink a seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The largest magnitude of a random weight row's float fields (its scales and offsets).
const WEIGHT_FLOATS: f32 = 0.05;

/// A random weight row of `n` values: random quant bits and finite scales.
pub(crate) fn random_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    random_row(ty, n, WEIGHT_FLOATS, &mut || rng.next_u64())
}

/// [`format::Activation::SUM_ROUNDING`] of the activation format of `w`.
fn sum_rounding(w: GgmlType) -> f64 {
    fn of<W: WeightRow>() -> f64 {
        <W::Act as format::Activation>::SUM_ROUNDING
    }
    with_weight!(w, W => of::<W>())
}

/// Random activations with occasional outliers, as real hidden states have.
pub(crate) fn random_activations(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| rng.unit() * if i % 37 == 0 { 20.0 } else { 1.0 })
        .collect()
}

/// `x` in the activation format of weights of type `w`.
pub(crate) fn quantized(w: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; vec_dot_type(w).row_bytes(x.len()).unwrap()];
    quantize_row_for(w, x, &mut out);
    out
}

fn dequantized(ty: GgmlType, row: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, row, &mut out);
    out
}

/// Σ|w_i·a_i| over the dequantised rows: the scale of float rounding in any summation order.
fn abs_product_sum(w: GgmlType, w_row: &[u8], act: &[u8], n: usize) -> f64 {
    let wd = dequantized(w, w_row, n);
    let ad = dequantized(vec_dot_type(w), act, n);
    wd.iter().zip(&ad).map(|(a, b)| (a * b).abs() as f64).sum()
}

/// One random case per weight type: (type, n, weight row, activation row in vec_dot_type).
fn cases(seed: u64, blocks: usize) -> Vec<(GgmlType, usize, Vec<u8>, Vec<u8>)> {
    let mut rng = Rng(seed);
    WEIGHT_TYPES
        .iter()
        .map(|&w| {
            // Float rows get lengths that are not a multiple of the 32-wide unrolling.
            let n = if w.block_len() == 1 {
                blocks * 37 + 3
            } else {
                blocks * w.block_len()
            };
            let w_row = random_weights(w, n, &mut rng);
            let act = quantized(w, &random_activations(n, &mut rng));
            (w, n, w_row, act)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// 1..=9 blocks covers the 4-way unrolled loop with every remainder.
    #[test]
    fn simd_dot_equals_reference(seed in any::<u64>(), blocks in 1usize..=9) {
        for (w, n, w_row, act) in cases(seed, blocks) {
            let scalar = vec_dot_ref(w, n, &w_row, &act);
            let tol = 1e-5 * abs_product_sum(w, &w_row, &act, n) + 1e-6;
            for order in [DotOrder::VecDot, DotOrder::Tiled, DotOrder::Repacked, DotOrder::Free] {
                let simd = vec_dot(w, order, n, &w_row, &act);
                prop_assert!(
                    ((simd - scalar) as f64).abs() <= tol,
                    "{w}, n={n}, {order:?}: simd {simd} vs reference {scalar} (tolerance {tol})"
                );
            }
        }
    }

    /// The integer arithmetic (mins and offsets via bsums, scales applied to int sums) equals the
    /// plain dot product of the dequantised rows; where the activation's block sums are rounded
    /// (Q8_1's `s`), up to that rounding times the weights' offsets (at most `WEIGHT_FLOATS`).
    #[test]
    fn reference_vec_dot_equals_dot_of_dequantised_rows(seed in any::<u64>(), blocks in 1usize..=3) {
        for (w, n, w_row, act) in cases(seed, blocks) {
            let wd = dequantized(w, &w_row, n);
            let ad = dequantized(vec_dot_type(w), &act, n);
            let exact: f64 = wd.iter().zip(&ad).map(|(a, b)| *a as f64 * *b as f64).sum();
            let got = vec_dot_ref(w, n, &w_row, &act) as f64;
            let block_sums: f64 = ad
                .chunks(vec_dot_type(w).block_len())
                .map(|b| b.iter().map(|&a| a as f64).sum::<f64>().abs())
                .sum();
            let sums = sum_rounding(w) * WEIGHT_FLOATS as f64 * block_sums;
            let tol = 1e-5 * abs_product_sum(w, &w_row, &act, n) + 1e-6 + sums;
            prop_assert!((got - exact).abs() <= tol, "{w}, n={n}: {got} vs {exact} (tolerance {tol})");
        }
    }

    /// `dot_rows` in the free order over 1..=9 rows of 1..=9 blocks: the rows in quads are what
    /// the format's four-row kernel gives them (in its own order, whatever computed them), the
    /// rows left over their vec_dot, bit for bit, and all agree with the reference to float
    /// rounding.
    #[test]
    fn free_order_dot_rows_of_any_row_count_equal_vec_dot(seed in any::<u64>(), n_rows in 1usize..=9, blocks in 1usize..=9) {
        let mut rng = Rng(seed);
        for w in WEIGHT_TYPES {
            let n = blocks * w.block_len().max(vec_dot_type(w).block_len());
            let rows: Vec<Vec<u8>> = (0..n_rows).map(|_| random_weights(w, n, &mut rng)).collect();
            let act = quantized(w, &random_activations(n, &mut rng));
            let mut out = vec![0f32; n_rows];
            dot_rows(w, DotOrder::Free, n, &rows.concat(), &act, &mut out);
            for (r, row) in rows.iter().enumerate() {
                let want = if r < n_rows / 4 * 4 {
                    let quad = std::array::from_fn(|k| &rows[r / 4 * 4 + k][..]);
                    four_rows(w, quad, &[&act], DotOrder::Free)[0][r % 4]
                } else {
                    vec_dot(w, DotOrder::VecDot, n, row, &act)
                };
                prop_assert_eq!(out[r].to_bits(), want.to_bits(), "{} row {}", w, r);
                let tol = 1e-5 * abs_product_sum(w, row, &act, n) + 1e-6;
                let reference = vec_dot_ref(w, n, row, &act);
                prop_assert!(((out[r] - reference) as f64).abs() <= tol, "{w} row {r}: {} vs {reference}", out[r]);
            }
        }
    }

    /// `dot_rows` in the orders that keep llama.cpp's (vec_dot, tiled, repacked) over 1..=9 rows:
    /// the four-row kernels and the rows left over both give every row its own `vec_dot`, bit for
    /// bit.
    #[test]
    fn ordered_dot_rows_of_any_row_count_equal_vec_dot_bit_for_bit(seed in any::<u64>(), n_rows in 1usize..=9, blocks in 1usize..=5) {
        let mut rng = Rng(seed);
        for w in WEIGHT_TYPES {
            let n = blocks * w.block_len().max(vec_dot_type(w).block_len());
            let rows: Vec<Vec<u8>> = (0..n_rows).map(|_| random_weights(w, n, &mut rng)).collect();
            let act = quantized(w, &random_activations(n, &mut rng));
            for order in [DotOrder::VecDot, DotOrder::Tiled, DotOrder::Repacked] {
                let mut out = vec![f32::NAN; n_rows];
                dot_rows(w, order, n, &rows.concat(), &act, &mut out);
                for (r, row) in rows.iter().enumerate() {
                    let one = vec_dot(w, order, n, row, &act);
                    prop_assert_eq!(out[r].to_bits(), one.to_bits(), "{} {:?} row {} of {}", w, order, r, n_rows);
                }
            }
        }
    }

    #[test]
    fn dot_rows_and_dot_rows_x4_equal_vec_dot_bit_for_bit(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        for w in WEIGHT_TYPES {
            let n = 256;
            let rows: Vec<Vec<u8>> = (0..3).map(|_| random_weights(w, n, &mut rng)).collect();
            let all_rows = rows.concat();
            let acts: Vec<Vec<u8>> =
                (0..4).map(|_| quantized(w, &random_activations(n, &mut rng))).collect();
            for order in [DotOrder::VecDot, DotOrder::Tiled] {
                let mut single = [0f32; 3];
                dot_rows(w, order, n, &all_rows, &acts[0], &mut single);
                let mut outs = [[0f32; 3]; 4];
                let [o0, o1, o2, o3] = &mut outs;
                let acts4 = [&acts[0][..], &acts[1], &acts[2], &acts[3]];
                dot_rows_x4(w, order, n, &all_rows, acts4, [o0, o1, o2, o3]);
                for (r, row) in rows.iter().enumerate() {
                    prop_assert_eq!(single[r].to_bits(), vec_dot(w, order, n, row, &acts[0]).to_bits());
                    for (k, act) in acts.iter().enumerate() {
                        prop_assert_eq!(outs[k][r].to_bits(), vec_dot(w, order, n, row, act).to_bits(), "{} row {} act {} {:?}", w, r, k, order);
                    }
                }
            }
        }
    }

    /// `dot_rows_x4` and `dot_rows_x8` (prefill's kernels, which the formats tile over many
    /// weight rows) over
    /// 1..=9 weight rows of 1..=9 blocks: every output is its row's own one-row result bit for
    /// bit, in the orders that keep llama.cpp's: vec_dot (and tiled) per activation row, and for
    /// the repacked types the written-out gemm.
    #[test]
    fn dot_rows_x4_and_x8_of_any_row_count_equal_each_rows_dot_bit_for_bit(
        seed in any::<u64>(),
        n_rows in 1usize..=9,
        blocks in 1usize..=9,
    ) {
        let mut rng = Rng(seed);
        for w in WEIGHT_TYPES {
            let n = blocks * w.block_len().max(vec_dot_type(w).block_len());
            let checked = x4_rows_equal_one_row_dots(w, n, n_rows, &mut rng);
            prop_assert!(checked.is_ok(), "{}", checked.unwrap_err());
        }
    }

    /// `dot_rows_multi` is `dot_rows` per activation row, bit for bit, in every order, for every
    /// type (those with shared-unpack kernels and the fallback), any row count (the free order's
    /// quads and the rows left over) and 1..=6 activation rows (groups of up to four and a rest).
    #[test]
    fn dot_rows_multi_equals_dot_rows_bit_for_bit(
        seed in any::<u64>(),
        n_rows in 1usize..=9,
        blocks in 1usize..=4,
        n_acts in 1usize..=6,
    ) {
        let mut rng = Rng(seed);
        for w in WEIGHT_TYPES {
            let n = blocks * w.block_len().max(vec_dot_type(w).block_len());
            let rows: Vec<u8> = (0..n_rows).flat_map(|_| random_weights(w, n, &mut rng)).collect();
            let acts: Vec<Vec<u8>> =
                (0..n_acts).map(|_| quantized(w, &random_activations(n, &mut rng))).collect();
            let act_refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
            for order in [DotOrder::VecDot, DotOrder::Tiled, DotOrder::Repacked, DotOrder::Free] {
                let mut outs = vec![vec![f32::NAN; n_rows]; n_acts];
                let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                dot_rows_multi(w, order, n, &rows, &act_refs, &mut out_refs);
                for (t, act) in acts.iter().enumerate() {
                    let mut single = vec![0f32; n_rows];
                    dot_rows(w, order, n, &rows, act, &mut single);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    prop_assert_eq!(bits(&outs[t]), bits(&single), "{} {:?} act {} of {}", w, order, t, n_acts);
                }
            }
        }
    }

    /// The repacked kernels sum exactly as llama.cpp's gemv (one activation row) and gemm (four)
    /// do, and still compute the dot product.
    #[test]
    fn repacked_kernels_follow_llama_cpp_gemv_and_gemm_bit_for_bit(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        for w in repacked_types() {
            let n = 512;
            // Five rows: one through the four-row kernels, one alone.
            let rows: Vec<Vec<u8>> = (0..5).map(|_| random_weights(w, n, &mut rng)).collect();
            let all_rows = rows.concat();
            let acts: Vec<Vec<u8>> =
                (0..4).map(|_| quantized(w, &random_activations(n, &mut rng))).collect();
            let mut single = [0f32; 5];
            dot_rows(w, DotOrder::Repacked, n, &all_rows, &acts[0], &mut single);
            let mut outs = [[0f32; 5]; 4];
            let [o0, o1, o2, o3] = &mut outs;
            let acts4 = [&acts[0][..], &acts[1], &acts[2], &acts[3]];
            dot_rows_x4(w, DotOrder::Repacked, n, &all_rows, acts4, [o0, o1, o2, o3]);
            for (r, row) in rows.iter().enumerate() {
                let gemv = repacked_spec(w, row, &acts[0], false);
                prop_assert_eq!(single[r].to_bits(), gemv.to_bits(), "{} row {} gemv", w, r);
                for (k, act) in acts.iter().enumerate() {
                    let gemm = repacked_spec(w, row, act, true);
                    prop_assert_eq!(outs[k][r].to_bits(), gemm.to_bits(), "{} row {} act {}", w, r, k);
                    let scalar = vec_dot_ref(w, n, row, act);
                    let tol = 1e-5 * abs_product_sum(w, row, act, n) + 1e-6;
                    prop_assert!(((gemm - scalar) as f64).abs() <= tol, "{w}: {gemm} vs reference {scalar}");
                }
            }
        }
    }

    /// Rows at odd addresses (weights are not aligned inside a GGUF mapping).
    #[test]
    fn kernels_accept_unaligned_rows(seed in any::<u64>(), shift in 1usize..32) {
        for (w, n, w_row, act) in cases(seed, 2) {
            let mut buf = vec![0u8; shift + w_row.len()];
            buf[shift..].copy_from_slice(&w_row);
            let order = DotOrder::VecDot;
            prop_assert_eq!(vec_dot(w, order, n, &buf[shift..], &act).to_bits(), vec_dot(w, order, n, &w_row, &act).to_bits());
        }
    }

    /// Every activation format of the table (a weight's `vec_dot_type`) keeps each value within
    /// half a quantisation step.
    #[test]
    fn activation_formats_round_trip(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let x = random_activations(512, &mut rng);
        for w in WEIGHT_TYPES {
            let ty = vec_dot_type(w);
            let f16_scale = matches!(with_format!(ty, F => F::FLOATS), [format::Float::F16(_), ..]);
            let back = dequantized(ty, &quantized(w, &x), x.len());
            let chunk = ty.block_len().max(32);
            for (block, (xs, ys)) in x.chunks(chunk).zip(back.chunks(chunk)).enumerate() {
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (&x, &y) in xs.iter().zip(ys) {
                    // Half a quantisation step; an f16 scale (Q8_0's d) also carries its
                    // rounding (2^-11 relative), F16 the absolute step of its subnormals.
                    let bound = match ty {
                        GgmlType::F32 => 0.0,
                        GgmlType::F16 => x.abs() * 2f32.powi(-11) + 2f32.powi(-25),
                        GgmlType::BF16 => x.abs() * 2f32.powi(-8),
                        _ if f16_scale => (amax / 127.0 * 0.5 + amax * 2f32.powi(-11)) * 1.0001,
                        _ => amax / 127.0 * 0.5 * 1.0001,
                    };
                    prop_assert!((x - y).abs() <= bound, "{ty} block {block}: {x} came back as {y}");
                }
            }
        }
    }
}

/// [`dot_rows_x4`]'s outputs for `acts[..4]` and [`dot_rows_x8`]'s for `acts[..8]` over
/// `all_rows` (`n_rows` rows of `n` values), NaN where a kernel wrote nothing.
fn x4_and_x8_outputs(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    all_rows: &[u8],
    n_rows: usize,
    acts: &[Vec<u8>],
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut x4 = vec![vec![f32::NAN; n_rows]; 4];
    let [o0, o1, o2, o3] = &mut x4[..] else {
        unreachable!()
    };
    let acts4 = [&acts[0][..], &acts[1], &acts[2], &acts[3]];
    dot_rows_x4(w, order, n, all_rows, acts4, [o0, o1, o2, o3]);
    let mut x8 = vec![vec![f32::NAN; n_rows]; 8];
    let outs8: [&mut [f32]; 8] = {
        let mut it = x8.iter_mut().map(|o| &mut o[..]);
        std::array::from_fn(|_| it.next().unwrap())
    };
    dot_rows_x8(
        w,
        order,
        n,
        all_rows,
        std::array::from_fn(|k| &acts[k][..]),
        outs8,
    );
    (x4, x8)
}

/// Checks [`dot_rows_x4`] and [`dot_rows_x8`] over `n_rows` random rows of `n` values against
/// each row's one-row result (see `dot_rows_x4_and_x8_of_any_row_count_equal_each_rows_dot_bit_for_bit`),
/// naming the first output that differs.
fn x4_rows_equal_one_row_dots(
    w: GgmlType,
    n: usize,
    n_rows: usize,
    rng: &mut Rng,
) -> Result<(), String> {
    let rows: Vec<Vec<u8>> = (0..n_rows).map(|_| random_weights(w, n, rng)).collect();
    let all_rows = rows.concat();
    let acts: Vec<Vec<u8>> = (0..8)
        .map(|_| quantized(w, &random_activations(n, rng)))
        .collect();
    for order in [DotOrder::VecDot, DotOrder::Tiled, DotOrder::Repacked] {
        let (x4, x8) = x4_and_x8_outputs(w, order, n, &all_rows, n_rows, &acts);
        for (r, row) in rows.iter().enumerate() {
            for (k, act) in acts.iter().enumerate() {
                let want = if order == DotOrder::Repacked && repacked_types().contains(&w) {
                    repacked_spec(w, row, act, true)
                } else {
                    vec_dot(w, order, n, row, act)
                };
                let got = [x4.get(k).map(|o| ("x4", o[r])), Some(("x8", x8[k][r]))];
                for (kernel, got) in got.into_iter().flatten() {
                    if got.to_bits() != want.to_bits() {
                        return Err(format!(
                            "{w} n={n} {order:?} {kernel} row {r} of {n_rows}, act {k}: {got} vs {want}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// `dot_rows_multi` in the repacked order, three streams: Q4_0 and IQ4_NL over many groups of
/// `gemv_nibbles::rows_n`'s eight rows and a rest, and over rows wider than its table, which
/// take each stream's mat-vec over three slabs (`gemv_slabs`, 64 KiB of weights each); Q4_K row
/// by row. Every row is what `dot_rows` gives each activation row alone, bit for bit.
#[test]
fn repacked_streams_equal_one_stream_bit_for_bit() {
    let mut rng = Rng(45);
    // 512 values: 37 groups of eight rows and five more; 520 blocks: past the table, 21 rows.
    for (n, bytes) in [(512, 150 << 10), (520 * 32, 190 << 10)] {
        for w in [GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::Q4_K] {
            let n_rows = bytes / w.row_bytes(n).unwrap() + 5;
            let rows: Vec<u8> = (0..n_rows)
                .flat_map(|_| random_weights(w, n, &mut rng))
                .collect();
            let acts: Vec<Vec<u8>> = (0..3)
                .map(|_| quantized(w, &random_activations(n, &mut rng)))
                .collect();
            let act_refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
            let mut outs = vec![vec![f32::NAN; n_rows]; acts.len()];
            let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            dot_rows_multi(w, DotOrder::Repacked, n, &rows, &act_refs, &mut out_refs);
            for (act, out) in acts.iter().zip(&outs) {
                let mut single = vec![0f32; n_rows];
                dot_rows(w, DotOrder::Repacked, n, &rows, act, &mut single);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(out), bits(&single), "{w}: {n_rows} rows of {n}");
            }
        }
    }
}

/// Rows wider than the tiled kernels' scale table (512 blocks of 32) take the per-row kernels:
/// still each row's own result.
#[test]
fn dot_rows_x4_and_x8_of_wide_rows_equal_each_rows_dot_bit_for_bit() {
    let mut rng = Rng(7);
    for w in WEIGHT_TYPES {
        // 528 blocks of 32, 66 super-blocks of 256.
        let n = 66 * 256;
        if let Err(e) = x4_rows_equal_one_row_dots(w, n, 3, &mut rng) {
            panic!("{e}");
        }
    }
}

/// llama.cpp's repacked kernels written out for one output (`gemv_q4_b32_8x8_q8_0_lut_avx`,
/// `ggml_gemv_q4_K_8x8_q8_K` and their gemm twins in ggml-cpu/arch/x86/repack.cpp): integer sums
/// scaled by d_w·d_a into one scalar FMA chain, per 32-value block; for Q4_K per super-block in
/// the gemv and per 64-value chunk in the gemm, with the mins in a second chain subtracted last.
fn repacked_spec(w: GgmlType, w_row: &[u8], act: &[u8], gemm: bool) -> f32 {
    let fma = |sumi: i32, d_w: f32, d_a: f32, acc: f32| (sumi as f32).mul_add(d_w * d_a, acc);
    let f16 = |bits: [u8; 2]| f16::from_le_bytes(bits).to_f32();
    let a_blocks = || blocks::<BlockQ8_0>(act).iter();
    let chain32 = |weights: Vec<([u8; 2], [i8; 32])>| {
        weights
            .iter()
            .zip(a_blocks())
            .fold(0.0, |acc, ((d, q), a)| {
                let sumi = q
                    .iter()
                    .zip(&a.qs)
                    .map(|(&q, &a)| q as i32 * a as i32)
                    .sum();
                fma(sumi, f16(*d), f16(a.d), acc)
            })
    };
    match w {
        GgmlType::Q4_0 => chain32(
            blocks::<BlockQ4_0>(w_row)
                .iter()
                .map(|b| (b.d, b.values()))
                .collect(),
        ),
        GgmlType::IQ4_NL => chain32(
            blocks::<BlockIq4Nl>(w_row)
                .iter()
                .map(|b| (b.d, b.values()))
                .collect(),
        ),
        GgmlType::Q4_K => {
            let (mut acc, mut acc_min) = (0.0, 0.0);
            for (b, y) in blocks::<BlockQ4K>(w_row)
                .iter()
                .zip(blocks::<BlockQ8K>(act))
            {
                let q = b.values();
                let sm = scales_mins_k4(&b.scales);
                let scaled = |s: usize| {
                    let dot: i32 = (32 * s..32 * s + 32)
                        .map(|i| q[i] as i32 * y.qs[i] as i32)
                        .sum();
                    sm[s] as i32 * dot
                };
                let min = |s: usize| sm[8 + s] as i32 * (y.bsum(2 * s) + y.bsum(2 * s + 1));
                // Sub-blocks per FMA: a 64-value chunk in the gemm, the super-block in the gemv.
                let per_fma = if gemm { 2 } else { 8 };
                for g in (0..8).step_by(per_fma).map(|s| s..s + per_fma) {
                    acc = fma(g.clone().map(scaled).sum(), f16(b.d), y.d(), acc);
                    acc_min = fma(g.map(min).sum(), f16(b.dmin), y.d(), acc_min);
                }
            }
            acc - acc_min
        }
        _ => panic!("no written-out llama.cpp gemv/gemm for {w}: add one here"),
    }
}

/// ggml's AVX2 `ggml_vec_dot_q4_1_q8_1` (Q5_1's sums in the same order) written out for one
/// output: per block, lane j's integer dot of values 4j..4j+3 into an eight-lane FMA chain by
/// `d_w·d_a`, the offsets' `m·s` into a scalar FMA chain; then the lanes' horizontal sum
/// (`hsum_float_8`: the two halves, then lanes 0+2 and 1+3, then those two) plus the offsets.
fn affine_spec(w: GgmlType, w_row: &[u8], act: &[u8]) -> f32 {
    let weights: Vec<([u8; 2], [u8; 2], [u8; 32])> = match w {
        GgmlType::Q4_1 => blocks::<BlockQ4_1>(w_row)
            .iter()
            .map(|b| (b.d, b.m, b.values()))
            .collect(),
        GgmlType::Q5_1 => blocks::<BlockQ5_1>(w_row)
            .iter()
            .map(|b| (b.d, b.m, b.values()))
            .collect(),
        _ => panic!("no written-out llama.cpp vec_dot for {w}: add one here"),
    };
    let f = |h: [u8; 2]| f16::from_le_bytes(h).to_f32();
    let mut acc = [0f32; 8];
    let mut offsets = 0f32;
    for ((d, m, q), y) in weights.iter().zip(blocks::<BlockQ8_1>(act)) {
        let d_wa = f(*d) * f(y.d);
        for (j, lane) in acc.iter_mut().enumerate() {
            let sumi: i32 = (4 * j..4 * j + 4)
                .map(|e| q[e] as i32 * y.qs[e] as i32)
                .sum();
            *lane = d_wa.mul_add(sumi as f32, *lane);
        }
        offsets = f(*m).mul_add(f(y.s), offsets);
    }
    let s: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    (s[0] + s[2]) + (s[1] + s[3]) + offsets
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Q4_1's and Q5_1's kernels sum as llama.cpp's vec_dot does, bit for bit, on each
    /// instruction set: their many-row kernels are held to `vec_dot` by the tests above, and
    /// `vec_dot` here to the written-out order.
    #[test]
    fn affine_kernels_follow_llama_cpp_vec_dot_bit_for_bit(seed in any::<u64>(), blocks in 1usize..=20) {
        let mut rng = Rng(seed);
        for w in [GgmlType::Q4_1, GgmlType::Q5_1] {
            let n = blocks * 32;
            let w_row = random_weights(w, n, &mut rng);
            let act = quantized(w, &random_activations(n, &mut rng));
            let want = affine_spec(w, &w_row, &act);
            for choice in runnable_isas() {
                for order in [DotOrder::VecDot, DotOrder::Free] {
                    let got = isa::forced(choice, || vec_dot(w, order, n, &w_row, &act));
                    prop_assert_eq!(got.to_bits(), want.to_bits(), "{} {:?} on {}: {} vs {}", w, order, choice, got, want);
                }
            }
        }
    }
}

/// [`Kernels::dot_4xn`](format::Kernels::dot_4xn) of type `w` on four weight rows and up to
/// four activation rows (already quantised), `result[t][k]` = row k · `acts[t]`.
fn four_rows(w: GgmlType, rows: [&[u8]; 4], acts: &[&[u8]], order: DotOrder) -> Vec<[f32; 4]> {
    fn run<W: Kernels<I>, I: isa::Isa, const N: usize>(
        rows: [&[u8]; 4],
        acts: &[&[u8]],
        order: DotOrder,
    ) -> Vec<[f32; 4]> {
        let a: [&[ActBlock<W>]; N] = std::array::from_fn(|t| blocks(acts[t]));
        W::dot_4xn(rows.map(blocks::<W::Block>), a, order).to_vec()
    }
    isa::with_isa!(I => with_weight!(w, W => match acts.len() {
        1 => run::<W, I, 1>(rows, acts, order),
        2 => run::<W, I, 2>(rows, acts, order),
        3 => run::<W, I, 3>(rows, acts, order),
        4 => run::<W, I, 4>(rows, acts, order),
        n => panic!("four_rows: {n} activation rows, not 1..=4"),
    }))
}

/// The four-row kernel of every format in the table, in every order, with 1..=4 activation
/// rows: each result is what the kernel gives its activation row alone (so a decode stream's
/// results do not depend on the others batched with it, whichever of a format's kernels it
/// overrides), and outside the free order that row's own `vec_dot`.
#[test]
fn four_row_kernels_give_each_activation_row_what_it_gets_alone() {
    let mut rng = Rng(7);
    for w in WEIGHT_TYPES {
        let n = 3 * w.block_len().max(vec_dot_type(w).block_len());
        let rows: Vec<Vec<u8>> = (0..4).map(|_| random_weights(w, n, &mut rng)).collect();
        let quad = std::array::from_fn(|k| &rows[k][..]);
        let acts: Vec<Vec<u8>> = (0..4)
            .map(|_| quantized(w, &random_activations(n, &mut rng)))
            .collect();
        let acts: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
        for order in [
            DotOrder::VecDot,
            DotOrder::Tiled,
            DotOrder::Repacked,
            DotOrder::Free,
        ] {
            for n_acts in 1..=4 {
                let got = four_rows(w, quad, &acts[..n_acts], order);
                for (t, got) in got.iter().enumerate() {
                    let alone = four_rows(w, quad, &acts[t..t + 1], order)[0];
                    for k in 0..4 {
                        let what = format!("{w} {order:?} row {k} act {t} of {n_acts}");
                        assert_eq!(got[k].to_bits(), alone[k].to_bits(), "{what}");
                        if order != DotOrder::Free {
                            let one = vec_dot(w, order, n, quad[k], acts[t]);
                            assert_eq!(got[k].to_bits(), one.to_bits(), "{what} vs vec_dot");
                        }
                    }
                }
            }
        }
    }
}

/// The weight types llama.cpp repacks (on a matrix whose rows come in groups of 8).
fn repacked_types() -> Vec<GgmlType> {
    let repacked = |w: &GgmlType| DotOrder::of(*w, 8, 1) == DotOrder::Repacked;
    WEIGHT_TYPES.into_iter().filter(repacked).collect()
}

/// llama.cpp's choices on AVX2, written out: Q4_0, Q4_K and IQ4_NL are repacked when their rows
/// come in groups of 8, the other K-quants take the tiled kernel from 8 activation rows, and
/// everything else (and anything else) is vec_dot.
#[test]
fn dot_orders_are_llama_cpp_s() {
    use GgmlType::*;
    for w in WEIGHT_TYPES {
        for (rows, act_rows) in [(8, 1), (8, 8), (12, 1), (12, 8), (16, 7)] {
            let want = match w {
                Q4_0 | Q4_K | IQ4_NL if rows % 8 == 0 => DotOrder::Repacked,
                Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ3_S | IQ4_XS if act_rows >= 8 => {
                    DotOrder::Tiled
                }
                _ => DotOrder::VecDot,
            };
            assert_eq!(
                DotOrder::of(w, rows, act_rows),
                want,
                "{w} {rows}x{act_rows}"
            );
        }
    }
}

#[test]
#[should_panic(expected = "2 activation rows but 1 outputs")]
fn dot_rows_multi_names_a_count_mismatch() {
    let act = [0u8; 34];
    let mut out = [0f32; 1];
    dot_rows_multi(
        GgmlType::Q8_0,
        DotOrder::VecDot,
        32,
        &[0u8; 34],
        &[&act, &act],
        &mut [&mut out],
    );
}

#[test]
#[should_panic(expected = "is not a q8_0 row of 64 values")]
fn wrong_row_length_names_type_and_count() {
    vec_dot(GgmlType::Q8_0, DotOrder::VecDot, 64, &[0u8; 34], &[0u8; 68]);
}

/// Every matmul entry point's outputs for `rows` (`n` values each) against `acts`, in every
/// order, as bits: what the instruction sets must agree on.
fn every_output(w: GgmlType, n: usize, rows: &[Vec<u8>], acts: &[Vec<u8>]) -> Vec<u32> {
    let all_rows = rows.concat();
    let n_rows = rows.len();
    let mut got = Vec::new();
    for order in [
        DotOrder::VecDot,
        DotOrder::Tiled,
        DotOrder::Repacked,
        DotOrder::Free,
    ] {
        for row in rows {
            got.extend(acts.iter().map(|a| vec_dot(w, order, n, row, a).to_bits()));
        }
        let mut single = vec![0f32; n_rows];
        dot_rows(w, order, n, &all_rows, &acts[0], &mut single);
        let (x4, x8) = x4_and_x8_outputs(w, order, n, &all_rows, n_rows, acts);
        let mut multi = vec![vec![0f32; n_rows]; 6];
        let mut multi_refs: Vec<&mut [f32]> = multi.iter_mut().map(|o| &mut o[..]).collect();
        let act_refs: Vec<&[u8]> = acts[..6].iter().map(|a| &a[..]).collect();
        dot_rows_multi(w, order, n, &all_rows, &act_refs, &mut multi_refs);
        for o in std::iter::once(&single).chain(&x4).chain(&x8).chain(&multi) {
            got.extend(o.iter().map(|x| x.to_bits()));
        }
    }
    got
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The VNNI kernels give the AVX2 kernels' results bit for bit, for every type, order and
    /// entry point, any row count and length (where the CPU has VNNI; on one without, the set
    /// cannot be selected, and that refusal is what is checked).
    #[test]
    fn vnni_kernels_equal_avx2_kernels_bit_for_bit(
        seed in any::<u64>(),
        n_rows in 1usize..=9,
        blocks in 1usize..=9,
    ) {
        if isa::detected() != isa::Choice::Vnni {
            prop_assert!(isa::select(isa::Choice::Vnni).is_err());
            return Ok(());
        }
        let mut rng = Rng(seed);
        for w in WEIGHT_TYPES {
            let n = blocks * w.block_len().max(vec_dot_type(w).block_len());
            let rows: Vec<Vec<u8>> = (0..n_rows).map(|_| random_weights(w, n, &mut rng)).collect();
            let acts: Vec<Vec<u8>> =
                (0..8).map(|_| quantized(w, &random_activations(n, &mut rng))).collect();
            let avx2 = isa::forced(isa::Choice::Avx2, || every_output(w, n, &rows, &acts));
            let vnni = isa::forced(isa::Choice::Vnni, || every_output(w, n, &rows, &acts));
            let first = avx2.iter().zip(&vnni).position(|(a, b)| a != b);
            prop_assert!(first.is_none(), "{} n={} rows={}: output {:?} differs", w, n, n_rows, first);
        }
    }
}

/// [`vnni_kernels_equal_avx2_kernels_bit_for_bit`] for rows wider than the tiled kernels' tables.
#[test]
fn vnni_kernels_equal_avx2_kernels_on_wide_rows() {
    if isa::detected() != isa::Choice::Vnni {
        assert!(isa::select(isa::Choice::Vnni).is_err());
        return;
    }
    let mut rng = Rng(11);
    for w in WEIGHT_TYPES {
        let n = 66 * 256;
        let rows: Vec<Vec<u8>> = (0..5).map(|_| random_weights(w, n, &mut rng)).collect();
        let acts: Vec<Vec<u8>> = (0..8)
            .map(|_| quantized(w, &random_activations(n, &mut rng)))
            .collect();
        let avx2 = isa::forced(isa::Choice::Avx2, || every_output(w, n, &rows, &acts));
        let vnni = isa::forced(isa::Choice::Vnni, || every_output(w, n, &rows, &acts));
        assert!(
            avx2 == vnni,
            "{w}: the VNNI kernels differ from the AVX2 ones"
        );
    }
}

/// What [`dot_rows_batch`] must give: llama.cpp's groups of the batch, eights and fours from the
/// first activation row through [`dot_rows_x8`] and [`dot_rows_x4`], the rest through
/// [`dot_rows`].
fn grouped_outputs(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    rows: &[u8],
    acts: &[Vec<u8>],
) -> Vec<Vec<f32>> {
    let n_rows = rows.len() / w.row_bytes(n).unwrap();
    let mut outs = vec![vec![f32::NAN; n_rows]; acts.len()];
    let mut t = 0;
    while t < acts.len() {
        let group = if t + 8 <= acts.len() {
            8
        } else if t + 4 <= acts.len() {
            4
        } else {
            1
        };
        let mut o = outs[t..t + group].iter_mut();
        match group {
            8 => dot_rows_x8(
                w,
                order,
                n,
                rows,
                std::array::from_fn(|i| &acts[t + i][..]),
                std::array::from_fn(|_| &mut o.next().unwrap()[..]),
            ),
            4 => dot_rows_x4(
                w,
                order,
                n,
                rows,
                std::array::from_fn(|i| &acts[t + i][..]),
                std::array::from_fn(|_| &mut o.next().unwrap()[..]),
            ),
            _ => dot_rows(w, order, n, rows, &acts[t], o.next().unwrap()),
        }
        t += group;
    }
    outs
}

/// [`dot_rows_batch`]'s outputs against [`grouped_outputs`], as bits, or the first difference.
pub(crate) fn batch_equals_groups(
    w: GgmlType,
    order: DotOrder,
    n: usize,
    rows: &[u8],
    acts: &[Vec<u8>],
) -> Result<(), String> {
    let want = grouped_outputs(w, order, n, rows, acts);
    let mut got = vec![vec![f32::NAN; want[0].len()]; acts.len()];
    let mut got_refs: Vec<&mut [f32]> = got.iter_mut().map(|o| &mut o[..]).collect();
    let act_refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
    dot_rows_batch(w, order, n, rows, &act_refs, &mut got_refs);
    for (t, (g, w_)) in got.iter().zip(&want).enumerate() {
        if let Some(r) = g
            .iter()
            .zip(w_)
            .position(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!(
                "{w} {order:?} n={n}: act {t} of {}, row {r}: {} vs {}",
                acts.len(),
                g[r],
                w_[r]
            ));
        }
    }
    Ok(())
}

/// The instruction sets this CPU can run.
pub(crate) fn runnable_isas() -> Vec<isa::Choice> {
    match isa::detected() {
        isa::Choice::Vnni => vec![isa::Choice::Avx2, isa::Choice::Vnni],
        isa::Choice::Avx2 => vec![isa::Choice::Avx2],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// `dot_rows_batch` (prefill's whole micro-batch at once; Q4_0 and IQ4_NL repacked as a GEMM
    /// with weight rows in the lanes) is llama.cpp's grouping of the batch bit for bit, for every
    /// type and order, on each instruction set: 1..=20 weight rows (whole and partial panels of
    /// eight), 1..=MAX_ACTS + 8 activation rows (below the GEMM's minimum, its tiles of four and
    /// their rest, more than one pass of [`MAX_ACTS`]).
    #[test]
    fn dot_rows_batch_equals_llama_cpp_grouping_bit_for_bit(
        seed in any::<u64>(),
        n_rows in 1usize..=20,
        blocks in 1usize..=3,
        n_acts in 1usize..=MAX_ACTS + 8,
    ) {
        let mut rng = Rng(seed);
        for w in WEIGHT_TYPES {
            let n = blocks * w.block_len().max(vec_dot_type(w).block_len());
            let rows: Vec<u8> = (0..n_rows).flat_map(|_| random_weights(w, n, &mut rng)).collect();
            let acts: Vec<Vec<u8>> =
                (0..n_acts).map(|_| quantized(w, &random_activations(n, &mut rng))).collect();
            for choice in runnable_isas() {
                for order in [DotOrder::VecDot, DotOrder::Tiled, DotOrder::Repacked, DotOrder::Free] {
                    let checked = isa::forced(choice, || batch_equals_groups(w, order, n, &rows, &acts));
                    prop_assert!(checked.is_ok(), "{} on {}", checked.unwrap_err(), choice);
                }
            }
        }
    }
}

/// [`dot_rows_batch_equals_llama_cpp_grouping_bit_for_bit`] at the GEMM's boundaries, for the
/// types it serves: 70 weight rows (a group of 64 and a partial panel), 130 blocks (three slices
/// of at most 64), a pass of [`MAX_ACTS`] activation rows then five.
#[test]
fn dot_rows_batch_of_wide_rows_and_many_panels_equals_grouping() {
    let mut rng = Rng(7);
    for w in [GgmlType::Q4_0, GgmlType::IQ4_NL] {
        let n = 130 * 32;
        let rows: Vec<u8> = (0..70)
            .flat_map(|_| random_weights(w, n, &mut rng))
            .collect();
        let acts: Vec<Vec<u8>> = (0..MAX_ACTS + 5)
            .map(|_| quantized(w, &random_activations(n, &mut rng)))
            .collect();
        for choice in runnable_isas() {
            let checked = isa::forced(choice, || {
                batch_equals_groups(w, DotOrder::Repacked, n, &rows, &acts)
            });
            assert!(checked.is_ok(), "{} on {choice}", checked.unwrap_err());
        }
    }
}

/// The grid types' whole-batch kernel (`simd::grid::rows_batch`) at its boundaries: 70
/// activation rows (a pass of 64, then a group of four and two single rows) and 21 (eights,
/// a four and a single row), against llama.cpp's grouping bit for bit, in the orders they have.
#[test]
fn grid_types_batch_kernel_equals_grouping_past_its_pass() {
    use GgmlType::*;
    let mut rng = Rng(11);
    for w in [IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M] {
        let n = 2 * 256;
        let rows: Vec<u8> = (0..5)
            .flat_map(|_| random_weights(w, n, &mut rng))
            .collect();
        for n_acts in [70, 21] {
            let acts: Vec<Vec<u8>> = (0..n_acts)
                .map(|_| quantized(w, &random_activations(n, &mut rng)))
                .collect();
            for choice in runnable_isas() {
                for order in [DotOrder::VecDot, DotOrder::Tiled] {
                    let checked =
                        isa::forced(choice, || batch_equals_groups(w, order, n, &rows, &acts));
                    assert!(checked.is_ok(), "{} on {choice}", checked.unwrap_err());
                }
            }
        }
    }
}

/// The unit grids' batch kernel (IQ1_S, IQ1_M: `simd::grid::rows_batch` sums four sub-blocks of
/// `q·scale + 15` times the activations in i16) at its bounds: every scale 15, activation rows
/// of all -127 and (but for one value a block) all 127 among random ones, against llama.cpp's
/// grouping bit for bit.
#[test]
fn unit_grids_batch_kernel_at_its_i16_bounds_equals_grouping() {
    use GgmlType::*;
    let mut rng = Rng(13);
    let n = 3 * 256;
    for w in [IQ1_S, IQ1_M] {
        let block = w.row_bytes(256).unwrap();
        let mut rows: Vec<u8> = (0..6)
            .flat_map(|_| random_weights(w, n, &mut rng))
            .collect();
        for b in rows.chunks_exact_mut(block) {
            if w == IQ1_S {
                // Bits 12..15 of the u16 qh[s] (from byte 34) are its scale.
                (0..8).for_each(|s| b[34 + 2 * s + 1] |= 0x70);
            } else {
                // Bits 0..12 of the u16 k of scales (from byte 48) are four scales.
                (0..4).for_each(|k| {
                    b[48 + 2 * k] = 0xFF;
                    b[48 + 2 * k + 1] |= 0x0F;
                });
            }
        }
        let acts: Vec<Vec<u8>> = (0..20)
            .map(|t| match t % 3 {
                0 => quantized(w, &vec![1.0; n]),
                // Each block's value of largest magnitude is made -127: the rest 127.
                1 => quantized(
                    w,
                    &(0..n)
                        .map(|i| if i % 256 == 0 { 1.0 } else { -0.9999 })
                        .collect::<Vec<_>>(),
                ),
                _ => quantized(w, &random_activations(n, &mut rng)),
            })
            .collect();
        for (t, q) in [(0, -127), (1, 127)] {
            assert!(
                blocks::<BlockQ8K>(&acts[t])
                    .iter()
                    .all(|b| b.qs[1..].iter().all(|&v| v == q)),
                "activation row {t} is not all {q}"
            );
        }
        for choice in runnable_isas() {
            for order in [DotOrder::VecDot, DotOrder::Tiled] {
                let checked =
                    isa::forced(choice, || batch_equals_groups(w, order, n, &rows, &acts));
                assert!(checked.is_ok(), "{} on {choice}", checked.unwrap_err());
            }
        }
    }
}
