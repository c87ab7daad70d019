//! Loading the profile: the shipped one is valid, and each kind of mistake is refused with a
//! message naming the key and the fix.

use std::path::Path;

use appliance::profile::{Profile, SysctlValue};

const E2_MICRO: &str = include_str!("../profiles/e2-micro.toml");

/// The shipped profile with `from` replaced by `to` (which must occur).
fn edited(from: &str, to: &str) -> String {
    assert!(E2_MICRO.contains(from), "the profile has no `{from}`");
    E2_MICRO.replacen(from, to, 1)
}

fn error_of(text: &str) -> String {
    Profile::parse(text, Path::new("test.toml"))
        .expect_err("the profile should be refused")
        .to_string()
}

#[test]
fn the_shipped_profile_loads() {
    let path = test_support::default_profile();
    let p = Profile::load(&path).unwrap();
    assert_eq!(p.machine.ram_mib, 1024);
    assert_eq!(p.model.file, "gemma-3-270m-q4_k_m.gguf");
    assert_eq!(p.model.size_bytes, 253_113_024);
    assert_eq!(p.server.api_port.0, 8080);
    assert_eq!(p.sysctl["vm.page-cluster"], SysctlValue::Int(0));
    assert_eq!(p.source, E2_MICRO);
    assert_eq!(
        p.model_path(),
        "/var/lib/llm/models/gemma-3-270m-q4_k_m.gguf"
    );
}

#[test]
fn the_plan_of_the_shipped_profile_is_what_its_numbers_say() {
    let p = Profile::parse(E2_MICRO, Path::new("e2-micro.toml")).unwrap();
    let need = appliance::plan::requirement(&p.model, &p.server);
    // K and V, 18 layers, 1 head of 256 f16 values, 2048 tokens, 2 slots.
    assert_eq!(need.kv_cache, 2 * 18 * 256 * 2 * 2048 * 2);
    assert_eq!(need.weights, 253_113_024);
    assert!(need.total() <= p.server.memory.high_mib << 20);
}

#[test]
fn unknown_keys_are_refused() {
    let e = error_of(&edited("ram_mib = 1024", "ram_mib = 1024\nram_gb = 1"));
    assert!(e.contains("unknown field `ram_gb`"), "{e}");
    assert!(e.contains("test.toml"), "{e}");
}

#[test]
fn headroom_below_earlyooms_term_line_is_refused() {
    // 42 % of 1024 MiB is 430 MiB: an idle box with 400 MiB available would be killing.
    let e = error_of(&edited("headroom_mib = 512", "headroom_mib = 400"));
    assert!(e.contains("machine.headroom_mib = 400"), "{e}");
    assert!(e.contains("term line (430 MiB"), "{e}");
    let e = error_of(&edited("headroom_mib = 512", "headroom_mib = 1024"));
    assert!(e.contains("machine.ram_mib = 1024"), "{e}");
}

#[test]
fn bad_cidrs_are_refused() {
    let e = error_of(&edited(
        r#"api_cidrs = ["0.0.0.0/0", "::/0"]"#,
        r#"api_cidrs = ["10.1.2.3/8"]"#,
    ));
    assert!(e.contains("write the network, `10.0.0.0/8`"), "{e}");
    let e = error_of(&edited(
        r#"api_cidrs = ["0.0.0.0/0", "::/0"]"#,
        r#"api_cidrs = ["10.0.0.0/40"]"#,
    ));
    assert!(e.contains("from 0 to 32"), "{e}");
}

#[test]
fn ports_out_of_range_are_refused() {
    let e = error_of(&edited("api_port = 8080", "api_port = 70000"));
    assert!(
        e.contains("port 70000 is out of range: use 1 to 65535"),
        "{e}"
    );
    let e = error_of(&edited("ssh_port = 22", "ssh_port = 0"));
    assert!(e.contains("port 0 is out of range"), "{e}");
    let e = error_of(&edited("ssh_port = 22", "ssh_port = 8080"));
    assert!(e.contains("both 8080"), "{e}");
}

#[test]
fn limits_that_cannot_hold_the_model_are_refused_with_the_numbers() {
    let e = error_of(&edited("high_mib = 576", "high_mib = 400"));
    assert!(e.contains("high_mib = 400 cannot hold the model"), "{e}");
    assert!(
        e.contains("needs 428 MiB (weights 242 + KV cache 72"),
        "{e}"
    );
    // A context far too long for the box, with everything else unchanged.
    let e = error_of(&edited("ctx_size = 2048", "ctx_size = 32768"));
    assert!(e.contains("lower server.ctx_size/server.parallel"), "{e}");
}

#[test]
fn limits_must_protect_the_weights_and_be_ordered() {
    let e = error_of(&edited("min_mib = 256", "min_mib = 128"));
    assert!(
        e.contains("min_mib = 128 does not protect the model's 242 MiB"),
        "{e}"
    );
    let e = error_of(&edited("max_mib = 640", "max_mib = 560"));
    assert!(
        e.contains("min_mib <= low_mib <= high_mib <= max_mib"),
        "{e}"
    );
}

#[test]
fn earlyoom_thresholds_below_the_protected_share_are_refused() {
    let e = error_of(&edited("mem_kill_percent = 36", "mem_kill_percent = 10"));
    assert!(e.contains("mem_kill_percent = 10 would never fire"), "{e}");
    assert!(e.contains("at least 35"), "{e}");
    let e = error_of(&edited(
        r#"prefer = ["apt""#,
        r#"prefer = ["systemd-journald""#,
    ));
    assert!(e.contains("cut to their first 15 characters"), "{e}");
}

#[test]
fn egress_must_reach_the_metadata_service() {
    let e = error_of(&edited(
        r#"egress_cidrs = ["169.254.169.254/32"]"#,
        r#"egress_cidrs = ["10.0.0.0/8"]"#,
    ));
    assert!(e.contains("add `169.254.169.254/32`"), "{e}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = edited("algorithm = \"zstd\"", "algorithm = \"brotli\"").replacen(
        "\"vm.swappiness\" = 10",
        "\"vm/swappiness\" = 10",
        1,
    );
    let e = error_of(&text);
    assert!(e.contains("zram.algorithm `brotli` is not one of"), "{e}");
    assert!(
        e.contains("sysctl `vm/swappiness` is not a sysctl name"),
        "{e}"
    );
}
