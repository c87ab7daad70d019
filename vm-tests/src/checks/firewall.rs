//! nftables from outside: SSH and the API answer; a listener on a port outside the allowlist,
//! forwarded by QEMU exactly like the allowed ones, does not. Then, as the control, one rule
//! opening that port makes the same probe reach the listener, so "unreachable" cannot come from
//! a dead listener or a broken forward.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, ensure, Result};

use crate::guest::{Guest, CLOSED_PORT};

/// What the listener says to every connection.
const BANNER: &str = "vm-test-listener";
/// How long the host waits for the banner. QEMU accepts the host's connection at once and only
/// then tries the guest, so a dropped SYN shows up as silence, not as a refused connection.
const PROBE_WAIT: Duration = Duration::from_secs(15);

pub fn run(guest: &Guest) -> Result<String> {
    let health = guest.api.get("/health", Duration::from_secs(30))?;
    ensure!(
        health.status == 200,
        "/health from the host: {}",
        health.status
    );
    guest.ssh.check("true")?;

    // A socket-activated echo of the banner, on all addresses; checked from inside first.
    let local = guest.ssh.check(&format!(
        "systemd-run --quiet --collect --unit=vm-test-listener \
           systemd-socket-activate --listen=0.0.0.0:{CLOSED_PORT} --accept --inetd /usr/bin/echo {BANNER}
         sleep 2
         exec 3<>/dev/tcp/127.0.0.1/{CLOSED_PORT} && timeout 10 cat <&3"
    ))?;
    ensure!(
        local.trim() == BANNER,
        "the listener on guest port {CLOSED_PORT} does not answer inside the guest: {local:?}"
    );

    let closed = guest.vm.forward(CLOSED_PORT);
    if let Some(answer) = probe(closed) {
        bail!(
            "guest port {CLOSED_PORT}, outside the allowlist, answered the host through {closed}: \
             {answer:?}"
        );
    }

    guest.ssh.check(&format!(
        "nft insert rule inet appliance input tcp dport {CLOSED_PORT} accept"
    ))?;
    let opened = probe(closed);
    guest.ssh.check("systemctl restart nftables")?;
    match opened {
        Some(answer) if answer.trim() == BANNER => Ok(format!(
            "API and SSH answer; guest port {CLOSED_PORT} silent from the host, and answers \
             {BANNER:?} once a rule accepts it (ruleset reloaded after)"
        )),
        other => bail!(
            "control failed: with port {CLOSED_PORT} accepted the host still got {other:?}, so \
             the probe cannot tell the firewall's drop from a broken forward"
        ),
    }
}

/// What the host reads from `addr` within [`PROBE_WAIT`], if anything.
fn probe(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_WAIT).ok()?;
    stream.set_read_timeout(Some(PROBE_WAIT)).ok()?;
    let mut answer = [0u8; 64];
    match stream.read(&mut answer) {
        Ok(n) if n > 0 => Some(String::from_utf8_lossy(&answer[..n]).into_owned()),
        _ => None,
    }
}
