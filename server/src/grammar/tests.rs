use super::*;
use crate::gguf::Gguf;

fn tokenizer() -> Tokenizer {
    let path = test_support::testdata("vocab/ggml-vocab-llama-spm.gguf");
    Tokenizer::from_metadata(&Gguf::open(&path).unwrap().metadata).unwrap()
}

/// Generates under `spec`, choosing at each step the allowed token `pick` prefers among the
/// allowed ones; returns the text and whether the grammar ended it.
fn walk(
    tok: &Tokenizer,
    spec: &Spec,
    steps: usize,
    pick: impl Fn(&[u32], usize) -> u32,
) -> (String, bool) {
    let mut c = Constraint::new(tok, spec).unwrap();
    let mut out = Vec::new();
    for step in 0..steps {
        let mask = c.mask().unwrap();
        let mut allowed = Vec::new();
        mask.iter_set_entries(|t| allowed.push(t as u32));
        assert!(!allowed.is_empty());
        let t = pick(&allowed, step);
        if tok.is_eog(t) {
            return (tok.decode(&out, false), true);
        }
        c.accept(t).unwrap();
        out.push(t);
        if c.is_done() {
            return (tok.decode(&out, false), true);
        }
    }
    (tok.decode(&out, false), false)
}

#[test]
fn gbnf_alternatives_are_all_that_can_come_out() {
    let tok = tokenizer();
    let spec =
        Spec::Gbnf("root ::= answer \"!\"\nanswer ::= \"yes\" | \"no\" # a comment\n".into());
    for seed in 0..6usize {
        // A different choice each time: the allowed token at a seed-dependent place.
        let (text, ended) = walk(&tok, &spec, 20, |a, step| {
            a[(seed * 7 + step * 13) % a.len()]
        });
        assert!(ended, "{text:?}");
        assert!(text == "yes!" || text == "no!", "{text:?}");
    }
}

#[test]
fn json_schema_output_is_valid() {
    let tok = tokenizer();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "c": {"enum": ["red", "green"]},
            "ok": {"type": "boolean"}
        },
        "required": ["n", "c", "ok"],
        "additionalProperties": false
    });
    let spec = Spec::JsonSchema(schema);
    for seed in 0..4usize {
        let (text, ended) = walk(&tok, &spec, 60, |a, step| {
            a[(seed * 31 + step * 17) % a.len()]
        });
        assert!(ended, "{text:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            v["n"].as_i64().is_some_and(|n| (0..=99).contains(&n)),
            "{text}"
        );
        assert!(matches!(v["c"].as_str(), Some("red" | "green")), "{text}");
        assert!(v["ok"].is_boolean(), "{text}");
    }
}

#[test]
fn unsupported_keywords_are_named() {
    let tok = tokenizer();
    let spec = Spec::JsonSchema(serde_json::json!({"type": "array", "uniqueItems": true}));
    let e = Constraint::new(&tok, &spec).unwrap_err().to_string();
    assert!(e.contains("uniqueItems"), "{e}");
    assert!(e.contains("cannot enforce"), "{e}");
}

#[test]
fn gbnf_errors_name_line_and_cause() {
    for (src, want) in [
        ("root ::= foo\n", "`foo` is used but never defined"),
        ("expr ::= \"a\"\n", "no `root` rule"),
        ("root ::= \"a\n", "unterminated string"),
        ("root ::= [ab", "unterminated character class"),
        ("root ::= <tok>\n", "token references"),
        ("root ::= \"a\"{3,1}\n", "backwards"),
        ("\nroot := \"a\"\n", "line 2"),
    ] {
        let e = gbnf::to_lark(src).unwrap_err().to_string();
        assert!(e.contains(want), "{src:?}: {e}");
    }
}

#[test]
fn gbnf_repetitions_classes_and_escapes() {
    let tok = tokenizer();
    let spec = Spec::Gbnf(
        "root ::= [A-Z] digit{2,3} (\"-\" [^\\x00-\\x60]?)+ \"\\n\"\ndigit ::= [0-9]\n".into(),
    );
    let re = |s: &str| {
        let b = s.as_bytes();
        b[0].is_ascii_uppercase()
            && s.ends_with('\n')
            && b[1].is_ascii_digit()
            && b[2].is_ascii_digit()
    };
    for seed in 0..4usize {
        let (text, ended) = walk(&tok, &spec, 40, |a, step| {
            // Prefer ending once a few tokens are out, so that `+` terminates.
            if step > 6 {
                if let Some(&t) = a
                    .iter()
                    .find(|&&t| tok.piece(t, false) == b"\n" || tok.is_eog(t))
                {
                    return t;
                }
            }
            a[(seed * 5 + step * 11) % a.len()]
        });
        assert!(ended && re(&text), "{text:?}");
    }
}

#[test]
fn rule_names_stay_distinct() {
    let lark = gbnf::to_lark("root ::= a-b A\na-b ::= \"x\"\nA ::= \"y\"\n").unwrap();
    assert!(lark.contains("g_a_2db: \"x\""), "{lark}");
    assert!(lark.contains("g__41: \"y\""), "{lark}");
}

/// A grammar nested as deeply as the GBNF reader allows still compiles in llguidance (whose Lark
/// reader has a nesting limit of its own), and one level more is refused by the GBNF reader
/// with its own message.
#[test]
fn gbnf_at_the_depth_limit_compiles() {
    let tok = tokenizer();
    let d = gbnf::MAX_DEPTH;
    // The deepest item is a repeated multi-character literal: the Lark text's deepest point.
    let src = format!(
        "root ::= {}\"ab\"*{}\n",
        "(".repeat(d - 1),
        ")".repeat(d - 1)
    );
    Constraint::new(&tok, &Spec::Gbnf(src)).unwrap();
    let src = format!("root ::= {}\"ab\"*{}\n", "(".repeat(d), ")".repeat(d));
    let e = Constraint::new(&tok, &Spec::Gbnf(src)).unwrap_err();
    assert!(e.0.contains(&format!("deeper than {d} levels")), "{e}");
}

/// A JSON schema nested as deeply as a request body can carry (serde_json reads 128 levels)
/// compiles or is refused, without overflowing the stack of a thread the size of tokio's
/// blocking threads.
#[test]
fn deeply_nested_json_schemas_do_not_overflow_the_stack() {
    let tok = tokenizer();
    let mut schema = serde_json::json!({"type": "integer"});
    // 63 levels of {"properties": {"a": ...}}: 127 levels of JSON, the most a schema can have.
    for _ in 0..63 {
        schema =
            serde_json::json!({"type": "object", "properties": {"a": schema}, "required": ["a"]});
    }
    let spec = Spec::JsonSchema(schema);
    let result = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || Constraint::new(&tok, &spec).map(|_| ()))
        .unwrap()
        .join()
        .expect("the compile must not overflow a 2 MiB stack");
    if let Err(e) = result {
        assert!(e.0.contains("grammar"), "{e}");
    }
}

/// A picker for [`walk`]: the first of `texts` that is allowed (the list in order of
/// preference), else the first token allowed.
fn prefer<'a>(tok: &'a Tokenizer, texts: &'a [&'a str]) -> impl Fn(&[u32], usize) -> u32 + 'a {
    move |allowed, _| {
        texts
            .iter()
            .find_map(|want| {
                allowed
                    .iter()
                    .copied()
                    .find(|&t| tok.piece(t, false) == want.as_bytes())
            })
            .unwrap_or(allowed[0])
    }
}

/// An object schema of one required property.
fn one_field(name: &str, schema: serde_json::Value) -> Spec {
    Spec::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {name: schema},
        "required": [name],
        "additionalProperties": false
    }))
}

/// A model that only wants to write digits (issue 44's base model at temperature 0.7) still
/// closes the object: an integer gets at most 16 digits, as llama.cpp's schema grammar allows.
#[test]
fn an_integer_cannot_take_a_17th_digit() {
    let tok = tokenizer();
    let spec = one_field("population", serde_json::json!({"type": "integer"}));
    let (text, ended) = walk(&tok, &spec, 60, prefer(&tok, &["7", "}"]));
    assert!(ended, "{text:?}");
    assert_eq!(text, format!("{{\"population\": {}}}", "7".repeat(16)));
}

#[test]
fn a_numbers_fraction_and_exponent_take_at_most_16_digits() {
    let tok = tokenizer();
    let spec = one_field("x", serde_json::json!({"type": "number"}));
    let sevens = "7".repeat(16);
    let (text, ended) = walk(&tok, &spec, 90, prefer(&tok, &["7", ".", "e", "}"]));
    assert!(ended, "{text:?}");
    assert_eq!(text, format!("{{\"x\": {sevens}.{sevens}e{sevens}}}"));
    // Without an exponent it is a JSON number as any parser reads it.
    let (text, ended) = walk(&tok, &spec, 60, prefer(&tok, &["7", ".", "}"]));
    assert!(ended, "{text:?}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["x"].is_f64(), "{text}");
}

/// The bound is on digits outside strings only: a string of digits is text.
#[test]
fn digits_in_strings_are_not_bounded() {
    let tok = tokenizer();
    let spec = one_field("s", serde_json::json!({"type": "string", "maxLength": 20}));
    let (text, ended) = walk(&tok, &spec, 60, prefer(&tok, &["7", "\""]));
    assert!(ended, "{text:?}");
    assert_eq!(text, format!("{{\"s\": \"{}\"}}", "7".repeat(20)));
}

#[test]
fn leading_zeros_are_refused() {
    let tok = tokenizer();
    for ty in ["integer", "number"] {
        let spec = one_field("n", serde_json::json!({"type": ty}));
        let (text, ended) = walk(&tok, &spec, 30, prefer(&tok, &["0", "-", "}"]));
        assert!(ended, "{text:?}");
        assert!(
            text == "{\"n\": 0}" || text == "{\"n\": -0}",
            "{ty}: {text}"
        );
    }
}

#[test]
fn max_length_and_max_items_are_honoured() {
    let tok = tokenizer();
    let spec = one_field("s", serde_json::json!({"type": "string", "maxLength": 5}));
    let (text, ended) = walk(&tok, &spec, 60, prefer(&tok, &["a", "\"", "}"]));
    assert!(ended, "{text:?}");
    assert_eq!(text, "{\"s\": \"aaaaa\"}");

    let items = serde_json::json!({"type": "array", "items": {"type": "string"}, "maxItems": 3});
    let spec = one_field("xs", items);
    let (text, ended) = walk(&tok, &spec, 60, prefer(&tok, &["\"", ",", " ", "]", "}"]));
    assert!(ended, "{text:?}");
    assert_eq!(text, "{\"xs\": [\"\", \"\", \"\"]}");
}

/// Explicit bounds still hold, and win over the 16 digits where they need more.
#[test]
fn explicit_minimum_and_maximum_are_honoured() {
    let tok = tokenizer();
    let spec = one_field(
        "n",
        serde_json::json!({"type": "integer", "minimum": 0, "maximum": 500}),
    );
    let (text, _) = walk(&tok, &spec, 30, prefer(&tok, &["7", "}"]));
    assert_eq!(text, "{\"n\": 77}");

    // 18 digits required: the grammar allows nothing but digits, so digits stay allowed.
    let big = serde_json::json!({"type": "integer", "minimum": 1e17, "maximum": 2e17});
    let (text, ended) = walk(&tok, &one_field("n", big), 40, prefer(&tok, &["1", "}"]));
    assert!(ended, "{text:?}");
    assert_eq!(text, format!("{{\"n\": {}}}", "1".repeat(18)));

    let unit = serde_json::json!({"type": "number", "minimum": 0, "maximum": 1});
    let (text, ended) = walk(
        &tok,
        &one_field("x", unit),
        40,
        prefer(&tok, &["7", "0", ".", "}"]),
    );
    assert!(ended, "{text:?}");
    assert_eq!(text, format!("{{\"x\": 0.{}}}", "7".repeat(16)));

    // A literal longer than the bound is written whole (one llguidance writes exactly: it
    // reads schema numbers as f64).
    let long = serde_json::json!({"const": 10_000_000_000_000_000_000u64});
    let (text, ended) = walk(&tok, &one_field("id", long), 40, prefer(&tok, &["}"]));
    assert!(ended, "{text:?}");
    assert_eq!(text, "{\"id\": 10000000000000000000}");
}

/// GBNF grammars are the client's own: their numbers are as they wrote them.
#[test]
fn gbnf_digits_are_not_bounded() {
    let tok = tokenizer();
    let spec = Spec::Gbnf("root ::= [0-9]+ \"!\"\n".into());
    let (text, ended) = walk(&tok, &spec, 30, prefer(&tok, &["7", "!"]));
    assert!(!ended, "{text:?}");
    assert_eq!(text, "7".repeat(30));
}
