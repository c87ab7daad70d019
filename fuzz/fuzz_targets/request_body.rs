//! Arbitrary bytes as the body of `POST /v1/chat/completions` and `POST /v1/completions`, read
//! as the server's JSON extractor reads them, then checked as the handlers check them (with the
//! default limits) and, for a chat, rendered in the built-in Gemma format. Nothing may panic;
//! every refusal is an error with a message.

#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use llm_server::engine::chat_template::ChatTemplate;
use llm_server::serve::extract::parse_body;
use llm_server::serve::input::InputArgs;
use llm_server::serve::openai::{ChatRequest, CompletionRequest};

fuzz_target!(|data: &[u8]| {
    let limits = InputArgs::default();
    match parse_body::<ChatRequest>(data) {
        Ok(req) => match req.check(&limits) {
            Ok(checked) => {
                black_box(ChatTemplate::Gemma.render(&checked.input).ok());
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        },
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match parse_body::<CompletionRequest>(data) {
        Ok(req) => {
            black_box(
                req.check(&limits)
                    .map(|c| c.input)
                    .map_err(|e| e.to_string())
                    .ok(),
            );
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
