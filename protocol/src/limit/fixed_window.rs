//! Fixed window: at most `limit` units per window, where windows are aligned
//! to multiples of `window_ns` since the Unix epoch (`[k x W, (k+1) x W)`,
//! [`Window::aligned_start_ns`], shared with the sliding counter), so every
//! key's windows start at the same instants and a window's start is known
//! without storing when the key was first seen.
//!
//! **The boundary burst is this kind's documented behaviour**: a client that
//! spends `limit` at the very end of one window and `limit` at the very start
//! of the next gets `2 x limit` units within a few nanoseconds. The promise
//! is per aligned window, not per rolling interval; use
//! [`sliding_log`](super::sliding_log) (exact) or
//! [`sliding_counter`](super::sliding_counter) (estimated) when a rolling
//! promise matters, or a token bucket when smoothness does.
//!
//! The state is the window's start and its count (16 bytes). A state whose
//! window has ended is equivalent to none, and decisions return `None` for
//! it. Refund lowers the current window's count (saturating at 0); units
//! spent in an earlier window are gone with it.
//!
//! A clock that steps backward into an earlier window does not open a fresh
//! window: the stored window is the current one until time passes its end,
//! so the step grants nothing (it only delays the next window).

use super::{until, Decision, Window};
use crate::gcra::Verdict;

/// A fixed window's state: which window, and how much of it is spent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C)]
pub struct FixedWindowState {
    /// Start of the window the count belongs to, ns since the epoch; a
    /// multiple of `window_ns`.
    pub window_start_ns: u64,
    /// Units admitted in that window (net of refunds).
    pub count: u64,
}

impl FixedWindowState {
    /// Whether the state is equivalent to none at `now_ns` (its window has
    /// ended, or it holds nothing), so the store may drop it.
    #[inline]
    pub fn is_full(&self, window: &Window, now_ns: u64) -> bool {
        self.count == 0 || current(Some(*self), window, now_ns).1 == 0
    }
}

/// The window that is current at `now_ns` for this state, and its count.
/// A stored window later than now's (the clock stepped back) stays current.
#[inline]
fn current(state: Option<FixedWindowState>, window: &Window, now_ns: u64) -> (u64, u64) {
    let aligned_ns = window.aligned_start_ns(now_ns);
    match state {
        Some(s) if s.window_start_ns >= aligned_ns => (s.window_start_ns, s.count),
        _ => (aligned_ns, 0),
    }
}

/// Spends `cost` units from the key's current window at `now_ns`.
///
/// `window` must be validated and `cost <= window.limit` (checked at the
/// edge; asserted here). A denied request returns the state unchanged.
#[inline]
pub fn throttle(
    state: Option<FixedWindowState>,
    window: &Window,
    cost: u64,
    now_ns: u64,
) -> Decision<FixedWindowState> {
    assert!(
        cost <= window.limit,
        "cost must be checked against the limit at the edge"
    );
    let (start_ns, count) = current(state, window, now_ns);
    // Saturating: a window ending past u64::MAX ns (year 2554) never ends.
    let until_end_ns = until(start_ns.saturating_add(window.window_ns), now_ns);
    match count.checked_add(cost).filter(|&n| n <= window.limit) {
        Some(spent) => {
            let verdict = Verdict {
                allowed: true,
                limit: window.limit,
                remaining: window.limit - spent,
                retry_after_ns: 0,
                reset_after_ns: if spent > 0 { until_end_ns } else { 0 },
            };
            let state = (spent > 0).then_some(FixedWindowState {
                window_start_ns: start_ns,
                count: spent,
            });
            Decision { verdict, state }
        }
        None => {
            // Denied: the next window starts empty and cost <= limit, so
            // its first instant admits this request.
            let verdict = Verdict {
                allowed: false,
                limit: window.limit,
                remaining: window.limit.saturating_sub(count),
                retry_after_ns: until_end_ns,
                reset_after_ns: until_end_ns,
            };
            Decision { verdict, state }
        }
    }
}

/// Answers as [`throttle`] would, changing nothing.
#[inline]
pub fn peek(state: Option<FixedWindowState>, window: &Window, cost: u64, now_ns: u64) -> Verdict {
    throttle(state, window, cost, now_ns).verdict
}

/// Gives `units` back to the current window (its count goes down,
/// saturating at 0). Units spent in a window that has ended are not
/// refundable: that window's count no longer limits anything. The verdict
/// is what a cost-0 [`peek`] says afterwards.
#[inline]
pub fn refund(
    state: Option<FixedWindowState>,
    window: &Window,
    units: u64,
    now_ns: u64,
) -> Decision<FixedWindowState> {
    let (start_ns, count) = current(state, window, now_ns);
    let count = count.saturating_sub(units);
    let state = (count > 0).then_some(FixedWindowState {
        window_start_ns: start_ns,
        count,
    });
    Decision {
        verdict: peek(state, window, 0, now_ns),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const S: u64 = 1_000_000_000;
    /// A multiple of a minute (and so of every window below but 7/3 s).
    const T0: u64 = 1_700_000_040 * S;

    fn window(limit: u64, window_ns: u64) -> Window {
        Window::new(limit, window_ns).unwrap()
    }

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        let w = window(3, 60 * S);
        // First request 30 s into a minute: the window still ends on the minute.
        let d = throttle(None, &w, 1, T0 + 30 * S);
        assert!(d.verdict.allowed);
        assert_eq!(d.verdict.remaining, 2);
        assert_eq!(d.verdict.reset_after_ns, 30 * S);
        assert_eq!(
            d.state,
            Some(FixedWindowState {
                window_start_ns: T0,
                count: 1
            })
        );
        let d = throttle(d.state, &w, 2, T0 + 59 * S);
        assert!(d.verdict.allowed);
        assert_eq!(d.verdict.remaining, 0);
        let denied = throttle(d.state, &w, 1, T0 + 59 * S);
        assert!(!denied.verdict.allowed);
        assert_eq!(denied.verdict.retry_after_ns, S);
        assert_eq!(denied.state, d.state, "a denial changes nothing");
        assert!(!throttle(d.state, &w, 1, T0 + 60 * S - 1).verdict.allowed);
        let next = throttle(d.state, &w, 1, T0 + 60 * S);
        assert!(next.verdict.allowed);
        assert_eq!(next.verdict.remaining, 2);
        assert!(d.state.unwrap().is_full(&w, T0 + 60 * S));
        assert!(!d.state.unwrap().is_full(&w, T0 + 60 * S - 1));
    }

    /// The documented boundary burst: `limit` at the last nanosecond of one
    /// window and `limit` at the first of the next, 2 x limit in 1 ns.
    #[test]
    fn boundary_burst_is_two_limits() {
        let w = window(100, 60 * S);
        let mut state = None;
        let mut admitted = 0;
        for t in [T0 + 60 * S - 1, T0 + 60 * S] {
            for _ in 0..150 {
                let d = throttle(state, &w, 1, t);
                admitted += u64::from(d.verdict.allowed);
                state = d.state;
            }
        }
        assert_eq!(admitted, 200, "2 x limit across the edge, by design");
    }

    #[test]
    fn refund_lowers_the_current_window_only() {
        let w = window(5, S);
        let d = throttle(None, &w, 5, T0);
        let r = refund(d.state, &w, 2, T0 + 1);
        assert_eq!(r.verdict.remaining, 2);
        assert_eq!(r.state.unwrap().count, 3);
        let r = refund(r.state, &w, 100, T0 + 2);
        assert_eq!(r.state, None, "saturates at 0, which is no state");
        assert_eq!(r.verdict.remaining, 5);
        // A refund in the next window cannot lift it above its limit.
        let r = refund(d.state, &w, 3, T0 + S);
        assert_eq!((r.state, r.verdict.remaining), (None, 5));
        // Cost 0 on nothing stores nothing.
        assert_eq!(throttle(None, &w, 0, T0).state, None);
    }

    #[test]
    fn clock_stepping_back_opens_no_window() {
        let w = window(2, 60 * S);
        let d = throttle(None, &w, 2, T0 + 60 * S);
        // An hour back: still the stored window, still spent.
        let back = throttle(d.state, &w, 1, T0 - 3_600 * S);
        assert!(!back.verdict.allowed);
        assert_eq!(back.state, d.state);
        assert_eq!(back.verdict.retry_after_ns, 3_720 * S);
        // And a refund there lowers the stored window, not a past one.
        let r = refund(d.state, &w, 1, T0 - 3_600 * S);
        assert_eq!(
            r.state,
            Some(FixedWindowState {
                window_start_ns: T0 + 60 * S,
                count: 1
            })
        );
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let w = window(1, WINDOW_NS_MAX_TEST);
        for now in [0, 1, u64::MAX - 1, u64::MAX] {
            let d = throttle(None, &w, 1, now);
            assert!(d.verdict.allowed);
            let denied = throttle(d.state, &w, 1, now);
            assert!(!denied.verdict.allowed);
            let _ = refund(d.state, &w, u64::MAX, now);
        }
    }

    const WINDOW_NS_MAX_TEST: u64 = crate::limit::WINDOW_NS_MAX;

    fn windows() -> impl Strategy<Value = Window> {
        (
            1u64..=20,
            prop_oneof![Just(S), Just(S / 4), Just(60 * S), Just(7 * S / 3)],
        )
            .prop_map(|(limit, window_ns)| window(limit, window_ns))
    }

    /// Operations: (gap since the previous one in ns, units, is a refund).
    fn ops(back: bool) -> impl Strategy<Value = Vec<(i64, u64, bool)>> {
        let gap = if back {
            prop_oneof![8 => 0i64..2_000_000_000, 1 => -2_000_000_000i64..0].boxed()
        } else {
            (0i64..700_000_000).boxed()
        };
        prop::collection::vec((gap, 0u64..=8, prop::bool::weighted(0.15)), 1..200)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Net of refunds, no aligned window admits more than `limit`.
        #[test]
        fn admitted_never_exceeds_promise(w in windows(), seq in ops(false)) {
            let mut state = None;
            let mut now = T0;
            let mut net: HashMap<u64, i128> = HashMap::new();
            for (gap, units, is_refund) in seq {
                now += gap.unsigned_abs();
                let units = units.min(w.limit);
                let window_start = now - now % w.window_ns;
                if is_refund {
                    let d = refund(state, &w, units, now);
                    prop_assert!(d.verdict.remaining <= w.limit);
                    // What a refund really gives back: at most what this
                    // window has spent.
                    let n = net.entry(window_start).or_default();
                    *n -= i128::from(units).min(*n);
                    prop_assert_eq!(d.verdict.remaining, w.limit - u64::try_from(*n).unwrap());
                    state = d.state;
                    continue;
                }
                let d = throttle(state, &w, units, now);
                if d.verdict.allowed {
                    let n = net.entry(window_start).or_default();
                    *n += i128::from(units);
                    prop_assert!(*n <= i128::from(w.limit), "{} in window {}", n, window_start);
                    prop_assert_eq!(d.verdict.remaining, w.limit - u64::try_from(*n).unwrap());
                }
                state = d.state;
            }
        }

        /// A denial changes nothing, peek answers as throttle, and retrying
        /// exactly retry_after later (and no earlier) is admitted, whatever
        /// the clock does.
        #[test]
        fn denial_peek_and_retry(w in windows(), seq in ops(true)) {
            let mut state = None;
            let mut now = T0;
            for (gap, units, is_refund) in seq {
                now = now.saturating_add_signed(gap);
                let units = units.min(w.limit);
                if is_refund {
                    state = refund(state, &w, units, now).state;
                    continue;
                }
                let d = throttle(state, &w, units, now);
                prop_assert_eq!(peek(state, &w, units, now), d.verdict);
                prop_assert!(d.verdict.remaining <= w.limit);
                if !d.verdict.allowed {
                    prop_assert_eq!(d.state, state);
                    let retry = d.verdict.retry_after_ns;
                    prop_assert!(retry > 0);
                    prop_assert!(throttle(state, &w, units, now + retry).verdict.allowed);
                    prop_assert!(!throttle(state, &w, units, now + retry - 1).verdict.allowed);
                }
                state = d.state;
            }
        }

        /// Time only gives units back: an earlier now (a clock that stepped
        /// back) never admits more than a later one would.
        #[test]
        fn earlier_never_admits_more(w in windows(), seq in ops(true), back in 0u64..200_000_000_000, cost in 0u64..=20) {
            let mut state = None;
            let mut now = T0;
            for (gap, units, is_refund) in seq {
                now = now.saturating_add_signed(gap);
                let units = units.min(w.limit);
                state = if is_refund {
                    refund(state, &w, units, now).state
                } else {
                    throttle(state, &w, units, now).state
                };
            }
            let cost = cost.min(w.limit);
            let early = peek(state, &w, cost, now - back);
            let late = peek(state, &w, cost, now);
            prop_assert!(!early.allowed || late.allowed);
            // (`remaining` is after the request, so compare it at cost 0.)
            let early = peek(state, &w, 0, now - back);
            let late = peek(state, &w, 0, now);
            prop_assert!(early.remaining <= late.remaining);
        }
    }
}
