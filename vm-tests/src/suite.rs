//! Runs named checks, prints each result as it comes, and ends with `N passed, N failed`. A
//! failure prints its evidence and the tail of the guest's serial console.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;

/// Lines of the serial console shown with a failure.
const CONSOLE_TAIL: usize = 40;

pub struct Suite {
    keep_going: bool,
    /// The checks to run; empty: all.
    only: Vec<String>,
    passed: usize,
    failed: usize,
}

/// The checks that boot a guest: the others need them, so `--only` always runs them.
const BOOTS: [&str; 2] = ["boots-and-ready", "no-avx2-refusal"];

/// The run stopped at a failure (without `--keep-going`).
#[derive(Debug)]
pub struct Stopped;

impl Suite {
    pub fn new(keep_going: bool, only: Vec<String>) -> Suite {
        Suite {
            keep_going,
            only,
            passed: 0,
            failed: 0,
        }
    }

    /// Whether `name` is to run (`--only`).
    pub fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|n| n == name)
    }

    /// Runs `check`, which returns what it saw when it passes. `console` is the serial console of
    /// the guest it examines.
    pub fn check(
        &mut self,
        name: &str,
        console: Option<&Path>,
        check: impl FnOnce() -> Result<String>,
    ) -> Result<bool, Stopped> {
        if !self.wants(name) && !BOOTS.contains(&name) {
            return Ok(true);
        }
        eprintln!("---- {name}");
        let begun = Instant::now();
        let result = check();
        let secs = begun.elapsed().as_secs_f64();
        match result {
            Ok(detail) => {
                self.passed += 1;
                println!("ok   {name} ({secs:.0} s): {detail}");
                Ok(true)
            }
            Err(e) => {
                self.failed += 1;
                println!("FAIL {name} ({secs:.0} s): {e:#}");
                if let Some(console) = console {
                    println!(
                        "     last lines of the guest console ({}):\n{}",
                        console.display(),
                        tail(console)
                    );
                }
                if self.keep_going {
                    Ok(false)
                } else {
                    Err(Stopped)
                }
            }
        }
    }

    /// Counts a check that could not run because an earlier one failed.
    pub fn not_run(&mut self, name: &str, because: &str) {
        self.failed += 1;
        println!("FAIL {name}: not run: {because}");
    }

    pub fn failed(&self) -> usize {
        self.failed
    }

    /// The closing `N passed, N failed` line.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed, self.failed)
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(CONSOLE_TAIL)..]
        .iter()
        .map(|l| format!("     | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
