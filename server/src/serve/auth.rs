//! API keys: `Authorization: Bearer <key>`, keys read from `--api-key-file`.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// The accepted keys. Empty: no key is needed.
#[derive(Clone, Default)]
pub struct ApiKeys(Arc<Vec<String>>);

/// Keys are secrets: debug output shows only how many there are.
impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

impl ApiKeys {
    /// One key per line; blank lines and `#` comments are skipped.
    pub fn from_file(path: &Path) -> Result<ApiKeys, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the API key file {}: {e}", path.display()))?;
        let keys: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect();
        if keys.is_empty() {
            return Err(format!(
                "the API key file {} holds no key: write one key per line",
                path.display()
            ));
        }
        Ok(ApiKeys(Arc::new(keys)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `header` (the Authorization value) carries one of the keys. Every key is compared
    /// in full, so the time taken does not reveal how much of a guess was right.
    fn admits(&self, header: Option<&[u8]>) -> bool {
        let Some(token) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        self.0.iter().fold(false, |ok, key| {
            ok | constant_time_eq(key.as_bytes(), token)
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Middleware: refuses requests without a valid key with 401.
pub async fn require_key(State(keys): State<ApiKeys>, req: Request, next: Next) -> Response {
    let header = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
    if keys.is_empty() || keys.admits(header) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        let keys = ApiKeys(Arc::new(vec!["k1".into(), "secret-2".into()]));
        assert!(keys.admits(Some(b"Bearer secret-2")));
        assert!(keys.admits(Some(b"Bearer k1")));
        assert!(!keys.admits(Some(b"Bearer k")));
        assert!(!keys.admits(Some(b"bearer k1")));
        assert!(!keys.admits(Some(b"k1")));
        assert!(!keys.admits(None));
    }

    #[test]
    fn key_file_format() {
        let path = std::env::temp_dir().join(format!("llm-keys-{}", std::process::id()));
        std::fs::write(&path, "# admins\n  k1  \n\nk2\n").unwrap();
        let keys = ApiKeys::from_file(&path).unwrap();
        assert_eq!(*keys.0, vec!["k1", "k2"]);
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(ApiKeys::from_file(&path)
            .unwrap_err()
            .contains("holds no key"));
        std::fs::remove_file(&path).unwrap();
        assert!(ApiKeys::from_file(&path)
            .unwrap_err()
            .contains("cannot read"));
    }
}
