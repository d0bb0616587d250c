//! Failed authentications, by source address: a budget per source so that
//! guessing the token is slow, a count for `/metrics`, and a warning a
//! source per interval (not per attempt).
//!
//! After [`FAILURES_PER_WINDOW_MAX`] failures from one IP address within
//! [`WINDOW_MS`], that address is refused for [`BLOCK_MS`]: its HELLOs and
//! AUTHs are answered AUTH_FAILED (RESP: `-WRONGPASS`) without the token
//! being compared, so a source gets at most 10 guesses every 6 seconds
//! however many connections it opens. A client with the token behind the
//! same address (a NAT) is refused too while the block lasts: the price of
//! a budget per address, stated in docs/SECURITY.md.
//!
//! Only failed attempts and attempts from a blocked source touch the map
//! (a lock, off the decision path: an authentication is once per
//! connection). It holds at most [`SOURCES_MAX`] addresses; past that,
//! sources whose window and block have run out are dropped, and a new
//! source finding it still full is not tracked (counted and logged, never
//! an unbounded map).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, Mutex, Ordering};

/// Failures one address may have in a window before it is blocked.
pub const FAILURES_PER_WINDOW_MAX: u32 = 10;
/// The window those failures are counted in.
pub const WINDOW_MS: u64 = 1_000;
/// How long a blocked address is refused.
pub const BLOCK_MS: u64 = 5_000;
/// At most one warning per address per this interval.
pub const WARN_INTERVAL_MS: u64 = 10_000;
/// Addresses tracked at most.
pub const SOURCES_MAX: usize = 16_384;

/// One address's recent failures.
#[derive(Debug)]
struct Source {
    /// When the current window began.
    window_start: Instant,
    /// Failures in the current window.
    failures: u32,
    /// Refused until then (`None`: not blocked).
    blocked_until: Option<Instant>,
    /// When this address was last warned about.
    warned: Option<Instant>,
    /// Failures since that warning (the next warning reports them).
    unreported: u64,
}

/// Every address's recent failures, shared by all shards.
#[derive(Debug, Default)]
pub struct AuthFailures {
    /// By address.
    sources: Mutex<HashMap<IpAddr, Source>>,
    /// Every failed authentication (`sluice_auth_failures_total`),
    /// refusals of a blocked address included.
    pub total: AtomicU64,
}

impl AuthFailures {
    /// `Some(wait)` when `ip` is blocked now: refuse its attempt (which
    /// counts as a failure) without comparing the token.
    pub fn blocked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        // No failure ever: no lock for a node whose clients all have the
        // token.
        if self.total.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut sources = self.sources.lock().expect("not poisoned");
        let source = sources.get_mut(&ip)?;
        let until = source.blocked_until.filter(|u| *u > now)?;
        self.total.fetch_add(1, Ordering::Relaxed);
        source.unreported += 1;
        warn_once_per_interval(ip, source, now, "refused: blocked");
        Some(until - now)
    }

    /// Records a wrong token from `ip`.
    pub fn failed(&self, ip: IpAddr, now: Instant) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut sources = self.sources.lock().expect("not poisoned");
        if !sources.contains_key(&ip) && sources.len() >= SOURCES_MAX {
            let live = |s: &Source| {
                s.blocked_until.is_some_and(|u| u > now)
                    || now.duration_since(s.window_start) < Duration::from_millis(WINDOW_MS)
            };
            sources.retain(|_, s| live(s));
            if sources.len() >= SOURCES_MAX {
                tracing::warn!(%ip, sources_max = SOURCES_MAX, "failed authentication from an address not tracked: too many sources failing at once");
                return;
            }
        }
        let source = sources.entry(ip).or_insert(Source {
            window_start: now,
            failures: 0,
            blocked_until: None,
            warned: None,
            unreported: 0,
        });
        if now.duration_since(source.window_start) >= Duration::from_millis(WINDOW_MS) {
            source.window_start = now;
            source.failures = 0;
        }
        source.failures = source.failures.saturating_add(1);
        source.unreported += 1;
        if source.failures >= FAILURES_PER_WINDOW_MAX {
            source.blocked_until = Some(now + Duration::from_millis(BLOCK_MS));
            source.failures = 0;
            source.window_start = now;
        }
        warn_once_per_interval(ip, source, now, "wrong token");
    }
}

/// The warning for `ip`, at most once per [`WARN_INTERVAL_MS`], with the
/// failures since the last one.
fn warn_once_per_interval(ip: IpAddr, source: &mut Source, now: Instant, what: &str) {
    let due = source.warned.map_or(true, |w| {
        now.duration_since(w) >= Duration::from_millis(WARN_INTERVAL_MS)
    });
    if due {
        let blocked_ms = source
            .blocked_until
            .map_or(0, |u| u.saturating_duration_since(now).as_millis() as u64);
        tracing::warn!(
            %ip,
            failures = source.unreported,
            blocked_ms,
            last = what,
            "failed authentications from this address (one line per {} s at most)",
            WARN_INTERVAL_MS / 1_000
        );
        source.warned = Some(now);
        source.unreported = 0;
    }
}

#[cfg(all(test, not(sluice_loom)))]
mod tests {
    use super::*;

    #[test]
    fn ten_failures_in_a_window_block_the_address_for_a_while() {
        let f = AuthFailures::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..FAILURES_PER_WINDOW_MAX - 1 {
            f.failed(ip, t0);
        }
        assert_eq!(f.blocked(ip, t0), None);
        f.failed(ip, t0);
        assert!(f.blocked(ip, t0).is_some());
        assert_eq!(f.blocked(other, t0), None);
        let later = t0 + Duration::from_millis(BLOCK_MS);
        assert_eq!(f.blocked(ip, later), None);
        assert_eq!(f.total.load(Ordering::Relaxed), 11);
    }

    #[test]
    fn failures_spread_over_windows_never_block() {
        let f = AuthFailures::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        for i in 0..50u64 {
            let now = t0 + Duration::from_millis(i * WINDOW_MS / 5);
            f.failed(ip, now);
            assert_eq!(f.blocked(ip, now), None, "at failure {i}");
        }
    }
}
