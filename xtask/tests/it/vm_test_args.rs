//! `cargo xtask vm-test`'s arguments are checked before the image build it may start, which
//! takes minutes: a misspelt `--only` check fails at once, naming the checks.

use std::process::Command;

#[test]
fn a_misspelt_check_fails_before_the_image_is_built() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["vm-test", "--rebuild", "--only", "memory-presure"])
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--only memory-presure: no such check")
            && stderr.contains("memory-pressure"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("==> building"),
        "built before refusing: {stderr}"
    );
}
