use std::path::{Path, PathBuf};

/// The workspace root (xtask lives one level below it).
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// Where downloaded artefacts live: `$LLM_APPLIANCE_CACHE`, else `$XDG_CACHE_HOME/llm-appliance`,
/// else `~/.cache/llm-appliance`. Outside the repository, so clean clones reuse it.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LLM_APPLIANCE_CACHE") {
        return d.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    base.join("llm-appliance")
}
