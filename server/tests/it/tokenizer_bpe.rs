//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) against llama.cpp's own outputs.

use crate::tokenizer_common::*;
use llm_server::gguf::Gguf;
use llm_server::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
use proptest::prelude::*;

/// llama.cpp's BPE vocabularies with test vectors (`testdata/vocab`), each named by its
/// `tokenizer.ggml.pre`.
const VOCABS: &[&str] = &[
    "llama-bpe",
    "qwen2",
    "gpt-2",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "mpt",
    "refact",
    "starcoder",
    "qwen35",
];

#[test]
fn all_vocab_cases_match_llama_cpp() {
    let mut report = Vec::new();
    for vocab in VOCABS {
        let (tok, cases) = vocab_cases(vocab);
        assert!(cases.len() >= 46, "{vocab}: {} cases", cases.len());
        let failures = vocab_failures(&tok, &cases);
        if !failures.is_empty() {
            report.push(format!(
                "{vocab}: {} of {} failed:\n{}",
                failures.len(),
                cases.len(),
                failures.join("\n")
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n\n"));
}

#[test]
fn vocab_cases_round_trip() {
    for vocab in VOCABS {
        let (tok, cases) = vocab_cases(vocab);
        for case in &cases {
            let ids = tok.encode(&case.text, false, false);
            assert_eq!(tok.decode(&ids, false), case.text, "{vocab}");
            let mut stream = StreamDecoder::new(false);
            let mut text = String::new();
            for &id in &ids {
                text.push_str(stream.push(&tok, id).unwrap_or(""));
            }
            text.push_str(stream.finish().unwrap_or(""));
            assert_eq!(text, case.text, "{vocab}: stream");
        }
    }
}

#[test]
fn llama3_special_tokens() {
    let (tok, _) = vocab_cases("llama-bpe");
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(128000), Some(128001), true)
    );
    let eot = tok.token_id("<|eot_id|>").expect("<|eot_id|>");
    assert!(tok.is_eog(eot) && tok.is_eog(128001) && !tok.is_eog(128000));
    let header = tok.token_id("<|start_header_id|>").expect("header");
    let ids = tok.encode(
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        true,
        true,
    );
    assert_eq!(ids[..2], [128000, header]);
    assert_eq!(*ids.last().unwrap(), eot);
    assert_eq!(
        tok.decode(&ids, true),
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    );
    assert_eq!(tok.decode(&ids, false), "user\n\nHi");
    // Without parse_special the markup is plain text.
    assert!(!tok.encode("<|eot_id|>", false, false).contains(&eot));
}

#[test]
fn qwen2_marks_im_end_as_end_of_generation() {
    let (tok, _) = vocab_cases("qwen2");
    assert!(!tok.add_bos());
    let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
    assert!(tok.is_eog(im_end) && tok.is_eog(tok.eos().expect("eos")));
    assert_eq!(
        tok.encode("a<|im_end|>", true, true),
        [tok.token_id("a").unwrap(), im_end]
    );
}

fn tiny_vocab(model: &str, pre: &str) -> Result<Tokenizer, TokenizerError> {
    let bytes = gguf_bytes(&[
        ("tokenizer.ggml.model", Kv::Str(model)),
        ("tokenizer.ggml.pre", Kv::Str(pre)),
        ("tokenizer.ggml.tokens", Kv::Strs(&["a", "b", "ab"])),
        ("tokenizer.ggml.merges", Kv::Strs(&["a b"])),
    ]);
    Tokenizer::from_metadata(&Gguf::from_vec(bytes).expect("gguf").metadata)
}

#[test]
fn tiny_vocab_merges() {
    let tok = tiny_vocab("gpt2", "gpt-2").expect("tokenizer");
    assert_eq!(tok.encode("abba", true, true), [2, 1, 0]);
    assert_eq!((tok.bos(), tok.add_bos()), (None, false));
}

#[test]
fn unknown_pre_tokenizer_is_named_in_the_error() {
    let err = tiny_vocab("gpt2", "chameleon").err().expect("must fail");
    assert!(
        matches!(err, TokenizerError::UnsupportedPreTokenizer { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("`chameleon`")
            && msg.contains("llama.cpp knows")
            && msg.contains("llama-bpe")
            && msg.contains("smollm"),
        "{msg}"
    );
    let msg = tiny_vocab("gpt2", "no-such-pre")
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        msg.contains("`no-such-pre`") && msg.contains("unknown to llama.cpp"),
        "{msg}"
    );
}

/// SmolLM's name has no vector file: llama.cpp runs it as StarCoder's (each digit alone, then
/// GPT-2's regex; `llama_vocab::impl::load` and `llm_tokenizer_bpe` in src/llama-vocab.cpp),
/// without BOS by default. So the StarCoder vocabulary named `smollm` passes StarCoder's cases.
#[test]
fn smollm_runs_as_starcoder() {
    let (_, cases) = vocab_cases("starcoder");
    let g = Gguf::open(&testdata("vocab/ggml-vocab-starcoder.gguf")).unwrap();
    let md = &g.metadata;
    let tokens = md.strings("tokenizer.ggml.tokens").unwrap();
    let merges = md.strings("tokenizer.ggml.merges").unwrap();
    let types = md.i32s("tokenizer.ggml.token_type").unwrap();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let merges: Vec<&str> = merges.iter().map(String::as_str).collect();
    let bytes = gguf_bytes(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2")),
        ("tokenizer.ggml.pre", Kv::Str("smollm")),
        ("tokenizer.ggml.tokens", Kv::Strs(&tokens)),
        ("tokenizer.ggml.merges", Kv::Strs(&merges)),
        ("tokenizer.ggml.token_type", Kv::I32s(types)),
    ]);
    let tok = Tokenizer::from_metadata(&Gguf::from_vec(bytes).unwrap().metadata).unwrap();
    assert!(!tok.add_bos());
    let failures = vocab_failures(&tok, &cases);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unknown_model_is_named_in_the_error() {
    let msg = tiny_vocab("t5", "default")
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        msg.contains("t5") && msg.contains("`llama`") && msg.contains("`gpt2`"),
        "{msg}"
    );
}

fn tokenizers() -> &'static [Tokenizer] {
    static TOKS: std::sync::OnceLock<Vec<Tokenizer>> = std::sync::OnceLock::new();
    TOKS.get_or_init(|| VOCABS.iter().map(|v| vocab_cases(v).0).collect())
}

proptest! {
    /// Byte-level BPE covers every byte, so any text comes back unchanged.
    #[test]
    fn round_trip(s in "\\PC*|[ \\n\\t'a-zA-Z0-9.,]*") {
        for tok in tokenizers() {
            let ids = tok.encode(&s, false, false);
            prop_assert_eq!(tok.decode(&ids, false), s.clone());
        }
    }
}
