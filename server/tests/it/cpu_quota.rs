//! The default thread count under a real cgroup CPU quota: inside a cgroup granting 25 % of one
//! CPU, `bench` runs 1 thread and names the quota, and `serve`'s start-up line says so. Needs
//! root (to create a cpu cgroup); v1 (this development machine) and v2 (the appliance) are
//! handled.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A cpu cgroup with a quota of `quota` µs per 100 ms, removed when dropped; `test` keeps the
/// names of tests running at once apart.
struct QuotaCgroup {
    dir: PathBuf,
}

impl QuotaCgroup {
    fn new(test: &str, quota: u64) -> QuotaCgroup {
        let name = format!("llm-quota-{test}-{}-{quota}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/cpu/cgroup.procs").exists();
        let root = if v1 {
            Path::new("/sys/fs/cgroup/cpu")
        } else {
            // v2: the controller must be enabled for the root's children first.
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
            Path::new("/sys/fs/cgroup")
        };
        let dir = root.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "cannot create the cpu cgroup {} ({e}); this test needs root",
                dir.display()
            )
        });
        let cgroup = QuotaCgroup { dir };
        let written = if v1 {
            std::fs::write(cgroup.dir.join("cpu.cfs_period_us"), "100000").and_then(|()| {
                std::fs::write(cgroup.dir.join("cpu.cfs_quota_us"), quota.to_string())
            })
        } else {
            std::fs::write(cgroup.dir.join("cpu.max"), format!("{quota} 100000"))
        };
        written.unwrap_or_else(|e| {
            panic!(
                "cannot set the quota of {} ({e}); the cpu controller must be available",
                cgroup.dir.display()
            )
        });
        cgroup
    }

    /// `llm-server <args>` inside this cgroup, not started yet.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(self.dir.join("cgroup.procs"))
            .arg(crate::serve_support::binary())
            .args(args);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }
}

impl Drop for QuotaCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn model() -> String {
    test_support::default_model().to_str().unwrap().to_owned()
}

#[test]
fn bench_under_a_quota_of_a_quarter_cpu_runs_one_thread_and_names_the_quota() {
    let cgroup = QuotaCgroup::new("bench", 25_000);
    let out = cgroup.run(&[
        "bench",
        "-m",
        &model(),
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["default_threads"]["threads"], 1, "{v}");
    let reason = v["default_threads"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("cgroup cpu.") && reason.ends_with("25000 100000"),
        "{reason}"
    );
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["threads"], 1, "{r}");
        assert!(r["cpu_ms_per_token"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// 1.5 CPUs of quota make one thread, as std's `available_parallelism` rounds down: a second
/// thread would spend the half CPU waiting for the next period.
#[test]
fn a_fractional_quota_is_rounded_down() {
    let cgroup = QuotaCgroup::new("round", 150_000);
    let out = cgroup.run(&[
        "bench",
        "-m",
        &model(),
        "-p",
        "0",
        "-n",
        "1",
        "-r",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["default_threads"]["threads"], 1, "{v}");
    assert!(
        v["default_threads"]["reason"]
            .as_str()
            .unwrap()
            .ends_with("150000 100000"),
        "{v}"
    );
}

/// Stops the child when dropped, so a failed assertion leaves no server behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_logs_the_thread_count_and_the_quota_behind_it() {
    let cgroup = QuotaCgroup::new("serve", 25_000);
    let log = std::env::temp_dir().join(format!("llm-quota-serve-{}.log", std::process::id()));
    let _server = Killed(
        cgroup
            .command(&["serve", "--model", &model(), "--port", "0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("forward pass on")) {
            break line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no thread count logged in 60 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_file(&log);
    assert!(
        line.contains("forward pass on 1 thread: cgroup cpu.") && line.contains("25000 100000"),
        "{line}"
    );
}
