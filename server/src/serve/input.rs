//! Limits on what one request may make the server do: the size of grammars, schemas, tool
//! lists and texts to (de)tokenize, and how many grammar compiles run at once and for how
//! long. Every limit is a `serve` option (this module's [`InputArgs`]) whose default fits the
//! 1 GB appliance; going over one is a 413 (or a 400 for a grammar too complex to compile in
//! time) that names the option, never a stalled or killed process.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// Longest accepted stop sequence, in bytes. Stop strings are matched against the held-back
/// text after every token on the decode thread, in time that grows with the square of their
/// length; real stop sequences (`"\n\n"`, `"</answer>"`, `"User:"`) are a few bytes.
pub const MAX_STOP_BYTES: usize = 256;

/// The `serve` options of this module.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct InputArgs {
    /// Largest `grammar`, `response_format` JSON schema and `tools` list (each counted on its
    /// own, as JSON text) in bytes; larger ones get 413. A compile may take some 200 bytes of
    /// memory per byte of grammar: raise it with care. GBNF grammars may also nest at most 25
    /// levels, and each stop sequence may be at most 256 bytes (both fixed).
    #[arg(long, value_name = "BYTES", default_value_t = InputArgs::default().max_grammar_bytes)]
    pub max_grammar_bytes: usize,
    /// Largest text /tokenize reads and /detokenize writes, in bytes; larger ones get 413.
    #[arg(long, value_name = "BYTES", default_value_t = InputArgs::default().max_tokenize_bytes)]
    pub max_tokenize_bytes: usize,
    /// Seconds one grammar or schema may take to compile; longer is a 400 ("too complex").
    #[arg(long = "grammar-timeout", value_name = "SECS", default_value_t = InputArgs::default().grammar_timeout_secs, value_parser = clap::value_parser!(u64).range(1..))]
    pub grammar_timeout_secs: u64,
    /// Grammar compiles at once (each on a blocking thread); more wait up to --grammar-timeout,
    /// then get 503 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = InputArgs::default().grammar_compiles, value_parser = clap::value_parser!(u32).range(1..))]
    pub grammar_compiles: u32,
    /// Read control-token texts (e.g. `<end_of_turn>`) written in message content as control
    /// tokens, as llama.cpp does. Off by default: content is tokenized as plain text and only
    /// the chat template's own markup is special.
    #[arg(long)]
    pub parse_special_in_content: bool,
}

impl Default for InputArgs {
    /// As `llm-server serve` starts without options.
    fn default() -> InputArgs {
        InputArgs {
            max_grammar_bytes: 64 << 10,
            max_tokenize_bytes: 256 << 10,
            grammar_timeout_secs: 10,
            grammar_compiles: 1,
            parse_special_in_content: false,
        }
    }
}

/// [`InputArgs`] in force, with the compile slots they ask for; cheap to clone.
#[derive(Clone, Debug)]
pub struct InputLimits {
    pub args: InputArgs,
    compiles: Arc<Semaphore>,
}

impl Default for InputLimits {
    fn default() -> InputLimits {
        InputLimits::new(InputArgs::default())
    }
}

impl InputLimits {
    pub fn new(args: InputArgs) -> InputLimits {
        InputLimits {
            compiles: Arc::new(Semaphore::new(args.grammar_compiles.max(1) as usize)),
            args,
        }
    }

    pub fn grammar_timeout(&self) -> Duration {
        Duration::from_secs(self.args.grammar_timeout_secs)
    }

    /// 413 when a text of `bytes` (`what`, of `param`) is over --max-tokenize-bytes.
    pub fn check_tokenize_size(
        &self,
        param: &'static str,
        what: &'static str,
        bytes: usize,
    ) -> Result<(), ApiError> {
        self.args.check_tokenize_size(param, what, bytes)
    }

    /// A compile slot, waiting for one at most --grammar-timeout; 503 with Retry-After when
    /// none frees up in time.
    pub async fn compile_slot(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        let wait = self.grammar_timeout();
        match tokio::time::timeout(wait, self.compiles.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a closed one would mean shutting down.
            Ok(Err(_)) => Err(ApiError::ShuttingDown),
            Err(_) => Err(ApiError::CompilesBusy {
                compiles: self.args.grammar_compiles,
                waited: wait.as_secs(),
                retry_after: wait.as_secs().max(1),
            }),
        }
    }
}

impl InputArgs {
    /// 413 when `bytes` of `what` (given as `param`) are over --max-grammar-bytes.
    pub fn check_grammar_size(
        &self,
        param: &'static str,
        what: &'static str,
        bytes: usize,
    ) -> Result<(), ApiError> {
        over(
            param,
            what,
            bytes,
            self.max_grammar_bytes,
            "--max-grammar-bytes",
        )
    }

    /// 413 when `bytes` of `what` (given as `param`) are over --max-tokenize-bytes.
    pub fn check_tokenize_size(
        &self,
        param: &'static str,
        what: &'static str,
        bytes: usize,
    ) -> Result<(), ApiError> {
        over(
            param,
            what,
            bytes,
            self.max_tokenize_bytes,
            "--max-tokenize-bytes",
        )
    }
}

fn over(
    param: &'static str,
    what: &'static str,
    bytes: usize,
    limit: usize,
    flag: &'static str,
) -> Result<(), ApiError> {
    if bytes > limit {
        return Err(ApiError::FieldTooLarge {
            param,
            what,
            bytes,
            limit,
            flag,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_over_a_limit_name_it_and_its_option() {
        let limits = InputArgs::default();
        limits
            .check_grammar_size("grammar", "`grammar`", 64 << 10)
            .unwrap();
        let e = limits
            .check_grammar_size("grammar", "`grammar`", (64 << 10) + 1)
            .unwrap_err();
        assert_eq!(e.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        let message = e.to_string();
        assert!(
            message.contains("65537")
                && message.contains("65536")
                && message.contains("--max-grammar-bytes"),
            "{message}"
        );
        let e = limits
            .check_tokenize_size("content", "`content`", 1 << 20)
            .unwrap_err();
        assert!(e.to_string().contains("--max-tokenize-bytes"), "{e}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn compiles_beyond_the_limit_wait_then_get_503() {
        let limits = InputLimits::new(InputArgs {
            grammar_compiles: 1,
            grammar_timeout_secs: 1,
            ..InputArgs::default()
        });
        let held = limits.compile_slot().await.unwrap();
        let e = limits.compile_slot().await.unwrap_err();
        assert_eq!(e.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.to_string().contains("--grammar-compiles"), "{e}");
        drop(held);
        drop(limits.compile_slot().await.unwrap());
    }
}
