//! The Nix package's source follows the Cargo workspace: nix/workspace-src.nix, evaluated with
//! plain `nix-instantiate` (no nixpkgs), yields exactly the root Cargo.toml's `[workspace]
//! members`, each a crate directory, and nix/package.nix takes its source from that file rather
//! than from a list of its own. A workspace member missing from the source is what made cargo
//! fail to load the workspace in `nix build`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// `nix-instantiate` with `args`, run in the workspace root. A missing binary fails the test:
/// the check must run, not be skipped. The evaluation copies nothing into a store, so it runs on
/// the `dummy://` store: no Nix daemon, no writable /nix, any user.
fn nix_instantiate(args: &[&str]) -> Output {
    match Command::new("nix-instantiate")
        .args(["--store", "dummy://"])
        .args(args)
        .current_dir(root())
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "nix-instantiate is not on PATH, and this test needs it to evaluate \
             nix/workspace-src.nix: install it (Debian/Ubuntu: `apt-get install nix-bin`)"
        ),
        Err(e) => panic!("cannot run nix-instantiate: {e}"),
    }
}

/// Evaluates `args` strictly to JSON and returns it; fails the test on an evaluation error.
fn eval_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--eval", "--strict", "--json"];
    all.extend_from_slice(args);
    let out = nix_instantiate(&all);
    assert!(
        out.status.success(),
        "nix-instantiate {all:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nix-instantiate {all:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap_or_else(|| panic!("not a string: {v}"))
                .to_owned()
        })
        .collect()
}

/// The `members` array of the `[workspace]` table, read minimally: the quoted strings between
/// `members = [` and the closing `]`, over one line or several, with `#` comments ignored.
fn cargo_members(manifest: &str) -> Vec<String> {
    let mut in_workspace = false;
    let mut list: Option<String> = None;
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(list) = list.as_mut() {
            list.push_str(line);
            if line.contains(']') {
                break;
            }
            continue;
        }
        if line.starts_with('[') {
            in_workspace = line == "[workspace]";
            continue;
        }
        if in_workspace {
            if let Some(rest) = line.strip_prefix("members") {
                let rest = rest.trim_start();
                let rest = rest
                    .strip_prefix('=')
                    .expect("`members` is followed by `=`");
                list = Some(rest.trim().to_owned());
                if rest.contains(']') {
                    break;
                }
            }
        }
    }
    let list = list.expect("the root Cargo.toml has `[workspace] members`");
    let inner = list
        .trim()
        .strip_prefix('[')
        .and_then(|l| l.split(']').next())
        .expect("`members` is an array");
    inner
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| m.trim_matches('"').to_owned())
        .collect()
}

#[test]
fn the_parser_reads_one_line_and_several() {
    assert_eq!(
        cargo_members("[package]\nmembers = [\"no\"]\n[workspace]\nmembers = [\"a\", \"b/c\"]\n"),
        ["a", "b/c"]
    );
    assert_eq!(
        cargo_members("[workspace]\nresolver = \"2\"\nmembers = [\n  \"a\", # one\n  \"b\",\n]\nexclude = [\"x\"]\n"),
        ["a", "b"]
    );
}

#[test]
fn the_nix_source_has_exactly_the_workspace_members() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let want = cargo_members(&manifest);
    assert!(!want.is_empty(), "no workspace members in Cargo.toml");

    let members = strings(&eval_json(&["--attr", "members", "nix/workspace-src.nix"]));
    assert_eq!(
        members, want,
        "nix/workspace-src.nix and the root Cargo.toml disagree on the workspace members"
    );
    for member in &members {
        let dir = root().join(member);
        assert!(dir.is_dir(), "workspace member {member} is not a directory");
        assert!(
            dir.join("Cargo.toml").is_file(),
            "workspace member {member} has no Cargo.toml"
        );
    }

    // The paths the source is made of: the manifest, the lock file and the members, nothing else
    // (in particular not testdata/ with its models).
    let paths = strings(&eval_json(&[
        "--expr",
        "map toString (import ./nix/workspace-src.nix { }).paths",
    ]));
    let root = root();
    let mut want_paths: Vec<String> = ["Cargo.toml", "Cargo.lock"]
        .iter()
        .map(|p| p.to_string())
        .chain(want.iter().cloned())
        .map(|p| root.join(p).display().to_string())
        .collect();
    let mut paths_sorted = paths.clone();
    paths_sorted.sort();
    want_paths.sort();
    assert_eq!(paths_sorted, want_paths);
}

#[test]
fn a_glob_member_fails_the_evaluation() {
    let dir = std::env::temp_dir().join(format!("xtask-nix-package-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        "[workspace]\nmembers = [\"server\", \"crates/*\"]\n",
    )
    .unwrap();
    let out = nix_instantiate(&[
        "--eval",
        "--strict",
        "--json",
        "--attr",
        "members",
        "--arg",
        "root",
        &dir.display().to_string(),
        "nix/workspace-src.nix",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a glob member evaluated: {stderr}");
    assert!(
        stderr.contains("\"crates/*\" is a glob"),
        "unexpected error: {stderr}"
    );
}

#[test]
fn package_nix_takes_its_source_from_the_workspace_file() {
    let package = std::fs::read_to_string(root().join("nix/package.nix")).unwrap();
    let code: String = package
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        code.contains("import ./workspace-src.nix"),
        "nix/package.nix does not import ./workspace-src.nix"
    );
    assert!(
        code.contains(").paths"),
        "nix/package.nix does not use the workspace file's `paths`"
    );
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    for member in cargo_members(&manifest) {
        assert!(
            !code.contains(&format!("../{member}")),
            "nix/package.nix names ../{member} itself: the members come from nix/workspace-src.nix"
        );
    }
    // Not a source fileset of its own besides: the only `toSource` is the workspace one.
    assert_eq!(code.matches("lib.fileset.toSource").count(), 1);
}
