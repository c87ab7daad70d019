//! Commands in the guest over SSH, as root with the key the guest fetched from the (fake)
//! metadata service: the same path an OCI user's key takes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

pub struct Ssh {
    key: PathBuf,
    addr: SocketAddr,
}

/// What a guest command printed and how it ended.
pub struct Output {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Makes a fresh ed25519 key pair in `dir` and returns the private key's path; the public half
/// is next to it with `.pub` appended.
pub fn generate_key(dir: &Path) -> Result<PathBuf> {
    let key = dir.join("id_ed25519");
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "vm-test", "-f"])
        .arg(&key)
        .status()
        .context("run ssh-keygen (apt-get install openssh-client)")?;
    if !status.success() {
        bail!("ssh-keygen failed ({status})");
    }
    Ok(key)
}

impl Ssh {
    /// Logs in to `addr` (a host port QEMU forwards to the guest's sshd) with `key`.
    pub fn new(key: &Path, addr: SocketAddr) -> Ssh {
        Ssh {
            key: key.to_owned(),
            addr,
        }
    }

    /// Runs `script` with the guest's shell as root, whatever its exit status.
    pub fn run(&self, script: &str) -> Result<Output> {
        let out = Command::new("ssh")
            .arg("-i")
            .arg(&self.key)
            .args(["-p", &self.addr.port().to_string()])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "LogLevel=ERROR",
                // TCG makes the key exchange slow; a dead guest should still fail in time.
                "-o",
                "ConnectTimeout=60",
                "-o",
                "ServerAliveInterval=30",
                "-o",
                "ServerAliveCountMax=20",
            ])
            .arg(format!("root@{}", self.addr.ip()))
            .arg(script)
            .output()
            .context("run ssh (apt-get install openssh-client)")?;
        Ok(Output {
            status: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Runs `script` and returns its output, failing unless it exits with 0.
    pub fn check(&self, script: &str) -> Result<String> {
        let out = self.run(script)?;
        if out.status != Some(0) {
            bail!(
                "`{script}` in the guest exited with {:?}:\n{}{}",
                out.status,
                out.stdout,
                out.stderr
            );
        }
        Ok(out.stdout)
    }
}
