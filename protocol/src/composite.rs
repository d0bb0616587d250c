//! The composite decision as a pure function over any store of bucket
//! states: several limits of one client checked and applied as one atomic
//! step (in SPEND mode, if any limit denies, nothing is consumed anywhere).
//!
//! The server decides on its shard tables, whose storage is specialised
//! per kind; this module is the same rule over a plain [`Store`], for the
//! client's local fallback limiter (and any other in-process limiter, such
//! as a drill's model). The per-kind decisions are the pure functions of
//! [`crate::limit`] and [`crate::gcra`], so a limit means the same here as
//! on the server.

use crate::gcra::{self, Verdict};
use crate::limit::{concurrency, fixed_window, sliding_counter, sliding_log, Kind, Limit, Window};
use crate::message::{DecideOk, LimitVerdict, Mode};
use crate::priority::{self, Priority};
use crate::replication::State;

/// Where bucket states live: the bucket key and kind name one state.
pub trait Store {
    /// The state of a bucket, if stored.
    fn get(&self, bucket: u128, kind: Kind) -> Option<&State>;
    /// Stores a state (`None`: drops it, the bucket is full).
    fn put(&mut self, bucket: u128, kind: Kind, state: Option<State>);
}

/// One limit of a request and its bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitAt {
    /// The bucket key (`identity::bucket_key`).
    pub bucket: u128,
    /// The limit.
    pub limit: Limit,
    /// The units the request's class must leave untouched
    /// ([`crate::priority::Reserves::floor`]); 0 without reserves.
    pub floor: u64,
}

/// What `r` would answer to `cost` at `now_ns`, changing nothing.
pub fn probe(store: &impl Store, r: &LimitAt, cost: u64, now_ns: u64) -> Verdict {
    let s = store.get(r.bucket, r.limit.kind());
    match (&r.limit, s) {
        (Limit::TokenBucket(p), Some(State::TokenBucket(b))) => {
            gcra::peek(Some(*b), p, cost, now_ns)
        }
        (Limit::TokenBucket(p), _) => gcra::peek(None, p, cost, now_ns),
        (Limit::FixedWindow(w), Some(State::FixedWindow { state, .. })) => {
            fixed_window::peek(Some(*state), w, cost, now_ns)
        }
        (Limit::FixedWindow(w), _) => fixed_window::peek(None, w, cost, now_ns),
        (Limit::SlidingCounter(w), Some(State::SlidingCounter { state, .. })) => {
            sliding_counter::peek(Some(*state), w, cost, now_ns)
        }
        (Limit::SlidingCounter(w), _) => sliding_counter::peek(None, w, cost, now_ns),
        (Limit::SlidingLog(w), Some(State::SlidingLog { log, .. })) => {
            sliding_log::peek(Some(log), w, cost, now_ns)
        }
        (Limit::SlidingLog(w), _) => sliding_log::peek(None, w, cost, now_ns),
        (Limit::Concurrency(c), Some(State::Concurrency(l))) => {
            concurrency::peek(Some(l), c, cost, now_ns)
        }
        (Limit::Concurrency(c), _) => concurrency::peek(None, c, cost, now_ns),
    }
}

/// Spends `cost` on `r` (an admitted concurrency acquire takes lease
/// `lease_id`).
pub fn spend(
    store: &mut impl Store,
    r: &LimitAt,
    cost: u64,
    now_ns: u64,
    lease_id: u64,
) -> LimitVerdict {
    let kind = r.limit.kind();
    let old = store.get(r.bucket, kind).cloned();
    let window = |w: &Window| w.window_ns;
    let (state, verdict, lease) = match (&r.limit, old) {
        (Limit::TokenBucket(p), s) => {
            let b = match s {
                Some(State::TokenBucket(b)) => Some(b),
                _ => None,
            };
            let d = gcra::throttle(b, p, cost, now_ns);
            (d.bucket.map(State::TokenBucket), d.verdict, 0)
        }
        (Limit::FixedWindow(w), s) => {
            let st = match s {
                Some(State::FixedWindow { state, .. }) => Some(state),
                _ => None,
            };
            let d = fixed_window::throttle(st, w, cost, now_ns);
            let state = d.state.map(|state| State::FixedWindow {
                window_ns: window(w),
                state,
            });
            (state, d.verdict, 0)
        }
        (Limit::SlidingCounter(w), s) => {
            let st = match s {
                Some(State::SlidingCounter { state, .. }) => Some(state),
                _ => None,
            };
            let d = sliding_counter::throttle(st, w, cost, now_ns);
            let state = d.state.map(|state| State::SlidingCounter {
                window_ns: window(w),
                state,
            });
            (state, d.verdict, 0)
        }
        (Limit::SlidingLog(w), s) => {
            let st = match s {
                Some(State::SlidingLog { log, .. }) => Some(log),
                _ => None,
            };
            let d = sliding_log::throttle(st, w, cost, now_ns);
            let state = d.state.map(|log| State::SlidingLog {
                window_ns: window(w),
                log,
            });
            (state, d.verdict, 0)
        }
        (Limit::Concurrency(c), s) => {
            let st = match s {
                Some(State::Concurrency(l)) => Some(l),
                _ => None,
            };
            let d = concurrency::acquire(st, c, cost, lease_id, now_ns);
            let lease = if d.verdict.allowed && cost > 0 {
                lease_id
            } else {
                0
            };
            (d.state.map(State::Concurrency), d.verdict, lease)
        }
    };
    store.put(r.bucket, kind, state);
    LimitVerdict {
        kind,
        verdict,
        lease_id: lease,
    }
}

/// A DECIDE on `limits` as one atomic step, in `mode` (SPEND, PROBE;
/// RESET drops the buckets; REFUND is answered as a probe of 0, the local
/// fallback having nothing to give back to), for a request of class
/// `priority` whose floors the refs carry. `next_lease_id` hands out
/// lease ids. The caller has checked `cost` against every limit.
pub fn decide(
    store: &mut impl Store,
    limits: &[LimitAt],
    mode: Mode,
    cost: u64,
    now_ns: u64,
    next_lease_id: &mut u64,
    priority: Priority,
) -> DecideOk {
    let probe_cost = if matches!(mode, Mode::Spend | Mode::Probe) {
        cost
    } else {
        0
    };
    let mut verdicts: Vec<LimitVerdict> = limits
        .iter()
        .map(|r| {
            if mode == Mode::Reset {
                store.put(r.bucket, r.limit.kind(), None);
            }
            let limit = r.limit.limit();
            let verdict = if mode == Mode::Spend || mode == Mode::Probe {
                priority::probe(r.floor, limit, probe_cost, |c| probe(store, r, c, now_ns))
            } else {
                priority::for_class(r.floor, probe(store, r, 0, now_ns))
            };
            LimitVerdict {
                kind: r.limit.kind(),
                verdict,
                lease_id: 0,
            }
        })
        .collect();
    if mode == Mode::Spend && verdicts.iter().all(|v| v.verdict.allowed) {
        for (v, r) in verdicts.iter_mut().zip(limits) {
            *next_lease_id = next_lease_id.wrapping_add(1).max(1);
            *v = spend(store, r, cost, now_ns, *next_lease_id);
            debug_assert!(
                v.verdict.allowed,
                "a probe that admits means a spend that admits"
            );
            v.verdict = priority::for_class(r.floor, v.verdict);
        }
    }
    DecideOk::from_verdicts(verdicts).for_class(priority)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Map(HashMap<(u128, u8), State>);

    impl Store for Map {
        fn get(&self, bucket: u128, kind: Kind) -> Option<&State> {
            self.0.get(&(bucket, kind as u8))
        }
        fn put(&mut self, bucket: u128, kind: Kind, state: Option<State>) {
            match state {
                Some(s) => drop(self.0.insert((bucket, kind as u8), s)),
                None => drop(self.0.remove(&(bucket, kind as u8))),
            }
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn all_or_nothing_for_every_kind() {
        let limits: Vec<LimitAt> = [
            "token-bucket:5/s,burst=5",
            "fixed-window:3/m",
            "sliding-log:4/m",
            "sliding-counter:4/m",
            "concurrency:10,lease=30s",
        ]
        .iter()
        .enumerate()
        .map(|(i, s)| LimitAt {
            bucket: 100 + i as u128,
            limit: s.parse().unwrap(),
            floor: 0,
        })
        .collect();
        let mut store = Map::default();
        let mut lease = 0;
        let now = 1_000 * S;
        let mut run = |store: &mut Map, limits: &[LimitAt], mode, cost| {
            decide(store, limits, mode, cost, now, &mut lease, Priority::Normal)
        };
        for _ in 0..3 {
            let ok = run(&mut store, &limits, Mode::Spend, 1);
            assert!(ok.allowed);
            assert_ne!(ok.verdicts[4].lease_id, 0);
        }
        // The fixed window (3/m) denies the fourth: nothing else moves.
        let before: Vec<Verdict> = limits.iter().map(|r| probe(&store, r, 1, now)).collect();
        let ok = run(&mut store, &limits, Mode::Spend, 1);
        assert!(!ok.allowed);
        assert_eq!(ok.denied_index, Some(1));
        let after: Vec<Verdict> = limits.iter().map(|r| probe(&store, r, 1, now)).collect();
        assert_eq!(before, after);
        // Reset clears; probe changes nothing.
        let ok = run(&mut store, &limits[1..2], Mode::Reset, 0);
        assert_eq!(ok.verdicts[0].verdict.remaining, 3);
        let n = store.0.len();
        run(&mut store, &limits, Mode::Probe, 1);
        assert_eq!(store.0.len(), n);
    }
}
