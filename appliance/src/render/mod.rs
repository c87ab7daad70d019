//! `appliance render`: the profile turned into the files the image installs.
//!
//! Every file is a pure function of the profile. The output directory mirrors the root file
//! system (`OUT/etc/nftables.conf` is installed as `/etc/nftables.conf`), so an image builder
//! copies the tree as it is and enables [`paths::UNITS_TO_ENABLE`]. Where each file goes is in
//! [`paths`].

mod exec;
mod memory;
mod nftables;
mod system;
mod units;

use std::io;
use std::path::{Path, PathBuf};

use crate::paths;
use crate::profile::{MemoryLimits, Profile};

pub use exec::command_line;
pub use memory::{earlyoom_args, server_limits};
pub use units::{
    credential_args, credentials, memory_baseline_command, metadata_job_confinement,
    secrets_command, server_args, server_ip_deny, ssh_keys_commands, SERVER_HOST,
};

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
        File::config(paths::PROFILE, profile.source.clone()),
        File::config(paths::ZRAM_GENERATOR_CONF, memory::zram_generator(profile)),
        File::config(paths::SYSCTL_CONF, memory::sysctl(profile)),
        File::config(paths::EARLYOOM_DEFAULTS, memory::earlyoom_defaults(profile)),
        File {
            path: paths::NFTABLES_CONF,
            mode: 0o755,
            contents: nftables::ruleset(profile),
        },
        File::config(paths::SERVER_UNIT_PATH, units::server(profile)),
        File::config(paths::SSH_KEYS_UNIT_PATH, units::ssh_keys(profile)),
        File::config(paths::SECRETS_UNIT_PATH, units::secrets(profile)),
        File {
            path: paths::MOTD_SCRIPT,
            mode: 0o755,
            contents: units::motd_script(profile),
        },
        File::config(paths::HOST_KEYS_UNIT_PATH, units::host_keys(profile)),
        File::config(paths::BASELINE_UNIT_PATH, units::memory_baseline(profile)),
        File::config(paths::SSHD_CONF, system::sshd(profile)),
        File::config(paths::HOSTNAME, format!("{}\n", profile.machine.hostname)),
        File::config(paths::HOSTS, system::hosts(profile)),
        File::config(paths::NETWORK_CONF, system::network(profile)),
        File::config(paths::JOURNALD_CONF, system::journald(profile)),
    ]
}

/// What the image needs from the server's plan of the model: the plan itself (`plan_json`, as
/// `llm-server plan --json` printed it), which the doctor reads, and the server unit's memory
/// limits resolved from it (`limits`, from [`Profile::memory_limits`]).
pub fn planned(profile: &Profile, plan_json: &str, limits: &MemoryLimits) -> Vec<File> {
    vec![
        File::config(paths::PLAN, plan_json.to_owned()),
        File::config(paths::MEMORY_DROPIN, memory::server_limits(profile, limits)),
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
