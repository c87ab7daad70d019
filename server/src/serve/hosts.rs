//! The DNS-rebinding guard: a server on loopback answers only requests addressed to a loopback
//! name. A web page on evil.example whose name the attacker re-points at 127.0.0.1 can make a
//! browser on this machine send requests here, but they carry `Host: evil.example`.

use axum::extract::Request;
use axum::http::header::HOST;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// `localhost`, `127.0.0.1` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((addr, "")) => return addr == "::1",
            Some((addr, port)) => {
                return addr == "::1" && port.strip_prefix(':').is_some_and(is_port)
            }
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1"
}

fn is_port(s: &str) -> bool {
    s.parse::<u16>().is_ok()
}

/// Middleware: 403 for any other Host (a request without one has none to check: HTTP/1.1
/// requires it and browsers always send it).
pub async fn loopback_only(req: Request, next: Next) -> Response {
    if let Some(host) = req.headers().get(HOST) {
        let host = String::from_utf8_lossy(host.as_bytes());
        if !is_loopback_host(&host) {
            return ApiError::BadHost {
                host: host.into_owned(),
            }
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_with_and_without_port() {
        for ok in [
            "localhost",
            "LocalHost:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "127.0.0.2",
            "[::2]:80",
            "[::1]x",
            "[::1]8080",
            "localhost:",
            "localhost:99999",
            "",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
