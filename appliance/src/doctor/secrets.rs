//! The API's secrets: the keys (printed, for the administrator who runs the doctor as root) and
//! the certificate's fingerprint, both files root-only.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::profile::Profile;
use crate::secrets::{parse_keys, Files, KeyListError};
use crate::tls::{self, CertError, CertInfo, Fingerprint};

use super::{Check, Host};

const HINT: &str = "see `journalctl -u llm-secrets`; `systemctl restart llm-secrets llm-server` provisions them again";

/// What is wrong with a secret's file. The cause's text is part of the message (the check's
/// detail), so it is kept in a field rather than in `source()`.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Its mode cannot be read (it is missing, most likely).
    #[error("{}: {error}", path.display())]
    Mode {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Group or others may read it; `mode` is its permission bits.
    #[error("{} has mode {mode:o}: others may read it", path.display())]
    Exposed { path: PathBuf, mode: u32 },
    #[error(transparent)]
    Keys(#[from] KeyListError),
    /// The certificate file holds no certificate.
    #[error(transparent)]
    Certificate(#[from] CertError),
    /// The certificate's fingerprint was read but its contents cannot be.
    #[error("{}: {error}", path.display())]
    Unreadable { path: PathBuf, error: CertError },
}

fn read(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    std::fs::read(path).map_err(|error| SecretFileError::Read {
        path: path.to_owned(),
        error,
    })
}

/// Whether `path` is readable by its owner only.
fn private(path: &Path) -> Result<(), SecretFileError> {
    let mode = std::fs::metadata(path)
        .map_err(|error| SecretFileError::Mode {
            path: path.to_owned(),
            error,
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Exposed {
            path: path.to_owned(),
            mode: mode & 0o777,
        });
    }
    Ok(())
}

pub fn checks(profile: &Profile, host: &Host) -> Vec<Check> {
    let files = Files::under(&host.root);
    vec![api_keys(profile, &files), certificate(profile, &files)]
}

fn api_keys(profile: &Profile, files: &Files) -> Check {
    const NAME: &str = "api-keys";
    if !profile.server.api_keys.enabled() {
        return Check::warn(
            NAME,
            "none (server.api_keys = \"none\"): anyone the firewall admits may use the API",
            "set server.api_keys = \"metadata\" in the profile",
        );
    }
    let path = &files.api_keys;
    let keys = || -> Result<Vec<String>, SecretFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| SecretFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        let keys = parse_keys(&text)?;
        private(path)?;
        Ok(keys)
    };
    match keys() {
        Ok(keys) => Check::ok(
            NAME,
            format!(
                "{} (in {}; send `Authorization: Bearer <key>`)",
                keys.join(", "),
                path.display()
            ),
        ),
        Err(e) => Check::fail(NAME, e.to_string(), HINT),
    }
}

fn certificate(profile: &Profile, files: &Files) -> Check {
    const NAME: &str = "tls";
    if !profile.server.tls.enabled() {
        return Check::warn(
            NAME,
            "none (server.tls = \"none\"): the API is plain HTTP",
            "set server.tls = \"metadata\" in the profile",
        );
    }
    let read_back = || -> Result<(Fingerprint, CertInfo), SecretFileError> {
        let pem = read(&files.tls_cert)?;
        let f = Fingerprint::of_pem(&pem)?;
        private(&files.tls_key)?;
        let info = tls::inspect(&pem).map_err(|error| SecretFileError::Unreadable {
            path: files.tls_cert.clone(),
            error,
        })?;
        Ok((f, info))
    };
    let (f, info) = match read_back() {
        Ok(read) => read,
        Err(e) => return Check::fail(NAME, e.to_string(), HINT),
    };
    let until = time::OffsetDateTime::from_unix_timestamp(info.not_after)
        .map(|t| t.date().to_string())
        .unwrap_or_else(|_| info.not_after.to_string());
    let detail = format!("certificate SHA-256 fingerprint {f}, valid until {until}");
    match info.renewal_due(std::time::SystemTime::now()) {
        None => Check::ok(NAME, detail),
        Some(why) => Check::warn(
            NAME,
            format!("{detail}: {why}"),
            "`systemctl restart llm-secrets llm-server` makes a new one (clients pin the new \
             fingerprint)",
        ),
    }
}

/// The certificate the server presents, for the doctor's own request to /health.
pub fn fingerprint(host: &Host) -> Result<Fingerprint, SecretFileError> {
    let pem = read(&Files::under(&host.root).tls_cert)?;
    Ok(Fingerprint::of_pem(&pem)?)
}
