//! The memory plan against a real cgroup limit: `serve` refuses a plan that cannot fit with
//! status 2 and the table, `plan --ctx-size auto` picks a context that fits. Needs root (to
//! create a memory cgroup); v1 (this development machine) and v2 (the appliance) are handled.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

/// A memory cgroup with a limit, removed when dropped.
struct LimitedCgroup {
    dir: PathBuf,
    limit_file: &'static str,
}

impl LimitedCgroup {
    fn new(limit: u64) -> LimitedCgroup {
        let name = format!("llm-serve-test-{}-{limit}", std::process::id());
        let (dir, limit_file) = if Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
            (
                Path::new("/sys/fs/cgroup/memory").join(name),
                "memory.limit_in_bytes",
            )
        } else {
            (Path::new("/sys/fs/cgroup").join(name), "memory.max")
        };
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "cannot create the memory cgroup {} ({e}); this test needs root",
                dir.display()
            )
        });
        std::fs::write(dir.join(limit_file), limit.to_string()).unwrap();
        LimitedCgroup { dir, limit_file }
    }

    /// Runs `llm-server <args>` inside this cgroup.
    fn run(&self, args: &[&str]) -> Output {
        let procs = self.dir.join("cgroup.procs");
        Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(&procs)
            .arg(crate::serve_support::binary())
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn serve_refuses_a_plan_over_the_cgroup_limit_with_status_2() {
    let model = test_support::default_model();
    let cgroup = LimitedCgroup::new(128 * MIB);
    let port = crate::serve_support::free_port().to_string();
    let out = cgroup.run(&[
        "serve",
        "--model",
        model.to_str().unwrap(),
        "--port",
        &port,
        "--ctx-size",
        "4096",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("weights (file-backed"), "{stderr}");
    assert!(stderr.contains("KV cache"), "{stderr}");
    assert!(
        stderr.contains(&format!("{} ({})", cgroup.limit_file, cgroup.dir.display())),
        "{stderr}"
    );
    assert!(stderr.contains("128.0 MiB   short by"), "{stderr}");
    assert!(stderr.contains("does not fit"), "{stderr}");
}

#[test]
fn plan_auto_picks_the_largest_context_under_the_limit() {
    let model = test_support::default_model();
    let model = model.to_str().unwrap();
    // The weights, vocabulary (with the grammar engine's trie) and scratch (with two slots'
    // worst-case grammars) of the default model take about 375 MiB; leave room for a modest
    // context but not the 32k training context.
    let cgroup = LimitedCgroup::new(400 * MIB);
    let out = cgroup.run(&[
        "plan",
        "--model",
        model,
        "--ctx-size",
        "auto",
        "--parallel",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n_ctx: usize = stdout
        .split("context ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no context in {stdout}"));
    assert!(
        (256..32768).contains(&n_ctx) && n_ctx.is_multiple_of(256),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: fits"), "{stdout}");

    // One step larger must not fit: `auto` picked the largest.
    let larger = (n_ctx + 256).to_string();
    let out = cgroup.run(&[
        "plan",
        "--model",
        model,
        "--ctx-size",
        &larger,
        "--parallel",
        "2",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
