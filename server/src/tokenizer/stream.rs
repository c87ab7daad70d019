//! Incremental detokenization for streaming: tokens can end inside a UTF-8 character (byte
//! tokens, byte-level BPE), so bytes are held back until the character is complete.

use super::Tokenizer;

const PIECE_CAPACITY: usize = 256;

/// Turns a stream of token ids into text, one complete UTF-8 chunk at a time. Buffers are
/// reused, so pushing a token allocates nothing once they have grown.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// Render CONTROL/UNKNOWN tokens as their text.
    special: bool,
    /// Bytes of an incomplete character carried over from earlier tokens.
    pending: Vec<u8>,
    /// The text returned by the last call.
    out: String,
}

impl StreamDecoder {
    pub fn new(special: bool) -> StreamDecoder {
        // Room for the longest pieces of the vocabularies we serve (Gemma's run to a few
        // dozen bytes), so the decode loop never grows these buffers.
        StreamDecoder {
            special,
            pending: Vec::with_capacity(PIECE_CAPACITY),
            out: String::with_capacity(PIECE_CAPACITY),
        }
    }

    /// Adds token `id`; returns the text it completes, if any. Invalid bytes become U+FFFD;
    /// an incomplete character at the end is kept for the next token.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Option<&str> {
        self.pending
            .extend_from_slice(tokenizer.piece(id, self.special));
        self.drain(false)
    }

    /// Flushes what is left at the end of the stream (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> Option<&str> {
        self.drain(true)
    }

    fn drain(&mut self, at_end: bool) -> Option<&str> {
        self.out.clear();
        let mut rest = &self.pending[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // `valid` is the prefix `from_utf8` just vouched for.
                    self.out
                        .push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            rest = &tail[bad..];
                        }
                        None if at_end => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = tail;
                            break;
                        }
                    }
                }
            }
        }
        let kept = rest.len();
        let start = self.pending.len() - kept;
        self.pending.copy_within(start.., 0);
        self.pending.truncate(kept);
        (!self.out.is_empty()).then_some(self.out.as_str())
    }
}
