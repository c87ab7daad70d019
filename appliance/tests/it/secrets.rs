//! `appliance secrets` against a fake metadata service: keys and certificate from the metadata
//! when given (and allowed), made once and kept otherwise, root-only, and bad metadata refused
//! with the fix. Keys and a certificate the metadata stops giving are replaced; a metadata
//! service that cannot be reached changes nothing. The certificate the box makes has a sane
//! validity, names the box's addresses, and is made again near its end.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use appliance::profile::{ApiKeys, Profile, Tls};
use appliance::secrets::{
    self, Files, KeyListError, Metadata, MetadataError, ProvisionError, Source, VnicsError,
};
use appliance::tls::{self, CertError, Fingerprint};

/// Metadata keys and their values; `Err` for every key when `down`.
#[derive(Default)]
struct FakeMetadata {
    values: BTreeMap<&'static str, String>,
    private_ip: Option<IpAddr>,
    down: bool,
    asked: std::cell::Cell<u32>,
}

/// What the real client says when nothing listens at the service's address.
fn refused() -> MetadataError {
    MetadataError::Unreachable {
        url: "http://169.254.169.254/opc/v2/instance/metadata".into(),
        error: Arc::new(ureq::Error::Io(
            std::io::ErrorKind::ConnectionRefused.into(),
        )),
        tries: 6,
    }
}

impl Metadata for FakeMetadata {
    fn get(&self, key: &str) -> Result<Option<String>, MetadataError> {
        self.asked.set(self.asked.get() + 1);
        if self.down {
            return Err(refused());
        }
        Ok(self.values.get(key).cloned())
    }

    fn private_ip(&self) -> Result<Option<IpAddr>, MetadataError> {
        self.asked.set(self.asked.get() + 1);
        if self.down {
            return Err(refused());
        }
        Ok(self.private_ip)
    }
}

/// The keys of the box's key file, as the server reads them.
fn keys_in(files: &Files) -> Vec<String> {
    secrets::parse_keys(&std::fs::read_to_string(&files.api_keys).unwrap()).unwrap()
}

fn with_keys(text: &str) -> FakeMetadata {
    let mut metadata = FakeMetadata::default();
    metadata
        .values
        .insert(secrets::METADATA_API_KEYS, text.to_owned());
    metadata
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
    // 256 bits as 64 hex digits, one line, under the line that says the box made it.
    let keys = keys_in(&files);
    assert_eq!(keys.len(), 1, "{key:?}");
    assert_eq!(keys[0].len(), 64, "{key:?}");
    assert!(keys[0].bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(key.starts_with(secrets::GENERATED_KEYS_HEADER), "{key:?}");
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
        format!("{}\n{KEY_A}\n{KEY_B}\n", secrets::METADATA_KEYS_HEADER)
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
    assert_eq!(keys_in(&files), [KEY_B]);
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
    // Keys an earlier boot took from the metadata do not survive a switch to "generate".
    let switched = tempfile::tempdir().unwrap();
    let switched_files = Files::under(switched.path());
    p.server.api_keys = ApiKeys::Metadata;
    secrets::provision(&p, &switched_files, &metadata).unwrap();
    p.server.api_keys = ApiKeys::Generate;
    let got = secrets::provision(&p, &switched_files, &metadata).unwrap();
    assert_eq!(got.keys, Source::Replaced);
    assert_ne!(keys_in(&switched_files), [KEY_A]);

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
    // Asked once: the other keys do not wait through the retries again, and each warning names
    // the first ask's cause (the keys, the certificate and its key, the private address).
    assert_eq!(metadata.asked.get(), 1);
    let cause = refused().to_string();
    assert!(cause.contains("connection refused"), "{cause}");
    let warned = got.log.iter().filter(|l| l.contains(&cause)).count();
    assert_eq!(warned, 4, "{:?}", got.log);
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
        matches!(e, ProvisionError::Keys(KeyListError::NotAKey { line: 1 })),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("line 1 of the metadata's `llm_api_keys` is not a key"),
        "{e}"
    );
    let e = refuse(
        secrets::METADATA_API_KEYS,
        &format!("{KEY_A}\nhas a space in it 0123456789\n"),
    );
    assert!(
        matches!(e, ProvisionError::Keys(KeyListError::NotAKey { line: 2 })),
        "{e:?}"
    );
    assert!(e.to_string().contains("line 2"), "{e}");
    let e = refuse(secrets::METADATA_API_KEYS, "# only a comment\n");
    assert!(
        matches!(e, ProvisionError::Keys(KeyListError::NoKey)),
        "{e:?}"
    );
    assert!(e.to_string().contains("holds no key"), "{e}");
    let e = refuse(secrets::METADATA_TLS_CERT, "-----BEGIN CERTIFICATE-----\n");
    assert!(matches!(e, ProvisionError::HalfCertificate), "{e:?}");
    assert!(e.to_string().contains("give both (PEM), or neither"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let mut metadata = FakeMetadata::default();
    metadata
        .values
        .insert(secrets::METADATA_TLS_CERT, "not a certificate".into());
    metadata
        .values
        .insert(secrets::METADATA_TLS_KEY, "not a key".into());
    let e = secrets::provision(&p, &Files::under(dir.path()), &metadata).unwrap_err();
    assert!(
        matches!(e, ProvisionError::MetadataCert(CertError::NoCertificate)),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("`llm_tls_cert` is not a certificate"),
        "{e}"
    );
    // A good certificate with a key that is not one.
    let given = ca_like_certificate();
    metadata
        .values
        .insert(secrets::METADATA_TLS_CERT, given.cert_pem);
    let e = secrets::provision(&p, &Files::under(dir.path()), &metadata).unwrap_err();
    assert!(matches!(e, ProvisionError::MetadataKey(_)), "{e:?}");
    assert!(
        e.to_string().contains("`llm_tls_key` is not a private key"),
        "{e}"
    );
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

/// The issue's finding: removing `llm_api_keys` from the metadata must not leave its key valid.
/// A metadata service that answers without it revokes the keys it gave; the console says so.
#[test]
fn keys_the_metadata_stops_giving_are_replaced_by_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let p = e2_micro();
    secrets::provision(&p, &files, &with_keys(&format!("{KEY_A}\n"))).unwrap();
    assert_eq!(keys_in(&files), [KEY_A]);

    let got = secrets::provision(&p, &files, &FakeMetadata::default()).unwrap();
    assert_eq!(got.keys, Source::Replaced);
    let keys = keys_in(&files);
    assert_eq!(keys.len(), 1);
    assert_ne!(keys[0], KEY_A);
    assert_eq!(keys[0].len(), 64);
    let said = got.log.join("\n");
    assert!(
        said.contains("no longer gives `llm_api_keys`")
            && said.contains("revoked")
            && said.contains(&keys[0][..8]),
        "{said}"
    );

    // The box's own key is then kept: later boots without the metadata's keys change nothing.
    let again = secrets::provision(&p, &files, &FakeMetadata::default()).unwrap();
    assert_eq!(again.keys, Source::Kept);
    assert_eq!(keys_in(&files), keys);

    // A key file without the box's header (written by hand, or by an older appliance) is not
    // vouched for either.
    std::fs::write(&files.api_keys, format!("{KEY_B}\n")).unwrap();
    let got = secrets::provision(&p, &files, &FakeMetadata::default()).unwrap();
    assert_eq!(got.keys, Source::Replaced);
    assert_ne!(keys_in(&files), [KEY_B]);
}

/// An unreachable metadata service is not a removed key: the box keeps the metadata's keys (and
/// says it did) rather than locking out every client until it answers again.
#[test]
fn an_unreachable_metadata_service_keeps_the_keys_it_gave() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let p = e2_micro();
    secrets::provision(&p, &files, &with_keys(&format!("{KEY_A}\n"))).unwrap();
    let down = FakeMetadata {
        down: true,
        ..Default::default()
    };
    let got = secrets::provision(&p, &files, &down).unwrap();
    assert_eq!((got.keys, got.tls), (Source::Kept, Source::Kept));
    assert_eq!(keys_in(&files), [KEY_A]);
    let said = got.log.join("\n");
    assert!(
        said.contains("could not reach the instance metadata")
            && said.contains("keeping the API key(s) of an earlier boot (from the metadata)"),
        "{said}"
    );
}

const DAY: Duration = Duration::from_secs(86_400);

/// The certificate the box makes: valid from a day before it is made for three years (not
/// 1975 to 4096), named for the host, localhost, both loopback addresses and the private IP
/// the metadata gives, and marked as the box's own.
#[test]
fn the_self_signed_certificate_has_a_sane_window_and_the_boxs_names() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let metadata = FakeMetadata {
        private_ip: Some("10.0.0.23".parse().unwrap()),
        ..Default::default()
    };
    let now = SystemTime::now();
    let got = secrets::provision_at(&e2_micro(), &files, &metadata, now).unwrap();
    assert_eq!(got.tls, Source::Generated);
    let info = tls::inspect(&std::fs::read(&files.tls_cert).unwrap()).unwrap();
    let now_secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let day = DAY.as_secs() as i64;
    assert!((info.not_before - (now_secs - day)).abs() <= 2, "{info:?}");
    let lifetime_days = (info.not_after - info.not_before) / day;
    assert_eq!(
        lifetime_days,
        tls::LIFETIME_DAYS + tls::BACKDATE_DAYS,
        "{info:?}"
    );
    assert!(info.made_here);
    assert_eq!(
        info.names,
        [
            "llm-appliance",
            "localhost",
            "127.0.0.1",
            "::1",
            "10.0.0.23"
        ]
    );
    assert!(
        got.log.iter().any(|l| l.contains("10.0.0.23")),
        "{:?}",
        got.log
    );

    // Without a private address from the metadata, the rest of the names.
    let other = tempfile::tempdir().unwrap();
    let other_files = Files::under(other.path());
    secrets::provision(&e2_micro(), &other_files, &FakeMetadata::default()).unwrap();
    let info = tls::inspect(&std::fs::read(&other_files.tls_cert).unwrap()).unwrap();
    assert_eq!(
        info.names,
        ["llm-appliance", "localhost", "127.0.0.1", "::1"]
    );
}

/// A boot within 30 days of the certificate's end makes a new one; earlier boots keep it.
#[test]
fn the_self_signed_certificate_is_made_again_near_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let p = e2_micro();
    let made = SystemTime::now();
    secrets::provision_at(&p, &files, &FakeMetadata::default(), made).unwrap();
    let first = std::fs::read(&files.tls_cert).unwrap();
    let days = |n: i64| DAY * u32::try_from(n).unwrap();

    let later = made + days(tls::LIFETIME_DAYS - tls::RENEW_WITHIN_DAYS - 2);
    let kept = secrets::provision_at(&p, &files, &FakeMetadata::default(), later).unwrap();
    assert_eq!(kept.tls, Source::Kept);
    assert_eq!(std::fs::read(&files.tls_cert).unwrap(), first);

    let near_end = made + days(tls::LIFETIME_DAYS - tls::RENEW_WITHIN_DAYS + 2);
    let renewed = secrets::provision_at(&p, &files, &FakeMetadata::default(), near_end).unwrap();
    assert_eq!(renewed.tls, Source::Replaced);
    let second = std::fs::read(&files.tls_cert).unwrap();
    assert_ne!(second, first);
    let info = tls::inspect(&second).unwrap();
    let near_end_secs = near_end
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(info.not_after > near_end_secs + 365 * 86_400, "{info:?}");
    assert!(
        renewed
            .log
            .iter()
            .any(|l| l.contains("expires in") && l.contains("fingerprint")),
        "{:?}",
        renewed.log
    );
    // The API keys are not touched by it.
    assert_eq!(renewed.keys, Source::Kept);
}

/// A certificate an earlier boot took from the metadata goes once the metadata answers without
/// it, and stays while the metadata cannot be reached.
#[test]
fn a_certificate_the_metadata_stops_giving_is_replaced() {
    let p = e2_micro();
    let given = ca_like_certificate();
    assert!(!tls::inspect(given.cert_pem.as_bytes()).unwrap().made_here);
    let mut metadata = FakeMetadata::default();
    metadata
        .values
        .insert(secrets::METADATA_TLS_CERT, given.cert_pem.clone());
    metadata
        .values
        .insert(secrets::METADATA_TLS_KEY, given.key_pem.clone());
    let dir = tempfile::tempdir().unwrap();
    let files = Files::under(dir.path());
    let got = secrets::provision(&p, &files, &metadata).unwrap();
    assert_eq!(got.tls, Source::Metadata);

    let down = FakeMetadata {
        down: true,
        ..Default::default()
    };
    let kept = secrets::provision(&p, &files, &down).unwrap();
    assert_eq!(kept.tls, Source::Kept);
    assert_eq!(
        std::fs::read_to_string(&files.tls_cert).unwrap(),
        given.cert_pem
    );

    let replaced = secrets::provision(&p, &files, &FakeMetadata::default()).unwrap();
    assert_eq!(replaced.tls, Source::Replaced);
    let info = tls::inspect(&std::fs::read(&files.tls_cert).unwrap()).unwrap();
    assert!(info.made_here, "{info:?}");
    assert!(
        replaced
            .log
            .iter()
            .any(|l| l.contains("no longer gives one")),
        "{:?}",
        replaced.log
    );
}

/// A certificate that does not carry the box's mark, as one from a CA would not.
fn ca_like_certificate() -> tls::Made {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["api.example".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    tls::Made {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[test]
fn the_private_ip_is_the_first_vnics() {
    let json = r#"[{"vnicId": "ocid1.vnic.oc1..a", "privateIp": "10.0.0.23", "vlanTag": 0},
                   {"vnicId": "ocid1.vnic.oc1..b", "privateIp": "10.0.1.5"}]"#;
    assert_eq!(
        secrets::primary_private_ip(json).unwrap(),
        "10.0.0.23".parse::<IpAddr>().unwrap()
    );
    let e = secrets::primary_private_ip("[]").unwrap_err();
    assert!(matches!(e, VnicsError::NoPrivateIp), "{e:?}");
    assert!(e.to_string().contains("names no privateIp"), "{e}");
    let e = secrets::primary_private_ip(r#"[{"privateIp": "ten"}]"#).unwrap_err();
    assert!(
        matches!(&e, VnicsError::BadPrivateIp { text, .. } if text == "ten"),
        "{e:?}"
    );
    let e = secrets::primary_private_ip("<html>").unwrap_err();
    assert!(matches!(e, VnicsError::NotJson(_)), "{e:?}");
    assert!(e.to_string().contains("is not JSON"), "{e}");
}
