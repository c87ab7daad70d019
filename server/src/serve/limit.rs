//! Rate limits: token buckets (governor's GCRA) per API key and per client IP. Over the rate
//! the answer is 429 with `Retry-After`; 503 stays for "the queue is full".

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::auth::KeyId;
use super::error::ApiError;

/// `--rate-limit-key`, `--rate-limit-ip` (requests per minute, 0 = off) and `--rate-burst`.
#[derive(Debug, Clone, Copy)]
pub struct RateConfig {
    pub per_key: u32,
    pub per_ip: u32,
    /// Requests a bucket holds: what a client may send at once after a quiet spell.
    pub burst: u32,
}

impl Default for RateConfig {
    /// Off: the appliance sets them from its profile.
    fn default() -> RateConfig {
        RateConfig {
            per_key: 0,
            per_ip: 0,
            burst: 10,
        }
    }
}

/// Buckets idle long enough to be full again are forgotten once this many clients are known,
/// so that a scan from many addresses cannot grow the table without bound.
const FORGET_AT: usize = 10_000;

/// The buckets, shared by every request.
#[derive(Clone, Default)]
pub struct RateLimits(Arc<Buckets>);

#[derive(Default)]
struct Buckets {
    per_key: Option<DefaultKeyedRateLimiter<usize>>,
    per_ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
}

impl RateLimits {
    pub fn new(config: RateConfig) -> RateLimits {
        RateLimits(Arc::new(Buckets {
            per_key: limiter(config.per_key, config.burst),
            per_ip: limiter(config.per_ip, config.burst),
        }))
    }
}

/// Buckets of `burst` requests refilled at `per_minute`; `None` when the limit is off.
fn limiter<K>(per_minute: u32, burst: u32) -> Option<DefaultKeyedRateLimiter<K>>
where
    K: std::hash::Hash + Eq + Clone,
{
    let rate = NonZeroU32::new(per_minute)?;
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Some(RateLimiter::keyed(
        Quota::per_minute(rate).allow_burst(burst),
    ))
}

/// Takes a token from `key`'s bucket, or says how long until there is one.
fn take<K>(limiter: &DefaultKeyedRateLimiter<K>, key: K, by: &'static str) -> Result<(), ApiError>
where
    K: std::hash::Hash + Eq + Clone,
{
    if limiter.len() > FORGET_AT {
        limiter.retain_recent();
    }
    limiter.check_key(&key).map_err(|not_until| {
        // The limiter's own clock: a new one would be calibrated afresh, and its instants
        // need not agree with the limiter's under load.
        let wait = not_until.wait_time_from(limiter.clock().now());
        // Retry-After is in whole seconds: round up, so that a retry then succeeds.
        ApiError::RateLimited {
            by,
            retry_after: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
        }
    })
}

/// Middleware: the per-IP bucket, before the key is checked (so that guessing keys is
/// limited too).
pub async fn per_ip(State(limits): State<RateLimits>, req: Request, next: Next) -> Response {
    if let Some(limiter) = &limits.0.per_ip {
        // Requests in process (tests) have no peer: nothing to count them by.
        if let Some(ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<SocketAddr>>() {
            if let Err(e) = take(limiter, peer.ip(), "client address") {
                return e.into_response();
            }
        }
    }
    next.run(req).await
}

/// Middleware: the bucket of the key the request was admitted with.
pub async fn per_key(State(limits): State<RateLimits>, req: Request, next: Next) -> Response {
    if let Some(limiter) = &limits.0.per_key {
        if let Some(KeyId(key)) = req.extensions().get::<KeyId>() {
            if let Err(e) = take(limiter, *key, "API key") {
                return e.into_response();
            }
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refusal_with_retry_after() {
        let limits = RateLimits::new(RateConfig {
            per_key: 60,
            per_ip: 0,
            burst: 3,
        });
        let limiter = limits.0.per_key.as_ref().unwrap();
        assert!(limits.0.per_ip.is_none());
        for _ in 0..3 {
            take(limiter, 7, "API key").unwrap();
        }
        match take(limiter, 7, "API key") {
            Err(ApiError::RateLimited { retry_after, .. }) => assert_eq!(retry_after, 1),
            other => panic!("{other:?}"),
        }
        // Another key has its own bucket.
        take(limiter, 8, "API key").unwrap();
    }
}
