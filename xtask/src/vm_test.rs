//! `cargo xtask vm-test`: boot the appliance image in QEMU and run the VM test suite
//! (`vm-tests/`) against it, building the image first when there is none (or on `--rebuild`).
//!
//! `--model FILE` tests the profile with another model file, such as one `llm-server synth`
//! wrote in the real model's shapes and types (real 1B weights cannot be fetched everywhere):
//! the profile is copied under target/appliance with `model.path` set to a link to the file
//! (named as `model.file`, which the image build's plan check holds the plan to) and with its
//! sha256 and size, and the image is built from that copy whenever it holds another model.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use appliance::Profile;
use xshell::{cmd, Shell};

use crate::setup::Need;

#[derive(clap::Args)]
pub struct VmTest {
    /// The qcow2 to test (default: the one `cargo xtask image` builds for the profile, built
    /// now if missing).
    #[arg(long)]
    image: Option<PathBuf>,
    /// The profile the image was built from (relative to the repository root).
    #[arg(long, default_value = "appliance/profiles/e2-micro.toml")]
    profile: PathBuf,
    /// Build the image with this model file instead of the profile's (e.g. a synthetic one
    /// from `llm-server synth --preset gemma3-1b`). Synthetic weights are recognised by the
    /// name synth gives them and checked without golden text.
    #[arg(long, conflicts_with = "image")]
    model: Option<PathBuf>,
    /// Run the remaining checks after a failure instead of stopping at the first.
    #[arg(long)]
    keep_going: bool,
    /// Run only these checks (comma-separated), after the boots they need.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Build the image even when one exists, so the suite tests the current sources.
    #[arg(long, conflicts_with = "image")]
    rebuild: bool,
    /// Who builds the image when it is built (see `cargo xtask image --builder`).
    #[arg(long, value_enum, default_value_t = crate::image::Builder::Auto)]
    builder: crate::image::Builder,
}

impl VmTest {
    pub fn run(self, sh: &Shell) -> Result<()> {
        // Before the image build, which a misspelt check would otherwise wait for.
        vm_tests::check_names::unknown_checks(&self.only)?;
        // The default profile is named from the repository's root, where the suite runs.
        let mut profile_path = sh.current_dir().join(&self.profile);
        let mut synthetic = false;
        let mut stale = false;
        if let Some(model) = &self.model {
            let model = std::fs::canonicalize(model)
                .with_context(|| format!("no model file at {}", model.display()))?;
            synthetic = is_synthetic(&model)?;
            let derived = sh.current_dir().join("target/appliance");
            sh.create_dir(&derived)?;
            let (path, sha256) = with_model(&profile_path, &model, &derived)?;
            profile_path = path;
            stale = !manifest_has_model(&derived.join("manifest.json"), &sha256);
        }
        let profile_path = &profile_path;
        let image = match self.image {
            // Named from where the user is; the suite runs elsewhere.
            Some(image) => std::fs::canonicalize(&image).with_context(|| {
                format!(
                    "no image at {}: build one with `cargo xtask image` or leave out --image",
                    image.display()
                )
            })?,
            None => {
                let profile = Profile::load(profile_path)?;
                let image = sh
                    .current_dir()
                    .join(format!("target/appliance/{}.qcow2", profile.machine.name));
                if self.rebuild || stale || !image.is_file() {
                    let why = if self.rebuild {
                        "--rebuild"
                    } else if stale {
                        "the last image holds another model"
                    } else {
                        "it is missing"
                    };
                    eprintln!("==> building {} ({why})", image.display());
                    // This same binary's `image` task, so no second cargo build is involved.
                    let xtask = std::env::current_exe().context("find the xtask binary")?;
                    let builder = self.builder.as_arg();
                    cmd!(
                        sh,
                        "{xtask} image --profile {profile_path} --builder {builder}"
                    )
                    .run()
                    .context("building the image for the VM test failed")?;
                }
                image
            }
        };
        crate::setup::ensure_debian(sh, &[Need::VmSuite])?;
        let keep_going = self.keep_going.then_some("--keep-going");
        let synthetic = synthetic.then_some("--synthetic-model");
        let only = (!self.only.is_empty()).then(|| format!("--only={}", self.only.join(",")));
        cmd!(
            sh,
            "cargo run --quiet -p vm-tests -- run --image {image} --profile {profile_path} {keep_going...} {synthetic...} {only...}"
        )
        .run()
        .context("the VM test failed (its output above names the check and shows the guest console)")
    }
}

/// Writes `<dir>/<profile stem>.model.toml`: the profile with `model.path` = a link to `model`
/// named `<dir>/models/<model.file>` (no `url`)
/// and the file's sha256 and size; returns its path and the sha256. Loading it checks the rest.
fn with_model(profile: &Path, model: &Path, dir: &Path) -> Result<(PathBuf, String)> {
    let text =
        std::fs::read_to_string(profile).with_context(|| format!("read {}", profile.display()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("parse {}", profile.display()))?;
    let Some(table) = doc.get_mut("model").and_then(|m| m.as_table_mut()) else {
        bail!("{} has no [model] table", profile.display());
    };
    let sha256 = crate::util::sha256_file(model)?;
    let size = std::fs::metadata(model)?.len();
    // The image build holds the profile to a plan of a file named as `model.file` (the name
    // the box serves it under), so the file is given through a link of that name.
    let file = table
        .get("file")
        .and_then(|f| f.as_str())
        .with_context(|| format!("{} has no model.file", profile.display()))?;
    let link = named_link(model, file, &dir.join("models"))?;
    // The file replaces the profile's source, an archive's member included.
    table.remove("url");
    table.remove("member");
    table["path"] = toml_edit::value(link.to_string_lossy().as_ref());
    table["sha256"] = toml_edit::value(sha256.as_str());
    table["size_bytes"] = toml_edit::value(i64::try_from(size)?);
    let stem = profile
        .file_stem()
        .and_then(|s| s.to_str())
        .context("profile path without a file name")?;
    let path = dir.join(format!("{stem}.model.toml"));
    let header = format!(
        "# Written by `cargo xtask vm-test --model`: {} with model.path = {}.\n",
        profile.display(),
        model.display()
    );
    std::fs::write(&path, header + &doc.to_string())
        .with_context(|| format!("write {}", path.display()))?;
    Profile::load(&path)?;
    Ok((path, sha256))
}

/// A symlink `<dir>/<file>` to `model` (replacing an older one), so the file can be named as the
/// profile names its model whatever the file itself is called.
fn named_link(model: &Path, file: &str, dir: &Path) -> Result<PathBuf> {
    anyhow::ensure!(
        !file.is_empty() && !file.contains('/'),
        "model.file {file:?} is not a file name"
    );
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let link = dir.join(file);
    match std::fs::remove_file(&link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("remove {}", link.display()))
        }
        _ => {}
    }
    std::os::unix::fs::symlink(model, &link)
        .with_context(|| format!("link {} to {}", link.display(), model.display()))?;
    Ok(link)
}

/// Whether the image builder's manifest (of the last image built) records this model.
fn manifest_has_model(manifest: &Path, sha256: &str) -> bool {
    std::fs::read_to_string(manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|m| m["model"]["sha256"] == sha256)
}

/// `llm-server synth` names its files `synthetic <preset> (pseudo-random weights)` in
/// `general.name` (server/src/gguf/synth.rs), which a GGUF keeps among its first keys.
fn is_synthetic(model: &Path) -> Result<bool> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(model)
        .with_context(|| format!("open {}", model.display()))?
        .take(64 * 1024)
        .read_to_end(&mut head)?;
    let marker = b"(pseudo-random weights)";
    Ok(head.windows(marker.len()).any(|w| w == marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derived_profile_points_at_the_file_and_pins_it() {
        let dir = std::env::temp_dir().join(format!("xtask-vm-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("model.gguf");
        std::fs::write(&model, b"GGUF synthetic gemma3-1b (pseudo-random weights)").unwrap();
        let profile = test_support::default_profile();
        let (path, sha256) = with_model(&profile, &model, &dir).unwrap();
        let loaded = Profile::load(&path).unwrap();
        let link = dir.join("models").join(&loaded.model.file);
        assert_eq!(loaded.model.path.as_deref(), link.to_str());
        assert_eq!(
            std::fs::canonicalize(&link).unwrap(),
            model.canonicalize().unwrap()
        );
        assert_eq!(loaded.model.url, None);
        assert_eq!(loaded.model.member, None);
        assert_eq!(loaded.model.sha256, sha256);
        assert_eq!(loaded.model.size_bytes, 48);
        assert!(is_synthetic(&model).unwrap());
        assert!(!is_synthetic(&profile).unwrap());
        let manifest = dir.join("manifest.json");
        std::fs::write(
            &manifest,
            format!(r#"{{"model": {{"sha256": "{sha256}"}}}}"#),
        )
        .unwrap();
        assert!(manifest_has_model(&manifest, &sha256));
        assert!(!manifest_has_model(&manifest, "0"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
