//! SentencePiece (`tokenizer.ggml.model = "llama"`) against llama.cpp's own outputs.

use crate::tokenizer_common::*;
use llm_server::gguf::Gguf;
use llm_server::tokenizer::{StreamDecoder, Tokenizer};
use proptest::prelude::*;

#[test]
fn gemma3_golden_tokenize_cases() {
    let golden = testdata("gemma-3-270m-q4_k_m.golden.json");
    let tok = load(&default_model());
    let cases = golden_tokenize(&golden);
    assert!(cases.len() >= 17);
    for (text, ids) in cases {
        assert_eq!(tok.encode(&text, true, true), ids, "{text:?}");
    }
}

#[test]
fn gemma3_special_tokens_and_eog() {
    let tok = load(&default_model());
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(2), Some(1), true)
    );
    assert_eq!(tok.n_vocab(), 262_144);
    let eot = tok.token_id("<end_of_turn>").expect("<end_of_turn>");
    assert_eq!(eot, 106);
    assert!(tok.is_eog(1) && tok.is_eog(eot));
    assert!(!tok.is_eog(2) && !tok.is_eog(107) && !tok.is_eog(u32::MAX));
    // Without parse_special a control token's text is ordinary text.
    let as_text = tok.encode("<end_of_turn>", false, false);
    assert!(as_text.len() > 1 && !as_text.contains(&eot));
    assert_eq!(tok.decode(&as_text, false), "<end_of_turn>");
    // Control tokens render only when asked.
    assert_eq!(tok.piece(eot, false), b"");
    assert_eq!(tok.piece(eot, true), b"<end_of_turn>");
    assert_eq!(tok.piece(u32::MAX, true), b"");
}

#[test]
fn gemma3_vocab_loads() {
    // How fast it builds is a benchmark's question (`examples/tokenize_bench.rs` prints it), not
    // a test's: a shared machine makes any time bound flaky.
    let g = Gguf::open(&default_model()).expect("model");
    let tok = Tokenizer::from_metadata(&g.metadata).expect("tokenizer");
    assert_eq!(tok.n_vocab(), 262_144);
}

#[test]
fn synth_models_golden_tokenize_cases() {
    let dir = testdata_dir().join("synth");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("synth dir") {
        let path = entry.expect("entry").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".golden.json") else {
            continue;
        };
        // Every file, also those with tensor types the kernels do not read: the tokenizer needs
        // only the vocabulary.
        let tok = load(&dir.join(format!("{stem}.gguf")));
        for (text, ids) in golden_tokenize(&path) {
            assert_eq!(tok.encode(&text, true, true), ids, "{stem}: {text:?}");
            checked += 1;
        }
    }
    assert!(
        checked > 0,
        "no synth tokenize cases found in {}",
        dir.display()
    );
}

/// llama.cpp's SPM vocabularies with test vectors: Llama 2 and Phi-3 (pre-tokenizer `default`).
#[test]
fn spm_vocab_all_cases() {
    for vocab in ["llama-spm", "phi-3"] {
        let (tok, cases) = vocab_cases(vocab);
        assert_eq!(cases.len(), 46, "{vocab}");
        let failures = vocab_failures(&tok, &cases);
        assert!(
            failures.is_empty(),
            "{vocab}: {} of {} failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }
}

#[test]
fn llama_spm_round_trip_adds_the_space_prefix() {
    let (tok, cases) = vocab_cases("llama-spm");
    for case in &cases {
        let ids = tok.encode(&case.text, false, false);
        let want = if case.text.is_empty() {
            String::new()
        } else {
            format!(" {}", case.text)
        };
        assert_eq!(tok.decode(&ids, false), want);
    }
}

#[test]
fn stream_decoder_matches_decode_on_split_characters() {
    let tok = load(&default_model());
    // Emoji and CJK fall back to byte tokens here, so characters span several tokens.
    let text = "emoji 🦀🚀 日本語 ∑∫√ done";
    let ids = tok.encode(text, false, false);
    let mut stream = StreamDecoder::new(false);
    let mut got = String::new();
    for &id in &ids {
        if let Some(s) = stream.push(&tok, id) {
            got.push_str(s);
        }
    }
    assert!(stream.finish().is_none());
    assert_eq!(got, text);
    assert_eq!(tok.decode(&ids, false), text);
}

#[test]
fn stream_decoder_replaces_a_truncated_character_at_the_end() {
    let tok = load(&default_model());
    let first_byte_of_crab = tok.token_id("<0xF0>").expect("byte token");
    let mut stream = StreamDecoder::new(false);
    assert_eq!(stream.push(&tok, first_byte_of_crab), None);
    assert_eq!(stream.finish(), Some("\u{FFFD}"));
    assert_eq!(stream.finish(), None);
}

fn gemma() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| load(&default_model()))
}

proptest! {
    /// Gemma has no space prefix and falls back to bytes, so any text survives the round trip,
    /// except that SentencePiece's '▁' reads back as the space it stands for.
    #[test]
    fn gemma3_round_trip(s in "\\PC*|[ \\n\\t<>a-z▁]*") {
        let tok = gemma();
        let ids = tok.encode(&s, false, false);
        prop_assert_eq!(tok.decode(&ids, false), s.replace('▁', " "));
    }
}
