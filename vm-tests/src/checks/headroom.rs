//! Headroom once the model is loaded: the profile's earlyoom thresholds say where memory counts
//! as short on this box (`mem_term_percent` of MemTotal); an idle appliance with its model
//! loaded must sit above that line, or the policy would start killing at rest.

use anyhow::Result;
use appliance::plan::MIB;
use appliance::Profile;

use super::{meminfo_bytes, section, sections, verdict};
use crate::ssh::Ssh;

pub fn run(ssh: &Ssh, profile: &Profile) -> Result<String> {
    let out = ssh.check(
        "echo '## meminfo'; cat /proc/meminfo
         echo '## server'; cat /sys/fs/cgroup/system.slice/llm-server.service/memory.current",
    )?;
    let parts = sections(&out);
    let meminfo = section(&parts, "meminfo")?;
    let total = meminfo_bytes(meminfo, "MemTotal")?;
    let available = meminfo_bytes(meminfo, "MemAvailable")?;
    let server = section(&parts, "server")?
        .trim()
        .parse::<u64>()
        .unwrap_or(0);
    let promised = total * u64::from(profile.earlyoom.mem_term_percent) / 100;
    let detail = format!(
        "MemAvailable {} MiB of {} MiB with the model loaded (server cgroup {} MiB); the \
         profile's line is {} MiB ({}% of MemTotal)",
        available / MIB,
        total / MIB,
        server / MIB,
        promised / MIB,
        profile.earlyoom.mem_term_percent
    );
    let mut problems = Vec::new();
    if available < promised {
        problems.push(format!("only {detail}"));
    }
    if server == 0 {
        problems.push("the server's cgroup charges nothing: is the model loaded?".into());
    }
    verdict(problems, detail)
}
