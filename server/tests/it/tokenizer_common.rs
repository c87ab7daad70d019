//! Shared by the tokenizer tests: llama.cpp's tokenizer test vectors and the golden tokenizations.

use std::path::Path;

pub use test_support::{default_model, testdata, testdata_dir};

use llm_server::gguf::Gguf;
use llm_server::tokenizer::Tokenizer;

pub fn load(path: &Path) -> Tokenizer {
    let g = Gguf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_metadata(&g.metadata).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// llama.cpp's `test-tokenizer-0` vectors: `X.gguf.inp` holds the texts, each followed by
/// `\n__ggml_vocab_test__\n`; line i of `X.gguf.out` holds the ids of text i.
pub struct VocabCase {
    pub text: String,
    pub ids: Vec<u32>,
}

pub fn vocab_cases(vocab: &str) -> (Tokenizer, Vec<VocabCase>) {
    let gguf = testdata(&format!("vocab/ggml-vocab-{vocab}.gguf"));
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).expect("read .inp");
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).expect("read .out");
    // As test-tokenizer-0.cpp: split on the separator; text after the last one (empty) is no case.
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut texts: Vec<&str> = inp.split(SEP).collect();
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        texts.len(),
        lines.len(),
        "{vocab}: .inp and .out disagree on the case count"
    );
    let cases = texts
        .into_iter()
        .zip(lines)
        .map(|(text, line)| VocabCase {
            text: text.to_string(),
            ids: line
                .split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect(),
        })
        .collect();
    (load(&gguf), cases)
}

/// Encodes every case (no BOS, no special parsing, as test-tokenizer-0) and returns the
/// failures, described, so one run shows all of them.
pub fn vocab_failures(tok: &Tokenizer, cases: &[VocabCase]) -> Vec<String> {
    cases
        .iter()
        .filter_map(|case| {
            let got = tok.encode(&case.text, false, false);
            (got != case.ids)
                .then(|| format!("{:?}\n  want {:?}\n  got  {:?}", case.text, case.ids, got))
        })
        .collect()
}

/// `(text, ids)` pairs of a golden JSON file's `tokenize` section.
pub fn golden_tokenize(path: &Path) -> Vec<(String, Vec<u32>)> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read golden")).expect("json");
    json["tokenize"]
        .as_array()
        .expect("tokenize array")
        .iter()
        .map(|c| {
            let text = c["text"].as_str().expect("text").to_string();
            let ids = c["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as u32)
                .collect();
            (text, ids)
        })
        .collect()
}

/// A metadata value for [`gguf_bytes`].
pub enum Kv<'a> {
    Str(&'a str),
    Strs(&'a [&'a str]),
    I32s(&'a [i32]),
}

/// A tensor-less GGUF v3 file holding `kvs`, for tests of metadata handling.
pub fn gguf_bytes(kvs: &[(&str, Kv)]) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    const STRING: u32 = 8;
    const ARRAY: u32 = 9;
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (key, value) in kvs {
        string(&mut out, key);
        match value {
            Kv::Str(s) => {
                out.extend(STRING.to_le_bytes());
                string(&mut out, s);
            }
            Kv::Strs(v) => {
                out.extend(ARRAY.to_le_bytes());
                out.extend(STRING.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                for s in v.iter() {
                    string(&mut out, s);
                }
            }
            Kv::I32s(v) => {
                const I32: u32 = 5;
                out.extend(ARRAY.to_le_bytes());
                out.extend(I32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                for x in v.iter() {
                    out.extend(x.to_le_bytes());
                }
            }
        }
    }
    out
}
