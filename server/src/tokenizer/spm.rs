//! SentencePiece-style tokenization as llama.cpp does it (`llm_tokenizer_spm_session`): greedy
//! merging of the adjacent pair whose concatenation is the highest-scoring vocabulary token,
//! then byte fallback (`<0xXX>`) for whatever is left unknown. It is not unigram Viterbi.

use std::collections::BinaryHeap;

use super::merge_queue::Candidate;
use super::vocab::Vocab;

/// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space.
pub const ESCAPED_SPACE: &str = "\u{2581}";

pub struct Spm {
    /// Prepend a space to text that starts the input or follows a special token
    /// (`tokenizer.ggml.add_space_prefix`; true for Llama 2, false for Gemma 3).
    pub add_space_prefix: bool,
    /// `<0xXX>` token of each byte, for byte fallback.
    byte_tokens: Box<[Option<u32>; 256]>,
    /// Used when the vocabulary lacks a byte token (llama.cpp would throw there).
    unk: Option<u32>,
}

/// A run of input bytes in the merge chain; `len == 0` once merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// A candidate merge of `left` with its right neighbour `right`.
/// A queued merge: the higher score first, then the leftmost pair.
type Bigram = Candidate<f32, Pair>;

struct Pair {
    right: i32,
    /// The merged text's length when queued: a merge of either side since makes it stale.
    len: u32,
}

/// Buffers reused across the fragments of one `encode` call.
#[derive(Default)]
pub struct Scratch {
    text: String,
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
}

impl Spm {
    pub fn new(vocab: &Vocab, add_space_prefix: bool, unk: Option<u32>) -> Spm {
        let mut byte_tokens = Box::new([None; 256]);
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            // As llama.cpp's `byte_to_token`: `<0xXX>` first, else the byte as a one-byte text.
            *slot = vocab
                .find(format!("<0x{b:02X}>").as_bytes())
                .or_else(|| vocab.find(&[b as u8]));
        }
        Spm {
            add_space_prefix,
            byte_tokens,
            unk,
        }
    }

    /// Whether every byte of a text becomes a token: a byte token, or the unknown token.
    pub fn every_byte_has_a_token(&self) -> bool {
        self.unk.is_some() || self.byte_tokens.iter().all(Option::is_some)
    }

    /// Tokenizes one raw-text fragment into `out`. `after_special` is true for the first
    /// fragment and for one that follows a special token (where the space prefix applies).
    pub fn encode(
        &self,
        vocab: &Vocab,
        fragment: &str,
        after_special: bool,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        let text = &mut scratch.text;
        text.clear();
        if self.add_space_prefix && after_special {
            text.push_str(ESCAPED_SPACE);
        }
        for (i, part) in fragment.split(' ').enumerate() {
            if i > 0 {
                text.push_str(ESCAPED_SPACE);
            }
            text.push_str(part);
        }
        let bytes = text.as_bytes();

        let symbols = &mut scratch.symbols;
        symbols.clear();
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: i as i32 - 1,
                next: i as i32 + 1,
            });
        }
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = -1;

        let heap = &mut scratch.heap;
        heap.clear();
        for right in 1..symbols.len() as i32 {
            push_bigram(vocab, bytes, symbols, heap, right - 1, right);
        }
        while let Some(Candidate { left, pair, .. }) = heap.pop() {
            let (l, r) = (left as usize, pair.right as usize);
            // Skip pairs made stale by an earlier merge of either side.
            if symbols[l].len == 0
                || symbols[r].len == 0
                || symbols[l].len + symbols[r].len != pair.len
            {
                continue;
            }
            symbols[l].len += symbols[r].len;
            symbols[r].len = 0;
            symbols[l].next = symbols[r].next;
            let after = symbols[r].next;
            if after >= 0 {
                symbols[after as usize].prev = left;
            }
            let (prev, next) = (symbols[l].prev, symbols[l].next);
            push_bigram(vocab, bytes, symbols, heap, prev, left);
            push_bigram(vocab, bytes, symbols, heap, left, next);
        }

        // Every merged symbol is a vocabulary token (merges only happen into tokens), so
        // llama.cpp's `resegment` reduces to: the token, or one byte token per byte.
        let mut i = 0;
        while i >= 0 {
            let s = symbols[i as usize];
            let piece = &bytes[s.start as usize..(s.start + s.len) as usize];
            match vocab.find(piece) {
                Some(id) => out.push(id),
                None => out.extend(
                    piece
                        .iter()
                        .filter_map(|&b| self.byte_tokens[b as usize].or(self.unk)),
                ),
            }
            i = s.next;
        }
    }
}

fn push_bigram(
    vocab: &Vocab,
    bytes: &[u8],
    symbols: &[Symbol],
    heap: &mut BinaryHeap<Bigram>,
    left: i32,
    right: i32,
) {
    if left < 0 || right < 0 {
        return;
    }
    let (l, r) = (symbols[left as usize], symbols[right as usize]);
    let len = l.len + r.len;
    let text = &bytes[l.start as usize..(l.start + len) as usize];
    if let Some(id) = vocab.find(text) {
        heap.push(Bigram {
            key: vocab.score(id),
            left,
            pair: Pair { right, len },
        });
    }
}
