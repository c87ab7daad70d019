//! HTTPS with `--tls-cert/--tls-key` on a spawned server, with a certificate made here; plain
//! HTTP on that port is told to use https and never gets data; bad TLS files exit 1.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use crate::serve_support::{read_head, synth_model, try_request, Server};

/// A self-signed certificate for `localhost` and 127.0.0.1, its DER and the PEM files (also
/// used by `hostile_conn`).
pub(crate) struct Cert {
    der: CertificateDer<'static>,
    cert: PathBuf,
    key: PathBuf,
    dir: PathBuf,
}

impl Cert {
    pub(crate) fn new(name: &str) -> Cert {
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
                .unwrap();
        let dir = std::env::temp_dir().join(format!("llm-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, signing_key.serialize_pem()).unwrap();
        Cert {
            der: cert.der().clone(),
            cert: cert_path,
            key: key_path,
            dir,
        }
    }

    pub(crate) fn args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }
}

impl Drop for Cert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One HTTPS request that trusts only `cert`; status and body.
pub(crate) fn https(
    addr: SocketAddr,
    cert: &Cert,
    request: &str,
) -> std::io::Result<(u16, String)> {
    let mut roots = RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
        .unwrap();
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut tls = StreamOwned::new(conn, tcp);
    tls.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(tls);
    let (status, _) = read_head(&mut reader)?;
    let mut body = String::new();
    // The server closes after `Connection: close`; a missing close_notify is not our concern.
    let _ = reader.read_to_string(&mut body);
    Ok((status, body))
}

pub(crate) fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

pub(crate) fn wait_ready_https(s: &Server, cert: &Cert) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(https(s.addr, cert, &get("/health")), Ok((200, _))) {
        assert!(Instant::now() < deadline, "not ready:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn https_answers_and_plain_http_is_refused() {
    let cert = Cert::new("serve");
    let args = cert.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Server::spawn(&synth_model(), &args);
    wait_ready_https(&s, &cert);

    let body = r#"{"prompt": "Hello", "max_tokens": 2}"#;
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = https(s.addr, &cert, &request).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");

    // Plain HTTP on the TLS port: a plain-text 400 that says https, no data.
    for path in ["/health", "/v1/models"] {
        let r = try_request(s.addr, "GET", path, &[], b"").unwrap();
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.body.contains("https://"), "{}", r.body);
        assert!(!r.body.contains("model"), "{}", r.body);
    }
    assert!(s.log().contains("listening on https://"), "{}", s.log());
    // HTTPS still works after the refusals.
    assert_eq!(https(s.addr, &cert, &get("/health")).unwrap().0, 200);
}

/// Unreadable or mismatched TLS files, and a certificate without its key, exit 1 (systemd
/// must not restart them) with a message naming the file.
#[test]
fn bad_tls_files_exit_1() {
    let cert = Cert::new("bad");
    let other = Cert::new("other");
    let missing = cert.dir.join("missing.pem");
    let cases: Vec<(Vec<&Path>, &str)> = vec![
        (vec![&missing, &cert.key], "missing.pem"),
        (vec![&cert.cert, &cert.cert], "private key"),
        (vec![&cert.cert, &other.key], "do not go together"),
    ];
    for (files, expected) in cases {
        let (c, k) = (
            files[0].display().to_string(),
            files[1].display().to_string(),
        );
        let mut s = Server::spawn(&synth_model(), &["--tls-cert", &c, "--tls-key", &k]);
        let status = s.wait_exit(Duration::from_secs(60));
        assert_eq!(status.code(), Some(1), "{}", s.log());
        assert!(s.log().contains(expected), "{expected}: {}", s.log());
    }
    let c = cert.cert.display().to_string();
    let mut s = Server::spawn(&synth_model(), &["--tls-cert", &c]);
    assert_eq!(s.wait_exit(Duration::from_secs(60)).code(), Some(1));
    assert!(s.log().contains("--tls-key"), "{}", s.log());
}
