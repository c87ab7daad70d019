//! The vocabulary as llama.cpp loads it: token texts, scores and attributes from the GGUF
//! arrays, plus a text → id index built for fast loading (one arena, one open-addressing table;
//! no per-token heap allocation, so the 262,144-token Gemma vocabulary loads in milliseconds).

use crate::gguf::Metadata;

use super::TokenizerError;

/// Token attributes, as llama.cpp derives them from `tokenizer.ggml.token_type`
/// (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attr(u8);

impl Attr {
    pub const UNDEFINED: Attr = Attr(0);
    pub const NORMAL: Attr = Attr(1);
    pub const UNKNOWN: Attr = Attr(2);
    pub const CONTROL: Attr = Attr(4);
    pub const USER_DEFINED: Attr = Attr(8);
    pub const UNUSED: Attr = Attr(16);
    pub const BYTE: Attr = Attr(32);

    fn from_token_type(t: i32) -> Attr {
        match t {
            1 => Attr::NORMAL,
            2 => Attr::UNKNOWN,
            3 => Attr::CONTROL,
            4 => Attr::USER_DEFINED,
            5 => Attr::UNUSED,
            6 => Attr::BYTE,
            _ => Attr::UNDEFINED,
        }
    }

    pub const fn or(self, other: Attr) -> Attr {
        Attr(self.0 | other.0)
    }

    /// True when any of `other`'s bits is set.
    pub fn has(self, other: Attr) -> bool {
        self.0 & other.0 != 0
    }

    fn insert(&mut self, other: Attr) {
        self.0 |= other.0;
    }
}

/// Many byte strings stored back to back: one allocation instead of one per string.
#[derive(Default)]
pub struct Strings {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Strings {
    pub fn with_capacity(n: usize, bytes: usize) -> Strings {
        Strings {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len() as u32);
    }

    /// Appends to the string under construction; [`Strings::finish`] closes it.
    pub fn extend(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
    }

    pub fn finish(&mut self) {
        self.ends.push(self.bytes.len() as u32);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }
}

/// FxHash-style multiply-rotate over 8-byte words: tokens are short, so this beats SipHash by
/// a wide margin. Only the high bits are well mixed (each depends on every input bit), so
/// tables index with those.
pub fn hash_bytes(s: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = s.len() as u64;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("chunk of 8"));
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(buf)).wrapping_mul(K);
    }
    h
}

/// Open-addressing map from token text to id; slots hold `id + 1` (0 = empty).
struct TextIndex {
    slots: Vec<u32>,
    mask: usize,
    /// `64 - log2(slots)`: the first slot of a text is its hash's top bits.
    shift: u32,
}

impl TextIndex {
    fn build(texts: &Strings) -> Result<TextIndex, TokenizerError> {
        let cap = (texts.len() * 2).next_power_of_two().max(16);
        let mut index = TextIndex {
            slots: vec![0; cap],
            mask: cap - 1,
            shift: 64 - cap.trailing_zeros(),
        };
        for id in 0..texts.len() {
            let text = texts.get(id);
            let mut i = (hash_bytes(text) >> index.shift) as usize;
            loop {
                match index.slots[i] {
                    0 => {
                        index.slots[i] = id as u32 + 1;
                        break;
                    }
                    s if texts.get(s as usize - 1) == text => {
                        return Err(TokenizerError::Malformed(format!(
                            "duplicate token in vocabulary: {:?} has ids {} and {id}",
                            String::from_utf8_lossy(text),
                            s - 1
                        )))
                    }
                    _ => i = (i + 1) & index.mask,
                }
            }
        }
        Ok(index)
    }

    fn find(&self, texts: &Strings, text: &[u8]) -> Option<u32> {
        let mut i = (hash_bytes(text) >> self.shift) as usize;
        loop {
            match self.slots[i] {
                0 => return None,
                s if texts.get(s as usize - 1) == text => return Some(s - 1),
                _ => i = (i + 1) & self.mask,
            }
        }
    }
}

/// Token texts, scores and attributes, and the text → id index.
pub struct Vocab {
    texts: Strings,
    scores: Vec<f32>,
    attrs: Vec<Attr>,
    index: TextIndex,
}

impl Vocab {
    pub fn from_metadata(md: &Metadata) -> Result<Vocab, TokenizerError> {
        let tokens = md.strings("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(TokenizerError::Malformed(format!(
                "tokenizer.ggml.tokens has {n} entries"
            )));
        }
        let scores = match md.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(_) => {
                let s = md.f32s("tokenizer.ggml.scores")?;
                check_len("tokenizer.ggml.scores", s.len(), n)?;
                s[..n].to_vec()
            }
        };
        let mut attrs = match md.get("tokenizer.ggml.token_type") {
            None => vec![Attr::NORMAL; n],
            Some(_) => {
                let t = md.i32s("tokenizer.ggml.token_type")?;
                check_len("tokenizer.ggml.token_type", t.len(), n)?;
                t[..n].iter().map(|&t| Attr::from_token_type(t)).collect()
            }
        };
        let total: usize = tokens.iter().map(String::len).sum();
        if total > u32::MAX as usize / 2 {
            return Err(TokenizerError::Malformed(format!(
                "token texts total {total} bytes"
            )));
        }
        let mut texts = Strings::with_capacity(n, total);
        for (i, t) in tokens.iter().enumerate() {
            if t.is_empty() {
                // As llama.cpp: an empty token gets a unique placeholder text, so it can be
                // neither matched nor confused with another.
                texts.push(format!("[EMPTY_{i}]").as_bytes());
            } else {
                texts.push(t.as_bytes());
            }
        }
        let index = TextIndex::build(&texts)?;
        attrs.shrink_to_fit();
        Ok(Vocab {
            texts,
            scores,
            attrs,
            index,
        })
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn text(&self, id: u32) -> &[u8] {
        self.texts.get(id as usize)
    }

    pub fn score(&self, id: u32) -> f32 {
        self.scores[id as usize]
    }

    pub fn attr(&self, id: u32) -> Attr {
        self.attrs[id as usize]
    }

    /// Marks a token CONTROL (llama.cpp does this for end-of-turn tokens found by text).
    pub fn mark_control(&mut self, id: u32) {
        self.attrs[id as usize].insert(Attr::CONTROL);
    }

    pub fn find(&self, text: &[u8]) -> Option<u32> {
        self.index.find(&self.texts, text)
    }
}

fn check_len(key: &str, got: usize, want: usize) -> Result<(), TokenizerError> {
    if got < want {
        return Err(TokenizerError::Malformed(format!(
            "{key} has {got} entries but tokenizer.ggml.tokens has {want}"
        )));
    }
    Ok(())
}
