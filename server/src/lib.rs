//! `llm-server`: a CPU inference engine for GGUF models, built for small x86-64-v3 machines.

pub mod cpu;
pub mod engine;
pub mod exit;
pub mod gguf;
pub mod grammar;
pub mod hooks;
pub mod limits;
pub mod malloc;
pub mod model;
pub mod plan;
pub mod quant;
pub mod sampler;
pub mod serve;
pub mod threads;
pub mod tokenizer;
