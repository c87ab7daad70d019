//! Helpers shared by the test files.

/// Splits a systemd command line (`ExecStart=`'s value) into its words as systemd does: double
/// and single quotes, the C-style escapes the renderer writes (`\\`, `\"`, `\n`, `\t`,
/// `\uXXXX`), and `%%` and `$$` for a literal `%` and `$`. `%d` (the credentials directory) is
/// kept as `%d`, the one specifier the renderer writes on purpose; any other lone `%` or `$`,
/// which systemd would expand, panics: the renderer must never leave one.
pub fn exec_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (c, quote) {
            ('"' | '\'', None) => {
                quote = Some(c);
                in_word = true;
            }
            (q, Some(open)) if q == open => quote = None,
            (' ', None) => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                }
                in_word = false;
            }
            ('\\', _) => {
                in_word = true;
                match chars.next() {
                    Some('n') => word.push('\n'),
                    Some('t') => word.push('\t'),
                    Some('u') => {
                        let hex: String = chars.by_ref().take(4).collect();
                        let code = u32::from_str_radix(&hex, 16).expect("four hex digits");
                        word.push(char::from_u32(code).expect("a character"));
                    }
                    Some(other) => word.push(other),
                    None => panic!("a line ending in a backslash: {line}"),
                }
            }
            ('%', _) if chars.clone().next() == Some('d') => {
                chars.next();
                word.push_str("%d");
                in_word = true;
            }
            ('%' | '$', _) => {
                assert_eq!(
                    chars.next(),
                    Some(c),
                    "a lone `{c}` systemd would expand in: {line}"
                );
                word.push(c);
                in_word = true;
            }
            (c, _) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(quote.is_none(), "an unclosed quote in: {line}");
    if in_word {
        words.push(word);
    }
    words
}
