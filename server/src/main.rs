//! `llm-server`: run, tokenize, inspect and serve GGUF models.

mod cli;
mod cpu_guard;

use std::process::ExitCode;

fn main() -> ExitCode {
    // The CPU was checked before `main` (cpu_guard.rs): from here on AVX2/FMA/F16C/BMI2 are safe.
    llm_server::malloc::tune();
    cli::main()
}
