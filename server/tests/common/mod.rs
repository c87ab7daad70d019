//! Paths shared by the integration tests: the golden data and the default model.
#![allow(dead_code)]

use std::path::PathBuf;

/// `$LLM_GOLDEN_DIR`, else `shared/golden` beside the repository (where the team keeps it).
pub fn golden_dir() -> PathBuf {
    let dir = std::env::var_os("LLM_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden"));
    assert!(
        dir.join("README.md").exists(),
        "golden data not found at {}; set LLM_GOLDEN_DIR to the folder holding llama.cpp's reference outputs",
        dir.display()
    );
    dir
}

/// `$LLM_MODEL`, else the cache path `cargo xtask model` fills.
pub fn default_model() -> PathBuf {
    let path = std::env::var_os("LLM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("LLM_APPLIANCE_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
                    PathBuf::from(home).join(".cache/llm-appliance")
                });
            cache.join("models/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        path.exists(),
        "default model not found at {}; run `cargo xtask model` first",
        path.display()
    );
    path
}
