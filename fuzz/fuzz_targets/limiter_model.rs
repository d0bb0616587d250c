//! Structure-aware: arbitrary sequences of valid THROTTLE and PEEK
//! requests on a few keys, with time moving forward by arbitrary steps,
//! against a shard's real table, checked after every step against what the
//! token bucket promises (PROTOCOL.md, "Token bucket"):
//!
//! - at most `burst + rate x T` units are admitted in any interval of
//!   length T (checked over every pair of admissions of a key);
//! - a denied request retried exactly `retry_after_ns` later, with nothing
//!   spent from its key in between, is admitted;
//! - a PEEK says what a THROTTLE at the same instant decides, and spends
//!   nothing;
//! - `remaining` never exceeds the burst, and a denial reports a wait.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sluice_protocol::Policy;
use sluice_server::shard::table::Table;

const KEYS: usize = 4;

#[derive(Arbitrary, Debug)]
struct Spec {
    count: u16,
    period_ms: u16,
    burst: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// THROTTLE `cost` on key `key % KEYS`, `dt_us` after the last step.
    Spend { key: u8, cost: u8, dt_us: u32 },
    /// PEEK then THROTTLE at the same instant.
    PeekThenSpend { key: u8, cost: u8, dt_us: u32 },
    /// Retry the key's last denied request exactly when it said to.
    RetryWhenTold { key: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    specs: [Spec; KEYS],
    ops: Vec<Op>,
}

#[derive(Default)]
struct Key {
    /// (time, cost) of every admission.
    admitted: Vec<(u64, u64)>,
    /// The last request, if it was denied and nothing was admitted since:
    /// (cost, when it may be admitted).
    denied: Option<(u64, u64)>,
}

fn key_hash(k: usize) -> u128 {
    (k as u128 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834)
}

fuzz_target!(|input: Input| {
    let policies: Vec<Policy> = input
        .specs
        .iter()
        .map(|s| {
            let count = u64::from(s.count.max(1));
            let period_ns = u64::from(s.period_ms.max(1)) * 1_000_000;
            let burst = u64::from(s.burst.max(1));
            Policy::new(count, period_ns, burst).expect("a valid policy")
        })
        .collect();
    let mut table = Table::new();
    let mut keys: Vec<Key> = (0..KEYS).map(|_| Key::default()).collect();
    let mut now: u64 = 1_000_000_000_000;
    for op in input.ops.iter().take(256) {
        let (k, cost, peek_first) = match *op {
            Op::Spend { key, cost, dt_us } | Op::PeekThenSpend { key, cost, dt_us } => {
                now += u64::from(dt_us) * 1_000;
                let k = usize::from(key) % KEYS;
                let cost = u64::from(cost).clamp(1, policies[k].burst);
                (k, cost, matches!(op, Op::PeekThenSpend { .. }))
            }
            Op::RetryWhenTold { key } => {
                let k = usize::from(key) % KEYS;
                let Some((cost, at)) = keys[k].denied else {
                    continue;
                };
                now = now.max(at);
                let v = table
                    .throttle(key_hash(k), &policies[k], cost, now)
                    .expect("no cap is near");
                assert!(
                    v.allowed,
                    "key {k}: denied again at the time it was told, {v:?}"
                );
                keys[k].admitted.push((now, cost));
                keys[k].denied = None;
                check_rate(&keys[k], &policies[k], k);
                continue;
            }
        };
        let policy = &policies[k];
        let peeked = peek_first.then(|| table.peek(key_hash(k), policy, cost, now));
        let v = table
            .throttle(key_hash(k), policy, cost, now)
            .expect("no cap is near");
        if let Some(p) = peeked {
            assert_eq!(
                p.allowed, v.allowed,
                "key {k}: PEEK said {p:?}, THROTTLE did {v:?}"
            );
        }
        assert!(v.remaining <= policy.burst, "{v:?}");
        if v.allowed {
            keys[k].admitted.push((now, cost));
            keys[k].denied = None;
            check_rate(&keys[k], policy, k);
        } else {
            assert!(v.retry_after_ns > 0, "a denial with no wait: {v:?}");
            keys[k].denied = Some((cost, now + v.retry_after_ns));
        }
    }
});

/// At most `burst + count x T / period` units in any interval of length T.
fn check_rate(key: &Key, p: &Policy, k: usize) {
    let a = &key.admitted;
    let last = a.len() - 1;
    let mut units: u128 = 0;
    // Intervals that end at the newest admission (older ones were checked
    // when they were the newest).
    for j in (0..=last).rev() {
        units += u128::from(a[j].1);
        let t = u128::from(a[last].0 - a[j].0);
        let allowed = u128::from(p.burst) * u128::from(p.period_ns) + u128::from(p.count) * t;
        assert!(
            units * u128::from(p.period_ns) <= allowed,
            "key {k}: {units} units admitted within {t} ns, more than burst {} + {}/{} ns",
            p.burst,
            p.count,
            p.period_ns
        );
    }
}
