//! One QEMU guest booting the appliance image the way OCI boots it: UEFI (OVMF), the disk on
//! virtio-scsi as an OCI paravirtualized boot volume is (/dev/sda), virtio network, serial
//! console, the profile's RAM. The one launcher: the VM suite and
//! `cargo xtask image --smoke` both start their guests here.
//!
//! TCG only: /dev/kvm exists on these machines but hangs every guest. `-snapshot` writes nothing
//! back to the image. User networking lives in 169.254.0.0/16 because QEMU accepts a `guestfwd`
//! only for an address inside its own network, and the metadata service must be 169.254.169.254.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// The network QEMU's user networking simulates; the metadata address must be inside it.
const NETWORK: &str = "169.254.0.0/16";

pub struct Config<'a> {
    pub image: &'a Path,
    /// A QEMU CPU model: `max` (x86-64-v3 under TCG) or an older one for the CPU check.
    pub cpu: &'a str,
    pub ram_mib: u64,
    /// Guest TCP ports to forward from the host's loopback.
    pub guest_ports: &'a [u16],
    /// `IP:PORT` of the metadata service and the command QEMU runs per connection to it, if
    /// the guest gets one.
    pub metadata: Option<(String, String)>,
    /// Where the guest's files (console, firmware variables) go.
    pub dir: &'a Path,
    /// Boot a copy-on-write overlay of the image grown to this many bytes, as OCI's boot volume
    /// (50 GB at least) is larger than the image: the root must grow into it on first boot.
    pub disk_bytes: Option<u64>,
}

/// A running guest; QEMU is killed when it is dropped.
pub struct Vm {
    child: Child,
    pub console: PathBuf,
    stderr: PathBuf,
    /// Host address forwarded to each of `Config::guest_ports`, in order.
    forwards: Vec<(u16, SocketAddr)>,
}

impl Vm {
    pub fn start(config: &Config) -> Result<Vm> {
        for (path, package) in [(OVMF_CODE, "ovmf"), (OVMF_VARS, "ovmf")] {
            if !Path::new(path).exists() {
                bail!("{path} is missing: install the firmware with `apt-get install {package}`");
            }
        }
        if !config.image.is_file() {
            bail!(
                "no image at {}: build it with `cargo xtask image`",
                config.image.display()
            );
        }
        let disk = match config.disk_bytes {
            Some(bytes) => grown_overlay(config, bytes)?,
            None => config.image.to_path_buf(),
        };
        let vars = config.dir.join(format!("ovmf-vars-{}.fd", config.cpu));
        std::fs::copy(OVMF_VARS, &vars).with_context(|| format!("copy {OVMF_VARS}"))?;
        let console = config.dir.join(format!("console-{}.log", config.cpu));
        let forwards = config
            .guest_ports
            .iter()
            .map(|&guest| Ok((guest, free_loopback_port()?)))
            .collect::<Result<Vec<_>>>()?;
        let stderr = config.dir.join(format!("qemu-{}.stderr", config.cpu));
        let mut netdev = format!("user,id=net0,net={NETWORK}");
        if let Some((address, command)) = &config.metadata {
            netdev.push_str(&format!(
                ",guestfwd=tcp:{address}-cmd:{}",
                command.replace(',', ",,")
            ));
        }
        for (guest, host) in &forwards {
            netdev.push_str(&format!(",hostfwd=tcp:{host}-:{guest}"));
        }
        let child = Command::new("qemu-system-x86_64")
            .args(["-machine", "q35", "-accel", "tcg", "-cpu", config.cpu])
            .args(["-smp", "2", "-m", &config.ram_mib.to_string()])
            .arg("-drive")
            .arg(format!("if=pflash,format=raw,readonly=on,file={OVMF_CODE}"))
            .arg("-drive")
            .arg(format!("if=pflash,format=raw,file={}", vars.display()))
            // The boot disk as OCI attaches a paravirtualized boot volume: a SCSI disk on a
            // virtio-scsi controller, not virtio-blk. Both initramfs builders carry its drivers:
            // Debian's initramfs-tools with its default MODULES=most copies all of
            // kernel/drivers/scsi (virtio_scsi, sd_mod; hook-functions, class `scsi`), and
            // NixOS's qemu-guest profile (imported by oci-common.nix) lists virtio_scsi beside
            // the default sd_mod. Root is found by PARTUUID, so the device name does not matter.
            .args(["-device", "virtio-scsi-pci,id=scsi0"])
            .arg("-drive")
            .arg(format!(
                "if=none,id=disk0,format=qcow2,file={}",
                disk.display()
            ))
            .args(["-device", "scsi-hd,drive=disk0,bus=scsi0.0"])
            .args(["-snapshot", "-nographic", "-monitor", "none"])
            .args(["-netdev", &netdev, "-device", "virtio-net-pci,netdev=net0"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&stderr)?))
            .spawn()
            .context("start qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
        Ok(Vm {
            child,
            console,
            stderr,
            forwards,
        })
    }

    /// The host address forwarded to `guest_port`.
    pub fn forward(&self, guest_port: u16) -> SocketAddr {
        self.forwards
            .iter()
            .find(|(guest, _)| *guest == guest_port)
            .map(|(_, host)| *host)
            .expect("every forwarded port is in the VM's configuration")
    }

    /// Fails when QEMU has exited, with its status and error output.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            bail!("QEMU exited ({status}): {}", stderr.trim_end());
        }
        Ok(())
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A qcow2 overlay in the guest's folder backed by the image (which stays untouched) with a
/// virtual size of `bytes`: the same disk, with unpartitioned space after the root partition.
fn grown_overlay(config: &Config, bytes: u64) -> Result<PathBuf> {
    let overlay = config.dir.join(format!("grown-{}.qcow2", config.cpu));
    let _ = std::fs::remove_file(&overlay);
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(config.image)
        .arg(&overlay)
        .arg(bytes.to_string())
        .output()
        .context("run qemu-img (apt-get install qemu-utils)")?;
    if !out.status.success() {
        bail!(
            "qemu-img could not make a {bytes}-byte overlay of {}: {}",
            config.image.display(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    Ok(overlay)
}

/// A loopback port nothing listens on now. QEMU binds it a moment later; another process could
/// take it in between, which QEMU then reports as a failed `hostfwd`.
fn free_loopback_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}
