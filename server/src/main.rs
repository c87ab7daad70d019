//! `llm-server`: run, tokenize, inspect and serve GGUF models.

mod cli;
mod cpu_guard;

use std::process::ExitCode;

fn main() -> ExitCode {
    // The CPU was checked before `main` (cpu_guard.rs): from here on AVX2/FMA/F16C/BMI2 are safe.
    limit_malloc_arenas();
    cli::main()
}

/// glibc gives every thread that allocates under contention its own arena (up to 8 per core),
/// and freed memory stays in them: on a 1 GB box that is RSS that creeps up with load. Two
/// arenas serve a server whose hot loop allocates nothing. Must run before threads start.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only adjusts allocator tuning; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
