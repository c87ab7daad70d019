//! HTTPS by rustls with the ring provider: the certificate chain and key from PEM files
//! (`--tls-cert`, `--tls-key`), and a clear refusal for plain HTTP sent to the TLS port.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// The first byte of every TLS connection: a handshake record (RFC 8446, 5.1). Anything else
/// on the TLS port is a client speaking plain HTTP (or garbage).
const TLS_HANDSHAKE: u8 = 0x16;

/// The answer to plain HTTP on the TLS port: never data, only where to go instead.
const PLAIN_HTTP_REFUSAL: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 78\r\n\r\n\
This port speaks HTTPS only: send the request again to https:// (not http://)\n";

/// Why `--tls-cert`/`--tls-key` give no acceptor.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error("cannot read the TLS certificate {}: {error}", path.display())]
    Certificate {
        path: PathBuf,
        error: rustls_pki_types::pem::Error,
    },
    #[error("the TLS certificate file {} holds no PEM CERTIFICATE block", path.display())]
    NoCertificate { path: PathBuf },
    #[error("cannot read the TLS private key {}: {error} (PEM PRIVATE KEY expected)", path.display())]
    Key {
        path: PathBuf,
        error: rustls_pki_types::pem::Error,
    },
    #[error("the TLS certificate and key do not go together: {0}")]
    Mismatch(rustls::Error),
}

/// Reads the certificate chain (leaf first) and private key (PKCS#8, PKCS#1 or SEC1) in PEM.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsFileError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|error| TlsFileError::Certificate {
            path: cert.to_owned(),
            error,
        })?;
    if certs.is_empty() {
        return Err(TlsFileError::NoCertificate {
            path: cert.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|error| TlsFileError::Key {
        path: key.to_owned(),
        error,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsFileError::Mismatch)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsFileError::Mismatch)?;
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Whether the client opened with a TLS handshake; if not, it has been told to use https and
/// the connection is to be closed. Waits for the first byte (the caller bounds the wait).
pub async fn is_tls(stream: &mut TcpStream) -> std::io::Result<bool> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    if n == 1 && first[0] == TLS_HANDSHAKE {
        return Ok(true);
    }
    if n == 1 {
        stream.write_all(PLAIN_HTTP_REFUSAL).await?;
        stream.shutdown().await?;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_content_length_is_right() {
        let text = std::str::from_utf8(PLAIN_HTTP_REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert!(body.contains("https://"));
    }

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = std::env::temp_dir().join(format!("llm-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = acceptor(&dir.join("nope.pem"), &empty).err().unwrap();
        assert!(err.to_string().contains("nope.pem"), "{err}");
        let err = acceptor(&empty, &empty).err().unwrap();
        assert!(matches!(err, TlsFileError::NoCertificate { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
