//! Single-core throughput of the mat-vec kernels over matrices larger than any cache, in GB/s of
//! weights read: every weight type of the format table, each a matrix the size of the Gemma 3
//! 270M LM head (262144 × 640 Q8_0, 178 MB), by default with rows of 2048 values (the model's FFN
//! width; a whole number of blocks of every type) or as given: `q8_0:640` benches Q8_0 rows of 640
//! values (the LM head itself). Rows go through `dot_rows` in the float order decode gives such a
//! matrix (`DotOrder::of` for one activation row), or the one named third: `q8_0:640:free` is the
//! LM head as decode computes it. Decode is bandwidth-bound, so compare with the machine's
//! single-core read bandwidth (`llm-server bench --read-bandwidth`; about 11 GB/s on the target
//! VM kind).
//!
//! Other processes on a shared machine stretch the wall-clock time, so the kernel's own rate is
//! also given per second of this thread's on-CPU time (`/proc/thread-self/schedstat`).
//!
//! `--bytes B` sets the matrix size instead (rounded down to whole groups of eight rows): a
//! matrix that fits in L2 (`--bytes 800000`) shows what the kernel's instructions allow, apart
//! from memory; a kernel no faster from L2 than from memory is bound by its instructions.
//!
//! `--kernels avx2` runs the x86-64-v3 kernels on a CPU that has VNNI (as the server's flag).
//!
//! `--streams S` gives every pass S activation rows (`dot_rows_multi`, as a batch of S decode
//! streams). The GB/s are still of the weights, read once per pass: against a run without
//! `--streams`, a batch that costs no more than one stream keeps the rate, and one that gains
//! nothing over S single passes divides it by S.
//!
//! `--batch B` gives every pass B activation rows through `dot_rows_batch` instead (prefill's
//! micro-batch, the GEMM), and adds the rate in multiply-adds: weights × activation rows per
//! second of on-CPU time.
//!
//! `cargo run -p llm-server --release --example kernel_bench [-- [--bytes B] [--kernels K]
//! [--streams S | --batch B] TYPE:N[:ORDER] ...]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use llm_server::quant::{
    dot_rows, dot_rows_batch, dot_rows_multi, isa, quantize_row_for, random_row, vec_dot_type,
    DotOrder, GgmlType,
};

/// Bytes of the weight matrix per case unless `--bytes` says: the size of the Q8_0 LM head.
const MATRIX_BYTES: usize = 262_144 * 680;
const PASSES: usize = 5;
/// Bytes each pass reads at least: a pass of a few milliseconds or less is below the resolution
/// of the on-CPU clock.
const REPEAT_BYTES: usize = 400_000_000;

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

fn bench(
    ty: GgmlType,
    n: usize,
    order: Option<DotOrder>,
    bytes: usize,
    streams: usize,
    batch: bool,
    seed: &mut u64,
) {
    let row_bytes = ty.row_bytes(n).unwrap();
    // Whole groups of eight rows, as every model's matrices come.
    let rows = (bytes / row_bytes / 8 * 8).max(8);
    // Prefill's order for a micro-batch, decode's otherwise.
    let order = order.unwrap_or(DotOrder::of(ty, rows, if batch { streams } else { 1 }));
    // Small scales keep NaN and subnormal arithmetic (slow on some CPUs) out of the timing.
    let matrix = random_row(ty, n * rows, 0.01, &mut || next(seed));
    let act_ty = vec_dot_type(ty);
    let acts: Vec<Vec<u8>> = (0..streams)
        .map(|_| {
            let x: Vec<f32> = (0..n)
                .map(|_| (next(seed) >> 40) as f32 / (1 << 23) as f32 - 1.0)
                .collect();
            let mut act = vec![0u8; act_ty.row_bytes(n).unwrap()];
            quantize_row_for(ty, &x, &mut act);
            act
        })
        .collect();
    let act_refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
    let mut outs = vec![vec![0f32; rows]; streams];

    // One pass: one activation row through `dot_rows` (the decode path of one stream), several
    // through `dot_rows_multi`, or a micro-batch through `dot_rows_batch`.
    let mut pass = |matrix: &[u8]| {
        if batch {
            let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            dot_rows_batch(ty, order, n, matrix, &act_refs, &mut out_refs);
        } else if streams == 1 {
            dot_rows(ty, order, n, matrix, &acts[0], &mut outs[0]);
        } else {
            let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            dot_rows_multi(ty, order, n, matrix, &act_refs, &mut out_refs);
        }
        black_box(&outs);
    };
    // A small matrix goes through several times per pass, so that each pass reads at least
    // REPEAT_BYTES: the on-CPU clock ticks in milliseconds.
    let repeats = REPEAT_BYTES.div_ceil(matrix.len()) as u32;
    let (mut wall, mut cpu) = (Duration::MAX, Duration::MAX);
    for _ in 0..PASSES {
        let (start, start_cpu) = (Instant::now(), on_cpu());
        for _ in 0..repeats {
            pass(black_box(&matrix));
        }
        wall = wall.min(start.elapsed() / repeats);
        cpu = cpu.min((on_cpu() - start_cpu) / repeats);
    }
    let gbs = |t: Duration| matrix.len() as f64 / t.as_secs_f64() / 1e9;
    let macs = if batch {
        format!(
            " {:>6.1} GMAC/s",
            (rows * n * streams) as f64 / cpu.as_secs_f64() / 1e9
        )
    } else {
        String::new()
    };
    println!(
        "{:>15} {rows:>7} x {n:<4} {:>6.1} MB  wall {:>6.2} ms {:>5.2} GB/s  on-CPU {:>6.2} ms {:>5.2} GB/s {:>5.1} ns/row{macs}",
        format!("{ty} x {act_ty} {order:?}"),
        matrix.len() as f64 / 1e6,
        wall.as_secs_f64() * 1e3,
        gbs(wall),
        cpu.as_secs_f64() * 1e3,
        gbs(cpu),
        cpu.as_nanos() as f64 / rows as f64,
    );
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut bytes = MATRIX_BYTES;
    let mut streams = 1;
    let mut batch = false;
    if let Some(at) = args.iter().position(|a| a == "--batch") {
        streams = match args.get(at + 1).and_then(|b| b.parse().ok()) {
            Some(b) if (1..=4096).contains(&b) => b,
            _ => {
                eprintln!("--batch: expected 1 to 4096 activation rows, e.g. --batch 64");
                std::process::exit(2)
            }
        };
        batch = true;
        args.drain(at..at + 2);
    }
    if let Some(at) = args.iter().position(|a| a == "--streams") {
        if batch {
            eprintln!("--streams and --batch: give one of them");
            std::process::exit(2)
        }
        streams = match args.get(at + 1).and_then(|b| b.parse().ok()) {
            Some(s) if (1..=16).contains(&s) => s,
            _ => {
                eprintln!("--streams: expected 1 to 16 activation rows, e.g. --streams 2");
                std::process::exit(2)
            }
        };
        args.drain(at..at + 2);
    }
    if let Some(at) = args.iter().position(|a| a == "--bytes") {
        bytes = match args.get(at + 1).and_then(|b| b.parse().ok()) {
            Some(b) if b > 0 => b,
            _ => {
                eprintln!(
                    "--bytes: expected a positive whole number of bytes, e.g. --bytes 800000"
                );
                std::process::exit(2)
            }
        };
        args.drain(at..at + 2);
    }
    if let Some(at) = args.iter().position(|a| a == "--kernels") {
        let choice = args
            .get(at + 1)
            .and_then(|k| isa::Choice::from_str(k, true).ok());
        let Some(choice) = choice else {
            eprintln!("--kernels: expected avx2 or vnni");
            std::process::exit(2)
        };
        if let Err(e) = isa::select(choice) {
            eprintln!("{e}");
            std::process::exit(2)
        }
        args.drain(at..at + 2);
    }
    let cases: Vec<_> = args.iter().map(|arg| parse_case(arg)).collect();
    let cases = if cases.is_empty() {
        GgmlType::SUPPORTED.map(|ty| (ty, 2048, None)).to_vec()
    } else {
        cases
    };
    let mut seed = 0x5eed;
    println!(
        "best of {PASSES} single-threaded passes over each matrix, {} kernels, {streams} \
         activation row(s) per pass{}",
        isa::selected(),
        if batch { " (dot_rows_batch)" } else { "" }
    );
    for (ty, n, order) in cases {
        bench(ty, n, order, bytes, streams, batch, &mut seed);
    }
}

/// `TYPE:N[:ORDER]`; exits naming the expected form on anything else.
fn parse_case(arg: &str) -> (GgmlType, usize, Option<DotOrder>) {
    let mut parts = arg.split(':');
    let ty = parts
        .next()
        .and_then(|name| GgmlType::SUPPORTED.into_iter().find(|t| t.name() == name));
    let n = parts.next().and_then(|n| n.parse().ok());
    let order = match parts.next() {
        None => Some(None),
        Some("vecdot") => Some(Some(DotOrder::VecDot)),
        Some("repacked") => Some(Some(DotOrder::Repacked)),
        Some("tiled") => Some(Some(DotOrder::Tiled)),
        Some("free") => Some(Some(DotOrder::Free)),
        Some(_) => None,
    };
    match (ty, n, order, parts.next()) {
        (Some(ty), Some(n), Some(order), None) if ty.row_bytes(n).is_some() => (ty, n, order),
        _ => {
            eprintln!(
                "{arg}: expected TYPE:N[:ORDER], N a whole number of the type's blocks, ORDER one \
                 of vecdot, repacked, tiled, free"
            );
            std::process::exit(2)
        }
    }
}
