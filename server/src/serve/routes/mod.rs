//! Handlers, one module per family of endpoints.

pub mod generate;
pub mod info;
pub mod tokens;
