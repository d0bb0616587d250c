//! Sliding window counter: a rolling window estimated from two counters.
//! Windows are aligned to multiples of `W = window_ns` since the Unix epoch
//! ([`Window::aligned_start_ns`]); the rolling window ending
//! now overlaps the previous aligned window by `(W - e) / W`, where `e` is
//! the time elapsed in the current one, so the estimate of units spent in
//! the last `W` is
//!
//! ```text
//! estimate = prev x (W - e) / W + cur
//! ```
//!
//! and a request of cost `c` is admitted iff `estimate + c <= limit`,
//! compared exactly in integers (`prev x (W - e) + (cur + c) x W <=
//! limit x W`, in a `u128`): no floats, no rounding.
//!
//! **What it promises** (net of refunds; `prev` and `cur` are the units
//! admitted in the previous and the current aligned window):
//!
//! 1. At every admission, `prev x (W - e) / W + cur <= limit`, exactly.
//! 2. Hence never more than `limit` units within one aligned window.
//! 3. In any interval of length `W` (`(t - W, t]`), at most
//!    `limit + prev x e / W` units, which is at most `2 x limit - 1`. That
//!    bound is reached only when the previous window's units all came at its
//!    very end, where the estimate (which assumes they were spread evenly) is
//!    most wrong; when traffic is steady, the estimate is close to the truth.
//!    Use [`sliding_log`](super::sliding_log) when the rolling promise must
//!    be exact.
//!
//! A consequence of the exact comparison: with `limit = 1`, a window after
//! one that admitted a unit admits nothing (the estimate stays above 0
//! until the window's last nanosecond has passed).
//!
//! The state is the current window's start and both counters (24 bytes);
//! a state whose counters have both aged out is equivalent to none. Refund
//! lowers the current window's counter, saturating at 0.
//!
//! A clock that steps backward within a window makes `e` smaller, which
//! weighs `prev` more: the estimate only grows. A step back across a window
//! edge keeps the stored window current, with `e = 0`. Neither grants units.

use super::{saturate, until, Decision, Window};
use crate::gcra::Verdict;

/// A sliding counter's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C)]
pub struct SlidingCounterState {
    /// Start of the aligned window `cur` counts, ns since the epoch; a
    /// multiple of `window_ns`.
    pub window_start_ns: u64,
    /// Units admitted in the aligned window before it (net of refunds).
    pub prev: u64,
    /// Units admitted in this window (net of refunds).
    pub cur: u64,
}

impl SlidingCounterState {
    /// Whether the state is equivalent to none at `now_ns` (both counters
    /// have aged out), so the store may drop it.
    #[inline]
    pub fn is_full(&self, window: &Window, now_ns: u64) -> bool {
        let at = current(Some(*self), window, now_ns);
        at.prev == 0 && at.cur == 0
    }
}

/// The counters as they stand at a given time.
#[derive(Clone, Copy, Debug)]
struct Current {
    /// Start of the window that is current.
    start_ns: u64,
    /// Time elapsed in it, `0..W`.
    elapsed_ns: u64,
    /// Units of the window before.
    prev: u64,
    /// Units of this window.
    cur: u64,
}

/// The window that is current at `now_ns` for this state, rolled forward if
/// time has moved on. A stored window later than now's (the clock stepped
/// back) stays current, at `e = 0`, the most conservative estimate.
#[inline]
fn current(state: Option<SlidingCounterState>, window: &Window, now_ns: u64) -> Current {
    let aligned_ns = window.aligned_start_ns(now_ns);
    let fresh = |prev| Current {
        start_ns: aligned_ns,
        elapsed_ns: now_ns - aligned_ns,
        prev,
        cur: 0,
    };
    match state {
        Some(s) if s.window_start_ns >= aligned_ns => Current {
            start_ns: s.window_start_ns,
            elapsed_ns: now_ns.saturating_sub(s.window_start_ns),
            prev: s.prev,
            cur: s.cur,
        },
        Some(s) if s.window_start_ns.checked_add(window.window_ns) == Some(aligned_ns) => {
            fresh(s.cur)
        }
        _ => fresh(0),
    }
}

impl Current {
    /// `prev x (W - e)`: the previous window's weight, scaled by `W`.
    #[inline]
    fn prev_weight(&self, window: &Window) -> u128 {
        u128::from(self.prev) * u128::from(window.window_ns - self.elapsed_ns)
    }

    /// Whether `cost` more fits: `prev x (W - e) + (cur + cost) x W <= limit x W`.
    #[inline]
    fn admits(&self, window: &Window, cost: u64) -> bool {
        let w = u128::from(window.window_ns);
        self.prev_weight(window) + (u128::from(self.cur) + u128::from(cost)) * w
            <= u128::from(window.limit) * w
    }

    /// The largest cost that fits now: `limit - cur - ceil(prev x (W - e) / W)`.
    #[inline]
    fn remaining(&self, window: &Window) -> u64 {
        let w = u128::from(window.window_ns);
        let room = (u128::from(window.limit) * w).saturating_sub(self.prev_weight(window)) / w;
        saturate(room.saturating_sub(u128::from(self.cur)))
    }

    /// Time until every unit is back: `cur` weighs nothing once the window
    /// after this one has passed, `prev` once this one has.
    #[inline]
    fn reset_after_ns(&self, window: &Window, now_ns: u64) -> u64 {
        let windows = if self.cur > 0 {
            2
        } else if self.prev > 0 {
            1
        } else {
            return 0;
        };
        let end = u128::from(self.start_ns) + windows * u128::from(window.window_ns);
        until(saturate(end), now_ns)
    }

    /// Time until a request of `cost` is admitted, if nothing else happens.
    /// Exact: at that instant it is admitted, one nanosecond before it is not.
    fn retry_after_ns(&self, window: &Window, cost: u64, now_ns: u64) -> u64 {
        let w = u128::from(window.window_ns);
        let limit = u128::from(window.limit);
        let cost = u128::from(cost);
        let cur = u128::from(self.cur);
        // Later in this window: prev x (W - e') <= (limit - cur - cost) x W.
        // With prev = 0 this would have been admitted already.
        let in_window = (limit >= cur + cost && self.prev > 0)
            .then(|| (limit - cur - cost) * w / u128::from(self.prev))
            .filter(|&k| k > 0)
            .map(|k| w - k);
        let at = match in_window {
            Some(e) => u128::from(self.start_ns) + e,
            // Next window: prev' = cur, so cur x (W - e') <= (limit - cost) x W;
            // e' = W is the start of the window after, where prev' is 0 and
            // any cost <= limit fits.
            None => {
                // cur = 0: nothing weighs on the next window, k = W.
                let k = ((limit - cost) * w)
                    .checked_div(cur)
                    .map_or(w, |k| k.min(w));
                u128::from(self.start_ns) + w + (w - k)
            }
        };
        until(saturate(at), now_ns)
    }
}

/// Spends `cost` units at `now_ns`.
///
/// `window` must be validated and `cost <= window.limit` (checked at the
/// edge; asserted here). A denied request returns the state unchanged.
#[inline]
pub fn throttle(
    state: Option<SlidingCounterState>,
    window: &Window,
    cost: u64,
    now_ns: u64,
) -> Decision<SlidingCounterState> {
    assert!(
        cost <= window.limit,
        "cost must be checked against the limit at the edge"
    );
    let mut at = current(state, window, now_ns);
    if at.admits(window, cost) {
        // admits() implies cur + cost <= limit: no overflow.
        at.cur += cost;
        let verdict = Verdict {
            allowed: true,
            limit: window.limit,
            remaining: at.remaining(window),
            retry_after_ns: 0,
            reset_after_ns: at.reset_after_ns(window, now_ns),
        };
        Decision {
            verdict,
            state: stored(&at),
        }
    } else {
        let verdict = Verdict {
            allowed: false,
            limit: window.limit,
            remaining: at.remaining(window),
            retry_after_ns: at.retry_after_ns(window, cost, now_ns),
            reset_after_ns: at.reset_after_ns(window, now_ns),
        };
        Decision { verdict, state }
    }
}

/// The state to store for these counters: none if both are 0.
#[inline]
fn stored(at: &Current) -> Option<SlidingCounterState> {
    (at.prev > 0 || at.cur > 0).then_some(SlidingCounterState {
        window_start_ns: at.start_ns,
        prev: at.prev,
        cur: at.cur,
    })
}

/// Answers as [`throttle`] would, changing nothing.
#[inline]
pub fn peek(
    state: Option<SlidingCounterState>,
    window: &Window,
    cost: u64,
    now_ns: u64,
) -> Verdict {
    throttle(state, window, cost, now_ns).verdict
}

/// Gives `units` back to the current window (`cur` goes down, saturating
/// at 0; `prev` is the past and stays). The verdict is what a cost-0
/// [`peek`] says afterwards.
#[inline]
pub fn refund(
    state: Option<SlidingCounterState>,
    window: &Window,
    units: u64,
    now_ns: u64,
) -> Decision<SlidingCounterState> {
    let mut at = current(state, window, now_ns);
    at.cur = at.cur.saturating_sub(units);
    let state = stored(&at);
    Decision {
        verdict: peek(state, window, 0, now_ns),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;
    /// A multiple of a minute.
    const T0: u64 = 1_700_000_040 * S;

    fn window(limit: u64, window_ns: u64) -> Window {
        Window::new(limit, window_ns).unwrap()
    }

    #[test]
    fn previous_window_is_weighted_by_overlap() {
        let w = window(10, 60 * S);
        let d = throttle(None, &w, 10, T0 + 30 * S);
        assert!(d.verdict.allowed);
        assert_eq!(d.verdict.remaining, 0);
        assert_eq!(d.verdict.reset_after_ns, 90 * S);
        // 15 s into the next window, 3/4 of the previous window's 10 count.
        let t = T0 + 75 * S;
        assert_eq!(peek(d.state, &w, 0, t).remaining, 2);
        let d2 = throttle(d.state, &w, 2, t);
        assert!(d2.verdict.allowed);
        assert_eq!(
            d2.state,
            Some(SlidingCounterState {
                window_start_ns: T0 + 60 * S,
                prev: 10,
                cur: 2
            })
        );
        let denied = throttle(d2.state, &w, 1, t);
        assert!(!denied.verdict.allowed);
        assert_eq!(denied.state, d2.state);
        // 10 x (60 - e) / 60 + 3 <= 10 first holds at e = 18 s.
        assert_eq!(denied.verdict.retry_after_ns, 3 * S);
        assert!(!throttle(d2.state, &w, 1, t + 3 * S - 1).verdict.allowed);
        assert!(throttle(d2.state, &w, 1, t + 3 * S).verdict.allowed);
        // Two windows on, nothing is left: no state.
        assert_eq!(throttle(d2.state, &w, 0, T0 + 180 * S).state, None);
        assert!(d2.state.unwrap().is_full(&w, T0 + 180 * S));
        assert!(!d2.state.unwrap().is_full(&w, T0 + 180 * S - 1));
    }

    /// The worst case of promise 3: `2 x limit - 1` within one window length.
    #[test]
    fn bunched_previous_window_reaches_two_limits_minus_one() {
        let w = window(10, 60 * S);
        let d = throttle(None, &w, 10, T0 + 60 * S - 1);
        assert!(d.verdict.allowed);
        let mut state = d.state;
        let mut admitted = 10;
        for _ in 0..20 {
            let d = throttle(state, &w, 1, T0 + 120 * S - 2);
            admitted += u64::from(d.verdict.allowed);
            state = d.state;
        }
        // Both instants lie in (T0 + 60 s - 2 ns, T0 + 120 s - 2 ns].
        assert_eq!(admitted, 19);
    }

    #[test]
    fn limit_one_blocks_the_next_window() {
        let w = window(1, S);
        let d = throttle(None, &w, 1, T0);
        let denied = throttle(d.state, &w, 1, T0 + S + S / 2);
        assert!(!denied.verdict.allowed);
        assert_eq!(denied.verdict.retry_after_ns, S / 2);
        assert!(throttle(d.state, &w, 1, T0 + 2 * S).verdict.allowed);
    }

    #[test]
    fn refund_and_clock_steps() {
        let w = window(4, S);
        let d = throttle(None, &w, 4, T0 + S / 2);
        let r = refund(d.state, &w, 3, T0 + S / 2);
        assert_eq!(r.verdict.remaining, 3);
        assert_eq!(refund(r.state, &w, 9, T0).state, None);
        // Back across the edge: the stored window stays current at e = 0.
        let next = throttle(d.state, &w, 2, T0 + S + S / 2);
        assert!(next.verdict.allowed, "half of prev's 4, plus 2");
        let back = throttle(next.state, &w, 1, T0 + S / 2);
        assert!(!back.verdict.allowed);
        assert_eq!(back.state, next.state);
        assert_eq!(back.verdict.remaining, 0);
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let w = window(crate::limit::WINDOW_LIMIT_MAX, crate::limit::WINDOW_NS_MAX);
        for now in [0, 1, u64::MAX - 1, u64::MAX] {
            let d = throttle(None, &w, w.limit, now);
            assert!(d.verdict.allowed);
            let denied = throttle(d.state, &w, w.limit, now);
            assert!(!denied.verdict.allowed);
            let _ = refund(d.state, &w, u64::MAX, now);
        }
    }

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
            prop_oneof![0i64..1_000, 0i64..700_000_000].boxed()
        };
        prop::collection::vec((gap, 0u64..=8, prop::bool::weighted(0.15)), 1..200)
    }

    /// Net units (admitted minus refunded) of events with time in `range`.
    fn net(events: &[(u64, i128)], range: impl std::ops::RangeBounds<u64>) -> i128 {
        events
            .iter()
            .filter(|(t, _)| range.contains(t))
            .map(|&(_, n)| n)
            .sum()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// The three promises of the module doc, checked at every admission
        /// against the history (net of refunds).
        #[test]
        fn admitted_never_exceeds_promise(w in windows(), seq in ops(false)) {
            let mut state = None;
            let mut now = T0;
            let mut events: Vec<(u64, i128)> = Vec::new();
            let limit = i128::from(w.limit);
            let wns = w.window_ns;
            for (gap, units, is_refund) in seq {
                now += gap.unsigned_abs();
                let units = units.min(w.limit);
                let start = now - now % wns;
                if is_refund {
                    let d = refund(state, &w, units, now);
                    prop_assert!(d.verdict.remaining <= w.limit);
                    // What a refund really gives back: at most what this
                    // window has spent.
                    let spent = net(&events, start..=now);
                    events.push((now, -i128::from(units).min(spent)));
                    state = d.state;
                    continue;
                }
                let d = throttle(state, &w, units, now);
                state = d.state;
                if !d.verdict.allowed {
                    continue;
                }
                events.push((now, i128::from(units)));
                let e = i128::from(now - start);
                let prev = net(&events, start - wns..start);
                let cur = net(&events, start..=now);
                // 1. The estimate, exactly.
                prop_assert!(prev * (i128::from(wns) - e) + cur * i128::from(wns) <= limit * i128::from(wns));
                // 2. Per aligned window.
                prop_assert!(cur <= limit);
                // 3. Any interval of length W ending now.
                let rolling = net(&events, now - wns + 1..=now);
                // At most 2 x limit - 1.
                prop_assert!(rolling < 2 * limit, "{} in a window", rolling);
                prop_assert!(rolling * i128::from(wns) <= limit * i128::from(wns) + prev * e);
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
                if d.verdict.allowed {
                    prop_assert!(units + d.verdict.remaining <= w.limit);
                } else {
                    prop_assert_eq!(d.state, state);
                    let retry = d.verdict.retry_after_ns;
                    prop_assert!(retry > 0);
                    prop_assert!(throttle(state, &w, units, now + retry).verdict.allowed);
                    prop_assert!(!throttle(state, &w, units, now + retry - 1).verdict.allowed);
                }
                // remaining is exactly the largest cost admitted now.
                let r = d.verdict.remaining;
                if r < w.limit {
                    prop_assert!(!peek(d.state, &w, r + 1, now).allowed);
                }
                // (After a step back even cost 0 may be denied: remaining 0.)
                if r > 0 {
                    prop_assert!(peek(d.state, &w, r, now).allowed);
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
