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
pub fn self_signed(hostname: &str, names: &[String], now: SystemTime) -> Result<Made, String> {
    let err = |e: rcgen::Error| format!("could not make a self-signed certificate: {e}");
    let date = |secs: i64| {
        time::OffsetDateTime::from_unix_timestamp(secs)
            .map_err(|e| format!("could not make a self-signed certificate: {e}"))
    };
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
pub fn inspect(pem: &[u8]) -> Result<CertInfo, String> {
    use x509_parser::extensions::GeneralName;
    let der = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or("no `BEGIN CERTIFICATE` block")?
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
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
    pub fn of_pem(pem: &[u8]) -> Result<Fingerprint, String> {
        let cert = CertificateDer::pem_slice_iter(pem)
            .next()
            .ok_or("no `BEGIN CERTIFICATE` block")?
            .map_err(|e| format!("not a PEM certificate: {e}"))?;
        Ok(Fingerprint::of_der(&cert))
    }

    /// Parses the `AB:CD:...` form (case and colons optional).
    pub fn parse(s: &str) -> Result<Fingerprint, String> {
        let hex: String = s.chars().filter(|c| *c != ':').collect();
        let mut bytes = [0u8; 32];
        if hex.len() != 64 {
            return Err(format!(
                "`{s}` is not a SHA-256 fingerprint (64 hex digits)"
            ));
        }
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("`{s}` is not a SHA-256 fingerprint (64 hex digits)"))?;
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
        assert!(Fingerprint::parse("AB:CD").is_err());
        assert!(Fingerprint::of_pem(b"not pem").is_err());
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
        assert!(
            inspect(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err()
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
