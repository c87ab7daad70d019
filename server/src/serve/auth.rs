//! API keys: `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>`
//! (Anthropic's), keys read from `--api-key-file`.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// The header Anthropic's API takes the key in.
const X_API_KEY: &str = "x-api-key";

/// The accepted keys, kept only as SHA-256 digests: comparing digests of a fixed length takes
/// the same time whatever the length of the key or of the guess. Empty: no key is needed.
#[derive(Clone, Default)]
pub struct ApiKeys(Arc<Vec<[u8; 32]>>);

/// Which key admitted a request (its line among the keys), for the per-key rate limit.
#[derive(Debug, Clone, Copy)]
pub struct KeyId(pub usize);

/// Keys are secrets: debug output shows only how many there are.
impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

/// Why `--api-key-file` gives no keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read the API key file {}: {error}", path.display())]
    Read {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("the API key file {} holds no key: write one key per line", path.display())]
    Empty { path: std::path::PathBuf },
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl ApiKeys {
    /// One key per line; blank lines and `#` comments are skipped.
    pub fn from_file(path: &Path) -> Result<ApiKeys, KeyFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| KeyFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        let keys: Vec<[u8; 32]> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|key| digest(key.as_bytes()))
            .collect();
        if keys.is_empty() {
            return Err(KeyFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(ApiKeys(Arc::new(keys)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key `header` (the Authorization value) carries, if it is one of ours. The scheme is
    /// matched without regard to case (RFC 9110, 11.1).
    fn admits(&self, header: Option<&[u8]>) -> Option<KeyId> {
        let header = header?;
        let space = header.iter().position(|&b| b == b' ')?;
        let (scheme, token) = header.split_at(space);
        if !scheme.eq_ignore_ascii_case(b"bearer") {
            return None;
        }
        self.admits_key(token)
    }

    /// Whether `key` is one of ours. Every key is compared in full, so the time taken does not
    /// reveal which key, nor how much of a guess, was right.
    fn admits_key(&self, key: &[u8]) -> Option<KeyId> {
        let guess = digest(key.trim_ascii());
        self.0.iter().enumerate().fold(None, |found, (i, key)| {
            if equal_digests(key, &guess) {
                Some(KeyId(i))
            } else {
                found
            }
        })
    }
}

/// Compares every byte whatever differs first; `black_box` keeps the compiler from stopping
/// early.
fn equal_digests(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Middleware: refuses requests without a valid key with 401; admitted ones carry [`KeyId`].
pub async fn require_key(State(keys): State<ApiKeys>, mut req: Request, next: Next) -> Response {
    if keys.is_empty() {
        return next.run(req).await;
    }
    // Anthropic's SDKs send the key as `x-api-key`; `Authorization` wins when both are there.
    let headers = req.headers();
    let admitted = match headers.get(AUTHORIZATION) {
        Some(value) => keys.admits(Some(value.as_bytes())),
        None => headers
            .get(X_API_KEY)
            .and_then(|key| keys.admits_key(key.as_bytes())),
    };
    match admitted {
        Some(id) => {
            req.extensions_mut().insert(id);
            next.run(req).await
        }
        None => ApiError::Unauthorized.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        let keys = ApiKeys(Arc::new(vec![digest(b"k1"), digest(b"secret-2")]));
        let id = |h: &[u8]| keys.admits(Some(h)).map(|KeyId(i)| i);
        assert_eq!(id(b"Bearer secret-2"), Some(1));
        assert_eq!(id(b"Bearer k1"), Some(0));
        // RFC 9110: the scheme is case-insensitive.
        assert_eq!(id(b"bearer k1"), Some(0));
        assert_eq!(id(b"BEARER k1"), Some(0));
        assert_eq!(id(b"Bearer k"), None);
        assert_eq!(id(b"Bearer k2"), None);
        assert_eq!(id(b"Basic k1"), None);
        assert_eq!(id(b"Bearerk1"), None);
        assert_eq!(id(b"k1"), None);
        assert_eq!(id(b""), None);
        assert!(keys.admits(None).is_none());
        // x-api-key: the key alone.
        assert_eq!(keys.admits_key(b"secret-2").map(|KeyId(i)| i), Some(1));
        assert!(keys.admits_key(b"Bearer k1").is_none());
        assert!(keys.admits_key(b"").is_none());
    }

    #[test]
    fn key_file_format() {
        let path = std::env::temp_dir().join(format!("llm-keys-{}", std::process::id()));
        std::fs::write(&path, "# admins\n  k1  \n\nk2\n").unwrap();
        let keys = ApiKeys::from_file(&path).unwrap();
        assert_eq!(*keys.0, vec![digest(b"k1"), digest(b"k2")]);
        std::fs::write(&path, "# nothing\n").unwrap();
        let e = ApiKeys::from_file(&path).unwrap_err();
        assert!(matches!(e, KeyFileError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("holds no key"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let e = ApiKeys::from_file(&path).unwrap_err();
        assert!(
            e.to_string().contains("cannot read the API key file"),
            "{e}"
        );
    }
}
