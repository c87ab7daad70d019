//! The root grows into a boot volume larger than the image, as OCI's (50 GB at least) is: the
//! guest booted on an overlay of the image grown to [`GROWN_DISK_BYTES`]; systemd-repart widens
//! the root partition to the disk's end and systemd-growfs the ext4 in it (the image's
//! /etc/repart.d and fstab's x-systemd.growfs). Read inside the guest with lsblk and df.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{section, sections};
use crate::ssh::Ssh;

/// The grown disk: several GB, far past the image's root (a few hundred MiB of slack), and
/// free to make (a sparse overlay).
pub const GROWN_DISK_BYTES: u64 = 6 << 30;
/// Space on the disk outside the root partition: the ESP (128 MiB, xtask/src/image/disk.rs;
/// 256 MiB for the Nix image) and the GPT's margins.
const OUTSIDE_ROOT: u64 = 320 << 20;
/// ext4's own metadata (inode tables, journal) that df does not count as size.
const EXT4_OVERHEAD: f64 = 0.05;
const MIB: u64 = 1 << 20;

/// Sizes in bytes as the guest sees them.
#[derive(Debug, PartialEq)]
struct Sizes {
    disk: u64,
    partition: u64,
    filesystem: u64,
}

pub fn run(ssh: &Ssh, image_bytes: u64) -> Result<String> {
    // Growing runs early in boot; allow for a slow guest.
    let waited = Instant::now();
    loop {
        let sizes = read(ssh)?;
        match judge(&sizes, image_bytes) {
            Ok(detail) => return Ok(detail),
            Err(e) if waited.elapsed() > Duration::from_secs(120) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_secs(5)),
        }
    }
}

fn read(ssh: &Ssh) -> Result<Sizes> {
    let out = ssh.check(
        "part=$(findmnt -n -o SOURCE /); disk=/dev/$(lsblk -n -o PKNAME \"$part\")
         echo '## disk'; lsblk -b -n -d -o SIZE \"$disk\"
         echo '## partition'; lsblk -b -n -d -o SIZE \"$part\"
         echo '## fs'; df -B1 --output=size / | tail -n 1",
    )?;
    let parts = sections(&out);
    let number = |name: &str| -> Result<u64> {
        let text = section(&parts, name)?.trim();
        text.parse()
            .with_context(|| format!("the guest's {name} size is {text:?}, not a number"))
    };
    Ok(Sizes {
        disk: number("disk")?,
        partition: number("partition")?,
        filesystem: number("fs")?,
    })
}

fn judge(s: &Sizes, image_bytes: u64) -> Result<String> {
    let detail = format!(
        "disk {} MiB (image {} MiB): root partition {} MiB, root file system {} MiB",
        s.disk / MIB,
        image_bytes / MIB,
        s.partition / MIB,
        s.filesystem / MIB
    );
    if s.disk != GROWN_DISK_BYTES {
        bail!("the guest's disk is not the grown overlay: {detail}");
    }
    if s.partition + OUTSIDE_ROOT < s.disk {
        bail!("systemd-repart did not grow the root partition to the disk's end: {detail}");
    }
    if (s.filesystem as f64) < s.partition as f64 * (1.0 - EXT4_OVERHEAD) {
        bail!("systemd-growfs did not grow the root file system to its partition: {detail}");
    }
    Ok(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wants_partition_and_file_system_grown_to_the_disk() {
        let image = 900 * MIB;
        let grown = Sizes {
            disk: GROWN_DISK_BYTES,
            partition: GROWN_DISK_BYTES - 130 * MIB,
            filesystem: GROWN_DISK_BYTES - 300 * MIB,
        };
        assert!(judge(&grown, image).unwrap().starts_with("disk 6144 MiB"));
        let e = judge(
            &Sizes {
                partition: 770 * MIB,
                filesystem: 700 * MIB,
                ..grown
            },
            image,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("systemd-repart"));
        let e = judge(
            &Sizes {
                filesystem: 700 * MIB,
                ..grown
            },
            image,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("systemd-growfs"));
        let e = judge(
            &Sizes {
                disk: image,
                ..grown
            },
            image,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("not the grown overlay"));
    }
}
