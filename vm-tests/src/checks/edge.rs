//! The box's edge against hostile clients, on the booted guest: the API port's per-source meters
//! are in the loaded ruleset with the profile's numbers and drop a source's connections beyond
//! them; the server's unit cannot reach the metadata service (which hands out the box's
//! secrets) while the box itself can; the API answers over IPv6 as well as IPv4; and the
//! certificate the box made names its addresses and has a sane validity.

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use appliance::paths;
use appliance::Profile;

use super::{properties, section, sections, verdict};
use crate::guest::Guest;
use crate::imds;
use crate::ssh::Ssh;

/// What the meter rules of one family must say, as `nft list ruleset` prints them.
fn expected_meters(profile: &Profile) -> Vec<(String, Vec<String>)> {
    let n = &profile.network;
    let api = profile.server.api_port;
    let rate = format!(
        "limit rate over {}/second burst {} packets",
        n.api_syn_per_source_per_sec, n.api_syn_burst
    );
    let count = format!("ct count over {}", n.api_connections_per_source);
    let mut rules = Vec::new();
    for (family, source) in [
        ("v4", "ip saddr"),
        ("v6", "ip6 saddr & ffff:ffff:ffff:ffff::"),
    ] {
        for (set, bound) in [("syn", &rate), ("conns", &count)] {
            rules.push((
                format!("@api_{set}_{family}"),
                vec![
                    format!("tcp dport {api} "),
                    "ct state new".to_owned(),
                    format!("{{ {source} {bound} }}"),
                ],
            ));
        }
    }
    rules
}

/// The problems of a loaded ruleset's input chain (`nft list ruleset`) against the profile's
/// meters: each present with its numbers, dropping, and before the API's accept rules.
pub fn meter_problems(ruleset: &str, profile: &Profile) -> Vec<String> {
    let lines: Vec<&str> = ruleset.lines().map(str::trim).collect();
    let api_accept = lines.iter().position(|l| {
        l.starts_with(&format!("tcp dport {} ", profile.server.api_port)) && l.ends_with(" accept")
    });
    let mut problems = Vec::new();
    for (set, parts) in expected_meters(profile) {
        let found = lines
            .iter()
            .position(|l| l.contains(&format!("{set} {{")) && !l.starts_with("set "));
        match found {
            None => problems.push(format!("no rule feeds {set}")),
            Some(i) => {
                let line = lines[i];
                for part in &parts {
                    if !line.contains(part.as_str()) {
                        problems.push(format!("the {set} rule lacks `{part}`: {line}"));
                    }
                }
                if !line.ends_with(" drop") {
                    problems.push(format!("the {set} rule does not drop: {line}"));
                }
                if api_accept.is_some_and(|a| a < i) {
                    problems.push(format!(
                        "the {set} rule comes after the API's accept rule: it never sees a packet"
                    ));
                }
            }
        }
    }
    if api_accept.is_none() {
        problems.push("no accept rule for the API port".to_owned());
    }
    problems
}

/// The meters in the loaded ruleset.
pub fn meters_loaded(ssh: &Ssh, profile: &Profile) -> Result<String> {
    let ruleset = ssh.check("nft list ruleset")?;
    let n = &profile.network;
    verdict(
        meter_problems(&ruleset, profile),
        format!(
            "nftables meters on port {} per IPv4 address and IPv6 /64: over {} connections or \
             {}/s SYNs (burst {}) dropped, before the API's accept rules",
            profile.server.api_port,
            n.api_connections_per_source,
            n.api_syn_per_source_per_sec,
            n.api_syn_burst
        ),
    )
}

/// How long the host waits for a listener's banner: QEMU accepts the host's connection at once
/// and only then tries the guest, so a dropped SYN shows as silence.
const PROBE_WAIT: Duration = Duration::from_secs(15);
const BANNER: &str = "vm-test-meter";

/// The connection meter at work. Under QEMU's user networking every connection from the host
/// reaches the guest from one address, so one source is all that can be tried: the host opens
/// the per-source limit's worth of connections to the API port and then two more. The server
/// would close connections beyond its own lower per-address cap first, so it is stopped and a
/// listener that holds every connection open takes the port; the first `limit` connections get
/// its banner, the two beyond it get nothing, and the meter's drop counter rises. The server is
/// left stopped: this runs last on its guest.
pub fn meter_behaviour(guest: &Guest, profile: &Profile) -> Result<String> {
    let port = profile.server.api_port.0;
    let limit = profile.network.api_connections_per_source as usize;
    let counter = "nft list ruleset | grep -F '@api_conns_v4 {' | grep -o 'packets [0-9]*'";
    guest.ssh.check(&format!(
        "systemctl stop {server}
         systemd-run --quiet --collect --unit=vm-test-meter \
           systemd-socket-activate '--listen=[::]:{port}' --accept --inetd \
           /bin/sh -c 'echo {BANNER}; exec sleep 600'
         sleep 2",
        server = paths::SERVER_UNIT,
    ))?;
    let before = guest.ssh.check(counter)?;
    let to = guest.vm.forward(port);
    let mut held = Vec::new();
    let mut seen = String::new();
    for _ in 0..limit + 2 {
        let mut stream = TcpStream::connect_timeout(&to, PROBE_WAIT)
            .with_context(|| format!("connect to {to}"))?;
        stream.set_read_timeout(Some(PROBE_WAIT))?;
        let mut answer = [0u8; 64];
        let answered = matches!(stream.read(&mut answer), Ok(n) if n > 0
            && String::from_utf8_lossy(&answer[..n]).trim() == BANNER);
        seen.push(if answered { '.' } else { 'x' });
        held.push(stream);
    }
    let after = guest.ssh.check(counter)?;
    drop(held);
    let _ = guest.ssh.run("systemctl stop vm-test-meter");
    let want = format!("{}xx", ".".repeat(limit));
    let count = |s: &str| {
        s.trim()
            .trim_start_matches("packets ")
            .parse::<u64>()
            .unwrap_or(0)
    };
    ensure!(
        seen == want,
        "connections from the host in order (. answered, x silent): {seen}, want {want}"
    );
    ensure!(
        count(&after) > count(&before),
        "the meter's drop counter did not rise ({} -> {})",
        before.trim(),
        after.trim()
    );
    Ok(format!(
        "{limit} connections from one source answered, the next two dropped (meter counter {} \
         -> {}); the server was stopped for this and stays stopped",
        before.trim(),
        after.trim()
    ))
}

/// The server cannot reach the metadata service, from inside its own unit: the unit's
/// `IPAddressDeny=` covers the metadata address, and a request made from a process in the
/// unit's cgroup (where systemd's BPF filter applies to every process, the server's included)
/// fails, while the same request from the administrator's shell gets its answer.
pub fn metadata_denied(ssh: &Ssh, profile: &Profile) -> Result<String> {
    let address = profile.oci.metadata_address;
    let url = format!("http://{address}{}", imds::KEYS_PATH);
    // The request as one shell word list, run by `sh -c` from the shell and from a process
    // that first moves itself into the server's cgroup.
    let out = ssh.check(&format!(
        "fetch='timeout 30 curl --silent --max-time 20 -o /dev/null -w %{{http_code}} \
           -H \"Authorization: Bearer Oracle\" {url}'
         echo '## unit'; systemctl show {server} -p IPAddressDeny
         echo '## shell'; sh -c \"$fetch\"; echo \" exit=$?\"
         cgroup=/sys/fs/cgroup$(systemctl show {server} -p ControlGroup --value)
         echo '## server'
         sh -c 'echo $$ > \"$1/cgroup.procs\" && exec sh -c \"$2\"' sh \"$cgroup\" \"$fetch\"
         echo \" exit=$?\"",
        server = paths::SERVER_UNIT,
    ))?;
    let parts = sections(&out);
    let unit = properties(section(&parts, "unit")?);
    let deny = unit.get("IPAddressDeny").copied().unwrap_or("");
    let mut problems = Vec::new();
    // systemd prints networks as `ADDRESS/PREFIX`, a single host as its bare address.
    let covered = deny.split_whitespace().any(|entry| {
        entry
            .parse::<appliance::cidr::Cidr>()
            .is_ok_and(|c| c.contains(address))
            || entry.parse::<std::net::IpAddr>() == Ok(address)
    });
    if !covered {
        problems.push(format!(
            "{}'s IPAddressDeny={deny:?} does not cover {address}",
            paths::SERVER_UNIT
        ));
    }
    let shell = section(&parts, "shell")?.trim();
    if !shell.starts_with("200") {
        problems.push(format!(
            "control: the administrator's shell got {shell:?} from {url}, not 200, so a failure \
             from the unit would prove nothing"
        ));
    }
    // curl ran (it printed a status) and could not connect (000, a failing exit).
    let server = section(&parts, "server")?.trim();
    let refused = server.starts_with("000") && !server.ends_with("exit=0");
    if !refused {
        problems.push(format!(
            "from inside {} the request to {url} got {server:?}: the server could read the \
             box's secrets",
            paths::SERVER_UNIT
        ));
    }
    verdict(
        problems,
        format!(
            "IPAddressDeny={deny} on {}; from its cgroup the metadata request fails ({server}), \
             from the shell it is answered 200",
            paths::SERVER_UNIT
        ),
    )
}

/// The API over IPv6: the server listens on `::` (both families; the host has reached it over
/// IPv4 all along), and answers `/health` at `[::1]` inside the guest. The certificate the box
/// made names the host name, localhost, both loopback addresses and the private IP the
/// metadata gave, and is valid for years, not centuries.
pub fn ipv6_and_certificate(ssh: &Ssh, profile: &Profile) -> Result<String> {
    let port = profile.server.api_port;
    let out = ssh.check(&format!(
        "echo '## listen'; cat /proc/net/tcp6
         echo '## bindv6only'; cat /proc/sys/net/ipv6/bindv6only
         echo '## health'; curl --silent --globoff --insecure --max-time 60 -o /dev/null -w '%{{http_code}}' \
           'https://[::1]:{port}/health' || true; echo
         echo '## cert'; cat {cert}",
        cert = paths::TLS_CERT,
    ))?;
    let parts = sections(&out);
    let mut problems = Vec::new();
    if !listens_on_any_v6(section(&parts, "listen")?, port.0) {
        problems.push(format!(
            "nothing listens on [::]:{port} (/proc/net/tcp6 has no such listening socket)"
        ));
    }
    let v6only = section(&parts, "bindv6only")?.trim();
    if v6only != "0" {
        problems.push(format!(
            "net.ipv6.bindv6only = {v6only}: a socket on :: would not take IPv4"
        ));
    }
    let health = section(&parts, "health")?.trim();
    if health != "200" {
        problems.push(format!("https://[::1]:{port}/health answered {health:?}"));
    }
    let cert = section(&parts, "cert")?;
    match appliance::tls::inspect(cert.as_bytes()) {
        Ok(info) => {
            for name in [
                profile.machine.hostname.as_str(),
                "localhost",
                "127.0.0.1",
                "::1",
                imds::GUEST_PRIVATE_IP,
            ] {
                if !info.names.iter().any(|n| n == name) {
                    problems.push(format!(
                        "the certificate does not name {name}: {:?}",
                        info.names
                    ));
                }
            }
            let days = (info.not_after - info.not_before) / 86_400;
            if !info.made_here || days > 4 * 365 {
                problems.push(format!(
                    "the certificate is not the box's own sane one (made here: {}, valid {days} \
                     days)",
                    info.made_here
                ));
            }
        }
        Err(e) => problems.push(format!("{}: {e}", paths::TLS_CERT)),
    }
    verdict(
        problems,
        format!(
            "listening on [::]:{port} (bindv6only 0: IPv4 too); https://[::1]:{port}/health 200; \
             the certificate names {}, {}, 127.0.0.1, ::1 and {}",
            profile.machine.hostname,
            "localhost",
            imds::GUEST_PRIVATE_IP
        ),
    )
}

/// Whether /proc/net/tcp6 holds a socket listening (state 0A) on `::` at `port`.
fn listens_on_any_v6(proc_net_tcp6: &str, port: u16) -> bool {
    let local = format!("{}:{port:04X}", "0".repeat(32));
    proc_net_tcp6.lines().skip(1).any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_listener_on_any_v6_address() {
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 61234        0 2345 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0
";
        assert!(listens_on_any_v6(tcp6, 8080));
        assert!(!listens_on_any_v6(tcp6, 22));
        assert!(!listens_on_any_v6(tcp6, 8081));
    }

    fn profile() -> Profile {
        Profile::load(&test_support::default_profile()).unwrap()
    }

    /// `nft list ruleset` as nftables 1.0.6 (Debian bookworm's) prints the rendered ruleset,
    /// the input chain's API rules.
    const LISTED: &str = "\
	chain input {
		tcp dport 22 ip6 saddr @ssh_v6 accept
		tcp dport 8080 ip saddr @api_v4 ct state new update @api_syn_v4 { ip saddr limit rate over 10/second burst 20 packets } counter packets 0 bytes 0 drop
		tcp dport 8080 ip saddr @api_v4 ct state new add @api_conns_v4 { ip saddr ct count over 16 } counter packets 3 bytes 180 drop
		tcp dport 8080 ip6 saddr @api_v6 ct state new update @api_syn_v6 { ip6 saddr & ffff:ffff:ffff:ffff:: limit rate over 10/second burst 20 packets } counter packets 0 bytes 0 drop
		tcp dport 8080 ip6 saddr @api_v6 ct state new add @api_conns_v6 { ip6 saddr & ffff:ffff:ffff:ffff:: ct count over 16 } counter packets 0 bytes 0 drop
		tcp dport 8080 ip saddr @api_v4 accept
		tcp dport 8080 ip6 saddr @api_v6 accept
	}
";

    #[test]
    fn finds_the_meters_as_nft_lists_them() {
        assert_eq!(meter_problems(LISTED, &profile()), Vec::<String>::new());
    }

    #[test]
    fn a_missing_wrong_or_late_meter_is_named() {
        let p = profile();
        let flushed = "table inet appliance {\n}\n";
        assert_eq!(meter_problems(flushed, &p).len(), 5);
        let loose = LISTED.replace("ct count over 16 }", "ct count over 99 }");
        let problems = meter_problems(&loose, &p);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("ct count over 16"), "{problems:?}");
        let accepting = LISTED.replace("bytes 180 drop", "bytes 180 accept");
        assert!(meter_problems(&accepting, &p)[0].contains("does not drop"));
        let late: String = {
            let mut lines: Vec<&str> = LISTED.lines().collect();
            let syn = lines.remove(2);
            lines.insert(6, syn);
            lines.join("\n")
        };
        let problems = meter_problems(&late, &p);
        assert!(
            problems.iter().any(|p| p.contains("comes after")),
            "{problems:?}"
        );
    }
}
