//! The appliance profile (`profiles/*.toml`): every value the appliance is built from, parsed
//! strictly and checked for consistency on load. Each section checks its own keys
//! (`schema.rs`); `check.rs` relates the sections, and resolves the server's limits against the
//! server's own memory plan of the model once one is given ([`Profile::memory_limits`]).

mod check;
mod schema;

use std::path::{Path, PathBuf};

pub use check::RUNTIME_ALLOWANCE_BYTES;
pub use schema::*;

use crate::plan::ServerPlan;

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read the profile {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the profile {path} does not pin its model (model.sha256 and model.size_bytes are \
         missing), so the model cannot be verified: run `cargo xtask model --profile {path} \
         --pin` once where the model's source is reachable; it writes both keys into the \
         profile (which `nix build` reads too). Check the recorded sha256 against the \
         publisher's and commit the profile."
    )]
    Unpinned { path: PathBuf },
    #[error("the profile {path} is not valid: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("the profile {path} does not fit together:\n{}", bullets(.problems))]
    Inconsistent {
        path: PathBuf,
        problems: Vec<String>,
    },
    #[error("the profile `{name}` cannot hold the server's memory plan:\n{}", bullets(.problems))]
    Plan { name: String, problems: Vec<String> },
    #[error(
        "the profile {path} gives [server.memory] as absolute limits ({keys}), which a model file \
         a few MiB larger than planned would outgrow: give margins over the server's plan \
         instead, which the image build resolves against the real file: min_over_weights_mib \
         (MemoryMin = weights + it), low_over_plan_mib (MemoryLow = plan + it), \
         high_over_need_mib (MemoryHigh = plan + {allowance} MiB for the process + it) and \
         max_over_high_mib (MemoryMax = MemoryHigh + it); see docs/memory.md"
    )]
    AbsoluteMemory {
        path: PathBuf,
        keys: String,
        allowance: u64,
    },
}

/// Whether `text` is a profile whose `[model]` has neither `sha256` nor `size_bytes`: committed
/// before anyone could check the file, to be pinned by `cargo xtask model --pin` (which reads
/// the profile through this before it can load). modules/read-profile.nix is the Nix side.
pub fn unpinned(text: &str) -> bool {
    let Ok(doc) = toml::from_str::<toml::Table>(text) else {
        return false; // `Profile::parse` names the syntax error
    };
    doc.get("model")
        .and_then(|m| m.as_table())
        .is_some_and(|m| !m.contains_key("sha256") && !m.contains_key("size_bytes"))
}

/// The keys of the absolute form of `[server.memory]` that `text` still gives, if any.
fn absolute_memory_keys(text: &str) -> Option<String> {
    let doc = toml::from_str::<toml::Table>(text).ok()?;
    let memory = doc.get("server")?.get("memory")?.as_table()?;
    let old: Vec<&str> = ["min_mib", "low_mib", "high_mib", "max_mib"]
        .into_iter()
        .filter(|k| memory.contains_key(*k))
        .collect();
    (!old.is_empty()).then(|| old.join(", "))
}

fn bullets(problems: &[String]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Profile {
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Profile::parse(&text, path)
    }

    /// Parses and checks `text`; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Profile, ProfileError> {
        if unpinned(text) {
            return Err(ProfileError::Unpinned {
                path: path.to_owned(),
            });
        }
        if let Some(keys) = absolute_memory_keys(text) {
            return Err(ProfileError::AbsoluteMemory {
                path: path.to_owned(),
                keys,
                allowance: RUNTIME_ALLOWANCE_BYTES / crate::plan::MIB,
            });
        }
        let mut profile: Profile = toml::from_str(text).map_err(|e| ProfileError::Syntax {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let mut problems = Vec::new();
        profile.section_problems(&mut problems);
        check::across_sections(&profile, &mut problems);
        if !problems.is_empty() {
            return Err(ProfileError::Inconsistent {
                path: path.to_owned(),
                problems,
            });
        }
        profile.source = text.to_owned();
        Ok(profile)
    }

    /// What the profile allows but an administrator must know: an API without keys or TLS
    /// (allowed only when `network.api_cidrs` admits private networks alone).
    pub fn warnings(&self) -> Vec<String> {
        let s = &self.server;
        let mut w = Vec::new();
        if !s.api_keys.enabled() {
            w.push(
                "server.api_keys = \"none\": the API serves anyone network.api_cidrs admits, \
                 without a key"
                    .to_owned(),
            );
        }
        if !s.tls.enabled() {
            w.push(
                "server.tls = \"none\": the API is plain HTTP, keys and prompts in clear text"
                    .to_owned(),
            );
        }
        w
    }

    /// The server unit's memory limits: the profile's policy resolved against `plan`, the
    /// server's plan of this profile's model (`llm-server plan --json` with
    /// [`crate::plan::args`]), or why the model cannot fit. Loading cannot do this: it needs the
    /// model file, which only the image builders have (the box keeps their plan,
    /// [`crate::paths::PLAN`]).
    pub fn memory_limits(&self, plan: &ServerPlan) -> Result<MemoryLimits, ProfileError> {
        check::memory(self, plan).map_err(|problems| ProfileError::Plan {
            name: self.machine.name.clone(),
            problems,
        })
    }
}
