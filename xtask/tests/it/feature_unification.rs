//! One compiled set of dependencies for the tests and the image: `cargo test --workspace`
//! resolves the server's dependencies with every member's (dev-)dependencies' features,
//! `cargo build -p llm-server` (the image build) with the
//! server's own. Where the two differ, the dependency and everything above it (ring, rustls,
//! the server's library: ten minutes of release build on two cores) is compiled twice; this
//! test names the dependency and the features to add to server/Cargo.toml (as its `bitflags`
//! line does) when they drift apart. The server's own features are left out: the tests' build
//! turns on `test-hooks` and the image's does not, on purpose, so that the shipped binary
//! carries no test hook; that costs one more compile of the server crate alone.

use std::collections::{BTreeMap, BTreeSet};

/// `package version` → its enabled features, from `cargo tree` with `args`.
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let out = test_support::cargo()
        .args([
            "tree",
            "--offline",
            "--prefix",
            "none",
            "--format",
            "{p}|{f}",
        ])
        .args(["--target", "x86_64-unknown-linux-gnu"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        // A trailing " (*)" marks a repeat.
        let line = line.trim_end_matches(" (*)");
        let Some((package, features)) = line.split_once('|') else {
            continue;
        };
        // "name v1.2.3 (/path)" for workspace members, "name v1.2.3" for the others.
        let id: Vec<&str> = package.split_whitespace().take(2).collect();
        let entry = map.entry(id.join(" ")).or_default();
        entry.extend(
            features
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_owned),
        );
    }
    map
}

#[test]
fn the_server_alone_resolves_the_features_the_workspace_tests_resolve() {
    let alone = features(&["-p", "llm-server", "-e", "normal,build"]);
    let workspace = features(&["--workspace", "-e", "normal,build,dev"]);
    assert!(
        alone.contains_key("llm-server v0.1.0"),
        "no llm-server in {alone:?}"
    );
    let drift: Vec<String> = alone
        .iter()
        .filter(|(package, _)| package.as_str() != "llm-server v0.1.0")
        .filter_map(|(package, own)| {
            let extra: Vec<&String> = workspace.get(package)?.difference(own).collect();
            (!extra.is_empty()).then(|| format!("{package}: {extra:?}"))
        })
        .collect();
    assert!(
        drift.is_empty(),
        "the workspace's test build turns on features the server alone does not, so the server \
         would be compiled twice; add them to server/Cargo.toml: {drift:?}"
    );
}
