//! `llm-server plan`: the memory the server would hold, beside the limits it runs under, as a
//! table or (`--json`) for programs: the appliance's image builders plan the real model file
//! this way and hold the profile's memory limits to the result. `serve` runs the same check
//! before loading anything.

use std::fmt::Write;
use std::path::PathBuf;
use std::str::FromStr;

use llm_server::exit::{Refusal, Status};
use llm_server::gguf::Gguf;
use llm_server::limits::{Fit, HumanBytes, MemoryLimits};
use llm_server::model::Config;
use llm_server::plan::MemoryPlan;

use super::CliResult;

/// Context per slot when none is asked for: Ollama's default, enough for chat.
const DEFAULT_CTX: usize = 4096;

#[derive(clap::Args)]
pub struct Plan {
    /// The GGUF model file.
    #[arg(long, short)]
    model: PathBuf,
    #[command(flatten)]
    sizing: Sizing,
    /// Print the plan as JSON (the inputs, every part in bytes, the limits and the verdict)
    /// instead of the table. The exit status is the same.
    #[arg(long)]
    json: bool,
}

/// How much the server allocates: shared by `plan` and `serve`.
#[derive(clap::Args, Clone, Copy)]
pub struct Sizing {
    /// Tokens of context per slot, or `auto` for the largest context that fits the memory
    /// limits [default: 4096, or the model's training context if smaller]
    #[arg(long, short = 'c')]
    pub ctx_size: Option<CtxSize>,
    /// Requests generated at the same time, each with its own KV cache.
    #[arg(long, short = 'p', default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtxSize {
    Auto,
    Tokens(usize),
}

impl FromStr for CtxSize {
    type Err = String;

    fn from_str(s: &str) -> Result<CtxSize, String> {
        match s {
            "auto" => Ok(CtxSize::Auto),
            _ => match s.parse::<usize>() {
                Ok(n) if n > 0 => Ok(CtxSize::Tokens(n)),
                _ => Err(format!(
                    "`{s}` is not a context size: give a number of tokens or `auto`"
                )),
            },
        }
    }
}

/// A plan and the limits it was checked against.
pub struct Checked {
    pub plan: MemoryPlan,
    pub limits: MemoryLimits,
    pub n_ctx_train: usize,
}

impl Checked {
    /// Plans `sizing` for `gguf`; with `auto`, the largest context (up to the training context)
    /// under the tightest limit, or the smallest one when nothing fits (reported as not fitting).
    pub fn new(gguf: &Gguf, sizing: Sizing) -> Result<Checked, Box<dyn std::error::Error>> {
        let limits = MemoryLimits::discover();
        let n_ctx_train = Config::from_gguf(gguf)?.n_ctx_train;
        let parallel = usize::from(sizing.parallel);
        let ctx_size = sizing
            .ctx_size
            .unwrap_or(CtxSize::Tokens(DEFAULT_CTX.min(n_ctx_train)));
        let plan = match ctx_size {
            CtxSize::Tokens(n) => MemoryPlan::for_model_file(gguf, n, parallel)?,
            CtxSize::Auto => {
                let budget = limits.tightest().map_or(u64::MAX, |l| l.bytes);
                match MemoryPlan::largest_fitting(gguf, parallel, n_ctx_train, budget)? {
                    Some(plan) => plan,
                    None => MemoryPlan::for_model_file(gguf, n_ctx_train.min(256), parallel)?,
                }
            }
        };
        Ok(Checked {
            plan,
            limits,
            n_ctx_train,
        })
    }

    pub fn fits(&self) -> bool {
        self.fit() == Fit::Now
    }

    pub fn fit(&self) -> Fit {
        self.limits.fit(self.plan.total())
    }

    /// Reads the limits again (what the host has free changes), keeping the plan.
    pub fn recheck(&mut self) {
        self.limits = MemoryLimits::discover();
    }

    /// The table `plan` prints and `serve` prints when refusing.
    pub fn table(&self, model: &str) -> String {
        let p = &self.plan;
        let mut out = String::new();
        let slots = if p.parallel == 1 { "slot" } else { "slots" };
        let _ = writeln!(
            out,
            "memory plan for {model}: context {} tokens x {} {slots}",
            p.n_ctx, p.parallel
        );
        if p.n_ctx > self.n_ctx_train {
            let _ = writeln!(
                out,
                "  (beyond the model's training context of {} tokens)",
                self.n_ctx_train
            );
        }
        let rows = [
            ("weights (file-backed, page cache)", p.weights_bytes),
            ("KV cache (anonymous)", p.kv_bytes),
            ("scratch (anonymous)", p.scratch_bytes),
            ("vocabulary (anonymous)", p.vocab_bytes),
            ("total", p.total()),
        ];
        for (what, bytes) in rows {
            let _ = writeln!(out, "  {what:<58} {:>11}", HumanBytes(bytes).to_string());
        }
        let _ = writeln!(out, "limits found:");
        if self.limits.limits.is_empty() {
            let _ = writeln!(out, "  none (no memory cgroup limit, no /proc/meminfo)");
        }
        for limit in &self.limits.limits {
            let verdict = match p.total().checked_sub(limit.bytes) {
                Some(over) if over > 0 => format!("short by {}", HumanBytes(over)),
                _ => "fits".to_owned(),
            };
            let _ = writeln!(
                out,
                "  {:<58} {:>11}   {verdict}",
                limit.source,
                HumanBytes(limit.bytes).to_string()
            );
        }
        let verdict = match self.fit() {
            Fit::Now => "fits",
            Fit::Later => "does not fit what the host has free now, only what other processes hold stands in the way; free memory, or lower --ctx-size or --parallel",
            Fit::Never => "does not fit; lower --ctx-size or --parallel, try --ctx-size auto, or raise the memory limit (MemoryMax= of the unit)",
        };
        let _ = writeln!(out, "verdict: {verdict}");
        out
    }

    /// The plan for programs: what was planned, each part and the total in bytes, the limits
    /// found and whether the plan fits them.
    pub fn json(&self, model: &str) -> PlanJson<'_> {
        let p = &self.plan;
        PlanJson {
            model: model.to_owned(),
            ctx_size: p.n_ctx,
            parallel: p.parallel,
            n_ctx_train: self.n_ctx_train,
            weights_bytes: p.weights_bytes,
            kv_cache_bytes: p.kv_bytes,
            scratch_bytes: p.scratch_bytes,
            vocabulary_bytes: p.vocab_bytes,
            total_bytes: p.total(),
            limits: self
                .limits
                .limits
                .iter()
                .map(|l| LimitJson {
                    source: &l.source,
                    bytes: l.bytes,
                })
                .collect(),
            fits: self.fits(),
        }
    }
}

/// `plan --json`. The keys are an interface (the appliance's image builders read them,
/// appliance/src/plan.rs): add keys, never rename one.
#[derive(serde::Serialize)]
pub struct PlanJson<'a> {
    /// The inputs: the model file as given, the context per slot as planned (`auto` and the
    /// default resolved), the slots.
    model: String,
    ctx_size: usize,
    parallel: usize,
    n_ctx_train: usize,
    weights_bytes: u64,
    kv_cache_bytes: u64,
    scratch_bytes: u64,
    vocabulary_bytes: u64,
    total_bytes: u64,
    /// Every limit found on this machine (`source`, `bytes`), and the verdict against the
    /// tightest.
    limits: Vec<LimitJson<'a>>,
    fits: bool,
}

#[derive(serde::Serialize)]
struct LimitJson<'a> {
    source: &'a str,
    bytes: u64,
}

impl Plan {
    pub fn run(self) -> CliResult {
        let gguf = Gguf::open(&self.model)?;
        let checked = Checked::new(&gguf, self.sizing)?;
        let model = self.model.display().to_string();
        if self.json {
            println!("{}", serde_json::to_string_pretty(&checked.json(&model))?);
        } else {
            print!("{}", checked.table(&model));
        }
        if !checked.fits() {
            // A distinct status, so scripts can tell "does not fit" from "cannot read the model".
            return Err(Refusal {
                status: Status::DoesNotFit,
                message: "the memory plan does not fit the limits (the table above)".into(),
            }
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctx_size_parses() {
        assert_eq!("auto".parse(), Ok(CtxSize::Auto));
        assert_eq!("2048".parse(), Ok(CtxSize::Tokens(2048)));
        assert!("0".parse::<CtxSize>().is_err());
        assert!("big".parse::<CtxSize>().unwrap_err().contains("`big`"));
    }

    #[test]
    fn json_holds_the_inputs_and_every_part_of_the_plan() {
        let gguf = Gguf::open(&test_support::synth("synth-gemma3-q8_0.gguf")).unwrap();
        let sizing = Sizing {
            ctx_size: Some(CtxSize::Tokens(512)),
            parallel: 2,
        };
        let checked = Checked::new(&gguf, sizing).unwrap();
        let json = serde_json::to_value(checked.json("m.gguf")).unwrap();
        let p = &checked.plan;
        let number = |key: &str| {
            json[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key}: {json}"))
        };
        assert_eq!(json["model"], "m.gguf");
        assert_eq!((number("ctx_size"), number("parallel")), (512, 2));
        assert_eq!(number("n_ctx_train"), checked.n_ctx_train as u64);
        assert_eq!(number("weights_bytes"), p.weights_bytes);
        assert_eq!(number("kv_cache_bytes"), p.kv_bytes);
        assert_eq!(number("scratch_bytes"), p.scratch_bytes);
        assert_eq!(number("vocabulary_bytes"), p.vocab_bytes);
        assert_eq!(number("total_bytes"), p.total());
        assert_eq!(json["fits"], checked.fits());
        assert_eq!(
            json["limits"].as_array().unwrap().len(),
            checked.limits.limits.len()
        );
    }
}
