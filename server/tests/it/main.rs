//! llm-server's integration tests, one binary (`autotests = false` in Cargo.toml), so axum,
//! tokio and the engine are linked once: the golden parity against llama.cpp, the GGUF reader
//! against hostile files, the tokenizers against llama.cpp's vectors, gguf-py's dequantisation,
//! the HTTP API (in process against the router; spawned only for signals, sd_notify,
//! disconnects and cgroup limits), the real clients, the CLI and the CPU guard.
//!
//! `gguf_malformed` installs this binary's global allocator: it counts live heap bytes per
//! thread, so a parse's peak can be measured while other tests run; the others do not notice
//! it. `decode_allocations` counts every thread's allocations and so needs a process of its own
//! (tests/decode_allocations.rs).

mod serve_support;
mod tokenizer_common;

mod bench_cli;
mod chat_page;
mod cli;
mod cpu_guard;
mod cpu_quota;
mod dequant_vs_gguf_py;
mod gguf_malformed;
mod golden;
mod hostile_conn;
mod hostile_requests;
mod no_pdep_pext;
mod serve_api;
mod serve_body;
mod serve_clients;
mod serve_conn;
mod serve_liveness;
mod serve_load;
mod serve_memory;
mod serve_schemathesis;
mod serve_sdks;
mod serve_security;
mod serve_slot_save;
mod serve_slots;
mod serve_structured;
mod serve_tls;
mod tokenizer_bpe;
mod tokenizer_limit;
mod tokenizer_spm;
