//! `appliance secrets`, run by `llm-secrets.service` at every boot before the server: the API
//! keys and the TLS certificate, from the instance metadata when the launch gives them and the
//! profile allows it, otherwise made on the first boot and kept. Everything lands root-only in
//! [`paths::SECRETS_DIR`]; the server unit loads the files as systemd credentials.

mod imds;

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;

use crate::paths;
use crate::profile::{ApiKeys, Profile, Tls};
use crate::tls::Fingerprint;

pub use imds::Imds;

/// The user-defined metadata keys the box reads (OCI: "Custom metadata" at launch).
pub const METADATA_API_KEYS: &str = "llm_api_keys";
pub const METADATA_TLS_CERT: &str = "llm_tls_cert";
pub const METADATA_TLS_KEY: &str = "llm_tls_key";

/// How `appliance secrets` introduces the fingerprint in the journal and on the serial console,
/// where the image's smoke boot reads it.
pub const FINGERPRINT_LINE: &str = "TLS certificate SHA-256 fingerprint ";

/// Bytes of a generated key: 256 bits.
const KEY_BYTES: usize = 32;
/// A key from the metadata is at least this long: shorter ones can be guessed.
const KEY_MIN_CHARS: usize = 16;
const KEY_MAX_CHARS: usize = 512;

/// Where the instance metadata is read from: `Ok(None)` when the launch did not give `key`.
pub trait Metadata {
    fn get(&self, key: &str) -> Result<Option<String>, String>;
}

/// Where one secret came from on this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Metadata,
    Generated,
    /// Made on an earlier boot.
    Kept,
    /// The profile turns it off.
    Off,
}

#[derive(Debug)]
pub struct Provisioned {
    pub keys: Source,
    pub tls: Source,
    pub fingerprint: Option<Fingerprint>,
    /// What the journal should show: each step and any metadata error that was worked around.
    pub log: Vec<String>,
}

/// The secrets' files under `dir` (the box's [`paths::SECRETS_DIR`]).
pub struct Files {
    pub api_keys: PathBuf,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

impl Files {
    /// The box's files under `root` (`/` on the box).
    pub fn under(root: &Path) -> Files {
        let at = |p: &str| root.join(p.trim_start_matches('/'));
        Files {
            api_keys: at(paths::API_KEYS),
            tls_cert: at(paths::TLS_CERT),
            tls_key: at(paths::TLS_KEY),
        }
    }
}

/// Provisions the keys and the certificate the profile asks for into `files`.
pub fn provision(
    profile: &Profile,
    files: &Files,
    metadata: &dyn Metadata,
) -> Result<Provisioned, String> {
    let mut log = Vec::new();
    let metadata = Remembering {
        inner: metadata,
        down: std::cell::RefCell::new(None),
    };
    let keys = api_keys(profile.server.api_keys, files, &metadata, &mut log)?;
    let tls = certificate(profile, files, &metadata, &mut log)?;
    let fingerprint = if tls == Source::Off {
        None
    } else {
        let pem = read(&files.tls_cert)?;
        Some(
            Fingerprint::of_pem(pem.as_bytes())
                .map_err(|e| format!("{}: {e}", files.tls_cert.display()))?,
        )
    };
    if let Some(f) = fingerprint {
        log.push(format!("{FINGERPRINT_LINE}{f}"));
    }
    Ok(Provisioned {
        keys,
        tls,
        fingerprint,
        log,
    })
}

/// Once the service proved unreachable, the other keys are not asked again: each ask would
/// wait through all its retries before the server may start.
struct Remembering<'a> {
    inner: &'a dyn Metadata,
    down: std::cell::RefCell<Option<String>>,
}

impl Metadata for Remembering<'_> {
    fn get(&self, key: &str) -> Result<Option<String>, String> {
        if let Some(e) = self.down.borrow().as_ref() {
            return Err(e.clone());
        }
        let got = self.inner.get(key);
        if let Err(e) = &got {
            *self.down.borrow_mut() = Some(e.clone());
        }
        got
    }
}

/// Asks the metadata for `key` when the profile allows it; an unreachable service is logged
/// and treated as not given, so the box still comes up with secrets of its own.
fn ask(metadata: &dyn Metadata, key: &str, log: &mut Vec<String>) -> Option<String> {
    match metadata.get(key) {
        Ok(value) => {
            if value.is_none() {
                log.push(format!("the instance metadata has no `{key}`"));
            }
            value
        }
        Err(e) => {
            log.push(format!(
                "WARNING: could not read `{key}` from the instance metadata ({e}); using the \
                 box's own"
            ));
            None
        }
    }
}

fn api_keys(
    mode: ApiKeys,
    files: &Files,
    metadata: &dyn Metadata,
    log: &mut Vec<String>,
) -> Result<Source, String> {
    if mode == ApiKeys::None {
        log.push(
            "WARNING: server.api_keys = \"none\": the API serves anyone the firewall admits".into(),
        );
        return Ok(Source::Off);
    }
    if mode == ApiKeys::Metadata {
        if let Some(text) = ask(metadata, METADATA_API_KEYS, log) {
            let keys = parse_keys(&text)?;
            write_private(&files.api_keys, &(keys.join("\n") + "\n"))?;
            log.push(format!(
                "{} API key(s) from the metadata's `{METADATA_API_KEYS}` in {}",
                keys.len(),
                files.api_keys.display()
            ));
            return Ok(Source::Metadata);
        }
    }
    if files.api_keys.exists() {
        log.push(format!(
            "API key kept from an earlier boot in {}",
            files.api_keys.display()
        ));
        return Ok(Source::Kept);
    }
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| format!("getrandom failed: {e}"))?;
    let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&files.api_keys, &format!("{key}\n"))?;
    log.push(format!(
        "generated a 256-bit API key in {} (`appliance doctor` prints it)",
        files.api_keys.display()
    ));
    Ok(Source::Generated)
}

/// The keys of a key list as the server reads it: one a line, blank lines and `#` comments
/// skipped. Each must be 16 to 512 visible ASCII characters.
pub fn parse_keys(text: &str) -> Result<Vec<String>, String> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let printable = line.bytes().all(|b| b.is_ascii_graphic());
        if !printable || !(KEY_MIN_CHARS..=KEY_MAX_CHARS).contains(&line.len()) {
            return Err(format!(
                "line {} of the metadata's `{METADATA_API_KEYS}` is not a key: give one key a \
                 line, {KEY_MIN_CHARS} to {KEY_MAX_CHARS} visible ASCII characters without \
                 spaces (e.g. `openssl rand -hex 32`)",
                n + 1
            ));
        }
        keys.push(line.to_owned());
    }
    if keys.is_empty() {
        return Err(format!(
            "the metadata's `{METADATA_API_KEYS}` holds no key: give one key a line, or remove \
             it to have the box generate one"
        ));
    }
    Ok(keys)
}

fn certificate(
    profile: &Profile,
    files: &Files,
    metadata: &dyn Metadata,
    log: &mut Vec<String>,
) -> Result<Source, String> {
    let mode = profile.server.tls;
    if mode == Tls::None {
        log.push("WARNING: server.tls = \"none\": the API is plain HTTP".into());
        return Ok(Source::Off);
    }
    if mode == Tls::Metadata {
        let cert = ask(metadata, METADATA_TLS_CERT, log);
        let key = ask(metadata, METADATA_TLS_KEY, log);
        match (cert, key) {
            (Some(cert), Some(key)) => {
                Fingerprint::of_pem(cert.as_bytes()).map_err(|e| {
                    format!("the metadata's `{METADATA_TLS_CERT}` is not a certificate: {e}; give the PEM file")
                })?;
                PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| {
                    format!("the metadata's `{METADATA_TLS_KEY}` is not a private key ({e}): give the PEM file of the certificate's key")
                })?;
                write_private(&files.tls_cert, &cert)?;
                write_private(&files.tls_key, &key)?;
                log.push(format!(
                    "TLS certificate and key from the metadata's `{METADATA_TLS_CERT}` and \
                     `{METADATA_TLS_KEY}`"
                ));
                return Ok(Source::Metadata);
            }
            (None, None) => {}
            _ => {
                return Err(format!(
                    "the metadata gives only one of `{METADATA_TLS_CERT}` and \
                     `{METADATA_TLS_KEY}`: give both (PEM), or neither for a self-signed \
                     certificate"
                ))
            }
        }
    }
    if files.tls_cert.exists() && files.tls_key.exists() {
        log.push(format!(
            "TLS certificate kept from an earlier boot in {}",
            files.tls_cert.display()
        ));
        return Ok(Source::Kept);
    }
    let names = vec![profile.machine.hostname.clone(), "localhost".to_owned()];
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| format!("could not make a self-signed certificate: {e}"))?;
    // The key first: a certificate without its key would be kept on the next boot.
    write_private(&files.tls_key, &made.signing_key.serialize_pem())?;
    write_private(&files.tls_cert, &made.cert.pem())?;
    log.push(format!(
        "made a self-signed certificate (ECDSA P-256) for {} and localhost in {}",
        profile.machine.hostname,
        files.tls_cert.display()
    ));
    Ok(Source::Generated)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Writes `text` to `path` readable by its owner only: into a fresh file beside it, then renamed
/// over it, so a crash never leaves half a key and the secret is never world-readable.
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    let err = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let dir = path.parent().expect("a secret's path has a directory");
    std::fs::create_dir_all(dir).map_err(err)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    let temporary = path.with_extension("new");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(err)?;
    file.write_all(text.as_bytes()).map_err(err)?;
    file.sync_all().map_err(err)?;
    std::fs::rename(&temporary, path).map_err(err)
}

/// The login banner: where the key is, the certificate's fingerprint, and loud warnings when
/// either is off. Readable by every user, so it names the key's file rather than the key.
pub fn banner(profile: &Profile, files: &Files) -> String {
    let port = profile.server.api_port;
    let mut out = String::new();
    let scheme = if profile.server.tls.enabled() {
        "https"
    } else {
        "http"
    };
    out.push_str(&format!(
        "LLM appliance `{}`: OpenAI-compatible API at {scheme}://<this address>:{port}/v1\n",
        profile.machine.name
    ));
    if profile.server.api_keys.enabled() {
        let state = if files.api_keys.exists() {
            ""
        } else {
            " (not made yet)"
        };
        out.push_str(&format!(
            "  API key: in {}{state}; `appliance doctor` prints it\n",
            files.api_keys.display()
        ));
    } else {
        out.push_str("  WARNING: no API key (server.api_keys = \"none\"): anyone admitted by the firewall may use it\n");
    }
    if profile.server.tls.enabled() {
        match std::fs::read(&files.tls_cert)
            .map_err(|e| e.to_string())
            .and_then(|pem| Fingerprint::of_pem(&pem))
        {
            Ok(f) => out.push_str(&format!("  TLS certificate SHA-256 fingerprint: {f}\n")),
            Err(e) => out.push_str(&format!(
                "  TLS certificate: none yet in {} ({e}); see `journalctl -u llm-secrets`\n",
                files.tls_cert.display()
            )),
        }
    } else {
        out.push_str("  WARNING: no TLS (server.tls = \"none\"): keys and prompts cross the network in clear text\n");
    }
    out
}
