//! Constrained decoding: a JSON schema, "any JSON object" or a GBNF grammar becomes a
//! [`Constraint`] that says, before each token is sampled, which tokens of the vocabulary may
//! come next, and follows the tokens chosen.
//!
//! The masks come from llguidance (the structured-output engine behind llama.cpp's
//! `LLAMA_LLGUIDANCE` build, vLLM and SGLang): it walks a trie of every token's bytes with a
//! derivative-based lexer and an Earley parser, so a mask over a 262k vocabulary costs well
//! under a millisecond for JSON. We give it the vocabulary ([`vocab`]), turn GBNF into its Lark
//! dialect ([`gbnf`]), and keep one compiled vocabulary per tokenizer ([`factory`]).

mod factory;
pub use factory::GRAMMAR_STATE_BYTES;
pub mod gbnf;
mod numbers;
mod vocab;

pub use numbers::MAX_DIGITS;

use std::fmt;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::Matcher;

use numbers::NumberBounds;

use crate::tokenizer::Tokenizer;

/// What the output must be, as a request asks for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema (`response_format.json_schema.schema`).
    JsonSchema(serde_json::Value),
    /// Text of this GBNF grammar (llama.cpp's syntax), start rule `root`.
    Gbnf(String),
    /// A grammar already in llguidance's Lark dialect, built here from JSON schemas (tool
    /// calls): its numbers are bounded as JSON's are.
    Lark(String),
}

/// Why a [`Spec`] cannot be used; the message names the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// The grammar of one generation, following its tokens.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// The vocabulary's token bytes, for [`NumberBounds`].
    tok_env: TokEnv,
    /// Where the output is in its JSON, for output that is JSON; `None` for GBNF grammars,
    /// whose numbers are as the client wrote them.
    numbers: Option<NumberBounds>,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint")
    }
}

/// JSON is generated compactly (no free whitespace between tokens): a small model given
/// free whitespace tends to spend its budget on newlines.
fn json_options() -> serde_json::Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl Spec {
    /// Whether the output is JSON (or JSON in fixed tags), whose numbers get at most
    /// [`MAX_DIGITS`] digits in each part.
    fn bounds_numbers(&self) -> bool {
        !matches!(self, Spec::Gbnf(_))
    }

    /// The Lark text handed to llguidance.
    fn to_lark(&self) -> Result<String, GrammarError> {
        Ok(match self {
            Spec::JsonObject => format!(
                "%llguidance {{}}\nstart: %json {{ \"type\": \"object\", \"x-guidance\": {} }}",
                json_options()
            ),
            Spec::JsonSchema(schema) => json_schema_lark(schema)?,
            Spec::Gbnf(text) => gbnf::to_lark(text).map_err(|e| GrammarError(e.to_string()))?,
            Spec::Lark(text) => text.clone(),
        })
    }
}

/// `start: %json {...}` for `schema`, with our JSON layout options merged in.
pub fn json_schema_lark(schema: &serde_json::Value) -> Result<String, GrammarError> {
    Ok(format!("start: {}", json_lark(schema)?))
}

/// `%json {...}`: the Lark expression for JSON valid against `schema`, laid out as all our JSON
/// is (for embedding in larger grammars, such as a tool call's).
pub fn json_lark(schema: &serde_json::Value) -> Result<String, GrammarError> {
    let serde_json::Value::Object(map) = schema else {
        return Err(GrammarError(
            "the JSON schema must be an object (e.g. {\"type\": \"object\", ...})".into(),
        ));
    };
    if map.contains_key("x-guidance") {
        return Err(GrammarError(
            "the schema keyword `x-guidance` is reserved by this server".into(),
        ));
    }
    let mut map = map.clone();
    map.insert("x-guidance".into(), json_options());
    Ok(format!("%json {}", serde_json::Value::Object(map)))
}

impl Constraint {
    /// Compiles `spec` for `tokenizer`'s vocabulary. Unsupported schema keywords and grammar
    /// errors are refused here, before anything is generated.
    pub fn new(tokenizer: &Tokenizer, spec: &Spec) -> Result<Constraint, GrammarError> {
        // The grammar's text first: a malformed one is refused before the vocabulary is built.
        let lark = spec.to_lark()?;
        let factory = factory::for_tokenizer(tokenizer)?;
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark))
            .map_err(|e| GrammarError(explain(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError(explain(&e)));
        }
        Ok(Constraint {
            matcher,
            tok_env: factory.tok_env().clone(),
            numbers: spec.bounds_numbers().then(NumberBounds::default),
        })
    }

    /// The tokens allowed next; end-of-generation tokens are allowed exactly when the output
    /// so far is complete. In JSON, no number gets more than [`MAX_DIGITS`] digits in a part
    /// unless the grammar allows nothing else.
    pub fn mask(&mut self) -> Result<SimpleVob, GrammarError> {
        let mut mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError(e.to_string()))?;
        if let Some(numbers) = self.numbers {
            numbers.narrow(&mut mask, self.tok_env.tok_trie());
        }
        Ok(mask)
    }

    /// Follows the chosen token (one the last mask allowed).
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError(e.to_string()))?;
        if let Some(numbers) = self.numbers.as_mut() {
            numbers.follow(self.tok_env.tok_trie().token(token));
        }
        Ok(())
    }

    /// True when nothing can follow: the output is complete and must end.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// True when the output so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// Compiles `spec` for a vocabulary of the 256 single bytes, with the server's limits: whether
/// llguidance accepts it, without a model (for the fuzz target `gbnf_parse`).
pub fn compile_for_bytes(spec: &Spec) -> Result<(), GrammarError> {
    thread_local! {
        static FACTORY: Result<llguidance::ParserFactory, String> = {
            llguidance::ParserFactory::new(&vocab::byte_tok_env(), Default::default(), &[])
                .map(|mut f| {
                    f.set_stderr_log_level(0);
                    *f.limits_mut() = factory::limits();
                    f
                })
                .map_err(|e| e.to_string())
        };
    }
    let lark = spec.to_lark()?;
    FACTORY.with(|factory| {
        let factory = factory.as_ref().map_err(|e| GrammarError(e.clone()))?;
        factory
            .create_parser(TopLevelGrammar::from_lark(lark))
            .map(drop)
            .map_err(|e| GrammarError(explain(&e.to_string())))
    })
}

/// llguidance's message, with the fix for the one a client most often meets.
fn explain(message: &str) -> String {
    // llguidance names the keywords it does not implement in "Unimplemented keys: [...]".
    match message.find("Unimplemented keys: ") {
        Some(at) => {
            let rest = &message[at + "Unimplemented keys: ".len()..];
            let keys = rest
                .split(']')
                .next()
                .unwrap_or(rest)
                .trim_start_matches('[');
            format!(
                "the JSON schema uses keywords this server cannot enforce: {keys}; remove them (or describe the constraint in the prompt)"
            )
        }
        None => format!("the grammar cannot be used: {message}"),
    }
}

#[cfg(test)]
mod tests;
