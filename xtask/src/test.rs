//! `cargo xtask test`: everything CI checks, in the order that fails fastest on a fresh machine:
//! the default model, the Python packages the tests call, the workspace's tests (release: the
//! golden and load tests run the real model), clippy, rustfmt, and last (it takes longest) the
//! appliance image rebuilt from the current sources and booted by the VM test suite.

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use crate::model;

/// Python packages the tests import: gguf-py (dequantisation reference), numpy (its dependency)
/// and the official OpenAI SDK (the server's client tests).
const PYTHON_PACKAGES: [&str; 3] = ["gguf", "numpy", "openai"];

#[derive(clap::Args)]
pub struct Test {
    /// Skip building the image and the VM test suite (about 15 minutes under TCG): the quick
    /// loop while working on the server. CI never skips it.
    #[arg(long)]
    no_vm: bool,
}

impl Test {
    pub fn run(self, sh: &Shell) -> Result<()> {
        step("the default model");
        let model = model::ensure(sh, false)?;

        step("Python test packages");
        ensure_python_packages(sh)?;

        step("cargo test --workspace --release");
        cmd!(sh, "cargo test --workspace --release")
            .env("LLM_MODEL", &model)
            .run()
            .context("tests failed")?;

        step("cargo clippy");
        cmd!(sh, "cargo clippy --workspace --all-targets -- -D warnings")
            .run()
            .context("clippy found problems")?;

        step("cargo fmt --check");
        cmd!(sh, "cargo fmt --all --check")
            .run()
            .context("some files are not formatted; run `cargo fmt --all`")?;

        if self.no_vm {
            step("all checks passed except the VM suite (--no-vm)");
            return Ok(());
        }
        step("the appliance image and the VM test suite");
        // This same binary's `vm-test`: no second cargo build of xtask.
        let xtask = std::env::current_exe().context("find the xtask binary")?;
        cmd!(sh, "{xtask} vm-test --rebuild --keep-going")
            .run()
            .context("the VM test suite failed")?;

        step("all checks passed");
        Ok(())
    }
}

fn step(what: &str) {
    eprintln!("\n==> {what}");
}

fn ensure_python_packages(sh: &Shell) -> Result<()> {
    let import = format!("import {}", PYTHON_PACKAGES.join(", "));
    let present = cmd!(sh, "python3 -c {import}")
        .quiet()
        .ignore_stderr()
        .run()
        .is_ok();
    if present {
        return Ok(());
    }
    cmd!(sh, "python3 -m pip install --quiet {PYTHON_PACKAGES...}")
        .run()
        .with_context(|| {
            format!(
                "pip could not install {}; on Debian's system Python use a virtual environment \
                 (python3 -m venv ~/.venv && . ~/.venv/bin/activate) or run .ci/run",
                PYTHON_PACKAGES.join(" ")
            )
        })
}
