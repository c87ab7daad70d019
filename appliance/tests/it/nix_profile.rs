//! The NixOS modules derive from the same profile as the Debian image: `modules/profile.nix`,
//! evaluated by Nix itself, must give every value `appliance render` writes, for the shipped
//! profile and for a variant that takes the other branches (IPv4-only networks, no `prefer`
//! list, no watchdog, a model file name that needs quoting, other meters and limits, a
//! metadata service outside link-local). The memory plan too: both builders
//! run `llm-server plan --json` with the same arguments and `appliance check` on its output.
//! Also: every `.nix` file in the repository parses, and the Nix ruleset passes `nft --check`.
//!
//! Nix evaluates pure expressions without nixpkgs (Debian's `nix-bin` is enough), so these run
//! in CI; a missing `nix-instantiate` fails them with the install command rather than skipping.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::exec_words;
use appliance::paths;
use appliance::profile::Profile;
use appliance::render::{self, File};
use serde_json::Value;

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the appliance crate is inside the workspace")
        .to_path_buf()
}

/// `nix-instantiate` with a store that is never touched: these are pure evaluations, and the
/// default store would need the Nix daemon (or root).
pub(crate) fn nix_instantiate() -> Command {
    let probe = Command::new("nix-instantiate").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        panic!(
            "nix-instantiate is missing: install Nix (`apt-get install nix-bin` on Debian; \
             .ci/run does) to check the NixOS modules against the profile"
        );
    }
    let mut cmd = Command::new("nix-instantiate");
    cmd.args(["--option", "store", "dummy://"]);
    cmd
}

/// The JSON value a `nix-instantiate --eval --json` command prints, failing with its stderr
/// (and `what` it evaluated) when it cannot evaluate.
pub(crate) fn eval_json<T: serde::de::DeserializeOwned>(cmd: &mut Command, what: &str) -> T {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "nix-instantiate could not evaluate {what}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A profile from `appliance/profiles/`, and the same values as Nix maps them.
struct Case {
    name: &'static str,
    profile: Profile,
    nix: Value,
}

/// The shipped profile and a variant taking the other branches of the mapping.
fn cases() -> Vec<Case> {
    let shipped = repo_root().join("appliance/profiles/e2-micro.toml");
    let text = std::fs::read_to_string(&shipped).unwrap();
    let variant_text = [
        (
            r#"ssh_cidrs = ["0.0.0.0/0", "::/0"]"#,
            r#"ssh_cidrs = ["192.0.2.0/24", "198.51.100.7/32"]"#,
        ),
        (
            r#"api_cidrs = ["0.0.0.0/0", "::/0"]"#,
            r#"api_cidrs = ["fd00:db8::/32"]"#,
        ),
        ("watchdog_sec = 120", "watchdog_sec = 0"),
        // Private networks only, so no key and no TLS are allowed: no credentials.
        (r#"api_keys = "metadata""#, r#"api_keys = "none""#),
        (r#"tls = "metadata""#, r#"tls = "none""#),
        (
            "cors_origins = []",
            r#"cors_origins = ["https://a.example", "http://b.example:8000"]"#,
        ),
        ("prefer = [", "prefer = [] # ["),
        ("api_port = 8080", "api_port = 11434"),
        // Other meters and limits, and a metadata service outside IPv4 link-local, which the
        // server is then denied by address.
        (
            "api_connections_per_source = 16",
            "api_connections_per_source = 9",
        ),
        (
            "api_syn_per_source_per_sec = 10",
            "api_syn_per_source_per_sec = 3",
        ),
        ("api_syn_burst = 20", "api_syn_burst = 7"),
        ("max_connections_per_ip = 8", "max_connections_per_ip = 5"),
        ("max_grammar_bytes = 65536", "max_grammar_bytes = 1000"),
        ("grammar_compiles = 1", "grammar_compiles = 2"),
        (
            r#"egress_cidrs = ["169.254.169.254/32"]"#,
            r#"egress_cidrs = ["10.0.0.0/8"]"#,
        ),
        (
            r#"metadata_address = "169.254.169.254""#,
            r#"metadata_address = "10.9.9.9""#,
        ),
        ("\"vm.swappiness\" = 10", "\"vm.swappiness\" = 5"),
        (
            r#"file = "SmolLM2-135M-Instruct.Q4_1.gguf""#,
            r#"file = "my \"model\" 100% $HOME.gguf""#,
        ),
    ]
    .iter()
    .fold(text, |t, (from, to)| {
        assert!(t.contains(from), "the shipped profile has no `{from}`");
        t.replacen(from, to, 1)
    });
    let dir = tempfile::tempdir().unwrap();
    let variant = dir.path().join("variant.toml");
    std::fs::write(&variant, variant_text).unwrap();
    vec![case("e2-micro", &shipped), case("variant", &variant)]
}

fn case(name: &'static str, path: &Path) -> Case {
    let profile = Profile::load(path).unwrap();
    let mut eval = nix_instantiate();
    eval.args(["--eval", "--strict", "--json"])
        .arg("--argstr")
        .arg("root")
        .arg(repo_root())
        .arg("--argstr")
        .arg("profile")
        .arg(path)
        .arg("--argstr")
        .arg("model")
        .arg(profile.model_path())
        .arg("--expr")
        .arg(
            "{ root, profile, model }:
             let values = import (/. + root + \"/modules/profile.nix\")
                   (builtins.fromTOML (builtins.readFile (/. + profile)));
             in values // {
               serveArgs = import (/. + root + \"/modules/serve-args.nix\")
                 (values.server // { inherit model; });
               planArgs = import (/. + root + \"/modules/plan-args.nix\") {
                 inherit model;
                 inherit (values.server) contextSize parallel;
               };
             }",
        );
    let what = format!("modules/profile.nix for {}", path.display());
    Case {
        name,
        profile,
        nix: eval_json(&mut eval, &what),
    }
}

fn rendered(profile: &Profile, path: &str) -> String {
    render::render(profile)
        .into_iter()
        .find(|f: &File| f.path == path)
        .unwrap_or_else(|| panic!("{path} is not rendered"))
        .contents
}

/// An INI-style file (systemd units, zram-generator.conf) as section -> key -> values, in order;
/// comments and blank lines dropped.
type Sections = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn sections(text: &str) -> Sections {
    let mut out = Sections::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.to_owned();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not `key = value`: {line}"));
        out.entry(current.clone())
            .or_default()
            .entry(key.trim().to_owned())
            .or_default()
            .push(value.trim().to_owned());
    }
    out
}

/// A Nix value as systemd (and zram-generator, sshd, journald) read it: booleans as yes/no,
/// lists as space-separated words.
fn as_setting(v: &Value) -> String {
    match v {
        Value::Bool(b) => if *b { "yes" } else { "no" }.to_owned(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(as_setting).collect::<Vec<_>>().join(" "),
        other => panic!("no setting syntax for {other}"),
    }
}

/// A Nix attribute set as key -> setting.
fn settings(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an attribute set: {v}"))
        .iter()
        .map(|(k, v)| (k.clone(), as_setting(v)))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().expect("a list of strings").to_owned())
        .collect()
}

/// A section with one value per key, as the map `settings` gives.
fn single_values(section: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
    section
        .iter()
        .map(|(k, v)| {
            assert_eq!(v.len(), 1, "`{k}` is set more than once");
            (k.clone(), v[0].clone())
        })
        .collect()
}

/// The command without the directory of its program: Debian's is `/usr/bin`, NixOS's the store.
fn by_program_name(mut words: Vec<String>) -> Vec<String> {
    let name = Path::new(&words[0]).file_name().unwrap().to_str().unwrap();
    words[0] = name.to_owned();
    words
}

#[test]
fn zram_generator_settings_match() {
    for c in cases() {
        let debian = sections(&rendered(&c.profile, "/etc/systemd/zram-generator.conf"));
        let nix = c.nix["zramGenerator"].as_object().unwrap();
        assert_eq!(
            debian.keys().collect::<Vec<_>>(),
            nix.keys().collect::<Vec<_>>(),
            "{}: devices",
            c.name
        );
        for (device, keys) in &debian {
            assert_eq!(
                single_values(keys),
                settings(&nix[device]),
                "{}: [{device}]",
                c.name
            );
        }
    }
}

#[test]
fn sysctls_match() {
    for c in cases() {
        let debian: BTreeMap<String, String> =
            rendered(&c.profile, "/etc/sysctl.d/90-llm-appliance.conf")
                .lines()
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| {
                    let (k, v) = l.split_once(" = ").unwrap();
                    (k.to_owned(), v.to_owned())
                })
                .collect();
        assert_eq!(debian, settings(&c.nix["sysctl"]), "{}", c.name);
    }
}

#[test]
fn earlyoom_arguments_match() {
    for c in cases() {
        assert_eq!(
            render::earlyoom_args(&c.profile),
            strings(&c.nix["earlyoomArgs"]),
            "{}",
            c.name
        );
    }
}

/// The ruleset's statements: comments and blank lines are the only freedom each side has.
fn statements(ruleset: &str) -> Vec<&str> {
    ruleset
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect()
}

#[test]
fn nftables_rulesets_match() {
    for c in cases() {
        let debian = rendered(&c.profile, "/etc/nftables.conf");
        let nix = c.nix["nftablesRuleset"].as_str().unwrap();
        assert_eq!(statements(&debian), statements(nix), "{}", c.name);
    }
}

/// `nft --check` needs netlink, so it runs in a network namespace of its own: as root with
/// `unshare -n`, otherwise in a user namespace (`unshare -rn`) where the caller is root.
#[test]
fn nft_accepts_the_nix_ruleset() {
    let probe = Command::new("nft").arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "nft is missing: `apt-get install nftables` (.ci/run does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let check = |ruleset: &str| {
        let path = dir.path().join("ruleset.nft");
        std::fs::write(&path, ruleset).unwrap();
        Command::new("unshare")
            .arg("--map-root-user")
            .arg("--net")
            .args(["nft", "--check", "--file"])
            .arg(&path)
            .output()
            .unwrap()
    };
    for c in cases() {
        let ruleset = c.nix["nftablesRuleset"].as_str().unwrap();
        let out = check(ruleset);
        assert!(
            out.status.success(),
            "{}: nft refused the Nix ruleset:\n{}",
            c.name,
            String::from_utf8_lossy(&out.stderr)
        );
        // The check is real: the same ruleset with a port out of range is refused.
        let broken = ruleset.replacen("tcp dport", "tcp dport 80800 tcp dport", 1);
        assert!(!check(&broken).status.success(), "{}", c.name);
    }
}

#[test]
fn server_unit_matches() {
    for c in cases() {
        let debian = sections(&rendered(
            &c.profile,
            "/etc/systemd/system/llm-server.service",
        ));
        let nix = &c.nix["serverUnit"];
        let service = &debian["Service"];

        let exec = &service["ExecStart"];
        assert_eq!(exec.len(), 1);
        let words = exec_words(&exec[0]);
        assert_eq!(words[0], paths::SERVER_BINARY);
        let mut nix_words = strings(&c.nix["serveArgs"]);
        nix_words.extend(strings(&c.nix["credentialArgs"]));
        assert_eq!(words[1..], nix_words, "{}", c.name);
        assert_eq!(
            render::server_args(&c.profile),
            strings(&c.nix["serveArgs"]),
            "{}",
            c.name
        );
        assert_eq!(
            render::credential_args(&c.profile),
            strings(&c.nix["credentialArgs"]),
            "{}",
            c.name
        );
        assert_eq!(
            service.get("LoadCredential").cloned().unwrap_or_default(),
            strings(&c.nix["loadCredentials"]),
            "{}",
            c.name
        );

        let mut service = service.clone();
        service.remove("LoadCredential");
        let mut rest = single_values(&service);
        rest.remove("ExecStart");
        // The renderer leaves out a watchdog of 0; Nix writes WatchdogSec=0, the same to systemd.
        rest.entry("WatchdogSec".into())
            .or_insert_with(|| "0".into());
        let mut nix_service = settings(&nix["serviceConfig"]);
        nix_service.extend(settings(&nix["limits"]));
        assert_eq!(rest, nix_service, "{}", c.name);

        let unit = single_values(&debian["Unit"]);
        let nix_unit: BTreeMap<String, String> = [
            ("Description", &nix["description"]),
            ("After", &nix["after"]),
            ("Requires", &nix["requires"]),
            ("StartLimitIntervalSec", &nix["startLimitIntervalSec"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), as_setting(v)))
        .collect();
        assert_eq!(unit, nix_unit, "{}", c.name);
        assert_eq!(
            debian["Install"]["WantedBy"],
            strings(&nix["wantedBy"]),
            "{}",
            c.name
        );
    }
}

/// The NixOS module plans the model at build time with the same `llm-server plan` arguments as
/// `cargo xtask image`, and both hold the profile to the result with the same rule
/// (`Profile::memory_limits`, which the module runs as `appliance memory --plan`), so the two
/// builders check the same numbers.
#[test]
fn memory_plan_arguments_match() {
    for c in cases() {
        let s = &c.profile.server;
        assert_eq!(
            appliance::plan::args(&c.profile.model_path(), s.ctx_size, s.parallel),
            strings(&c.nix["planArgs"]),
            "{}",
            c.name
        );
    }
}

#[test]
fn ssh_key_unit_matches() {
    for c in cases() {
        let debian = sections(&rendered(
            &c.profile,
            "/etc/systemd/system/oci-ssh-keys.service",
        ));
        let nix = &c.nix["sshKeys"];
        let commands: Vec<Vec<String>> = debian["Service"]["ExecStart"]
            .iter()
            .map(|line| by_program_name(exec_words(line)))
            .collect();
        let nix_commands: Vec<Vec<String>> = nix["commands"]
            .as_array()
            .unwrap()
            .iter()
            .map(strings)
            .collect();
        assert_eq!(commands, nix_commands, "{}", c.name);
        assert_eq!(
            debian["Unit"]["Description"],
            [as_setting(&nix["description"])]
        );
        assert_eq!(
            debian["Service"]["RuntimeDirectory"],
            [as_setting(&nix["runtimeDirectory"])]
        );
        let mut service = debian["Service"].clone();
        for key in [
            "ExecStart",
            "Type",
            "RemainAfterExit",
            "RuntimeDirectory",
            "RuntimeDirectoryMode",
        ] {
            service.remove(key);
        }
        let confinement = single_values(&service);
        assert_eq!(
            confinement,
            settings(&c.nix["sshKeysConfinement"]),
            "{}",
            c.name
        );
    }
}

#[test]
fn secrets_unit_matches() {
    for c in cases() {
        let debian = sections(&rendered(
            &c.profile,
            "/etc/systemd/system/llm-secrets.service",
        ));
        let nix = &c.nix["secrets"];
        let unit = single_values(&debian["Unit"]);
        let nix_unit: BTreeMap<String, String> = [
            ("Description", &nix["description"]),
            ("Wants", &nix["wants"]),
            ("After", &nix["after"]),
            ("Before", &nix["before"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), as_setting(v)))
        .collect();
        assert_eq!(unit, nix_unit, "{}", c.name);
        let mut service = single_values(&debian["Service"]);
        assert_eq!(
            by_program_name(exec_words(&service.remove("ExecStart").unwrap())),
            strings(&nix["command"])
        );
        assert_eq!(
            service.remove("StateDirectory").unwrap(),
            as_setting(&nix["stateDirectory"])
        );
        for (key, value) in [
            ("Type", "oneshot"),
            ("RemainAfterExit", "yes"),
            ("StateDirectoryMode", "0700"),
        ] {
            assert_eq!(service.remove(key).as_deref(), Some(value), "{key}");
        }
        assert_eq!(service, settings(&nix["serviceConfig"]), "{}", c.name);
    }
}

#[test]
fn memory_baseline_unit_matches() {
    for c in cases() {
        let debian = sections(&rendered(
            &c.profile,
            "/etc/systemd/system/memory-baseline.service",
        ));
        let nix = &c.nix["memoryBaseline"];
        let unit = &debian["Unit"];
        assert_eq!(unit["Description"], [as_setting(&nix["description"])]);
        assert_eq!(unit["Before"], [as_setting(&nix["before"])]);
        // Debian calls the SSH daemon's unit ssh.service, NixOS sshd.service.
        assert_eq!(
            unit["After"][0].replace("ssh.service", "sshd.service"),
            as_setting(&nix["after"])
        );
        assert_eq!(
            by_program_name(exec_words(&debian["Service"]["ExecStart"][0])),
            strings(&nix["command"])
        );
    }
}

#[test]
fn sshd_journald_and_hostname_match() {
    for c in cases() {
        // sshd_config is `Key value`, not `Key=value`.
        let debian: BTreeMap<String, String> =
            rendered(&c.profile, "/etc/ssh/sshd_config.d/50-llm-appliance.conf")
                .lines()
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| {
                    let (k, v) = l.split_once(' ').unwrap();
                    (k.to_owned(), v.to_owned())
                })
                .collect();
        let mut nix = settings(&c.nix["openssh"]["settings"]);
        nix.insert("Port".into(), as_setting(&c.nix["openssh"]["ports"]));
        assert_eq!(debian, nix, "{}", c.name);

        let journald = sections(&rendered(
            &c.profile,
            "/etc/systemd/journald.conf.d/50-llm-appliance.conf",
        ));
        assert_eq!(
            single_values(&journald["Journal"]),
            settings(&c.nix["journald"])
        );

        assert_eq!(
            rendered(&c.profile, "/etc/hostname").trim_end(),
            c.nix["hostName"].as_str().unwrap()
        );
        assert_eq!(c.nix["model"]["file"], c.profile.model.file.as_str());
        assert_eq!(c.nix["model"]["sha256"], c.profile.model.sha256.as_str());
    }
}

/// Every `.nix` file under `dir`, skipping build output and version control.
fn nix_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap_or_default();
        if path.is_dir() {
            if !matches!(name, "target" | ".git" | "result") {
                nix_files(&path, found);
            }
        } else if name.ends_with(".nix") {
            found.push(path);
        }
    }
}

#[test]
fn every_nix_file_parses() {
    let mut files = Vec::new();
    nix_files(&repo_root(), &mut files);
    for expected in ["flake.nix", "modules/profile.nix", "modules/llm-server.nix"] {
        assert!(
            files.contains(&repo_root().join(expected)),
            "{expected} is missing"
        );
    }
    for file in &files {
        let out = nix_instantiate().arg("--parse").arg(file).output().unwrap();
        assert!(
            out.status.success(),
            "{} does not parse:\n{}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The NixOS module's build step (modules/memory-script.nix, evaluated by Nix and run by bash
/// with the real planner and the real `appliance`, as the derivation runs it) writes the server
/// unit's memory drop-in and the plan where the Debian image installs them, word for word:
/// `appliance memory` and `cargo xtask image` render both from `Profile::memory_limits`. A
/// context the machine cannot hold fails the step with the reason and the planner's table.
#[test]
fn the_memory_drop_in_is_the_same_from_both_builders() {
    let shipped = repo_root().join("appliance/profiles/e2-micro.toml");
    let too_big = std::env::temp_dir().join(format!("nix-memory-{}.toml", std::process::id()));
    std::fs::write(
        &too_big,
        std::fs::read_to_string(&shipped)
            .unwrap()
            .replacen("ctx_size = 4096", "ctx_size = 8192", 1)
            .replacen("parallel = 2", "parallel = 4", 1),
    )
    .unwrap();
    let model = test_support::appliance_model();
    let run = |profile: &Path| {
        let profile_values = Profile::load(profile).unwrap();
        let s = &profile_values.server;
        let mut eval = nix_instantiate();
        eval.args(["--eval", "--strict", "--json"])
            .args(["--argstr", "root"])
            .arg(repo_root())
            .args(["--argstr", "server"])
            .arg(test_support::llm_server_binary())
            .args(["--argstr", "appliance", env!("CARGO_BIN_EXE_appliance")])
            .args(["--argstr", "profile"])
            .arg(profile)
            .args(["--argstr", "model"])
            .arg(&model)
            .args(["--arg", "ctx", &s.ctx_size.to_string()])
            .args(["--arg", "parallel", &s.parallel.to_string()])
            .arg("--expr")
            .arg(
                "{ root, server, appliance, profile, model, ctx, parallel }:
                 import (/. + root + \"/modules/memory-script.nix\") {
                   inherit server appliance profile;
                   planArgs = import (/. + root + \"/modules/plan-args.nix\") {
                     inherit model parallel; contextSize = ctx;
                   };
                 }",
            );
        let script: String = eval_json(&mut eval, "modules/memory-script.nix");
        let dir = tempfile::tempdir().unwrap();
        let result = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(dir.path())
            .env("out", dir.path().join("out"))
            .output()
            .unwrap();
        (profile_values, dir, result)
    };

    let (profile, dir, result) = run(&shipped);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let out = dir.path().join("out");
    let read = |p: &str| std::fs::read_to_string(out.join(p)).unwrap();
    // NixOS links the package's lib/systemd/system/<dir>/<file> to /etc/systemd/system/<dir>/.
    assert_eq!(
        paths::MEMORY_DROPIN,
        format!(
            "/etc/systemd/system/{}",
            paths::MEMORY_DROPIN_IN_PACKAGE
                .strip_prefix("lib/systemd/system/")
                .unwrap()
        )
    );
    let dropin = read(paths::MEMORY_DROPIN_IN_PACKAGE);
    let plan_json = read("share/llm-appliance/plan.json");
    let plan = appliance::plan::ServerPlan::parse(&plan_json).unwrap();
    // What `cargo xtask image` installs for the same plan.
    let limits = profile.memory_limits(&plan).unwrap();
    let debian = render::planned(&profile, &plan_json, &limits);
    let file = |path: &str| &debian.iter().find(|f| f.path == path).unwrap().contents;
    assert_eq!(&dropin, file(paths::MEMORY_DROPIN));
    assert_eq!(&plan_json, file(paths::PLAN));
    assert!(
        dropin.ends_with(
            "[Service]\nMemoryMin=96M\nMemoryLow=384M\nMemoryHigh=512M\nMemoryMax=576M\n"
        ),
        "{dropin}"
    );

    let (_, _dir, result) = run(&too_big);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success(), "{stderr}");
    assert!(
        stderr.contains("the model does not fit machine.ram_mib = 1024"),
        "{stderr}"
    );
    // The planner's own table follows the reason.
    assert!(stderr.contains("KV cache (anonymous)"), "{stderr}");
    std::fs::remove_file(&too_big).unwrap();
}

/// The module gives the profile as a path: the step must name its copy in the store, which the
/// builder's sandbox can read, not the path in the source tree. (`--readonly-mode` computes the
/// store path without a store.)
#[test]
fn the_memory_step_reads_the_profile_from_the_store() {
    let mut eval = nix_instantiate();
    eval.args(["--readonly-mode", "--eval", "--strict", "--json"])
        .args(["--argstr", "root"])
        .arg(repo_root())
        .arg("--expr")
        .arg(
            "{ root }: import (/. + root + \"/modules/memory-script.nix\") {
               server = \"/s/llm-server\"; appliance = \"/a/appliance\";
               profile = /. + root + \"/appliance/profiles/e2-micro.toml\";
               planArgs = [ \"plan\" \"--json\" ];
             }",
        );
    let script: String = eval_json(&mut eval, "modules/memory-script.nix");
    let profile = script
        .split("--profile '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no --profile in:\n{script}"));
    assert!(
        profile.starts_with("/nix/store/") && profile.ends_with("-e2-micro.toml"),
        "{profile}"
    );
}
