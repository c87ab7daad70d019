//! systemd units: the server, and the two first-boot jobs that make SSH work.

use crate::profile::Profile;

use super::{header, SERVER_BINARY};

pub const SSH_KEYS_UNIT: &str = "oci-ssh-keys.service";
pub const SSH_KEYS_PATH: &str = "/etc/systemd/system/oci-ssh-keys.service";
pub const HOST_KEYS_UNIT: &str = "ssh-host-keys.service";
pub const HOST_KEYS_PATH: &str = "/etc/systemd/system/ssh-host-keys.service";
pub const BASELINE_UNIT: &str = "memory-baseline.service";
pub const BASELINE_PATH: &str = "/etc/systemd/system/memory-baseline.service";

/// `llm-server` exits with this status when the CPU lacks x86-64-v3 (server/src/main.rs):
/// restarting cannot help, so systemd must not loop on it.
const CPU_REFUSED_STATUS: u8 = 3;

/// The server's command line.
pub fn server_command(profile: &Profile) -> String {
    let s = &profile.server;
    format!(
        "{SERVER_BINARY} serve --model {} --host 0.0.0.0 --port {} --ctx-size {} --parallel {}",
        profile.model_path(),
        s.api_port,
        s.ctx_size,
        s.parallel
    )
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
        command = server_command(profile),
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
ExecStart=/usr/bin/curl --fail --silent --show-error --retry 10 --retry-delay 3 --retry-all-errors --connect-timeout 5 --max-time 20 -H \"Authorization: Bearer Oracle\" -o /run/oci-ssh-keys/authorized_keys {url}
ExecStart=/usr/bin/ssh-keygen -l -f /run/oci-ssh-keys/authorized_keys
ExecStart=/usr/bin/install -d -m 0700 /root/.ssh
ExecStart=/usr/bin/install -m 0600 /run/oci-ssh-keys/authorized_keys /root/.ssh/authorized_keys

[Install]
WantedBy=multi-user.target
",
        header = header(profile, "#"),
        url = ssh_keys_url(profile),
    )
}

/// Host keys are made on the box's first boot, not baked into the image, so no two instances
/// share them.
pub fn host_keys(profile: &Profile) -> String {
    format!(
        "{}
[Unit]
Description=Generate this machine's SSH host keys on first boot
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=ssh.service
",
        header(profile, "#")
    )
}

/// Prints the memory the OS uses once its own services are up and before the server starts
/// (`free`'s "used" is MemTotal - MemAvailable) to the journal and the serial console, where
/// OCI's console history and the VM tests read it: the headroom the profile plans on.
pub fn memory_baseline(profile: &Profile) -> String {
    format!(
        "{}
[Unit]
Description=Record the memory the OS uses before the LLM server starts
After=ssh.service earlyoom.service nftables.service systemd-networkd.service systemd-logind.service
Before={}

[Service]
Type=oneshot
ExecStart=/usr/bin/free --mebi
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
",
        header(profile, "#"),
        super::SERVER_UNIT
    )
}
