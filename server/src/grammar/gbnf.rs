//! GBNF, llama.cpp's grammar syntax (its `grammars/README.md`), read and rewritten in
//! llguidance's Lark dialect. The meaning is kept: every terminal of GBNF is a character, so
//! each literal becomes a sequence of one-character terminals and each class a one-character
//! regex; the Earley parser does the rest, as llama.cpp's stack machine does.
//!
//! Supported: `name ::= ...` rules, `|`, `( )`, `"literals"` and `[classes]` (with `^` and
//! ranges) and their escapes (`\x..`, `\u....`, `\U........`, `\t \r \n \\ \" \[ \] \-`), `.`,
//! `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `# comments`. Not supported (refused by name): token
//! references `<...>`.
//!
//! The text comes from clients, so the reader is built for hostile input: it runs in time
//! linear in the text (line numbers are counted only when an error is reported), and nesting
//! (parentheses, and repetition operators piled on one item) is refused beyond [`MAX_DEPTH`]
//! levels instead of recursing until the thread's stack overflows.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GBNF grammar, line {line}: {message}")]
pub struct GbnfError {
    pub line: usize,
    pub message: String,
}

/// How deeply expressions may nest: parentheses, and each `*`, `+`, `?` or `{m,n}` applied to
/// an item, count one level each. Each level is one level of the Lark text, which has at most
/// two more (the rule, a literal's group), and llguidance's Lark reader refuses 30: so deeper
/// grammars are refused here, with this reader's message. Hand-written grammars and
/// llama.cpp's JSON-schema converter stay within a dozen. The limit also keeps this reader's
/// recursion far from the end of a thread's stack (30000 nested parentheses overflowed it).
pub const MAX_DEPTH: usize = 25;

/// The Lark text of GBNF grammar `src`, whose start rule is `root`.
pub fn to_lark(src: &str) -> Result<String, GbnfError> {
    let mut p = Parser {
        src: src.chars().collect(),
        pos: 0,
        depth: 0,
        referenced: Vec::new(),
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    // Rule name -> the position where it is defined.
    let mut defined: HashMap<String, usize> = HashMap::new();
    p.skip(true);
    while !p.at_end() {
        let start = p.pos;
        let name = p.name().ok_or_else(|| p.error("expected a rule name"))?;
        p.skip(false);
        if !p.eat_str("::=") {
            return Err(p.error(&format!("expected `::=` after rule name `{name}`")));
        }
        p.skip(true);
        let body = p.alternates(false)?;
        if defined.insert(name.clone(), start).is_some() {
            return Err(GbnfError {
                line: p.line_at(start),
                message: format!("rule `{name}` is defined twice"),
            });
        }
        rules.push((name, body));
        p.skip(false);
        if !p.at_end() && !p.eat('\n') {
            return Err(p.error("expected the end of the rule (a new line)"));
        }
        p.skip(true);
    }
    if !defined.contains_key("root") {
        return Err(GbnfError {
            line: 1,
            message: "the grammar has no `root` rule (the rule output starts from)".into(),
        });
    }
    if let Some((name, at)) = p.referenced.iter().find(|(n, _)| !defined.contains_key(n)) {
        return Err(GbnfError {
            line: p.line_at(*at),
            message: format!("rule `{name}` is used but never defined"),
        });
    }
    let mut out = format!("start: {}\n", rule_name("root"));
    for (name, body) in &rules {
        let _ = writeln!(out, "{}: {body}", rule_name(name));
    }
    Ok(out)
}

/// A Lark rule name for a GBNF one: Lark's are lowercase `[a-z0-9_]`, so every other character
/// is written as `_` and its hex code, which keeps distinct names distinct.
fn rule_name(gbnf: &str) -> String {
    let mut out = String::from("g_");
    for c in gbnf.chars() {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else {
            let _ = write!(out, "_{:x}", c as u32);
        }
    }
    out
}

struct Parser {
    src: Vec<char>,
    pos: usize,
    /// Nesting of the expression being read (see [`MAX_DEPTH`]).
    depth: usize,
    /// Rules referenced, with the position of each use.
    referenced: Vec<(String, usize)>,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn peek(&self) -> Option<char> {
        self.src.get(self.pos).copied()
    }

    /// The line of position `pos`, counted from the start: only for error messages, so that
    /// reading stays linear in the text.
    fn line_at(&self, pos: usize) -> usize {
        1 + self.src[..pos.min(self.src.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count()
    }

    /// One level deeper, or the error naming [`MAX_DEPTH`].
    fn descend(&mut self) -> Result<(), GbnfError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(&format!(
                "the grammar nests deeper than {MAX_DEPTH} levels (parentheses and repetition operators); give inner parts names of their own as rules"
            )));
        }
        Ok(())
    }

    fn error(&self, message: &str) -> GbnfError {
        GbnfError {
            line: self.line_at(self.pos),
            message: match self.peek() {
                Some(c) => format!("{message}, found {c:?}"),
                None => format!("{message}, found the end of the grammar"),
            },
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_str(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        if self.src.len() >= self.pos + n
            && self.src[self.pos..self.pos + n]
                .iter()
                .copied()
                .eq(s.chars())
        {
            self.pos += n;
            true
        } else {
            false
        }
    }

    /// Skips blanks and comments, and new lines too when `newlines`.
    fn skip(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' => self.pos += 1,
                '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.src[start..self.pos].iter().collect())
    }

    /// `seq | seq | ...`; inside parentheses (`nested`) new lines are blanks.
    fn alternates(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.eat('|') {
            self.skip(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut items: Vec<String> = Vec::new();
        loop {
            self.skip(nested);
            let Some(c) = self.peek() else { break };
            let item = match c {
                '"' => {
                    self.pos += 1;
                    let mut chars = Vec::new();
                    while !self.eat('"') {
                        if self.at_end() || self.peek() == Some('\n') {
                            return Err(self.error("unterminated string literal"));
                        }
                        chars.push(self.char_in_literal()?);
                    }
                    literal(&chars)
                }
                '[' => {
                    self.pos += 1;
                    let negated = self.eat('^');
                    let mut ranges = Vec::new();
                    while !self.eat(']') {
                        if self.at_end() {
                            return Err(self.error("unterminated character class"));
                        }
                        let lo = self.char_in_literal()?;
                        let hi = if self.peek() == Some('-') && self.src.get(self.pos + 1) != Some(&']') {
                            self.pos += 1;
                            self.char_in_literal()?
                        } else {
                            lo
                        };
                        if hi < lo {
                            return Err(self.error(&format!("range {lo:?}-{hi:?} is backwards")));
                        }
                        ranges.push((lo, hi));
                    }
                    class(negated, &ranges)
                }
                '(' => {
                    self.descend()?;
                    self.pos += 1;
                    self.skip(true);
                    let inner = self.alternates(true)?;
                    self.skip(true);
                    if !self.eat(')') {
                        return Err(self.error("expected `)`"));
                    }
                    self.depth -= 1;
                    format!("({inner})")
                }
                '.' => {
                    self.pos += 1;
                    "/(?s:.)/".to_string()
                }
                '<' => {
                    return Err(self.error(
                        "token references `<...>` are not supported; write the token's text as a string literal",
                    ))
                }
                c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    let save = self.pos;
                    let name = self.name().unwrap_or_default();
                    // A name followed by `::=` starts the next rule (rules may follow each
                    // other without a blank line only when the sequence ended at a new line,
                    // which the caller handles); here it is an error.
                    let after = self.pos;
                    self.skip(false);
                    if self.eat_str("::=") {
                        self.pos = save;
                        return Err(self.error("a new rule must start on its own line"));
                    }
                    self.pos = after;
                    self.referenced.push((name.clone(), save));
                    rule_name(&name)
                }
                _ => break,
            };
            items.push(self.postfix(item)?);
        }
        Ok(if items.is_empty() {
            "\"\"".to_string()
        } else {
            items.join(" ")
        })
    }

    /// `*`, `+`, `?` and `{m}`, `{m,}`, `{m,n}` after an item. Each wraps the item once more,
    /// so each counts as a level of nesting (`"a"****...` would otherwise copy an ever longer
    /// item once per operator: quadratic time, and a Lark text nested as deep).
    fn postfix(&mut self, item: String) -> Result<String, GbnfError> {
        let depth = self.depth;
        let item = self.postfix_ops(item);
        self.depth = depth;
        item
    }

    fn postfix_ops(&mut self, mut item: String) -> Result<String, GbnfError> {
        loop {
            if matches!(self.peek(), Some('*' | '+' | '?' | '{')) {
                self.descend()?;
            }
            match self.peek() {
                Some(op @ ('*' | '+' | '?')) => {
                    self.pos += 1;
                    item = format!("({item}){op}");
                }
                Some('{') => {
                    self.pos += 1;
                    self.skip(false);
                    let min = self.number()?;
                    self.skip(false);
                    let max = if self.eat(',') {
                        self.skip(false);
                        if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.number()?)
                        } else {
                            None
                        }
                    } else {
                        Some(min)
                    };
                    self.skip(false);
                    if !self.eat('}') {
                        return Err(self.error("expected `}` closing a repetition"));
                    }
                    item = match max {
                        Some(max) if max < min => {
                            return Err(
                                self.error(&format!("repetition {{{min},{max}}} is backwards"))
                            )
                        }
                        Some(max) => format!("({item}){{{min},{max}}}"),
                        None => format!("({item}){{{min},}}"),
                    };
                }
                _ => return Ok(item),
            }
        }
    }

    fn number(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits: String = self.src[start..self.pos].iter().collect();
        digits
            .parse()
            .map_err(|_| self.error("expected a number in a repetition"))
    }

    /// One character of a literal or class, escapes read.
    fn char_in_literal(&mut self) -> Result<char, GbnfError> {
        let Some(c) = self.peek() else {
            return Err(self.error("unexpected end"));
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return Err(self.error("unfinished escape"));
        };
        self.pos += 1;
        let hex = |p: &mut Parser, n: usize| -> Result<char, GbnfError> {
            let end = p.pos + n;
            let digits: String = p.src.get(p.pos..end).unwrap_or(&[]).iter().collect();
            let code = u32::from_str_radix(&digits, 16)
                .ok()
                .filter(|_| digits.len() == n)
                .and_then(char::from_u32)
                .ok_or_else(|| p.error(&format!("expected {n} hex digits of a character code")))?;
            p.pos = end;
            Ok(code)
        };
        match e {
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            'n' => Ok('\n'),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            other => {
                self.pos -= 1;
                Err(self.error(&format!("unknown escape `\\{other}`")))
            }
        }
    }
}

/// A literal as one-character terminals.
fn literal(chars: &[char]) -> String {
    if chars.is_empty() {
        return "\"\"".into();
    }
    let parts: Vec<String> = chars
        .iter()
        .map(|c| serde_json::Value::String(c.to_string()).to_string())
        .collect();
    if parts.len() == 1 {
        parts.into_iter().next().unwrap_or_default()
    } else {
        format!("({})", parts.join(" "))
    }
}

/// A class as a one-character regex; every character written as `\x{..}` so that nothing in
/// it is read as regex syntax.
fn class(negated: bool, ranges: &[(char, char)]) -> String {
    let set: BTreeSet<(char, char)> = ranges.iter().copied().collect();
    let mut out = String::from("/[");
    if negated {
        out.push('^');
    }
    for (lo, hi) in set {
        let _ = write!(out, "\\x{{{:x}}}", lo as u32);
        if hi != lo {
            let _ = write!(out, "-\\x{{{:x}}}", hi as u32);
        }
    }
    out.push_str("]/");
    if ranges.is_empty() {
        // `[]` matches nothing and `[^]` anything, as in llama.cpp.
        return if negated {
            "/(?s:.)/".into()
        } else {
            "/[^\\x{0}-\\x{10ffff}]/".into()
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// 30000 nested parentheses overflowed the request thread's stack and aborted the process
    /// (issue 42); now they are an error that names the limit.
    #[test]
    fn deep_nesting_is_refused_not_recursed() {
        let n = 30_000;
        let src = format!("root ::= {}\"a\"{}\n", "(".repeat(n), ")".repeat(n));
        let e = to_lark(&src).unwrap_err();
        assert!(
            e.message
                .contains(&format!("deeper than {MAX_DEPTH} levels")),
            "{e}"
        );
        assert_eq!(e.line, 1);
        // Just within the limit is fine.
        let src = format!(
            "root ::= {}\"a\"{}\n",
            "(".repeat(MAX_DEPTH),
            ")".repeat(MAX_DEPTH)
        );
        to_lark(&src).unwrap();
        let src = format!(
            "root ::= {}\"a\"{}\n",
            "(".repeat(MAX_DEPTH + 1),
            ")".repeat(MAX_DEPTH + 1)
        );
        assert!(to_lark(&src).is_err());
    }

    /// Repetition operators piled on one item nest too: each wraps the item once more.
    #[test]
    fn piled_repetitions_count_as_nesting() {
        let src = format!("root ::= \"a\"{}\n", "*".repeat(30_000));
        let e = to_lark(&src).unwrap_err();
        assert!(e.message.contains("deeper than"), "{e}");
        let src = format!("root ::= \"a\"{}\n", "?{1,2}".repeat(MAX_DEPTH / 2));
        to_lark(&src).unwrap();
        // Operators on items side by side do not add up.
        let src = format!("root ::= {}\n", "\"a\"* ".repeat(10 * MAX_DEPTH));
        to_lark(&src).unwrap();
        // Nor do parentheses closed before the next ones open.
        let src = format!("root ::= {}\n", "(\"a\")+ ".repeat(10 * MAX_DEPTH));
        to_lark(&src).unwrap();
    }

    /// Reading is linear: 900k rule references (1.8 MB) took over 120 s when every reference
    /// counted the lines before it.
    #[test]
    fn a_two_megabyte_grammar_of_references_reads_in_linear_time() {
        let refs = 1_000_000;
        let src = format!("root ::= {}\nx ::= \"a\"\n", "x ".repeat(refs));
        assert!(src.len() >= 2_000_000);
        let started = Instant::now();
        let lark = to_lark(&src).unwrap();
        let took = started.elapsed();
        assert!(lark.contains("g_x: \"a\""));
        // Well under this in a release build (~0.2 s); the quadratic reader never finished.
        assert!(took < Duration::from_secs(3), "{took:?}");
        // The same many references, each on its own line, still report the right line.
        let src = format!(
            "root ::= ( x{}\n y )\nx ::= \"a\"\n",
            "\n x".repeat(refs / 2)
        );
        let started = Instant::now();
        let e = to_lark(&src).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(e.line, refs / 2 + 2, "{e}");
        assert!(e.message.contains("`y` is used but never defined"), "{e}");
    }

    #[test]
    fn errors_name_the_line_of_their_cause() {
        let e = to_lark("root ::= a\n\na ::= \"x\"\n# c\na ::= \"y\"\n").unwrap_err();
        assert_eq!(
            (e.line, e.message.as_str()),
            (5, "rule `a` is defined twice")
        );
        let e = to_lark("root ::= a\n\na ::= b\n").unwrap_err();
        assert_eq!(e.line, 3);
        let e = to_lark("root ::= \"a\"\nb ::= (\"x\"\n").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
    }
}
