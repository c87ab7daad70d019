//! A CPU without AVX2: the server refuses with its CPU message and systemd does not restart it
//! in a loop.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use appliance::Profile;

use super::{properties, verdict};
use crate::ssh::Ssh;

/// A QEMU CPU model before Haswell: SSE4.2 and AES, no AVX at all.
pub const OLD_CPU: &str = "Westmere";
/// Words of the server's refusal (server/src/cpu.rs) that name the cause.
const MESSAGE: &str = "this CPU lacks";

pub fn run(ssh: &Ssh, profile: &Profile) -> Result<String> {
    let show = "systemctl show llm-server -p ActiveState,Result,ExecMainStatus,NRestarts";
    // The unit may still be starting when SSH first answers.
    let waited = Instant::now();
    let mut state = ssh.check(show)?;
    // Failed for good, or restarted at least once (then the check below says so).
    while properties(&state).get("ActiveState") != Some(&"failed")
        && properties(&state).get("NRestarts") == Some(&"0")
    {
        if waited.elapsed() > Duration::from_secs(300) {
            bail!("llm-server never failed on {OLD_CPU}: {}", state.trim());
        }
        std::thread::sleep(Duration::from_secs(5));
        state = ssh.check(show)?;
    }
    // Long enough for several restarts, had the unit allowed them.
    let settle = 4 * u64::from(profile.server.restart_sec);
    std::thread::sleep(Duration::from_secs(settle));
    let out = ssh.check(&format!(
        "{show}; echo '## journal'; journalctl -u llm-server -o cat | tail -n 12"
    ))?;
    let (state, journal) = out.split_once("## journal").unwrap_or((&out, ""));
    let p = properties(state);
    let get = |key: &str| p.get(key).copied().unwrap_or("?");
    let mut problems = Vec::new();
    if get("NRestarts") != "0" || get("ActiveState") != "failed" {
        problems.push(format!(
            "{settle} s later the unit is {} after {} restarts: it restarts in a loop",
            get("ActiveState"),
            get("NRestarts")
        ));
    }
    if get("ExecMainStatus") != "3" {
        problems.push(format!(
            "llm-server ended with {} ({}), not exit status 3 (its CPU refusal)",
            get("ExecMainStatus"),
            get("Result")
        ));
    }
    let message = journal.lines().find(|l| l.contains(MESSAGE));
    if message.is_none() {
        problems.push(format!(
            "the journal of llm-server has no `{MESSAGE}` line; it ends:\n{}",
            journal.trim()
        ));
    }
    verdict(
        problems,
        format!(
            "-cpu {OLD_CPU}: exit 3, failed, no restart in {settle} s; journal: {}",
            message.unwrap_or_default().trim()
        ),
    )
}
