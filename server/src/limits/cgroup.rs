//! This process's memory cgroup: where it is, its limits, its usage.
//!
//! `/proc/self/cgroup` names the cgroup (`0::/path` under v2, `N:memory:/path` under v1) relative
//! to the hierarchy's root; `/proc/self/mountinfo` says where that hierarchy is mounted and which
//! part of it the mount shows (inside a cgroup namespace the mount root is not `/`). Limits are
//! inherited, so the effective ceiling is the smallest one between our cgroup and the mount root.

use std::fs;
use std::path::{Path, PathBuf};

use super::Limit;

/// cgroup v1 reports "no limit" as a page-rounded `i64::MAX`; anything this large is unlimited.
const V1_UNLIMITED: u64 = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The directory of this process's memory cgroup, and the mount it lives under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    pub version: Version,
    pub dir: PathBuf,
    mount: PathBuf,
}

/// Memory use of the cgroup, as `/metrics` reports it. `None`: the kernel does not provide it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub current: Option<u64>,
    pub peak: Option<u64>,
    /// Times the cgroup hit its limit and the OOM killer was invoked (v2 `memory.events` oom).
    pub oom: Option<u64>,
    /// Processes in it the OOM killer killed.
    pub oom_kill: Option<u64>,
}

impl Cgroup {
    /// This process's memory cgroup, or `None` when no memory controller is mounted.
    pub fn own() -> Option<Cgroup> {
        Cgroup::own_for("memory")
    }

    /// This process's cgroup in the hierarchy that holds `controller` (`memory`, `cpu`).
    pub fn own_for(controller: &str) -> Option<Cgroup> {
        let membership = fs::read_to_string("/proc/self/cgroup").ok()?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        Cgroup::locate_for(&membership, &mountinfo, controller)
    }

    #[cfg(test)]
    fn locate(membership: &str, mountinfo: &str) -> Option<Cgroup> {
        Cgroup::locate_for(membership, mountinfo, "memory")
    }

    /// Finds the cgroup of `controller` from the texts of `/proc/self/cgroup` and
    /// `/proc/self/mountinfo`. A v1 controller wins over v2: on hybrid hosts (like our
    /// development machine) the unified hierarchy exists but the controllers are attached to v1.
    pub fn locate_for(membership: &str, mountinfo: &str, controller: &str) -> Option<Cgroup> {
        let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
        let v1 = membership.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == controller)
                .then_some(path)
        });
        if let Some(path) = v1 {
            let mount = mounts.iter().find(|m| m.is_v1(controller))?;
            return Some(mount.cgroup(Version::V1, path));
        }
        let path = membership
            .lines()
            .find_map(|line| line.strip_prefix("0::"))?;
        let mount = mounts.iter().find(|m| m.fstype == "cgroup2")?;
        Some(mount.cgroup(Version::V2, path))
    }

    /// The limits in force, each the smallest along the path from this cgroup to the mount root.
    pub fn limits(&self) -> Vec<Limit> {
        let files: &[&str] = match self.version {
            Version::V2 => &["memory.max", "memory.high"],
            Version::V1 => &["memory.limit_in_bytes"],
        };
        let version = match self.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        };
        files
            .iter()
            .filter_map(|file| {
                let (bytes, dir) = self
                    .ancestors()
                    .filter_map(|dir| Some((read_limit(&dir.join(file))?, dir)))
                    .min_by_key(|(bytes, _)| *bytes)?;
                Some(Limit {
                    source: format!("cgroup {version} {file} ({})", dir.display()),
                    bytes,
                    transient: false,
                })
            })
            .collect()
    }

    /// Current and peak usage and OOM counts of this cgroup.
    pub fn usage(&self) -> CgroupUsage {
        let read = |file: &str| read_u64(&self.dir.join(file));
        match self.version {
            Version::V2 => {
                let events = fs::read_to_string(self.dir.join("memory.events")).unwrap_or_default();
                CgroupUsage {
                    current: read("memory.current"),
                    peak: read("memory.peak"),
                    oom: keyed_value(&events, "oom"),
                    oom_kill: keyed_value(&events, "oom_kill"),
                }
            }
            Version::V1 => {
                let control =
                    fs::read_to_string(self.dir.join("memory.oom_control")).unwrap_or_default();
                CgroupUsage {
                    current: read("memory.usage_in_bytes"),
                    peak: read("memory.max_usage_in_bytes"),
                    // v1 counts limit hits in memory.failcnt, which also counts reclaim that
                    // succeeded; it is not the same event, so it is not reported as one.
                    oom: None,
                    oom_kill: keyed_value(&control, "oom_kill"),
                }
            }
        }
    }

    /// This cgroup's directory and each parent up to the hierarchy's mount point.
    pub fn ancestors(&self) -> impl Iterator<Item = &Path> {
        self.dir
            .ancestors()
            .take_while(move |dir| dir.starts_with(&self.mount))
    }
}

/// One line of `/proc/self/mountinfo`, the fields we need.
struct Mount {
    root: String,
    mount_point: PathBuf,
    fstype: String,
    super_options: String,
}

impl Mount {
    /// `36 25 0:32 / /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory`
    fn parse(line: &str) -> Option<Mount> {
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        Some(Mount {
            root: unescape(left.get(3)?),
            mount_point: PathBuf::from(unescape(left.get(4)?)),
            fstype: right.next()?.to_string(),
            super_options: right.nth(1)?.to_string(),
        })
    }

    fn is_v1(&self, controller: &str) -> bool {
        self.fstype == "cgroup" && self.super_options.split(',').any(|o| o == controller)
    }

    /// The directory of the cgroup at `path` (relative to the hierarchy root) under this mount.
    fn cgroup(&self, version: Version, path: &str) -> Cgroup {
        let relative = path
            .strip_prefix(self.root.trim_end_matches('/'))
            .unwrap_or(path)
            .trim_start_matches('/');
        Cgroup {
            version,
            dir: self.mount_point.join(relative),
            mount: self.mount_point.clone(),
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as three-digit octal (`\040`).
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A limit file: a number of bytes, or `max` / a v1 "unlimited" value, both meaning no limit.
fn read_limit(path: &Path) -> Option<u64> {
    read_u64(path).filter(|&bytes| bytes < V1_UNLIMITED)
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines, as in `memory.events` and `memory.oom_control`.
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_memory_controller_wins_on_hybrid_hosts() {
        let membership = "9:name=systemd:/\n4:memory:/process_api/8c51\n1:cpu:/\n0::/\n";
        let cg = Cgroup::locate(membership, HYBRID_MOUNTINFO).unwrap();
        assert_eq!(cg.version, Version::V1);
        assert_eq!(cg.dir, Path::new("/sys/fs/cgroup/memory/process_api/8c51"));
    }

    #[test]
    fn v2_unified_hierarchy() {
        let mountinfo = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let membership = "0::/system.slice/llm-server.service\n";
        let cg = Cgroup::locate(membership, mountinfo).unwrap();
        assert_eq!(cg.version, Version::V2);
        assert_eq!(
            cg.dir,
            Path::new("/sys/fs/cgroup/system.slice/llm-server.service")
        );
    }

    #[test]
    fn namespaced_mount_root_is_stripped() {
        // Inside a container the mount shows only our subtree, rooted at our own cgroup.
        let mountinfo = "30 23 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        let cg = Cgroup::locate("0::/docker/abc\n", mountinfo).unwrap();
        assert_eq!(cg.dir, Path::new("/sys/fs/cgroup"));
    }

    #[test]
    fn no_memory_controller_is_none() {
        let mountinfo = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(Cgroup::locate("1:cpu:/\n", mountinfo), None);
    }

    #[test]
    fn mountinfo_octal_escapes() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"/odd\x"), r"/odd\x");
    }

    #[test]
    fn keyed_values() {
        let events = "low 0\nhigh 12\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed_value(events, "oom"), Some(2));
        assert_eq!(keyed_value(events, "oom_kill"), Some(1));
        assert_eq!(keyed_value(events, "missing"), None);
    }

    #[test]
    fn limits_take_the_smallest_ancestor() {
        let root = std::env::temp_dir().join(format!("llm-cgroup-test-{}", std::process::id()));
        let child = root.join("a/b");
        fs::create_dir_all(&child).unwrap();
        fs::write(root.join("memory.max"), "max\n").unwrap();
        fs::write(root.join("a/memory.max"), "1073741824\n").unwrap();
        fs::write(child.join("memory.max"), "2147483648\n").unwrap();
        fs::write(child.join("memory.high"), "max\n").unwrap();
        let cg = Cgroup {
            version: Version::V2,
            dir: child.clone(),
            mount: root.clone(),
        };
        let limits = cg.limits();
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(limits.len(), 1, "memory.high is max everywhere: {limits:?}");
        assert_eq!(limits[0].bytes, 1 << 30);
        assert!(
            limits[0].source.contains("memory.max"),
            "{}",
            limits[0].source
        );
        assert!(limits[0].source.ends_with("/a)"), "{}", limits[0].source);
    }

    #[test]
    fn this_process_has_a_memory_cgroup_with_usage() {
        // Both the development machine (v1) and the appliance (v2) mount the memory controller.
        let cg = Cgroup::own().expect("no memory cgroup found in /proc/self/cgroup");
        assert!(cg.dir.is_dir(), "{}", cg.dir.display());
        assert!(cg.usage().current.is_some_and(|b| b > 0));
    }
}
