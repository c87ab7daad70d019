//! The server: its unit's cgroup limits and events, its process, and whether it answers.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::paths::{PLAN, SERVER_PROCESS, SERVER_UNIT};
use crate::plan::{ServerPlan, MIB};
use crate::profile::{MemoryLimits, Profile};

use super::{keyed_value, mib, Check, Host, Process};

const JOURNAL_HINT: &str = "see `systemctl status llm-server` and `journalctl -u llm-server`";

pub fn checks(profile: &Profile, host: &Host) -> Vec<Check> {
    let mut checks = Vec::new();
    match find(host) {
        Err(check) => checks.push(check),
        Ok((process, cgroup)) => {
            checks.push(Check::ok(
                "server",
                format!("pid {} in {}", process.pid, cgroup),
            ));
            let dir = format!("/sys/fs/cgroup{cgroup}");
            let resolved = resolved_limits(profile, host);
            checks.push(limits(profile, resolved.as_ref(), host, &process, &dir));
            checks.push(memory_events(host, &dir));
            checks.push(footprint(resolved.ok().as_ref(), host, &process, &dir));
            checks.push(cpu_throttling(host, &dir));
        }
    }
    checks.push(health(profile, host));
    checks
}

/// The server's process and its cgroup, which must be the unit's.
fn find(host: &Host) -> Result<(Process, String), Check> {
    const NAME: &str = "server";
    let Some(process) = host.processes_named(SERVER_PROCESS).into_iter().next() else {
        return Err(Check::fail(NAME, "llm-server is not running", JOURNAL_HINT));
    };
    // cgroup v2: a single line `0::/system.slice/llm-server.service`.
    let cgroup = host
        .read(&format!("/proc/{}/cgroup", process.pid))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .unwrap_or_default();
    if !cgroup.ends_with(&format!("/{SERVER_UNIT}")) {
        return Err(Check::fail(
            NAME,
            format!(
                "llm-server (pid {}) runs outside {SERVER_UNIT} (cgroup `{cgroup}`), so none of \
                 the unit's limits apply",
                process.pid
            ),
            "stop it and run `systemctl start llm-server` instead",
        ));
    }
    Ok((process, cgroup))
}

/// The unit's memory limits as the image builder resolved them: the profile's policy against
/// the plan it installed beside the profile.
fn resolved_limits(profile: &Profile, host: &Host) -> Result<MemoryLimits, String> {
    let json = host
        .read(PLAN)
        .map_err(|e| format!("cannot read the image's memory plan {PLAN}: {e}"))?;
    let plan = ServerPlan::parse(&json).map_err(|e| format!("{PLAN}: {e}"))?;
    profile.memory_limits(&plan).map_err(|e| e.to_string())
}

/// MemoryMin/Low/High/Max as the profile's policy resolves against the image's plan, and
/// OOMScoreAdjust as the profile says.
fn limits(
    profile: &Profile,
    resolved: Result<&MemoryLimits, &String>,
    host: &Host,
    process: &Process,
    dir: &str,
) -> Check {
    const NAME: &str = "unit-limits";
    let m =
        match resolved {
            Ok(m) => m,
            Err(why) => return Check::fail(
                NAME,
                why.clone(),
                "the image builders install the plan the limits are resolved from: rebuild the \
                 image (or copy the build's plan.json there)",
            ),
        };
    let mut wrong = Vec::new();
    for (file, want_mib) in [
        ("memory.min", m.min_mib),
        ("memory.low", m.low_mib),
        ("memory.high", m.high_mib),
        ("memory.max", m.max_mib),
    ] {
        let have = host.read(&format!("{dir}/{file}")).unwrap_or_default();
        let have = have.trim();
        if have.parse::<u64>().ok() != Some(want_mib * MIB) {
            wrong.push(format!("{file} = {have} (want {})", want_mib * MIB));
        }
    }
    let adj = host
        .read(&format!("/proc/{}/oom_score_adj", process.pid))
        .unwrap_or_default();
    if adj.trim().parse::<i32>().ok() != Some(profile.server.oom_score_adjust) {
        wrong.push(format!(
            "oom_score_adj = {} (want {})",
            adj.trim(),
            profile.server.oom_score_adjust
        ));
    }
    if wrong.is_empty() {
        Check::ok(
            NAME,
            format!("{m}, OOMScoreAdjust {}", profile.server.oom_score_adjust),
        )
    } else {
        Check::fail(
            NAME,
            wrong.join(", "),
            "the installed llm-server.service (and its memory.conf drop-in) differs from the \
             profile and the image's plan: render them again, then `systemctl daemon-reload && \
             systemctl restart llm-server`",
        )
    }
}

/// memory.events: the cgroup never ran out of memory, and how often it was throttled.
fn memory_events(host: &Host, dir: &str) -> Check {
    const NAME: &str = "memory-events";
    let Ok(events) = host.read(&format!("{dir}/memory.events")) else {
        return Check::fail(
            NAME,
            format!("cannot read {dir}/memory.events"),
            JOURNAL_HINT,
        );
    };
    let count = |key| keyed_value(&events, key).unwrap_or(0);
    let (oom, kills, high) = (count("oom"), count("oom_kill"), count("high"));
    let detail = format!("oom {oom}, oom_kill {kills}, high {high}");
    if oom > 0 || kills > 0 {
        Check::fail(
            NAME,
            detail,
            "the server reached MemoryMax: raise server.memory.max_over_high_mib (and high_over_need_mib) or lower server.ctx_size/parallel",
        )
    } else if high > 0 {
        Check::warn(
            NAME,
            detail,
            "the server was throttled at MemoryHigh: raise server.memory.high_over_need_mib",
        )
    } else {
        Check::ok(NAME, detail)
    }
}

/// Resident memory, major faults, and memory maps against vm.max_map_count.
fn footprint(limits: Option<&MemoryLimits>, host: &Host, process: &Process, dir: &str) -> Check {
    const NAME: &str = "server-memory";
    let pid = process.pid;
    let rss_kib = host
        .read(&format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    let major_faults = major_faults(&host.read(&format!("/proc/{pid}/stat")).unwrap_or_default());
    let maps = host
        .read(&format!("/proc/{pid}/maps"))
        .map(|m| m.lines().count())
        .unwrap_or(0);
    let max_maps: usize = host
        .read("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let current = host
        .read(&format!("{dir}/memory.current"))
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let high_mib = limits.map(|l| l.high_mib);
    let detail = format!(
        "RSS {} MiB, cgroup {} MiB of MemoryHigh {} MiB, {} major faults, {maps} of {max_maps} memory maps",
        rss_kib / 1024,
        mib(current),
        high_mib.map_or("?".to_owned(), |n| n.to_string()),
        major_faults.map_or("?".to_owned(), |n| n.to_string()),
    );
    if maps * 5 > max_maps * 4 {
        Check::fail(
            NAME,
            detail,
            "the server is close to vm.max_map_count: raise it in the profile's [sysctl]",
        )
    } else if high_mib.is_some_and(|high| current * 20 > high * MIB * 19) {
        Check::warn(
            NAME,
            detail,
            "the server's cgroup is within 5% of MemoryHigh: raise server.memory.high_over_need_mib",
        )
    } else {
        Check::ok(NAME, detail)
    }
}

/// Field 12 of /proc/PID/stat. The name (field 2) may contain spaces and parentheses, so count
/// from the last `)`.
fn major_faults(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(9)?.parse().ok()
}

/// cpu.stat: whether the cgroup's CPU quota held the server back.
fn cpu_throttling(host: &Host, dir: &str) -> Check {
    const NAME: &str = "cpu-throttling";
    let stat = host.read(&format!("{dir}/cpu.stat")).unwrap_or_default();
    let throttled = keyed_value(&stat, "nr_throttled").unwrap_or(0);
    let usec = keyed_value(&stat, "throttled_usec").unwrap_or(0);
    let detail = format!("throttled {throttled} times, {} ms in all", usec / 1000);
    if throttled > 0 {
        Check::warn(
            NAME,
            detail,
            "a CPU quota limits the server: remove CPUQuota= from llm-server.service",
        )
    } else {
        Check::ok(NAME, detail)
    }
}

/// `GET /health` on loopback answers 200: over TLS pinned to the box's own certificate when
/// the profile turns TLS on.
fn health(profile: &Profile, host: &Host) -> Check {
    const NAME: &str = "health";
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, profile.server.api_port.0));
    let (url, line) = if profile.server.tls.enabled() {
        let url = format!("https://{addr}/health");
        let line = super::secrets::fingerprint(host)
            .map_err(std::io::Error::other)
            .and_then(|f| https_status_line(addr, "/health", f));
        (url, line)
    } else {
        (
            format!("http://{addr}/health"),
            http_status_line(addr, "/health"),
        )
    };
    match line {
        Ok(line) if line.split_whitespace().nth(1) == Some("200") => {
            Check::ok(NAME, format!("{url}: {line}"))
        }
        Ok(line) => Check::fail(NAME, format!("{url}: {line}"), JOURNAL_HINT),
        Err(e) => Check::fail(NAME, format!("{url}: {e}"), JOURNAL_HINT),
    }
}

/// The status line (`HTTP/1.1 200 OK`) a plain HTTP/1.1 GET of `path` gets from `addr`.
pub fn http_status_line(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    status_line(connect(addr)?, addr, path)
}

/// The same over TLS, trusting only the certificate `fingerprint`.
pub fn https_status_line(
    addr: SocketAddr,
    path: &str,
    fingerprint: crate::tls::Fingerprint,
) -> std::io::Result<String> {
    let name = rustls::pki_types::ServerName::from(addr.ip());
    let tls = rustls::ClientConnection::new(crate::tls::pinned_client(fingerprint), name)
        .map_err(std::io::Error::other)?;
    status_line(rustls::StreamOwned::new(tls, connect(addr)?), addr, path)
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let timeout = Duration::from_secs(5);
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

fn status_line(
    mut stream: impl Read + Write,
    addr: SocketAddr,
    path: &str,
) -> std::io::Result<String> {
    // One write: a server may answer and close after the first segment it reads.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while head.len() < 512 && !head.ends_with(b"\r\n") {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&head).trim_end().to_owned();
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed without an answer",
        ));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    #[test]
    fn major_faults_skip_names_with_spaces_and_parentheses() {
        let stat = "42 (llm (x) server) S 1 42 42 0 -1 4194560 1000 0 77 0 5 3";
        assert_eq!(super::major_faults(stat), Some(77));
    }
}
