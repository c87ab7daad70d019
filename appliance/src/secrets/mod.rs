//! `appliance secrets`, run by `llm-secrets.service` at every boot before the server: the API
//! keys and the TLS certificate, from the instance metadata when the launch gives them and the
//! profile allows it, otherwise made on the first boot and kept. Everything lands root-only in
//! [`paths::SECRETS_DIR`]; the server unit loads the files as systemd credentials.

mod imds;

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;

use crate::paths;
use crate::profile::{ApiKeys, Profile, Tls};
use crate::tls::{self, Fingerprint};

pub use imds::{primary_private_ip, Imds, VnicsError, VNICS_PATH};

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

/// The first line of the key file says where its keys came from, so that a later boot knows
/// whether they were the metadata's (and go once the metadata stops giving them) or the box's
/// own. The server, the doctor and [`parse_keys`] skip `#` lines.
pub const GENERATED_KEYS_HEADER: &str = "# generated on this box by `appliance secrets`";
pub const METADATA_KEYS_HEADER: &str = "# from the instance metadata's `llm_api_keys`";

// The errors below put their cause's text in their own message, as the journal prints it, and
// keep the cause in a field to match on rather than in `source()`: a printer that walks the
// chain (anyhow's `{:#}`) would otherwise say it twice.

/// Why the instance metadata could not be asked. `Clone` because once the service proved
/// unreachable the later asks get the same error without asking (see `Remembering`); the causes
/// that are not `Clone` (ureq's, serde_json's) are shared behind an `Arc`, as they are only read.
#[derive(Clone, Debug, thiserror::Error)]
pub enum MetadataError {
    /// Every try failed to get an answer (connection refused, timed out, ...): the last one's.
    #[error("GET {url}: {error} (after {tries} tries)")]
    Unreachable {
        url: String,
        error: Arc<ureq::Error>,
        tries: u32,
    },
    /// Every try was answered with a status other than 200 or 404: the last one.
    #[error("GET {url}: HTTP {status} (after {tries} tries)")]
    Status {
        url: String,
        status: u16,
        tries: u32,
    },
    /// The answer's body could not be read.
    #[error("GET {url}: {error}")]
    Body {
        url: String,
        error: Arc<ureq::Error>,
    },
    /// The service's VNICs answer names no private address.
    #[error(transparent)]
    Vnics(#[from] VnicsError),
}

/// Why a key list ([`parse_keys`]) gives no keys.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyListError {
    /// Line `line` (from 1) is too short, too long, or has spaces or control characters.
    #[error(
        "line {line} of the metadata's `{METADATA_API_KEYS}` is not a key: give one key a line, \
         {KEY_MIN_CHARS} to {KEY_MAX_CHARS} visible ASCII characters without spaces (e.g. \
         `openssl rand -hex 32`)"
    )]
    NotAKey { line: usize },
    #[error(
        "the metadata's `{METADATA_API_KEYS}` holds no key: give one key a line, or remove it to \
         have the box generate one"
    )]
    NoKey,
}

/// Why [`provision`] could not provision the secrets: the server must not start without them.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The metadata's `llm_api_keys` is given but holds no usable key.
    #[error(transparent)]
    Keys(#[from] KeyListError),
    #[error("the metadata's `{METADATA_TLS_CERT}` is not a certificate: {0}; give the PEM file")]
    MetadataCert(tls::CertError),
    #[error(
        "the metadata's `{METADATA_TLS_KEY}` is not a private key ({0}): give the PEM file of \
         the certificate's key"
    )]
    MetadataKey(rustls::pki_types::pem::Error),
    #[error(
        "the metadata gives only one of `{METADATA_TLS_CERT}` and `{METADATA_TLS_KEY}`: give \
         both (PEM), or neither for a self-signed certificate"
    )]
    HalfCertificate,
    /// The certificate file this run wrote or kept holds no certificate.
    #[error("{}: {error}", path.display())]
    Certificate {
        path: PathBuf,
        error: tls::CertError,
    },
    #[error(transparent)]
    SelfSigned(#[from] tls::SelfSignedError),
    #[error("getrandom failed: {0}")]
    Random(getrandom::Error),
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Where the instance metadata is read from. `Err` only when the service could not be asked
/// (unreachable, or answering errors): a service that answers "not given" is `Ok(None)`.
pub trait Metadata {
    /// The user-defined metadata `key`; `Ok(None)` when the launch did not give it.
    fn get(&self, key: &str) -> Result<Option<String>, MetadataError>;
    /// The instance's private address (its primary VNIC's); `Ok(None)` when not known.
    fn private_ip(&self) -> Result<Option<IpAddr>, MetadataError>;
}

/// Where one secret came from on this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Metadata,
    Generated,
    /// Made on this run in place of one the box must no longer use: keys or a certificate an
    /// earlier boot took from the metadata, which no longer gives them, or a certificate near
    /// its end.
    Replaced,
    /// From an earlier boot.
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
) -> Result<Provisioned, ProvisionError> {
    provision_at(profile, files, metadata, SystemTime::now())
}

/// [`provision`] with the clock at `now` (for a certificate's validity).
pub fn provision_at(
    profile: &Profile,
    files: &Files,
    metadata: &dyn Metadata,
    now: SystemTime,
) -> Result<Provisioned, ProvisionError> {
    let mut log = Vec::new();
    let metadata = Remembering {
        inner: metadata,
        down: std::cell::RefCell::new(None),
    };
    let keys = api_keys(profile.server.api_keys, files, &metadata, &mut log)?;
    let tls = certificate(profile, files, &metadata, now, &mut log)?;
    let fingerprint = if tls == Source::Off {
        None
    } else {
        let pem = read(&files.tls_cert)?;
        Some(
            Fingerprint::of_pem(pem.as_bytes()).map_err(|error| ProvisionError::Certificate {
                path: files.tls_cert.clone(),
                error,
            })?,
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
    down: std::cell::RefCell<Option<MetadataError>>,
}

impl Remembering<'_> {
    fn remember<T>(
        &self,
        ask: impl FnOnce() -> Result<T, MetadataError>,
    ) -> Result<T, MetadataError> {
        if let Some(e) = self.down.borrow().as_ref() {
            return Err(e.clone());
        }
        let got = ask();
        if let Err(e) = &got {
            *self.down.borrow_mut() = Some(e.clone());
        }
        got
    }
}

impl Metadata for Remembering<'_> {
    fn get(&self, key: &str) -> Result<Option<String>, MetadataError> {
        self.remember(|| self.inner.get(key))
    }

    fn private_ip(&self) -> Result<Option<IpAddr>, MetadataError> {
        self.remember(|| self.inner.private_ip())
    }
}

/// What the metadata said about one key.
enum Answer {
    Given(String),
    /// The service answered: the launch does not give it (any more).
    Absent,
    /// The service could not be asked; nothing is known about the key.
    Unreachable,
}

/// Asks the metadata for `key`, logging what it said: an unreachable service is not an answer,
/// so the caller keeps what the box has rather than acting as if the key were gone.
fn ask(metadata: &dyn Metadata, key: &str, log: &mut Vec<String>) -> Answer {
    match metadata.get(key) {
        Ok(Some(value)) => Answer::Given(value),
        Ok(None) => {
            log.push(format!("the instance metadata has no `{key}`"));
            Answer::Absent
        }
        Err(e) => {
            log.push(format!(
                "WARNING: could not reach the instance metadata for `{key}` ({e})"
            ));
            Answer::Unreachable
        }
    }
}

/// Where the keys in the key file came from, by its first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeysOrigin {
    Generated,
    Metadata,
    /// No header: written by hand or by an older appliance. Treated like the metadata's: the
    /// box cannot vouch for them.
    Unknown,
}

fn keys_origin(path: &Path) -> Option<KeysOrigin> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(match text.lines().next().map(str::trim) {
        Some(GENERATED_KEYS_HEADER) => KeysOrigin::Generated,
        Some(METADATA_KEYS_HEADER) => KeysOrigin::Metadata,
        _ => KeysOrigin::Unknown,
    })
}

fn api_keys(
    mode: ApiKeys,
    files: &Files,
    metadata: &dyn Metadata,
    log: &mut Vec<String>,
) -> Result<Source, ProvisionError> {
    if mode == ApiKeys::None {
        log.push(
            "WARNING: server.api_keys = \"none\": the API serves anyone the firewall admits".into(),
        );
        return Ok(Source::Off);
    }
    let path = files.api_keys.display();
    let existing = keys_origin(&files.api_keys);
    let answer = match mode {
        ApiKeys::Metadata => ask(metadata, METADATA_API_KEYS, log),
        // Not asked: as if the launch gave none.
        _ => Answer::Absent,
    };
    match (answer, existing) {
        (Answer::Given(text), _) => {
            let keys = parse_keys(&text)?;
            write_private(
                &files.api_keys,
                &format!("{METADATA_KEYS_HEADER}\n{}\n", keys.join("\n")),
            )?;
            log.push(format!(
                "{} API key(s) from the metadata's `{METADATA_API_KEYS}` in {path}",
                keys.len(),
            ));
            Ok(Source::Metadata)
        }
        (Answer::Unreachable, Some(origin)) => {
            let whose = match origin {
                KeysOrigin::Generated => "generated on this box",
                KeysOrigin::Metadata => "from the metadata",
                KeysOrigin::Unknown => "of unknown origin",
            };
            log.push(format!(
                "WARNING: keeping the API key(s) of an earlier boot ({whose}) in {path} until \
                 the metadata can be read: `systemctl restart llm-secrets llm-server` asks again"
            ));
            Ok(Source::Kept)
        }
        (Answer::Absent, Some(KeysOrigin::Generated)) => {
            log.push(format!(
                "API key kept from an earlier boot (generated on this box) in {path}"
            ));
            Ok(Source::Kept)
        }
        (Answer::Absent, Some(origin)) => {
            let why = match (mode, origin) {
                (ApiKeys::Metadata, KeysOrigin::Metadata) => format!(
                    "the instance metadata no longer gives `{METADATA_API_KEYS}`: the key(s) an \
                     earlier boot took from it are revoked"
                ),
                (ApiKeys::Metadata, _) => format!(
                    "the instance metadata gives no `{METADATA_API_KEYS}` and the key(s) in \
                     {path} were not made on this box: they are revoked"
                ),
                _ => format!(
                    "server.api_keys = \"generate\" and the key(s) in {path} were not made on \
                     this box: they are revoked"
                ),
            };
            let key = generate_key(files)?;
            log.push(format!(
                "WARNING: {why}; generated a new 256-bit API key ({}...) in {path}: clients \
                 need it now (`appliance doctor` prints it)",
                &key[..8]
            ));
            Ok(Source::Replaced)
        }
        (Answer::Absent | Answer::Unreachable, None) => {
            generate_key(files)?;
            log.push(format!(
                "generated a 256-bit API key in {path} (`appliance doctor` prints it)"
            ));
            Ok(Source::Generated)
        }
    }
}

/// Writes a fresh 256-bit key (hex) to the key file, marked as made here; returns it.
fn generate_key(files: &Files) -> Result<String, ProvisionError> {
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::fill(&mut bytes).map_err(ProvisionError::Random)?;
    let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(
        &files.api_keys,
        &format!("{GENERATED_KEYS_HEADER}\n{key}\n"),
    )?;
    Ok(key)
}

/// The keys of a key list as the server reads it: one a line, blank lines and `#` comments
/// skipped. Each must be 16 to 512 visible ASCII characters.
pub fn parse_keys(text: &str) -> Result<Vec<String>, KeyListError> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let printable = line.bytes().all(|b| b.is_ascii_graphic());
        if !printable || !(KEY_MIN_CHARS..=KEY_MAX_CHARS).contains(&line.len()) {
            return Err(KeyListError::NotAKey { line: n + 1 });
        }
        keys.push(line.to_owned());
    }
    if keys.is_empty() {
        return Err(KeyListError::NoKey);
    }
    Ok(keys)
}

fn certificate(
    profile: &Profile,
    files: &Files,
    metadata: &dyn Metadata,
    now: SystemTime,
    log: &mut Vec<String>,
) -> Result<Source, ProvisionError> {
    let mode = profile.server.tls;
    if mode == Tls::None {
        log.push("WARNING: server.tls = \"none\": the API is plain HTTP".into());
        return Ok(Source::Off);
    }
    // Whether the metadata answered that it gives no certificate (as good as asked, for
    // "self-signed"): a certificate an earlier boot took from it must then go.
    let mut metadata_gives_none = mode == Tls::SelfSigned;
    if mode == Tls::Metadata {
        let cert = ask(metadata, METADATA_TLS_CERT, log);
        let key = ask(metadata, METADATA_TLS_KEY, log);
        match (cert, key) {
            (Answer::Given(cert), Answer::Given(key)) => {
                Fingerprint::of_pem(cert.as_bytes()).map_err(ProvisionError::MetadataCert)?;
                PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(ProvisionError::MetadataKey)?;
                write_private(&files.tls_cert, &cert)?;
                write_private(&files.tls_key, &key)?;
                log.push(format!(
                    "TLS certificate and key from the metadata's `{METADATA_TLS_CERT}` and \
                     `{METADATA_TLS_KEY}`"
                ));
                return Ok(Source::Metadata);
            }
            (Answer::Absent, Answer::Absent) => metadata_gives_none = true,
            (Answer::Unreachable, _) | (_, Answer::Unreachable) => {}
            _ => return Err(ProvisionError::HalfCertificate),
        }
    }
    let path = files.tls_cert.display();
    let mut replacing = None;
    if files.tls_cert.exists() && files.tls_key.exists() {
        let kept = read(&files.tls_cert)?;
        match tls::inspect(kept.as_bytes()) {
            Ok(info) if !info.made_here && metadata_gives_none => {
                replacing = Some(format!(
                    "the certificate in {path} came from the metadata's `{METADATA_TLS_CERT}`, \
                     which no longer gives one"
                ));
            }
            Ok(info) => match info.renewal_due(now) {
                Some(why) => replacing = Some(format!("the certificate in {path}: {why}")),
                None => {
                    log.push(format!(
                        "TLS certificate kept from an earlier boot in {path}"
                    ));
                    return Ok(Source::Kept);
                }
            },
            Err(e) => {
                replacing = Some(format!("the certificate in {path} cannot be read: {e}"));
            }
        }
    }
    // The instance's private address, for clients inside its network; a service that does
    // not say is no reason to go without a certificate.
    let private_ip = match metadata.private_ip() {
        Ok(ip) => ip,
        Err(e) => {
            log.push(format!(
                "WARNING: the instance's private address is unknown ({e}): the certificate \
                 names the host name and loopback only"
            ));
            None
        }
    };
    let hostname = &profile.machine.hostname;
    let names = tls::subject_alt_names(hostname, private_ip);
    let made = tls::self_signed(hostname, &names, now)?;
    // The key first: a certificate without its key would be kept on the next boot.
    write_private(&files.tls_key, &made.key_pem)?;
    write_private(&files.tls_cert, &made.cert_pem)?;
    let what = format!(
        "a self-signed certificate (ECDSA P-256, valid {} days) for {} in {path}",
        tls::LIFETIME_DAYS,
        names.join(", ")
    );
    Ok(match replacing {
        Some(why) => {
            log.push(format!(
                "WARNING: {why}; made {what}: clients that pin the old fingerprint need the new one"
            ));
            Source::Replaced
        }
        None => {
            log.push(format!("made {what}"));
            Source::Generated
        }
    })
}

fn read(path: &Path) -> Result<String, ProvisionError> {
    std::fs::read_to_string(path).map_err(|error| ProvisionError::Read {
        path: path.to_owned(),
        error,
    })
}

/// Writes `text` to `path` readable by its owner only: into a fresh file beside it, then renamed
/// over it, so a crash never leaves half a key and the secret is never world-readable.
fn write_private(path: &Path, text: &str) -> Result<(), ProvisionError> {
    let err = |error: std::io::Error| ProvisionError::Write {
        path: path.to_owned(),
        error,
    };
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
            .and_then(|pem| Fingerprint::of_pem(&pem).map_err(|e| e.to_string()))
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
