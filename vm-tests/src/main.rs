//! `vm-tests`: boots the appliance image in QEMU at its profile's RAM and checks, from the host
//! and inside the guest, that the model loads and answers and that every policy protecting it
//! is in force. `cargo xtask vm-test` builds the image if needed and runs this.

mod checks;
mod guest;
mod http;
mod imds;
mod sabotage;
mod ssh;
mod suite;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use appliance::Profile;
use clap::{Parser, Subcommand};

use guest::{Boot, Guest};
use suite::{Stopped, Suite};
use vm_tests::check_names::{unknown_checks, ON_MAX_CPU, ON_OLD_CPU};
use vm_tests::qemu;

#[derive(Parser)]
#[command(about = "Boot the appliance image in QEMU and check it from outside and inside")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every check against the image.
    Run(Run),
    /// Answer one OCI metadata (IMDS v2) request on stdin/stdout; QEMU's guestfwd runs this.
    #[command(hide = true)]
    ImdsRespond {
        /// The authorized_keys text to serve.
        #[arg(long)]
        keys: PathBuf,
        /// The llm_api_keys text to serve (none: 404, as for a launch without it).
        #[arg(long)]
        api_keys: Option<PathBuf>,
        /// Where to append a line per request.
        #[arg(long)]
        log: PathBuf,
    },
}

#[derive(clap::Args)]
struct Run {
    /// The qcow2 to boot (`cargo xtask image` builds it).
    #[arg(long, default_value = "target/appliance/e2-micro.qcow2")]
    image: PathBuf,
    /// The profile the image was built from: every expectation comes from it.
    #[arg(long, default_value = "appliance/profiles/e2-micro.toml")]
    profile: PathBuf,
    /// The golden data folder (default: $LLM_GOLDEN_DIR, else the repository's testdata/).
    #[arg(long)]
    golden: Option<PathBuf>,
    /// Where consoles, keys and logs go (default: a fresh folder under target/vm-test).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Run the remaining checks after a failure instead of stopping.
    #[arg(long)]
    keep_going: bool,
    /// Run only these checks (comma-separated names as the suite prints them) after the boots
    /// they need; a developer's shortcut to one check, not a passing suite.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The image's model has synthetic weights (`llm-server synth`): its output cannot be
    /// golden, so `answers` checks that tokens stream back and `usage` counts them instead.
    #[arg(long)]
    synthetic_model: bool,
    /// Remove these policies from the guests once they boot, to see the checks guarding them
    /// fail (comma-separated).
    #[arg(long, value_delimiter = ',')]
    remove_policy: Vec<sabotage::Policy>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run(run) => run.run(),
        Cmd::ImdsRespond {
            keys,
            api_keys,
            log,
        } => imds_respond(&keys, api_keys.as_deref(), &log).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("vm-tests: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn imds_respond(keys: &Path, api_keys: Option<&Path>, log: &Path) -> Result<()> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()));
    let keys = read(keys)?;
    let api_keys = api_keys.map(read).transpose()?;
    imds::respond(
        std::io::stdin().lock(),
        std::io::stdout().lock(),
        &keys,
        api_keys.as_deref(),
        log,
    )
}

/// Durations the suite reports at the end.
#[derive(Default)]
struct Timings {
    to_ssh: Option<Duration>,
    to_ready: Option<Duration>,
    first_answer: Option<Duration>,
}

impl Run {
    /// Runs the suite; `Ok(false)` when a check failed.
    fn run(self) -> Result<bool> {
        let started = Instant::now();
        let profile = Profile::load(&self.profile)?;
        let golden = self
            .golden
            .clone()
            .unwrap_or_else(test_support::testdata_location);
        let work = match &self.work {
            Some(dir) => dir.clone(),
            None => PathBuf::from("target/vm-test").join(format!("run-{}", std::process::id())),
        };
        std::fs::create_dir_all(&work)?;
        let work = work.canonicalize()?;
        let key = ssh::generate_key(&work)?;
        let imds_log = work.join("imds.log");
        let exe = std::env::current_exe().context("find the vm-tests binary")?;
        // The first boot's launch gives an API key in the metadata; the second's does not, so
        // the box makes its own.
        let api_key = format!(
            "vm-test-key-{}-{}",
            std::process::id(),
            started.elapsed().as_nanos()
        );
        let api_keys = work.join("llm_api_keys");
        std::fs::write(&api_keys, format!("{api_key}\n"))?;
        let imds_command = |api_keys: Option<&Path>| {
            format!(
                "{} imds-respond --keys {} --log {}{}",
                exe.display(),
                key.with_extension("pub").display(),
                imds_log.display(),
                api_keys
                    .map(|p| format!(" --api-keys {}", p.display()))
                    .unwrap_or_default()
            )
        };
        let boot = Boot {
            image: &self.image,
            profile: &profile,
            key: &key,
            imds_command: imds_command(Some(&api_keys)),
            dir: &work,
            remove: &self.remove_policy,
            disk_bytes: None,
        };
        // The second boot is short (the server refuses that CPU): it also boots on a disk
        // grown to several GB, as OCI's boot volume is, which costs the suite no extra boot.
        let second_boot = Boot {
            imds_command: imds_command(None),
            disk_bytes: Some(checks::disk::GROWN_DISK_BYTES),
            ..boot.clone()
        };
        eprintln!(
            "vm-tests: image {}, work in {}",
            self.image.display(),
            work.display()
        );

        unknown_checks(&self.only)?;
        let mut suite = Suite::new(self.keep_going, self.only.clone());
        let mut timings = Timings::default();
        let answers = match self.synthetic_model {
            true => Answers::Streamed,
            false => Answers::Golden(&golden),
        };
        let outcome = checks_on_max_cpu(
            &mut suite,
            &boot,
            answers,
            &imds_log,
            &api_key,
            &mut timings,
        )
        .and_then(|()| check_old_cpu(&mut suite, &second_boot, &imds_log, &api_key));
        if outcome.is_err() {
            println!("stopped at the first failure (--keep-going runs the rest)");
        }
        let secs =
            |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{:.0} s", d.as_secs_f64()));
        println!(
            "timings (TCG): SSH login {} and /health 200 {} after power-on; first answer {}; \
             suite {}",
            secs(timings.to_ssh),
            secs(timings.to_ready),
            secs(timings.first_answer),
            secs(Some(started.elapsed()))
        );
        println!("{}", suite.summary());
        Ok(suite.failed() == 0)
    }
}

/// How the `answers` check judges the model's output.
#[derive(Clone, Copy)]
enum Answers<'a> {
    /// Against the golden data in this folder.
    Golden(&'a Path),
    /// Synthetic weights: tokens stream back and `usage` counts them.
    Streamed,
}

/// Checks 1-5 and 7 on one guest with the CPU the appliance is built for.
fn checks_on_max_cpu(
    suite: &mut Suite,
    boot: &Boot,
    answers: Answers,
    imds_log: &Path,
    api_key: &str,
    timings: &mut Timings,
) -> Result<(), Stopped> {
    let profile = boot.profile;
    let mut started = None;
    let mut pace = None;
    let booted = suite.check("boots-and-ready", None, || {
        let mut guest = Guest::start(boot, guest::MAIN_CPU)?;
        // Boot under TCG takes about a minute; the unit's own start timeout covers the load.
        let budget = Duration::from_secs(600 + u64::from(profile.server.start_timeout_sec));
        let ssh = guest.wait_for_ssh(budget);
        let secrets = ssh.as_ref().ok().map(|_| guest.read_secrets(budget));
        let ready = match &secrets {
            Some(Ok(_)) => Some(guest.wait_for_health(budget)),
            _ => None,
        };
        let console = guest.console();
        started = Some(guest);
        let to_ssh = ssh.with_context(|| console_hint(&console))?;
        secrets.expect("read when SSH answered")?;
        let to_ready = ready.expect("set when the secrets were read")?;
        timings.to_ssh = Some(to_ssh);
        timings.to_ready = Some(to_ready);
        let imds = std::fs::read_to_string(imds_log).unwrap_or_default();
        Ok(format!(
            "SSH as root after {:.0} s with the key from IMDS ({}), /health 200 after {:.0} s",
            to_ssh.as_secs_f64(),
            imds.lines().last().unwrap_or("no request logged").trim(),
            to_ready.as_secs_f64()
        ))
    })?;
    let names = ON_MAX_CPU;
    let Some(guest) = started.filter(|_| booted) else {
        for name in names {
            suite.not_run(name, "the guest did not become ready");
        }
        return Ok(());
    };
    let console = guest.console();
    let console = Some(console.as_path());
    suite.check("api-keys-and-tls", console, || {
        let from_metadata = guest.api.key.as_deref() == Some(api_key);
        let imds = std::fs::read_to_string(imds_log).unwrap_or_default();
        let asked = imds
            .lines()
            .any(|l| l.contains(imds::API_KEYS_PATH) && l.ends_with("200 OK"));
        anyhow::ensure!(
            from_metadata && asked,
            "the box's API key is {:?}, not the metadata's {api_key:?} (IMDS log: {imds})",
            guest.api.key
        );
        let detail = checks::api::auth(&guest.api)?;
        Ok(format!("key from the metadata's llm_api_keys; {detail}"))
    })?;
    suite.check("confinement", console, || {
        checks::policy::confinement(&guest.ssh)
    })?;
    suite.check("answers", console, || {
        let answers = match answers {
            Answers::Golden(golden) => checks::api::run(&guest.api, profile, golden)?,
            Answers::Streamed => checks::api::run_streamed(&guest.api, profile)?,
        };
        timings.first_answer = Some(answers.first_answer);
        pace = answers.pace;
        Ok(answers.detail)
    })?;
    suite.check("memory-policy", console, || {
        checks::policy::run(&guest.ssh, profile)
    })?;
    suite.check("firewall", console, || checks::firewall::run(&guest))?;
    suite.check("api-meters", console, || {
        checks::edge::meters_loaded(&guest.ssh, profile)
    })?;
    suite.check("metadata-denied-to-server", console, || {
        checks::edge::metadata_denied(&guest.ssh, profile)
    })?;
    suite.check("ipv6-and-certificate", console, || {
        checks::edge::ipv6_and_certificate(&guest.ssh, profile)
    })?;
    // Before the pressure test, which leaves memory in a different state.
    suite.check("headroom", console, || {
        checks::headroom::run(&guest.ssh, profile)
    })?;
    // Also before the pressure test: the figures of a box in ordinary use.
    suite.check("footprint", console, || {
        checks::footprint::run(&guest.ssh, &guest.api, profile, pace)
    })?;
    // After the figures of ordinary use: the restart gives the server a fresh process.
    suite.check("prompt-cache-across-restart", console, || {
        checks::slots::run(&guest.ssh, &guest.api)
    })?;
    suite.check("memory-pressure", console, || {
        checks::pressure::run(&guest.ssh, &guest.api)
    })?;
    suite.check("restart-while-memory-is-short", console, || {
        checks::restart_short::run(&guest.ssh, &guest.api, profile)
    })?;
    // Last: it stops the server to hold the API port with a listener of its own.
    suite.check("api-meter-drops", console, || {
        checks::edge::meter_behaviour(&guest, profile)
    })?;
    Ok(())
}

/// Check 6 on a second, short boot with a CPU that lacks AVX2, whose launch gives no API key
/// (the box must make its own), on a disk grown past the image (its root must grow).
fn check_old_cpu(
    suite: &mut Suite,
    boot: &Boot,
    imds_log: &Path,
    metadata_key: &str,
) -> Result<(), Stopped> {
    if !ON_OLD_CPU.iter().any(|name| suite.wants(name)) {
        return Ok(());
    }
    let mut started = None;
    suite.check("no-avx2-refusal", None, || {
        let mut guest = Guest::start(boot, checks::cpu::OLD_CPU)?;
        let ssh = guest.wait_for_ssh(Duration::from_secs(900));
        let console = guest.console();
        started = Some(guest);
        ssh.with_context(|| console_hint(&console))?;
        checks::cpu::run(&started.as_ref().expect("just set").ssh, boot.profile)
    })?;
    let Some(mut guest) = started else {
        suite.not_run("generated-api-key", "the second guest did not boot");
        suite.not_run("grown-root", "the second guest did not boot");
        return Ok(());
    };
    let console = guest.console();
    suite.check("grown-root", Some(&console), || {
        checks::disk::run(&guest.ssh, image_virtual_bytes(boot.image)?)
    })?;
    suite.check("generated-api-key", Some(&console), || {
        guest.read_secrets(Duration::from_secs(900))?;
        let key = guest.api.key.clone().unwrap_or_default();
        let imds = std::fs::read_to_string(imds_log).unwrap_or_default();
        let not_given = imds
            .lines()
            .any(|l| l.contains(imds::API_KEYS_PATH) && l.ends_with("404 Not Found"));
        anyhow::ensure!(
            key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) && key != metadata_key,
            "the key the box made is {key:?}, not 64 hex digits of its own"
        );
        anyhow::ensure!(
            not_given,
            "the IMDS log shows no 404 for llm_api_keys: {imds}"
        );
        Ok(format!(
            "no llm_api_keys in the metadata (404); the box made a 256-bit key ({}...) and a \
             self-signed certificate {}",
            &key[..8],
            guest.api.tls.map(|f| f.to_string()).unwrap_or_default()
        ))
    })?;
    Ok(())
}

/// The image's virtual disk size, as `qemu-img info` reports it.
fn image_virtual_bytes(image: &Path) -> Result<u64> {
    let out = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(image)
        .output()
        .context("run qemu-img (apt-get install qemu-utils)")?;
    anyhow::ensure!(
        out.status.success(),
        "qemu-img info {}: {}",
        image.display(),
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    info["virtual-size"]
        .as_u64()
        .with_context(|| format!("qemu-img info {} gave no virtual-size", image.display()))
}

fn console_hint(console: &Path) -> String {
    let text = std::fs::read_to_string(console).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "guest console ({}), last lines:\n{}",
        console.display(),
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists `--only` is checked against are the names the suite runs.
    #[test]
    fn the_check_lists_are_the_checks_run() {
        let source = include_str!("main.rs");
        for name in std::iter::once("boots-and-ready")
            .chain(ON_MAX_CPU)
            .chain(ON_OLD_CPU)
        {
            assert!(
                source.contains(&format!("suite.check(\"{name}\"")),
                "no suite.check(\"{name}\", ..) in main.rs"
            );
        }
        let checks = source.matches("suite.check(\"").count();
        assert_eq!(checks, 1 + ON_MAX_CPU.len() + ON_OLD_CPU.len());
    }
}
