//! `cargo xtask vm-test`: boot the appliance image in QEMU and run the VM test suite
//! (`vm-tests/`) against it, building the image first when there is none (or on `--rebuild`).

use std::path::PathBuf;

use anyhow::{Context, Result};
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
    /// Run the remaining checks after a failure instead of stopping at the first.
    #[arg(long)]
    keep_going: bool,
    /// Build the image even when one exists, so the suite tests the current sources.
    #[arg(long, conflicts_with = "image")]
    rebuild: bool,
    /// Who builds the image when it is built (see `cargo xtask image --builder`).
    #[arg(long, value_enum, default_value_t = crate::image::Builder::Auto)]
    builder: crate::image::Builder,
}

impl VmTest {
    pub fn run(self, sh: &Shell) -> Result<()> {
        // The default profile is named from the repository's root, where the suite runs.
        let profile_path = &sh.current_dir().join(&self.profile);
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
                if self.rebuild || !image.is_file() {
                    let why = if self.rebuild {
                        "--rebuild"
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
        cmd!(
            sh,
            "cargo run --quiet -p vm-tests -- run --image {image} --profile {profile_path} {keep_going...}"
        )
        .run()
        .context("the VM test failed (its output above names the check and shows the guest console)")
    }
}
