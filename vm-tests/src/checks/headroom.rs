//! Headroom once the model is loaded: MemAvailable on the idle box is at least what the profile
//! promises (`machine.headroom_mib`, which loading the profile keeps above earlyoom's term line).

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
    let promised = profile.machine.headroom_mib * MIB;
    let detail = format!(
        "MemAvailable {} MiB of {} MiB with the model loaded (server cgroup {} MiB); the \
         profile promises {} MiB (machine.headroom_mib)",
        available / MIB,
        total / MIB,
        server / MIB,
        promised / MIB,
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
