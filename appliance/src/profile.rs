//! The appliance profile (`profiles/*.toml`): every value the appliance is built from, parsed
//! strictly and checked for consistency on load.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cidr::Cidr;
use crate::plan::{self, MIB};

/// Where the image installs the profile; `appliance doctor` reads it from there by default.
pub const INSTALLED_PATH: &str = "/etc/llm-appliance/profile.toml";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub machine: Machine,
    pub model: Model,
    pub server: Server,
    pub zram: Zram,
    pub sysctl: BTreeMap<String, SysctlValue>,
    pub earlyoom: Earlyoom,
    pub network: Network,
    pub oci: Oci,
    /// The file as written, installed verbatim so the box carries its own policy.
    #[serde(skip)]
    pub source: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    pub name: String,
    pub hostname: String,
    pub ram_mib: u64,
    /// MemAvailable promised with the model loaded and idle.
    pub headroom_mib: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// File name under the image's model directory.
    pub file: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub embedding: u64,
    pub vocab: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub api_port: Port,
    pub ctx_size: u32,
    pub parallel: u32,
    pub start_timeout_sec: u32,
    pub watchdog_sec: u32,
    pub restart_sec: u32,
    pub oom_score_adjust: i32,
    pub memory: MemoryLimits,
}

/// The server unit's cgroup limits, in MiB.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryLimits {
    pub min_mib: u64,
    pub low_mib: u64,
    pub high_mib: u64,
    pub max_mib: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Zram {
    pub percent_of_ram: u64,
    pub max_mib: u64,
    pub algorithm: String,
    pub swap_priority: i32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Earlyoom {
    pub mem_term_percent: u8,
    pub mem_kill_percent: u8,
    pub swap_term_percent: u8,
    pub swap_kill_percent: u8,
    pub avoid: Vec<String>,
    pub prefer: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub ssh_port: Port,
    pub ssh_cidrs: Vec<Cidr>,
    pub api_cidrs: Vec<Cidr>,
    pub egress_cidrs: Vec<Cidr>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Oci {
    pub metadata_address: IpAddr,
}

/// A TCP port, 1 to 65535.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub struct Port(pub u16);

impl TryFrom<i64> for Port {
    type Error = String;

    fn try_from(n: i64) -> Result<Self, String> {
        u16::try_from(n)
            .ok()
            .filter(|p| *p != 0)
            .map(Port)
            .ok_or_else(|| format!("port {n} is out of range: use 1 to 65535"))
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A sysctl's value as written in the profile and as `/proc/sys` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SysctlValue {
    Int(i64),
    Text(String),
}

impl fmt::Display for SysctlValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SysctlValue::Int(n) => n.fmt(f),
            SysctlValue::Text(s) => s.fmt(f),
        }
    }
}

/// Compression algorithms the kernel's zram accepts.
const ZRAM_ALGORITHMS: [&str; 6] = ["lzo", "lzo-rle", "lz4", "lz4hc", "zstd", "842"];
/// `/proc/PID/comm`, which earlyoom matches, holds at most this many bytes of a process name.
const COMM_MAX: usize = 15;
/// The server's process name, always in earlyoom's avoid list.
pub const SERVER_PROCESS: &str = "llm-server";

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read the profile {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the profile {path} is not valid: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("the profile {path} does not fit together:\n{}", bullets(.problems))]
    Inconsistent {
        path: PathBuf,
        problems: Vec<String>,
    },
}

fn bullets(problems: &[String]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Profile {
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Profile::parse(&text, path)
    }

    /// Parses and checks `text`; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Profile, ProfileError> {
        let mut profile: Profile = toml::from_str(text).map_err(|e| ProfileError::Syntax {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let problems = profile.problems();
        if !problems.is_empty() {
            return Err(ProfileError::Inconsistent {
                path: path.to_owned(),
                problems,
            });
        }
        profile.source = text.to_owned();
        Ok(profile)
    }

    /// The server's process names earlyoom must leave alone, the server first.
    pub fn earlyoom_avoid(&self) -> impl Iterator<Item = &str> {
        std::iter::once(SERVER_PROCESS).chain(self.earlyoom.avoid.iter().map(String::as_str))
    }

    /// The model's path on the box.
    pub fn model_path(&self) -> String {
        format!("{}/{}", crate::render::MODEL_DIR, self.model.file)
    }

    /// Everything that makes the profile unusable, each naming the key and the fix.
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        self.machine_problems(&mut p);
        self.model_problems(&mut p);
        self.memory_problems(&mut p);
        self.zram_problems(&mut p);
        self.sysctl_problems(&mut p);
        self.earlyoom_problems(&mut p);
        self.network_problems(&mut p);
        p
    }

    fn machine_problems(&self, p: &mut Vec<String>) {
        let m = &self.machine;
        if !is_name(&m.name) {
            p.push(format!(
                "machine.name `{}` must be lowercase letters, digits and `-`",
                m.name
            ));
        }
        let hostname_ok = !m.hostname.is_empty() && m.hostname.len() <= 63 && is_name(&m.hostname);
        if !hostname_ok {
            p.push(format!(
                "machine.hostname `{}` must be 1 to 63 lowercase letters, digits and `-`",
                m.hostname
            ));
        }
        if m.ram_mib < 256 {
            p.push(format!(
                "machine.ram_mib = {} is below the 256 MiB the OS alone needs",
                m.ram_mib
            ));
        }
    }

    fn model_problems(&self, p: &mut Vec<String>) {
        let m = &self.model;
        if m.file.contains('/') || !m.file.ends_with(".gguf") {
            p.push(format!(
                "model.file `{}` must be a bare file name ending in `.gguf`",
                m.file
            ));
        }
        let hex = m.sha256.len() == 64
            && m.sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            p.push(format!(
                "model.sha256 `{}` must be 64 lowercase hex digits (`sha256sum` prints it)",
                m.sha256
            ));
        }
        for (key, value) in [
            ("size_bytes", m.size_bytes),
            ("layers", m.layers),
            ("kv_heads", m.kv_heads),
            ("head_dim", m.head_dim),
            ("embedding", m.embedding),
            ("vocab", m.vocab),
        ] {
            if value == 0 {
                p.push(format!(
                    "model.{key} is 0: copy it from the model's GGUF metadata"
                ));
            }
        }
    }

    fn memory_problems(&self, p: &mut Vec<String>) {
        let s = &self.server;
        let m = &s.memory;
        if s.ctx_size == 0 || s.parallel == 0 {
            p.push("server.ctx_size and server.parallel must be at least 1".into());
        }
        if s.watchdog_sec != 0 && s.watchdog_sec < 2 {
            p.push("server.watchdog_sec must be 0 (off) or at least 2".into());
        }
        if !(-1000..=1000).contains(&s.oom_score_adjust) {
            p.push(format!(
                "server.oom_score_adjust = {} is outside the kernel's -1000..=1000",
                s.oom_score_adjust
            ));
        }
        if !(m.min_mib <= m.low_mib && m.low_mib <= m.high_mib && m.high_mib <= m.max_mib) {
            p.push(format!(
                "server.memory must satisfy min_mib <= low_mib <= high_mib <= max_mib \
                 (have {} <= {} <= {} <= {})",
                m.min_mib, m.low_mib, m.high_mib, m.max_mib
            ));
        }
        if m.max_mib >= self.machine.ram_mib {
            p.push(format!(
                "server.memory.max_mib = {} leaves nothing of machine.ram_mib = {} for the OS: \
                 lower it",
                m.max_mib, self.machine.ram_mib
            ));
        }
        let weights_mib = self.model.size_bytes.div_ceil(MIB);
        if m.min_mib < weights_mib {
            p.push(format!(
                "server.memory.min_mib = {} does not protect the model's {} MiB of weights from \
                 reclaim: raise it to at least {}",
                m.min_mib, weights_mib, weights_mib
            ));
        }
        let need = plan::requirement(&self.model, s);
        let need_mib = need.total().div_ceil(MIB);
        if need_mib > m.high_mib {
            p.push(format!(
                "server.memory.high_mib = {} cannot hold the model: the server needs {} MiB \
                 (weights {} + KV cache {} + scratch {} + runtime {} MiB); raise high_mib/max_mib \
                 or lower server.ctx_size/server.parallel",
                m.high_mib,
                need_mib,
                need.weights.div_ceil(MIB),
                need.kv_cache.div_ceil(MIB),
                need.scratch.div_ceil(MIB),
                need.runtime.div_ceil(MIB),
            ));
        }
    }

    fn zram_problems(&self, p: &mut Vec<String>) {
        let z = &self.zram;
        if !ZRAM_ALGORITHMS.contains(&z.algorithm.as_str()) {
            p.push(format!(
                "zram.algorithm `{}` is not one of {}",
                z.algorithm,
                ZRAM_ALGORITHMS.join(", ")
            ));
        }
        if !(1..=100).contains(&z.percent_of_ram) {
            p.push(format!(
                "zram.percent_of_ram = {} must be 1 to 100",
                z.percent_of_ram
            ));
        }
        if z.max_mib == 0 || z.max_mib > self.machine.ram_mib {
            p.push(format!(
                "zram.max_mib = {} must be 1 to machine.ram_mib ({})",
                z.max_mib, self.machine.ram_mib
            ));
        }
    }

    fn sysctl_problems(&self, p: &mut Vec<String>) {
        for (key, value) in &self.sysctl {
            let well_formed = !key.is_empty()
                && key.split('.').all(|part| {
                    !part.is_empty()
                        && part
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                });
            if !well_formed {
                p.push(format!(
                    "sysctl `{key}` is not a sysctl name like `vm.swappiness`"
                ));
            }
            if let SysctlValue::Text(s) = value {
                if s.is_empty() || s.contains(['\n', '\0']) {
                    p.push(format!(
                        "sysctl `{key}` must have a one-line, non-empty value"
                    ));
                }
            }
        }
    }

    fn earlyoom_problems(&self, p: &mut Vec<String>) {
        let e = &self.earlyoom;
        for (key, term, kill) in [
            ("mem", e.mem_term_percent, e.mem_kill_percent),
            ("swap", e.swap_term_percent, e.swap_kill_percent),
        ] {
            if term > 100 || kill > term {
                p.push(format!(
                    "earlyoom.{key}_kill_percent ({kill}) <= earlyoom.{key}_term_percent ({term}) \
                     <= 100 must hold"
                ));
            }
        }
        // MemAvailable counts the server's page cache as available although MemoryMin keeps it
        // from being reclaimed, so below this share earlyoom would never see memory running
        // short. A tenth of RAM on top covers MemTotal being below the RAM size and the kernel's
        // own reserves.
        let ram = self.machine.ram_mib;
        let floor_mib = self.server.memory.min_mib + ram / 10;
        let floor_percent = (floor_mib * 100).div_ceil(ram);
        if u64::from(e.mem_kill_percent) * ram < floor_mib * 100 {
            p.push(format!(
                "earlyoom.mem_kill_percent = {} would never fire: MemAvailable counts the \
                 server's protected {} MiB (server.memory.min_mib) as available; raise it (and \
                 mem_term_percent) to at least {}",
                e.mem_kill_percent, self.server.memory.min_mib, floor_percent
            ));
        }
        // An idle box below earlyoom's term line would have earlyoom killing at rest.
        let term_line_mib = u64::from(e.mem_term_percent) * ram / 100;
        let headroom = self.machine.headroom_mib;
        if headroom <= term_line_mib || headroom >= ram {
            p.push(format!(
                "machine.headroom_mib = {headroom} must lie between earlyoom's term line \
                 ({term_line_mib} MiB: earlyoom.mem_term_percent = {} of machine.ram_mib) and \
                 machine.ram_mib = {ram}: an idle box must not be where earlyoom starts killing",
                e.mem_term_percent
            ));
        }
        for (key, names) in [("avoid", &e.avoid), ("prefer", &e.prefer)] {
            for name in names {
                let valid = !name.is_empty()
                    && name.len() <= COMM_MAX
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !valid {
                    p.push(format!(
                        "earlyoom.{key} entry `{name}` must be a process name as /proc/PID/comm \
                         shows it: 1 to {COMM_MAX} letters, digits, `-` or `_` (longer names are \
                         cut to their first {COMM_MAX} characters)"
                    ));
                }
            }
        }
        if let Some(name) = e
            .prefer
            .iter()
            .find(|n| self.earlyoom_avoid().any(|a| a == *n))
        {
            p.push(format!(
                "earlyoom: `{name}` is both avoided and preferred; keep it in one list"
            ));
        }
    }

    fn network_problems(&self, p: &mut Vec<String>) {
        let n = &self.network;
        if n.ssh_port == self.server.api_port {
            p.push(format!(
                "network.ssh_port and server.api_port are both {}: pick different ports",
                n.ssh_port
            ));
        }
        if n.ssh_cidrs.is_empty() {
            p.push("network.ssh_cidrs is empty: nobody could log in; list the admin networks (`0.0.0.0/0` for any)".into());
        }
        let metadata = self.oci.metadata_address;
        if !n.egress_cidrs.iter().any(|c| c.contains(metadata)) {
            p.push(format!(
                "network.egress_cidrs does not include oci.metadata_address {metadata}: the box \
                 could not fetch its SSH keys; add `{metadata}/32`"
            ));
        }
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}
