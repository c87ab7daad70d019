//! `llm-server bench`: prefill and decode throughput, as llama.cpp's `llama-bench` measures them.
//!
//! For every thread count the model is loaded once; then each prompt length is prefilled from an
//! empty context (`ppN`) and each generation length is decoded greedily one token at a time
//! after a BOS token (`tgN`), `-r` times each. With `--streams S` (S > 1) a generation length is
//! also decoded by S sessions at once, one batched forward pass per step as the server's
//! continuous batching runs them (`tgNxS`, aggregate tokens per second of all S).
//! `bench/peer_bench.py` runs the same workload on llama.cpp, and `bench/compare.sh` alternates
//! the two.
//!
//! Every test also reports the CPU time it took per token (user + system time of the whole
//! process, `getrusage(RUSAGE_SELF)`, so the pool's spinning workers count): what a VM that sells
//! CPU time by the slice (a burstable shape, a cgroup quota) makes the user wait for.
//!
//! Every decode test also reports the bandwidth it implies: the weight bytes one forward pass
//! reads (`weight_bytes_per_token`, from the model's tensor table) × forward passes per second.
//! `--read-bandwidth` adds a probe of the machine's sequential read bandwidth ([`bandwidth`]),
//! the ceiling those figures run against.

mod bandwidth;

use std::path::PathBuf;
use std::time::Instant;

use llm_server::model::{decode_batch, LoadOptions, Model, Session, UBATCH};
use llm_server::threads::DefaultThreads;
use serde::Serialize;
use smallvec::SmallVec;

use super::CliResult;

#[derive(clap::Args)]
pub struct Bench {
    /// The GGUF model file.
    #[arg(long, short)]
    model: PathBuf,
    /// Prompt lengths to prefill, comma-separated (0 for none).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_values_t = [128])]
    n_prompt: Vec<usize>,
    /// Generation lengths to decode, comma-separated (0 for none).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_values_t = [128])]
    n_gen: Vec<usize>,
    /// Thread counts, comma-separated [default: the count `run` and `serve` pick: the physical
    /// cores, at most the CPUs the cgroup's quota grants].
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Concurrent streams for the decode tests, comma-separated: each S > 1 adds a `tgNxS` test
    /// of S sessions decoded together in one batched pass per step.
    #[arg(short = 's', long = "streams", value_delimiter = ',', default_values_t = [1])]
    streams: Vec<usize>,
    /// Repetitions of every test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,
    /// Also measure sequential read bandwidth (GB/s), at 1 thread and at every -t count, of an
    /// anonymous buffer of 4x the last-level cache (256 MiB..1 GiB, at most a quarter of
    /// MemAvailable) and of the model file's mapping (what decode reads), with AVX2 loads; the
    /// best and median of -r repetitions. Runs after the tests; -p 0 -n 0 runs it alone.
    #[arg(long)]
    read_bandwidth: bool,
    /// The probe's anonymous buffer in MiB, instead of 4x the last-level cache.
    #[arg(long, value_name = "MIB", requires = "read_bandwidth")]
    read_bandwidth_mib: Option<usize>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

/// The fixed, ordinary text whose tokens, cycled, make every prompt (the peer uses the same).
const TEXT: &str =
    "The quick brown fox jumps over the lazy dog while the memory of a small server stays free. ";

#[derive(Serialize)]
struct Report {
    engine: &'static str,
    model: String,
    cpu: String,
    /// The matmul kernels' instruction set (`--kernels`, or the best the CPU has).
    kernels: String,
    /// Bytes of weights one forward pass reads: every layer's matrices, the output matrix and
    /// one embedding row (`model::weight_bytes_per_token`).
    weight_bytes_per_token: u64,
    /// The thread count without `-t`, and why (`llm_server::threads::default_threads`).
    default_threads: DefaultThreads,
    results: Vec<TestResult>,
    /// `--read-bandwidth`'s probe, absent without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    read_bandwidth: Option<Vec<bandwidth::ReadBandwidth>>,
    /// Peak anonymous and file-backed resident memory seen after any run, and the kernel's
    /// high-water mark of all resident memory (kB, as /proc/self/status counts).
    rss_anon_peak_kb: u64,
    rss_file_peak_kb: u64,
    vm_hwm_kb: u64,
    /// Of the file-backed memory, the most the kernel mapped with 2 MiB entries after a run
    /// (`FilePmdMapped`, /proc/self/smaps_rollup): the weights in huge folios, so decode's stream
    /// over them is not a TLB miss per 4 KiB. 0 when the file was cached in small folios
    /// before it was mapped (written or read just before; see `Gguf::open`).
    file_pmd_mapped_kb: u64,
}

#[derive(Serialize)]
struct TestResult {
    /// `ppN` (prefill N tokens) or `tgN` (decode N tokens).
    test: String,
    threads: usize,
    tokens: usize,
    /// Tokens per second of every repetition, in run order.
    samples: Vec<f64>,
    median: f64,
    min: f64,
    max: f64,
    /// (max − min) / median.
    spread: f64,
    /// CPU milliseconds (user + system, all threads) per token, median of the repetitions:
    /// per prompt token for `ppN`, per generated token for `tgN` and `tgNxS`.
    cpu_ms_per_token: f64,
    /// CPU time over wall time of the median repetition: how many CPUs the test kept busy.
    cpu_utilisation: f64,
    /// Decode tests only: the weight bandwidth the median implies, GB/s (1e9 bytes):
    /// `weight_bytes_per_token` × forward passes per second (a `tgNxS` pass makes S tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    gb_per_s: Option<f64>,
}

impl Bench {
    pub fn run(mut self) -> CliResult {
        self.check()?;
        let default_threads = llm_server::threads::default_threads();
        if self.threads.is_empty() {
            self.threads = vec![default_threads.threads];
        }
        let mut mem = Memory::default();
        let mut results = Vec::new();
        let mut name = String::new();
        let mut bytes_per_token = 0;
        for &threads in &self.threads {
            let model = Model::load(
                &self.model,
                &LoadOptions {
                    threads,
                    mlock: false,
                },
            )?;
            name = model.name().to_owned();
            bytes_per_token = model.weight_bytes_per_token();
            let gb_per_s = |streams: usize| Bandwidth {
                bytes_per_token,
                streams,
            };
            let longest = self.n_prompt.iter().chain(&self.n_gen).max().copied();
            let n_ctx = longest.unwrap_or(0) + 1;
            if n_ctx > model.n_ctx_train() {
                return Err(format!(
                    "a test needs {n_ctx} tokens of context but the model was trained on {}; \
                     lower -p/-n",
                    model.n_ctx_train()
                )
                .into());
            }
            let mut session = model.new_session(n_ctx.max(8));
            let tokens = prompt(&model, n_ctx);
            // Warm the page cache and the code paths once.
            session.eval(&model, &tokens[..8.min(tokens.len())])?;
            mem.sample(); // a reading even when only the probe runs
            for &n in self.n_prompt.iter().filter(|&&n| n > 0) {
                let samples = (0..self.repetitions)
                    .map(|_| {
                        let r = prefill(&model, &mut session, &tokens[..n]);
                        mem.sample();
                        r
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                results.push(TestResult::new(format!("pp{n}"), threads, n, samples, None));
            }
            for &n in self.n_gen.iter().filter(|&&n| n > 0) {
                let samples = (0..self.repetitions)
                    .map(|_| {
                        let r = decode(&model, &mut session, tokens[0], n);
                        mem.sample();
                        r
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                results.push(TestResult::new(
                    format!("tg{n}"),
                    threads,
                    n,
                    samples,
                    Some(gb_per_s(1)),
                ));
                for &k in self.streams.iter().filter(|&&k| k > 1) {
                    let mut sessions: Vec<Session> =
                        (0..k).map(|_| model.new_session(n_ctx.max(8))).collect();
                    let samples = (0..self.repetitions)
                        .map(|_| {
                            let r = decode_streams(&model, &mut sessions, &tokens, n);
                            mem.sample();
                            r
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    results.push(TestResult::new(
                        format!("tg{n}x{k}"),
                        threads,
                        n * k,
                        samples,
                        Some(gb_per_s(k)),
                    ));
                }
            }
        }
        // The memory figures are read before the probe: its buffer is not the engine's memory.
        let vm_hwm_kb = status_kb("VmHWM:").unwrap_or(0);
        let read_bandwidth = if self.read_bandwidth {
            let buffer = bandwidth::buffer_bytes(self.read_bandwidth_mib);
            Some(bandwidth::probe(
                &self.model,
                &self.threads,
                self.repetitions,
                buffer,
            )?)
        } else {
            None
        };
        let report = Report {
            engine: "llm-server",
            model: name,
            cpu: cpu_model(),
            kernels: llm_server::quant::isa::selected().to_string(),
            weight_bytes_per_token: bytes_per_token,
            default_threads,
            results,
            read_bandwidth,
            rss_anon_peak_kb: mem.anon,
            rss_file_peak_kb: mem.file,
            vm_hwm_kb,
            file_pmd_mapped_kb: mem.file_pmd,
        };
        if self.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print_table(&report);
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        if self.threads.contains(&0) {
            return Err("-t/--threads must be at least 1".into());
        }
        if self.repetitions == 0 {
            return Err("-r/--repetitions must be at least 1".into());
        }
        if let Some(&k) = self.streams.iter().find(|&&k| k == 0 || k > UBATCH) {
            return Err(format!(
                "-s/--streams {k}: give between 1 and {UBATCH} streams (one batched pass holds \
                 at most {UBATCH} rows)"
            ));
        }
        if self.read_bandwidth_mib == Some(0) {
            return Err("--read-bandwidth-mib must be at least 1".into());
        }
        if !self.read_bandwidth && self.n_prompt.iter().chain(&self.n_gen).all(|&n| n == 0) {
            return Err(
                "nothing to measure: give a prompt length (-p) or a generation length \
                 (-n) above 0, or --read-bandwidth"
                    .into(),
            );
        }
        Ok(())
    }
}

/// BOS, then the text's tokens cycled to `n` in all.
fn prompt(model: &Model, n: usize) -> Vec<u32> {
    let tok = model.tokenizer();
    let ids = tok.encode(TEXT, false, false);
    let mut p = vec![tok.bos().unwrap_or(ids[0])];
    p.extend(ids.iter().cycle().take(n.saturating_sub(1)));
    p
}

/// Prefilling `tokens` into an empty context.
fn prefill(
    model: &Model,
    s: &mut Session,
    tokens: &[u32],
) -> Result<Sample, Box<dyn std::error::Error>> {
    s.clear();
    let t = Timer::start();
    s.eval(model, tokens)?;
    Ok(t.stop(tokens.len()))
}

/// Decoding `n` tokens greedily after `first` (which is not timed).
// Not inlined, so `valgrind --tool=callgrind --toggle-collect=` can count one test alone.
#[inline(never)]
fn decode(
    model: &Model,
    s: &mut Session,
    first: u32,
    n: usize,
) -> Result<Sample, Box<dyn std::error::Error>> {
    s.clear();
    let mut next = argmax(s.eval(model, &[first])?);
    let t = Timer::start();
    for _ in 0..n {
        next = argmax(s.eval(model, &[next])?);
    }
    Ok(t.stop(n))
}

/// `sessions.len()` streams decoding `n` tokens each, all in one
/// batched pass per step; stream i starts after prompt token i (untimed), so the streams differ.
#[inline(never)]
fn decode_streams(
    model: &Model,
    sessions: &mut [Session],
    tokens: &[u32],
    n: usize,
) -> Result<Sample, Box<dyn std::error::Error>> {
    let mut next = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.iter_mut().enumerate() {
        s.clear();
        next.push([argmax(s.eval(model, &[tokens[i % tokens.len()]])?)]);
    }
    let mut batch: Vec<&mut Session> = sessions.iter_mut().collect();
    let t = Timer::start();
    for _ in 0..n {
        // On the stack (as the server's scheduler does): the timed loop allocates nothing.
        let inputs: SmallVec<[&[u32]; 8]> = next.iter().map(|t| &t[..]).collect();
        decode_batch(model, &mut batch, &inputs)?;
        drop(inputs); // SmallVec has a Drop: it ends the borrow of `next` here
        for (t, s) in next.iter_mut().zip(&batch) {
            *t = [argmax(s.logits_row(0))];
        }
    }
    Ok(t.stop(n * batch.len()))
}

/// One repetition of a test: its tokens, wall time and the process's CPU time.
#[derive(Clone, Copy)]
struct Sample {
    tokens: usize,
    secs: f64,
    cpu_secs: f64,
}

impl Sample {
    fn tok_per_s(&self) -> f64 {
        self.tokens as f64 / self.secs
    }

    fn cpu_ms_per_token(&self) -> f64 {
        self.cpu_secs * 1e3 / self.tokens as f64
    }
}

/// Wall and CPU clocks started together.
struct Timer {
    wall: Instant,
    cpu: f64,
}

impl Timer {
    fn start() -> Timer {
        let cpu = process_cpu_secs();
        Timer {
            wall: Instant::now(),
            cpu,
        }
    }

    fn stop(self, tokens: usize) -> Sample {
        let secs = self.wall.elapsed().as_secs_f64();
        Sample {
            tokens,
            secs,
            cpu_secs: process_cpu_secs() - self.cpu,
        }
    }
}

/// User + system CPU seconds of this process so far, every thread included.
fn process_cpu_secs() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer it is given; RUSAGE_SELF is valid,
    // so it cannot fail (and a zeroed rusage is a valid value if it did).
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32
}

/// What a decode test's tokens per second imply in bytes read: each forward pass reads
/// `bytes_per_token` of weights and makes `streams` tokens.
#[derive(Clone, Copy)]
struct Bandwidth {
    bytes_per_token: u64,
    streams: usize,
}

/// `samples` in ascending order.
fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

fn sorted_f(values: impl Iterator<Item = f64>) -> Vec<f64> {
    sorted(&values.collect::<Vec<_>>())
}

/// The median of samples already [`sorted`] (at least one).
fn median(sorted: &[f64]) -> f64 {
    let k = sorted.len();
    if k % 2 == 1 {
        sorted[k / 2]
    } else {
        (sorted[k / 2 - 1] + sorted[k / 2]) / 2.0
    }
}

impl TestResult {
    fn new(
        test: String,
        threads: usize,
        tokens: usize,
        runs: Vec<Sample>,
        bandwidth: Option<Bandwidth>,
    ) -> TestResult {
        let samples: Vec<f64> = runs.iter().map(Sample::tok_per_s).collect();
        let sorted = sorted(&samples);
        let cpu_ms = median(&sorted_f(runs.iter().map(Sample::cpu_ms_per_token)));
        let utilisation = median(&sorted_f(runs.iter().map(|r| r.cpu_secs / r.secs)));
        let median = median(&sorted);
        let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
        TestResult {
            test,
            threads,
            tokens,
            samples: samples.iter().map(|v| round1(*v)).collect(),
            median: round1(median),
            min: round1(min),
            max: round1(max),
            spread: ((max - min) / median * 1000.0).round() / 1000.0,
            cpu_ms_per_token: (cpu_ms * 1000.0).round() / 1000.0,
            cpu_utilisation: (utilisation * 100.0).round() / 100.0,
            gb_per_s: bandwidth.map(|b| {
                let gb = b.bytes_per_token as f64 * median / b.streams as f64 / 1e9;
                (gb * 100.0).round() / 100.0
            }),
        }
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn print_table(r: &Report) {
    println!("model {}, {}, {} kernels", r.model, r.cpu, r.kernels);
    println!("default threads: {}", r.default_threads);
    println!(
        "weights read per token: {:.1} MB",
        r.weight_bytes_per_token as f64 / 1e6
    );
    if !r.results.is_empty() {
        println!(
            "| test | threads | tok/s (median) | min | max | spread | CPU ms/token | CPUs busy \
             | weights GB/s |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    for t in &r.results {
        let gb = t.gb_per_s.map_or("-".to_owned(), |g| format!("{g:.2}"));
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} % | {:.2} | {:.2} | {gb} |",
            t.test,
            t.threads,
            t.median,
            t.min,
            t.max,
            t.spread * 100.0,
            t.cpu_ms_per_token,
            t.cpu_utilisation
        );
    }
    if let Some(bw) = &r.read_bandwidth {
        println!("| read bandwidth | threads | MiB read | best GB/s | median GB/s |");
        println!("|---|---|---|---|---|");
        for b in bw {
            println!(
                "| {} | {} | {} | {:.2} | {:.2} |",
                b.source,
                b.threads,
                b.bytes >> 20,
                b.best_gb_per_s,
                b.median_gb_per_s
            );
        }
    }
    println!(
        "peak RssAnon {} MiB, RssFile {} MiB, VmHWM {} MiB; FilePmdMapped {} MiB",
        r.rss_anon_peak_kb / 1024,
        r.rss_file_peak_kb / 1024,
        r.vm_hwm_kb / 1024,
        r.file_pmd_mapped_kb / 1024
    );
}

/// The largest RssAnon and RssFile seen so far (the kernel keeps a peak only of their sum).
#[derive(Default)]
struct Memory {
    anon: u64,
    file: u64,
    file_pmd: u64,
}

impl Memory {
    fn sample(&mut self) {
        self.anon = self.anon.max(status_kb("RssAnon:").unwrap_or(0));
        self.file = self.file.max(status_kb("RssFile:").unwrap_or(0));
        let pmd = proc_kb("/proc/self/smaps_rollup", "FilePmdMapped:").unwrap_or(0);
        self.file_pmd = self.file_pmd.max(pmd);
    }
}

/// A `kB` field of /proc/self/status.
fn status_kb(field: &str) -> Option<u64> {
    proc_kb("/proc/self/status", field)
}

/// A `kB` field of a /proc file of `Field:   N kB` lines.
fn proc_kb(path: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
