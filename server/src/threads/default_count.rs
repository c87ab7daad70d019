//! How many threads to run when `--threads` is not given: the one source of that number for
//! `run`, `serve`, `bench` and the memory plan.
//!
//! The smallest of three bounds, each a reason to stop adding threads:
//! - the CPU time the cgroup grants (`cpu.max` under v2, `cpu.cfs_quota_us` / `cpu.cfs_period_us`
//!   under v1), as whole CPUs rounded down (at least 1): a thread beyond the quota does not run
//!   more, it only makes every thread wait for the next period, and the pool's spinning workers
//!   burn the quota the decode thread needs;
//! - physical cores: a second hyper-thread adds little to memory-bound matrix-vector work and
//!   slows its sibling;
//! - the CPUs this process may run on (`std::thread::available_parallelism`, which on Linux
//!   already honours the affinity mask and both cgroup versions' quota; the quota is read here
//!   too, to say it was the reason).
//!
//! A burstable VM (Oracle's E2.1.Micro: 1/8 of an OCPU with bursts) shows no quota inside the
//! guest: the hypervisor enforces the baseline, so the guest sees its vCPUs, and the default
//! stays their physical cores. There CPU time per token, not threads, decides the wait (`bench`
//! reports it); fewer threads spend less of a burst spinning.

use std::fmt;
use std::path::Path;

use crate::limits::cgroup::{Cgroup, Version};

/// The default thread count and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DefaultThreads {
    pub threads: usize,
    /// Why that many: `cgroup cpu.max 25000 100000`, `2 physical cores`, ...
    pub reason: String,
}

impl fmt::Display for DefaultThreads {
    /// `1 thread: cgroup cpu.max 25000 100000`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.threads == 1 { "" } else { "s" };
        write!(f, "{} thread{s}: {}", self.threads, self.reason)
    }
}

/// A cgroup's CPU bandwidth limit: `quota` µs of CPU time in every `period` µs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuQuota {
    pub quota: u64,
    pub period: u64,
    /// The file(s) it was read from, as the reason names them.
    pub source: String,
}

impl CpuQuota {
    /// Whole CPUs the quota grants, rounded down as std's `available_parallelism` does, at
    /// least 1.
    pub fn cpus(&self) -> usize {
        ((self.quota / self.period.max(1)) as usize).max(1)
    }
}

/// The thread count `run`, `serve`, `bench` and the memory plan use when `--threads` is not
/// given. Reads /proc and /sys; cheap enough to call once per command.
pub fn default_threads() -> DefaultThreads {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    choose(allowed, physical_cores(), cpu_quota())
}

/// The smallest bound wins; on a tie the quota is named first, then the cores, as the more
/// telling reason.
pub fn choose(allowed: usize, cores: Option<usize>, quota: Option<CpuQuota>) -> DefaultThreads {
    let s = |n: usize| if n == 1 { "" } else { "s" };
    let mut best = DefaultThreads {
        threads: allowed.max(1),
        reason: format!("{allowed} CPU{} this process may run on", s(allowed)),
    };
    if let Some(cores) = cores.filter(|&c| c > 0 && c <= best.threads) {
        best = DefaultThreads {
            threads: cores,
            reason: format!("{cores} physical core{}", s(cores)),
        };
    }
    if let Some(q) = quota.filter(|q| q.cpus() <= best.threads) {
        best = DefaultThreads {
            threads: q.cpus(),
            reason: format!("{} {} {}", q.source, q.quota, q.period),
        };
    }
    best
}

/// The tightest CPU quota on the path from this process's cpu cgroup to the hierarchy's root,
/// if any (a parent's quota limits its children too).
pub fn cpu_quota() -> Option<CpuQuota> {
    let cgroup = Cgroup::own_for("cpu")?;
    cgroup
        .ancestors()
        .filter_map(|dir| read_quota(cgroup.version, dir))
        .min_by(|a, b| (a.quota * b.period).cmp(&(b.quota * a.period)))
}

fn read_quota(version: Version, dir: &Path) -> Option<CpuQuota> {
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
    match version {
        Version::V2 => parse_cpu_max(&read("cpu.max")?),
        Version::V1 => parse_cfs(&read("cpu.cfs_quota_us")?, &read("cpu.cfs_period_us")?),
    }
}

/// cgroup v2 `cpu.max`: `QUOTA PERIOD`, or `max PERIOD` for no limit.
pub fn parse_cpu_max(text: &str) -> Option<CpuQuota> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?.parse().ok()?;
    let period = fields.next().map_or(Some(100_000), |p| p.parse().ok())?;
    valid(quota, period, "cgroup cpu.max")
}

/// cgroup v1 `cpu.cfs_quota_us` (`-1` for no limit) and `cpu.cfs_period_us`.
pub fn parse_cfs(quota: &str, period: &str) -> Option<CpuQuota> {
    let quota = quota.trim().parse().ok()?;
    let period = period.trim().parse().ok()?;
    valid(quota, period, "cgroup cpu.cfs_quota_us/cpu.cfs_period_us")
}

fn valid(quota: u64, period: u64, source: &str) -> Option<CpuQuota> {
    (quota > 0 && period > 0).then(|| CpuQuota {
        quota,
        period,
        source: source.to_owned(),
    })
}

/// The machine's physical cores, `None` when sysfs does not say (the affinity mask is
/// `available_parallelism`'s bound). A core's hyper-threads all list the same
/// `thread_siblings_list`, so unique lists are cores.
fn physical_cores() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu").ok()?;
    let mut cores: Vec<String> = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let is_cpu = name
            .to_str()
            .and_then(|n| n.strip_prefix("cpu"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_cpu {
            continue;
        }
        let siblings = entry.path().join("topology/thread_siblings_list");
        if let Ok(list) = std::fs::read_to_string(siblings) {
            cores.push(list.trim().to_owned());
        }
    }
    cores.sort_unstable();
    cores.dedup();
    (!cores.is_empty()).then_some(cores.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(text: &str) -> Option<CpuQuota> {
        parse_cpu_max(text)
    }

    #[test]
    fn cpu_max_is_parsed_and_max_means_no_limit() {
        let q = quota("25000 100000\n").unwrap();
        assert_eq!((q.quota, q.period, q.cpus()), (25000, 100000, 1));
        assert_eq!(quota("150000 100000").unwrap().cpus(), 1);
        assert_eq!(quota("200000 100000").unwrap().cpus(), 2);
        assert_eq!(quota("max 100000\n"), None);
        assert_eq!(quota("garbage"), None);
        assert_eq!(quota(""), None);
        assert_eq!(quota("0 100000"), None);
    }

    #[test]
    fn cfs_files_are_parsed_and_minus_one_means_no_limit() {
        let q = parse_cfs("50000\n", "100000\n").unwrap();
        assert_eq!((q.quota, q.period, q.cpus()), (50000, 100000, 1));
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("400000", "100000").unwrap().cpus(), 4);
    }

    #[test]
    fn the_smallest_bound_wins_and_is_named() {
        let q = quota("25000 100000");
        assert_eq!(
            choose(2, Some(2), q.clone()).to_string(),
            "1 thread: cgroup cpu.max 25000 100000"
        );
        assert_eq!(
            choose(8, Some(4), None).to_string(),
            "4 threads: 4 physical cores"
        );
        assert_eq!(
            choose(2, Some(4), None).to_string(),
            "2 threads: 2 CPUs this process may run on"
        );
        assert_eq!(
            choose(8, Some(4), quota("300000 100000")).to_string(),
            "3 threads: cgroup cpu.max 300000 100000"
        );
        // A quota above the cores does not bind: the cores are the reason.
        assert_eq!(
            choose(8, Some(2), quota("400000 100000")).to_string(),
            "2 threads: 2 physical cores"
        );
        assert_eq!(
            choose(1, None, None).to_string(),
            "1 thread: 1 CPU this process may run on"
        );
    }
}
