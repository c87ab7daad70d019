//! The root file system: a Debian base made by mmdebstrap (cached as a tarball, keyed by its
//! exact arguments), then the appliance installed into a copy of it. Nothing runs inside the
//! tree: files are written directly and units enabled with `systemctl --root`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use appliance::{paths, render, Profile};
use xshell::{cmd, Shell};

use super::disk::Layout;
use super::Binaries;

const SUITE: &str = "bookworm";
/// The packages on top of Debian's minbase. The cloud kernel is the small, virtio-focused one;
/// no cloud-init (too heavy for 1 GB: the key-fetching unit does its one job here).
const PACKAGES: [&str; 15] = [
    "linux-image-cloud-amd64",
    "initramfs-tools",
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "systemd-zram-generator",
    "earlyoom",
    "nftables",
    "openssh-server",
    "curl",
    "ca-certificates",
    "e2fsprogs",
    // The UEFI boot loader; only its binary is used (copied onto the ESP).
    "systemd-boot-efi",
    "procps",
];
/// Documentation, manuals and translations are never read on the appliance; the licences
/// (`copyright`) stay.
const DPKG_OPTIONS: [&str; 6] = [
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
];
/// Units that must not run: systemd-firstboot would prompt on the console of a fresh box, and
/// apt's daily runs would compete with the model for 1 GB (the appliance is updated by
/// replacing its image).
const UNITS_TO_MASK: [&str; 3] = [
    "systemd-firstboot.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
];

fn mmdebstrap_args() -> Vec<String> {
    let mut args = vec![
        "--variant=minbase".to_owned(),
        format!("--include={}", PACKAGES.join(",")),
    ];
    args.extend(DPKG_OPTIONS.iter().map(|o| format!("--dpkgopt={o}")));
    args.push(SUITE.to_owned());
    args
}

fn sources() -> Vec<String> {
    vec![
        format!("deb http://deb.debian.org/debian {SUITE} main"),
        format!("deb http://deb.debian.org/debian {SUITE}-updates main"),
        format!("deb http://deb.debian.org/debian-security {SUITE}-security main"),
    ]
}

/// The Debian base as a tarball, rebuilt when the arguments change or `fresh` is set.
pub fn base(sh: &Shell, cache: &Path, fresh: bool) -> Result<PathBuf> {
    let tarball = cache.join(format!("debian-{SUITE}-base.tar"));
    let stamp = cache.join(format!("debian-{SUITE}-base.args"));
    let args = mmdebstrap_args();
    let sources = sources();
    let key = [args.clone(), sources.clone()].concat().join("\n");
    if !fresh && tarball.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&key) {
        eprintln!("    reusing {} (--fresh rebuilds it)", tarball.display());
        return Ok(tarball);
    }
    sh.create_dir(cache)?;
    let partial = cache.join(format!("debian-{SUITE}-base.partial.tar"));
    cmd!(sh, "mmdebstrap --quiet {args...} {partial} {sources...}")
        .run()
        .context("mmdebstrap failed (it needs root and Debian's mirrors)")?;
    std::fs::rename(&partial, &tarball)?;
    std::fs::write(&stamp, key)?;
    Ok(tarball)
}

/// Unpacks the base into `root` and installs the appliance into it.
pub fn assemble(
    sh: &Shell,
    base: &Path,
    root: &Path,
    profile: &Profile,
    binaries: &Binaries,
    model: &Path,
    layout: &Layout,
) -> Result<()> {
    if root.exists() {
        sh.remove_path(root)?;
    }
    sh.create_dir(root)?;
    cmd!(
        sh,
        "tar --numeric-owner --xattrs --xattrs-include=* -xpf {base} -C {root}"
    )
    .run()?;

    render::write(&render::render(profile), root).context("install the rendered files")?;
    install(
        &binaries.server,
        &root.join(paths::SERVER_BINARY.trim_start_matches('/')),
        0o755,
    )?;
    install(
        &binaries.appliance,
        &root.join(paths::APPLIANCE_BINARY.trim_start_matches('/')),
        0o755,
    )?;
    let model_dest = root.join(profile.model_path().trim_start_matches('/'));
    install(model, &model_dest, 0o644)?;

    // The root partition grows to the boot volume on first boot: systemd-repart widens the
    // partition (its type is the x86-64 root type), then systemd-growfs the file system.
    std::fs::write(
        root.join("etc/fstab"),
        format!(
            "# <file system> <mount point> <type> <options> <dump> <pass>\n\
             PARTUUID={} / ext4 defaults,errors=remount-ro,x-systemd.growfs 0 1\n",
            layout.root_partuuid
        ),
    )?;
    sh.create_dir(root.join("etc/repart.d"))?;
    std::fs::write(
        root.join("etc/repart.d/50-root.conf"),
        "# Grow the root partition into the rest of the disk.\n[Partition]\nType=root\n",
    )?;

    // Per-instance identity is made on first boot, not baked into every copy of the image.
    for entry in std::fs::read_dir(root.join("etc/ssh"))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("ssh_host_") {
            std::fs::remove_file(&path)?;
        }
    }
    std::fs::write(root.join("etc/machine-id"), "")?;

    let enable = paths::UNITS_TO_ENABLE;
    cmd!(sh, "systemctl --root={root} enable --quiet {enable...}").run()?;
    cmd!(
        sh,
        "systemctl --root={root} mask --quiet {UNITS_TO_MASK...}"
    )
    .run()?;
    Ok(())
}

fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if !from.is_file() {
        bail!("{} does not exist", from.display());
    }
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Every installed package and its version, from the tree's dpkg database.
pub fn package_versions(
    sh: &Shell,
    root: &Path,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let admindir = root.join("var/lib/dpkg");
    let format = "${Package}\t${Version}\n";
    let listing = cmd!(sh, "dpkg-query --admindir={admindir} -W -f={format}").read()?;
    Ok(listing
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(name, version)| (name.to_owned(), version.into()))
        .collect())
}
