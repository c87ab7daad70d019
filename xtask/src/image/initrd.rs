//! The initramfs must hold the drivers OCI's boot needs: the boot volume is a SCSI disk on
//! virtio-scsi (virtio_scsi, sd_mod), the smoke and older setups attach virtio-blk
//! (virtio_blk), and the network is virtio (virtio_net). Without one, the box stops in the
//! initramfs waiting for its root, with nothing on the API or SSH to say why. Checked on the
//! built initrd with `lsinitramfs`; a driver built into the kernel (`modules.builtin`) counts.
//!
//! The list is shared with the Nix builder (`nix/initrd-modules.nix` asserts it on the NixOS
//! configuration): one file, `appliance/initrd-modules.json`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

/// The drivers every image's initramfs must hold.
pub fn required() -> Vec<String> {
    serde_json::from_str(include_str!("../../../appliance/initrd-modules.json"))
        .expect("appliance/initrd-modules.json is a JSON list of module names")
}

/// Checks the initrd under `root`'s /boot (as `lsinitramfs` lists it) against `required()`.
pub fn check(sh: &Shell, root: &Path) -> Result<String> {
    let initrd = super::disk::only_match(&root.join("boot"), "initrd.img-")?;
    let listing = cmd!(sh, "lsinitramfs {initrd}")
        .quiet()
        .read()
        .context("lsinitramfs failed (apt-get install initramfs-tools-core)")?;
    let version = initrd
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("initrd.img-"))
        .context("initrd name without a kernel version")?;
    let builtin_path = root.join(format!("usr/lib/modules/{version}/modules.builtin"));
    let builtin = std::fs::read_to_string(&builtin_path)
        .with_context(|| format!("read {}", builtin_path.display()))?;
    let required = required();
    let missing = missing(&listing, &builtin, &required);
    if !missing.is_empty() {
        bail!(
            "the initramfs {} lacks {}: OCI boots from a virtio-scsi disk on a virtio network, \
             and this box would stop before its root. Debian's initramfs-tools copies them with \
             its default MODULES=most; if /etc/initramfs-tools/initramfs.conf sets MODULES=dep or \
             list, name them in /etc/initramfs-tools/modules and run update-initramfs -u",
            initrd.display(),
            missing.join(", ")
        );
    }
    Ok(format!("{} in {}", required.join(", "), initrd.display()))
}

/// The names in `required` that are neither a module file in `listing` (one path per line, as
/// `lsinitramfs` prints) nor built in (`modules.builtin`: one `kernel/…/name.ko` per line).
fn missing<'a>(listing: &str, builtin: &str, required: &'a [String]) -> Vec<&'a str> {
    let names: Vec<String> = listing
        .lines()
        .chain(builtin.lines())
        .filter_map(module_name)
        .collect();
    required
        .iter()
        .map(String::as_str)
        .filter(|want| !names.iter().any(|n| n == &want.replace('-', "_")))
        .collect()
}

/// `…/virtio_scsi.ko` (or `.ko.xz`, `.ko.zst`, `.ko.gz`) → `virtio_scsi`, with `-` as `_` as
/// the kernel treats them.
fn module_name(path: &str) -> Option<String> {
    let file = path.trim().rsplit('/').next()?;
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    Some(stem.replace('-', "_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "usr/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/block/virtio_blk.ko
usr/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/net/virtio_net.ko
usr/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/scsi/sd_mod.ko.zst
usr/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/scsi/virtio_scsi.ko
usr/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio
";

    #[test]
    fn the_list_is_the_four_drivers() {
        let mut names = required();
        names.sort();
        assert_eq!(names, ["sd_mod", "virtio_blk", "virtio_net", "virtio_scsi"]);
    }

    #[test]
    fn names_each_missing_driver_and_counts_built_in_ones() {
        let required = required();
        assert!(missing(LISTING, "", &required).is_empty());
        let without_scsi: String = LISTING
            .lines()
            .filter(|l| !l.contains("virtio_scsi") && !l.contains("sd_mod"))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut gone = missing(&without_scsi, "", &required);
        gone.sort();
        assert_eq!(gone, ["sd_mod", "virtio_scsi"]);
        let builtin = "kernel/drivers/scsi/sd_mod.ko\nkernel/drivers/scsi/virtio_scsi.ko\n";
        assert!(missing(&without_scsi, builtin, &required).is_empty());
        // A directory named like a driver is not the driver.
        assert_eq!(module_name("usr/lib/modules/x/kernel/drivers/virtio"), None);
    }

    /// The whole check on a small initrd made here with cpio and gzip, as Debian compresses its
    /// own (lsinitramfs reads it as it reads a real one): passes
    /// with the four drivers, and names virtio_scsi when it is left out.
    #[test]
    fn checks_a_real_initrd_with_lsinitramfs() {
        let sh = Shell::new().unwrap();
        let dir = std::env::temp_dir().join(format!("xtask-initrd-{}", std::process::id()));
        let version = "6.1.0-test";
        let make = |drivers: &[&str]| {
            let _ = std::fs::remove_dir_all(&dir);
            let tree = dir.join("tree");
            let kernel = tree.join(format!("usr/lib/modules/{version}/kernel/drivers"));
            std::fs::create_dir_all(&kernel).unwrap();
            for d in drivers {
                std::fs::write(kernel.join(format!("{d}.ko")), b"").unwrap();
            }
            let root = dir.join("root");
            std::fs::create_dir_all(root.join("boot")).unwrap();
            let modules = root.join(format!("usr/lib/modules/{version}"));
            std::fs::create_dir_all(&modules).unwrap();
            std::fs::write(modules.join("modules.builtin"), "kernel/fs/ext4/ext4.ko\n").unwrap();
            let initrd = root.join(format!("boot/initrd.img-{version}"));
            let made = std::process::Command::new("sh")
                .args([
                    "-c",
                    "find . | cpio --quiet -o -H newc | gzip > \"$1\"",
                    "sh",
                ])
                .arg(&initrd)
                .current_dir(&tree)
                .status()
                .expect("sh runs");
            assert!(
                made.success(),
                "cpio (Debian package cpio) makes the test initrd"
            );
            root
        };
        let root = make(&["virtio_scsi", "sd_mod", "virtio_blk", "virtio_net"]);
        let seen = check(&sh, &root).unwrap();
        assert!(seen.starts_with("virtio_scsi, sd_mod"), "{seen}");
        let root = make(&["sd_mod", "virtio_blk", "virtio_net"]);
        let e = format!("{:#}", check(&sh, &root).unwrap_err());
        assert!(e.contains("lacks virtio_scsi:"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
