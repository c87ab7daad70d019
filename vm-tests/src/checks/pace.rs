//! How fast the guest's model works under TCG, measured by the suite's first generation, and the
//! number of tokens a later generation can ask for so that it ends inside the server's request
//! timeout. Under TCG a batched prompt costs about as much per token as decoding (the 1B box:
//! a 12-token chat prompt and 3 tokens in 203 s, 6 prompt tokens in 95 s), so one figure, seconds
//! per token of either kind, sizes a request; the host's load moves it by a factor of two or more.

use std::time::Duration;

/// `llm-server serve`'s `--request-timeout` default (server/src/cli/serve.rs), which the
/// appliance's unit keeps: a request running longer is cancelled by the server itself.
pub const SERVER_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// The share of [`SERVER_REQUEST_TIMEOUT`] a sized request is planned to take: the rest absorbs
/// the host's load changing between the measurement and the request.
const SHARE: f64 = 0.5;

/// Seconds per token (prompt or generated) of one measured request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    pub secs_per_token: f64,
}

impl Pace {
    /// The pace of a request over `prompt_tokens + completion_tokens` that took `took`; `None`
    /// when it counted no tokens.
    pub fn of(took: Duration, prompt_tokens: u64, completion_tokens: u64) -> Option<Pace> {
        let tokens = prompt_tokens + completion_tokens;
        (tokens > 0).then(|| Pace {
            secs_per_token: took.as_secs_f64() / tokens as f64,
        })
    }

    /// Tokens to generate after a prompt of `prompt_tokens` so that the request is planned to
    /// take at most half the server's request timeout, between `min` and `max`: `min` when even
    /// that does not fit (the request then shows how slow the box is rather than being skipped).
    pub fn tokens_within_timeout(&self, prompt_tokens: u64, min: u64, max: u64) -> u64 {
        let budget = SERVER_REQUEST_TIMEOUT.as_secs_f64() * SHARE;
        let fit = (budget / self.secs_per_token.max(f64::MIN_POSITIVE)).floor() as u64;
        fit.saturating_sub(prompt_tokens).clamp(min, max.max(min))
    }

    /// How long a request of `tokens` in all is expected to take at this pace.
    pub fn expected(&self, tokens: u64) -> Duration {
        Duration::from_secs_f64(self.secs_per_token * tokens as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fast_box_gets_the_most_tokens_and_a_slow_one_fewer() {
        // The 270M box under TCG: about 5 s a token leaves room for all 8.
        let fast = Pace::of(Duration::from_secs(75), 12, 3).unwrap();
        assert_eq!(fast.secs_per_token, 5.0);
        assert_eq!(fast.tokens_within_timeout(6, 2, 8), 8);
        // The 1B box at 20 s a token: 300 s hold 15 tokens, 6 of them the prompt's.
        let slow = Pace::of(Duration::from_secs(300), 12, 3).unwrap();
        assert_eq!(slow.tokens_within_timeout(6, 2, 8), 8);
        let slower = Pace::of(Duration::from_secs(450), 12, 3).unwrap();
        assert_eq!(slower.tokens_within_timeout(6, 2, 8), 4);
        assert_eq!(slower.expected(10), Duration::from_secs(300));
    }

    #[test]
    fn too_slow_a_box_still_asks_the_minimum() {
        let crawl = Pace::of(Duration::from_secs(3600), 12, 3).unwrap();
        assert_eq!(crawl.tokens_within_timeout(6, 2, 8), 2);
        assert_eq!(Pace::of(Duration::from_secs(1), 0, 0), None);
    }
}
