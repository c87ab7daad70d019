//! `appliance doctor`: reads the running box back and compares it with its profile.
//!
//! Every check reads files under a root directory ([`Host`]), `/` on the box and a fake tree in
//! the tests, so each one can be made to fail on purpose. The only thing not read from files is
//! the server's `/health`, asked over loopback TCP.

mod memory;
mod secrets;
mod server;

pub use server::{http_status_line, https_status_line};

use std::fmt;
use std::io::{self, Read};
use std::path::PathBuf;

use serde::Serialize;

use crate::profile::Profile;

/// The box being examined: paths are read under `root`.
pub struct Host {
    root: PathBuf,
}

/// A process found in /proc.
struct Process {
    pid: u32,
    comm: String,
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Host {
        Host { root: root.into() }
    }

    fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }

    fn read(&self, absolute: &str) -> io::Result<String> {
        std::fs::read_to_string(self.path(absolute))
    }

    /// Processes whose name (`/proc/PID/comm`) is `name`.
    fn processes_named(&self, name: &str) -> Vec<Process> {
        let Ok(entries) = std::fs::read_dir(self.path("/proc")) else {
            return Vec::new();
        };
        let mut found: Vec<Process> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| {
                let comm = self.read(&format!("/proc/{pid}/comm")).ok()?;
                let comm = comm.trim_end().to_owned();
                (comm == name).then_some(Process { pid, comm })
            })
            .collect();
        found.sort_by_key(|p| p.pid);
        found
    }

    /// The kernel log as /dev/kmsg holds it. Reads stop at the end of the buffer instead of
    /// waiting for new records (non-blocking); a record overwritten while reading is skipped.
    fn kernel_log(&self) -> io::Result<String> {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK on Linux (asm-generic/fcntl.h); std exposes no constant for it.
        const O_NONBLOCK: i32 = 0o4000;
        const EPIPE: i32 = 32;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(O_NONBLOCK)
            .open(self.path("/dev/kmsg"))?;
        let mut log = Vec::new();
        let mut record = [0u8; 8192];
        loop {
            match file.read(&mut record) {
                Ok(0) => break,
                Ok(n) => log.extend_from_slice(&record[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(EPIPE) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(String::from_utf8_lossy(&log).into_owned())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Worth knowing, not wrong: does not make the doctor fail.
    Warn,
    Fail,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// What to do about a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub healthy: bool,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    /// The check called `name`, if it ran.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            let mark = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            writeln!(f, "{mark} {:<16} {}", c.name, c.detail)?;
            if let Some(fix) = &c.fix {
                writeln!(f, "     {:<16} fix: {fix}", "")?;
            }
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        writeln!(
            f,
            "{} passed, {} failed",
            self.checks.len() - failed,
            failed
        )
    }
}

/// Runs every check of `host` against `profile`.
pub fn examine(profile: &Profile, host: &Host) -> Report {
    let mut checks = vec![
        memory::zram(profile, host),
        memory::sysctls(profile, host),
        memory::earlyoom(profile, host),
        memory::kernel_oom_kills(host),
        memory::mem_total(profile, host),
        memory::headroom(profile, host),
        cpu_flags(host),
    ];
    checks.extend(secrets::checks(profile, host));
    checks.extend(server::checks(profile, host));
    Report {
        healthy: checks.iter().all(|c| c.status != Status::Fail),
        checks,
    }
}

/// The instruction-set extensions of x86-64-v3 as /proc/cpuinfo names them (`abm` is LZCNT).
const X86_64_V3_FLAGS: [&str; 9] = [
    "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave",
];

fn cpu_flags(host: &Host) -> Check {
    const NAME: &str = "cpu";
    let Ok(cpuinfo) = host.read("/proc/cpuinfo") else {
        return Check::fail(
            NAME,
            "cannot read /proc/cpuinfo",
            "run on Linux with /proc mounted",
        );
    };
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags")?.split_once(':').map(|(_, f)| f))
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let missing: Vec<&str> = X86_64_V3_FLAGS
        .into_iter()
        .filter(|f| !flags.contains(f))
        .collect();
    if missing.is_empty() {
        Check::ok(NAME, "x86-64-v3 (AVX2, FMA, F16C, BMI2, MOVBE)")
    } else {
        Check::fail(
            NAME,
            format!("the CPU lacks {} (x86-64-v3)", missing.join(", ")),
            "run on a CPU with x86-64-v3 (AMD EPYC, Intel Haswell or later; QEMU `-cpu max` or `-cpu host`)",
        )
    }
}

/// `key value` lines (memory.events, cpu.stat) as a lookup.
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

fn mib(bytes: u64) -> u64 {
    bytes / crate::plan::MIB
}
