//! Slots for the tests' hooks: the test build's second binary, `llm-server-test-hooks`
//! (src/bin/llm-server-test-hooks.rs), installs functions here that stall or panic the decode
//! thread or leak per request when its environment asks, for the tests that must see the
//! server fail that way. The shipped `llm-server` installs none, so it carries no such code and
//! each slot costs it one load of an empty `OnceLock`.
//!
//! Slots rather than a cargo feature: a feature the tests' build turned on would give the
//! library a second set of features, and the image build would compile it a second time.

use std::sync::OnceLock;

/// The functions a test binary runs at each hook point.
pub struct Hooks {
    /// Each round of the decode thread, where it holds no lock, as a real hang in the forward
    /// pass would ([`Counters::beat`](crate::engine::Counters::beat)).
    pub on_beat: fn(),
    /// Each HTTP request, before its handler runs.
    pub on_request: fn(),
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// Installs `hooks` for the rest of the process; a second call is ignored. Call it before the
/// server starts.
pub fn install(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

#[inline]
pub(crate) fn on_beat() {
    if let Some(hooks) = HOOKS.get() {
        (hooks.on_beat)();
    }
}

#[inline]
pub(crate) fn on_request() {
    if let Some(hooks) = HOOKS.get() {
        (hooks.on_request)();
    }
}
