//! `llm-server` with the tests' hooks ([`llm_server::hooks`]), for the tests that must see the
//! server fail in ways no request can cause: a decode thread that hangs or panics, a leak per
//! request. Each hook acts only when this process's environment names it (`LLM_SERVER_TEST_*`
//! below); no request can. The tests that spawn the server start this binary when they set one
//! of those variables (server/tests/it/serve_support). The image ships `llm-server` alone,
//! which installs no hook.

// The shipped binary's own modules, so that this one runs the same code.
#[path = "../cli/mod.rs"]
mod cli;
#[path = "../cpu_guard.rs"]
mod cpu_guard;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;

use llm_server::hooks::{self, Hooks};

fn main() -> ExitCode {
    llm_server::malloc::tune();
    hooks::install(Hooks {
        on_beat: engine_hook,
        on_request: leak_per_request,
    });
    cli::main()
}

const ENGINE_HOOK: &str = "LLM_SERVER_TEST_ENGINE_HOOK";

/// For the tests of liveness: with `LLM_SERVER_TEST_ENGINE_HOOK=<path>`, each beat of the
/// decode thread reads that file, and the thread hangs for ever when it says `stall`, panics
/// when it says `panic`.
fn engine_hook() {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    let Some(path) = PATH.get_or_init(|| std::env::var_os(ENGINE_HOOK).map(PathBuf::from)) else {
        return;
    };
    match std::fs::read_to_string(path).as_deref().map(str::trim) {
        Ok("stall") => {
            tracing::warn!("{ENGINE_HOOK}: the decode thread stalls");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        Ok("panic") => panic!("{ENGINE_HOOK}: the decode thread panics"),
        _ => {}
    }
}

/// For the test that proves the load test's leak bound can fail: with
/// `LLM_SERVER_TEST_LEAK_PER_REQUEST=<bytes>`, each request leaks that many bytes of touched
/// heap.
fn leak_per_request() {
    static BYTES: OnceLock<usize> = OnceLock::new();
    let bytes = *BYTES.get_or_init(|| {
        std::env::var("LLM_SERVER_TEST_LEAK_PER_REQUEST")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if bytes > 0 {
        // Non-zero bytes: every page is written, so resident; black_box: an allocation nobody
        // reads could be optimised away.
        std::hint::black_box(vec![0x5au8; bytes].leak());
    }
}
