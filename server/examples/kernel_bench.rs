//! Single-core throughput of the mat-vec kernels over matrices larger than any cache, in GB/s of
//! weights read: every weight type of the format table, each a matrix the size of the Gemma 3
//! 270M LM head (262144 × 640 Q8_0, 178 MB), by default with rows of 2048 values (the model's FFN
//! width; a whole number of blocks of every type) or as given: `q8_0:640` benches Q8_0 rows of 640
//! values (the LM head itself). Decode is bandwidth-bound, so compare with the machine's
//! single-core read bandwidth (about 11 GB/s on the target VM kind).
//!
//! Other processes on a shared machine stretch the wall-clock time, so the kernel's own rate is
//! also given per second of this thread's on-CPU time (`/proc/thread-self/schedstat`).
//!
//! `cargo run -p llm-server --release --example kernel_bench [-- TYPE:N ...]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use llm_server::quant::{quantize_row_for, random_row, vec_dot, vec_dot_type, DotOrder, GgmlType};

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

fn bench(ty: GgmlType, n: usize, seed: &mut u64) {
    let row_bytes = ty.row_bytes(n).unwrap();
    let rows = MATRIX_BYTES / row_bytes;
    // Small scales keep NaN and subnormal arithmetic (slow on some CPUs) out of the timing.
    let matrix = random_row(ty, n * rows, 0.01, &mut || next(seed));
    let x: Vec<f32> = (0..n)
        .map(|_| (next(seed) >> 40) as f32 / (1 << 23) as f32 - 1.0)
        .collect();
    let act_ty = vec_dot_type(ty);
    let mut act = vec![0u8; act_ty.row_bytes(n).unwrap()];
    quantize_row_for(ty, &x, &mut act);
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
        "{:>15} {rows:>7} x {n:<4} {:>6.1} MB  wall {:>6.2} ms {:>5.2} GB/s  on-CPU {:>6.2} ms {:>5.2} GB/s {:>5.1} ns/row",
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
    let cases: Vec<(GgmlType, usize)> = std::env::args()
        .skip(1)
        .map(|arg| {
            let parsed = arg.split_once(':').and_then(|(name, n)| {
                let ty = GgmlType::SUPPORTED.into_iter().find(|t| t.name() == name)?;
                Some((ty, n.parse().ok()?)).filter(|&(ty, n)| ty.row_bytes(n).is_some())
            });
            parsed.unwrap_or_else(|| panic!("{arg}: expected TYPE:N, N a whole number of blocks"))
        })
        .collect();
    let cases = if cases.is_empty() {
        GgmlType::SUPPORTED.map(|ty| (ty, 2048)).to_vec()
    } else {
        cases
    };
    let mut seed = 0x5eed;
    println!("best of {PASSES} single-threaded passes over each matrix");
    for (ty, n) in cases {
        bench(ty, n, &mut seed);
    }
}
