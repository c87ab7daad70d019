//! schemathesis (PyPI, pinned in xtask/python-requirements.txt) fuzzes a spawned server from its
//! own `/openapi.json`, with an API key: no 5xx and no response outside the documented schema.
//! A bounded number of examples per operation keeps it under a minute.

use std::process::Command;

use crate::serve_support::{synth_model, Server};

#[test]
fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let dir = std::env::temp_dir().join(format!("llm-schemathesis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, "sk-schemathesis\n").unwrap();
    let keys = keys.display().to_string();
    // A few tokens per generation: the fuzzer sends hundreds of requests.
    let s = Server::start(
        &synth_model(),
        &[
            "--api-key-file",
            &keys,
            "--default-max-tokens",
            "8",
            "--slot-save-path",
            dir.join("slots").to_str().unwrap(),
        ],
    );
    let url = format!("http://{}/openapi.json", s.addr);
    let out = Command::new("schemathesis")
        .current_dir(&dir)
        .args(["run", &url, "-H", "Authorization: Bearer sk-schemathesis"])
        .args(["--checks", "not_a_server_error,response_schema_conformance"])
        .args(["--max-examples", "20", "--seed", "1", "--workers", "1"])
        .args(["--generation-database", "none", "--no-shrink"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run schemathesis ({e}): put the tests' venv on PATH \
                 (cargo xtask test does; it installs xtask/python-requirements.txt)"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .split_once("SUMMARY")
        .map_or(stdout.as_ref(), |(_, s)| s);
    eprintln!("schemathesis summary:{summary}");
    assert!(
        out.status.success(),
        "schemathesis failed ({}):\n{stdout}\n{}\nserver log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    // Every route but `/openapi.json` itself, which schemathesis leaves out of a run from that
    // URL unless it is asked for by path.
    let operations = llm_server::serve::ROUTES.len() - 1;
    assert!(
        summary.contains(&format!("Selected: {operations}/{operations}"))
            && summary.contains(&format!("Tested: {operations}")),
        "{summary}"
    );
    assert!(!s.log().contains("panicked"), "{}", s.log());
    std::fs::remove_dir_all(&dir).unwrap();
}
