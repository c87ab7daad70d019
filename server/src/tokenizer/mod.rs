//! Tokenizers built from GGUF metadata, reproducing llama.cpp's token ids exactly:
//! SentencePiece-style (`tokenizer.ggml.model = "llama"`, e.g. Gemma 3, Llama 2) and
//! byte-level BPE (`"gpt2"`, e.g. Llama 3, Qwen2).
//!
//! Reference: llama.cpp `src/llama-vocab.cpp` (vocabulary loading, `tokenizer_st_partition`,
//! the SPM and BPE sessions, `token_to_piece`) and `src/unicode.cpp` (pre-tokenizers).

mod bpe;
mod merge_queue;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod vocab;

use std::borrow::Cow;

use crate::gguf::{GgufError, Metadata};
use bpe::Bpe;
use special::{Fragment, SpecialTokens};
use spm::Spm;
pub use stream::StreamDecoder;
use vocab::{Attr, Strings, Vocab};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tokenizer.ggml.model is `{0}`, which is not supported; supported tokenizers: `llama` (SentencePiece: Gemma, Llama 2) and `gpt2` (byte-level BPE: Llama 3, Qwen2, GPT-2)")]
    UnsupportedModel(String),
    #[error("tokenizer.ggml.pre is `{name}`, a pre-tokenizer {why}; supported: {supported}; use a model whose vocabulary has one of them")]
    UnsupportedPreTokenizer {
        name: String,
        /// Whether llama.cpp knows the name, in words.
        why: &'static str,
        supported: String,
    },
    #[error("malformed tokenizer metadata: {0}; re-convert the model with a current llama.cpp")]
    Malformed(String),
}

/// Token texts that end generation wherever they occur, as llama.cpp's list (a workaround for
/// converters that do not write `tokenizer.ggml.eot_token_id`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

enum Model {
    Spm(Spm),
    Bpe(Bpe),
}

/// A tokenizer for one model's vocabulary. Immutable after loading, so `Send + Sync`.
pub struct Tokenizer {
    vocab: Vocab,
    /// The bytes each token decodes to with `special = true` (llama.cpp's piece cache).
    pieces: Strings,
    specials: SpecialTokens,
    model: Model,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// Bit set over ids: end-of-generation tokens.
    eog: Vec<u64>,
    /// The longest token text in bytes, where every byte of a text has a token: no token
    /// stands for more bytes of input than its text has (SentencePiece's `▁` is three bytes
    /// for one space, byte-level BPE's characters one or two for one byte), so a text of B
    /// bytes takes at least B / this many tokens. `None` where bytes can be dropped.
    max_token_bytes: Option<usize>,
}

/// What [`Tokenizer::encode_within`] refuses: the text takes more tokens than allowed, at
/// least `at_least` (a bound counted before the text is tokenized whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the text takes at least {at_least} tokens")]
pub struct TooManyTokens {
    pub at_least: usize,
}

// The engine shares one tokenizer between the HTTP handlers and the decode thread.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
};

impl Tokenizer {
    /// Builds the tokenizer that `tokenizer.ggml.model` names.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let kind = md.str("tokenizer.ggml.model")?;
        let mut vocab = Vocab::from_metadata(md)?;
        let n = vocab.len() as u32;
        // An id key pointing outside the vocabulary is ignored (llama.cpp warns and keeps the
        // default), so a sloppy converter does not make the model unusable.
        let id_key = |key: &str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            let default = default.filter(|&d| d < n);
            Ok(match md.opt(key, Metadata::u32)? {
                Some(id) if id < n => Some(id),
                _ => default,
            })
        };
        let (model, bos, eos, add_bos_default) = match kind {
            "llama" => {
                let unk = id_key("tokenizer.ggml.unknown_token_id", Some(0))?;
                let add_space_prefix = md
                    .opt("tokenizer.ggml.add_space_prefix", Metadata::bool)?
                    .unwrap_or(true);
                let spm = Spm::new(&vocab, add_space_prefix, unk);
                (Model::Spm(spm), Some(1), Some(2), true)
            }
            "gpt2" => {
                let bpe = Bpe::from_metadata(md, &vocab)?;
                // llama.cpp's gpt2 defaults (bos = eos = 11) are arbitrary ids; without the
                // keys there is simply no BOS/EOS here.
                let add_bos = bpe::pre_tokenizer_name(md)?.is_some_and(Bpe::adds_bos_by_default);
                (Model::Bpe(bpe), None, None, add_bos)
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let bos = id_key("tokenizer.ggml.bos_token_id", bos)?;
        let eos = id_key("tokenizer.ggml.eos_token_id", eos)?;
        let add_bos = md
            .opt("tokenizer.ggml.add_bos_token", Metadata::bool)?
            .unwrap_or(add_bos_default);
        let add_eos = md
            .opt("tokenizer.ggml.add_eos_token", Metadata::bool)?
            .unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::Malformed(
                "tokenizer.ggml.add_bos_token is true but there is no BOS token".into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::Malformed(
                "tokenizer.ggml.add_eos_token is true but there is no EOS token".into(),
            ));
        }

        let mut eog = vec![0u64; (n as usize).div_ceil(64)];
        let mut set_eog = |id: u32| eog[id as usize / 64] |= 1 << (id % 64);
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = id_key(key, None)? {
                set_eog(id);
            }
        }
        if let Some(id) = eos {
            set_eog(id);
        }
        for text in EOG_TEXTS {
            if let Some(id) = vocab.find(text.as_bytes()) {
                set_eog(id);
                // llama.cpp forces these to CONTROL: they are then split out of text only
                // with `parse_special` and render as nothing unless asked.
                vocab.mark_control(id);
            }
        }

        let pieces = build_pieces(&vocab, &model);
        let specials = SpecialTokens::new(&vocab);
        let every_byte = match &model {
            Model::Spm(spm) => spm.every_byte_has_a_token(),
            Model::Bpe(_) => bpe::every_byte_has_a_token(&vocab),
        };
        let max_token_bytes = every_byte.then(|| {
            (0..vocab.len() as u32)
                .map(|id| vocab.text(id).len())
                .max()
                .unwrap_or(1)
                .max(1)
        });
        Ok(Tokenizer {
            vocab,
            pieces,
            specials,
            model,
            bos,
            eos,
            add_bos,
            add_eos,
            eog,
            max_token_bytes,
        })
    }

    /// Tokenizes `text`. `add_bos`: add BOS (and EOS) where the vocabulary asks for them
    /// (llama.cpp's `add_special`). `parse_special`: CONTROL tokens written as text (e.g.
    /// `<start_of_turn>`) become their ids; USER_DEFINED tokens are matched either way.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        self.encode_fragments(text, add_bos, parse_special, false, usize::MAX)
            .expect("no text takes more than usize::MAX tokens")
    }

    /// [`Tokenizer::encode`], refused when the text takes more than `max_tokens` tokens: a
    /// fragment of text whose bytes alone need more than what is left is refused before it is
    /// tokenized, so a text far too long for a context costs a scan, not the merge structures of
    /// every byte (tens of times the text's size).
    pub fn encode_within(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>, TooManyTokens> {
        self.encode_fragments(text, add_bos, parse_special, false, max_tokens)
    }

    /// `text` to be placed inside a prompt that [`Tokenizer::encode_marked`] reads, so that
    /// control-token texts in it (`<end_of_turn>` in a user's message) stay plain text while
    /// the rest of the prompt (a chat template's markup) is read for control tokens.
    ///
    /// Each occurrence of a control token's text gets [`PLAIN_MARK`] after its first character,
    /// so no control token can be matched there; a mark already in `text` is doubled, so that
    /// it comes out as itself. Text with neither is returned as is: templates that look at
    /// contents (`| trim`, `.startswith(...)`) see them unchanged.
    pub fn mark_plain<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let starts = self.specials.control_starts(&self.vocab, text);
        if starts.is_empty() && !text.contains(PLAIN_MARK) {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len() + 3 * (starts.len() + 1));
        let mut starts = starts.into_iter().peekable();
        for (at, c) in text.char_indices() {
            out.push(c);
            if c == PLAIN_MARK {
                out.push(PLAIN_MARK);
            }
            if starts.next_if_eq(&at).is_some() {
                out.push(PLAIN_MARK);
            }
        }
        Cow::Owned(out)
    }

    /// Tokenizes a prompt whose client-written parts went through [`Tokenizer::mark_plain`]:
    /// control tokens are read out of the text (`parse_special`) except where marked, and the
    /// marks are removed before the text is tokenized.
    pub fn encode_marked(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_marked_within(text, add_bos, usize::MAX)
            .expect("no text takes more than usize::MAX tokens")
    }

    /// [`Tokenizer::encode_marked`] within `max_tokens`, as [`Tokenizer::encode_within`].
    pub fn encode_marked_within(
        &self,
        text: &str,
        add_bos: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>, TooManyTokens> {
        self.encode_fragments(text, add_bos, true, true, max_tokens)
    }

    /// The fewest tokens a fragment of `bytes` bytes can take ([`Tokenizer::max_token_bytes`]).
    fn fewest_tokens(&self, bytes: usize) -> usize {
        self.max_token_bytes.map_or(0, |max| bytes.div_ceil(max))
    }

    fn encode_fragments(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        marked: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>, TooManyTokens> {
        let eos = usize::from(add_bos && self.add_eos && self.eos.is_some());
        // Refused as soon as the tokens so far, the fewest the next fragment can take and the
        // EOS to come exceed the limit; the fragments are tokenized one at a time.
        let check = |count: usize| {
            if count > max_tokens {
                Err(TooManyTokens { at_least: count })
            } else {
                Ok(())
            }
        };
        if !marked {
            // Before the partition, which lists every control token's place. (Marks are no
            // input: a marked text is counted fragment by fragment, unmarked.)
            check(self.fewest_tokens(text.len()).saturating_add(eos))?;
        }
        let mut out = Vec::with_capacity((text.len() / 3 + 2).min(max_tokens.saturating_add(2)));
        if add_bos && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.specials.partition(&self.vocab, text, parse_special);
        let text_of = |range: std::ops::Range<usize>| -> Cow<'_, str> {
            let fragment = text.get(range).unwrap_or_default();
            if marked {
                unmark(fragment)
            } else {
                Cow::Borrowed(fragment)
            }
        };
        match &self.model {
            Model::Spm(spm) => {
                let mut scratch = spm::Scratch::default();
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(range) => {
                            let fragment = text_of(range);
                            check(out.len() + self.fewest_tokens(fragment.len()) + eos)?;
                            spm.encode(
                                &self.vocab,
                                &fragment,
                                after_special,
                                &mut scratch,
                                &mut out,
                            );
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                let mut scratch = bpe::Scratch::default();
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(range) => {
                            let fragment = text_of(range);
                            check(out.len() + self.fewest_tokens(fragment.len()) + eos)?;
                            bpe.encode(&self.vocab, &fragment, &mut scratch, &mut out);
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_bos && self.add_eos {
            out.extend(self.eos);
        }
        check(out.len())?;
        Ok(out)
    }

    /// Whether [`Tokenizer::encode`] with `add_bos = true` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End of generation: EOS, EOT/EOM, and end-of-turn tokens found by text.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog
            .get(id as usize / 64)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// The id of the token whose text is exactly `text` (in the vocabulary's own spelling,
    /// e.g. `"▁Hello"` for SPM or `"ĠHello"` for byte-level BPE).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.find(text.as_bytes())
    }

    /// The bytes token `id` stands for. CONTROL and UNKNOWN tokens give nothing unless
    /// `special`; an id outside the vocabulary gives nothing. The bytes may be part of a UTF-8
    /// character (byte tokens): see [`StreamDecoder`].
    pub fn piece(&self, id: u32, special: bool) -> &[u8] {
        if id as usize >= self.vocab.len()
            || (!special && self.vocab.attr(id).has(Attr::CONTROL.or(Attr::UNKNOWN)))
        {
            return &[];
        }
        self.pieces.get(id as usize)
    }

    /// The text of `ids`: pieces concatenated, invalid UTF-8 replaced by U+FFFD. Unlike
    /// llama.cpp's `detokenize`, no space is stripped or cleaned up, so that
    /// `decode(encode(s))` gives `s` back.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.piece(id, special));
        }
        match String::from_utf8_lossy(&bytes) {
            Cow::Borrowed(_) => String::from_utf8(bytes).unwrap_or_default(),
            Cow::Owned(s) => s,
        }
    }
}

/// The mark of [`Tokenizer::mark_plain`]: a noncharacter, which Unicode reserves for a
/// program's internal use, so no real text is changed by it (one that has it gets it doubled).
pub const PLAIN_MARK: char = '\u{FDD0}';

/// `text` with the marks of [`Tokenizer::mark_plain`] removed: a doubled mark is one mark of
/// the original text, a single one is dropped.
fn unmark(text: &str) -> Cow<'_, str> {
    if !text.contains(PLAIN_MARK) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != PLAIN_MARK {
            out.push(c);
        } else if chars.next_if_eq(&PLAIN_MARK).is_some() {
            out.push(PLAIN_MARK);
        }
    }
    Cow::Owned(out)
}

/// The piece of every token, as llama.cpp's `token_to_piece` with `special = true`.
fn build_pieces(vocab: &Vocab, model: &Model) -> Strings {
    let mut pieces = Strings::with_capacity(vocab.len(), vocab.len() * 6);
    for id in 0..vocab.len() as u32 {
        let attr = vocab.attr(id);
        let text = vocab.text(id);
        if attr.has(Attr::CONTROL.or(Attr::UNKNOWN).or(Attr::USER_DEFINED)) {
            pieces.extend(text);
        } else if attr.has(Attr::NORMAL) {
            match model {
                Model::Spm(_) => extend_unescaped(&mut pieces, text),
                Model::Bpe(_) => extend_byte_decoded(&mut pieces, text),
            }
        } else if attr.has(Attr::BYTE) {
            pieces.extend(parse_byte_token(text).as_slice());
        }
        // UNUSED and undefined tokens decode to nothing, as in llama.cpp.
        pieces.finish();
    }
    pieces
}

/// Appends `text` with every '▁' turned back into a space.
fn extend_unescaped(pieces: &mut Strings, mut text: &[u8]) {
    let escaped = spm::ESCAPED_SPACE.as_bytes();
    while let Some(i) = text.windows(escaped.len()).position(|w| w == escaped) {
        pieces.extend(&text[..i]);
        pieces.extend(b" ");
        text = &text[i + escaped.len()..];
    }
    pieces.extend(text);
}

/// Appends the bytes a byte-level BPE token stands for. A character outside GPT-2's byte
/// table (a malformed vocabulary) is kept as its own UTF-8 rather than dropped.
fn extend_byte_decoded(pieces: &mut Strings, text: &[u8]) {
    for c in String::from_utf8_lossy(text).chars() {
        match bpe::char_to_byte(c) {
            Some(b) => pieces.extend(&[b]),
            None => pieces.extend(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
}

/// The byte of a `<0xXX>` token.
fn parse_byte_token(text: &[u8]) -> Option<u8> {
    let hex = text.strip_prefix(b"<0x")?.strip_suffix(b">")?;
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}
