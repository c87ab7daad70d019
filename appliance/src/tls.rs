//! The box's certificate as its clients see it: the SHA-256 fingerprint the banner and
//! `appliance doctor` show, and a rustls client that trusts exactly that certificate (a
//! self-signed one has no CA to check it against, so it is pinned instead).

use std::fmt::Write as _;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring as provider, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

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
}
