//! systemd units: the server, the first-boot jobs that make SSH and the API's secrets work,
//! and the memory baseline. Their commands are argument lists (as in modules/profile.nix),
//! written out by [`command_line`].

use crate::paths::{self, APPLIANCE_BINARY, SERVER_BINARY};
use crate::profile::Profile;

use super::exec::command_line;
use super::header;

/// `llm-server`'s exit statuses that a restart cannot fix: a copy of its `exit::Status::NO_RESTART`
/// (server/src/exit.rs; the on-box `appliance` does not link the server), which
/// `server_plan::the_unit_does_not_restart_on_the_servers_refusals` holds to it.
const REFUSAL_STATUSES: &str = "1 2 3";

/// The systemd credentials the server gets (`LoadCredential=NAME:FILE`) and the flag naming
/// each, for the secrets the profile turns on.
pub fn credentials(profile: &Profile) -> Vec<(&'static str, &'static str, &'static str)> {
    let s = &profile.server;
    let mut c = Vec::new();
    if s.api_keys.enabled() {
        c.push(("api-keys", paths::API_KEYS, "--api-key-file"));
    }
    if s.tls.enabled() {
        c.push(("tls-cert", paths::TLS_CERT, "--tls-cert"));
        c.push(("tls-key", paths::TLS_KEY, "--tls-key"));
    }
    c
}

/// The flags that name the credentials, with systemd's `%d` (the credentials directory), which
/// must reach systemd unescaped: appended to the escaped command as they are.
pub fn credential_args(profile: &Profile) -> Vec<String> {
    credentials(profile)
        .into_iter()
        .flat_map(|(name, _, flag)| [flag.to_owned(), format!("%d/{name}")])
        .collect()
}

/// Where the appliance's server listens: every address of both families. On Linux a socket on
/// `::` also takes IPv4 connections (as v4-mapped addresses, which the server counts per IPv4
/// address) unless `net.ipv6.bindv6only` is set, which neither image does; so the API rule's
/// `::/0` is served, not only promised. The nftables allowlist decides who may connect.
pub const SERVER_HOST: &str = "::";

/// Where the server keeps its slots' caches across restarts (`--slot-save-path`), inside the
/// unit's `StateDirectory=`.
pub const SLOT_SAVE_PATH: &str = "/var/lib/llm-server/slots";

/// Seconds the server waits at start for memory that other processes hold (`--wait-for-memory`)
/// before it exits with a status the unit restarts: a restart while a hog runs must not leave
/// the box without its server, and one wait per two minutes keeps the journal short.
pub const MEMORY_WAIT_SEC: u32 = 120;

/// The arguments of `llm-server serve` (server/src/cli/serve.rs), one word each, as
/// modules/serve-args.nix gives them to the NixOS module; the credentials' flags follow them
/// ([`credential_args`]).
pub fn server_args(profile: &Profile) -> Vec<String> {
    let s = &profile.server;
    let l = &s.limits;
    let mut args = vec![
        "serve".to_owned(),
        "--model".to_owned(),
        profile.model_path(),
        "--host".to_owned(),
        SERVER_HOST.to_owned(),
        "--port".to_owned(),
        s.api_port.to_string(),
        "--ctx-size".to_owned(),
        s.ctx_size.to_string(),
        "--parallel".to_owned(),
        s.parallel.to_string(),
        "--slot-save-path".to_owned(),
        SLOT_SAVE_PATH.to_owned(),
        "--wait-for-memory".to_owned(),
        MEMORY_WAIT_SEC.to_string(),
    ];
    for (flag, value) in [
        ("--rate-limit-key", l.rate_per_key_per_min),
        ("--rate-limit-ip", l.rate_per_ip_per_min),
        ("--rate-burst", l.burst),
        ("--max-connections", l.max_connections),
        ("--header-timeout", l.header_timeout_sec),
        ("--body-timeout", l.body_timeout_sec),
        ("--default-max-tokens", l.default_max_tokens),
        ("--engine-stall-timeout", l.engine_stall_sec),
        ("--max-connections-per-ip", l.max_connections_per_ip),
        ("--idle-timeout", l.idle_timeout_sec),
        ("--write-timeout", l.write_timeout_sec),
        ("--max-connection-age", l.max_connection_age_sec),
        ("--max-grammar-bytes", l.max_grammar_bytes),
        ("--max-tokenize-bytes", l.max_tokenize_bytes),
        ("--grammar-timeout", l.grammar_timeout_sec),
        ("--grammar-compiles", l.grammar_compiles),
    ] {
        args.extend([flag.to_owned(), value.to_string()]);
    }
    for origin in &l.cors_origins {
        args.extend(["--cors-origin".to_owned(), origin.clone()]);
    }
    args
}

/// A command given by program name, with Debian's path for the program.
fn debian_command(words: &[String]) -> String {
    let mut words = words.to_vec();
    words[0] = paths::debian_program(&words[0]);
    command_line(&words)
}

/// `llm-server.service`: ready once the model is loaded, always restarted, protected in memory,
/// and confined. The confinement leaves /proc/meminfo and the unit's own cgroup files readable
/// (no `ProcSubset=pid`; `ProtectControlGroups` is read-only, not hidden): the server sizes
/// itself against them.
pub fn server(profile: &Profile) -> String {
    let s = &profile.server;
    let watchdog = if s.watchdog_sec == 0 {
        String::new()
    } else {
        format!("WatchdogSec={}\n", s.watchdog_sec)
    };
    let mut command = vec![SERVER_BINARY.to_owned()];
    command.extend(server_args(profile));
    let mut command = command_line(&command);
    for arg in credential_args(profile) {
        command.push(' ');
        command.push_str(&arg);
    }
    let credentials: String = credentials(profile)
        .into_iter()
        .map(|(name, file, _)| format!("LoadCredential={name}:{file}\n"))
        .collect();
    let warnings: String = profile
        .warnings()
        .iter()
        .map(|w| format!("# WARNING: {w}\n"))
        .collect();
    format!(
        "{header}{warnings}
[Unit]
Description=LLM inference server (OpenAI-compatible API)
After=network.target {secrets}
# The API keys and the certificate must exist before the server reads them.
Requires={secrets}
# Restart=always means forever: never give up after a burst of failures.
StartLimitIntervalSec=0

[Service]
Type=notify
NotifyAccess=main
ExecStart={command}
# Root-only files under {secrets_dir}, copied by systemd for the unit's dynamic user.
{credentials}Restart=always
RestartSec={restart}
# 1: a bad model, option, key or certificate file; 2: the memory plan does not fit; 3: the CPU
# lacks x86-64-v3. A restart cannot fix these; the server's last journal line says which.
RestartPreventExitStatus={REFUSAL_STATUSES}
TimeoutStartSec={start_timeout}
{watchdog}OOMScoreAdjust={oom}
# MemoryMin/Low/High/Max: in {dropin}, resolved from the profile's policy against the
# server's plan of the model when the image was built.

{confinement}
[Install]
WantedBy=multi-user.target
",
        header = header(profile, "#"),
        secrets = paths::SECRETS_UNIT,
        secrets_dir = paths::SECRETS_DIR,
        restart = s.restart_sec,
        start_timeout = s.start_timeout_sec,
        oom = s.oom_score_adjust,
        dropin = paths::MEMORY_DROPIN,
        confinement = settings(&server_confinement(profile)),
    )
}

/// The metadata URL of the SSH keys given at launch (IMDS v2).
pub fn ssh_keys_url(profile: &Profile) -> String {
    format!(
        "http://{}/opc/v2/instance/metadata/ssh_authorized_keys",
        profile.oci.metadata_address
    )
}

/// The key fetcher's commands by program name: fetch into the private runtime directory, parse,
/// install.
pub fn ssh_keys_commands(profile: &Profile) -> Vec<Vec<String>> {
    let fetched = "/run/oci-ssh-keys/authorized_keys";
    let words = |ws: &[&str]| ws.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let url = ssh_keys_url(profile);
    vec![
        words(&[
            "curl",
            "--fail",
            "--silent",
            "--show-error",
            "--retry",
            "10",
            "--retry-delay",
            "3",
            "--retry-all-errors",
            "--connect-timeout",
            "5",
            "--max-time",
            "20",
            "-H",
            "Authorization: Bearer Oracle",
            "-o",
            fetched,
            &url,
        ]),
        words(&["ssh-keygen", "-l", "-f", fetched]),
        words(&["install", "-d", "-m", "0700", "/root/.ssh"]),
        words(&[
            "install",
            "-m",
            "0600",
            fetched,
            "/root/.ssh/authorized_keys",
        ]),
    ]
}

/// Fetches root's SSH keys from OCI's metadata service at every boot. The keys land in a
/// private runtime directory first and replace authorized_keys only once ssh-keygen has parsed
/// them, so an error page or an unreachable service never locks the owner out. sshd reads
/// authorized_keys at each login, so it need not wait for this (and its retries).
pub fn ssh_keys(profile: &Profile) -> String {
    format!(
        "{header}
[Unit]
Description=Fetch root's SSH keys from the OCI instance metadata service
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
RuntimeDirectory=oci-ssh-keys
RuntimeDirectoryMode=0700
{commands}# It writes root's keys and nothing else.
ReadWritePaths=/root
{confinement}
[Install]
WantedBy=multi-user.target
",
        header = header(profile, "#"),
        commands = ssh_keys_commands(profile)
            .iter()
            .map(|c| format!("ExecStart={}\n", debian_command(c)))
            .collect::<String>(),
        confinement = settings(&metadata_job_confinement(profile)),
    )
}

/// `KEY=VALUE` lines.
fn settings(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// What every unit of the appliance's own is denied: capabilities, privilege changes, writes
/// outside its own directories, kernel knobs, namespaces, W^X violations, exotic syscalls. The
/// units add what differs; modules/profile.nix keeps the same three lists (`baseConfinement`,
/// `serverConfinement`, `metadataJobConfinement`; the render tests hold them equal).
const BASE_CONFINEMENT: [(&str, &str); 21] = [
    ("ProtectSystem", "strict"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("NoNewPrivileges", "yes"),
    ("CapabilityBoundingSet", ""),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("SystemCallArchitectures", "native"),
    ("SystemCallFilter", "@system-service"),
    ("SystemCallErrorNumber", "EPERM"),
    ("UMask", "0077"),
];

/// The base list and then `extra`.
fn confinement_with(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    BASE_CONFINEMENT
        .iter()
        .map(|&(k, v)| (k, v.to_owned()))
        .chain(extra.iter().cloned())
        .collect()
}

/// The server's: an unprivileged dynamic user with no home, sockets for its clients and for
/// sd_notify, no way to the metadata service ([`server_ip_deny`]), and a state directory of its
/// own for the slots' caches ([`SLOT_SAVE_PATH`]).
fn server_confinement(profile: &Profile) -> Vec<(&'static str, String)> {
    confinement_with(&[
        ("DynamicUser", "yes".into()),
        ("StateDirectory", "llm-server".into()),
        ("ProtectHome", "yes".into()),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX".into()),
        ("IPAddressDeny", server_ip_deny(profile).join(" ")),
    ])
}

/// What the server may not talk to (`IPAddressDeny=`, enforced by systemd's cgroup BPF filter
/// for every process of the unit): the metadata service, which hands out the box's API keys and
/// TLS key to whoever asks from the box, so a server tricked into a request (or compromised)
/// cannot fetch them. Its address alone, not all of link-local: the filter drops packets in both
/// directions, so denying a network also silences every client in it, and a client may well
/// come from link-local (QEMU's user network in the VM suite is 169.254.0.0/16).
pub fn server_ip_deny(profile: &Profile) -> Vec<String> {
    let metadata = profile.oci.metadata_address;
    let bits = if metadata.is_ipv4() { 32 } else { 128 };
    vec![format!("{metadata}/{bits}")]
}

/// The confinement of the first-boot jobs that talk to the metadata service
/// (`oci-ssh-keys.service`, `llm-secrets.service`): root, since they write root's files, but
/// with no capabilities, nothing writable beyond their own directories, and no address but the
/// metadata service's.
pub fn metadata_job_confinement(profile: &Profile) -> Vec<(&'static str, String)> {
    confinement_with(&[
        ("PrivateMounts", "yes".into()),
        ("ProcSubset", "pid".into()),
        ("RestrictAddressFamilies", "AF_INET AF_INET6".into()),
        ("IPAddressDeny", "any".into()),
        (
            "IPAddressAllow",
            format!("{}/32", profile.oci.metadata_address),
        ),
    ])
}

/// `appliance secrets`' command.
pub fn secrets_command() -> Vec<String> {
    vec![
        APPLIANCE_BINARY.to_owned(),
        "secrets".to_owned(),
        "--profile".to_owned(),
        paths::PROFILE.to_owned(),
    ]
}

/// Provisions the API keys and the TLS certificate before the server starts, at every boot:
/// keys and certificate from the metadata when the launch gives them and the profile allows it,
/// otherwise made on the first boot and kept (`appliance secrets`). A bad value in the metadata
/// fails the unit, and so the server, with the reason in `journalctl -u llm-secrets`.
pub fn secrets(profile: &Profile) -> String {
    format!(
        "{header}
[Unit]
Description=Provision the LLM API's keys and TLS certificate
Wants=network-online.target
After=network-online.target
Before={server}

[Service]
Type=oneshot
RemainAfterExit=yes
StateDirectory={state}
StateDirectoryMode=0700
ExecStart={command}
# Also on the serial console (OCI's console history): where the key came from and the
# certificate's fingerprint, never the key itself.
StandardOutput=journal+console
ProtectHome=yes
{confinement}
[Install]
WantedBy=multi-user.target
",
        header = header(profile, "#"),
        server = paths::SERVER_UNIT,
        state = paths::SECRETS_STATE_DIRECTORY,
        command = command_line(&secrets_command()),
        confinement = settings(&metadata_job_confinement(profile)),
    )
}

/// The login banner, run by pam_motd (Debian's update-motd.d) at each login.
pub fn motd_script(profile: &Profile) -> String {
    format!(
        "#!/bin/sh\n{header}exec {appliance} banner\n",
        header = header(profile, "#"),
        appliance = APPLIANCE_BINARY,
    )
}

/// Host keys are made on the box's first boot, not baked into the image, so no two instances
/// share them.
pub fn host_keys(profile: &Profile) -> String {
    format!(
        "{header}
[Unit]
Description=Generate this machine's SSH host keys on first boot
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
Before={ssh}

[Service]
Type=oneshot
ExecStart={command}

[Install]
WantedBy={ssh}
",
        header = header(profile, "#"),
        ssh = paths::SSH_UNIT,
        command = debian_command(&["ssh-keygen".to_owned(), "-A".to_owned()]),
    )
}

/// The memory baseline's command by program name.
pub fn memory_baseline_command() -> Vec<String> {
    vec!["free".to_owned(), "--mebi".to_owned()]
}

/// Prints the memory the OS uses once its own services are up and before the server starts
/// (`free`'s "used" is MemTotal - MemAvailable) to the journal and the serial console, where
/// OCI's console history and the VM tests read it: the headroom the profile plans on.
pub fn memory_baseline(profile: &Profile) -> String {
    format!(
        "{header}
[Unit]
Description=Record the memory the OS uses before the LLM server starts
After={ssh} {earlyoom} {nftables} {networkd} systemd-logind.service
Before={server}

[Service]
Type=oneshot
ExecStart={command}
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
",
        header = header(profile, "#"),
        ssh = paths::SSH_UNIT,
        earlyoom = paths::EARLYOOM_UNIT,
        nftables = paths::NFTABLES_UNIT,
        networkd = paths::NETWORKD_UNIT,
        server = paths::SERVER_UNIT,
        command = debian_command(&memory_baseline_command()),
    )
}
