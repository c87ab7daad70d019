//! `bench --read-bandwidth`: how fast this machine streams memory, the ceiling decode runs
//! against (it reads every weight once a token, see `model::weight_bytes_per_token`).
//!
//! Two sources, each read sequentially with 32-byte AVX2 loads summed into four accumulators
//! (so the loads cannot be optimised away and no add chain limits them), at 1 thread and at every
//! `-t` count, the buffer split into one contiguous part per thread on the engine's own pool:
//! - `anonymous`: a buffer of 4× the last-level cache (clamped to 256 MiB..1 GiB and to a quarter
//!   of MemAvailable), written first so every page is real memory, not the shared zero page;
//! - `model_file`: the model file's mapping, page-cache pages behind 4 KiB mappings, which is
//!   what decode reads. Its first, untimed pass faults the pages in.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use llm_server::gguf::Gguf;
use llm_server::threads::Pool;
use serde::Serialize;

const MIB: usize = 1 << 20;
/// The anonymous buffer's bounds when it follows the cache size.
const MIN_BUFFER: usize = 256 * MIB;
const MAX_BUFFER: usize = 1024 * MIB;
/// Bytes one step of the kernel reads: four 32-byte loads. Parts are multiples of it.
const STEP: usize = 128;

#[derive(Serialize)]
pub struct ReadBandwidth {
    /// `anonymous` (a freshly written buffer) or `model_file` (the model's mapping).
    pub source: &'static str,
    pub threads: usize,
    /// Bytes read by one repetition.
    pub bytes: u64,
    /// GB/s (1e9 bytes) of every repetition, in run order.
    pub samples_gb_per_s: Vec<f64>,
    pub best_gb_per_s: f64,
    pub median_gb_per_s: f64,
}

/// The anonymous buffer's size: `mib` if given, else 4× the last-level cache within the bounds.
pub fn buffer_bytes(mib: Option<usize>) -> usize {
    if let Some(mib) = mib {
        return mib * MIB;
    }
    let want = llc_bytes().map_or(MIN_BUFFER, |c| (4 * c).clamp(MIN_BUFFER, MAX_BUFFER));
    // A small box must not be pushed into reclaim (or evict the model's pages) by its own probe.
    match llm_server::limits::mem_available() {
        Some(avail) => want
            .min(usize::try_from(avail / 4).unwrap_or(usize::MAX))
            .max(MIB),
        None => want,
    }
}

/// Runs the probe at 1 thread and at every count of `threads`, `reps` times each.
pub fn probe(
    model: &Path,
    threads: &[usize],
    reps: usize,
    buffer: usize,
) -> Result<Vec<ReadBandwidth>, Box<dyn std::error::Error>> {
    let mut counts: Vec<usize> = std::iter::once(1).chain(threads.iter().copied()).collect();
    counts.sort_unstable();
    counts.dedup();
    // The alignment is taken inside: a plain Vec<u8> of this size is only 16-byte aligned.
    let anon = vec![0x5au8; buffer + 64];
    let start = anon.as_ptr().align_offset(64);
    let anon = &anon[start..start + buffer];
    let file = Gguf::open(model)?;
    let mut out = Vec::new();
    for &t in &counts {
        let pool = Pool::new(t);
        for (source, bytes) in [("anonymous", anon), ("model_file", file.bytes())] {
            out.push(measure(&pool, source, bytes, reps));
        }
    }
    Ok(out)
}

fn measure(pool: &Pool, source: &'static str, bytes: &[u8], reps: usize) -> ReadBandwidth {
    let sink = AtomicU64::new(0);
    let parts = parts(bytes.len(), pool.threads());
    let pass = || {
        pool.broadcast(&|i| {
            let s = sum(&bytes[parts[i].clone()]);
            sink.fetch_add(s, Ordering::Relaxed);
        })
    };
    pass(); // untimed: faults in the file's pages, wakes the workers
    let samples: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            pass();
            bytes.len() as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    std::hint::black_box(sink.load(Ordering::Relaxed));
    let sorted = super::sorted(&samples);
    let (k, median) = (sorted.len(), super::median(&sorted));
    ReadBandwidth {
        source,
        threads: pool.threads(),
        bytes: bytes.len() as u64,
        samples_gb_per_s: samples.iter().map(|&v| round2(v)).collect(),
        best_gb_per_s: round2(sorted[k - 1]),
        median_gb_per_s: round2(median),
    }
}

/// `n` bytes split into `threads` contiguous ranges, every boundary a multiple of [`STEP`].
fn parts(n: usize, threads: usize) -> Vec<std::ops::Range<usize>> {
    let per = n.div_ceil(threads).div_ceil(STEP) * STEP;
    (0..threads)
        .map(|i| (i * per).min(n)..((i + 1) * per).min(n))
        .collect()
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The wrapping sum of `bytes` as 64-bit lanes (the tail bytewise): a result that needs every load.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
fn sum(bytes: &[u8]) -> u64 {
    // SAFETY: AVX2 is enabled for the whole build (the cfg above), and main checks the CPU has it.
    unsafe { sum_avx2(bytes) }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
#[target_feature(enable = "avx2")]
fn sum_avx2(bytes: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let steps = bytes.chunks_exact(STEP);
    let tail: u64 = steps.remainder().iter().map(|&b| b as u64).sum();
    let mut acc = [_mm256_setzero_si256(); 4];
    for step in steps {
        let p = step.as_ptr().cast::<__m256i>();
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: load j reads bytes 32j..32j+32 of a STEP-byte chunk; loadu needs no
            // alignment.
            *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(p.add(j)) });
        }
    }
    let v = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` is 32 writable bytes.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
    lanes.iter().fold(tail, |s, &l| s.wrapping_add(l))
}

/// The same sum without AVX2 (builds for other targets; the shipped binary never runs it).
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
fn sum(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let tail: u64 = words.remainder().iter().map(|&b| b as u64).sum();
    words.fold(tail, |s, w| {
        s.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")))
    })
}

/// The largest data or unified cache of CPU 0, from sysfs.
fn llc_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| {
        let p = e.ok()?.path();
        let ty = std::fs::read_to_string(p.join("type")).ok()?;
        if ty.trim() == "Instruction" {
            return None;
        }
        parse_size(std::fs::read_to_string(p.join("size")).ok()?.trim())
    })
    .max()
}

/// sysfs cache sizes: `48K`, `2048K`, `32M`.
fn parse_size(s: &str) -> Option<usize> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    num.parse::<usize>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_reads_every_byte() {
        // 1000 bytes: seven whole steps and a 104-byte tail, at an odd start.
        let v: Vec<u8> = (0..1001u32).map(|i| (i * 7 % 251) as u8).collect();
        let b = &v[1..];
        let mut want = 0u64;
        for w in b[..896].chunks_exact(8) {
            want = want.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()));
        }
        want += b[896..].iter().map(|&x| x as u64).sum::<u64>();
        assert_eq!(sum(b), want);
    }

    #[test]
    fn parts_cover_the_buffer_in_step_multiples() {
        for (n, t) in [(1000, 1), (1000, 2), (1 << 20, 3), (100, 4), (0, 2)] {
            let p = parts(n, t);
            assert_eq!(p.len(), t);
            assert_eq!(p[0].start, 0);
            assert_eq!(p[t - 1].end, n);
            for w in p.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].end == n || w[0].end % STEP == 0, "{n} {t}: {p:?}");
            }
        }
    }

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("32M"), Some(32 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size(""), None);
    }
}
