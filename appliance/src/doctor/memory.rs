//! The memory stack as the kernel sees it: zram, sysctls, earlyoom, kernel OOM kills.

use crate::paths;
use crate::profile::Profile;
use crate::render;

use super::{mib, Check, Host};

/// zram0 exists, is active swap, and has the profile's size and algorithm.
pub fn zram(profile: &Profile, host: &Host) -> Check {
    const NAME: &str = "zram";
    let fix = &format!(
        "check {} and `systemctl status systemd-zram-setup@zram0`",
        paths::ZRAM_GENERATOR_CONF
    );
    let z = &profile.zram;
    let Ok(disksize) = host.read("/sys/block/zram0/disksize") else {
        return Check::fail(NAME, "no zram0 device", fix);
    };
    let disksize: u64 = disksize.trim().parse().unwrap_or(0);
    let swaps = host.read("/proc/swaps").unwrap_or_default();
    if !swaps.lines().any(|l| l.starts_with("/dev/zram0 ")) {
        return Check::fail(NAME, "zram0 exists but is not in use as swap", fix);
    }
    let algorithm = host
        .read("/sys/block/zram0/comp_algorithm")
        .unwrap_or_default();
    // The kernel lists every algorithm and brackets the one in use: `lzo lz4 [zstd]`.
    let algorithm = algorithm
        .split_whitespace()
        .find_map(|a| a.strip_prefix('[')?.strip_suffix(']'))
        .unwrap_or("unknown");
    if algorithm != z.algorithm {
        return Check::fail(
            NAME,
            format!(
                "zram0 compresses with {algorithm}, the profile says {}",
                z.algorithm
            ),
            fix,
        );
    }
    let Some(expected) = expected_zram_bytes(profile, host) else {
        return Check::fail(NAME, "cannot read MemTotal from /proc/meminfo", fix);
    };
    // zram-generator computes in MiB and the kernel rounds up to a page: allow a MiB either way.
    if disksize.abs_diff(expected) > crate::plan::MIB {
        return Check::fail(
            NAME,
            format!(
                "zram0 holds {} MiB, the profile says {} MiB (min({}% of RAM, {} MiB))",
                mib(disksize),
                mib(expected),
                z.percent_of_ram,
                z.max_mib
            ),
            fix,
        );
    }
    // mm_stat: orig_data_size compr_data_size mem_used_total ...
    let stat: Vec<u64> = host
        .read("/sys/block/zram0/mm_stat")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let usage = match stat[..] {
        // Below a MiB the ratio says nothing (a few same-filled pages compress "infinitely").
        [orig, compressed, used, ..] if orig >= crate::plan::MIB && compressed > 0 => format!(
            "; holds {} MiB in {} MiB of RAM (ratio {:.1})",
            mib(orig),
            mib(used),
            orig as f64 / compressed as f64
        ),
        _ => "; (almost) empty".to_owned(),
    };
    Check::ok(
        NAME,
        format!("zram0 {} MiB {algorithm}{usage}", mib(disksize)),
    )
}

/// The size zram-generator gives `min(ram * percent / 100, max)`, `ram` being MemTotal in MiB.
fn expected_zram_bytes(profile: &Profile, host: &Host) -> Option<u64> {
    let share = meminfo_bytes(host, "MemTotal")? * profile.zram.percent_of_ram / 100;
    Some(share.min(profile.zram.max_mib * crate::plan::MIB))
}

/// A `/proc/meminfo` line (`MemTotal:  1000000 kB`) in bytes.
fn meminfo_bytes(host: &Host, key: &str) -> Option<u64> {
    let meminfo = host.read("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// MemTotal is at least what the profile states (`machine.mem_total_mib`): earlyoom takes its
/// percentages of MemTotal, and the build placed its kill line above the protected weights
/// (MemoryMin) on the stated figure; on a box with less, the line sits lower than was checked.
pub fn mem_total(profile: &Profile, host: &Host) -> Check {
    const NAME: &str = "mem-total";
    let stated = profile.machine.mem_total_mib;
    let Some(total) = meminfo_bytes(host, "MemTotal") else {
        return Check::fail(
            NAME,
            "cannot read MemTotal from /proc/meminfo",
            "run on Linux with /proc mounted",
        );
    };
    // Whole MiB, rounded down: a box with a fraction less than stated is short of it.
    let total = mib(total);
    let detail = format!("MemTotal {total} MiB, the profile states {stated} MiB");
    if total >= stated {
        Check::ok(NAME, detail)
    } else {
        Check::fail(
            NAME,
            detail,
            format!(
                "earlyoom's lines ({}% of MemTotal) sit lower here than the build checked: set \
                 machine.mem_total_mib = {total} in the profile and rebuild (the build then says \
                 whether earlyoom.mem_kill_percent must rise)",
                profile.earlyoom.mem_kill_percent
            ),
        )
    }
}

/// MemAvailable is at least the profile's promised headroom (`machine.headroom_mib`).
pub fn headroom(profile: &Profile, host: &Host) -> Check {
    const NAME: &str = "headroom";
    let promised = profile.machine.headroom_mib;
    let Some(available) = meminfo_bytes(host, "MemAvailable") else {
        return Check::fail(
            NAME,
            "cannot read MemAvailable from /proc/meminfo",
            "run on Linux 3.14 or later with /proc mounted",
        );
    };
    let detail = format!(
        "MemAvailable {} MiB, the profile promises {promised} MiB",
        mib(available)
    );
    if mib(available) >= promised {
        Check::ok(NAME, detail)
    } else {
        Check::fail(
            NAME,
            detail,
            "something besides the model holds the memory: find it with \
             `ps -eo rss,comm --sort=-rss | head` (or the server's KV cache is filling under \
             requests: run the doctor again when the box is idle)",
        )
    }
}

/// Every sysctl of the profile has its value in /proc/sys.
pub fn sysctls(profile: &Profile, host: &Host) -> Check {
    const NAME: &str = "sysctl";
    let wrong: Vec<String> = profile
        .sysctl
        .iter()
        .filter_map(|(key, want)| {
            let want = want.to_string();
            let have = host
                .read(&format!("/proc/sys/{}", key.replace('.', "/")))
                .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|_| "unreadable".to_owned());
            (have != want).then(|| format!("{key} = {have} (want {want})"))
        })
        .collect();
    if wrong.is_empty() {
        Check::ok(
            NAME,
            format!("{} values as the profile says", profile.sysctl.len()),
        )
    } else {
        Check::fail(
            NAME,
            wrong.join(", "),
            format!("check {}, then `sysctl --system`", paths::SYSCTL_CONF),
        )
    }
}

/// earlyoom runs with exactly the arguments rendered from the profile.
pub fn earlyoom(profile: &Profile, host: &Host) -> Check {
    const NAME: &str = "earlyoom";
    let want = render::earlyoom_args(profile);
    let Some(process) = host.processes_named("earlyoom").into_iter().next() else {
        return Check::fail(
            NAME,
            "earlyoom is not running",
            "systemctl enable --now earlyoom",
        );
    };
    let cmdline = host
        .read(&format!("/proc/{}/cmdline", process.pid))
        .unwrap_or_default();
    let have: Vec<&str> = cmdline
        .split('\0')
        .filter(|a| !a.is_empty())
        .skip(1)
        .collect();
    if have == want {
        Check::ok(NAME, format!("pid {}: {}", process.pid, have.join(" ")))
    } else {
        Check::fail(
            NAME,
            format!(
                "{} (pid {}) runs with `{}`, the profile says `{}`",
                process.comm,
                process.pid,
                have.join(" "),
                want.join(" ")
            ),
            format!(
                "check EARLYOOM_ARGS in {}, then `systemctl restart earlyoom`",
                paths::EARLYOOM_DEFAULTS
            ),
        )
    }
}

/// The kernel's OOM killer never had to act: earlyoom is meant to step in first.
pub fn kernel_oom_kills(host: &Host) -> Check {
    const NAME: &str = "kernel-oom";
    let log = match host.kernel_log() {
        Ok(log) => log,
        Err(e) => {
            return Check::warn(
                NAME,
                format!("cannot read /dev/kmsg: {e}"),
                "run the doctor as root",
            )
        }
    };
    // "Out of memory: Killed process 1234 (name) ..." and its memory-cgroup variant.
    let victims: Vec<&str> = log
        .lines()
        .filter_map(|l| {
            l.split_once("Killed process ")?
                .1
                .split_once('(')?
                .1
                .split_once(')')
        })
        .map(|(name, _)| name)
        .collect();
    if victims.is_empty() {
        return Check::ok(NAME, "no OOM kills since boot");
    }
    let server_hit = victims.contains(&paths::SERVER_PROCESS);
    Check::fail(
        NAME,
        format!(
            "the kernel OOM-killed {} since boot: {}",
            victims.len(),
            victims.join(", ")
        ),
        if server_hit {
            "the server was killed: it outgrew MemoryMax (raise server.memory.max_over_high_mib or lower ctx_size/parallel) or the box ran dry"
        } else {
            "earlyoom should act before the kernel: check it runs and that earlyoom.mem_term_percent fits the box"
        },
    )
}
