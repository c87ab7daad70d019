//! A minimal HTTP/1.1 client for the API forwarded from the guest: one request per connection,
//! JSON bodies, `Content-Length` or chunked answers, over TLS pinned to the box's certificate
//! and with its API key once the suite has read them over SSH. Enough for the checks and
//! nothing a real client would need to be trusted with.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appliance::tls::{pinned_client, Fingerprint};
use serde_json::Value;

/// The guest's API as the host reaches it.
#[derive(Clone, Debug)]
pub struct Api {
    pub addr: SocketAddr,
    /// HTTPS trusting only this certificate; plain HTTP when `None`.
    pub tls: Option<Fingerprint>,
    /// Sent as `Authorization: Bearer <key>`.
    pub key: Option<String>,
}

impl Api {
    pub fn plain(addr: SocketAddr) -> Api {
        Api {
            addr,
            tls: None,
            key: None,
        }
    }

    /// The same API with another key (or none).
    pub fn with_key(&self, key: Option<&str>) -> Api {
        Api {
            key: key.map(str::to_owned),
            ..self.clone()
        }
    }

    /// The same API over plain HTTP, to see it refused.
    pub fn without_tls(&self) -> Api {
        Api {
            tls: None,
            ..self.clone()
        }
    }

    pub fn get(&self, path: &str, timeout: Duration) -> Result<Response> {
        request(self, "GET", path, None, timeout)
    }

    pub fn post(&self, path: &str, body: &Value, timeout: Duration) -> Result<Response> {
        request(self, "POST", path, Some(body), timeout)
    }
}

pub struct Response {
    pub status: u16,
    pub body: String,
    /// The answer as received, and when each read ended (bytes received by then): when parts of
    /// a streamed answer arrived.
    raw: Vec<u8>,
    arrivals: Vec<(Instant, usize)>,
}

impl Response {
    /// The body as JSON, failing with the body when it is not.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("the answer is not JSON: {}", self.body))
    }

    /// When the end of the first occurrence of `text` at or after byte `from` of the raw answer
    /// had arrived, and the byte after that occurrence. Events of a stream can be byte for byte
    /// the same (a synthetic model repeating one token), so each is looked for after the last.
    pub fn arrival_of(&self, text: &str, from: usize) -> Option<(Instant, usize)> {
        let end = from
            + self
                .raw
                .get(from..)?
                .windows(text.len().max(1))
                .position(|w| w == text.as_bytes())?
            + text.len();
        self.arrivals
            .iter()
            .find(|(_, received)| *received >= end)
            .map(|(at, _)| (*at, end))
    }
}

fn request(
    api: &Api,
    method: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Result<Response> {
    let addr = api.addr;
    let scheme = if api.tls.is_some() { "https" } else { "http" };
    let what = || format!("{method} {scheme}://{addr}{path}");
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("{}: connect", what()))?;
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let authorization = api
        .key
        .as_ref()
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut raw = Vec::new();
    let mut arrivals = Vec::new();
    let mut exchange = |stream: &mut dyn ReadWrite, raw: &mut Vec<u8>| -> Result<()> {
        stream
            .write_all(request.as_bytes())
            .with_context(|| format!("{}: send", what()))?;
        stream.flush()?;
        read_all(stream, raw, &mut arrivals)
            .with_context(|| format!("{}: no complete answer within {timeout:?}", what()))
    };
    match api.tls {
        None => exchange(&mut { tcp }, &mut raw)?,
        Some(fingerprint) => {
            let name = rustls::pki_types::ServerName::from(addr.ip());
            let tls = rustls::ClientConnection::new(pinned_client(fingerprint), name)?;
            exchange(&mut rustls::StreamOwned::new(tls, tcp), &mut raw)?
        }
    }
    let mut response = parse(&raw).with_context(what)?;
    response.raw = raw;
    response.arrivals = arrivals;
    Ok(response)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Reads to the end; a TLS peer that closes without close_notify after a complete answer is
/// an end too (the answer's own length says whether it is complete).
/// Each read's end is noted in `arrivals` (when, bytes so far).
fn read_all(
    stream: &mut dyn ReadWrite,
    raw: &mut Vec<u8>,
    arrivals: &mut Vec<(Instant, usize)>,
) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                arrivals.push((Instant::now(), raw.len()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
}

fn parse(raw: &[u8]) -> Result<Response> {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("closed without a complete answer ({} bytes)", raw.len());
    };
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or("");
    let Some(status) = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
    else {
        bail!("not an HTTP status line: {status_line:?}");
    };
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("transfer-encoding") && value.trim() == "chunked"
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok(Response {
        status,
        body,
        raw: Vec::new(),
        arrivals: Vec::new(),
    })
}

/// The payload of a chunked body: hexadecimal sizes, each followed by that many bytes.
fn dechunk(mut rest: &str) -> Result<String> {
    let mut body = String::new();
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            bail!("chunked body ends without its last chunk");
        };
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size:?}"))?;
        if size == 0 {
            return Ok(body);
        }
        let chunk = after.get(..size).context("chunk shorter than its size")?;
        body.push_str(chunk);
        rest = after[size..].trim_start_matches("\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_content_length_answer() {
        let r = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
    }

    #[test]
    fn joins_chunks() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n\
                    3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        let r = parse(raw).unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.json().unwrap()["a"], 1);
    }

    #[test]
    fn identical_events_each_arrive_when_their_own_bytes_did() {
        let event = "data: {\"t\":\"\\n\"}\n\n";
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
            2 * event.len()
        );
        let raw = format!("{head}{event}{event}");
        let mut r = parse(raw.as_bytes()).unwrap();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(20);
        r.raw = raw.clone().into_bytes();
        r.arrivals = vec![(t0, head.len() + event.len()), (t1, raw.len())];
        let raw_event = event.trim_start_matches("data: ").trim_end();
        let (first, end) = r.arrival_of(raw_event, 0).unwrap();
        let (second, _) = r.arrival_of(raw_event, end).unwrap();
        assert_eq!((first, second), (t0, t1));
        assert_eq!(r.arrival_of(raw_event, raw.len()), None);
    }

    #[test]
    fn a_cut_answer_is_an_error() {
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Le").is_err());
        assert!(parse(b"garbage\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab").is_err());
    }
}
