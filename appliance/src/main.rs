//! `appliance`: render the appliance's files from its profile, or check a running box.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use appliance::plan::{ServerPlan, MIB};
use appliance::profile::RUNTIME_ALLOWANCE_BYTES;
use appliance::{doctor, paths, render, secrets, Profile};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "The LLM appliance's policy: render it from the profile, check it on the box")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check a profile; with the server's plan of its model, hold its memory limits to it.
    Check {
        #[arg(long)]
        profile: PathBuf,
        /// The output of `llm-server plan --json` for the profile's model, context and slots
        /// (`-` reads it from stdin).
        #[arg(long)]
        plan: Option<PathBuf>,
    },
    /// Write every file the image needs under DIR, laid out as on the root file system; with
    /// --plan also the plan and the server unit's memory drop-in resolved from it.
    Render {
        #[arg(long)]
        profile: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// The output of `llm-server plan --json` for the profile's model, context and slots
        /// (`-` reads it from stdin).
        #[arg(long)]
        plan: Option<PathBuf>,
    },
    /// Print the server unit's memory drop-in (`[Service]` MemoryMin/Low/High/Max): the
    /// profile's [server.memory] policy resolved against the server's plan of its model.
    /// Refuses, naming the fix, a model that cannot fit the machine.
    Memory {
        #[arg(long)]
        profile: PathBuf,
        /// The output of `llm-server plan --json` for the profile's model, context and slots
        /// (`-` reads it from stdin).
        #[arg(long)]
        plan: PathBuf,
    },
    /// Check the running box against its profile; exits non-zero if anything is off.
    Doctor {
        #[arg(long, default_value = paths::PROFILE)]
        profile: PathBuf,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
        /// Read /proc and /sys under this directory instead of / (for tests and rescue disks).
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
    /// Provision the API keys and the TLS certificate (llm-secrets.service runs this at boot):
    /// from the instance metadata when given and allowed, else made once and kept.
    Secrets {
        #[arg(long, default_value = paths::PROFILE)]
        profile: PathBuf,
        /// Keep the files under this directory instead of / (for tests).
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
    /// Print the login banner: where the API key is and the certificate's fingerprint.
    Banner {
        #[arg(long, default_value = paths::PROFILE)]
        profile: PathBuf,
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
        Cmd::Check { profile, plan } => {
            let profile = Profile::load(&profile)?;
            warn(&profile);
            let Some(plan) = plan else {
                let s = &profile.server;
                let args = appliance::plan::args(&profile.model.file, s.ctx_size, s.parallel);
                println!(
                    "{}: ok. Memory limits not resolved: give --plan, the output of \
                     `llm-server {}`",
                    profile.machine.name,
                    args.join(" ")
                );
                return Ok(ExitCode::SUCCESS);
            };
            let (plan, _) = read_plan(&plan)?;
            let limits = profile.memory_limits(&plan)?;
            let mib = |b: u64| b.div_ceil(MIB);
            println!(
                "{}: ok. The server needs {} MiB (weights {}, KV cache {}, scratch {}, \
                 vocabulary {}, runtime {}); {limits}",
                profile.machine.name,
                mib(plan.total_bytes + RUNTIME_ALLOWANCE_BYTES),
                mib(plan.weights_bytes),
                mib(plan.kv_cache_bytes),
                mib(plan.scratch_bytes),
                mib(plan.vocabulary_bytes),
                mib(RUNTIME_ALLOWANCE_BYTES),
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Render { profile, out, plan } => {
            let profile = Profile::load(&profile)?;
            warn(&profile);
            let mut files = render::render(&profile);
            if let Some(plan) = plan {
                let (plan, json) = read_plan(&plan)?;
                let limits = profile.memory_limits(&plan)?;
                files.extend(render::planned(&profile, &json, &limits));
            }
            let written = render::write(&files, &out)
                .with_context(|| format!("write the rendered files under {}", out.display()))?;
            for path in written {
                println!("{}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Memory { profile, plan } => {
            let profile = Profile::load(&profile)?;
            let (plan, _) = read_plan(&plan)?;
            let limits = profile.memory_limits(&plan)?;
            print!("{}", render::server_limits(&profile, &limits));
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
        Cmd::Secrets { profile, root } => {
            let profile = Profile::load(&profile)?;
            let imds = secrets::Imds::new(profile.oci.metadata_address);
            let provisioned = secrets::provision(&profile, &secrets::Files::under(&root), &imds)
                .context("provision the API keys and the TLS certificate")?;
            for line in provisioned.log {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Banner { profile, root } => {
            let profile = Profile::load(&profile)?;
            print!(
                "{}",
                secrets::banner(&profile, &secrets::Files::under(&root))
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The profile's loud warnings (an API without key or TLS, allowed on private networks only).
fn warn(profile: &Profile) {
    for w in profile.warnings() {
        eprintln!("appliance: WARNING: {w}");
    }
}

/// `llm-server plan --json` output from a file, or stdin for `-`: parsed, and as it was.
fn read_plan(path: &std::path::Path) -> Result<(ServerPlan, String)> {
    let json = if path == std::path::Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("read the plan from stdin")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("read the plan {}", path.display()))?
    };
    let plan = ServerPlan::parse(&json).with_context(|| format!("the plan {}", path.display()))?;
    Ok((plan, json))
}
