//! The memory rule against the server's own planner: `llm-server plan --json`, run as the image
//! builders run it (`appliance::plan::args`) on the default model, gives the planner's numbers,
//! and the shipped profile's limits hold them, while a context and slots far too large for the
//! box are refused. Without this the server would refuse to start (exit 2) inside the limits
//! the image gives it, or the image would be built on numbers the server does not use.

use std::path::Path;
use std::process::Command;

use appliance::plan::{self, ServerPlan};
use appliance::Profile;
use llm_server::gguf::Gguf;
use llm_server::plan::MemoryPlan;

/// `llm-server plan --json` of `model` at `ctx_size` x `parallel`. Exit status 2 says the plan
/// does not fit this machine's own memory, which is not the question here.
fn server_plan(model: &Path, ctx_size: u32, parallel: u32) -> ServerPlan {
    let out = Command::new(test_support::llm_server_binary())
        .args(plan::args(model.to_str().unwrap(), ctx_size, parallel))
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 2)),
        "llm-server plan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ServerPlan::parse(std::str::from_utf8(&out.stdout).unwrap()).unwrap()
}

#[test]
fn the_json_plan_is_the_planners_and_the_shipped_profile_holds_it() {
    let profile = Profile::load(&test_support::default_profile()).unwrap();
    let model = test_support::appliance_model();
    assert_eq!(
        model.file_name().unwrap().to_str().unwrap(),
        profile.model.file
    );
    let s = &profile.server;
    let json = server_plan(&model, s.ctx_size, s.parallel);
    let gguf = Gguf::open(&model).unwrap();
    let planner =
        MemoryPlan::for_model_file(&gguf, s.ctx_size as usize, s.parallel as usize).unwrap();
    assert_eq!(
        json,
        ServerPlan {
            model: model.to_str().unwrap().to_owned(),
            ctx_size: s.ctx_size,
            parallel: s.parallel,
            weights_bytes: planner.weights_bytes,
            kv_cache_bytes: planner.kv_bytes,
            scratch_bytes: planner.scratch_bytes,
            vocabulary_bytes: planner.vocab_bytes,
            total_bytes: planner.total(),
        }
    );
    eprintln!(
        "server plan {} MiB (weights {}, anonymous {})",
        planner.total() >> 20,
        planner.weights_bytes >> 20,
        planner.anonymous_bytes() >> 20
    );
    profile.memory_limits(&json).unwrap();
}

#[test]
fn a_context_and_slots_far_too_large_for_the_box_are_refused() {
    let text = std::fs::read_to_string(test_support::default_profile())
        .unwrap()
        .replacen("ctx_size = 4096", "ctx_size = 32768", 1)
        .replacen("parallel = 2", "parallel = 8", 1);
    let profile = Profile::parse(&text, Path::new("big.toml")).unwrap();
    let plan = server_plan(&test_support::appliance_model(), 32768, 8);
    let e = profile.memory_limits(&plan).unwrap_err().to_string();
    assert!(
        e.contains("the model does not fit machine.ram_mib = 1024"),
        "{e}"
    );
    assert!(e.contains("lower server.ctx_size/server.parallel"), "{e}");
}

/// The unit's `RestartPreventExitStatus=` is the server's own list of statuses that a restart
/// cannot fix (server/src/exit.rs); the Nix module's copy is held to the renderer's by
/// `nix_profile::server_unit_matches`.
#[test]
fn the_unit_does_not_restart_on_the_servers_refusals() {
    let unit = appliance::render::render(&Profile::load(&test_support::default_profile()).unwrap())
        .into_iter()
        .find(|f| f.path == "/etc/systemd/system/llm-server.service")
        .expect("the server unit is rendered");
    let line = unit
        .contents
        .lines()
        .find_map(|l| l.strip_prefix("RestartPreventExitStatus="))
        .expect("the unit names the statuses not to restart on");
    let want: Vec<String> = llm_server::exit::Status::NO_RESTART
        .iter()
        .map(|s| s.code().to_string())
        .collect();
    assert_eq!(line, want.join(" "));
}

/// Every flag the unit passes (and the credentials' flags) is one the server takes: the server
/// is run with the unit's arguments and a model file that does not exist, and must get past
/// its option parser to refuse the model by name (exit 1 with its own message, not clap's).
#[test]
fn the_server_takes_every_flag_the_unit_passes() {
    let profile = Profile::load(&test_support::default_profile()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model.gguf");
    let mut args = appliance::render::server_args(&profile);
    args.extend(appliance::render::credential_args(&profile));
    let model = args.iter().position(|a| a == "--model").unwrap() + 1;
    args[model] = missing.to_str().unwrap().to_owned();
    let out = Command::new(test_support::llm_server_binary())
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(i32::from(llm_server::exit::Status::BadInput.code())),
        "{stderr}"
    );
    assert!(
        !stderr.contains("Usage:") && stderr.contains("no-such-model.gguf"),
        "the server's option parser refused the unit's arguments {args:?}:\n{stderr}"
    );
}
