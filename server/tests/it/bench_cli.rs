//! `llm-server bench`: its JSON report on the default model, and its refusals of bad arguments.

use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    let model = test_support::default_model();
    Command::new(env!("CARGO_BIN_EXE_llm-server"))
        .arg("bench")
        .arg("-m")
        .arg(&model)
        .args(args)
        .output()
        .expect("start llm-server")
}

/// Refused with one line on stderr naming `what`, nothing on stdout.
fn refused(args: &[&str], what: &str) {
    let out = bench(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
    assert!(
        stderr.contains(what),
        "{args:?}: {stderr:?} should name {what}"
    );
}

#[test]
fn json_report_has_every_test_with_its_statistics() {
    let out = bench(&["-p", "8,16", "-n", "4", "-t", "1,2", "-r", "3", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["engine"], "llm-server");
    assert!(!v["cpu"].as_str().unwrap().is_empty());
    let results = v["results"].as_array().unwrap();
    let names: Vec<(String, u64)> = results
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap().to_owned(),
                r["threads"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = [1, 2]
        .into_iter()
        .flat_map(|t| ["pp8", "pp16", "tg4"].map(|n| (n.to_owned(), t)))
        .collect();
    assert_eq!(names, expected);
    for r in results {
        let samples: Vec<f64> = serde_json::from_value(r["samples"].clone()).unwrap();
        assert_eq!(samples.len(), 3, "{r}");
        let (min, med, max) = (
            r["min"].as_f64().unwrap(),
            r["median"].as_f64().unwrap(),
            r["max"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= med && med <= max, "{r}");
        assert!(samples.iter().all(|s| (min..=max).contains(s)), "{r}");
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(med, sorted[1], "{r}");
    }
    // The weights are mapped (file-backed), the KV cache and scratch anonymous.
    let anon = v["rss_anon_peak_kb"].as_u64().unwrap();
    let file = v["rss_file_peak_kb"].as_u64().unwrap();
    assert!(
        anon > 1024 && file > 100 * 1024,
        "anon {anon} kB, file {file} kB"
    );
    assert!(v["vm_hwm_kb"].as_u64().unwrap() >= file);
}

/// Every decode test (single and batched) reports the weight bandwidth its median implies, from
/// the report's bytes per token; prefill tests do not. No probe runs without `--read-bandwidth`.
#[test]
fn decode_tests_report_the_weight_bandwidth_they_imply() {
    let out = bench(&["-p", "8", "-n", "4", "-s", "1,2", "-r", "1", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bytes = v["weight_bytes_per_token"].as_u64().unwrap();
    // The default model's layers and its tied 262144-row output matrix: about 246 MB, less than
    // the file (whose norms, vocabulary and metadata a token does not read).
    let file = std::fs::metadata(test_support::default_model())
        .unwrap()
        .len();
    assert!(bytes > file * 9 / 10 && bytes < file, "{bytes} of {file}");
    assert!(v.get("read_bandwidth").is_none(), "{v}");
    for r in v["results"].as_array().unwrap() {
        let test = r["test"].as_str().unwrap();
        if test.starts_with("pp") {
            assert!(r.get("gb_per_s").is_none(), "{r}");
            continue;
        }
        let streams = if test.ends_with("x2") { 2.0 } else { 1.0 };
        let gb = r["gb_per_s"].as_f64().unwrap();
        let want = bytes as f64 * r["median"].as_f64().unwrap() / streams / 1e9;
        assert!(
            gb > 0.0 && (gb - want).abs() <= 0.01 * want + 0.01,
            "{r}: want {want}"
        );
    }
}

/// `--read-bandwidth` alone (`-p 0 -n 0`) probes both sources at 1 thread and at every `-t`
/// count, with `-r` samples each, whose best and median are among them.
#[test]
fn read_bandwidth_probe_reports_both_sources_at_every_thread_count() {
    let out = bench(&[
        "-p",
        "0",
        "-n",
        "0",
        "-t",
        "2",
        "-r",
        "3",
        "--read-bandwidth",
        "--read-bandwidth-mib",
        "32",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"].as_array().unwrap().len(), 0);
    let file = std::fs::metadata(test_support::default_model())
        .unwrap()
        .len();
    let probe = v["read_bandwidth"].as_array().unwrap();
    let seen: Vec<(&str, u64, u64)> = probe
        .iter()
        .map(|b| {
            (
                b["source"].as_str().unwrap(),
                b["threads"].as_u64().unwrap(),
                b["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let mib32 = 32 << 20;
    assert_eq!(
        seen,
        [
            ("anonymous", 1, mib32),
            ("model_file", 1, file),
            ("anonymous", 2, mib32),
            ("model_file", 2, file),
        ]
    );
    for b in probe {
        let samples: Vec<f64> = serde_json::from_value(b["samples_gb_per_s"].clone()).unwrap();
        let (best, median) = (
            b["best_gb_per_s"].as_f64().unwrap(),
            b["median_gb_per_s"].as_f64().unwrap(),
        );
        assert_eq!(samples.len(), 3, "{b}");
        assert!(samples.iter().all(|&s| s > 0.0), "{b}");
        assert!(samples.contains(&best) && samples.contains(&median), "{b}");
        assert!(samples.iter().all(|&s| s <= best) && median <= best, "{b}");
    }
    let table = bench(&[
        "-p",
        "0",
        "-n",
        "0",
        "-r",
        "1",
        "--read-bandwidth",
        "--read-bandwidth-mib",
        "16",
    ]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.status.success()
            && text.contains("| anonymous | 1 | 16 |")
            && text.contains("| model_file | 1 |"),
        "{text}"
    );
}

/// Without -t the tests run at the default thread count, which the table names with its reason.
#[test]
fn table_output_names_the_tests() {
    let out = bench(&["-p", "8", "-n", "2", "-r", "1"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let threads = text
        .lines()
        .find_map(|l| l.strip_prefix("default threads: "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no default thread count in\n{text}"));
    assert!(
        out.status.success()
            && text.contains(&format!("| pp8 | {threads} |"))
            && text.contains(&format!("| tg2 | {threads} |"))
            && text.contains("| CPU ms/token |")
            && text.contains("weights read per token:"),
        "{text}"
    );
}

/// CPU time per token is reported beside tok/s: positive, and at most wall time × threads
/// (plus getrusage's tick of slack), since the process cannot use more CPUs than it runs.
#[test]
fn every_test_reports_its_cpu_time_per_token() {
    let out = bench(&["-p", "16", "-n", "4", "-t", "1,2", "-r", "1", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for r in v["results"].as_array().unwrap() {
        let cpu_ms = r["cpu_ms_per_token"].as_f64().unwrap();
        let wall_ms = 1000.0 / r["median"].as_f64().unwrap();
        let threads = r["threads"].as_f64().unwrap();
        let busy = r["cpu_utilisation"].as_f64().unwrap();
        assert!(cpu_ms > 0.0, "{r}");
        assert!(cpu_ms <= wall_ms * threads * 1.1 + 1.0, "{r}");
        assert!(busy > 0.0 && busy <= threads + 0.1, "{r}");
    }
}

/// `-s 3` adds a batched test after the single-stream one, counting the tokens of all three
/// streams.
#[test]
fn streams_add_a_batched_decode_test() {
    let out = bench(&["-p", "0", "-n", "4", "-s", "1,3", "-r", "1", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tests: Vec<(String, u64)> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap().to_owned(),
                r["tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(tests, [("tg4".to_owned(), 4), ("tg4x3".to_owned(), 12)]);
}

#[test]
fn bad_arguments_are_refused_with_the_cause() {
    refused(&["-t", "0"], "--threads must be at least 1");
    refused(&["-r", "0"], "--repetitions must be at least 1");
    refused(&["-p", "0", "-n", "0"], "nothing to measure");
    refused(
        &["--read-bandwidth", "--read-bandwidth-mib", "0"],
        "--read-bandwidth-mib must be at least 1",
    );
    refused(&["--read-bandwidth-mib", "64"], "--read-bandwidth");
    refused(&["-p", "x"], "invalid value 'x'");
    refused(&["-p", "100000000"], "lower -p/-n");
    refused(&["-s", "0"], "--streams 0: give between 1 and");
    refused(&["-s", "1,1000"], "--streams 1000: give between 1 and");
    let out = Command::new(env!("CARGO_BIN_EXE_llm-server"))
        .args(["bench", "-m", "/nonexistent.gguf"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/nonexistent.gguf"),
        "{stderr}"
    );
}
