//! Handlers, one module per family of endpoints.

mod answer;
pub mod generate;
pub mod info;
pub mod tokens;
