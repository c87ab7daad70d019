//! `cargo xtask image`: the appliance as a UEFI-bootable qcow2 for Oracle Cloud, built from
//! Debian packages without Nix, loop devices or mounts.
//!
//! Steps: check the host's tools; build the release binaries; fetch the model; plan its memory
//! with the server's own planner and hold the profile's limits to the plan; make (or reuse) a
//! Debian base root file system with mmdebstrap; install the binaries, the model and the files
//! rendered from the profile into it; pack it with `mkfs.ext4 -d`; build the EFI system
//! partition with mtools; lay both out in a GPT disk with sgdisk; convert to qcow2; write a
//! manifest. `--smoke` then boots the result in QEMU.

mod disk;
mod initrd;
mod rootfs;
mod smoke;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use appliance::plan::{self, ServerPlan};
use appliance::profile::MemoryLimits;
use appliance::{render, Profile};
use xshell::{cmd, Shell};

use crate::setup::{self, Need};

#[derive(clap::Args)]
pub struct Image {
    /// The appliance profile to build.
    #[arg(long, default_value = "appliance/profiles/e2-micro.toml")]
    profile: PathBuf,
    /// Output directory (the image is `<dir>/<profile name>.qcow2`).
    #[arg(long, default_value = "target/appliance")]
    out: PathBuf,
    /// Rebuild the Debian base even if a cached one matches the package list.
    #[arg(long)]
    fresh: bool,
    /// After building, boot the image in QEMU (TCG, the profile's RAM) and wait for the
    /// serial console's login prompt.
    #[arg(long)]
    smoke: bool,
    /// Seconds the smoke boot may take to reach the login prompt.
    #[arg(long, default_value_t = 900)]
    smoke_timeout: u64,
    /// Who builds the image: `nix` (`nix build .#e2-micro-image`), `debian` (mmdebstrap, this
    /// task), or `auto`: Nix when a Nix that can build NixOS is present, Debian otherwise.
    #[arg(long, value_enum, default_value_t = Builder::Auto)]
    pub builder: Builder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Builder {
    Auto,
    Nix,
    Debian,
}

impl Builder {
    pub fn as_arg(self) -> &'static str {
        match self {
            Builder::Auto => "auto",
            Builder::Nix => "nix",
            Builder::Debian => "debian",
        }
    }
}

/// Nix's flags that enable the flakes interface for one command.
const NIX_FLAGS: [&str; 2] = ["--extra-experimental-features", "nix-command flakes"];

/// Whether this machine's Nix can build NixOS: `nix` runs and the binary cache answers (without
/// it, nixpkgs cannot be fetched and a NixOS build cannot start).
fn nix_can_build_nixos(sh: &Shell) -> bool {
    let ping = "https://cache.nixos.org";
    cmd!(
        sh,
        "timeout 20 nix {NIX_FLAGS...} store ping --store {ping}"
    )
    .quiet()
    .ignore_stdout()
    .ignore_stderr()
    .run()
    .is_ok()
}

impl Image {
    pub fn run(self, sh: &Shell) -> Result<()> {
        // First: an unpinned or inconsistent profile stops here, before any probe or build.
        let profile = Profile::load(&self.profile)?;
        let builder = match self.builder {
            Builder::Auto if nix_can_build_nixos(sh) => Builder::Nix,
            Builder::Auto => Builder::Debian,
            chosen => chosen,
        };
        let why = match self.builder {
            Builder::Auto => " (auto: a Nix that can build NixOS is present)",
            _ => " (--builder)",
        };
        if builder == Builder::Nix {
            println!("builder: nix{why}");
            return self.run_nix(sh, profile);
        }
        let why = match self.builder {
            Builder::Auto => " (auto: no Nix that can build NixOS here)",
            _ => " (--builder)",
        };
        println!("builder: debian{why}");
        self.run_debian(sh, profile)
    }

    /// `nix build .#<machine>-image`, then the qcow2 copied to where the Debian builder puts it.
    fn run_nix(self, sh: &Shell, profile: Profile) -> Result<()> {
        let name = profile.machine.name.clone();
        let out = sh.current_dir().join(&self.out);
        sh.create_dir(&out)?;
        let link = out.join("nix-result");
        let attr = format!(".#{name}-image");
        cmd!(sh, "nix {NIX_FLAGS...} build {attr} --out-link {link}")
            .run()
            .context(
                "nix build failed; `--builder debian` builds the same appliance without Nix",
            )?;
        let built = link.join(format!("{name}.qcow2"));
        let image = out.join(format!("{name}.qcow2"));
        std::fs::copy(&built, &image)
            .with_context(|| format!("copy {} to {}", built.display(), image.display()))?;
        println!("built {} with Nix", image.display());
        if self.smoke {
            let boot = smoke::boot(sh, &image, &profile, &out, self.smoke_timeout)?;
            println!("{boot}");
        }
        Ok(())
    }

    fn run_debian(self, sh: &Shell, profile: Profile) -> Result<()> {
        let started = Instant::now();
        let mut progress = Progress::new();
        let name = profile.machine.name.clone();
        let out = sh.current_dir().join(&self.out);
        let work = out.join("work");
        sh.create_dir(&work)?;

        progress.step("check the host's tools", || {
            setup::ensure_debian(sh, &[Need::Image])
        })?;
        let binaries = progress.step("build llm-server and appliance (release)", || {
            build_binaries(sh)
        })?;
        let model = progress.step("fetch and check the model", || model(sh, &profile))?;
        let plan = progress.step("plan the server's memory (llm-server plan)", || {
            memory_plan(sh, &binaries.server, &model, &profile)
        })?;
        let base = progress.step("Debian base (mmdebstrap)", || {
            rootfs::base(sh, &out.join("cache"), self.fresh)
        })?;
        let layout = disk::Layout::new(sh)?;
        let root_dir = work.join("rootfs");
        progress.step("assemble the root file system", || {
            rootfs::assemble(sh, &base, &root_dir, &profile, &binaries, &model, &layout)?;
            // The plan and the server unit's memory drop-in resolved from it, the text
            // `appliance memory` writes for the NixOS module.
            let planned = render::planned(&profile, &plan.text, &plan.limits);
            render::write(&planned, &root_dir)
                .context("install the plan and the memory drop-in")?;
            Ok(())
        })?;
        progress.step("check the initramfs's boot drivers (lsinitramfs)", || {
            let seen = initrd::check(sh, &root_dir)?;
            eprintln!("    {seen}");
            Ok(())
        })?;
        let packages = rootfs::package_versions(sh, &root_dir)?;
        let image = out.join(format!("{name}.qcow2"));
        let built = progress.step("make the disk (ext4, ESP, GPT, qcow2)", || {
            disk::build(sh, &root_dir, &work, &layout, &image)
        })?;
        progress.step("write the manifest", || {
            let manifest = manifest(&profile, &image, &built, &binaries, &packages, &plan.json)?;
            let path = out.join("manifest.json");
            std::fs::write(&path, serde_json::to_string_pretty(&manifest)? + "\n")
                .with_context(|| format!("write {}", path.display()))
        })?;
        sh.remove_path(&work)?;
        let size = std::fs::metadata(&image)?.len();
        println!(
            "built {} ({} MiB) in {:.0} s",
            image.display(),
            size >> 20,
            started.elapsed().as_secs_f64()
        );
        if size > 1 << 30 {
            eprintln!("warning: the image is over the 1 GiB goal");
        }
        if self.smoke {
            let boot = progress.step("smoke boot (QEMU TCG)", || {
                smoke::boot(sh, &image, &profile, &out, self.smoke_timeout)
            })?;
            println!("{boot}");
        }
        Ok(())
    }
}

/// Prints each step's name, then its duration.
struct Progress {
    started: Instant,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            started: Instant::now(),
        }
    }

    fn step<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let at = self.started.elapsed().as_secs_f64();
        eprintln!("==> [{at:6.1} s] {name}");
        let begun = Instant::now();
        let result = f().with_context(|| format!("step `{name}` failed"))?;
        eprintln!("    done in {:.1} s", begun.elapsed().as_secs_f64());
        Ok(result)
    }
}

/// The two release binaries the image runs.
pub struct Binaries {
    pub server: PathBuf,
    pub appliance: PathBuf,
}

/// `appliance` is built for baseline x86-64, not the server's x86-64-v3 (.cargo/config.toml):
/// it provisions the secrets before the server starts and diagnoses the box, so it must run on
/// the CPU the server refuses. RUSTFLAGS replaces the configured flags; its own target
/// directory keeps the two builds from invalidating each other.
const BASELINE_RUSTFLAGS: &str = "-C target-cpu=x86-64";

fn build_binaries(sh: &Shell) -> Result<Binaries> {
    let failed = "the release build failed: the image needs both binaries (llm-server must \
                  build with `cargo build --release -p llm-server`)";
    cmd!(sh, "cargo build --release -p llm-server")
        .run()
        .context(failed)?;
    let baseline = target_dir(sh)?.join("baseline");
    cmd!(
        sh,
        "cargo build --release -p appliance --bin appliance --target-dir {baseline}"
    )
    .env("RUSTFLAGS", BASELINE_RUSTFLAGS)
    .run()
    .context(failed)?;
    Ok(Binaries {
        server: target_dir(sh)?.join("release/llm-server"),
        appliance: baseline.join("release/appliance"),
    })
}

fn target_dir(sh: &Shell) -> Result<PathBuf> {
    Ok(match sh.var_os("CARGO_TARGET_DIR") {
        Some(dir) => sh.current_dir().join(dir),
        None => sh.current_dir().join("target"),
    })
}

/// The profile's model from the source its `[model]` names, as `cargo xtask model` fetches it,
/// hashed again against the profile's sha256 (the image is what ships).
fn model(sh: &Shell, profile: &Profile) -> Result<PathBuf> {
    crate::model::ensure_profile(sh, profile, true)
}

/// The server's memory plan of the real model file, and the unit's limits resolved from it.
#[derive(Debug)]
pub struct MemoryPlan {
    /// As `llm-server plan --json` printed it: installed on the box for the doctor.
    pub text: String,
    /// The same, for the manifest.
    pub json: serde_json::Value,
    pub limits: MemoryLimits,
}

/// The server's memory plan of the real model file at the profile's context and slots, from
/// the binary the image installs (the NixOS module runs the same command, modules/plan-args.nix),
/// and the profile's memory policy resolved against it (as `appliance memory` resolves it for
/// the NixOS module); a model that cannot fit stops the build with the planner's table.
fn memory_plan(sh: &Shell, server: &Path, model: &Path, profile: &Profile) -> Result<MemoryPlan> {
    let s = &profile.server;
    let args = plan::args(&model.to_string_lossy(), s.ctx_size, s.parallel);
    let words = &args;
    let out = cmd!(sh, "{server} {words...}")
        .quiet()
        .ignore_status()
        .output()?;
    // 2: the plan does not fit this build machine's own memory, which is not the box's.
    if !matches!(out.status.code(), Some(0 | 2)) {
        bail!(
            "`{} {}` failed ({}): {}",
            server.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    let json = String::from_utf8(out.stdout).context("llm-server plan printed non-UTF-8")?;
    let plan = ServerPlan::parse(&json)?;
    let limits = match profile.memory_limits(&plan) {
        Ok(limits) => limits,
        Err(e) => {
            // The planner's own table beside the rule's message: what each part costs.
            let table_args: Vec<&String> = args.iter().filter(|a| *a != "--json").collect();
            let table = cmd!(sh, "{server} {table_args...}")
                .quiet()
                .ignore_status()
                .read()
                .unwrap_or_default();
            bail!("{e}\n{}", table.trim_end());
        }
    };
    let mib = |b: u64| b.div_ceil(plan::MIB);
    eprintln!(
        "    the server plans {} MiB (weights {}, KV cache {}, scratch {}, vocabulary {}); {limits}",
        mib(plan.total_bytes),
        mib(plan.weights_bytes),
        mib(plan.kv_cache_bytes),
        mib(plan.scratch_bytes),
        mib(plan.vocabulary_bytes),
    );
    Ok(MemoryPlan {
        json: serde_json::from_str(&json)?,
        text: json,
        limits,
    })
}

fn manifest(
    profile: &Profile,
    image: &Path,
    built: &disk::Built,
    binaries: &Binaries,
    packages: &serde_json::Map<String, serde_json::Value>,
    memory_plan: &serde_json::Value,
) -> Result<serde_json::Value> {
    let file = |path: &Path| -> Result<serde_json::Value> {
        Ok(serde_json::json!({
            "bytes": std::fs::metadata(path)?.len(),
            "sha256": crate::util::sha256_file(path)?,
        }))
    };
    Ok(serde_json::json!({
        "profile": {
            "name": profile.machine.name,
            "text": profile.source,
        },
        "image": {
            "file": image.file_name().and_then(|n| n.to_str()),
            "format": "qcow2",
            "virtual_bytes": built.disk_bytes,
            "file_bytes": std::fs::metadata(image)?.len(),
            "sha256": crate::util::sha256_file(image)?,
            "firmware": "UEFI_64",
            "kernel_command_line": built.command_line,
            "partitions": built.partitions,
        },
        "binaries": {
            "llm-server": file(&binaries.server)?,
            "appliance": file(&binaries.appliance)?,
        },
        "model": {
            "file": profile.model.file,
            "bytes": profile.model.size_bytes,
            "sha256": profile.model.sha256,
        },
        // As `llm-server plan --json` printed it on the build machine (its `limits` and `fits`
        // are that machine's).
        "memory_plan": memory_plan,
        "packages": packages,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `llm-server` that records its arguments and prints `plan` with `status`.
    fn planner(dir: &Path, plan: &str, status: i32) -> PathBuf {
        let path = dir.join("llm-server");
        let args = dir.join("args");
        let script = format!(
            "#!/bin/sh\necho \"$@\" > '{}'\ncat <<'EOF'\n{plan}\nEOF\nexit {status}\n",
            args.display()
        );
        test_support::write_executable(&path, &script);
        path
    }

    #[test]
    fn the_plan_step_runs_the_planner_and_holds_the_profile_to_its_plan() {
        let sh = Shell::new().unwrap();
        let dir = std::env::temp_dir().join(format!("xtask-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let profile = Profile::load(&test_support::default_profile()).unwrap();
        let model = dir.join(&profile.model.file);
        let plan = |total: u64| {
            format!(
                r#"{{"model": "{}", "ctx_size": 4096, "parallel": 2, "weights_bytes": 96576768,
                "kv_cache_bytes": 188743680, "scratch_bytes": 56404480,
                "vocabulary_bytes": 19243607, "total_bytes": {total}, "fits": false}}"#,
                model.display()
            )
        };
        // Status 2 (does not fit this machine) is still a plan.
        let server = planner(&dir, &plan(360968535), 2);
        let planned = memory_plan(&sh, &server, &model, &profile).unwrap();
        assert_eq!(planned.json["total_bytes"], 360968535);
        assert_eq!(
            ServerPlan::parse(&planned.text).unwrap().total_bytes,
            360968535
        );
        // The shipped profile's policy gives today's limits for today's model.
        let l = planned.limits;
        assert_eq!(
            (l.min_mib, l.low_mib, l.high_mib, l.max_mib),
            (96, 384, 512, 576)
        );
        let args = std::fs::read_to_string(dir.join("args")).unwrap();
        assert_eq!(
            args.trim_end(),
            format!(
                "plan --json --model {} --ctx-size 4096 --parallel 2",
                model.display()
            )
        );
        // A plan the machine cannot hold stops the build with the rule's message.
        let server = planner(&dir, &plan(900 << 20), 0);
        let e = format!(
            "{:#}",
            memory_plan(&sh, &server, &model, &profile).unwrap_err()
        );
        assert!(
            e.contains("the model does not fit machine.ram_mib = 1024"),
            "{e}"
        );
        // ... followed by the planner's table (asked for without --json; this stand-in prints
        // the same text either way).
        assert!(
            e.contains(&format!("\"total_bytes\": {}", 900 << 20)),
            "{e}"
        );
        let args = std::fs::read_to_string(dir.join("args")).unwrap();
        assert_eq!(
            args.trim_end(),
            format!(
                "plan --model {} --ctx-size 4096 --parallel 2",
                model.display()
            )
        );
        // Any other failure of the planner is an error naming the command.
        let server = planner(&dir, "", 3);
        let e = format!(
            "{:#}",
            memory_plan(&sh, &server, &model, &profile).unwrap_err()
        );
        assert!(e.contains("plan --json --model"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
