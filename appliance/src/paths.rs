//! Where things are on the box and what its units are called: the one list the renderer, the
//! doctor and the image builders take them from.

/// The profile as the image installs it; `appliance doctor` reads it from there by default.
pub const PROFILE: &str = "/etc/llm-appliance/profile.toml";

/// The server's plan of the model (`llm-server plan --json`) made when the image was built: with
/// the profile, it gives the unit's memory limits (`Profile::memory_limits`), which the doctor
/// checks the box against.
pub const PLAN: &str = "/etc/llm-appliance/plan.json";
/// Those limits as a drop-in of the server's unit, written by `appliance memory` for both
/// builders (the NixOS module links the same file in from a package's
/// `lib/systemd/system/llm-server.service.d/`).
pub const MEMORY_DROPIN: &str = "/etc/systemd/system/llm-server.service.d/memory.conf";
/// The drop-in's path under a package's `lib/systemd/system/`, as NixOS's `systemd.packages`
/// links it into /etc/systemd/system.
pub const MEMORY_DROPIN_IN_PACKAGE: &str = "lib/systemd/system/llm-server.service.d/memory.conf";

/// Where the image keeps the model; the server's `--model` points inside it.
pub const MODEL_DIR: &str = "/var/lib/llm/models";
/// The two binaries the image installs.
pub const SERVER_BINARY: &str = "/usr/local/bin/llm-server";
pub const APPLIANCE_BINARY: &str = "/usr/local/bin/appliance";
/// The server's process name (`/proc/PID/comm`), which earlyoom always avoids.
pub const SERVER_PROCESS: &str = "llm-server";

/// The model file `file` (a bare name, as the profile gives it) on the box.
pub fn model(file: &str) -> String {
    format!("{MODEL_DIR}/{file}")
}

/// The box's secrets, root-only (`StateDirectory=` of the secrets unit, mode 0700): the API keys
/// and the TLS certificate and key the server gets as systemd credentials.
pub const SECRETS_DIR: &str = "/var/lib/llm-secrets";
/// The directory's name under /var/lib, as `StateDirectory=` takes it.
pub const SECRETS_STATE_DIRECTORY: &str = "llm-secrets";
pub const API_KEYS: &str = "/var/lib/llm-secrets/api-keys";
pub const TLS_CERT: &str = "/var/lib/llm-secrets/tls-cert.pem";
pub const TLS_KEY: &str = "/var/lib/llm-secrets/tls-key.pem";
/// Run by Debian's pam_motd at each login: the banner naming the key and the fingerprint.
pub const MOTD_SCRIPT: &str = "/etc/update-motd.d/50-llm-appliance";

/// The memory stack's configuration files.
pub const ZRAM_GENERATOR_CONF: &str = "/etc/systemd/zram-generator.conf";
pub const SYSCTL_CONF: &str = "/etc/sysctl.d/90-llm-appliance.conf";
/// Read by Debian's `earlyoom.service` as `$EARLYOOM_ARGS`.
pub const EARLYOOM_DEFAULTS: &str = "/etc/default/earlyoom";
pub const NFTABLES_CONF: &str = "/etc/nftables.conf";
pub const SSHD_CONF: &str = "/etc/ssh/sshd_config.d/50-llm-appliance.conf";
pub const HOSTNAME: &str = "/etc/hostname";
pub const HOSTS: &str = "/etc/hosts";
pub const NETWORK_CONF: &str = "/etc/systemd/network/50-dhcp.network";
pub const JOURNALD_CONF: &str = "/etc/systemd/journald.conf.d/50-llm-appliance.conf";

/// A unit the appliance renders: its name and, from the same literal, where it is installed.
macro_rules! units {
    ($($(#[$doc:meta])* $name:ident, $path:ident = $unit:literal;)*) => {$(
        $(#[$doc])*
        pub const $name: &str = $unit;
        pub const $path: &str = concat!("/etc/systemd/system/", $unit);
    )*};
}

units! {
    /// The server: ready once the model is loaded, protected in memory, confined.
    SERVER_UNIT, SERVER_UNIT_PATH = "llm-server.service";
    /// Fetches root's SSH keys from OCI's metadata service at every boot.
    SSH_KEYS_UNIT, SSH_KEYS_UNIT_PATH = "oci-ssh-keys.service";
    /// Makes the SSH host keys on first boot.
    HOST_KEYS_UNIT, HOST_KEYS_UNIT_PATH = "ssh-host-keys.service";
    /// Prints the memory the OS uses before the server starts.
    BASELINE_UNIT, BASELINE_UNIT_PATH = "memory-baseline.service";
    /// Takes the API keys and the TLS certificate from the metadata, or makes them.
    SECRETS_UNIT, SECRETS_UNIT_PATH = "llm-secrets.service";
}

/// Debian's names for the packaged units the appliance relies on.
pub const SSH_UNIT: &str = "ssh.service";
pub const EARLYOOM_UNIT: &str = "earlyoom.service";
pub const NFTABLES_UNIT: &str = "nftables.service";
pub const NETWORKD_UNIT: &str = "systemd-networkd.service";

/// Units the image must enable.
pub const UNITS_TO_ENABLE: [&str; 8] = [
    SERVER_UNIT,
    SECRETS_UNIT,
    SSH_KEYS_UNIT,
    HOST_KEYS_UNIT,
    BASELINE_UNIT,
    EARLYOOM_UNIT,
    NFTABLES_UNIT,
    NETWORKD_UNIT,
];

/// Where Debian installs the programs the units run (the NixOS module puts store paths in).
pub fn debian_program(name: &str) -> String {
    format!("/usr/bin/{name}")
}
