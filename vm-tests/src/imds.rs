//! The OCI instance metadata service (IMDS v2), as much of it as the appliance uses: the SSH keys
//! given at launch, the instance's VNIC (its private IP) and, in the boot that tests it, the API
//! keys (`llm_api_keys`); every other key answers 404, as OCI does for metadata the launch did
//! not give. QEMU's `guestfwd` runs `vm-tests imds-respond` once per guest connection to
//! 169.254.169.254:80, with the connection on its stdin and stdout.

use std::io::{BufRead, Write};
use std::path::Path;

/// The path OCI serves the launch's SSH public keys at.
pub const KEYS_PATH: &str = "/opc/v2/instance/metadata/ssh_authorized_keys";
/// The path of the user-defined metadata the appliance takes its API keys from.
pub const API_KEYS_PATH: &str = "/opc/v2/instance/metadata/llm_api_keys";
/// The instance's VNICs; the appliance names the first one's private IP in its certificate.
pub const VNICS_PATH: &str = appliance::secrets::VNICS_PATH;
/// The guest's address on QEMU's user network (169.254.0.0/16, see qemu.rs): its DHCP server
/// hands out the network's 15th address first, as OCI's VNIC has its private IP.
pub const GUEST_PRIVATE_IP: &str = "169.254.0.15";
/// IMDS v2 refuses requests without this header (v1's unauthenticated paths are disabled on
/// current OCI images, so the appliance must not rely on them).
const AUTHORIZATION: &str = "Bearer Oracle";

/// Reads one request from `input`, answers it on `output`, and appends one line describing it to
/// `log` so the suite can show how the guest got its key.
pub fn respond(
    input: impl BufRead,
    mut output: impl Write,
    keys: &str,
    api_keys: Option<&str>,
    log: &Path,
) -> anyhow::Result<()> {
    let request = read_head(input)?;
    let (status, body) = answer(&request, keys, api_keys);
    write!(
        output,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    output.flush()?;
    let first = request.lines().next().unwrap_or("").to_owned();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    writeln!(file, "{first} -> {status}")?;
    Ok(())
}

/// The request line and headers, up to the blank line.
fn read_head(mut input: impl BufRead) -> anyhow::Result<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if input.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            return Ok(head);
        }
        head.push_str(&line);
    }
}

/// The status line's code and reason, and the body, for a request head.
fn answer(head: &str, keys: &str, api_keys: Option<&str>) -> (&'static str, String) {
    let mut lines = head.lines();
    let mut request = lines.next().unwrap_or("").split_whitespace();
    let (method, path) = (request.next(), request.next());
    let authorized = lines.any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("authorization") && value.trim() == AUTHORIZATION
        })
    });
    let vnics = format!(
        "[{{\"vnicId\": \"ocid1.vnic.oc1..vmtest\", \"privateIp\": \"{GUEST_PRIVATE_IP}\"}}]\n"
    );
    let served = match path {
        Some(KEYS_PATH) => Some(keys),
        Some(API_KEYS_PATH) => api_keys,
        Some(VNICS_PATH) => Some(vnics.as_str()),
        _ => None,
    };
    match (method, served) {
        (Some("GET"), Some(value)) if authorized => ("200 OK", value.to_owned()),
        (Some("GET"), Some(_)) => (
            "401 Unauthorized",
            format!("IMDS v2 needs the header `Authorization: {AUTHORIZATION}`\n"),
        ),
        _ => (
            "404 Not Found",
            "not served by the VM test's IMDS\n".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "ssh-ed25519 AAAA test\n";

    fn exchange(request: &str) -> (String, String) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("imds.log");
        let mut out = Vec::new();
        respond(
            request.as_bytes(),
            &mut out,
            KEY,
            Some("api-key-0123456789abcdef\n"),
            &log,
        )
        .unwrap();
        (
            String::from_utf8(out).unwrap(),
            std::fs::read_to_string(log).unwrap(),
        )
    }

    #[test]
    fn serves_the_keys_to_an_authorized_request() {
        let (out, log) = exchange(&format!(
            "GET {KEYS_PATH} HTTP/1.1\r\nHost: 169.254.169.254\r\nauthorization:  Bearer Oracle\r\n\r\n"
        ));
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with(&format!(
            "Content-Length: 22\r\nConnection: close\r\n\r\n{KEY}"
        )));
        assert_eq!(log, format!("GET {KEYS_PATH} HTTP/1.1 -> 200 OK\n"));
    }

    #[test]
    fn refuses_a_request_without_the_bearer_header() {
        let (out, _) = exchange(&format!("GET {KEYS_PATH} HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(out.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{out}");
        assert!(!out.contains("ssh-ed25519"));
        let (out, _) = exchange(&format!(
            "GET {KEYS_PATH} HTTP/1.1\r\nAuthorization: Bearer Other\r\n\r\n"
        ));
        assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    }

    #[test]
    fn serves_the_api_keys_when_given_and_404_otherwise() {
        let (out, _) = exchange(&format!(
            "GET {API_KEYS_PATH} HTTP/1.1\r\nAuthorization: Bearer Oracle\r\n\r\n"
        ));
        assert!(out.ends_with("\r\n\r\napi-key-0123456789abcdef\n"), "{out}");
        let (status, _) = answer(
            &format!("GET {API_KEYS_PATH} HTTP/1.1\r\nAuthorization: Bearer Oracle\r\n"),
            KEY,
            None,
        );
        assert_eq!(status, "404 Not Found");
    }

    #[test]
    fn serves_the_vnic_the_appliance_reads_its_private_ip_from() {
        let (out, _) = exchange(&format!(
            "GET {VNICS_PATH} HTTP/1.1\r\nAuthorization: Bearer Oracle\r\n\r\n"
        ));
        let body = out.split_once("\r\n\r\n").unwrap().1;
        assert_eq!(
            appliance::secrets::primary_private_ip(body).unwrap(),
            GUEST_PRIVATE_IP.parse::<std::net::IpAddr>().unwrap()
        );
    }

    #[test]
    fn other_paths_and_methods_are_not_found() {
        for request in [
            "GET /opc/v1/instance/metadata/ HTTP/1.1\r\nAuthorization: Bearer Oracle\r\n\r\n",
            "POST /opc/v2/instance/metadata/ssh_authorized_keys HTTP/1.1\r\nAuthorization: Bearer Oracle\r\n\r\n",
            "",
        ] {
            let (out, _) = exchange(request);
            assert!(out.starts_with("HTTP/1.1 404"), "{request:?}: {out}");
        }
    }
}
