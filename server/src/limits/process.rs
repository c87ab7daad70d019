//! This process's own memory counters, from `/proc/self`.

use std::fs;
use std::io;

use super::parse_meminfo_field;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// Resident set: anonymous memory plus the mapped weight pages currently in RAM.
    pub rss_bytes: u64,
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    /// Page faults that had to read from disk: weights evicted and read back show up here.
    pub major_faults: u64,
    /// Memory mappings, to compare against `vm.max_map_count`.
    pub vma_count: u64,
}

impl ProcessStats {
    pub fn read() -> io::Result<ProcessStats> {
        let status = fs::read_to_string("/proc/self/status")?;
        let stat = fs::read_to_string("/proc/self/stat")?;
        let maps = fs::read("/proc/self/maps")?;
        let field = |name| parse_meminfo_field(&status, name).unwrap_or(0);
        Ok(ProcessStats {
            rss_bytes: field("VmRSS"),
            rss_anon_bytes: field("RssAnon"),
            rss_file_bytes: field("RssFile"),
            major_faults: major_faults(&stat).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "unparseable /proc/self/stat")
            })?,
            vma_count: maps.iter().filter(|&&b| b == b'\n').count() as u64,
        })
    }
}

/// Field 12 (`majflt`) of `/proc/<pid>/stat`. The command name (field 2) is in parentheses and
/// may itself contain spaces and parentheses, so counting starts after the last `)`.
fn major_faults(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields after the name start at 3 (state); majflt is the 10th of them.
    after_comm.split_whitespace().nth(9)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majflt_is_field_twelve() {
        let stat = "1234 (llm server (x)) S 1 1234 1234 0 -1 4194560 5000 0 42 0 10 3 0 0 20 0";
        assert_eq!(major_faults(stat), Some(42));
        assert_eq!(major_faults("garbage"), None);
    }

    #[test]
    fn reads_this_process() {
        let stats = ProcessStats::read().unwrap();
        assert!(stats.rss_bytes > 0);
        assert!(stats.rss_anon_bytes > 0 && stats.rss_anon_bytes <= stats.rss_bytes);
        assert!(stats.vma_count > 10, "{stats:?}");
    }
}
