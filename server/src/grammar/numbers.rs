//! Bounds on the digits of generated JSON numbers, as llama.cpp's schema grammar sets them: at
//! most [`MAX_DIGITS`] digits before the point, after it, and in the exponent.
//!
//! JSON and llguidance's number lexemes have no such bound (`[1-9][0-9]*`, `\.[0-9]+`), and a
//! small model sampling at temperature 0.7 may keep writing digits until `max_tokens`, so the
//! object never closes. llguidance offers no option for it and a JSON schema cannot say it
//! (`minimum`/`maximum` bound the integral part but not a fraction), so the bound is kept here:
//! a small JSON lexer follows the output, and while a number is being written the tokens that
//! would take one of its digit runs past the bound are removed from llguidance's mask.
//!
//! It only ever narrows what the grammar allows, and never to nothing: where the grammar allows
//! only tokens past the bound (a schema's `const` of 20 digits, a `minimum` of 1e20), they stay
//! allowed, so explicit bounds and literals are still honoured.

use llguidance::toktrie::{SimpleVob, TokTrie};

/// Digits at most in the integral part, the fraction and the exponent of a number
/// (llama.cpp's json-schema-to-grammar allows 1 to 16 in each).
pub const MAX_DIGITS: u8 = 16;

/// Where the output is in JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NumberBounds {
    /// Between values, in a key, a literal (`true`) or text around the JSON (a tool call's tags).
    #[default]
    Outside,
    /// In a string, after a backslash when `escaped`.
    InString { escaped: bool },
    /// In a number, in `part`, with `digits` digits of that part so far.
    InNumber { part: Part, digits: u8 },
}

/// A number's digit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Integral,
    Fraction,
    Exponent,
}

impl NumberBounds {
    /// The state after `byte`, and whether the byte kept every digit run within the bound.
    fn step(self, byte: u8) -> (NumberBounds, bool) {
        use NumberBounds::*;
        let number = |part, digits| InNumber { part, digits };
        match self {
            InString { escaped: true } => (InString { escaped: false }, true),
            InString { escaped: false } => match byte {
                b'\\' => (InString { escaped: true }, true),
                b'"' => (Outside, true),
                _ => (self, true),
            },
            InNumber { part, digits } => match byte {
                b'0'..=b'9' => (number(part, digits.saturating_add(1)), digits < MAX_DIGITS),
                b'.' if part == Part::Integral => (number(Part::Fraction, 0), true),
                b'e' | b'E' if part != Part::Exponent => (number(Part::Exponent, 0), true),
                b'+' | b'-' if part == Part::Exponent && digits == 0 => (self, true),
                // Anything else ends the number and is read as outside it.
                _ => Outside.step(byte),
            },
            Outside => match byte {
                b'"' => (InString { escaped: false }, true),
                b'-' => (number(Part::Integral, 0), true),
                b'0'..=b'9' => (number(Part::Integral, 1), true),
                _ => (Outside, true),
            },
        }
    }

    /// Follows the bytes of a chosen token.
    pub fn follow(&mut self, bytes: &[u8]) {
        for &b in bytes {
            *self = self.step(b).0;
        }
    }

    /// Whether a token of these bytes keeps every digit run within the bound.
    fn allows(self, bytes: &[u8]) -> bool {
        let mut state = self;
        for &b in bytes {
            let (next, ok) = state.step(b);
            if !ok {
                return false;
            }
            state = next;
        }
        true
    }

    /// Removes from `mask` the tokens that would take a number past the bound, unless that
    /// leaves nothing allowed.
    pub fn narrow(self, mask: &mut SimpleVob, trie: &TokTrie) {
        // In a string almost every token is allowed, and none of them can end the string and
        // then write 17 digits: the bound is checked from outside strings only, where the
        // grammar allows few tokens.
        if matches!(self, NumberBounds::InString { .. }) {
            return;
        }
        let mut over = Vec::new();
        let mut allowed = 0usize;
        mask.iter_set_entries(|t| {
            allowed += 1;
            if !self.allows(trie.token(t as u32)) {
                over.push(t as u32);
            }
        });
        if over.len() < allowed {
            for t in over {
                mask.disallow_token(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(text: &str) -> NumberBounds {
        let mut s = NumberBounds::default();
        s.follow(text.as_bytes());
        s
    }

    #[test]
    fn digit_runs_are_counted_per_part() {
        let sixteen = "1234567890123456";
        assert!(after(&format!("{{\"a\": {sixteen}")).allows(b".5"));
        assert!(!after(&format!("{{\"a\": {sixteen}")).allows(b"7"));
        assert!(!after(&format!("[-{sixteen}")).allows(b"0"));
        assert!(!after(&format!("[1.{sixteen}")).allows(b"0"));
        assert!(after(&format!("[1.{sixteen}")).allows(b"e-5"));
        assert!(!after(&format!("[1e+{sixteen}")).allows(b"1"));
        assert!(after(&format!("[{sixteen}")).allows(b"], ["));
        // A token may end one number and start another.
        assert!(!after("[1").allows(b", 12345678901234567"));
    }

    #[test]
    fn digits_in_strings_and_literals_are_not_numbers() {
        let long = "\"12345678901234567\\\"";
        assert_eq!(after(long), NumberBounds::InString { escaped: false });
        assert!(after(long).allows(b"890\""));
        assert_eq!(after("[true, 1"), after("[1"));
    }
}
