//! `--smoke`: boot the image the way OCI would (UEFI, serial console, the profile's RAM) in
//! QEMU, through the VM suite's launcher (`vm_tests::qemu`), and wait for the login prompt on
//! the serial console and then for the server's `/health`.

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use appliance::Profile;
use vm_tests::qemu::{Config, Vm};
use xshell::Shell;

/// What the boot showed.
pub struct Boot {
    /// From starting QEMU to the serial console's login prompt.
    pub to_login: Duration,
    /// `free --mebi`'s "used" printed by the memory-baseline unit before the server starts.
    pub os_used_mib: Option<u64>,
    /// From starting QEMU to `/health` answering 200 through the firewall, if it did in time.
    pub to_health: Option<Duration>,
    pub console: std::path::PathBuf,
}

impl fmt::Display for Boot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |d: Duration| format!("{:.0} s", d.as_secs_f64());
        writeln!(f, "smoke boot: login prompt after {}", secs(self.to_login))?;
        match self.os_used_mib {
            Some(m) => writeln!(f, "  OS memory used before the server starts: {m} MiB")?,
            None => writeln!(f, "  OS memory before the server: not printed")?,
        }
        match self.to_health {
            Some(d) => writeln!(f, "  llm-server /health answered 200 after {}", secs(d))?,
            None => writeln!(f, "  llm-server /health did not answer 200 in time")?,
        }
        write!(f, "  console: {}", self.console.display())
    }
}

pub fn boot(sh: &Shell, image: &Path, profile: &Profile, out: &Path, timeout: u64) -> Result<Boot> {
    crate::setup::ensure_debian(sh, &[crate::setup::Need::VmSuite])?;
    let api_port = profile.server.api_port.0;
    let started = Instant::now();
    let mut vm = Vm::start(&Config {
        image,
        cpu: "max",
        ram_mib: profile.machine.ram_mib,
        guest_ports: &[api_port],
        metadata: None,
        dir: out,
        disk_bytes: None,
    })?;
    let health = vm.forward(api_port);
    let console = vm.console.clone();
    let deadline = Duration::from_secs(timeout);
    let mut to_login = None;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if to_login.is_none() && text.contains(" login: ") {
            to_login = Some(started.elapsed());
        }
        // After the prompt, wait for the server too (loading takes a while under TCG).
        if let Some(to_login) = to_login {
            let answered = health_line(profile, health, &text)
                .is_ok_and(|line| line.split_whitespace().nth(1) == Some("200"));
            if answered || started.elapsed() > deadline {
                return Ok(Boot {
                    to_login,
                    os_used_mib: used_mib(&text),
                    to_health: answered.then(|| started.elapsed()),
                    console,
                });
            }
        }
        if let Err(e) = vm.ensure_running() {
            bail!("{e:#}, before the login prompt:\n{}", tail(&text));
        }
        if to_login.is_none() && started.elapsed() > deadline {
            bail!(
                "no login prompt on the serial console within {timeout} s:\n{}",
                tail(&text)
            );
        }
    }
}

/// `/health`'s status line: over HTTPS pinned to the certificate whose fingerprint
/// llm-secrets.service printed on the console when the profile turns TLS on (the smoke boot has
/// no SSH to read it from), else over plain HTTP.
fn health_line(
    profile: &Profile,
    addr: std::net::SocketAddr,
    console: &str,
) -> std::io::Result<String> {
    if !profile.server.tls.enabled() {
        return appliance::doctor::http_status_line(addr, "/health");
    }
    let fingerprint = console_fingerprint(console)
        .ok_or_else(|| std::io::Error::other("no certificate fingerprint on the console yet"))?;
    appliance::doctor::https_status_line(addr, "/health", fingerprint)
}

/// The last fingerprint `appliance secrets` printed on the console.
fn console_fingerprint(console: &str) -> Option<appliance::tls::Fingerprint> {
    console
        .lines()
        .filter_map(|l| l.split_once(appliance::secrets::FINGERPRINT_LINE))
        .filter_map(|(_, f)| appliance::tls::Fingerprint::parse(f.trim()).ok())
        .next_back()
}

/// "used" from `free --mebi`'s `Mem:` line: `Mem: total used free shared buff/cache available`
/// (on the console after a kernel timestamp and `free[PID]: `).
fn used_mib(console: &str) -> Option<u64> {
    console
        .lines()
        .find_map(|l| l.split_once("free[")?.1.split_once("Mem:"))
        .map(|(_, numbers)| numbers)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_baseline_off_the_console() {
        let console = "[   90.5] free[334]:       total   used   free  shared  buff/cache  available\n\
                       [   90.6] free[334]: Mem:      965    173    826       0          72        792\n";
        assert_eq!(super::used_mib(console), Some(173));
        assert_eq!(super::used_mib("Mem: 1 2 3\n"), None);
    }

    #[test]
    fn reads_the_fingerprint_off_the_console() {
        let f = appliance::tls::Fingerprint::of_der(b"cert");
        let console = format!(
            "[ 12.0] appliance[300]: {}{f}\n[ 13.0] other\n",
            appliance::secrets::FINGERPRINT_LINE
        );
        assert_eq!(super::console_fingerprint(&console), Some(f));
        assert_eq!(super::console_fingerprint("nothing\n"), None);
    }
}
