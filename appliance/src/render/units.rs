//! systemd units: the server, the two first-boot jobs that make SSH work, and the memory
//! baseline. Their commands are argument lists (as in modules/profile.nix), written out by
//! [`command_line`].

use crate::paths::{self, SERVER_BINARY};
use crate::profile::Profile;

use super::exec::command_line;
use super::header;

/// `llm-server` exits with this status when the CPU lacks x86-64-v3 (server/src/main.rs):
/// restarting cannot help, so systemd must not loop on it.
const CPU_REFUSED_STATUS: u8 = 3;

/// The arguments of `llm-server serve` (server/src/cli/serve.rs), one word each, as
/// modules/serve-args.nix gives them to the NixOS module. The appliance serves on every
/// address; the nftables allowlist decides who may connect.
pub fn server_args(profile: &Profile) -> Vec<String> {
    let s = &profile.server;
    vec![
        "serve".to_owned(),
        "--model".to_owned(),
        profile.model_path(),
        "--host".to_owned(),
        "0.0.0.0".to_owned(),
        "--port".to_owned(),
        s.api_port.to_string(),
        "--ctx-size".to_owned(),
        s.ctx_size.to_string(),
        "--parallel".to_owned(),
        s.parallel.to_string(),
    ]
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
    let m = &s.memory;
    let watchdog = if s.watchdog_sec == 0 {
        String::new()
    } else {
        format!("WatchdogSec={}\n", s.watchdog_sec)
    };
    let mut command = vec![SERVER_BINARY.to_owned()];
    command.extend(server_args(profile));
    format!(
        "{header}
[Unit]
Description=LLM inference server (OpenAI-compatible API)
After=network.target
# Restart=always means forever: never give up after a burst of failures.
StartLimitIntervalSec=0

[Service]
Type=notify
NotifyAccess=main
ExecStart={command}
Restart=always
RestartSec={restart}
# {CPU_REFUSED_STATUS}: the CPU lacks AVX2/FMA/F16C/BMI2 (x86-64-v3); a restart cannot fix that.
RestartPreventExitStatus={CPU_REFUSED_STATUS}
TimeoutStartSec={start_timeout}
{watchdog}OOMScoreAdjust={oom}

# Sized from the profile's memory plan. The memory-mapped weights are page cache charged to
# this unit, so MemoryMin keeps them resident whatever else runs.
MemoryMin={min}M
MemoryLow={low}M
MemoryHigh={high}M
MemoryMax={max}M

DynamicUser=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
NoNewPrivileges=yes
CapabilityBoundingSet=
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
UMask=0077

[Install]
WantedBy=multi-user.target
",
        header = header(profile, "#"),
        command = command_line(&command),
        restart = s.restart_sec,
        start_timeout = s.start_timeout_sec,
        oom = s.oom_score_adjust,
        min = m.min_mib,
        low = m.low_mib,
        high = m.high_mib,
        max = m.max_mib,
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
{commands}
[Install]
WantedBy=multi-user.target
",
        header = header(profile, "#"),
        commands = ssh_keys_commands(profile)
            .iter()
            .map(|c| format!("ExecStart={}\n", debian_command(c)))
            .collect::<String>(),
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
