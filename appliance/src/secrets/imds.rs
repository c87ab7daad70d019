//! OCI's instance metadata service, version 2: `GET /opc/v2/instance/metadata/<key>` with
//! `Authorization: Bearer Oracle` (v1's unauthenticated paths are off on current images). A key
//! the launch did not give answers 404.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{Metadata, MetadataError};

/// Tries and the pause between them: the network may still be coming up at boot (as for the
/// SSH keys' curl, about half a minute in all).
const TRIES: u32 = 6;
const PAUSE: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const TIMEOUT: Duration = Duration::from_secs(10);

/// The metadata path of user-defined keys under the service's base URL.
const METADATA_PATH: &str = "/opc/v2/instance/metadata";
/// The instance's VNICs (JSON, the primary first), whose `privateIp` the certificate names.
pub const VNICS_PATH: &str = "/opc/v2/vnics/";

pub struct Imds {
    /// `http://169.254.169.254` on OCI.
    base: String,
    agent: ureq::Agent,
}

impl Imds {
    /// The service at `address`, port 80.
    pub fn new(address: IpAddr) -> Imds {
        Imds::with_base(base(address))
    }

    /// The service at `base` (`http://host:port`), for a stand-in in tests.
    pub fn with_base(base: String) -> Imds {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .timeout_connect(Some(CONNECT_TIMEOUT))
            // A link-local service: never through an HTTP proxy from the environment.
            .proxy(None)
            .http_status_as_error(false)
            .build()
            .into();
        Imds { base, agent }
    }

    /// The URL of the user-defined metadata `key` at `address`.
    pub fn url(address: IpAddr, key: &str) -> String {
        format!("{}{METADATA_PATH}/{key}", base(address))
    }
}

fn base(address: IpAddr) -> String {
    match address {
        IpAddr::V4(a) => format!("http://{a}"),
        IpAddr::V6(a) => format!("http://[{a}]"),
    }
}

impl Imds {
    /// GET `path`: its body, `None` on 404, an error when the service cannot be reached or
    /// answers otherwise (after [`TRIES`]).
    fn fetch(&self, path: &str) -> Result<Option<String>, MetadataError> {
        let url = format!("{}{path}", self.base);
        let mut attempt = 1;
        loop {
            let failure = match self
                .agent
                .get(&url)
                .header("Authorization", "Bearer Oracle")
                .call()
            {
                Ok(mut response) => match response.status().as_u16() {
                    200 => {
                        return response.body_mut().read_to_string().map(Some).map_err(|e| {
                            MetadataError::Body {
                                url,
                                error: Arc::new(e),
                            }
                        })
                    }
                    404 => return Ok(None),
                    status => Failure::Status(status),
                },
                Err(e) => Failure::Request(e),
            };
            if attempt >= TRIES {
                return Err(match failure {
                    Failure::Status(status) => MetadataError::Status {
                        url,
                        status,
                        tries: TRIES,
                    },
                    Failure::Request(e) => MetadataError::Unreachable {
                        url,
                        error: Arc::new(e),
                        tries: TRIES,
                    },
                });
            }
            attempt += 1;
            std::thread::sleep(PAUSE);
        }
    }
}

/// How the last try went wrong.
enum Failure {
    Status(u16),
    Request(ureq::Error),
}

impl Metadata for Imds {
    fn get(&self, key: &str) -> Result<Option<String>, MetadataError> {
        self.fetch(&format!("{METADATA_PATH}/{key}"))
    }

    fn private_ip(&self) -> Result<Option<IpAddr>, MetadataError> {
        match self.fetch(VNICS_PATH)? {
            None => Ok(None),
            Some(json) => Ok(Some(primary_private_ip(&json)?)),
        }
    }
}

/// Why the service's VNICs answer names no private address ([`primary_private_ip`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum VnicsError {
    #[error("{VNICS_PATH} is not JSON: {0}")]
    NotJson(Arc<serde_json::Error>),
    #[error("{VNICS_PATH} names no privateIp")]
    NoPrivateIp,
    #[error("{VNICS_PATH}: privateIp `{text}`: {error}")]
    BadPrivateIp {
        text: String,
        error: std::net::AddrParseError,
    },
}

/// The first VNIC's `privateIp` in the service's answer (`[{"privateIp": "10.0.0.2", ...}]`).
pub fn primary_private_ip(json: &str) -> Result<IpAddr, VnicsError> {
    let vnics: serde_json::Value =
        serde_json::from_str(json).map_err(|e| VnicsError::NotJson(Arc::new(e)))?;
    let ip = vnics
        .get(0)
        .and_then(|v| v.get("privateIp"))
        .and_then(serde_json::Value::as_str)
        .ok_or(VnicsError::NoPrivateIp)?;
    ip.parse().map_err(|error| VnicsError::BadPrivateIp {
        text: ip.to_owned(),
        error,
    })
}
