//! What memory this process may use and what it is using.
//!
//! The limits that matter on the appliance are the cgroup's (`memory.max`/`memory.high` under
//! cgroup v2, `memory.limit_in_bytes` under v1), not the host's RAM: a unit with `MemoryMax=`
//! is OOM-killed at its own limit however much the host has free. `MemAvailable` is the host's
//! side of the same question. The process counters (RSS, major faults, VMAs) are what an operator
//! of a 1 GB box watches to see weights being evicted and re-read.

pub mod cgroup;
pub mod process;

use std::fmt;

pub use cgroup::{Cgroup, CgroupUsage};
pub use process::ProcessStats;

/// One ceiling on this process's memory, with where it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// What the number is, e.g. `cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/x)`.
    pub source: String,
    pub bytes: u64,
    /// What other processes hold now (the host's `MemAvailable`), not a ceiling: a plan over it
    /// may fit once they free memory, so a server under systemd waits or exits to be restarted
    /// instead of refusing for good.
    pub transient: bool,
}

/// Every ceiling found; an empty list means nothing limits the process.
#[derive(Debug, Clone, Default)]
pub struct MemoryLimits {
    pub limits: Vec<Limit>,
}

impl MemoryLimits {
    /// Reads the limits of this process's own cgroup and the host's `MemTotal` and
    /// `MemAvailable`.
    pub fn discover() -> MemoryLimits {
        let mut limits = Cgroup::own().map(|cg| cg.limits()).unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        for (field, transient) in [("MemTotal", false), ("MemAvailable", true)] {
            if let Some(bytes) = parse_meminfo_field(&meminfo, field) {
                limits.push(Limit {
                    source: format!("host {field} (/proc/meminfo)"),
                    bytes,
                    transient,
                });
            }
        }
        MemoryLimits { limits }
    }

    /// The smallest ceiling: the one a plan must fit under.
    pub fn tightest(&self) -> Option<&Limit> {
        self.limits.iter().min_by_key(|l| l.bytes)
    }

    /// Whether `bytes` fit under every limit, or only once other processes free memory.
    pub fn fit(&self, bytes: u64) -> Fit {
        let mut over = self.limits.iter().filter(|l| bytes > l.bytes).peekable();
        if over.peek().is_none() {
            Fit::Now
        } else if over.all(|l| l.transient) {
            Fit::Later
        } else {
            Fit::Never
        }
    }
}

/// A plan against the limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    Now,
    /// Over what the host has free now, under every ceiling.
    Later,
    /// Over a ceiling (a cgroup limit, the host's RAM).
    Never,
}

/// `MemAvailable` from `/proc/meminfo`, in bytes: the kernel's estimate of what can be
/// allocated without swapping, page cache that can be dropped included.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_field(&text, "MemAvailable")
}

/// A `Name:   1234 kB` field of `/proc/meminfo` or `/proc/self/status`, in bytes.
pub(crate) fn parse_meminfo_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        let mut words = rest.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// Bytes as a person reads them: `253.1 MiB`.
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_bytes() {
        let text =
            "MemTotal:       32768000 kB\nMemAvailable:   23446760 kB\nHugePages_Total:       0\n";
        assert_eq!(
            parse_meminfo_field(text, "MemAvailable"),
            Some(23446760 * 1024)
        );
        assert_eq!(parse_meminfo_field(text, "HugePages_Total"), Some(0));
        assert_eq!(parse_meminfo_field(text, "Mem"), None);
        assert_eq!(parse_meminfo_field(text, "SwapFree"), None);
    }

    #[test]
    fn this_host_reports_mem_available() {
        assert!(mem_available().is_some_and(|b| b > 0));
    }

    #[test]
    fn tightest_is_the_smallest() {
        let limits = MemoryLimits {
            limits: vec![
                Limit {
                    source: "a".into(),
                    bytes: 3 << 30,
                    transient: false,
                },
                Limit {
                    source: "b".into(),
                    bytes: 1 << 30,
                    transient: false,
                },
            ],
        };
        assert_eq!(limits.tightest().unwrap().source, "b");
        assert!(MemoryLimits::default().tightest().is_none());
    }

    #[test]
    fn a_plan_over_only_what_is_free_now_fits_later() {
        let limit = |bytes: u64, transient| Limit {
            source: String::new(),
            bytes,
            transient,
        };
        let limits = MemoryLimits {
            limits: vec![limit(900, false), limit(1000, false), limit(500, true)],
        };
        assert_eq!(limits.fit(400), Fit::Now);
        assert_eq!(limits.fit(500), Fit::Now);
        assert_eq!(limits.fit(501), Fit::Later);
        assert_eq!(limits.fit(900), Fit::Later);
        assert_eq!(limits.fit(901), Fit::Never);
        assert_eq!(MemoryLimits::default().fit(u64::MAX), Fit::Now);
    }

    #[test]
    fn the_host_gives_a_ceiling_and_what_is_free_now() {
        let limits = MemoryLimits::discover();
        let host = |name: &str| {
            limits
                .limits
                .iter()
                .find(|l| l.source.contains(name))
                .unwrap_or_else(|| panic!("no {name} in {limits:?}"))
        };
        assert!(!host("MemTotal").transient);
        assert!(host("MemAvailable").transient);
        assert!(host("MemAvailable").bytes <= host("MemTotal").bytes);
    }

    #[test]
    fn human_bytes() {
        assert_eq!(HumanBytes(512).to_string(), "512 B");
        assert_eq!(HumanBytes(253_113_024).to_string(), "241.4 MiB");
        assert_eq!(HumanBytes(1 << 30).to_string(), "1.0 GiB");
    }
}
