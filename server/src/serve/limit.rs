//! Rate limits: token buckets (governor's GCRA) per API key and per client. Over the rate the
//! answer is 429 with `Retry-After`; 503 stays for "the queue is full". Who a client is
//! ([`client_key`]) is decided once, for these buckets and for the connection caps alike.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::auth::KeyId;
use super::error::ApiError;

/// Who a client is for every per-client limit: an IPv4 address, or an IPv6 /64. A /64 is what
/// one subscriber gets (a single host may use any of its 2^64 addresses), so counting per /128
/// would give one attacker unlimited buckets and connections. IPv4-mapped IPv6 (`::ffff:a.b.c.d`,
/// from a dual-stack listener) is the IPv4 client it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey(IpAddr);

/// The one mapping from a peer's address to its [`ClientKey`].
pub fn client_key(ip: IpAddr) -> ClientKey {
    match ip {
        IpAddr::V4(v4) => ClientKey(IpAddr::V4(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => ClientKey(IpAddr::V4(v4)),
            None => ClientKey(IpAddr::V6(Ipv6Addr::from(
                u128::from(v6) & (u128::MAX << 64),
            ))),
        },
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

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
    per_ip: Option<DefaultKeyedRateLimiter<ClientKey>>,
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

/// Middleware: the per-client bucket ([`client_key`]), before the key is checked (so that
/// guessing keys is limited too).
pub async fn per_ip(State(limits): State<RateLimits>, req: Request, next: Next) -> Response {
    if let Some(limiter) = &limits.0.per_ip {
        // Requests in process (tests) have no peer: nothing to count them by.
        if let Some(ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<SocketAddr>>() {
            if let Err(e) = take(limiter, client_key(peer.ip()), "client address") {
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

    #[test]
    fn client_keys_are_ipv4_addresses_and_ipv6_slash_64s() {
        let key = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(key("203.0.113.7").to_string(), "203.0.113.7");
        assert_ne!(key("203.0.113.7"), key("203.0.113.8"));
        // A mapped address is the IPv4 client itself.
        assert_eq!(key("::ffff:203.0.113.7"), key("203.0.113.7"));
        // Every address of one /64 is one client; the next /64 is another.
        assert_eq!(
            key("2001:db8:1:2::1"),
            key("2001:db8:1:2:ffff:ffff:ffff:ffff")
        );
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("2001:db8:1:2:abcd::9").to_string(), "2001:db8:1:2::/64");
        assert_eq!(key("::1").to_string(), "::/64");
    }

    #[test]
    fn one_slash_64_shares_one_bucket() {
        let limits = RateLimits::new(RateConfig {
            per_key: 0,
            per_ip: 60,
            burst: 2,
        });
        let limiter = limits.0.per_ip.as_ref().unwrap();
        for host in 1..=2 {
            let ip = format!("2001:db8::{host}").parse().unwrap();
            take(limiter, client_key(ip), "client address").unwrap();
        }
        let ip = "2001:db8::ffff".parse().unwrap();
        assert!(take(limiter, client_key(ip), "client address").is_err());
        let other = "2001:db8:0:1::1".parse().unwrap();
        take(limiter, client_key(other), "client address").unwrap();
    }
}
