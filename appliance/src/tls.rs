//! The box's certificate: the self-signed one a box makes for itself ([`self_signed`]) and what
//! a later boot reads back from it to renew it in time ([`inspect`]); and the certificate as
//! its clients see it: the SHA-256 fingerprint the banner and `appliance doctor` show, and a
//! rustls client that trusts exactly that certificate (a self-signed one has no CA to check it
//! against, so it is pinned instead).

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring as provider, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

const DAY_SECS: i64 = 86_400;
/// A certificate the box makes starts a day before it is made, so a client whose clock runs a
/// little behind still accepts it.
pub const BACKDATE_DAYS: i64 = 1;
/// ... and ends about three years later: long enough that an appliance left alone keeps working,
/// short enough that a leaked key does not stay good for ever.
pub const LIFETIME_DAYS: i64 = 3 * 365;
/// A boot makes a new one when the kept certificate has less than this left (or has expired).
pub const RENEW_WITHIN_DAYS: i64 = 30;
/// The organisation (O) a certificate the box makes names: how a later boot tells its own
/// certificate from one the metadata gave.
pub const SELF_SIGNED_ORGANIZATION: &str = "llm-appliance self-signed";

// The errors below put their cause's text in their own message, as the journal and the doctor
// print it, and keep the cause in a field to match on rather than in `source()`: a printer
// that walks the chain (anyhow's `{:#}`) would otherwise say it twice.

/// Why PEM text gives no certificate ([`inspect`], [`Fingerprint::of_pem`]).
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("no `BEGIN CERTIFICATE` block")]
    NoCertificate,
    #[error("not a PEM certificate: {0}")]
    Pem(rustls::pki_types::pem::Error),
    #[error("not an X.509 certificate: {0}")]
    X509(x509_parser::nom::Err<x509_parser::error::X509Error>),
}

/// Why [`self_signed`] made no certificate.
#[derive(Debug, thiserror::Error)]
pub enum SelfSignedError {
    #[error("could not make a self-signed certificate: {0}")]
    Rcgen(rcgen::Error),
    /// The validity window does not fit `time`'s dates (a clock far off).
    #[error("could not make a self-signed certificate: {0}")]
    Date(time::error::ComponentRange),
}

/// Text that is not a fingerprint in the `AB:CD:...` form ([`Fingerprint::parse`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a SHA-256 fingerprint (64 hex digits)")]
pub struct FingerprintParseError {
    /// The text as given.
    pub text: String,
}

/// A certificate and its private key, PEM.
pub struct Made {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The names a certificate the box makes carries: its host name, `localhost`, the loopback
/// addresses, and the instance's private address when the metadata gives it. OCI's public IP is
/// NAT'd to the private one and appears nowhere on the box, so it cannot be named: clients that
/// reach the box by its public address pin the fingerprint (or use a certificate given through
/// the metadata).
pub fn subject_alt_names(hostname: &str, private_ip: Option<IpAddr>) -> Vec<String> {
    let mut names = vec![
        hostname.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if let Some(ip) = private_ip {
        names.push(ip.to_string());
    }
    names.dedup();
    names
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// A self-signed certificate (ECDSA P-256) for `names` ([`subject_alt_names`]), valid from
/// [`BACKDATE_DAYS`] before `now` for [`LIFETIME_DAYS`], for TLS servers.
pub fn self_signed(
    hostname: &str,
    names: &[String],
    now: SystemTime,
) -> Result<Made, SelfSignedError> {
    let err = SelfSignedError::Rcgen;
    let date =
        |secs: i64| time::OffsetDateTime::from_unix_timestamp(secs).map_err(SelfSignedError::Date);
    let now = unix_secs(now);
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(err)?;
    params.not_before = date(now - BACKDATE_DAYS * DAY_SECS)?;
    params.not_after = date(now + LIFETIME_DAYS * DAY_SECS)?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, hostname);
    dn.push(rcgen::DnType::OrganizationName, SELF_SIGNED_ORGANIZATION);
    params.distinguished_name = dn;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().map_err(err)?;
    let cert = params.self_signed(&key).map_err(err)?;
    Ok(Made {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The first certificate of `pem` (the server's own; a chain follows it).
fn first_certificate(pem: &[u8]) -> Result<CertificateDer<'static>, CertError> {
    CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or(CertError::NoCertificate)?
        .map_err(CertError::Pem)
}

/// What a boot reads back from a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Seconds since the Unix epoch.
    pub not_before: i64,
    pub not_after: i64,
    /// Made by a box for itself ([`SELF_SIGNED_ORGANIZATION`]), not given through the metadata.
    pub made_here: bool,
    /// Its subject alternative names: DNS names and IP addresses as text.
    pub names: Vec<String>,
}

/// Reads the first certificate of `pem`.
pub fn inspect(pem: &[u8]) -> Result<CertInfo, CertError> {
    use x509_parser::extensions::GeneralName;
    let der = first_certificate(pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(CertError::X509)?;
    let validity = cert.validity();
    let made_here = cert
        .subject()
        .iter_organization()
        .any(|o| o.as_str() == Ok(SELF_SIGNED_ORGANIZATION));
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(n) => names.push((*n).to_owned()),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    names.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        made_here,
        names,
    })
}

impl CertInfo {
    /// Why a boot at `now` must replace this certificate, if it must: it has expired or expires
    /// within [`RENEW_WITHIN_DAYS`]. (One not valid yet is kept: that says the clock is behind,
    /// and a certificate made by that clock would be wrong too.)
    pub fn renewal_due(&self, now: SystemTime) -> Option<String> {
        let now = unix_secs(now);
        let days_left = (self.not_after - now).div_euclid(DAY_SECS);
        if self.not_after <= now {
            Some("it has expired".to_owned())
        } else if days_left < RENEW_WITHIN_DAYS {
            Some(format!(
                "it expires in {days_left} days (renewed within {RENEW_WITHIN_DAYS})"
            ))
        } else {
            None
        }
    }
}

/// A certificate's SHA-256 over its DER bytes, as `openssl x509 -noout -fingerprint -sha256`
/// prints it: `AB:CD:...`, 32 pairs of upper-case hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of_der(der: &[u8]) -> Fingerprint {
        let digest = ring::digest::digest(&ring::digest::SHA256, der);
        Fingerprint(digest.as_ref().try_into().expect("SHA-256 has 32 bytes"))
    }

    /// The fingerprint of the first certificate in `pem` (the server's own; a chain follows it).
    pub fn of_pem(pem: &[u8]) -> Result<Fingerprint, CertError> {
        Ok(Fingerprint::of_der(&first_certificate(pem)?))
    }

    /// Parses the `AB:CD:...` form (case and colons optional).
    pub fn parse(s: &str) -> Result<Fingerprint, FingerprintParseError> {
        let err = || FingerprintParseError { text: s.to_owned() };
        let hex: String = s.chars().filter(|c| *c != ':').collect();
        let mut bytes = [0u8; 32];
        if hex.len() != 64 {
            return Err(err());
        }
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = hex
                .get(2 * i..2 * i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(err)?;
        }
        Ok(Fingerprint(bytes))
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::with_capacity(95);
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                s.push(':');
            }
            write!(s, "{b:02X}").expect("writing to a String");
        }
        f.write_str(&s)
    }
}

/// Trusts the one certificate with this fingerprint, whatever name it carries; the handshake's
/// signature is still checked against it, so only the holder of its key passes.
#[derive(Debug)]
struct Pinned {
    fingerprint: Fingerprint,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if Fingerprint::of_der(end_entity) == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client configuration (ring provider) that accepts only the certificate `fingerprint`.
pub fn pinned_client(fingerprint: Fingerprint) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(provider::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            fingerprint,
            provider,
        }))
        .with_no_client_auth();
    Arc::new(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_and_parses_like_openssl() {
        let f = Fingerprint::of_der(b"abc");
        let text = f.to_string();
        // SHA-256("abc") from FIPS 180-2, appendix B.1.
        assert!(text.starts_with("BA:78:16:BF:8F:01:CF:EA"), "{text}");
        assert_eq!(text.len(), 95);
        assert_eq!(Fingerprint::parse(&text).unwrap(), f);
        assert_eq!(
            Fingerprint::parse(&text.replace(':', "").to_lowercase()).unwrap(),
            f
        );
        let e = Fingerprint::parse("AB:CD").unwrap_err();
        assert_eq!(e.text, "AB:CD");
        assert_eq!(
            e.to_string(),
            "`AB:CD` is not a SHA-256 fingerprint (64 hex digits)"
        );
        assert!(Fingerprint::parse(&"G".repeat(64)).is_err());
        // 64 bytes but 32 characters: refused, not sliced inside a character.
        assert!(Fingerprint::parse(&"é".repeat(32)).is_err());
        assert!(matches!(
            Fingerprint::of_pem(b"not pem"),
            Err(CertError::NoCertificate)
        ));
    }

    #[test]
    fn a_made_certificate_reads_back_with_its_window_and_names() {
        let names = subject_alt_names("box", Some("10.1.2.3".parse().unwrap()));
        assert_eq!(names, ["box", "localhost", "127.0.0.1", "::1", "10.1.2.3"]);
        let now = UNIX_EPOCH + std::time::Duration::from_secs(2_000_000_000);
        let made = self_signed("box", &names, now).unwrap();
        let info = inspect(made.cert_pem.as_bytes()).unwrap();
        assert_eq!(info.not_before, 2_000_000_000 - DAY_SECS);
        assert_eq!(info.not_after, 2_000_000_000 + LIFETIME_DAYS * DAY_SECS);
        assert_eq!(info.names, names);
        assert!(info.made_here);
        // The key is the certificate's: rustls pairs them.
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(made.key_pem.as_bytes());
        assert!(key.is_ok());
        let e =
            inspect(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap_err();
        assert!(matches!(e, CertError::X509(_)), "{e:?}");
        assert!(
            e.to_string().starts_with("not an X.509 certificate: "),
            "{e}"
        );
    }

    #[test]
    fn renewal_is_due_within_its_window_or_after_the_end() {
        let info = CertInfo {
            not_before: 0,
            not_after: 100 * DAY_SECS,
            made_here: true,
            names: Vec::new(),
        };
        let at = |day: i64| UNIX_EPOCH + std::time::Duration::from_secs((day * DAY_SECS) as u64);
        assert_eq!(info.renewal_due(at(100 - RENEW_WITHIN_DAYS)), None);
        let due = info.renewal_due(at(100 - RENEW_WITHIN_DAYS + 1)).unwrap();
        assert!(due.contains("expires in 29 days"), "{due}");
        assert_eq!(info.renewal_due(at(100)).as_deref(), Some("it has expired"));
        // Not valid yet means the clock is behind: kept.
        let future = CertInfo {
            not_before: 50 * DAY_SECS,
            ..info
        };
        assert_eq!(future.renewal_due(at(10)), None);
    }
}
