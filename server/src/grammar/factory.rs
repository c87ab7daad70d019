//! One compiled vocabulary per tokenizer. Building it (llguidance's token trie) takes about a
//! second and ~46 MiB for 262k tokens, so it is done at the first constrained request and kept;
//! a server has one model, so one is kept. The memory plan counts it (`plan::GRAMMAR_BYTES_PER_TOKEN`).

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use llguidance::api::ParserLimits;
use llguidance::ParserFactory;

use super::{vocab, GrammarError};
use crate::tokenizer::Tokenizer;

static CACHE: Mutex<Option<(u64, Arc<ParserFactory>)>> = Mutex::new(None);

/// The factory for `tokenizer`, built on first use. Keyed by the vocabulary's content, not its
/// address, so that a model loaded where another was freed never gets the other's masks.
pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Arc<ParserFactory>, GrammarError> {
    let key = fingerprint(tokenizer);
    // Held while building: a second request for the same model waits instead of building twice.
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, factory)) = cache.as_ref() {
        if *k == key {
            return Ok(factory.clone());
        }
    }
    let env = vocab::tok_env(tokenizer);
    // No precomputed slices (llguidance's `new_simple` builds its general ones): on the default
    // model's 262k vocabulary they cost +63 MiB of anonymous memory (a first constrained request
    // grew RssAnon by 109 MiB with them, 46 without) and 1.5 s more to build, to save ~0.4 ms of
    // a mask (1.1 vs 1.5 ms per token against a 39–52 ms decode step). On a 1 GB box the memory
    // matters more.
    let mut factory = ParserFactory::new(&env, Default::default(), &[])
        .map_err(|e| GrammarError(format!("cannot prepare the vocabulary for grammars: {e}")))?;
    // llguidance logs warnings to stderr by default; its errors reach the client instead.
    factory.set_stderr_log_level(0);
    *factory.limits_mut() = limits();
    let factory = Arc::new(factory);
    *cache = Some((key, factory.clone()));
    Ok(factory)
}

/// llguidance's limits, for a 1 GB box whose one decode thread computes every mask. Its
/// defaults are sized for GPU servers: 250k lexer states at 1-2 kB each could hold up to
/// ~500 MB per generation, and 200k fuel per mask is ~15 ms (~45 ms on an E2.1.Micro's Zen 1),
/// a whole decode step of every other slot. Grammars are at most `--max-grammar-bytes` (64 KiB)
/// of text, and a JSON schema or a GBNF grammar of that size needs far less than any of these:
/// a mask over the 262k-token Gemma vocabulary takes ~1 ms, about 15k fuel.
///
/// What a generation's grammar may hold at most ([`GRAMMAR_STATE_BYTES`]) is in the memory
/// plan, per slot.
pub fn limits() -> ParserLimits {
    ParserLimits {
        // Earley items in one row: the grammar's "branching" at one point (default 2000).
        max_items_in_row: 2000,
        // Building the lexer's regexes at compile time: ~50k/ms, so ~20 ms (default 1M).
        initial_lexer_fuel: 1_000_000,
        // One mask: ~14k/ms, so ~3.5 ms here, ~10 ms on Zen 1 (default 200k).
        step_lexer_fuel: 50_000,
        // Earley items for one mask: ~20k/ms, so ~1 ms (default 50k).
        step_max_items: 20_000,
        // Lexer (DFA) states one generation may build, ~1-2 kB each: at most ~20 MB (default
        // 250k, ~500 MB).
        max_lexer_states: MAX_LEXER_STATES,
        // Symbols in the compiled grammar: a 64 KiB grammar of one-character literals has
        // ~64k; JSON schemas compile to a few per keyword (default 500k).
        max_grammar_size: 200_000,
        precompute_large_lexemes: true,
        // Errors go to the client: without the parser's state and the whole grammar echoed.
        verbose_errors: false,
    }
}

/// [`ParserLimits::max_lexer_states`] of [`limits`].
const MAX_LEXER_STATES: usize = 10_000;

/// Anonymous bytes one constrained generation's grammar may hold beside the shared vocabulary:
/// its lexer states, at most [`MAX_LEXER_STATES`] at 2 KiB each (llguidance's upper figure),
/// and 4 MiB for the Earley parser's rows (each at most `max_items_in_row` items; a row is kept
/// per token of output, a few thousand tokens in a slot's context). The memory plan counts it
/// once per slot, since every slot may generate under a grammar.
pub const GRAMMAR_STATE_BYTES: u64 = MAX_LEXER_STATES as u64 * 2048 + (4 << 20);

fn fingerprint(tokenizer: &Tokenizer) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tokenizer.n_vocab().hash(&mut h);
    for id in 0..tokenizer.n_vocab() as u32 {
        tokenizer.piece(id, true).hash(&mut h);
        tokenizer.is_eog(id).hash(&mut h);
    }
    h.finish()
}
