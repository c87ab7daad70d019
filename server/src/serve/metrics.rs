//! Counters and gauges for `GET /metrics`, in the Prometheus text format: the HTTP layer's own,
//! the engine's, and the process's and its cgroup's memory figures, read when scraped so that
//! they are never stale.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::engine::Counters;
use crate::limits::{Cgroup, ProcessStats};

#[derive(Default)]
pub struct Metrics {
    /// Finished HTTP requests by (route, status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Given to the engine when it starts.
    pub engine: Arc<Counters>,
}

impl Metrics {
    pub fn record_request(&self, route: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests.entry((route.to_owned(), status)).or_default() += 1;
    }

    /// The Prometheus exposition text.
    pub fn render(&self, cgroup: Option<&Cgroup>) -> String {
        let engine = &*self.engine;
        let mut out = String::with_capacity(4096);
        let seconds = |nanos: &AtomicU64| nanos.load(Relaxed) as f64 / 1e9;

        family(
            &mut out,
            "llm_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
        );
        {
            let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            for ((route, status), n) in requests.iter() {
                let _ = writeln!(
                    out,
                    "llm_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        metric(
            &mut out,
            "llm_prompt_tokens_total",
            "counter",
            "Prompt tokens evaluated.",
            engine.prompt_tokens.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens taken from a slot's cache instead of evaluated.",
            engine.cached_prompt_tokens.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_generated_tokens_total",
            "counter",
            "Tokens generated.",
            engine.generated_tokens.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_decode_passes_total",
            "counter",
            "Forward passes over generated tokens; each takes one token of every slot generating at the time.",
            engine.decode_passes.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_draft_tokens_total",
            "counter",
            "Tokens drafted by prompt lookup (speculative decoding) and verified.",
            engine.drafted_tokens.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_draft_accepted_total",
            "counter",
            "Drafted tokens the model agreed with.",
            engine.accepted_tokens.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_prefill_seconds_total",
            "counter",
            "Time spent evaluating prompts.",
            seconds(&engine.prefill_nanos),
        );
        metric(
            &mut out,
            "llm_decode_seconds_total",
            "counter",
            "Time spent generating tokens.",
            seconds(&engine.decode_nanos),
        );
        metric(
            &mut out,
            "llm_cancelled_total",
            "counter",
            "Generations stopped because the client disconnected.",
            engine.cancelled.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            engine.queue_depth.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_busy_slots",
            "gauge",
            "Slots generating.",
            engine.busy_slots.load(Relaxed) as f64,
        );
        metric(
            &mut out,
            "llm_slots",
            "gauge",
            "Slots configured (--parallel).",
            engine.slots.load(Relaxed) as f64,
        );

        if let Ok(p) = ProcessStats::read() {
            metric(
                &mut out,
                "process_resident_memory_bytes",
                "gauge",
                "Resident set size.",
                p.rss_bytes as f64,
            );
            metric(
                &mut out,
                "process_resident_memory_anon_bytes",
                "gauge",
                "Resident anonymous memory (heap, KV cache).",
                p.rss_anon_bytes as f64,
            );
            metric(
                &mut out,
                "process_resident_memory_file_bytes",
                "gauge",
                "Resident file-backed memory (mapped weights).",
                p.rss_file_bytes as f64,
            );
            metric(
                &mut out,
                "process_major_page_faults_total",
                "counter",
                "Page faults that read from disk.",
                p.major_faults as f64,
            );
            metric(
                &mut out,
                "process_memory_maps",
                "gauge",
                "Memory mappings (compare with vm.max_map_count).",
                p.vma_count as f64,
            );
        }
        if let Some(usage) = cgroup.map(Cgroup::usage) {
            let gauges = [
                (
                    "cgroup_memory_current_bytes",
                    "gauge",
                    "The cgroup's memory use (memory.current).",
                    usage.current,
                ),
                (
                    "cgroup_memory_peak_bytes",
                    "gauge",
                    "The cgroup's peak memory use (memory.peak).",
                    usage.peak,
                ),
                (
                    "cgroup_memory_oom_events_total",
                    "counter",
                    "Times the cgroup hit its limit and invoked the OOM killer.",
                    usage.oom,
                ),
                (
                    "cgroup_memory_oom_kill_events_total",
                    "counter",
                    "Processes of the cgroup killed by the OOM killer.",
                    usage.oom_kill,
                ),
            ];
            for (name, kind, help, value) in gauges {
                if let Some(v) = value {
                    metric(&mut out, name, kind, help, v as f64);
                }
            }
        }
        out
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample line is `name{labels} value` with a numeric value and a TYPE declared above.
    #[test]
    fn exposition_format() {
        let m = Metrics::default();
        m.record_request("/v1/chat/completions", 200);
        m.record_request("/v1/chat/completions", 200);
        m.record_request("/v1/chat/completions", 503);
        m.engine.add_prefill(std::time::Duration::from_millis(1500));
        let text = m.render(Cgroup::own().as_ref());
        assert!(
            text.contains("llm_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n")
        );
        assert!(text.contains("llm_prefill_seconds_total 1.5\n"));
        assert!(text.contains("\nprocess_resident_memory_bytes "));
        assert!(text.contains("\ncgroup_memory_current_bytes "));
        let mut typed = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_owned());
            } else if !line.starts_with('#') {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let name = series.split('{').next().unwrap();
                assert!(typed.contains(name), "{name} has no TYPE line");
                value
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("bad value in {line}"));
            }
        }
    }
}
