//! The files rendered from the shipped profile: exact text where it is short, the lines that
//! matter where it is long, and the real tools (`nft --check`, `systemd-analyze verify`) where
//! they are installed.

use std::path::Path;
use std::process::Command;

use crate::common::exec_words;
use appliance::paths;
use appliance::profile::Profile;
use appliance::render::{self, File};

fn e2_micro() -> Profile {
    Profile::load(&test_support::default_profile()).unwrap()
}

fn rendered(path: &str) -> File {
    rendered_from(&e2_micro(), path)
}

fn rendered_from(profile: &Profile, path: &str) -> File {
    render::render(profile)
        .into_iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} is not rendered"))
}

const HEADER: &str = "# Rendered by `appliance render` from the profile `e2-micro`.\n\
                      # Do not edit: change the profile and render again.\n";

#[test]
fn zram_generator_conf() {
    assert_eq!(
        rendered("/etc/systemd/zram-generator.conf").contents,
        format!(
            "{HEADER}\n[zram0]\nzram-size = min(ram * 50 / 100, 384)\n\
             compression-algorithm = zstd\nswap-priority = 100\n"
        )
    );
}

#[test]
fn sysctl_conf() {
    assert_eq!(
        rendered("/etc/sysctl.d/90-llm-appliance.conf").contents,
        format!(
            "{HEADER}\nkernel.panic = 10\nvm.compaction_proactiveness = 0\nvm.max_map_count = 262144\n\
             vm.min_free_kbytes = 16384\n\
             vm.overcommit_memory = 0\n\
             vm.page-cluster = 0\nvm.swappiness = 10\nvm.vfs_cache_pressure = 50\n"
        )
    );
}

#[test]
fn earlyoom_defaults() {
    assert_eq!(
        rendered("/etc/default/earlyoom").contents,
        format!(
            "{HEADER}\nEARLYOOM_ARGS='-m 42,36 -s 80,40 \
             --avoid ^(llm-server|sshd|systemd|systemd-journal|systemd-logind|systemd-network|systemd-udevd)$ \
             --prefer ^(apt|apt-get|dpkg|python3|perl|cc1|rustc|cargo)$'\n"
        )
    );
}

#[test]
fn sshd_hostname_and_hosts() {
    assert_eq!(
        rendered("/etc/ssh/sshd_config.d/50-llm-appliance.conf").contents,
        format!(
            "{HEADER}\nPort 22\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n"
        )
    );
    assert_eq!(rendered("/etc/hostname").contents, "llm-appliance\n");
    assert!(rendered("/etc/hosts")
        .contents
        .contains("\n127.0.1.1\tllm-appliance\n"));
}

/// Asserts every line of `lines` appears, whole, in `text`.
fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l.trim() == *line),
            "missing line `{line}` in:\n{text}"
        );
    }
}

/// The memory limits depend on the model file, so they are not in the unit but in its drop-in,
/// resolved from the plan the image builder made; the plan goes to the box for the doctor.
#[test]
fn the_memory_limits_are_a_drop_in_resolved_from_the_plan() {
    let unit = rendered("/etc/systemd/system/llm-server.service").contents;
    for limit in ["MemoryMin=", "MemoryLow=", "MemoryHigh=", "MemoryMax="] {
        assert!(!unit.lines().any(|l| l.starts_with(limit)), "{unit}");
    }
    let profile = Profile::load(&test_support::default_profile()).unwrap();
    let plan_json = format!(
        r#"{{"model": "/m/{}", "ctx_size": 4096, "parallel": 2, "weights_bytes": 96576768,
        "kv_cache_bytes": 188743680, "scratch_bytes": 56404480, "vocabulary_bytes": 19243607,
        "total_bytes": 360968535}}"#,
        profile.model.file
    );
    let plan = appliance::plan::ServerPlan::parse(&plan_json).unwrap();
    let limits = profile.memory_limits(&plan).unwrap();
    let files = render::planned(&profile, &plan_json, &limits);
    let paths: Vec<&str> = files.iter().map(|f| f.path).collect();
    assert_eq!(
        paths,
        [
            "/etc/llm-appliance/plan.json",
            "/etc/systemd/system/llm-server.service.d/memory.conf"
        ]
    );
    assert_eq!(files[0].contents, plan_json);
    let dropin = &files[1].contents;
    assert!(dropin.starts_with("# Rendered by `appliance memory` from the profile `e2-micro`"));
    assert!(
        dropin.ends_with(
            "\n[Service]\nMemoryMin=96M\nMemoryLow=384M\nMemoryHigh=512M\nMemoryMax=576M\n"
        ),
        "{dropin}"
    );
}

#[test]
fn server_unit() {
    let unit = rendered("/etc/systemd/system/llm-server.service").contents;
    assert_lines(
        &unit,
        &[
            "Type=notify",
            "NotifyAccess=main",
            "ExecStart=/usr/local/bin/llm-server serve --model /var/lib/llm/models/SmolLM2-135M-Instruct.Q4_1.gguf --host :: --port 8080 --ctx-size 4096 --parallel 2 \
             --slot-save-path /var/lib/llm-server/slots --wait-for-memory 120 --rate-limit-key 60 --rate-limit-ip 120 --rate-burst 10 --max-connections 64 \
             --header-timeout 10 --body-timeout 30 --default-max-tokens 256 --engine-stall-timeout 300 \
             --max-connections-per-ip 8 --idle-timeout 30 --write-timeout 30 --max-connection-age 900 \
             --max-grammar-bytes 65536 --max-tokenize-bytes 262144 --grammar-timeout 10 --grammar-compiles 1 \
             --api-key-file %d/api-keys --tls-cert %d/tls-cert --tls-key %d/tls-key",
            "LoadCredential=api-keys:/var/lib/llm-secrets/api-keys",
            "LoadCredential=tls-cert:/var/lib/llm-secrets/tls-cert.pem",
            "LoadCredential=tls-key:/var/lib/llm-secrets/tls-key.pem",
            "Requires=llm-secrets.service",
            "After=network.target llm-secrets.service",
            "Restart=always",
            "RestartPreventExitStatus=1 2 3",
            "StartLimitIntervalSec=0",
            "TimeoutStartSec=600",
            "WatchdogSec=120",
            "OOMScoreAdjust=-900",
            "DynamicUser=yes",
            "StateDirectory=llm-server",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "NoNewPrivileges=yes",
            "ProtectControlGroups=yes",
            // The metadata service hands out the box's secrets: not to the server.
            "IPAddressDeny=169.254.169.254/32",
            "WantedBy=multi-user.target",
        ],
    );
    assert!(!unit.contains("IPAddressAllow="));
    // Either would hide /proc/meminfo or the cgroup files the server sizes itself against.
    assert!(!unit.contains("ProcSubset="));
    assert!(!unit.contains("InaccessiblePaths="));
    assert!(!unit.contains("WARNING"));
}

/// A profile serving private networks only, without keys or TLS, as the loader allows.
fn private_open() -> Profile {
    let text = include_str!("../../profiles/e2-micro.toml")
        .replace(
            r#"api_cidrs = ["0.0.0.0/0", "::/0"]"#,
            r#"api_cidrs = ["10.0.0.0/16"]"#,
        )
        .replace(r#"api_keys = "metadata""#, r#"api_keys = "none""#)
        .replace(r#"tls = "metadata""#, r#"tls = "none""#)
        .replace(
            "cors_origins = []",
            r#"cors_origins = ["https://a.example", "http://b.example:8000"]"#,
        );
    Profile::parse(&text, Path::new("private.toml")).unwrap()
}

#[test]
fn without_keys_or_tls_the_unit_loads_no_credential_and_warns() {
    let p = private_open();
    let unit = rendered_from(&p, "/etc/systemd/system/llm-server.service").contents;
    assert!(!unit.contains("LoadCredential"), "{unit}");
    assert!(!unit.contains("%d"), "{unit}");
    assert!(
        unit.contains("# WARNING: server.api_keys = \"none\""),
        "{unit}"
    );
    assert!(unit.contains("# WARNING: server.tls = \"none\""), "{unit}");
    let args = render::server_args(&p);
    let tail: Vec<&str> = args
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail,
        [
            "--cors-origin",
            "https://a.example",
            "--cors-origin",
            "http://b.example:8000"
        ]
    );
    assert_eq!(p.warnings().len(), 2);
}

#[test]
fn secrets_unit_runs_before_the_server_and_reaches_only_the_metadata_service() {
    let unit = rendered("/etc/systemd/system/llm-secrets.service").contents;
    assert_lines(
        &unit,
        &[
            "Before=llm-server.service",
            "After=network-online.target",
            "Type=oneshot",
            "RemainAfterExit=yes",
            "StateDirectory=llm-secrets",
            "StateDirectoryMode=0700",
            "ExecStart=/usr/local/bin/appliance secrets --profile /etc/llm-appliance/profile.toml",
            "IPAddressAllow=169.254.169.254/32",
            "IPAddressDeny=any",
            "CapabilityBoundingSet=",
            "WantedBy=multi-user.target",
        ],
    );
    let keys = rendered("/etc/systemd/system/oci-ssh-keys.service").contents;
    assert_lines(
        &keys,
        &[
            "IPAddressAllow=169.254.169.254/32",
            "IPAddressDeny=any",
            "ReadWritePaths=/root",
        ],
    );
    let motd = rendered(paths::MOTD_SCRIPT);
    assert_eq!(motd.mode, 0o755);
    assert!(motd.contents.starts_with("#!/bin/sh\n"));
    assert!(motd
        .contents
        .ends_with("exec /usr/local/bin/appliance banner\n"));
}

/// The exposure `systemd-analyze security --offline=true` gives each unit file, 0.0 (confined)
/// to 10.0 (unprotected).
fn exposure(dir: &Path, unit: &str) -> (f64, String) {
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(unit)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let level = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for ").nth(1))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no exposure level for {unit}:\n{text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (level, text)
}

/// The server and the jobs that talk to the metadata service are confined to an exposure of at
/// most 2.0 ("OK"); the check is real: the server without its confinement scores far worse.
#[test]
fn units_are_confined_as_systemd_analyze_security_measures() {
    assert!(
        tool("systemd-analyze"),
        "systemd-analyze is missing: apt-get install systemd"
    );
    let dir = tempfile::tempdir().unwrap();
    render::write(&render::render(&e2_micro()), dir.path()).unwrap();
    let units = dir.path().join("etc/systemd/system");
    for unit in [
        paths::SERVER_UNIT,
        paths::SECRETS_UNIT,
        paths::SSH_KEYS_UNIT,
    ] {
        let (level, text) = exposure(&units, unit);
        assert!(level <= 2.0, "{unit}: exposure {level} > 2.0:\n{text}");
        eprintln!("{unit}: exposure {level}");
    }
    let server = units.join(paths::SERVER_UNIT);
    let text = std::fs::read_to_string(&server).unwrap();
    let bare: String = text
        .lines()
        .filter(|l| {
            !l.starts_with("Protect") && !l.starts_with("Restrict") && !l.starts_with("DynamicUser")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&server, bare).unwrap();
    let (level, _) = exposure(&units, paths::SERVER_UNIT);
    assert!(level > 4.0, "unconfined server scored {level}");
}

/// A profile whose model's file name systemd would split or expand if written bare.
fn awkward_model_name() -> Profile {
    let mut p = e2_micro();
    p.model.file = "my \"model\" 100% $HOME\\x.gguf".into();
    p
}

fn exec_start(unit: &str) -> Vec<Vec<String>> {
    unit.lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .map(exec_words)
        .collect()
}

#[test]
fn exec_start_is_the_server_argument_list_escaped() {
    for profile in [e2_micro(), awkward_model_name()] {
        let unit = rendered_from(&profile, "/etc/systemd/system/llm-server.service").contents;
        let mut want = vec![paths::SERVER_BINARY.to_owned()];
        want.extend(render::server_args(&profile));
        want.extend(render::credential_args(&profile));
        assert_eq!(exec_start(&unit), [want], "{unit}");
    }
    assert_eq!(
        render::server_args(&awkward_model_name())[2],
        "/var/lib/llm/models/my \"model\" 100% $HOME\\x.gguf"
    );
}

#[test]
fn command_lines_split_back_into_their_words() {
    let words = [
        "/usr/bin/x",
        "plain",
        "two words",
        "",
        ";",
        "a;b",
        "%n",
        "100%",
        "$HOME",
        "${X}",
        "say \"hi\"",
        "it's",
        "back\\slash",
        "tab\tnew\nline",
        "bell\u{7}",
        "ünïcode",
    ];
    assert_eq!(exec_words(&render::command_line(&words)), words);
}

#[test]
fn ssh_key_and_baseline_commands_are_their_argument_lists() {
    let p = e2_micro();
    let keys = exec_start(&rendered("/etc/systemd/system/oci-ssh-keys.service").contents);
    let with_paths: Vec<Vec<String>> = render::ssh_keys_commands(&p)
        .into_iter()
        .map(|mut c| {
            c[0] = format!("/usr/bin/{}", c[0]);
            c
        })
        .collect();
    assert_eq!(keys, with_paths);
    let baseline = exec_start(&rendered("/etc/systemd/system/memory-baseline.service").contents);
    assert_eq!(baseline, [["/usr/bin/free", "--mebi"]]);
    assert_eq!(render::memory_baseline_command(), ["free", "--mebi"]);
}

#[test]
fn ssh_key_units() {
    let keys = rendered("/etc/systemd/system/oci-ssh-keys.service").contents;
    assert_lines(
        &keys,
        &[
            "After=network-online.target",
            "Type=oneshot",
            "ExecStart=/usr/bin/curl --fail --silent --show-error --retry 10 --retry-delay 3 --retry-all-errors --connect-timeout 5 --max-time 20 -H \"Authorization: Bearer Oracle\" -o /run/oci-ssh-keys/authorized_keys http://169.254.169.254/opc/v2/instance/metadata/ssh_authorized_keys",
            "ExecStart=/usr/bin/ssh-keygen -l -f /run/oci-ssh-keys/authorized_keys",
            "ExecStart=/usr/bin/install -m 0600 /run/oci-ssh-keys/authorized_keys /root/.ssh/authorized_keys",
        ],
    );
    let host_keys = rendered("/etc/systemd/system/ssh-host-keys.service").contents;
    assert_lines(
        &host_keys,
        &[
            "ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key",
            "ExecStart=/usr/bin/ssh-keygen -A",
            "WantedBy=ssh.service",
        ],
    );
}

#[test]
fn memory_baseline_runs_before_the_server() {
    let unit = rendered("/etc/systemd/system/memory-baseline.service").contents;
    assert_lines(
        &unit,
        &[
            "Before=llm-server.service",
            "ExecStart=/usr/bin/free --mebi",
            "StandardOutput=journal+console",
        ],
    );
}

#[test]
fn nftables_ruleset_lines() {
    let rules = rendered("/etc/nftables.conf");
    assert_eq!(rules.mode, 0o755);
    assert!(rules.contents.starts_with("#!/usr/sbin/nft -f\n"));
    assert_lines(
        &rules.contents,
        &[
            "flush ruleset",
            "type filter hook input priority filter; policy drop;",
            "type filter hook forward priority filter; policy drop;",
            "type filter hook output priority filter; policy drop;",
            "iif \"lo\" accept",
            "ct state established,related accept",
            "elements = { 0.0.0.0/0 }",
            "elements = { ::/0 }",
            "elements = { 169.254.169.254/32 }",
            "tcp dport 22 ip saddr @ssh_v4 accept",
            "tcp dport 22 ip6 saddr @ssh_v6 accept",
            "tcp dport 8080 ip saddr @api_v4 accept",
            "tcp dport 8080 ip6 saddr @api_v6 accept",
            "ip daddr @egress_v4 accept",
            // The per-source meters on the API port, from [network].
            "tcp dport 8080 ip saddr @api_v4 ct state new update @api_syn_v4 { ip saddr limit rate over 10/second burst 20 packets } counter drop",
            "tcp dport 8080 ip saddr @api_v4 ct state new add @api_conns_v4 { ip saddr ct count over 16 } counter drop",
            "tcp dport 8080 ip6 saddr @api_v6 ct state new update @api_syn_v6 { ip6 saddr and ffff:ffff:ffff:ffff:: limit rate over 10/second burst 20 packets } counter drop",
            "tcp dport 8080 ip6 saddr @api_v6 ct state new add @api_conns_v6 { ip6 saddr and ffff:ffff:ffff:ffff:: ct count over 16 } counter drop",
            "set api_conns_v6 {",
            "flags dynamic,timeout",
        ],
    );
    // The meters come before the API's accept rules, or they would never see a packet.
    let at = |line: &str| rules.contents.find(line).unwrap();
    assert!(at("@api_conns_v6 {") < at("tcp dport 8080 ip saddr @api_v4 accept"));
}

/// The server listens on both families, and the meters follow the profile's numbers.
#[test]
fn the_server_serves_ipv6_and_the_meters_follow_the_profile() {
    let args = render::server_args(&e2_micro());
    let host = args.iter().position(|a| a == "--host").unwrap();
    assert_eq!(args[host + 1], "::");
    let mut p = e2_micro();
    p.network.api_connections_per_source = 9;
    p.network.api_syn_per_source_per_sec = 3;
    p.network.api_syn_burst = 7;
    let rules = rendered_from(&p, "/etc/nftables.conf").contents;
    assert_eq!(rules.matches("ct count over 9 }").count(), 2, "{rules}");
    assert_eq!(
        rules
            .matches("limit rate over 3/second burst 7 packets }")
            .count(),
        2,
        "{rules}"
    );
    // The metadata address alone is denied to the server, wherever it lies.
    p.oci.metadata_address = "fd00:c1::a9fe:a9fe".parse().unwrap();
    assert_eq!(render::server_ip_deny(&p), ["fd00:c1::a9fe:a9fe/128"]);
}

fn tool(name: &str) -> bool {
    Command::new(name).arg("--version").output().is_ok()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// `nft --check` parses and resolves the ruleset without loading it (it needs root for netlink).
fn nft_check(ruleset: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nftables.conf");
    std::fs::write(&path, ruleset).unwrap();
    Command::new("nft")
        .arg("--check")
        .arg("-f")
        .arg(&path)
        .output()
        .unwrap()
}

#[test]
fn nft_accepts_the_ruleset() {
    // Fails rather than skips without the tool: `cargo xtask test` installs it.
    assert!(tool("nft"), "nft is missing: apt-get install nftables");
    assert!(
        is_root(),
        "nft --check needs CAP_NET_ADMIN: run the tests as root"
    );
    let rules = rendered("/etc/nftables.conf").contents;
    let out = nft_check(&rules);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The check is real: a port out of range in the same ruleset is refused, and so are the
    // meters with a bad rate or count.
    let broken = rules.replace("tcp dport 8080 ip saddr", "tcp dport 80800 ip saddr");
    assert!(!nft_check(&broken).status.success());
    assert!(rules.contains("/second burst") && rules.contains("ct count over"));
    let broken = rules.replace("/second burst", "/fortnight burst");
    assert!(!nft_check(&broken).status.success());
    let broken = rules.replace("ct count over", "ct count under");
    assert!(!nft_check(&broken).status.success());
    // And so are profiles with networks of only one family (empty sets stay valid).
    let mut v4_only = e2_micro();
    v4_only.network.api_cidrs.retain(|c| c.is_ipv4());
    v4_only.network.ssh_cidrs = vec!["192.0.2.0/24".parse().unwrap()];
    let rules = render::render(&v4_only)
        .into_iter()
        .find(|f| f.path == "/etc/nftables.conf")
        .unwrap()
        .contents;
    let out = nft_check(&rules);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn systemd_analyze_verifies_the_units() {
    assert!(
        tool("systemd-analyze"),
        "systemd-analyze is missing: apt-get install systemd"
    );
    verify_units(&e2_micro());
    // The quoting too: a model path with spaces, quotes, `%`, `$` and a backslash.
    verify_units(&awkward_model_name());
}

fn verify_units(profile: &Profile) {
    let dir = tempfile::tempdir().unwrap();
    // verify insists that ExecStart's binary exists: point it at a stand-in, the rest as is.
    let stand_in = dir.path().join("llm-server");
    std::fs::copy("/bin/true", &stand_in).unwrap();
    let mut units = Vec::new();
    for file in render::render(profile) {
        if !file.path.starts_with("/etc/systemd/system/") {
            continue;
        }
        let name = Path::new(file.path).file_name().unwrap();
        let path = dir.path().join(name);
        let text = file
            .contents
            .replace(paths::SERVER_BINARY, stand_in.to_str().unwrap())
            .replace(paths::APPLIANCE_BINARY, stand_in.to_str().unwrap());
        std::fs::write(&path, text).unwrap();
        units.push(path);
    }
    assert_eq!(units.len(), 5);
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn write_mirrors_the_root_file_system() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let files = render::render(&e2_micro());
    let written = render::write(&files, dir.path()).unwrap();
    assert_eq!(written.len(), files.len());
    let nft = dir.path().join("etc/nftables.conf");
    assert_eq!(
        std::fs::metadata(&nft).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let profile =
        std::fs::read_to_string(dir.path().join("etc/llm-appliance/profile.toml")).unwrap();
    assert_eq!(profile, include_str!("../../profiles/e2-micro.toml"));
}
