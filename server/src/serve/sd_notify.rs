//! systemd's readiness protocol (`Type=notify`): datagrams such as `READY=1` sent to the socket
//! named by `$NOTIFY_SOCKET`, a path or, when it starts with `@`, an abstract socket name.
//! Without `$NOTIFY_SOCKET` (not under systemd) every call does nothing.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Sends `state` (e.g. `"READY=1"`); `Ok(false)` when not running under systemd.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy();
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(path.as_ref())?,
    };
    let socket = UnixDatagram::unbound()?;
    // Called from async tasks: a full receive queue (a reader that does not keep up) must be
    // an error, not a blocked worker thread.
    socket.set_nonblocking(true)?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, as sd_watchdog_enabled(3)
/// recommends, if the watchdog is enabled for this process.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse() != Ok(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test for both socket kinds: the environment is process-wide.
    #[test]
    fn datagrams_reach_path_and_abstract_sockets() {
        let dir = std::env::temp_dir().join(format!("llm-sd-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        let name = format!("llm-sd-notify-test-{}", std::process::id());
        let abstract_addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&abstract_addr).unwrap();
        let mut buf = [0u8; 64];

        // SAFETY: no other test in this binary reads or writes NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        assert!(notify("READY=1").unwrap());
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        unsafe { std::env::set_var("NOTIFY_SOCKET", format!("@{name}")) };
        assert!(notify("STOPPING=1").unwrap());
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");

        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(!notify("READY=1").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
