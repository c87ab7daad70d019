//! Byte-level BPE as llama.cpp does it (`llm_tokenizer_bpe_session`): pre-tokenize into words,
//! map each word's bytes to GPT-2's printable characters, then repeatedly merge the adjacent
//! pair with the lowest merge rank (`tokenizer.ggml.merges` order; ties to the leftmost).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

use crate::gguf::Metadata;

use super::merge_queue::Candidate;
use super::pretokenize::{self, PreTokenizer};
use super::vocab::Vocab;
use super::TokenizerError;

/// GPT-2's byte → character table: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100.. in byte order, so every byte string becomes printable text.
pub fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Inverse of [`byte_to_char`].
pub fn char_to_byte(c: char) -> Option<u8> {
    byte_table().bytes.get(c as usize).copied().flatten()
}

/// All 256 characters are below U+0144.
const TABLE_CHARS: usize = 0x144;

struct ByteTable {
    /// UTF-8 of each byte's character (1 or 2 bytes), for fast word encoding.
    utf8: [([u8; 2], u8); 256],
    /// The byte of each character below U+0144, if it stands for one.
    bytes: [Option<u8>; TABLE_CHARS],
}

/// Whether the vocabulary has a token for each of the 256 bytes' characters, so that no byte of
/// a text is dropped (llama.cpp drops a byte that has none).
pub fn every_byte_has_a_token(vocab: &Vocab) -> bool {
    byte_table()
        .utf8
        .iter()
        .all(|(utf8, n)| vocab.find(&utf8[..*n as usize]).is_some())
}

fn byte_table() -> &'static ByteTable {
    static TABLE: std::sync::OnceLock<ByteTable> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = ByteTable {
            utf8: [([0; 2], 0); 256],
            bytes: [None; TABLE_CHARS],
        };
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            t.bytes[c as usize] = Some(b);
            let mut buf = [0u8; 4];
            let len = c.encode_utf8(&mut buf).len() as u8;
            t.utf8[b as usize] = ([buf[0], buf[1]], len);
        }
        t
    })
}

/// Hasher for a pair of token ids packed into a u64: one multiply, high bits folded down.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

#[derive(Clone, Copy)]
struct Merge {
    rank: u32,
    /// The token the pair becomes.
    into: u32,
}

const NO_TOKEN: u32 = u32::MAX;

pub struct Bpe {
    pre: PreTokenizer,
    /// Emit a word that is itself a token without merging (llama.cpp's `ignore_merges`, set
    /// for Llama 3).
    ignore_merges: bool,
    merges: HashMap<u64, Merge, BuildHasherDefault<PairHasher>>,
}

/// How llama.cpp runs one `tokenizer.ggml.pre` name: its regex family, and the two flags the
/// name sets that change token ids (`ignore_merges`: a word that is itself a token skips merging;
/// `add_bos`: BOS is added unless `tokenizer.ggml.add_bos_token` says otherwise).
struct PreTokenizerName {
    name: &'static str,
    pre: PreTokenizer,
    ignore_merges: bool,
    add_bos: bool,
}

const fn pre(name: &'static str, pre: PreTokenizer) -> PreTokenizerName {
    PreTokenizerName {
        name,
        pre,
        ignore_merges: false,
        add_bos: false,
    }
}

const LLAMA3: PreTokenizer = PreTokenizer::Llama3 {
    max_digits: 3,
    marks: false,
};
const QWEN2: PreTokenizer = PreTokenizer::Llama3 {
    max_digits: 1,
    marks: false,
};

/// The names this engine runs, as llama.cpp maps them: `llama_vocab::impl::load` in
/// `src/llama-vocab.cpp` turns the name into a pre-tokenizer type (and sets the flags), and
/// `llm_tokenizer_bpe::llm_tokenizer_bpe` gives each type its regexes; names whose types share
/// regexes share a family here.
const PRE_TOKENIZERS: &[PreTokenizerName] = &[
    pre("default", PreTokenizer::Default),
    // LLAMA3: ignore_merges and add_bos.
    llama3("llama3"),
    llama3("llama-v3"),
    llama3("llama-bpe"),
    llama3("falcon3"),
    llama3("falcon-h1"),
    llama3("pixtral"),
    llama3("midm-2.0"),
    llama3("lfm2"),
    llama3("jina-v5-nano"),
    // DBRX, SMAUG and CHATGLM4: Llama 3's regex without its flags.
    pre("dbrx", LLAMA3),
    pre("smaug-bpe", LLAMA3),
    pre("glm4", LLAMA3),
    pre("chatglm-bpe", LLAMA3),
    // QWEN2 (and STABLELM2, HUNYUAN, SOLAR_OPEN, GROK_2: the same regex).
    pre("qwen2", QWEN2),
    pre("deepseek-r1-qwen", QWEN2),
    pre("kormo", QWEN2),
    pre("f2llmv2", QWEN2),
    pre("megrez", QWEN2),
    pre("stablelm2", QWEN2),
    pre("hunyuan", QWEN2),
    pre("solar-open", QWEN2),
    pre("grok-2", QWEN2),
    pre(
        "qwen35",
        PreTokenizer::Llama3 {
            max_digits: 1,
            marks: true,
        },
    ),
    // GPT2, MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING: GPT-2's regex alone.
    pre("gpt-2", PreTokenizer::Gpt2),
    pre("phi-2", PreTokenizer::Gpt2),
    pre("jina-es", PreTokenizer::Gpt2),
    pre("jina-de", PreTokenizer::Gpt2),
    pre("gigachat", PreTokenizer::Gpt2),
    pre("jina-v2-es", PreTokenizer::Gpt2),
    pre("jina-v2-de", PreTokenizer::Gpt2),
    pre("a.x-4.0", PreTokenizer::Gpt2),
    pre("mellum", PreTokenizer::Gpt2),
    pre("modern-bert", PreTokenizer::Gpt2),
    pre("exaone4", PreTokenizer::Gpt2),
    pre("mpt", PreTokenizer::Gpt2),
    pre("olmo", PreTokenizer::Gpt2),
    pre("jais", PreTokenizer::Gpt2),
    pre("trillion", PreTokenizer::Gpt2),
    pre("granite-docling", PreTokenizer::Gpt2),
    // STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2.
    pre("starcoder", PreTokenizer::DigitsThenGpt2),
    pre("refact", PreTokenizer::DigitsThenGpt2),
    pre("command-r", PreTokenizer::DigitsThenGpt2),
    pre("smollm", PreTokenizer::DigitsThenGpt2),
    pre("codeshell", PreTokenizer::DigitsThenGpt2),
    pre("exaone", PreTokenizer::DigitsThenGpt2),
    pre("minerva-7b", PreTokenizer::DigitsThenGpt2),
    pre("mellum2", PreTokenizer::DigitsThenGpt2),
    pre("falcon", PreTokenizer::Falcon),
    pre("deepseek-coder", PreTokenizer::DeepseekCoder),
    pre("deepseek-llm", PreTokenizer::DeepseekLlm),
];

const fn llama3(name: &'static str) -> PreTokenizerName {
    PreTokenizerName {
        name,
        pre: LLAMA3,
        ignore_merges: true,
        add_bos: true,
    }
}

/// Names llama.cpp knows (same source) whose regexes, normalisation or extra tokens this engine
/// does not implement: refused, with the list of those it runs.
const REFUSED_PRE_TOKENIZERS: &[&str] = &[
    "deepseek-v3",
    "minicpm5",
    "spark2_5",
    "youtu",
    "jais-2",
    "gemma4",
    "granite-embed-multi-311m",
    "sarvam-moe",
    // GPT-2's regex, but llama.cpp adds a SEP token (BERT-style embedding models).
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "whitespace",
    "poro-chat",
    "bloom",
    "gpt3-finnish",
    "viking",
    "tekken",
    "exaone-moe",
    "chameleon",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "granite-embed-multi-97m",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "hunyuan-dense",
    "hy_v4",
    "joyai-llm",
    "kimi-k2",
    "ufakzeka",
    "afmoe",
    "laguna",
    "minimax-m2",
];

/// The names this engine runs, for error messages and tests.
pub fn supported_pre_tokenizers() -> impl Iterator<Item = &'static str> {
    PRE_TOKENIZERS.iter().map(|p| p.name)
}

/// Buffers reused across the words of one `encode` call.
#[derive(Default)]
pub struct Scratch {
    pre: pretokenize::Scratch,
    words: Vec<Range<usize>>,
    encoded: Vec<u8>,
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
}

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
    /// Token of this symbol's text, or `NO_TOKEN`.
    id: u32,
}

/// A queued merge: the lowest rank first (hence `Reverse`), then the leftmost pair.
type Bigram = Candidate<Reverse<u32>, Pair>;

struct Pair {
    right: i32,
    /// The two tokens when the pair was queued: a merge since then makes it stale.
    left_id: u32,
    right_id: u32,
    into: u32,
}

impl Bpe {
    /// Whether llama.cpp adds BOS by default for the pre-tokenizer `pre` names.
    pub fn adds_bos_by_default(pre: &str) -> bool {
        PRE_TOKENIZERS.iter().any(|p| p.name == pre && p.add_bos)
    }

    pub fn from_metadata(md: &Metadata, vocab: &Vocab) -> Result<Bpe, TokenizerError> {
        // Without the key llama.cpp falls back to its default pre-tokenizer (with a warning
        // that quality suffers); so do we.
        let pre_name = pre_tokenizer_name(md)?.unwrap_or("default");
        let entry = PRE_TOKENIZERS
            .iter()
            .find(|p| p.name == pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
                name: pre_name.to_string(),
                why: if REFUSED_PRE_TOKENIZERS.contains(&pre_name) {
                    "llama.cpp knows but this engine does not implement"
                } else {
                    "unknown to llama.cpp and to this engine"
                },
                supported: supported_pre_tokenizers().collect::<Vec<_>>().join(", "),
            })?;
        let (pre, ignore_merges) = (entry.pre, entry.ignore_merges);
        let lines = md.strings("tokenizer.ggml.merges")?;
        let mut merges = HashMap::with_capacity_and_hasher(lines.len(), Default::default());
        let mut joined = Vec::new();
        for (rank, line) in lines.iter().enumerate() {
            // As llama.cpp: split at the first space after the first byte (a merge of a space
            // token reads "Ġ Ġ", but "  x" would have a space as its first half).
            let after_first = line.as_bytes().get(1..).unwrap_or_default();
            let Some(cut) = after_first.iter().position(|&b| b == b' ').map(|i| i + 1) else {
                continue;
            };
            let (left, right) = (&line[..cut], &line[cut + 1..]);
            let (Some(l), Some(r)) = (vocab.find(left.as_bytes()), vocab.find(right.as_bytes()))
            else {
                // A merge of non-tokens can never apply to symbols that are tokens.
                continue;
            };
            joined.clear();
            joined.extend_from_slice(&line.as_bytes()[..cut]);
            joined.extend_from_slice(right.as_bytes());
            let into = vocab.find(&joined).unwrap_or(NO_TOKEN);
            // The first occurrence of a pair wins, as with llama.cpp's `emplace`.
            merges.entry(pair(l, r)).or_insert(Merge {
                rank: rank as u32,
                into,
            });
        }
        Ok(Bpe {
            pre,
            ignore_merges,
            merges,
        })
    }

    /// Tokenizes one raw-text fragment into `out`.
    pub fn encode(&self, vocab: &Vocab, text: &str, scratch: &mut Scratch, out: &mut Vec<u32>) {
        scratch.words.clear();
        self.pre.split(text, &mut scratch.pre, &mut scratch.words);
        let table = byte_table();
        for w in 0..scratch.words.len() {
            let word = &text.as_bytes()[scratch.words[w].clone()];
            scratch.encoded.clear();
            for &b in word {
                let (utf8, n) = &table.utf8[b as usize];
                scratch.encoded.extend_from_slice(&utf8[..*n as usize]);
            }
            if self.ignore_merges {
                if let Some(id) = vocab.find(&scratch.encoded) {
                    out.push(id);
                    continue;
                }
            }
            self.merge_word(vocab, scratch, out);
        }
    }

    /// BPE over `scratch.encoded` (one byte-encoded word).
    fn merge_word(&self, vocab: &Vocab, scratch: &mut Scratch, out: &mut Vec<u32>) {
        let bytes = &scratch.encoded[..];
        let symbols = &mut scratch.symbols;
        symbols.clear();
        let text = std::str::from_utf8(bytes).unwrap_or_default();
        for (i, (start, c)) in text.char_indices().enumerate() {
            let piece = &bytes[start..start + c.len_utf8()];
            symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: i as i32 - 1,
                next: i as i32 + 1,
                id: vocab.find(piece).unwrap_or(NO_TOKEN),
            });
        }
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = -1;

        let heap = &mut scratch.heap;
        heap.clear();
        for right in 1..symbols.len() as i32 {
            self.push_bigram(symbols, heap, right - 1, right);
        }
        while let Some(Candidate { left, pair: b, .. }) = heap.pop() {
            let (l, r) = (left as usize, b.right as usize);
            // Stale when either side has changed since the pair was queued.
            if symbols[l].len == 0
                || symbols[r].len == 0
                || symbols[l].id != b.left_id
                || symbols[r].id != b.right_id
            {
                continue;
            }
            symbols[l].len += symbols[r].len;
            symbols[l].id = b.into;
            symbols[r].len = 0;
            symbols[l].next = symbols[r].next;
            let after = symbols[r].next;
            if after >= 0 {
                symbols[after as usize].prev = left;
            }
            let (prev, next) = (symbols[l].prev, symbols[l].next);
            self.push_bigram(symbols, heap, prev, left);
            self.push_bigram(symbols, heap, left, next);
        }

        let mut i = 0;
        while i >= 0 {
            let s = symbols[i as usize];
            let piece = &bytes[s.start as usize..(s.start + s.len) as usize];
            match (s.id != NO_TOKEN)
                .then_some(s.id)
                .or_else(|| vocab.find(piece))
            {
                Some(id) => out.push(id),
                // As llama.cpp: each byte of the (encoded) text that is itself a token.
                None => out.extend(piece.iter().filter_map(|&b| vocab.find(&[b]))),
            }
            i = s.next;
        }
    }

    fn push_bigram(
        &self,
        symbols: &[Symbol],
        heap: &mut BinaryHeap<Bigram>,
        left: i32,
        right: i32,
    ) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (symbols[left as usize].id, symbols[right as usize].id);
        if l == NO_TOKEN || r == NO_TOKEN {
            return;
        }
        if let Some(m) = self.merges.get(&pair(l, r)) {
            heap.push(Bigram {
                key: Reverse(m.rank),
                left,
                pair: Pair {
                    right,
                    left_id: l,
                    right_id: r,
                    into: m.into,
                },
            });
        }
    }
}

/// `tokenizer.ggml.pre`, if present.
pub fn pre_tokenizer_name(md: &Metadata) -> Result<Option<&str>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.pre";
    Ok(match md.get(KEY) {
        Some(_) => Some(md.str(KEY)?),
        None => None,
    })
}

fn pair(left: u32, right: u32) -> u64 {
    (left as u64) << 32 | right as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name is either run or refused, never both, and each once.
    #[test]
    fn pre_tokenizer_names_are_run_or_refused_once() {
        let mut names: Vec<&str> = supported_pre_tokenizers()
            .chain(REFUSED_PRE_TOKENIZERS.iter().copied())
            .collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a name is listed twice");
        for name in ["smollm", "llama-bpe", "qwen35", "falcon", "deepseek-coder"] {
            assert!(supported_pre_tokenizers().any(|s| s == name), "{name}");
        }
        assert!(Bpe::adds_bos_by_default("llama-bpe") && !Bpe::adds_bos_by_default("smollm"));
    }

    #[test]
    fn byte_table_is_gpt2s() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
    }
}
