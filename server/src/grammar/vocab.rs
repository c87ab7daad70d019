//! The vocabulary as llguidance reads it: every token's bytes, special tokens marked.

use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::tokenizer::Tokenizer;

/// Each token's bytes; control tokens (`<start_of_turn>`, EOS, ...) get llguidance's 0xFF
/// marker in front, so that no grammar text ever matches them.
pub fn token_bytes(tokenizer: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tokenizer.n_vocab() as u32)
        .map(|id| {
            let text = tokenizer.piece(id, false);
            if text.is_empty() {
                let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                marked.extend_from_slice(tokenizer.piece(id, true));
                marked
            } else {
                text.to_vec()
            }
        })
        .collect()
}

/// The end-of-generation tokens: the ones a complete output may end with.
pub fn eog_tokens(tokenizer: &Tokenizer) -> Vec<u32> {
    (0..tokenizer.n_vocab() as u32)
        .filter(|&id| tokenizer.is_eog(id))
        .collect()
}

/// llguidance's tokenizer environment for `tokenizer`. Text it must tokenize itself (rare:
/// forced prefixes) is split greedily over the trie, which gives valid if not canonical ids.
pub fn tok_env(tokenizer: &Tokenizer) -> TokEnv {
    let words = token_bytes(tokenizer);
    let eog = eog_tokens(tokenizer);
    let eos = tokenizer.eos().or(eog.first().copied()).unwrap_or(0);
    let info = TokRxInfo {
        vocab_size: words.len() as u32,
        tok_eos: eos,
        tok_bos: tokenizer.bos(),
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    let mut trie = TokTrie::from(&info, &words);
    if !eog.is_empty() {
        trie = trie.with_eos_tokens(&eog);
    }
    Arc::new(ApproximateTokEnv::new(trie))
}

/// A tokenizer environment of the 256 single bytes and one end token: for checking grammars
/// where there is no model (the fuzz target `gbnf_parse`).
pub fn byte_tok_env() -> TokEnv {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push([&[TokTrie::SPECIAL_TOKEN_MARKER][..], b"<eos>"].concat());
    let info = TokRxInfo {
        vocab_size: words.len() as u32,
        tok_eos: 256,
        tok_bos: None,
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)))
}
