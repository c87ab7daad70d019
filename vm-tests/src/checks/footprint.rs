//! The box's memory while it generates, measured inside the guest: MemAvailable and the
//! server cgroup's memory.current idle and during a streamed completion (sampled over SSH while
//! it runs), memory.events, the server's major page faults per generated token, how much of the
//! model file is resident (fincore), zram's mm_stat, and the decode rate (under TCG). Printed
//! as one report line, the same for every profile, so a note can set the boxes side by side.
//! Fails when a completion brings MemAvailable under earlyoom's term line (earlyoom would start
//! killing during ordinary use) or the cgroup OOM-kills.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use appliance::plan::MIB;
use appliance::Profile;
use serde_json::json;

use super::api::ok_json;
use super::pace::Pace;
use super::stream::{self, Streamed};
use super::{meminfo_bytes, section, sections, verdict};
use crate::http::Api;
use crate::ssh::Ssh;

/// Tokens the measured completion generates at most: enough for a decode rate and faults per
/// token, few enough for TCG. Fewer when the first answer's pace says that many would not end
/// well inside the server's request timeout (the 1B box under a loaded host), never fewer than
/// [`MIN_TOKENS`].
pub const TOKENS: u64 = 8;
/// The least that still gives a decode rate (it is measured between the first and last token).
const MIN_TOKENS: u64 = 2;
const PROMPT: &str = "The capital of France is";
const CGROUP: &str = "/sys/fs/cgroup/system.slice/llm-server.service";

/// One reading of the guest.
struct Snapshot {
    available: u64,
    total: u64,
    cgroup: u64,
    events: BTreeMap<String, u64>,
    major_faults: u64,
    /// zram's mm_stat: original, compressed and total memory used, in bytes.
    zram: Option<[u64; 3]>,
    /// Bytes of the model file in the page cache, and its size.
    resident: Option<(u64, u64)>,
}

fn snapshot(ssh: &Ssh, profile: &Profile) -> Result<Snapshot> {
    let model = profile.model_path();
    let out = ssh.check(&format!(
        "pid=$(systemctl show -p MainPID --value llm-server)
         echo '## meminfo'; cat /proc/meminfo
         echo '## current'; cat {CGROUP}/memory.current
         echo '## events'; cat {CGROUP}/memory.events
         echo '## stat'; cat /proc/$pid/stat
         echo '## mm_stat'; cat /sys/block/zram0/mm_stat 2>/dev/null || true
         echo '## fincore'; fincore --bytes --noheadings --output RES,SIZE '{model}' || true"
    ))?;
    let parts = sections(&out);
    let meminfo = section(&parts, "meminfo")?;
    let numbers = |text: &str| -> Vec<u64> {
        text.split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    let events = section(&parts, "events")?
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect();
    let zram = numbers(section(&parts, "mm_stat")?);
    let resident = numbers(section(&parts, "fincore")?);
    Ok(Snapshot {
        available: meminfo_bytes(meminfo, "MemAvailable")?,
        total: meminfo_bytes(meminfo, "MemTotal")?,
        cgroup: section(&parts, "current")?
            .trim()
            .parse()
            .context("memory.current is not a number")?,
        events,
        major_faults: major_faults(section(&parts, "stat")?)
            .context("the server's /proc/PID/stat has no majflt field")?,
        zram: (zram.len() >= 3).then(|| [zram[0], zram[1], zram[2]]),
        resident: (resident.len() >= 2).then(|| (resident[0], resident[1])),
    })
}

/// majflt, the 12th field of /proc/PID/stat (counted after the parenthesised command name,
/// which may hold spaces).
fn major_faults(stat: &str) -> Option<u64> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(9)?
        .parse()
        .ok()
}

/// Tokens to ask for after [`PROMPT`]: [`TOKENS`], or fewer at `pace`; and how they were chosen.
fn sized_tokens(api: &Api, pace: Option<Pace>) -> Result<(u64, String)> {
    let Some(pace) = pace else {
        return Ok((TOKENS, "no pace measured".into()));
    };
    let tokenized = ok_json(api.post(
        "/tokenize",
        &json!({"content": PROMPT, "add_special": true, "parse_special": false}),
        Duration::from_secs(60),
    )?)?;
    let prompt_tokens = tokenized["tokens"]
        .as_array()
        .map(|t| t.len() as u64)
        .with_context(|| format!("/tokenize gave no tokens: {tokenized}"))?;
    let tokens = pace.tokens_within_timeout(prompt_tokens, MIN_TOKENS, TOKENS);
    Ok((
        tokens,
        format!(
            "{tokens} of at most {TOKENS} tokens at the first answer's {:.1} s a token, \
             {:.0} s expected",
            pace.secs_per_token,
            pace.expected(prompt_tokens + tokens).as_secs_f64()
        ),
    ))
}

pub fn run(ssh: &Ssh, api: &Api, profile: &Profile, pace: Option<Pace>) -> Result<String> {
    let (tokens_asked, sizing) = sized_tokens(api, pace)?;
    let idle = snapshot(ssh, profile)?;
    let body = json!({"prompt": PROMPT, "max_tokens": tokens_asked, "temperature": 0});
    let generating = {
        let api = api.clone();
        std::thread::spawn(move || stream::generate(&api, "/v1/completions", body))
    };
    // Sampled while it runs: the lowest MemAvailable and the highest cgroup charge.
    let (mut min_available, mut max_cgroup) = (idle.available, idle.cgroup);
    let sample = format!(
        "awk '/^MemAvailable/{{print $2 * 1024}}' /proc/meminfo; cat {CGROUP}/memory.current"
    );
    while !generating.is_finished() {
        if let Ok(out) = ssh.check(&sample) {
            let v: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if let [available, cgroup] = v[..] {
                min_available = min_available.min(available);
                max_cgroup = max_cgroup.max(cgroup);
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let streamed: Streamed = generating
        .join()
        .map_err(|_| anyhow::anyhow!("the completion thread panicked"))??;
    let after = snapshot(ssh, profile)?;
    min_available = min_available.min(after.available);
    max_cgroup = max_cgroup.max(after.cgroup);

    let mib = |b: u64| b / MIB;
    let delta = |key: &str| {
        after.events.get(key).copied().unwrap_or(0) - idle.events.get(key).copied().unwrap_or(0)
    };
    let faults = after.major_faults - idle.major_faults;
    let tokens = streamed.completion_tokens;
    let resident = match idle.resident {
        Some((res, size)) => format!(
            "{} of {} MiB of the model file resident",
            mib(res),
            mib(size)
        ),
        None => "model residency unknown (no fincore)".into(),
    };
    let zram = match after.zram {
        Some([orig, compr, used]) => format!(
            "zram mm_stat {} MiB stored in {} MiB ({} MiB used)",
            mib(orig),
            mib(compr),
            mib(used)
        ),
        None => "no zram".into(),
    };
    let rate = streamed
        .decode_tokens_per_s()
        .map_or("-".into(), |r| format!("{r:.2}"));
    let first = streamed
        .to_first()
        .map_or("-".into(), |d| format!("{:.0} s", d.as_secs_f64()));
    let detail = format!(
        "idle: MemAvailable {} of {} MiB, server cgroup {} MiB, {resident}; during a {tokens}-token \
         completion ({} prompt tokens, first token after {first}, decode {rate} tok/s under TCG, \
         {:.0} s in all; {sizing}): MemAvailable min {} MiB, cgroup max {} MiB, memory.events \
         high +{} max +{} oom_kill +{}, {faults} major faults ({:.1} per token); {zram}",
        mib(idle.available),
        mib(idle.total),
        mib(idle.cgroup),
        streamed.prompt_tokens,
        streamed.done.duration_since(streamed.asked).as_secs_f64(),
        mib(min_available),
        mib(max_cgroup),
        delta("high"),
        delta("max"),
        delta("oom_kill"),
        faults as f64 / tokens.max(1) as f64,
    );
    let mut problems = Vec::new();
    let term_line = profile.earlyoom.term_line(idle.total);
    if u128::from(min_available) < term_line {
        problems.push(format!(
            "a completion took MemAvailable to {} MiB, under earlyoom's term line {} MiB \
             ({}% of MemTotal): earlyoom would kill during ordinary use",
            mib(min_available),
            mib(u64::try_from(term_line).unwrap_or(u64::MAX)),
            profile.earlyoom.mem_term_percent
        ));
    }
    if delta("oom_kill") > 0 {
        problems.push("the server's cgroup OOM-killed during a completion".into());
    }
    if !problems.is_empty() {
        problems.push(detail.clone());
    }
    verdict(problems, detail)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_majflt_after_the_command_name() {
        let stat = "480 (llm server) S 1 480 480 0 -1 4194560 1200 0 37 0 5 6";
        assert_eq!(super::major_faults(stat), Some(37));
        assert_eq!(super::major_faults("480 (x) S 1"), None);
    }
}
