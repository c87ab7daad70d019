//! The named checks. Each returns what it saw when the policy holds and an error naming what
//! differs otherwise; each reads its expectations from the profile (or the golden data), never
//! from values typed here.

pub mod api;
pub mod cpu;
pub mod disk;
pub mod edge;
pub mod firewall;
pub mod footprint;
pub mod headroom;
pub mod pace;
pub mod policy;
pub mod pressure;
pub mod restart_short;
pub mod slots;
pub mod stream;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// How long one generation request may take: under TCG the default model prefills and decodes
/// at roughly one token per 5 to 30 s, a 1B model four times slower, and the checks ask for a
/// handful of tokens.
pub const GENERATION_TIMEOUT: Duration = Duration::from_secs(1800);

/// `Key=Value` lines (`systemctl show`) as a map.
pub fn properties(text: &str) -> BTreeMap<&str, &str> {
    text.lines().filter_map(|l| l.split_once('=')).collect()
}

/// Splits the output of a guest script that prints `## name` before each part.
pub fn sections(text: &str) -> BTreeMap<&str, String> {
    let mut parts = BTreeMap::new();
    let mut current: Option<(&str, String)> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("## ") {
            parts.extend(current.take());
            current = Some((name.trim(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    parts.extend(current);
    parts
}

/// The section `name` of a guest script's output, failing when the script did not print it.
pub fn section<'a>(parts: &'a BTreeMap<&str, String>, name: &str) -> Result<&'a str> {
    parts
        .get(name)
        .map(String::as_str)
        .with_context(|| format!("the guest printed no `{name}` section"))
}

/// A `Key: <n> kB` line of /proc/meminfo, in bytes.
pub fn meminfo_bytes(meminfo: &str, key: &str) -> Result<u64> {
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    match kib {
        Some(kib) => Ok(kib * 1024),
        None => bail!("/proc/meminfo has no {key}"),
    }
}

/// Fails listing every problem, or passes with `detail`.
pub fn verdict(problems: Vec<String>, detail: String) -> Result<String> {
    if problems.is_empty() {
        Ok(detail)
    } else {
        bail!("{}", problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_sections_and_keeps_their_lines() {
        let text = "noise\n## a\n1\n2\n## b\n## c\nx=y\n";
        let parts = sections(text);
        assert_eq!(parts["a"], "1\n2\n");
        assert_eq!(parts["b"], "");
        assert_eq!(parts["c"], "x=y\n");
        assert!(section(&parts, "d").is_err());
    }

    #[test]
    fn reads_meminfo_lines() {
        let meminfo = "MemTotal:         988200 kB\nMemAvailable:     700000 kB\n";
        assert_eq!(
            meminfo_bytes(meminfo, "MemAvailable").unwrap(),
            700000 * 1024
        );
        assert!(meminfo_bytes(meminfo, "MemFree").is_err());
        assert_eq!(properties("A=1\nB=x=y\n")["B"], "x=y");
    }
}
