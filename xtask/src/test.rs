//! `cargo xtask test`: everything CI checks, in the order that fails fastest on a fresh machine:
//! the machine's set-up (Debian packages, the tests' pinned Python environment), the default
//! model and the golden set's real models, the workspace's tests (release: the golden and load
//! tests run the real models), clippy, a bounded fuzz run of the client-facing parsers, rustfmt,
//! and last (it takes longest) the appliance image rebuilt from the current sources and booted
//! by the VM test suite.

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use crate::fuzz;
use crate::model;
use crate::setup::{self, Need};
use crate::util::step;

#[derive(clap::Args)]
pub struct Test {
    /// Skip building the image and the VM test suite (about 15 minutes under TCG): the quick
    /// loop while working on the server. CI never skips it.
    #[arg(long)]
    no_vm: bool,
}

impl Test {
    pub fn run(self, sh: &Shell) -> Result<()> {
        step("Debian packages");
        let needs: &[Need] = if self.no_vm {
            &[Need::Tests]
        } else {
            &[Need::Tests, Need::Image, Need::VmSuite]
        };
        setup::ensure_debian(sh, needs)?;

        step("the tests' Python environment (xtask/python-requirements.txt)");
        let python = setup::python_env(sh)?;
        let path = setup::path_with(&python)?;

        step("the default model and the golden set's real models");
        let model = model::ensure(sh, false)?;
        model::ensure_golden(sh, false)?;

        step("cargo test --workspace --release");
        cmd!(sh, "cargo test --workspace --release")
            .env("LLM_MODEL", &model)
            .env("PATH", &path)
            .run()
            .context("tests failed")?;

        step("cargo clippy");
        cmd!(sh, "cargo clippy --workspace --all-targets -- -D warnings")
            .run()
            .context("clippy found problems")?;

        step("cargo fuzz: gbnf_parse and request_body, a minute each (fuzz/README.md)");
        fuzz::run(sh).context("fuzzing failed")?;

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
