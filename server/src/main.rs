//! `llm-server`: run, tokenize, inspect and serve GGUF models.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before anything else: everything below may use AVX2/FMA/F16C/BMI2.
    if let Err(msg) = llm_server::cpu::check() {
        eprintln!("llm-server: {msg}");
        return ExitCode::from(3);
    }
    cli::main()
}
