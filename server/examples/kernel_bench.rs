//! Single-core throughput of the mat-vec kernels over matrices larger than any cache, in GB/s of
//! weights read: the Gemma 3 270M LM head (262144 × 640 Q8_0, 178 MB) and rows of the other
//! decode-path types at a similar size. Decode is bandwidth-bound, so compare with the machine's
//! single-core read bandwidth (about 11 GB/s on the target VM kind).
//!
//! Other processes on a shared machine stretch the wall-clock time, so the kernel's own rate is
//! also given per second of this thread's on-CPU time (`/proc/thread-self/schedstat`).
//!
//! `cargo run -p llm-server --release --example kernel_bench`

use std::hint::black_box;
use std::time::{Duration, Instant};

use llm_server::quant::{quantize_row, vec_dot, vec_dot_type, DotOrder, GgmlType};

/// Bytes of the weight matrix per case: the size of the Q8_0 LM head.
const MATRIX_BYTES: usize = 262_144 * 680;
const PASSES: usize = 5;

/// SplitMix64: fills matrices quickly and reproducibly.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Byte offsets of each block's f16 scales, set to small normal values so that no NaN or
/// subnormal arithmetic (slow on some CPUs) distorts the timing.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

fn random_matrix(ty: GgmlType, n: usize, rows: usize, seed: &mut u64) -> Vec<u8> {
    let mut m = vec![0u8; rows * ty.row_bytes(n).unwrap()];
    for chunk in m.chunks_mut(8) {
        let r = next(seed).to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    let small = half::f16::from_f32(0.01).to_le_bytes();
    for block in m.chunks_exact_mut(ty.block_bytes()) {
        for &off in scale_offsets(ty) {
            block[off..off + 2].copy_from_slice(&small);
        }
    }
    m
}

/// Nanoseconds this thread has run on a CPU (first field of its schedstat).
fn on_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = stat
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

fn bench(ty: GgmlType, n: usize, label: &str, seed: &mut u64) {
    let row_bytes = ty.row_bytes(n).unwrap();
    let rows = MATRIX_BYTES / row_bytes;
    let matrix = random_matrix(ty, n, rows, seed);
    let x: Vec<f32> = (0..n)
        .map(|_| (next(seed) >> 40) as f32 / (1 << 23) as f32 - 1.0)
        .collect();
    let act_ty = vec_dot_type(ty);
    let mut act = vec![0u8; act_ty.row_bytes(n).unwrap()];
    quantize_row(act_ty, &x, &mut act);
    let mut out = vec![0f32; rows];

    let (mut wall, mut cpu) = (Duration::MAX, Duration::MAX);
    for _ in 0..PASSES {
        let (start, start_cpu) = (Instant::now(), on_cpu());
        for (o, row) in out.iter_mut().zip(matrix.chunks_exact(row_bytes)) {
            *o = vec_dot(ty, DotOrder::VecDot, n, row, &act);
        }
        black_box(&out);
        wall = wall.min(start.elapsed());
        cpu = cpu.min(on_cpu() - start_cpu);
    }
    let gbs = |t: Duration| matrix.len() as f64 / t.as_secs_f64() / 1e9;
    println!(
        "{label:<24} {:>13} {rows:>7} x {n:<4} {:>6.1} MB  wall {:>6.2} ms {:>5.2} GB/s  on-CPU {:>6.2} ms {:>5.2} GB/s {:>5.1} ns/row",
        format!("{ty} x {act_ty}"),
        matrix.len() as f64 / 1e6,
        wall.as_secs_f64() * 1e3,
        gbs(wall),
        cpu.as_secs_f64() * 1e3,
        gbs(cpu),
        cpu.as_nanos() as f64 / rows as f64,
    );
}

fn main() {
    let mut seed = 0x5eed;
    println!("best of {PASSES} single-threaded passes over each matrix");
    bench(GgmlType::Q8_0, 640, "LM head (Gemma 3 270M)", &mut seed);
    bench(GgmlType::Q5_0, 640, "q/k/gate/up rows", &mut seed);
    bench(GgmlType::Q4_K, 1024, "attn_output rows", &mut seed);
    bench(GgmlType::Q6_K, 2048, "ffn_down rows", &mut seed);
    bench(GgmlType::Q4_0, 640, "", &mut seed);
    bench(GgmlType::IQ4_NL, 1152, "", &mut seed);
    bench(GgmlType::Q5_K, 2048, "", &mut seed);
    bench(GgmlType::IQ4_XS, 2048, "", &mut seed);
    bench(GgmlType::F16, 640, "", &mut seed);
}
