//! `Tokenizer::encode_within` against `encode`: the same tokens whenever they fit the limit, and
//! a refusal, with a bound above the limit, whenever they do not. The bound is counted from
//! the bytes of each fragment before it is tokenized (no token stands for more input bytes than
//! the vocabulary's longest text), so a wrong bound would refuse a text that fits: the limits
//! tried are the true count and the counts around it, on texts where the bound is tight (runs
//! of one character) and loose, with control tokens, for SentencePiece and byte-level BPE
//! vocabularies and the default model's.

use crate::tokenizer_common::{default_model, load, testdata, vocab_cases};
use llm_server::gguf::Gguf;
use llm_server::tokenizer::Tokenizer;

fn texts(tok: &Tokenizer, cases: Vec<String>) -> Vec<String> {
    let control = tok
        .token_id("<end_of_turn>")
        .or_else(|| tok.token_id("<|eot_id|>"))
        .map(|id| String::from_utf8_lossy(tok.piece(id, true)).into_owned())
        .unwrap_or_default();
    let mut texts = cases;
    for n in [1, 7, 64, 1000] {
        texts.push("a".repeat(n));
        texts.push(" ".repeat(n));
        texts.push("=".repeat(n));
        texts.push("\u{2581}".repeat(n));
        texts.push(format!("{}{control}{}", "ab ".repeat(n), "é".repeat(n)));
    }
    texts.push(format!("{control}{control} x {control}"));
    texts
}

/// Every text of `texts` at limits around its token count: within gives encode's tokens or a
/// refusal whose bound exceeds the limit, exactly as the count says.
fn within_agrees(name: &str, tok: &Tokenizer, texts: &[String]) {
    let mut failures = Vec::new();
    for text in texts {
        for marked in [false, true] {
            let (full, within): (Vec<u32>, Box<dyn Fn(usize) -> _>) = if marked {
                let plain = tok.mark_plain(text).into_owned();
                let full = tok.encode_marked(&plain, true);
                (
                    full,
                    Box::new(move |n| tok.encode_marked_within(&plain, true, n)),
                )
            } else {
                let full = tok.encode(text, true, true);
                (
                    full,
                    Box::new(move |n: usize| tok.encode_within(text, true, true, n)),
                )
            };
            let count = full.len();
            for limit in [0, count.saturating_sub(1), count, count + 1, count * 2] {
                let got = within(limit);
                let ok = match &got {
                    Ok(ids) => count <= limit && *ids == full,
                    Err(e) => count > limit && e.at_least > limit && e.at_least <= count,
                };
                if !ok {
                    failures.push(format!(
                        "{name} marked={marked} {:?} ({count} tokens) at limit {limit}: {:?}",
                        text.chars().take(40).collect::<String>(),
                        got.map(|ids| ids.len())
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn encode_within_is_encode_or_a_refusal_exactly_when_the_count_is_over() {
    for vocab in ["llama-spm", "llama-bpe", "gpt-2"] {
        let (tok, cases) = vocab_cases(vocab);
        let texts = texts(&tok, cases.into_iter().map(|c| c.text).collect());
        within_agrees(vocab, &tok, &texts);
    }
    let tok = load(&default_model());
    let texts = texts(&tok, vec!["Hello, world!".into(), "  two  spaces ".into()]);
    within_agrees("default model", &tok, &texts);
}

/// A text far too long for the limit is refused by its bytes alone: the bound is at least its
/// length over the longest token text, far above the limit.
#[test]
fn a_text_far_over_the_limit_is_refused_by_its_length() {
    let path = testdata("vocab/ggml-vocab-llama-spm.gguf");
    let tok = load(&path);
    let longest = {
        let g = Gguf::open(&path).unwrap();
        let tokens = g.metadata.strings("tokenizer.ggml.tokens").unwrap();
        tokens.iter().map(|t| t.len()).max().unwrap()
    };
    let text = "a".repeat(2 << 20);
    let e = tok.encode_within(&text, true, true, 1023).unwrap_err();
    assert!(
        e.at_least >= text.len() / longest,
        "{e:?}, longest token text {longest}"
    );
}
