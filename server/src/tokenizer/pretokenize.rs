//! Pre-tokenizers of byte-level BPE vocabularies: the regexes named by `tokenizer.ggml.pre`,
//! as llama.cpp runs them (`src/unicode.cpp`, `unicode_regex_split`). llama.cpp matches the
//! GPT-2 and Llama 3 regexes with hand-written scanners (`unicode_regex_split_custom_gpt2/llama3`),
//! whose decisions are reproduced here step by step; Qwen2's regex differs from Llama 3's only in
//! taking digits one at a time (`\p{N}` instead of `\p{N}{1,3}`), so it is the Llama 3 scanner
//! with a run of 1, and Qwen3.5's also lets combining marks join letters. The other families are
//! lists of simple regexes applied in turn, each splitting the pieces of the previous one into its
//! matches and the gaps between them.
//!
//! Unicode classes follow llama.cpp's table: `\p{L}`, `\p{N}`, `\p{M}` and `\p{P}` are the
//! general-category groups; `\s` is the White_Space list below.

use std::ops::Range;

use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` (Llama 3: 3 digits; Qwen2: 1).
    /// With `marks` (Qwen3.5), combining marks join letters: `[\p{L}\p{M}]+` for `\p{L}+`, and
    /// the punctuation run excludes `\p{M}`.
    Llama3 { max_digits: usize, marks: bool },
    /// llama.cpp's fallback for BPE vocabularies without a known pre-tokenizer, four regexes
    /// applied in turn, each splitting the pieces of the previous one:
    /// `[\p{P}\$\+<=>\^~\|]+`, then GPT-2's, then `\p{N}+`, then `[0-9][0-9][0-9]`.
    Default,
    /// Falcon: `[\p{P}\$\+<=>\^~\|`]+`, then GPT-2's, then `[0-9][0-9][0-9]`.
    Falcon,
    /// StarCoder, Refact, SmolLM and others: `\p{N}` (each digit alone), then GPT-2's.
    DigitsThenGpt2,
    /// DeepSeek Coder: `[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}`.
    DeepseekCoder,
    /// DeepSeek LLM: `[\r\n]`, `\s?[<letters>]+`, `\s?[<punctuation>]+`, `\s+$`,
    /// `[一-龥ࠀ-一가-퟿]+`, `\p{N}+`, with the explicit ranges of [`DEEPSEEK_LLM_LETTERS`] and
    /// [`DEEPSEEK_LLM_PUNCT`].
    DeepseekLlm,
}

/// The letter class of DeepSeek LLM's second regex, as ranges `a-b` and single characters
/// (llama.cpp's `llm_tokenizer_bpe`, case `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM`).
const DEEPSEEK_LLM_LETTERS: &str = "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃";

/// The punctuation class of DeepSeek LLM's third regex (same source).
const DEEPSEEK_LLM_PUNCT: &str = "!-/:-~！-／：-～‘-‟　-。";

/// Class bits of one character. `IN_TEXT` marks a real character, so that positions past the
/// end (no bits) never match a class, as llama.cpp's `OUT_OF_RANGE` flags.
const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const SPACE: u8 = 4;
const IN_TEXT: u8 = 8;
/// `\p{M}` (combining marks).
const MARK: u8 = 16;
/// `\p{P}` (punctuation; in ASCII, `$+<=>^`|~` are symbols, not punctuation).
const PUNCT: u8 = 32;

fn classify(c: char) -> u8 {
    let class = if c.is_ascii_alphabetic() {
        LETTER
    } else if c.is_ascii_digit() {
        NUMBER
    } else if c.is_ascii() {
        if matches!(c, ' ' | '\t'..='\r') {
            SPACE
        } else if c.is_ascii_punctuation()
            && !matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '`' | '|' | '~')
        {
            PUNCT
        } else {
            0
        }
    } else {
        let group = match c.general_category_group() {
            GeneralCategoryGroup::Letter => LETTER,
            GeneralCategoryGroup::Number => NUMBER,
            GeneralCategoryGroup::Mark => MARK,
            GeneralCategoryGroup::Punctuation => PUNCT,
            _ => 0,
        };
        // Unicode White_Space, as llama.cpp's `unicode_set_whitespace`.
        let space = matches!(
            c,
            '\u{85}' | '\u{a0}' | '\u{1680}' | '\u{2000}'
                ..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
        );
        group | if space { SPACE } else { 0 }
    };
    class | IN_TEXT
}

/// One character of the text being split: where it starts, what it is, its class.
#[derive(Clone, Copy)]
struct Char {
    at: u32,
    c: char,
    class: u8,
}

/// The text as classified characters, with llama.cpp's bounds-checked accessors.
struct Chars<'a> {
    chars: &'a [Char],
}

impl Chars<'_> {
    fn class(&self, pos: usize) -> u8 {
        self.chars.get(pos).map_or(0, |c| c.class)
    }

    fn is(&self, pos: usize, bits: u8) -> bool {
        self.class(pos) & bits != 0
    }

    fn char(&self, pos: usize) -> Option<char> {
        self.chars.get(pos).map(|c| c.c)
    }

    fn is_cr_lf(&self, pos: usize) -> bool {
        matches!(self.char(pos), Some('\r' | '\n'))
    }

    /// Length of the contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) at `pos`, or 0.
    fn contraction(&self, pos: usize, ignore_case: bool) -> usize {
        if self.char(pos) != Some('\'') {
            return 0;
        }
        let at = |i| {
            let c = self.char(pos + i).unwrap_or('\0');
            if ignore_case {
                c.to_ascii_lowercase()
            } else {
                c
            }
        };
        match (at(1), at(2)) {
            ('s' | 't' | 'm' | 'd', _) => 2,
            ('r', 'e') | ('v', 'e') | ('l', 'l') => 3,
            _ => 0,
        }
    }

    /// Length of the whitespace run at `pos` and the end of its last CR/LF (0 if none).
    fn space_run(&self, pos: usize) -> (usize, usize) {
        let mut n = 0;
        let mut last_cr_lf_end = 0;
        while self.is(pos + n, SPACE) {
            if self.is_cr_lf(pos + n) {
                last_cr_lf_end = pos + n + 1;
            }
            n += 1;
        }
        (n, last_cr_lf_end)
    }
}

/// Reusable buffers for splitting.
#[derive(Default)]
pub struct Scratch {
    chars: Vec<Char>,
    /// Word ends, in characters.
    ends: Vec<usize>,
    tmp: Vec<usize>,
}

impl PreTokenizer {
    /// Splits `text` into words, appending their byte ranges to `words`.
    pub fn split(&self, text: &str, scratch: &mut Scratch, words: &mut Vec<Range<usize>>) {
        scratch.chars.clear();
        scratch
            .chars
            .extend(text.char_indices().map(|(at, c)| Char {
                at: at as u32,
                c,
                class: classify(c),
            }));
        scratch.ends.clear();
        let chars = Chars {
            chars: &scratch.chars,
        };
        let ends = &mut scratch.ends;
        let tmp = &mut scratch.tmp;
        match *self {
            PreTokenizer::Gpt2 => split_gpt2(&chars, ends),
            PreTokenizer::Llama3 { max_digits, marks } => {
                split_llama3(&chars, max_digits, marks, ends)
            }
            PreTokenizer::Default => {
                split_runs(&chars, |c| is_default_punct(c.c), ends);
                refine(&chars, ends, tmp, split_gpt2);
                refine(&chars, ends, tmp, |t, e| {
                    split_runs(t, |c| c.class & NUMBER != 0, e)
                });
                refine(&chars, ends, tmp, split_digit_triples);
            }
            PreTokenizer::Falcon => {
                split_runs(&chars, |c| is_default_punct(c.c) || c.c == '`', ends);
                refine(&chars, ends, tmp, split_gpt2);
                refine(&chars, ends, tmp, split_digit_triples);
            }
            PreTokenizer::DigitsThenGpt2 => {
                split_matches(&chars, |t, pos| t.is(pos, NUMBER) as usize, ends);
                refine(&chars, ends, tmp, split_gpt2);
            }
            PreTokenizer::DeepseekCoder => {
                split_matches(&chars, |t, pos| t.is_cr_lf(pos) as usize, ends);
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(
                        t,
                        |t, pos| space_then_run(t, pos, |c| c.class & LETTER != 0),
                        e,
                    )
                });
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(
                        t,
                        |t, pos| space_then_run(t, pos, |c| c.class & PUNCT != 0),
                        e,
                    )
                });
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(t, |t, pos| run_len(t, pos, is_cjk), e)
                });
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(t, |t, pos| t.is(pos, NUMBER) as usize, e)
                });
            }
            PreTokenizer::DeepseekLlm => {
                // llama.cpp runs the regexes without `\p{..}` with std::wregex on the text, where
                // a non-ASCII space has been replaced by U+000B: it matches `\s`, no range.
                let in_class = |ranges: &'static str| {
                    move |c: &Char| {
                        (c.c.is_ascii() || c.class & SPACE == 0) && in_ranges(ranges, c.c)
                    }
                };
                split_matches(&chars, |t, pos| t.is_cr_lf(pos) as usize, ends);
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(
                        t,
                        |t, pos| space_then_run(t, pos, in_class(DEEPSEEK_LLM_LETTERS)),
                        e,
                    )
                });
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(
                        t,
                        |t, pos| space_then_run(t, pos, in_class(DEEPSEEK_LLM_PUNCT)),
                        e,
                    )
                });
                // `\s+$`: the whitespace that ends a piece.
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(
                        t,
                        |t, pos| {
                            let n = run_len(t, pos, |c| c.class & SPACE != 0);
                            if pos + n == t.chars.len() {
                                n
                            } else {
                                0
                            }
                        },
                        e,
                    )
                });
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(t, |t, pos| run_len(t, pos, is_cjk), e)
                });
                refine(&chars, ends, tmp, |t, e| {
                    split_matches(t, |t, pos| run_len(t, pos, |c| c.class & NUMBER != 0), e)
                });
            }
        }
        let byte_at = |pos: usize| scratch.chars.get(pos).map_or(text.len(), |c| c.at as usize);
        let mut start = 0;
        for &end in &scratch.ends {
            words.push(byte_at(start)..byte_at(end));
            start = end;
        }
    }
}

/// Records word ends, skipping empty words (llama.cpp's `_add_token`).
struct Words<'a> {
    ends: &'a mut Vec<usize>,
    prev: usize,
}

impl Words<'_> {
    fn end_at(&mut self, end: usize) {
        if end > self.prev {
            self.ends.push(end);
        }
        self.prev = end;
    }
}

fn split_gpt2(t: &Chars, ends: &mut Vec<usize>) {
    let len = t.chars.len();
    let mut words = Words { ends, prev: 0 };
    let mut pos = 0;
    while pos < len {
        let contraction = t.contraction(pos, false);
        if contraction > 0 {
            pos += contraction;
            words.end_at(pos);
            continue;
        }
        let space = t.char(pos) == Some(' ');
        // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: a run of one kind after an optional
        // space; the character after the space decides the kind.
        let class = t.class(pos + space as usize);
        let in_run: Option<fn(u8) -> bool> = if class & LETTER != 0 {
            Some(|c| c & LETTER != 0)
        } else if class & NUMBER != 0 {
            Some(|c| c & NUMBER != 0)
        } else if is_other(class) {
            Some(is_other)
        } else {
            None
        };
        if let Some(in_run) = in_run {
            pos += space as usize;
            while in_run(t.class(pos)) {
                pos += 1;
            }
            words.end_at(pos);
            continue;
        }
        pos = whitespace(t, pos, &mut words);
    }
}

/// `[^\s\p{L}\p{N}]`: punctuation, symbols and anything unassigned.
fn is_other(class: u8) -> bool {
    class & (SPACE | LETTER | NUMBER) == 0 && class & IN_TEXT != 0
}

fn split_llama3(t: &Chars, max_digits: usize, marks: bool, ends: &mut Vec<usize>) {
    let len = t.chars.len();
    let (word, mark) = if marks {
        (LETTER | MARK, MARK)
    } else {
        (LETTER, 0)
    };
    let other = |class: u8| is_other(class) && class & mark == 0;
    let mut words = Words { ends, prev: 0 };
    let mut pos = 0;
    while pos < len {
        let contraction = t.contraction(pos, true);
        if contraction > 0 {
            pos += contraction;
            words.end_at(pos);
            continue;
        }
        let class = t.class(pos);
        // `[^\r\n\p{L}\p{N}]?\p{L}+` (`[\p{L}\p{M}]+` with marks)
        if !t.is_cr_lf(pos) && class & NUMBER == 0 && (class & word != 0 || t.is(pos + 1, word)) {
            pos += 1;
            while t.is(pos, word) {
                pos += 1;
            }
            words.end_at(pos);
            continue;
        }
        // `\p{N}{1,max_digits}`
        if class & NUMBER != 0 {
            let mut start = pos;
            while t.is(pos, NUMBER) {
                pos += 1;
                if pos - start >= max_digits {
                    words.end_at(pos);
                    start = pos;
                }
            }
            words.end_at(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let space = t.char(pos) == Some(' ');
        let next = if space { t.class(pos + 1) } else { class };
        if next & (SPACE | LETTER | NUMBER | mark) == 0 {
            pos += space as usize;
            while other(t.class(pos)) {
                pos += 1;
            }
            while t.is_cr_lf(pos) {
                pos += 1;
            }
            words.end_at(pos);
            continue;
        }
        // `\s*[\r\n]+`
        let (_, last_cr_lf_end) = t.space_run(pos);
        if last_cr_lf_end > 0 {
            pos = last_cr_lf_end;
            words.end_at(pos);
            continue;
        }
        pos = whitespace(t, pos, &mut words);
    }
}

/// Splits each word of `ends` again with `split`, which sees the word alone (its end is the
/// text's end, as for llama.cpp's regexes run on each previous piece).
fn refine(
    t: &Chars,
    ends: &mut Vec<usize>,
    tmp: &mut Vec<usize>,
    split: impl Fn(&Chars, &mut Vec<usize>),
) {
    std::mem::swap(ends, tmp);
    ends.clear();
    let mut start = 0;
    for &end in tmp.iter() {
        let word = Chars {
            chars: &t.chars[start..end],
        };
        let first = ends.len();
        split(&word, ends);
        for e in &mut ends[first..] {
            *e += start;
        }
        start = end;
    }
}

/// Maximal runs of characters that match `in_run` and of characters that do not: a regex
/// `X+`, its matches and the gaps between them.
fn split_runs(t: &Chars, in_run: impl Fn(&Char) -> bool, ends: &mut Vec<usize>) {
    let mut words = Words { ends, prev: 0 };
    let mut pos = 0;
    while pos < t.chars.len() {
        let matching = in_run(&t.chars[pos]);
        while pos < t.chars.len() && in_run(&t.chars[pos]) == matching {
            pos += 1;
        }
        words.end_at(pos);
    }
}

/// The leftmost matches of a regex and the gaps between them: `match_len(t, pos)` is the length
/// of the (greedy) match starting at `pos`, 0 for none.
fn split_matches(t: &Chars, match_len: impl Fn(&Chars, usize) -> usize, ends: &mut Vec<usize>) {
    let mut words = Words { ends, prev: 0 };
    let mut pos = 0;
    while pos < t.chars.len() {
        match match_len(t, pos) {
            0 => pos += 1,
            n => {
                words.end_at(pos);
                pos += n;
                words.end_at(pos);
            }
        }
    }
    words.end_at(t.chars.len());
}

/// `\s?X+` at `pos`, where `in_x` is the class X: its length, or 0.
fn space_then_run(t: &Chars, pos: usize, in_x: impl Fn(&Char) -> bool) -> usize {
    let x_at = |p: usize| t.chars.get(p).is_some_and(&in_x);
    let start = if t.is(pos, SPACE) && !x_at(pos) && x_at(pos + 1) {
        pos + 1
    } else {
        pos
    };
    match run_len(t, start, &in_x) {
        0 => 0,
        n => start - pos + n,
    }
}

/// Whether `c` is in a regex class body of ranges `a-b` and single characters.
fn in_ranges(ranges: &str, c: char) -> bool {
    let mut it = ranges.chars().peekable();
    while let Some(lo) = it.next() {
        let hi = if it.peek() == Some(&'-') {
            it.next();
            it.next().unwrap_or(lo)
        } else {
            lo
        };
        if (lo..=hi).contains(&c) {
            return true;
        }
    }
    false
}

/// Length of the run of characters matching `f` at `pos`.
fn run_len(t: &Chars, pos: usize, f: impl Fn(&Char) -> bool) -> usize {
    if pos >= t.chars.len() {
        return 0;
    }
    t.chars[pos..].iter().take_while(|c| f(c)).count()
}

/// `[一-龥ࠀ-一가-퟿]`: the ranges DeepSeek's regexes give for CJK ideographs and Hangul.
fn is_cjk(c: &Char) -> bool {
    // U+4E00..U+9FA5 and U+0800..U+4E00 overlap: one range.
    matches!(c.c, '\u{0800}'..='\u{9fa5}' | '\u{ac00}'..='\u{d7ff}')
}

/// `[0-9][0-9][0-9]`: leftmost triples of ASCII digits, and the gaps between them.
fn split_digit_triples(t: &Chars, ends: &mut Vec<usize>) {
    let digit = |pos| t.char(pos).is_some_and(|c| c.is_ascii_digit());
    let mut words = Words { ends, prev: 0 };
    let mut pos = 0;
    while pos < t.chars.len() {
        if digit(pos) && digit(pos + 1) && digit(pos + 2) {
            words.end_at(pos);
            pos += 3;
            words.end_at(pos);
        } else {
            pos += 1;
        }
    }
    words.end_at(t.chars.len());
}

/// `[\p{P}\$\+<=>\^~\|]`: punctuation, plus the ASCII symbols the default regex lists.
fn is_default_punct(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_punctuation() && c != '`'
    } else {
        c.general_category_group() == GeneralCategoryGroup::Punctuation
    }
}

/// `\s+(?!\S)|\s+`, else one unmatched character; returns the new position.
fn whitespace(t: &Chars, mut pos: usize, words: &mut Words) -> usize {
    let (n, _) = t.space_run(pos);
    if n > 1 && pos + n < t.chars.len() {
        // Leave the last space to lead the next word.
        pos += n - 1;
    } else if n > 0 {
        pos += n;
    } else {
        pos += 1;
    }
    words.end_at(pos);
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut ranges = Vec::new();
        pre.split(text, &mut Scratch::default(), &mut ranges);
        ranges.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn llama3_splits_like_its_regex() {
        let pre = PreTokenizer::Llama3 {
            max_digits: 3,
            marks: false,
        };
        assert_eq!(
            words(pre, "Hello, y'all! I'M 12345 ok\n\n  x  "),
            [
                "Hello", ",", " y", "'all", "!", " I", "'M", " ", "123", "45", " ok", "\n\n", " ",
                " x", "  "
            ]
        );
    }

    #[test]
    fn qwen2_takes_digits_one_at_a_time() {
        let pre = PreTokenizer::Llama3 {
            max_digits: 1,
            marks: false,
        };
        assert_eq!(words(pre, "a 123"), ["a", " ", "1", "2", "3"]);
    }

    #[test]
    fn gpt2_splits_like_its_regex() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello world's 42  !!\n x"),
            ["Hello", " world", "'s", " 42", " ", " !!", "\n", " x"]
        );
    }

    #[test]
    fn default_applies_its_four_regexes_in_turn() {
        assert_eq!(
            words(PreTokenizer::Default, "a+b=12345 x!! 7"),
            ["a", "+", "b", "=", "123", "45", " x", "!!", " ", "7"]
        );
    }

    #[test]
    fn starcoder_takes_digits_alone_then_gpt2() {
        assert_eq!(
            words(PreTokenizer::DigitsThenGpt2, "a 123 b"),
            ["a", " ", "1", "2", "3", " b"]
        );
    }

    #[test]
    fn falcon_splits_punctuation_with_backticks_then_gpt2_then_triples() {
        assert_eq!(
            words(PreTokenizer::Falcon, "x+`y` 1234"),
            ["x", "+`", "y", "`", " ", "123", "4"]
        );
    }

    #[test]
    fn qwen35_joins_combining_marks_to_letters() {
        let text = "e\u{301}x";
        let marks = PreTokenizer::Llama3 {
            max_digits: 1,
            marks: true,
        };
        let qwen2 = PreTokenizer::Llama3 {
            max_digits: 1,
            marks: false,
        };
        assert_eq!(words(marks, text), [text]);
        assert_eq!(words(qwen2, text), ["e", "\u{301}x"]);
    }

    #[test]
    fn deepseek_llm_applies_its_six_regexes_in_turn() {
        assert_eq!(
            words(PreTokenizer::DeepseekLlm, "Hello, 世界 123  "),
            ["Hello", ",", " ", "世界", " ", "123", "  "]
        );
        assert!(in_ranges(DEEPSEEK_LLM_LETTERS, 'é') && !in_ranges(DEEPSEEK_LLM_LETTERS, '1'));
    }

    #[test]
    fn unicode_classes_follow_general_categories() {
        assert_eq!(classify('é') & LETTER, LETTER);
        assert_eq!(classify('٣') & NUMBER, NUMBER);
        assert_eq!(classify('\u{3000}') & SPACE, SPACE);
        assert_eq!(classify('🦀') & (LETTER | NUMBER | SPACE), 0);
    }
}
