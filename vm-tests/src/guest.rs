//! A booted appliance: the QEMU guest, SSH into it, its API from the host, and the waits that
//! take it from power-on to ready.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appliance::tls::Fingerprint;
use appliance::{paths, Profile};

use crate::http::Api;
use crate::qemu::{self, Vm};
use crate::sabotage::Policy;
use crate::ssh::Ssh;

/// A guest port the firewall must not let through: QEMU forwards it like the allowed ones, so
/// only the guest's nftables can block it.
pub const CLOSED_PORT: u16 = 9999;
/// The QEMU CPU model the appliance is built for: under TCG it has x86-64-v3.
pub const MAIN_CPU: &str = "max";
/// How often a wait asks again.
const POLL: Duration = Duration::from_secs(5);

pub struct Guest {
    pub vm: Vm,
    pub ssh: Ssh,
    /// The API on the host: plain until [`Guest::read_secrets`] learns the key and certificate.
    pub api: Api,
    pub started: Instant,
    old_cpu: bool,
    remove: Vec<Policy>,
}

/// What a guest needs from the run: the image, its profile, the test's key and the command that
/// serves the key to the guest.
#[derive(Clone)]
pub struct Boot<'a> {
    pub image: &'a Path,
    pub profile: &'a Profile,
    pub key: &'a Path,
    pub imds_command: String,
    pub dir: &'a Path,
    /// Policies to take away once SSH answers (to see their checks fail).
    pub remove: &'a [Policy],
    /// Boot on a disk grown to this size (see `qemu::Config::disk_bytes`).
    pub disk_bytes: Option<u64>,
}

impl Guest {
    /// Powers on a guest with the QEMU CPU model `cpu`.
    pub fn start(boot: &Boot, cpu: &str) -> Result<Guest> {
        let p = boot.profile;
        let (ssh_port, api_port) = (p.network.ssh_port.0, p.server.api_port.0);
        if [ssh_port, api_port].contains(&CLOSED_PORT) {
            bail!("the profile allows port {CLOSED_PORT}, which the firewall check needs closed");
        }
        let started = Instant::now();
        let vm = Vm::start(&qemu::Config {
            image: boot.image,
            cpu,
            ram_mib: p.machine.ram_mib,
            guest_ports: &[ssh_port, api_port, CLOSED_PORT],
            metadata: Some((
                format!("{}:80", p.oci.metadata_address),
                boot.imds_command.clone(),
            )),
            dir: boot.dir,
            disk_bytes: boot.disk_bytes,
        })?;
        let ssh = Ssh::new(boot.key, vm.forward(ssh_port));
        let api = Api::plain(vm.forward(api_port));
        Ok(Guest {
            vm,
            ssh,
            api,
            started,
            old_cpu: cpu != MAIN_CPU,
            remove: boot.remove.to_vec(),
        })
    }

    /// Waits until root can log in with the test's key, which the guest can only have fetched
    /// from the metadata service.
    pub fn wait_for_ssh(&mut self, budget: Duration) -> Result<Duration> {
        let mut last = String::new();
        while self.started.elapsed() < budget {
            self.vm.ensure_running()?;
            let out = self.ssh.run("true")?;
            if out.status == Some(0) {
                let at = self.started.elapsed();
                for policy in &self.remove {
                    if policy.on_old_cpu() == self.old_cpu {
                        policy.apply(&self.ssh)?;
                    }
                }
                return Ok(at);
            }
            last = out.stderr;
            std::thread::sleep(POLL);
        }
        bail!(
            "no SSH login within {budget:?} of power-on (last error: {})",
            last.trim()
        )
    }

    /// Waits for llm-secrets.service, then reads the API key and the certificate over SSH, as
    /// an administrator would, and points the API at them: HTTPS pinned to that certificate,
    /// with that key.
    pub fn read_secrets(&mut self, budget: Duration) -> Result<()> {
        loop {
            self.vm.ensure_running()?;
            let state = self
                .ssh
                .check("systemctl is-active llm-secrets.service || true")?;
            match state.trim() {
                "active" => break,
                "failed" => bail!(
                    "llm-secrets.service failed:\n{}",
                    self.ssh
                        .check("journalctl -u llm-secrets -o cat --no-pager | tail -20")?
                ),
                _ if self.started.elapsed() > budget => {
                    bail!("llm-secrets.service is `{}` after {budget:?}", state.trim())
                }
                _ => std::thread::sleep(POLL),
            }
        }
        let keys = self.ssh.check(&format!("cat {}", paths::API_KEYS))?;
        let key = keys
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .with_context(|| format!("{} holds no key", paths::API_KEYS))?;
        let cert = self.ssh.check(&format!("cat {}", paths::TLS_CERT))?;
        let fingerprint = Fingerprint::of_pem(cert.as_bytes()).map_err(anyhow::Error::msg)?;
        self.api.key = Some(key.to_owned());
        self.api.tls = Some(fingerprint);
        Ok(())
    }

    /// Waits until `/health` answers 200 from the host through QEMU's forward and the firewall.
    pub fn wait_for_health(&mut self, budget: Duration) -> Result<Duration> {
        let mut last = String::new();
        while self.started.elapsed() < budget {
            self.vm.ensure_running()?;
            match self.api.get("/health", Duration::from_secs(30)) {
                Ok(r) if r.status == 200 => return Ok(self.started.elapsed()),
                Ok(r) => last = format!("{} {}", r.status, r.body.trim()),
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(POLL);
        }
        bail!("/health did not answer 200 within {budget:?} of power-on (last: {last})")
    }

    pub fn console(&self) -> PathBuf {
        self.vm.console.clone()
    }
}
