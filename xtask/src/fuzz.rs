//! The bounded fuzz run of CI: each cargo-fuzz target of `fuzz/` (see fuzz/README.md) for a
//! fixed time, failing on any crash. cargo-fuzz is installed when missing; `fuzz/` builds on
//! the stable toolchain with `RUSTC_BOOTSTRAP=1` (for the sanitizer flags only).

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use crate::util::workspace_root;

/// The targets, each run for [`SECONDS`]: the GBNF reader and the request body reader, both
/// fed by clients. (`gguf_parse` reads model files, which the operator chooses: run by hand.)
const TARGETS: &[&str] = &["gbnf_parse", "request_body"];

/// Seconds per target: enough for the cheap crashes (a panic, an overflow, a deep recursion)
/// on every commit, without lengthening CI by much; long runs are for `cargo fuzz` by hand.
const SECONDS: u32 = 60;

/// Installs cargo-fuzz if `cargo fuzz` is missing.
pub fn ensure_cargo_fuzz(sh: &Shell) -> Result<()> {
    if cmd!(sh, "cargo fuzz --version")
        .quiet()
        .ignore_stdout()
        .ignore_stderr()
        .run()
        .is_ok()
    {
        return Ok(());
    }
    cmd!(sh, "cargo install cargo-fuzz --locked")
        .run()
        .context("install cargo-fuzz (`cargo install cargo-fuzz --locked`)")
}

/// Builds and runs every target of [`TARGETS`] for [`SECONDS`]; a crash fails with the command
/// that reproduces it.
pub fn run(sh: &Shell) -> Result<()> {
    ensure_cargo_fuzz(sh)?;
    let _dir = sh.push_dir(workspace_root().join("fuzz"));
    let _bootstrap = sh.push_env("RUSTC_BOOTSTRAP", "1");
    let time = format!("-max_total_time={SECONDS}");
    for target in TARGETS {
        // `-a`: debug assertions and overflow checks on; limits as in fuzz/README.md.
        cmd!(
            sh,
            "cargo fuzz run -O -a {target} -- {time} -malloc_limit_mb=64 -rss_limit_mb=512"
        )
        .run()
        .with_context(|| {
            format!(
                "fuzz target {target} crashed: its input is in fuzz/artifacts/{target}/; reproduce with `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -O -a {target} <artifact>`"
            )
        })?;
    }
    Ok(())
}
