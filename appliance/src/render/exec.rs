//! systemd command lines (`ExecStart=`) from argument lists. Every unit's commands are lists
//! of words, as the NixOS module keeps them (`utils.escapeSystemdExecArgs`), and each word is
//! written so that systemd splits the line back into exactly those words and expands nothing in
//! them: no `%` specifier, no `$` variable, no lone `;`.

/// The command line of `words`, the program first.
pub fn command_line<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| word(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One word: bare when systemd reads it as it is (a path, a flag, a number: the line stays
/// readable), else double-quoted with C-style escapes. `%` and `$` are doubled either way, as
/// systemd reads `%%` and `$$` inside quotes too.
fn word(w: &str) -> String {
    let bare = !w.is_empty()
        && w != ";"
        && !w.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\' | '%' | '$')
        });
    if bare {
        return w.to_owned();
    }
    let mut out = String::from('"');
    for c in w.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::command_line;

    #[test]
    fn plain_words_stay_bare_and_the_rest_is_quoted() {
        assert_eq!(
            command_line(&["/usr/bin/free", "--mebi"]),
            "/usr/bin/free --mebi"
        );
        assert_eq!(
            command_line(&[
                "curl",
                "-H",
                "Authorization: Bearer Oracle",
                "http://[::1]:80/a_b"
            ]),
            "curl -H \"Authorization: Bearer Oracle\" http://[::1]:80/a_b"
        );
        assert_eq!(
            command_line(&[
                "x",
                "",
                ";",
                "a;b",
                "100%",
                "$HOME",
                "say \"hi\"",
                "a\\b",
                "it's"
            ]),
            "x \"\" \";\" a;b \"100%%\" \"$$HOME\" \"say \\\"hi\\\"\" \"a\\\\b\" \"it's\""
        );
        assert_eq!(command_line(&["x", "a\nb\u{1}"]), "x \"a\\nb\\u0001\"");
    }
}
