//! Loading the profile: the shipped one is valid, and each kind of mistake is refused with a
//! message naming the key and the fix; and the memory rule against a given plan (the real
//! planner's in server_plan.rs).

use std::path::Path;

use appliance::plan::ServerPlan;
use appliance::profile::{Profile, SysctlValue};

const E2_MICRO: &str = include_str!("../../profiles/e2-micro.toml");

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
    assert_eq!(p.model.file, test_support::SMOLLM2_MODEL_FILE);
    assert_eq!(p.model.size_bytes, 98_362_432);
    assert_eq!(p.server.api_port.0, 8080);
    assert_eq!(p.sysctl["vm.page-cluster"], SysctlValue::Int(0));
    assert_eq!(p.source, E2_MICRO);
    assert_eq!(
        p.model_path(),
        "/var/lib/llm/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    );
}

/// A plan of the appliance's model at the shipped profile's 4096 tokens x 2 slots, as
/// `llm-server plan --json` printed it when this was written. Its numbers need not stay current
/// with the planner: server_plan.rs holds the profile to the real one.
fn plan() -> ServerPlan {
    ServerPlan::parse(
        r#"{
            "model": "/root/.cache/llm-appliance/models/SmolLM2-135M-Instruct.Q4_1.gguf",
            "ctx_size": 4096, "parallel": 2, "n_ctx_train": 8192,
            "weights_bytes": 96576768, "kv_cache_bytes": 188743680, "scratch_bytes": 56404480,
            "vocabulary_bytes": 19243607, "total_bytes": 360968535,
            "limits": [], "fits": true
        }"#,
    )
    .unwrap()
}

fn plan_error_of(text: &str, plan: &ServerPlan) -> String {
    Profile::parse(text, Path::new("test.toml"))
        .unwrap()
        .memory_limits(plan)
        .expect_err("the plan should not fit")
        .to_string()
}

#[test]
fn the_shipped_profile_holds_the_plan() {
    let p = Profile::parse(E2_MICRO, Path::new("e2-micro.toml")).unwrap();
    let l = p.memory_limits(&plan()).unwrap();
    // The shipped policy gives the limits the profile had when they were absolute.
    assert_eq!(
        (l.min_mib, l.low_mib, l.high_mib, l.max_mib),
        (96, 384, 512, 576)
    );
    // A store path (`<hash>-<file>`, as the NixOS module gives the planner) is the same model.
    let mut in_store = plan();
    in_store.model = "/nix/store/0123abcd-SmolLM2-135M-Instruct.Q4_1.gguf".into();
    assert_eq!(p.memory_limits(&in_store).unwrap(), l);
}

/// Issue #44: a file a few MiB larger than the one the profile was written for builds, its
/// limits following it; one the machine cannot hold is refused with the plan's figures.
#[test]
fn the_limits_follow_a_larger_file_and_a_file_that_cannot_fit_is_refused() {
    let p = Profile::parse(E2_MICRO, Path::new("e2-micro.toml")).unwrap();
    let mut larger = plan();
    larger.weights_bytes += 4 << 20;
    larger.total_bytes += 4 << 20;
    let l = p.memory_limits(&larger).unwrap();
    assert_eq!(
        (l.min_mib, l.low_mib, l.high_mib, l.max_mib),
        (100, 388, 516, 580)
    );

    // 1024 MiB of RAM: MemoryMax must stay below it. 3 + 39 MiB of margin and 32 for the
    // process: a plan of 800 MiB gives MemoryMax 800 + 32 + 135 + 64 = 1031.
    let mut huge = plan();
    huge.weights_bytes = 600 << 20;
    huge.total_bytes = 800 << 20;
    let e = plan_error_of(E2_MICRO, &huge);
    assert!(
        e.contains("the model does not fit machine.ram_mib = 1024: MemoryMax would be 1031 MiB"),
        "{e}"
    );
    assert!(
        e.contains(
            "the server's 832 MiB (weights 600 + KV cache 180 + scratch 54 + vocabulary 19 MiB \
             as llm-server plans them, + 32 MiB for the process itself)"
        ),
        "{e}"
    );
    assert!(
        e.contains("serve a smaller model or lower server.ctx_size"),
        "{e}"
    );
    // 600 MiB of protected weights also blind earlyoom's 36 % kill line (of MemTotal 965 MiB).
    assert!(
        e.contains(
            "earlyoom.mem_kill_percent = 36 would never fire in time: its line is 347 MiB (36 % \
             of machine.mem_total_mib = 965) and MemAvailable counts the server's protected 603 \
             MiB"
        ),
        "{e}"
    );
    // (603 + 48) MiB of 965.
    assert!(e.contains("at 651 MiB"), "{e}");
    assert!(e.contains("at least 68"), "{e}");
}

#[test]
fn a_plan_of_another_model_context_or_slots_is_refused() {
    for (what, edit) in [
        (
            "model",
            (|p: &mut ServerPlan| p.model = "/m/qwen.gguf".into()) as fn(&mut ServerPlan),
        ),
        ("context", |p| p.ctx_size = 2048),
        ("slots", |p| p.parallel = 1),
    ] {
        let mut other = plan();
        edit(&mut other);
        let e = plan_error_of(E2_MICRO, &other);
        assert!(
            e.contains("but the profile serves `SmolLM2-135M-Instruct.Q4_1.gguf` at 4096 x 2"),
            "{what}: {e}"
        );
        assert!(
            e.contains("`llm-server plan --json --model SmolLM2-135M-Instruct.Q4_1.gguf --ctx-size 4096 --parallel 2`"),
            "{what}: {e}"
        );
    }
}

#[test]
fn unknown_keys_are_refused() {
    let e = error_of(&edited("ram_mib = 1024", "ram_mib = 1024\nram_gb = 1"));
    assert!(e.contains("unknown field `ram_gb`"), "{e}");
    assert!(e.contains("test.toml"), "{e}");
    // The model's shape is the planner's to read from the file, no longer the profile's.
    let e = error_of(&edited(
        "size_bytes = 98362432",
        "size_bytes = 98362432\nlayers = 30",
    ));
    assert!(e.contains("unknown field `layers`"), "{e}");
}

#[test]
fn headroom_below_earlyooms_term_line_is_refused() {
    // 42 % of MemTotal 965 MiB is 405 MiB: an idle box with 400 MiB available would be killing.
    let e = error_of(&edited("headroom_mib = 512", "headroom_mib = 400"));
    assert!(e.contains("machine.headroom_mib = 400"), "{e}");
    assert!(e.contains("term line (405 MiB"), "{e}");
    // More than the box has at all.
    let e = error_of(&edited("headroom_mib = 512", "headroom_mib = 965"));
    assert!(e.contains("machine.mem_total_mib = 965"), "{e}");
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
fn the_absolute_form_is_refused_with_the_relative_keys() {
    let text = edited("min_over_weights_mib = 3", "min_mib = 96");
    let e = error_of(&text);
    assert!(
        e.contains("gives [server.memory] as absolute limits (min_mib)"),
        "{e}"
    );
    assert!(
        e.contains("min_over_weights_mib (MemoryMin = weights + it)"),
        "{e}"
    );
    assert!(
        e.contains("high_over_need_mib (MemoryHigh = plan + 32 MiB"),
        "{e}"
    );
}

#[test]
fn bad_margins_are_refused_naming_the_key() {
    let e = error_of(&edited("low_over_plan_mib = 39", "low_over_plan_mib = -1"));
    assert!(e.contains("low_over_plan_mib"), "{e}");
    let e = error_of(&edited(
        "max_over_high_mib = 64",
        "max_over_high_mib = \"64M\"",
    ));
    assert!(e.contains("max_over_high_mib"), "{e}");
    let e = error_of(&edited("max_over_high_mib = 64", ""));
    assert!(e.contains("missing field `max_over_high_mib`"), "{e}");
    let e = error_of(&edited(
        "min_over_weights_mib = 3",
        "min_over_weights_mib = 1024",
    ));
    assert!(
        e.contains("server.memory.min_over_weights_mib = 1024 is not below machine.ram_mib"),
        "{e}"
    );
    // Whatever the model, 32 + 135 + 900 MiB is more than the machine.
    let e = error_of(&edited("max_over_high_mib = 64", "max_over_high_mib = 900"));
    assert!(e.contains("MemoryMax would be at least 1067 MiB"), "{e}");
    // MemoryLow would sit above MemoryHigh (the plan + 32 + 135).
    let e = error_of(&edited("low_over_plan_mib = 39", "low_over_plan_mib = 200"));
    assert!(
        e.contains("low_over_plan_mib = 200 would put MemoryLow above MemoryHigh"),
        "{e}"
    );
    // MemoryMin above MemoryLow shows only against a plan: of weights alone, 93 + 50 > 93 + 39.
    let mut weights_only = plan();
    weights_only.total_bytes = weights_only.weights_bytes;
    let e = plan_error_of(
        &edited("min_over_weights_mib = 3", "min_over_weights_mib = 50"),
        &weights_only,
    );
    assert!(
        e.contains("puts MemoryMin (143 MiB) above MemoryLow (132 MiB"),
        "{e}"
    );
}

#[test]
fn earlyoom_thresholds_below_the_protected_share_are_refused() {
    // On load, against the least MemoryMin can be (the margin alone): 5 % of 965 MiB is 48,
    // under 3 + 48.
    let e = error_of(&edited("mem_kill_percent = 36", "mem_kill_percent = 5"));
    assert!(e.contains("mem_kill_percent = 5 would never fire"), "{e}");
    assert!(e.contains("whatever the model"), "{e}");
    assert!(e.contains("at least 6"), "{e}");
    // At build time, against the resolved MemoryMin: 14 % of 965 is 135, under 93 + 3 + 48;
    // 15 % (144) is enough.
    let e = plan_error_of(
        &edited("mem_kill_percent = 36", "mem_kill_percent = 14"),
        &plan(),
    );
    assert!(
        e.contains("protected 96 MiB (MemoryMin: the model's 93 MiB of weights"),
        "{e}"
    );
    assert!(e.contains("at least 15"), "{e}");
    let at_15 = edited("mem_kill_percent = 36", "mem_kill_percent = 15");
    let limits = Profile::parse(&at_15, Path::new("test.toml"))
        .unwrap()
        .memory_limits(&plan())
        .unwrap();
    assert_eq!(limits.min_mib, 96);
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

#[test]
fn no_keys_or_no_tls_on_a_public_api_is_refused_naming_the_fix() {
    let e = error_of(&edited(r#"api_keys = "metadata""#, r#"api_keys = "none""#));
    assert!(
        e.contains("server.api_keys = \"none\" leaves the API open to the public internet"),
        "{e}"
    );
    assert!(e.contains("0.0.0.0/0, ::/0"), "{e}");
    assert!(e.contains("use \"metadata\" or \"generate\""), "{e}");
    let e = error_of(&edited(r#"tls = "metadata""#, r#"tls = "none""#));
    assert!(e.contains("server.tls = \"none\""), "{e}");
    // One public network among private ones is enough to refuse.
    let text = edited(
        r#"api_cidrs = ["0.0.0.0/0", "::/0"]"#,
        r#"api_cidrs = ["10.0.0.0/8", "203.0.113.0/24"]"#,
    )
    .replacen(r#"api_keys = "metadata""#, r#"api_keys = "none""#, 1);
    assert!(error_of(&text).contains("203.0.113.0/24"));
    // Private networks only: allowed, with the warning.
    let text = edited(
        r#"api_cidrs = ["0.0.0.0/0", "::/0"]"#,
        r#"api_cidrs = ["10.0.0.0/8", "fd00::/8"]"#,
    )
    .replacen(r#"api_keys = "metadata""#, r#"api_keys = "none""#, 1);
    let p = Profile::parse(&text, Path::new("private.toml")).unwrap();
    assert!(
        p.warnings()[0].contains("without a key"),
        "{:?}",
        p.warnings()
    );
    let e = error_of(&edited(r#"api_keys = "metadata""#, r#"api_keys = "maybe""#));
    assert!(e.contains("unknown variant `maybe`"), "{e}");
}

#[test]
fn absurd_limits_are_refused() {
    for (from, to, want) in [
        ("burst = 10", "burst = 0", "server.limits.burst = 0"),
        (
            "max_connections = 64",
            "max_connections = 0",
            "max_connections = 0",
        ),
        (
            "header_timeout_sec = 10",
            "header_timeout_sec = 0",
            "header_timeout_sec = 0 must be 1 to 86400",
        ),
        (
            "body_timeout_sec = 30",
            "body_timeout_sec = 9999999",
            "body_timeout_sec = 9999999",
        ),
        (
            "default_max_tokens = 256",
            "default_max_tokens = 8192",
            "must be 1 to server.ctx_size (4096)",
        ),
        (
            "cors_origins = []",
            r#"cors_origins = ["https://a.example/path"]"#,
            "is not an origin",
        ),
        (
            "cors_origins = []",
            r#"cors_origins = ["*"]"#,
            "`*` is not an origin",
        ),
        ("burst = 10", "burst = -1", "invalid value"),
        (
            "max_connections_per_ip = 8",
            "max_connections_per_ip = 64",
            "max_connections_per_ip = 64 must be 1 to max_connections - 1 (63)",
        ),
        (
            "max_connections_per_ip = 8",
            "max_connections_per_ip = 0",
            "max_connections_per_ip = 0 must be 1",
        ),
        (
            "idle_timeout_sec = 30",
            "idle_timeout_sec = 0",
            "idle_timeout_sec = 0 must be 1 to 86400",
        ),
        (
            "max_connection_age_sec = 900",
            "max_connection_age_sec = 20",
            "max_connection_age_sec = 20 is shorter than idle_timeout_sec = 30",
        ),
        (
            "grammar_compiles = 1",
            "grammar_compiles = 0",
            "grammar_compiles = 0 would refuse every request",
        ),
        (
            "max_tokenize_bytes = 262144",
            "max_tokenize_bytes = 0",
            "max_tokenize_bytes = 0",
        ),
        (
            "api_syn_burst = 20",
            "api_syn_burst = 0",
            "network.api_syn_burst = 0 would drop every connection",
        ),
        // The kernel's meter must not bind before the server's own cap, which answers.
        (
            "api_connections_per_source = 16",
            "api_connections_per_source = 4",
            "network.api_connections_per_source = 4 is below \
             server.limits.max_connections_per_ip = 8",
        ),
        (
            "write_timeout_sec = 30",
            "",
            "missing field `write_timeout_sec`",
        ),
    ] {
        let e = error_of(&edited(from, to));
        assert!(e.contains(want), "{to}: {e}");
    }
}

/// Values that would divide by zero or overflow a product are refused with an error, never a
/// panic or a silent wrap (the tests build in debug, where an overflow panics).
#[test]
fn absurd_sizes_are_errors_not_panics() {
    for (from, to, want) in [
        (
            "ram_mib = 1024",
            "ram_mib = 0",
            "machine.ram_mib = 0 is below",
        ),
        (
            "ram_mib = 1024",
            "ram_mib = 18446744073709551615",
            "more than 1073741824 MiB",
        ),
        (
            "mem_total_mib = 965",
            "mem_total_mib = 0",
            "machine.mem_total_mib = 0 must be 1 to machine.ram_mib (1024)",
        ),
        (
            "mem_total_mib = 965",
            "mem_total_mib = 18446744073709551615",
            "machine.mem_total_mib = 18446744073709551615 must be 1 to",
        ),
        (
            "min_over_weights_mib = 3",
            "min_over_weights_mib = 18446744073709551615",
            "min_over_weights_mib = 18446744073709551615 is not below",
        ),
        (
            "max_over_high_mib = 64",
            "max_over_high_mib = 18446744073709551615",
            "max_over_high_mib = 18446744073709551615 is not below",
        ),
        (
            "headroom_mib = 512",
            "headroom_mib = 18446744073709551615",
            "machine.headroom_mib",
        ),
        (
            "max_mib = 384",
            "max_mib = 18446744073709551615",
            "zram.max_mib",
        ),
        (
            "percent_of_ram = 50",
            "percent_of_ram = 18446744073709551615",
            "percent_of_ram",
        ),
        (
            "ram_mib = 1024",
            "ram_mib = 18446744073709551616",
            "expected u64",
        ),
        (
            "ctx_size = 4096",
            "ctx_size = 0",
            "ctx_size and server.parallel must be at least 1",
        ),
    ] {
        let text = edited(from, to);
        let result = std::panic::catch_unwind(|| Profile::parse(&text, Path::new("test.toml")));
        let e = result
            .unwrap_or_else(|_| panic!("loading `{to}` panicked"))
            .expect_err("refused")
            .to_string();
        assert!(e.contains(want), "{to}: {e}");
    }
}
