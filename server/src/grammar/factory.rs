//! One compiled vocabulary per tokenizer. Building it (llguidance's token trie) takes about a
//! second and ~46 MiB for 262k tokens, so it is done at the first constrained request and kept;
//! a server has one model, so one is kept. The memory plan counts it (`plan::GRAMMAR_BYTES_PER_TOKEN`).

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

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
    let factory = Arc::new(factory);
    *cache = Some((key, factory.clone()));
    Ok(factory)
}

fn fingerprint(tokenizer: &Tokenizer) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tokenizer.n_vocab().hash(&mut h);
    for id in 0..tokenizer.n_vocab() as u32 {
        tokenizer.piece(id, true).hash(&mut h);
        tokenizer.is_eog(id).hash(&mut h);
    }
    h.finish()
}
