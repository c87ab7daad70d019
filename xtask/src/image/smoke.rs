//! `--smoke`: boot the image the way OCI would (UEFI, serial console, the profile's RAM) in
//! QEMU and wait for the login prompt on the serial console.
//!
//! QEMU runs under TCG with `-cpu max` (x86-64-v3 for the server): /dev/kvm hangs guests on
//! these machines. `-snapshot` keeps the image untouched.

use std::fmt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appliance::Profile;
use xshell::Shell;

const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// What the serial console showed.
pub struct Boot {
    pub to_login: Duration,
    /// `free --mebi`'s "used" from the memory-baseline unit.
    pub os_used_mib: Option<u64>,
    /// The console line where systemd reported llm-server.service started or failed.
    pub server: Option<(Duration, String)>,
    pub console: std::path::PathBuf,
}

impl fmt::Display for Boot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "smoke boot: login prompt after {:.0} s",
            self.to_login.as_secs_f64()
        )?;
        match self.os_used_mib {
            Some(m) => writeln!(f, "  OS memory used before the server starts: {m} MiB")?,
            None => writeln!(f, "  OS memory before the server: not printed")?,
        }
        match &self.server {
            Some((at, line)) => writeln!(f, "  after {:.0} s: {line}", at.as_secs_f64())?,
            None => writeln!(
                f,
                "  llm-server.service: no start or failure reported in time"
            )?,
        }
        write!(f, "  console: {}", self.console.display())
    }
}

/// Kills QEMU when the smoke test ends, however it ends.
struct Vm(Child);

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn boot(sh: &Shell, image: &Path, profile: &Profile, out: &Path, timeout: u64) -> Result<Boot> {
    super::ensure_tools(
        sh,
        &[
            ("qemu-system-x86_64", "qemu-system-x86"),
            (OVMF_CODE, "ovmf"),
        ],
    )?;
    let vars = out.join("smoke-ovmf-vars.fd");
    std::fs::copy(OVMF_VARS, &vars).with_context(|| format!("copy {OVMF_VARS}"))?;
    let console = out.join("smoke-console.log");
    let _ = std::fs::remove_file(&console);
    let started = Instant::now();
    let mut vm = Vm(Command::new("qemu-system-x86_64")
        .args([
            "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-smp", "2",
        ])
        .args(["-m", &profile.machine.ram_mib.to_string()])
        .arg("-drive")
        .arg(format!("if=pflash,format=raw,readonly=on,file={OVMF_CODE}"))
        .arg("-drive")
        .arg(format!("if=pflash,format=raw,file={}", vars.display()))
        .arg("-drive")
        .arg(format!("if=virtio,format=qcow2,file={}", image.display()))
        .args(["-snapshot", "-nographic", "-monitor", "none"])
        .args([
            "-netdev",
            "user,id=net0",
            "-device",
            "virtio-net-pci,netdev=net0",
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("start qemu-system-x86_64")?);
    let deadline = Duration::from_secs(timeout);
    let mut to_login = None;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if to_login.is_none() && text.contains(" login: ") {
            to_login = Some(started.elapsed());
        }
        let server = server_outcome(&text);
        // After the prompt, wait for the server's outcome too (loading takes a while under TCG).
        if let (Some(to_login), Some(line)) = (to_login, &server) {
            return Ok(Boot {
                to_login,
                os_used_mib: used_mib(&text),
                server: Some((started.elapsed(), line.clone())),
                console,
            });
        }
        if let Some(status) = vm.0.try_wait()? {
            bail!(
                "QEMU exited ({status}) before the login prompt:\n{}",
                tail(&text)
            );
        }
        if started.elapsed() > deadline {
            let Some(to_login) = to_login else {
                bail!(
                    "no login prompt on the serial console within {timeout} s:\n{}",
                    tail(&text)
                );
            };
            return Ok(Boot {
                to_login,
                os_used_mib: used_mib(&text),
                server: None,
                console,
            });
        }
    }
}

/// systemd's status line for llm-server.service starting (READY=1) or failing.
fn server_outcome(console: &str) -> Option<String> {
    console
        .lines()
        .filter(|l| l.contains("llm-server.service"))
        .find(|l| l.contains("Started") || l.contains("Failed") || l.contains("failed"))
        .map(strip_ansi)
}

/// The text of a console line without its colour codes.
fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters final-letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out.trim().to_owned()
}

/// "used" from `free --mebi`'s `Mem:` line: `Mem: total used free shared buff/cache available`.
fn used_mib(console: &str) -> Option<u64> {
    console
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Mem:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
