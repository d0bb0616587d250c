//! One trait over the five limit kinds, [`LimitKind`], so that a store of
//! bucket states (a shard's table) decides every kind through one generic
//! path, monomorphised per kind (no `dyn`, no match inside the path: the
//! store matches a [`Limit`] once and calls the path with the kind's type).
//!
//! The kinds are the zero-sized types below; each names its numbers (what
//! [`Limit`] carries for it), its per-key state, its [`Kind`] (wire code),
//! and its pure decisions from [`gcra`] and the kind modules. Converting a
//! state to and from replication's record is the store's business:
//! `replication` imports this module, so this module does not import it.

use super::{concurrency, fixed_window, sliding_counter, sliding_log, Decision, Kind, Window};
use crate::gcra::{self, Bucket, Verdict};
use crate::policy::Policy;

/// A limit kind: its numbers, its per-key state, its wire code, and its
/// pure decisions (`f(state, numbers, cost, now) -> (state', verdict)`,
/// with the promises of [`super`]: a denial returns the state as given,
/// `peek` answers as `spend` would and changes nothing).
pub trait LimitKind {
    /// The kind, whose wire code is `KIND.code()`.
    const KIND: Kind;
    /// Whether an admitted spend of a cost above 0 takes a lease, named by
    /// the `lease_id` given to [`LimitKind::spend`] (concurrency only: the
    /// other kinds ignore the id, and a store need not make one).
    const LEASES: bool;
    /// The kind's numbers, as [`Limit`](super::Limit) carries them.
    type Numbers: Copy;
    /// One key's state; `None` where a decision takes or returns an
    /// `Option` means "equivalent to no state".
    type State;

    /// Spends `cost` units at `now_ns` (a concurrency acquire: an admitted
    /// cost above 0 takes lease `lease_id`). `cost <= limit` is checked at
    /// the edge and asserted.
    fn spend(
        state: Option<Self::State>,
        numbers: &Self::Numbers,
        cost: u64,
        lease_id: u64,
        now_ns: u64,
    ) -> Decision<Self::State>;

    /// Answers as [`LimitKind::spend`] would, changing nothing.
    fn peek(
        state: Option<&Self::State>,
        numbers: &Self::Numbers,
        cost: u64,
        now_ns: u64,
    ) -> Verdict;

    /// Gives `units` back, never above the limit; the verdict is what a
    /// cost-0 peek says afterwards. Concurrency gives nothing back (leases
    /// are freed by release): its state comes back as given.
    fn refund(
        state: Option<Self::State>,
        numbers: &Self::Numbers,
        units: u64,
        now_ns: u64,
    ) -> Decision<Self::State>;
}

/// A token bucket (GCRA, [`gcra`]).
#[derive(Clone, Copy, Debug)]
pub struct TokenBucket;

/// A fixed window ([`fixed_window`]).
#[derive(Clone, Copy, Debug)]
pub struct FixedWindow;

/// A sliding log ([`sliding_log`]).
#[derive(Clone, Copy, Debug)]
pub struct SlidingLog;

/// A sliding window counter ([`sliding_counter`]).
#[derive(Clone, Copy, Debug)]
pub struct SlidingCounter;

/// Concurrency leases ([`concurrency`]).
#[derive(Clone, Copy, Debug)]
pub struct Concurrency;

impl LimitKind for TokenBucket {
    const KIND: Kind = Kind::TokenBucket;
    const LEASES: bool = false;
    type Numbers = Policy;
    type State = Bucket;

    #[inline(always)]
    fn spend(s: Option<Bucket>, p: &Policy, cost: u64, _: u64, now_ns: u64) -> Decision<Bucket> {
        gcra::throttle(s, p, cost, now_ns).into()
    }

    #[inline(always)]
    fn peek(s: Option<&Bucket>, p: &Policy, cost: u64, now_ns: u64) -> Verdict {
        gcra::peek(s.copied(), p, cost, now_ns)
    }

    #[inline(always)]
    fn refund(s: Option<Bucket>, p: &Policy, units: u64, now_ns: u64) -> Decision<Bucket> {
        gcra::refund(s, p, units, now_ns).into()
    }
}

/// The three window kinds: their decisions by module, state by value.
macro_rules! window_kind {
    ($kind:ident, $module:ident, $state:ty) => {
        impl LimitKind for $kind {
            const KIND: Kind = Kind::$kind;
            const LEASES: bool = false;
            type Numbers = Window;
            type State = $state;

            #[inline(always)]
            fn spend(
                s: Option<$state>,
                w: &Window,
                cost: u64,
                _: u64,
                now_ns: u64,
            ) -> Decision<$state> {
                $module::throttle(s, w, cost, now_ns)
            }

            #[inline(always)]
            fn peek(s: Option<&$state>, w: &Window, cost: u64, now_ns: u64) -> Verdict {
                window_kind!(@peek $module, s, w, cost, now_ns)
            }

            #[inline(always)]
            fn refund(s: Option<$state>, w: &Window, units: u64, now_ns: u64) -> Decision<$state> {
                $module::refund(s, w, units, now_ns)
            }
        }
    };
    // The log is peeked by reference (it is not Copy); the counters by value.
    (@peek sliding_log, $s:ident, $w:ident, $cost:ident, $now:ident) => {
        sliding_log::peek($s, $w, $cost, $now)
    };
    (@peek $module:ident, $s:ident, $w:ident, $cost:ident, $now:ident) => {
        $module::peek($s.copied(), $w, $cost, $now)
    };
}

window_kind!(FixedWindow, fixed_window, fixed_window::FixedWindowState);
window_kind!(SlidingLog, sliding_log, sliding_log::SlidingLogState);
window_kind!(
    SlidingCounter,
    sliding_counter,
    sliding_counter::SlidingCounterState
);

impl LimitKind for Concurrency {
    const KIND: Kind = Kind::Concurrency;
    const LEASES: bool = true;
    type Numbers = super::Concurrency;
    type State = concurrency::ConcurrencyState;

    #[inline(always)]
    fn spend(
        s: Option<Self::State>,
        c: &super::Concurrency,
        cost: u64,
        lease_id: u64,
        now_ns: u64,
    ) -> Decision<Self::State> {
        concurrency::acquire(s, c, cost, lease_id, now_ns)
    }

    #[inline(always)]
    fn peek(s: Option<&Self::State>, c: &super::Concurrency, cost: u64, now_ns: u64) -> Verdict {
        concurrency::peek(s, c, cost, now_ns)
    }

    #[inline(always)]
    fn refund(
        s: Option<Self::State>,
        c: &super::Concurrency,
        _units: u64,
        now_ns: u64,
    ) -> Decision<Self::State> {
        Decision {
            verdict: concurrency::peek(s.as_ref(), c, 0, now_ns),
            state: s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_040 * S;

    /// Drives one kind through its trait: a peek answers as the spend at
    /// the same instant, a denial returns the state as given, and a refund
    /// never leaves fewer units than before it.
    fn drive<K: LimitKind>(limit: Limit, numbers: K::Numbers)
    where
        K::State: Clone + PartialEq + std::fmt::Debug,
    {
        assert_eq!(limit.kind(), K::KIND);
        let mut state: Option<K::State> = None;
        let (mut allowed, mut denied) = (0, 0);
        for (i, cost) in (0u64..).zip([1u64, 3, 0, 2, 5, 1, 4].into_iter().cycle().take(60)) {
            let now_ns = T0 + i * S / 7;
            let peeked = K::peek(state.as_ref(), &numbers, cost, now_ns);
            let d = K::spend(state.clone(), &numbers, cost, i + 1, now_ns);
            assert_eq!(peeked, d.verdict, "{:?} step {i}", K::KIND);
            if d.verdict.allowed {
                allowed += 1;
            } else {
                denied += 1;
                assert_eq!(d.state, state, "a denial changes nothing");
            }
            state = d.state;
            if i % 5 == 4 {
                let r = K::refund(state.clone(), &numbers, 2, now_ns);
                assert!(
                    r.verdict.remaining >= K::peek(state.as_ref(), &numbers, 0, now_ns).remaining
                );
                state = r.state;
            }
        }
        assert!(
            allowed > 0 && denied > 0,
            "{:?}: {allowed} allowed, {denied} denied",
            K::KIND
        );
    }

    #[test]
    fn every_kind_keeps_the_trait_promises() {
        let p = Policy::new(5, S, 5).unwrap();
        let w = Window::new(5, S).unwrap();
        let c = super::super::Concurrency::new(5, 2 * S).unwrap();
        drive::<TokenBucket>(Limit::TokenBucket(p), p);
        drive::<FixedWindow>(Limit::FixedWindow(w), w);
        drive::<SlidingLog>(Limit::SlidingLog(w), w);
        drive::<SlidingCounter>(Limit::SlidingCounter(w), w);
        drive::<Concurrency>(Limit::Concurrency(c), c);
        assert_eq!(Concurrency::KIND.code(), 5);
        const { assert!(Concurrency::LEASES && !TokenBucket::LEASES) };
    }
}
