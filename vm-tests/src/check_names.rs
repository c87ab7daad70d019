//! The suite's check names, in the order they run: what `--only` may name. A library item so
//! that `cargo xtask vm-test` refuses a misspelt name before it spends minutes building an image.

use anyhow::Result;

/// The checks on the first guest after `boots-and-ready`, in the order they run.
pub const ON_MAX_CPU: [&str; 14] = [
    "api-keys-and-tls",
    "confinement",
    "answers",
    "memory-policy",
    "firewall",
    "api-meters",
    "metadata-denied-to-server",
    "ipv6-and-certificate",
    "headroom",
    "footprint",
    "prompt-cache-across-restart",
    "memory-pressure",
    "restart-while-memory-is-short",
    "api-meter-drops",
];

/// The checks on the second guest (a CPU without AVX2), in the order they run.
pub const ON_OLD_CPU: [&str; 3] = ["no-avx2-refusal", "grown-root", "generated-api-key"];

/// Fails naming every check when `only` names one that does not exist: a typo must not pass
/// as a suite that ran nothing.
pub fn unknown_checks(only: &[String]) -> Result<()> {
    let known: Vec<&str> = std::iter::once("boots-and-ready")
        .chain(ON_MAX_CPU)
        .chain(ON_OLD_CPU)
        .collect();
    match only.iter().find(|name| !known.contains(&name.as_str())) {
        Some(unknown) => anyhow::bail!(
            "--only {unknown}: no such check; the checks are {}",
            known.join(", ")
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refuses_a_check_that_does_not_exist() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(unknown_checks(&names(&["memory-pressure", "grown-root"])).is_ok());
        let e = unknown_checks(&names(&["memory-pressure", "memory-presure"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--only memory-presure: no such check") && e.contains("boots-and-ready"),
            "{e}"
        );
    }
}
