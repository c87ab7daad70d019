//! `appliance render`: the profile turned into the files the image installs.
//!
//! Every file is a pure function of the profile. The output directory mirrors the root file
//! system (`OUT/etc/nftables.conf` is installed as `/etc/nftables.conf`), so an image builder
//! copies the tree as it is and enables [`UNITS_TO_ENABLE`].

mod memory;
mod nftables;
mod system;
mod units;

use std::io;
use std::path::{Path, PathBuf};

use crate::profile::Profile;

pub use memory::earlyoom_args;

/// Where the image keeps the model; the server's `--model` points inside it.
pub const MODEL_DIR: &str = "/var/lib/llm/models";
/// Where the image installs the two binaries.
pub const SERVER_BINARY: &str = "/usr/local/bin/llm-server";
pub const APPLIANCE_BINARY: &str = "/usr/local/bin/appliance";
/// The server's unit.
pub const SERVER_UNIT: &str = "llm-server.service";
/// Units the image must enable (Debian's names for the packaged ones).
pub const UNITS_TO_ENABLE: [&str; 7] = [
    SERVER_UNIT,
    units::SSH_KEYS_UNIT,
    units::HOST_KEYS_UNIT,
    units::BASELINE_UNIT,
    "earlyoom.service",
    "nftables.service",
    "systemd-networkd.service",
];

/// One rendered file: where it goes on the box, its mode, and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    pub path: &'static str,
    pub mode: u32,
    pub contents: String,
}

impl File {
    fn config(path: &'static str, contents: String) -> File {
        File {
            path,
            mode: 0o644,
            contents,
        }
    }
}

/// Everything the image needs from the profile, in a stable order.
pub fn render(profile: &Profile) -> Vec<File> {
    vec![
        File::config("/etc/llm-appliance/profile.toml", profile.source.clone()),
        File::config(
            "/etc/systemd/zram-generator.conf",
            memory::zram_generator(profile),
        ),
        File::config(
            "/etc/sysctl.d/90-llm-appliance.conf",
            memory::sysctl(profile),
        ),
        File::config("/etc/default/earlyoom", memory::earlyoom_defaults(profile)),
        File {
            path: "/etc/nftables.conf",
            mode: 0o755,
            contents: nftables::ruleset(profile),
        },
        File::config(
            "/etc/systemd/system/llm-server.service",
            units::server(profile),
        ),
        File::config(units::SSH_KEYS_PATH, units::ssh_keys(profile)),
        File::config(units::HOST_KEYS_PATH, units::host_keys(profile)),
        File::config(units::BASELINE_PATH, units::memory_baseline(profile)),
        File::config(
            "/etc/ssh/sshd_config.d/50-llm-appliance.conf",
            system::sshd(profile),
        ),
        File::config("/etc/hostname", format!("{}\n", profile.machine.hostname)),
        File::config("/etc/hosts", system::hosts(profile)),
        File::config(
            "/etc/systemd/network/50-dhcp.network",
            system::network(profile),
        ),
        File::config(
            "/etc/systemd/journald.conf.d/50-llm-appliance.conf",
            system::journald(profile),
        ),
    ]
}

/// Writes `files` under `out`, mirroring their absolute paths; returns the paths written.
pub fn write(files: &[File], out: &Path) -> io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    files
        .iter()
        .map(|f| {
            let dest = out.join(f.path.trim_start_matches('/'));
            if let Some(dir) = dest.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&dest, &f.contents)?;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(f.mode))?;
            Ok(dest)
        })
        .collect()
}

/// The first lines of every rendered file, in the file's comment syntax.
fn header(profile: &Profile, comment: &str) -> String {
    format!(
        "{comment} Rendered by `appliance render` from the profile `{}`.\n\
         {comment} Do not edit: change the profile and render again.\n",
        profile.machine.name
    )
}
