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
//! Every decode test also reports the bandwidth it implies: the weight bytes one forward pass
//! reads (`weight_bytes_per_token`, from the model's tensor table) × forward passes per second.
//! `--read-bandwidth` adds a probe of the machine's sequential read bandwidth ([`bandwidth`]),
//! the ceiling those figures run against.

mod bandwidth;

use std::path::PathBuf;
use std::time::Instant;

use llm_server::model::{decode_batch, LoadOptions, Model, Session, UBATCH};
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
    /// Thread counts, comma-separated.
    #[arg(short = 't', long = "threads", value_delimiter = ',', default_values_t = [1])]
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
    /// Decode tests only: the weight bandwidth the median implies, GB/s (1e9 bytes):
    /// `weight_bytes_per_token` × forward passes per second (a `tgNxS` pass makes S tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    gb_per_s: Option<f64>,
}

impl Bench {
    pub fn run(self) -> CliResult {
        self.check()?;
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

/// Tokens per second prefilling `tokens` into an empty context.
fn prefill(
    model: &Model,
    s: &mut Session,
    tokens: &[u32],
) -> Result<f64, Box<dyn std::error::Error>> {
    s.clear();
    let t = Instant::now();
    s.eval(model, tokens)?;
    Ok(tokens.len() as f64 / t.elapsed().as_secs_f64())
}

/// Tokens per second decoding `n` tokens greedily after `first` (which is not timed).
// Not inlined, so `valgrind --tool=callgrind --toggle-collect=` can count one test alone.
#[inline(never)]
fn decode(
    model: &Model,
    s: &mut Session,
    first: u32,
    n: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    s.clear();
    let mut next = argmax(s.eval(model, &[first])?);
    let t = Instant::now();
    for _ in 0..n {
        next = argmax(s.eval(model, &[next])?);
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Aggregate tokens per second of `sessions.len()` streams decoding `n` tokens each, all in one
/// batched pass per step; stream i starts after prompt token i (untimed), so the streams differ.
#[inline(never)]
fn decode_streams(
    model: &Model,
    sessions: &mut [Session],
    tokens: &[u32],
    n: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut next = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.iter_mut().enumerate() {
        s.clear();
        next.push([argmax(s.eval(model, &[tokens[i % tokens.len()]])?)]);
    }
    let mut batch: Vec<&mut Session> = sessions.iter_mut().collect();
    let t = Instant::now();
    for _ in 0..n {
        // On the stack (as the server's scheduler does): the timed loop allocates nothing.
        let inputs: SmallVec<[&[u32]; 8]> = next.iter().map(|t| &t[..]).collect();
        decode_batch(model, &mut batch, &inputs)?;
        drop(inputs); // SmallVec has a Drop: it ends the borrow of `next` here
        for (t, s) in next.iter_mut().zip(&batch) {
            *t = [argmax(s.logits_row(0))];
        }
    }
    Ok((n * batch.len()) as f64 / t.elapsed().as_secs_f64())
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
        samples: Vec<f64>,
        bandwidth: Option<Bandwidth>,
    ) -> TestResult {
        let sorted = sorted(&samples);
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
    println!(
        "weights read per token: {:.1} MB",
        r.weight_bytes_per_token as f64 / 1e6
    );
    if !r.results.is_empty() {
        println!("| test | threads | tok/s (median) | min | max | spread | weights GB/s |");
        println!("|---|---|---|---|---|---|---|");
    }
    for t in &r.results {
        let gb = t.gb_per_s.map_or("-".to_owned(), |g| format!("{g:.2}"));
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} % | {gb} |",
            t.test,
            t.threads,
            t.median,
            t.min,
            t.max,
            t.spread * 100.0
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
