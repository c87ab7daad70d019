//! The memory policy in force: zram, sysctls, earlyoom's arguments, the server unit's limits,
//! and `appliance doctor` reading all of it back.

use anyhow::{Context, Result};
use appliance::plan::MIB;
use appliance::Profile;
use serde_json::Value;

use super::{meminfo_bytes, properties, section, sections, verdict};
use crate::ssh::Ssh;

/// The unit properties the profile sets, in `systemctl show`'s names.
const UNIT_PROPERTIES: &str = "MemoryMin,MemoryLow,MemoryHigh,MemoryMax,OOMScoreAdjust";

pub fn run(ssh: &Ssh, profile: &Profile) -> Result<String> {
    let sysctl_paths: Vec<String> = profile
        .sysctl
        .keys()
        .map(|k| format!("/proc/sys/{}", k.replace('.', "/")))
        .collect();
    let script = format!(
        "echo '## meminfo'; cat /proc/meminfo
         echo '## disksize'; cat /sys/block/zram0/disksize
         echo '## algorithm'; cat /sys/block/zram0/comp_algorithm
         echo '## swaps'; cat /proc/swaps
         echo '## sysctl'; cat {}
         echo '## earlyoom'; tr '\\0' '\\n' < /proc/$(pgrep -xo earlyoom)/cmdline
         echo '## unit'; systemctl show llm-server -p {UNIT_PROPERTIES}
         echo '## plan'; cat {plan}
         echo '## doctor'; appliance doctor --json",
        sysctl_paths.join(" "),
        plan = appliance::paths::PLAN,
    );
    let out = ssh.run(&script)?.stdout;
    let parts = sections(&out);
    let mut problems = Vec::new();

    let total = meminfo_bytes(section(&parts, "meminfo")?, "MemTotal")?;
    let z = &profile.zram;
    let want_size = zram_bytes(total, z);
    let size = section(&parts, "disksize")?.trim();
    if !size
        .parse::<u64>()
        .is_ok_and(|s| s.abs_diff(want_size) <= ZRAM_ROUNDING)
    {
        problems.push(format!("zram0 is {size:?} bytes, want {want_size}"));
    }
    let algorithm = selected(section(&parts, "algorithm")?);
    if algorithm != Some(z.algorithm.as_str()) {
        problems.push(format!(
            "zram0 compresses with {algorithm:?}, want {}",
            z.algorithm
        ));
    }
    let swap = section(&parts, "swaps")?
        .lines()
        .find(|l| l.starts_with("/dev/zram0"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>());
    match swap {
        Some(fields) if fields.get(4) == Some(&z.swap_priority.to_string().as_str()) => {}
        other => problems.push(format!(
            "/dev/zram0 is not swap at priority {} ({other:?})",
            z.swap_priority
        )),
    }

    let values: Vec<&str> = section(&parts, "sysctl")?.lines().collect();
    for (i, (key, want)) in profile.sysctl.iter().enumerate() {
        let have = values.get(i).map(|v| v.trim()).unwrap_or("(unreadable)");
        if have != want.to_string() {
            problems.push(format!("{key} = {have}, want {want}"));
        }
    }

    let args: Vec<&str> = section(&parts, "earlyoom")?.lines().skip(1).collect();
    let want_args = appliance::render::earlyoom_args(profile);
    if args != want_args {
        problems.push(format!("earlyoom runs with {args:?}, want {want_args:?}"));
    }

    let unit = properties(section(&parts, "unit")?);
    // The limits are the profile's policy resolved against the plan the image builder made of
    // the model and installed beside the profile.
    let plan =
        appliance::plan::ServerPlan::parse(section(&parts, "plan")?).context("the image's plan")?;
    let m = profile.memory_limits(&plan)?;
    for (key, want) in [
        ("MemoryMin", (m.min_mib * MIB).to_string()),
        ("MemoryLow", (m.low_mib * MIB).to_string()),
        ("MemoryHigh", (m.high_mib * MIB).to_string()),
        ("MemoryMax", (m.max_mib * MIB).to_string()),
        (
            "OOMScoreAdjust",
            profile.server.oom_score_adjust.to_string(),
        ),
    ] {
        let have = unit.get(key).copied().unwrap_or("(not shown)");
        if have != want {
            problems.push(format!("llm-server {key}={have}, want {want}"));
        }
    }

    let doctor: Value = serde_json::from_str(section(&parts, "doctor")?)
        .context("`appliance doctor --json` printed no JSON")?;
    let by_status = |status: &str| -> Vec<String> {
        doctor["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == status)
            .map(|c| format!("{}: {}", c["name"].as_str().unwrap_or("?"), c["detail"]))
            .collect()
    };
    let failed = by_status("fail");
    if doctor["healthy"] != true || !failed.is_empty() {
        problems.push(format!("appliance doctor is not green: {failed:?}"));
    }
    let warnings = by_status("warn");

    verdict(
        problems,
        format!(
            "zram0 {} MiB {} prio {}, {} sysctls, earlyoom {}, unit {UNIT_PROPERTIES} as \
             rendered, doctor green ({} checks{})",
            want_size / MIB,
            z.algorithm,
            z.swap_priority,
            profile.sysctl.len(),
            want_args.join(" "),
            doctor["checks"].as_array().map_or(0, Vec::len),
            if warnings.is_empty() {
                String::new()
            } else {
                format!(", warnings {warnings:?}")
            }
        ),
    )
}

/// The algorithm in brackets in `comp_algorithm` (`lzo [zstd] lz4`).
fn selected(line: &str) -> Option<&str> {
    line.split_whitespace()
        .find_map(|a| a.strip_prefix('[')?.strip_suffix(']'))
}

/// The units `systemd-analyze security` must score at most this exposure ("OK").
const CONFINED_UNITS: [&str; 3] = [
    appliance::paths::SERVER_UNIT,
    appliance::paths::SECRETS_UNIT,
    appliance::paths::SSH_KEYS_UNIT,
];
const EXPOSURE_MAX: f64 = 2.0;

/// `systemd-analyze security` on the booted box: the server and the jobs that talk to the
/// metadata service score an exposure of at most 2.0.
pub fn confinement(ssh: &Ssh) -> Result<String> {
    let out = ssh.check(&format!(
        "systemd-analyze security --no-pager {} 2>&1 | grep -F 'Overall exposure level' || true",
        CONFINED_UNITS.join(" ")
    ))?;
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for unit in CONFINED_UNITS {
        match exposure(&out, unit) {
            Some(l) if l <= EXPOSURE_MAX => found.push(format!("{unit} {l}")),
            Some(l) => problems.push(format!("{unit}: exposure {l} > {EXPOSURE_MAX}")),
            None => problems.push(format!("no exposure for {unit} in: {out}")),
        }
    }
    verdict(
        problems,
        format!("systemd-analyze security: {}", found.join(", ")),
    )
}

/// The exposure `systemd-analyze security` gives `unit` in its summary line
/// (`→ Overall exposure level for UNIT: 1.5 OK :-)`).
fn exposure(out: &str, unit: &str) -> Option<f64> {
    out.lines()
        .find_map(|l| l.split_once(&format!("for {unit}: ")))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
}

/// zram-generator evaluates `min(ram * percent / 100, max)` with `ram` as MemTotal in whole MiB
/// (Debian bookworm's 1.1.2 drops the fraction: a guest with MemTotal 988960 kB, 965.8 MiB, got
/// 25% of 965 MiB), and rounds the result to whole pages: within this of the exact figure.
const ZRAM_ROUNDING: u64 = 64 * 1024;

/// The zram device's size the profile asks for on a guest with `mem_total` bytes.
fn zram_bytes(mem_total: u64, z: &appliance::profile::Zram) -> u64 {
    let ram = mem_total / MIB * MIB;
    (ram * z.percent_of_ram / 100).min(z.max_mib * MIB)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_exposure_of_each_unit() {
        let out = "→ Overall exposure level for llm-server.service: 1.5 OK :-)\n\
                   → Overall exposure level for llm-secrets.service: 1.7 OK :-)\n";
        assert_eq!(super::exposure(out, "llm-server.service"), Some(1.5));
        assert_eq!(super::exposure(out, "llm-secrets.service"), Some(1.7));
        assert_eq!(super::exposure(out, "oci-ssh-keys.service"), None);
    }

    #[test]
    fn finds_the_selected_algorithm() {
        assert_eq!(
            super::selected("lzo lzo-rle lz4 [zstd] 842\n"),
            Some("zstd")
        );
        assert_eq!(super::selected("lzo lz4\n"), None);
    }
}

#[cfg(test)]
mod zram_tests {
    use super::*;

    #[test]
    fn the_zram_size_is_the_generators_within_a_page_rounding() {
        let z = |percent, max| appliance::profile::Zram {
            percent_of_ram: percent,
            max_mib: max,
            algorithm: "zstd".into(),
            swap_priority: 100,
        };
        // As the 1B guest showed it: MemTotal 988160 kB, 25% under a 256 MiB cap.
        let want = zram_bytes(988_160 * 1024, &z(25, 256));
        assert!(want.abs_diff(252_968_960) <= ZRAM_ROUNDING, "{want}");
        // A later image's kernel left 800 kB more (MemTotal 988960 kB): the same device, as the
        // generator counts whole MiB.
        let want = zram_bytes(988_960 * 1024, &z(25, 256));
        assert!(want.abs_diff(252_968_960) <= ZRAM_ROUNDING, "{want}");
        // A MiB more is a quarter MiB more zram.
        let want = zram_bytes(989_184 * 1024, &z(25, 256));
        assert!(
            want.abs_diff(252_968_960 + MIB / 4) <= ZRAM_ROUNDING,
            "{want}"
        );
        // Capped: the 270M profile's 384 MiB.
        assert_eq!(zram_bytes(988_160 * 1024, &z(50, 384)), 384 * MIB);
    }
}
