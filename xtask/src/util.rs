use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

pub use test_support::{cache_dir, workspace_root};

/// A file's sha256, hex, read in one pass.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("read {}", path.display()))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// The sha256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Prints a task's step heading.
pub fn step(what: &str) {
    eprintln!("\n==> {what}");
}
