//! `appliance secrets` against a fake metadata service: keys and certificate from the metadata
//! when given (and allowed), made once and kept otherwise, root-only, and bad metadata refused
//! with the fix.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use appliance::profile::{ApiKeys, Profile, Tls};
use appliance::secrets::{self, Files, Metadata, Source};
use appliance::tls::Fingerprint;

/// Metadata keys and their values; `Err` for every key when `down`.
#[derive(Default)]
struct FakeMetadata {
    values: BTreeMap<&'static str, String>,
    down: bool,
    asked: std::cell::Cell<u32>,
}

impl Metadata for FakeMetadata {
    fn get(&self, key: &str) -> Result<Option<String>, String> {
        self.asked.set(self.asked.get() + 1);
        if self.down {
            return Err("connection refused".into());
        }
        Ok(self.values.get(key).cloned())
    }
}

fn e2_micro() -> Profile {
    Profile::load(&test_support::default_profile()).unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

const KEY_A: &str = "key-from-metadata-0123456789abcdef";
const KEY_B: &str = "second-key-0123456789abcdef";

#[test]
fn without_metadata_a_key_and_a_certificate_are_made_once_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let p = e2_micro();
    let first = secrets::provision(&p, &files, &FakeMetadata::default()).unwrap();
    assert_eq!(
        (first.keys, first.tls),
        (Source::Generated, Source::Generated)
    );
    let key = std::fs::read_to_string(&files.api_keys).unwrap();
    // 256 bits as 64 hex digits, one line.
    assert_eq!(key.len(), 65, "{key:?}");
    assert!(key.trim_end().bytes().all(|b| b.is_ascii_hexdigit()));
    for path in [&files.api_keys, &files.tls_cert, &files.tls_key] {
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }
    assert_eq!(mode(files.api_keys.parent().unwrap()), 0o700);
    let pem = std::fs::read(&files.tls_cert).unwrap();
    assert_eq!(first.fingerprint, Some(Fingerprint::of_pem(&pem).unwrap()));

    let second = secrets::provision(&p, &files, &FakeMetadata::default()).unwrap();
    assert_eq!((second.keys, second.tls), (Source::Kept, Source::Kept));
    assert_eq!(std::fs::read_to_string(&files.api_keys).unwrap(), key);
    assert_eq!(second.fingerprint, first.fingerprint);

    // Another box makes another key.
    let other = tempfile::tempdir().unwrap();
    secrets::provision(&p, &Files::under(other.path()), &FakeMetadata::default()).unwrap();
    assert_ne!(
        std::fs::read_to_string(Files::under(other.path()).api_keys).unwrap(),
        key
    );
}

#[test]
fn metadata_keys_and_certificate_are_taken_at_every_boot() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let p = e2_micro();
    // A certificate made elsewhere, handed over as the launch's metadata.
    let elsewhere = tempfile::tempdir().unwrap();
    let made = Files::under(elsewhere.path());
    secrets::provision(&p, &made, &FakeMetadata::default()).unwrap();
    let cert = std::fs::read_to_string(&made.tls_cert).unwrap();
    let key = std::fs::read_to_string(&made.tls_key).unwrap();
    let mut metadata = FakeMetadata::default();
    metadata.values.insert(
        secrets::METADATA_API_KEYS,
        format!("# ours\n{KEY_A}\n\n  {KEY_B}  \n"),
    );
    metadata
        .values
        .insert(secrets::METADATA_TLS_CERT, cert.clone());
    metadata.values.insert(secrets::METADATA_TLS_KEY, key);
    let got = secrets::provision(&p, &files, &metadata).unwrap();
    assert_eq!((got.keys, got.tls), (Source::Metadata, Source::Metadata));
    assert_eq!(
        std::fs::read_to_string(&files.api_keys).unwrap(),
        format!("{KEY_A}\n{KEY_B}\n")
    );
    assert_eq!(std::fs::read_to_string(&files.tls_cert).unwrap(), cert);
    assert_eq!(
        got.fingerprint,
        Some(Fingerprint::of_pem(cert.as_bytes()).unwrap())
    );
    // A new key list in the metadata replaces the old one at the next boot.
    metadata
        .values
        .insert(secrets::METADATA_API_KEYS, format!("{KEY_B}\n"));
    secrets::provision(&p, &files, &metadata).unwrap();
    assert_eq!(
        std::fs::read_to_string(&files.api_keys).unwrap(),
        format!("{KEY_B}\n")
    );
}

#[test]
fn the_profile_decides_whether_the_metadata_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let mut p = e2_micro();
    p.server.api_keys = ApiKeys::Generate;
    p.server.tls = Tls::SelfSigned;
    let mut metadata = FakeMetadata::default();
    metadata
        .values
        .insert(secrets::METADATA_API_KEYS, format!("{KEY_A}\n"));
    let got = secrets::provision(&p, &files, &metadata).unwrap();
    assert_eq!((got.keys, got.tls), (Source::Generated, Source::Generated));
    assert!(!std::fs::read_to_string(&files.api_keys)
        .unwrap()
        .contains(KEY_A));

    let off = tempfile::tempdir().unwrap();
    let off_files = Files::under(off.path());
    p.server.api_keys = ApiKeys::None;
    p.server.tls = Tls::None;
    let got = secrets::provision(&p, &off_files, &metadata).unwrap();
    assert_eq!(
        (got.keys, got.tls, got.fingerprint),
        (Source::Off, Source::Off, None)
    );
    assert!(!off_files.api_keys.exists() && !off_files.tls_cert.exists());
    assert!(
        got.log.iter().any(|l| l.starts_with("WARNING")),
        "{:?}",
        got.log
    );
}

#[test]
fn an_unreachable_metadata_service_still_leaves_the_box_with_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let metadata = FakeMetadata {
        down: true,
        ..Default::default()
    };
    let got = secrets::provision(&e2_micro(), &files, &metadata).unwrap();
    assert_eq!((got.keys, got.tls), (Source::Generated, Source::Generated));
    assert!(
        got.log.iter().any(|l| l.contains("connection refused")),
        "{:?}",
        got.log
    );
    // Asked once: the other keys do not wait through the retries again.
    assert_eq!(metadata.asked.get(), 1);
}

#[test]
fn bad_metadata_is_refused_naming_the_fix() {
    let p = e2_micro();
    let refuse = |key: &'static str, value: &str| {
        let dir = tempfile::tempdir().unwrap();
        let mut metadata = FakeMetadata::default();
        metadata.values.insert(key, value.to_owned());
        secrets::provision(&p, &Files::under(dir.path()), &metadata).unwrap_err()
    };
    let e = refuse(secrets::METADATA_API_KEYS, "short\n");
    assert!(
        e.contains("line 1 of the metadata's `llm_api_keys` is not a key"),
        "{e}"
    );
    let e = refuse(
        secrets::METADATA_API_KEYS,
        &format!("{KEY_A}\nhas a space in it 0123456789\n"),
    );
    assert!(e.contains("line 2"), "{e}");
    let e = refuse(secrets::METADATA_API_KEYS, "# only a comment\n");
    assert!(e.contains("holds no key"), "{e}");
    let e = refuse(secrets::METADATA_TLS_CERT, "-----BEGIN CERTIFICATE-----\n");
    assert!(e.contains("give both (PEM), or neither"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let mut metadata = FakeMetadata::default();
    metadata
        .values
        .insert(secrets::METADATA_TLS_CERT, "not a certificate".into());
    metadata
        .values
        .insert(secrets::METADATA_TLS_KEY, "not a key".into());
    let e = secrets::provision(&p, &Files::under(dir.path()), &metadata).unwrap_err();
    assert!(e.contains("`llm_tls_cert` is not a certificate"), "{e}");
}

/// The real IMDS client against a loopback stand-in: the header IMDS v2 requires, 200 and 404.
#[test]
fn the_imds_client_sends_the_bearer_header_and_reads_404_as_not_given() {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let authorized = head.to_lowercase().contains("authorization: bearer oracle");
            let (status, body) = if !authorized {
                ("401 Unauthorized", "")
            } else if head.starts_with("GET /opc/v2/instance/metadata/llm_api_keys ") {
                ("200 OK", "k\n")
            } else {
                ("404 Not Found", "")
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    // The stand-in listens on loopback at another port than 80, which the URL cannot name, so
    // point the client at it through the host part: IMDS::url is what the unit would ask.
    assert_eq!(
        secrets::Imds::url("169.254.169.254".parse().unwrap(), "llm_api_keys"),
        "http://169.254.169.254/opc/v2/instance/metadata/llm_api_keys"
    );
    let imds = secrets::Imds::with_base(format!("http://127.0.0.1:{port}"));
    assert_eq!(imds.get("llm_api_keys").unwrap().as_deref(), Some("k\n"));
    assert_eq!(imds.get("llm_tls_cert").unwrap(), None);
}
