//! The CPU guard, under QEMU's user-mode emulator with named CPU models: a pre-Haswell CPU gets
//! the message and exit status 3 (not SIGILL), a Haswell runs normally.

use std::process::Command;

use llm_server::cpu::MESSAGE;
use llm_server::exit::Status;

fn run_on(cpu: &str) -> std::process::Output {
    Command::new("qemu-x86_64")
        .args(["-cpu", cpu, env!("CARGO_BIN_EXE_llm-server"), "--version"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run qemu-x86_64 ({e}); install it with `apt-get install qemu-user`")
        })
}

#[test]
fn a_cpu_without_avx2_is_refused_with_the_message_and_status_3() {
    for cpu in ["Westmere", "SandyBridge"] {
        let out = run_on(cpu);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(i32::from(Status::CpuUnsupported.code())),
            "{cpu}: {:?}\n{stderr}",
            out.status
        );
        assert!(stderr.contains(MESSAGE), "{cpu}: {stderr}");
        assert!(out.stdout.is_empty(), "{cpu} printed on stdout");
    }
}

#[test]
fn a_haswell_runs() {
    let out = run_on("Haswell");
    assert!(
        out.status.success(),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("llm-server "));
}
