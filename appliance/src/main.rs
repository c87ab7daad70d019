//! `appliance`: render the appliance's files from its profile, or check a running box.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use appliance::{doctor, render, Profile};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "The LLM appliance's policy: render it from the profile, check it on the box")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check a profile and print the server's memory plan against its limits.
    Check {
        #[arg(long)]
        profile: PathBuf,
    },
    /// Write every file the image needs under DIR, laid out as on the root file system.
    Render {
        #[arg(long)]
        profile: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Check the running box against its profile; exits non-zero if anything is off.
    Doctor {
        #[arg(long, default_value = appliance::profile::INSTALLED_PATH)]
        profile: PathBuf,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
        /// Read /proc and /sys under this directory instead of / (for tests and rescue disks).
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse().cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("appliance: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cmd: Cmd) -> Result<ExitCode> {
    match cmd {
        Cmd::Check { profile } => {
            let profile = Profile::load(&profile)?;
            let need = appliance::plan::requirement(&profile.model, &profile.server);
            let mib = |b: u64| b.div_ceil(appliance::plan::MIB);
            let m = &profile.server.memory;
            println!(
                "{}: ok. The server needs {} MiB (weights {}, KV cache {}, scratch {}, runtime {}); \
                 MemoryMin {} / Low {} / High {} / Max {} MiB",
                profile.machine.name,
                mib(need.total()),
                mib(need.weights),
                mib(need.kv_cache),
                mib(need.scratch),
                mib(need.runtime),
                m.min_mib,
                m.low_mib,
                m.high_mib,
                m.max_mib
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Render { profile, out } => {
            let profile = Profile::load(&profile)?;
            let written = render::write(&render::render(&profile), &out)
                .with_context(|| format!("write the rendered files under {}", out.display()))?;
            for path in written {
                println!("{}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Doctor {
            profile,
            json,
            root,
        } => {
            let profile = Profile::load(&profile)?;
            let report = doctor::examine(&profile, &doctor::Host::new(root));
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{report}");
            }
            Ok(if report.healthy() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
