//! Arbitrary text into the GBNF reader (client input: a request's `grammar`). It must return,
//! never panic, overflow the stack or take more than linear time, and whatever it accepts must
//! be Lark that llguidance compiles: a grammar the reader passes on is never one llguidance
//! then chokes on (or refuses with a message about a text the client never wrote).

#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use llm_server::grammar::{compile_for_bytes, gbnf, Spec};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match gbnf::to_lark(text) {
        Ok(lark) => {
            if let Err(e) = compile_for_bytes(&Spec::Lark(lark.clone())) {
                panic!(
                    "the GBNF reader accepted {text:?} as\n{lark}\nbut llguidance refuses it: {e}"
                );
            }
        }
        Err(e) => {
            black_box(e.to_string());
        }
    }
});
