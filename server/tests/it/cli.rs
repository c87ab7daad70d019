//! The `run` and `tokenize` subcommands, through the built binary, against llama.cpp's outputs
//! on the default model (golden data), and their errors on bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use llm_server::gguf::Gguf;
use llm_server::tokenizer::Tokenizer;
use serde_json::Value;

fn llm_server(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llm-server"))
        .args(args)
        .output()
        .expect("start llm-server")
}

fn model() -> String {
    test_support::default_model().display().to_string()
}

fn golden() -> Value {
    let path = test_support::testdata("gemma-3-270m-q4_k_m.golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

fn golden_prompt(name: &str) -> Value {
    golden()["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no golden prompt `{name}`"))
        .clone()
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("a list of token ids")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "llm-server failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// Runs a command that must fail; returns its stderr, after checking it printed nothing on stdout
/// and that the refusal is one line, printed once, ending in a newline.
fn failure(args: &[&str]) -> String {
    let out = llm_server(args);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        stderr.ends_with('\n') && stderr.lines().count() == 1,
        "{args:?}: the refusal should be one line ending in a newline: {stderr:?}"
    );
    assert_eq!(stderr.matches("llm-server:").count(), 1, "{stderr:?}");
    stderr
}

fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `run --temp 0` prints exactly llama.cpp's greedy continuation of the golden "capital" prompt.
#[test]
fn run_greedy_prints_exactly_the_reference_continuation() {
    let golden = golden_prompt("capital");
    let prompt = golden["prompt_text"].as_str().unwrap();
    let n = ids(&golden["greedy_tokens"]).len().to_string();
    let out = llm_server(&[
        "run",
        "--model",
        &model(),
        "--temp",
        "0",
        "-n",
        &n,
        "--prompt",
        prompt,
    ]);
    assert_eq!(stdout(&out), golden["greedy_text"].as_str().unwrap());
}

#[test]
fn run_stops_after_n_tokens() {
    let golden = golden_prompt("capital");
    let first = &ids(&golden["greedy_tokens"])[..5];
    let gguf = Gguf::open(&test_support::default_model()).unwrap();
    let expected = Tokenizer::from_metadata(&gguf.metadata)
        .unwrap()
        .decode(first, false);
    let prompt = golden["prompt_text"].as_str().unwrap();
    let out = llm_server(&[
        "run",
        "--model",
        &model(),
        "--temp",
        "0",
        "-n",
        "5",
        "--prompt",
        prompt,
    ]);
    assert_eq!(stdout(&out), expected);
}

#[test]
fn run_with_a_seed_is_reproducible() {
    let args = [
        "run",
        "--model",
        &model(),
        "--temp",
        "1.0",
        "--seed",
        "7",
        "-n",
        "12",
        "--prompt",
        "Once upon a time",
    ];
    let first = stdout(&llm_server(&args));
    assert!(!first.is_empty());
    assert_eq!(stdout(&llm_server(&args)), first);
}

#[test]
fn run_verbose_reports_speeds_on_stderr_only() {
    let out = llm_server(&[
        "run",
        "--model",
        &model(),
        "-n",
        "4",
        "--prompt",
        "Hi",
        "-v",
    ]);
    let text = stdout(&out);
    assert!(
        !text.contains("tok/s"),
        "timings leaked into stdout: {text:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prompt") && stderr.contains("tok/s"),
        "{stderr}"
    );
}

#[test]
fn tokenize_prints_the_reference_ids() {
    let golden = golden();
    let cases = golden["tokenize"].as_array().expect("tokenize cases");
    for case in cases.iter().take(4) {
        let text = case["text"].as_str().unwrap();
        let out = llm_server(&["tokenize", "--model", &model(), "--text", text]);
        let got: Vec<u32> = serde_json::from_str(&stdout(&out)).expect("a JSON array");
        assert_eq!(got, ids(&case["ids"]), "tokenizing {text:?}");
    }
}

#[test]
fn missing_model_file_is_named() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-model.gguf");
    let path = path.to_str().unwrap();
    for cmd in ["run", "tokenize"] {
        let flag = if cmd == "run" { "--prompt" } else { "--text" };
        let stderr = failure(&[cmd, "--model", path, flag, "hello"]);
        assert!(
            stderr.contains(path) && stderr.contains("No such file"),
            "{stderr}"
        );
    }
}

#[test]
fn non_gguf_file_is_refused() {
    let path = scratch_file("not-a-model.gguf", b"<html>404 Not Found</html>");
    let stderr = failure(&[
        "run",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "hello",
    ]);
    assert!(stderr.contains("not a GGUF file"), "{stderr}");
}

#[test]
fn unsupported_architecture_is_named() {
    let path = scratch_file("mamba.gguf", &gguf_with_architecture("mamba"));
    let stderr = failure(&[
        "run",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "hello",
    ]);
    assert!(
        stderr.contains("architecture `mamba` is not supported"),
        "{stderr}"
    );
}

#[test]
fn prompt_longer_than_the_context_names_both_lengths() {
    let prompt = "The quick brown fox jumps over the lazy dog, again and again and again.";
    let stderr = failure(&[
        "run",
        "--model",
        &model(),
        "--ctx-size",
        "8",
        "--prompt",
        prompt,
    ]);
    let n_prompt = stdout(&llm_server(&[
        "tokenize",
        "--model",
        &model(),
        "--text",
        prompt,
    ]))
    .matches(',')
    .count()
        + 1;
    assert!(
        stderr.contains(&format!("the prompt is {n_prompt} tokens"))
            && stderr.contains("the context holds 8"),
        "{stderr}"
    );
}

/// A GGUF v3 file with no tensors and one metadata key, `general.architecture`.
fn gguf_with_architecture(arch: &str) -> Vec<u8> {
    const STRING: u32 = 8;
    fn put_str(f: &mut Vec<u8>, s: &str) {
        f.extend((s.len() as u64).to_le_bytes());
        f.extend(s.as_bytes());
    }
    let mut f = b"GGUF".to_vec();
    f.extend(3u32.to_le_bytes()); // version
    f.extend(0u64.to_le_bytes()); // tensors
    f.extend(1u64.to_le_bytes()); // metadata keys
    put_str(&mut f, "general.architecture");
    f.extend(STRING.to_le_bytes());
    put_str(&mut f, arch);
    f
}

fn synth_files() -> Vec<PathBuf> {
    let dir = test_support::testdata_dir().join("synth");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("synth dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .gguf in {}", dir.display());
    files
}

/// Asserts `inspect` prints one row per tensor of `path`: its name and ggml type.
fn assert_inspect_lists_tensors(path: &Path) {
    let out = stdout(&llm_server(&["inspect", "--model", path.to_str().unwrap()]));
    let g = Gguf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(!g.tensors.is_empty(), "{}", path.display());
    for t in &g.tensors {
        assert!(
            out.lines().any(|l| {
                let mut cols = l.split_whitespace();
                cols.next() == Some(t.name.as_str()) && cols.next() == Some(t.ty.name())
            }),
            "{}: no row for {} ({})",
            path.display(),
            t.name,
            t.ty
        );
    }
}

/// `inspect` prints the tensor table of every synth file, also those with tensor types the
/// kernels do not read (e.g. tq1_0).
#[test]
fn inspect_prints_the_tensor_table_of_every_synth_file() {
    for path in synth_files() {
        assert_inspect_lists_tensors(&path);
    }
}

/// A file with a type the kernels do not read: `tokenize` gives llama.cpp's ids (it needs only
/// the vocabulary), and `run` refuses with one line naming the type.
#[test]
fn files_with_unread_types_tokenize_but_run_refuses_naming_the_type() {
    // A type no kernel will read (i32 has f32's block layout, so the file stays well formed),
    // so this holds however many quantisations are added.
    let llama = std::fs::read(test_support::synth("synth-llama-q4_0.gguf")).unwrap();
    let path = scratch_file(
        "synth-llama-i32-norm.gguf",
        &test_support::with_tensor_type(llama, "blk.0.attn_norm.weight", 26),
    );
    let model = path.to_str().unwrap();
    assert_inspect_lists_tensors(&path);
    let text =
        std::fs::read_to_string(test_support::synth("synth-llama-q4_0.golden.json")).unwrap();
    let golden: Value = serde_json::from_str(&text).unwrap();
    let case = &golden["tokenize"][0];
    let out = llm_server(&[
        "tokenize",
        "--model",
        model,
        "--text",
        case["text"].as_str().unwrap(),
    ]);
    let got: Vec<u32> = serde_json::from_str(&stdout(&out)).expect("a JSON array");
    assert_eq!(got, ids(&case["ids"]), "{model}");

    let stderr = failure(&["run", "--model", model, "--prompt", "hello", "-n", "1"]);
    assert!(
        stderr.contains("has type i32 (ggml id"),
        "{model}: {stderr}"
    );
    assert!(
        stderr.contains("supported types: ") && stderr.contains("re-quantize"),
        "{stderr}"
    );
}

/// A well-formed GGUF of an architecture the engine does not run still inspects and tokenizes;
/// `run` refuses with the supported list.
#[test]
fn unknown_architecture_inspects_and_tokenizes_but_run_refuses() {
    let llama = std::fs::read(test_support::synth("synth-llama-q4_0.gguf")).unwrap();
    let path = scratch_file(
        "synth-mamba.gguf",
        &test_support::with_architecture(llama, "mamba"),
    );
    let model = path.to_str().unwrap();
    assert_inspect_lists_tensors(&path);
    let out = stdout(&llm_server(&["inspect", "--model", model]));
    assert!(
        out.contains("general.architecture") && out.contains("mamba"),
        "{out}"
    );
    let out = llm_server(&["tokenize", "--model", model, "--text", "hello"]);
    let got: Vec<u32> = serde_json::from_str(&stdout(&out)).expect("a JSON array");
    assert!(!got.is_empty());
    let stderr = failure(&["run", "--model", model, "--prompt", "hello"]);
    assert!(
        stderr.contains("architecture `mamba` is not supported; supported architectures: ")
            && stderr.contains("llama")
            && stderr.contains("gemma3"),
        "{stderr}"
    );
}
