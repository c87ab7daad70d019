//! appliance/profiles/e2-micro-1b.toml against the server's planner on a file of Gemma 3 1B's
//! real shapes and IQ4_XS types (`llm-server synth --preset gemma3-1b`, its tokenizer from the
//! default model): `inspect` shows its real shapes; pinned to that file, the profile loads (every cross-section rule holds) and
//! its limits hold the plan at its context and slots. Unpinned, as committed, it does not load,
//! and both builders stop at once with the command that pins it.

use std::process::Command;
use std::time::{Duration, Instant};

use appliance::plan::{self, ServerPlan};
use appliance::Profile;
use sha2::{Digest, Sha256};

#[test]
fn the_1b_profile_holds_the_servers_plan_of_a_1b_shaped_file() {
    let path = test_support::workspace_root().join("appliance/profiles/e2-micro-1b.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let e = Profile::parse(&text, &path).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "cargo xtask model --profile {} --pin",
            path.display()
        )),
        "the committed profile is unpinned: {e}"
    );

    let server = test_support::llm_server_binary();
    let dir = std::env::temp_dir().join(format!("xtask-profile-1b-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("gemma-3-1b-it-iq4_xs.gguf");
    let out = Command::new(&server)
        .args(["synth", "--preset", "gemma3-1b", "--mix", "iq4_xs", "--out"])
        .arg(&model)
        .arg("--vocab-from")
        .arg(test_support::default_model())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `inspect` shows the real shapes, types and byte counts.
    let out = Command::new(&server)
        .arg("inspect")
        .arg("-m")
        .arg(&model)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    for row in [
        "token_embd.weight q8_0 [1152, 262144] 320864256",
        "blk.25.attn_v.weight q5_1 [1152, 256] 221184",
        "blk.25.ffn_down.weight iq4_xs [6912, 1152] 4230144",
        "blk.25.ffn_up.weight iq4_nl [1152, 6912] 4478976",
    ] {
        let found = table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == row);
        assert!(found, "no `{row}` in:\n{table}");
    }
    let bytes = std::fs::read(&model).unwrap();
    // The published IQ4_XS file is about 714 MB.
    assert!(
        (700e6..730e6).contains(&(bytes.len() as f64)),
        "{}",
        bytes.len()
    );
    let sha256 = format!("{:x}", Sha256::digest(&bytes));
    drop(bytes);

    let url_line = text.lines().find(|l| l.starts_with("url = ")).unwrap();
    let pinned = text.replacen(
        url_line,
        &format!(
            "{url_line}\nsha256 = \"{sha256}\"\nsize_bytes = {}",
            std::fs::metadata(&model).unwrap().len()
        ),
        1,
    );
    let profile = Profile::parse(&pinned, &path).unwrap();
    assert!(profile
        .model
        .url
        .as_deref()
        .unwrap()
        .starts_with("https://huggingface.co/"));
    let s = &profile.server;
    let out = Command::new(&server)
        .args(plan::args(model.to_str().unwrap(), s.ctx_size, s.parallel))
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 2)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = ServerPlan::parse(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let limits = profile.memory_limits(&plan).unwrap();
    assert_eq!(
        (
            limits.min_mib,
            limits.low_mib,
            limits.high_mib,
            limits.max_mib
        ),
        (676, 818, 856, 904),
        "the limits the profile was sized at"
    );
    // llama.cpp's own quantiser, given these shapes (ftype IQ4_XS), bumps some tensors: its file
    // plans 711634432 bytes of weights and 859125606 in all. The limits follow it, and earlyoom's
    // kill line (77 % of MemTotal 965 MiB: 743) still sits 48 MiB above its 679 MiB.
    let mut quantised = plan.clone();
    quantised.weights_bytes = 711_634_432;
    quantised.total_bytes = 859_125_606;
    let limits = profile.memory_limits(&quantised).unwrap();
    assert_eq!(
        (
            limits.min_mib,
            limits.low_mib,
            limits.high_mib,
            limits.max_mib
        ),
        (679, 822, 860, 908)
    );
    // 695 MiB of weights is the most that line protects; one MiB more is refused, naming the
    // percentage that would serve it.
    for (weights_mib, fits) in [(695, true), (696, false)] {
        let mut larger = quantised.clone();
        larger.weights_bytes = weights_mib << 20;
        larger.total_bytes = quantised.total_bytes - quantised.weights_bytes + larger.weights_bytes;
        match profile.memory_limits(&larger) {
            Ok(limits) => assert!(fits, "{weights_mib} MiB accepted: {limits:?}"),
            Err(e) => {
                let e = e.to_string();
                assert!(!fits, "{weights_mib} MiB refused: {e}");
                assert!(
                    e.contains("earlyoom.mem_kill_percent = 77 would never fire in time")
                        && e.contains("protected 696 MiB")
                        && e.contains("at least 78"),
                    "{e}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cargo xtask image` on the unpinned profile stops within seconds, before any probe, download
/// or build, with the `--pin` command; `nix build .#e2-micro-1b-image` reads the profile through
/// modules/read-profile.nix, which throws the same command (evaluated here as the flake's module
/// evaluates it, without nixpkgs), while the shipped, pinned profile reads through.
#[test]
fn both_builders_stop_at_once_on_the_unpinned_1b_profile_with_the_pin_command() {
    let root = test_support::workspace_root();
    let pin = "cargo xtask model --profile appliance/profiles/e2-micro-1b.toml --pin";
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .current_dir(&root)
        .args(["image", "--profile", "appliance/profiles/e2-micro-1b.toml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(pin), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );

    let read = |profile: &str| {
        Command::new("nix-instantiate")
            .current_dir(&root)
            .args([
                "--option", "store", "dummy://", "--eval", "--strict", "--json", "-E",
            ])
            .arg(format!(
                "(import ./modules/read-profile.nix ./appliance/profiles/{profile}).machine.name"
            ))
            .output()
            .expect("nix-instantiate is missing: install Nix (`apt-get install nix-bin`)")
    };
    let out = read("e2-micro-1b.toml");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(pin), "{stderr}");
    let out = read("e2-micro.toml");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "\"e2-micro\"");
}
