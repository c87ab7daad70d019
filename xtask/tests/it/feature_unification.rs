//! One compiled server for the tests and the image: `cargo test --workspace --release` builds the
//! server's library and dependencies with every member's (dev-)dependencies' features,
//! `cargo build --release -p llm-server` (the image build) with the server's own. Where a unit
//! differs (a dependency's features, for the target or for the host, where proc macros and
//! their syn build), it and everything above it (ring, rustls, the server's library: minutes of
//! release build on two cores) is compiled twice. This test compares the two builds' unit graphs
//! and names each unit of the image build that the test build lacks, with the features to add to
//! server/Cargo.toml (as its `bitflags` and `syn` lines do). The server has no features of its own
//! for the tests to turn on: its test hooks are a second binary (server/src/hooks.rs).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// A unit as cargo compiles it: package, target, mode, platform (host or target) and profile,
/// and the features it is compiled with.
type Units = BTreeMap<String, BTreeSet<Vec<String>>>;

/// The unit graph of `cargo <args> --unit-graph` (an unstable option, allowed on the stable
/// toolchain by `RUSTC_BOOTSTRAP=1`).
fn units(args: &[&str]) -> Units {
    let out = test_support::cargo()
        .args(args)
        .args([
            "--release",
            "--offline",
            "--unit-graph",
            "-Z",
            "unstable-options",
        ])
        .env("RUSTC_BOOTSTRAP", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo --unit-graph failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graph: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut units = Units::new();
    for unit in graph["units"].as_array().unwrap() {
        let key = format!(
            "{} {} {} {} {}",
            unit["pkg_id"], unit["target"]["name"], unit["mode"], unit["platform"], unit["profile"]
        );
        let features = unit["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        units.entry(key).or_default().insert(features);
    }
    units
}

#[test]
fn the_image_build_reuses_every_unit_of_the_test_build() {
    let image = units(&["build", "-p", "llm-server"]);
    let tests = units(&["test", "--workspace", "--no-run"]);
    assert!(
        image.keys().any(|k| k.contains("llm-server")),
        "no llm-server unit in {image:?}"
    );
    let mut missing = Vec::new();
    for (unit, feature_sets) in &image {
        for features in feature_sets {
            if !tests.get(unit).is_some_and(|t| t.contains(features)) {
                let theirs = tests.get(unit).map(|t| format!("{t:?}"));
                missing.push(format!(
                    "{unit}\n  image build: {features:?}\n  test build: {}",
                    theirs.as_deref().unwrap_or("no such unit")
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the image build compiles units the workspace's test build does not, so the server would \
         be compiled twice; give server/Cargo.toml the test build's features (a dependency for \
         the target, a build dependency for the host's proc macros):\n{}",
        missing.join("\n")
    );
}
