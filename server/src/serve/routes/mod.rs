//! Handlers, one module per family of endpoints.

mod answer;
pub mod generate;
pub mod info;
pub mod messages;
pub mod responses;
pub mod slots;
pub mod tokens;
pub mod ui;

use crate::engine::Engine;
use crate::serve::error::ApiError;
use crate::serve::AppState;

/// Runs CPU work (templating, tokenizing) on tokio's blocking pool; `what` names it in the log
/// if the task fails.
async fn blocking<T: Send + 'static>(
    state: &AppState,
    what: &'static str,
    work: impl FnOnce(&Engine) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || work(state.engine()?))
        .await
        .map_err(|e| ApiError::Internal(format!("{what} task failed: {e}")))?
}
