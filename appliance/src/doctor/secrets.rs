//! The API's secrets: the keys (printed, for the administrator who runs the doctor as root) and
//! the certificate's fingerprint, both files root-only.

use std::os::unix::fs::PermissionsExt;

use crate::profile::Profile;
use crate::secrets::{parse_keys, Files};
use crate::tls::{self, Fingerprint};

use super::{Check, Host};

const HINT: &str = "see `journalctl -u llm-secrets`; `systemctl restart llm-secrets llm-server` provisions them again";

/// Whether `path` is readable by its owner only.
fn private(path: &std::path::Path) -> Result<(), String> {
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {:o}: others may read it",
            path.display(),
            mode & 0o777
        ));
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
    let keys = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
        .and_then(|text| parse_keys(&text))
        .and_then(|keys| private(path).map(|()| keys));
    match keys {
        Ok(keys) => Check::ok(
            NAME,
            format!(
                "{} (in {}; send `Authorization: Bearer <key>`)",
                keys.join(", "),
                path.display()
            ),
        ),
        Err(e) => Check::fail(NAME, e, HINT),
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
    let fingerprint = std::fs::read(&files.tls_cert)
        .map_err(|e| format!("cannot read {}: {e}", files.tls_cert.display()))
        .and_then(|pem| Fingerprint::of_pem(&pem))
        .and_then(|f| private(&files.tls_key).map(|()| f));
    let f = match fingerprint {
        Ok(f) => f,
        Err(e) => return Check::fail(NAME, e, HINT),
    };
    let info = std::fs::read(&files.tls_cert)
        .map_err(|e| e.to_string())
        .and_then(|pem| tls::inspect(&pem));
    let info = match info {
        Ok(info) => info,
        Err(e) => return Check::fail(NAME, format!("{}: {e}", files.tls_cert.display()), HINT),
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
pub fn fingerprint(host: &Host) -> Result<Fingerprint, String> {
    let files = Files::under(&host.root);
    let pem = std::fs::read(&files.tls_cert)
        .map_err(|e| format!("cannot read {}: {e}", files.tls_cert.display()))?;
    Fingerprint::of_pem(&pem)
}
