//! Sliding window log: the exact rolling promise. At time `t`, the units
//! admitted in `(t - W, t]` count against the limit; an admission exactly
//! `W` old has expired. So **no interval `(t - W, t]` ever holds more than
//! `limit` admitted units**, and a request is admitted whenever that would
//! stay true: no estimate, no boundary burst.
//!
//! The log records every admission. Equal timestamps are distinct
//! admissions, and a cost of `c` is `c` admissions at that instant; both are
//! stored compactly as *runs* (one instant, a number of units), so the log
//! holds one 16-byte run per distinct instant still in the window: at most
//! `limit` runs, and `limit <= SLIDING_LOG_LIMIT_MAX` bounds a key's memory
//! (1 MiB at most, 16 bytes per admission instant in practice). Storage grows
//! only when a new instant is recorded and never beyond `limit` runs; a log
//! whose admissions have all expired is equivalent to none (decisions return
//! `None`, so the store frees it).
//!
//! Refund removes the newest admissions still in the window.
//!
//! A clock that steps backward never hands out units: admissions are
//! recorded, and the window is measured, at `max(now, newest recorded)`,
//! so nothing recorded expires any earlier than it would have, and the log
//! stays in time order.

use std::collections::VecDeque;

use super::{until, Decision, Window, SLIDING_LOG_LIMIT_MAX};
use crate::gcra::Verdict;

/// A sliding log: the admissions still in the window, as runs.
///
/// Each run stores the running total of units up to and including itself
/// (wrapping), not its own units, so the units in any span of runs is one
/// subtraction and a decision is a binary search, however long the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLogState {
    /// Runs at strictly increasing instants, oldest first.
    runs: VecDeque<Run>,
    /// The running total just before the first run (wrapping): the `end` of
    /// the last run pruned.
    base: u64,
}

/// Admissions at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    /// When, ns since the epoch.
    at_ns: u64,
    /// The log's running total of units after this run (wrapping).
    end: u64,
}

/// Where the window stands at a given time.
#[derive(Clone, Copy, Debug)]
struct Look {
    /// The time the window ends at: `max(now, newest recorded)`.
    t_ns: u64,
    /// Index of the oldest run still in the window.
    first: usize,
    /// Units in the window.
    live: u64,
    /// Runs at or before this instant have expired (`t - W`); `None` while
    /// `t < W`, when nothing can be `W` old.
    cutoff_ns: Option<u64>,
}

impl Look {
    /// Whether `run` has left the window.
    #[inline]
    fn expired(&self, run: &Run) -> bool {
        self.cutoff_ns.is_some_and(|c| run.at_ns <= c)
    }
}

impl SlidingLogState {
    /// The running total before run `i`.
    #[inline]
    fn before(&self, i: usize) -> u64 {
        match i.checked_sub(1) {
            Some(j) => self.runs[j].end,
            None => self.base,
        }
    }

    /// The running total after the newest run.
    #[inline]
    fn total(&self) -> u64 {
        self.runs.back().map_or(self.base, |r| r.end)
    }

    /// The window as it stands at `now_ns`.
    #[inline]
    fn look(&self, window: &Window, now_ns: u64) -> Look {
        let t_ns = self.runs.back().map_or(now_ns, |r| r.at_ns.max(now_ns));
        let cutoff_ns = t_ns.checked_sub(window.window_ns);
        let first = match cutoff_ns {
            Some(c) => self.runs.partition_point(|r| r.at_ns <= c),
            None => 0,
        };
        let live = self.total().wrapping_sub(self.before(first));
        Look {
            t_ns,
            first,
            live,
            cutoff_ns,
        }
    }

    /// Drops the runs before `first` (expired).
    #[inline]
    fn prune(&mut self, first: usize) {
        self.base = self.before(first);
        self.runs.drain(..first);
    }

    /// Records `units` admissions at `at_ns`, which is not before the newest
    /// run. Grows the storage at most to `limit` runs.
    #[inline]
    fn record(&mut self, at_ns: u64, units: u64, limit: u64) {
        let end = self.total().wrapping_add(units);
        if let Some(back) = self.runs.back_mut() {
            if back.at_ns == at_ns {
                back.end = end;
                return;
            }
        }
        let len = self.runs.len();
        if len == self.runs.capacity() {
            // Double, as a VecDeque would, but never past the most runs the
            // window can hold.
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let target = len.saturating_mul(2).max(4).min(limit).max(len + 1);
            self.runs.reserve_exact(target - len);
        }
        self.runs.push_back(Run { at_ns, end });
    }

    /// Whether every admission has expired at `now_ns` (the log is
    /// equivalent to none and the store may drop it).
    #[inline]
    pub fn is_full(&self, window: &Window, now_ns: u64) -> bool {
        self.look(window, now_ns).live == 0
    }

    /// The runs as `(at_ns, units)`, oldest first, for snapshots and
    /// replication; [`SlidingLogState::from_runs`] rebuilds the log. May
    /// include runs that have expired but not yet been pruned.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().scan(self.base, |before, r| {
            let units = r.end.wrapping_sub(*before);
            *before = r.end;
            Some((r.at_ns, units))
        })
    }

    /// Rebuilds a log from [`SlidingLogState::runs`]. `None` (a corrupt
    /// record) unless the instants strictly increase, every run holds at
    /// least one unit, and the runs hold at most [`SLIDING_LOG_LIMIT_MAX`]
    /// units in all (no log that decisions produce holds more).
    pub fn from_runs(runs: impl IntoIterator<Item = (u64, u64)>) -> Option<SlidingLogState> {
        let mut log = SlidingLogState::default();
        let mut total = 0u64;
        for (at_ns, units) in runs {
            total = total.checked_add(units)?;
            let in_order = match log.runs.back() {
                Some(r) => r.at_ns < at_ns,
                None => true,
            };
            if units == 0 || total > SLIDING_LOG_LIMIT_MAX || !in_order {
                return None;
            }
            log.record(at_ns, units, SLIDING_LOG_LIMIT_MAX);
        }
        Some(log)
    }

    /// Bytes of heap the log holds, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.runs.capacity() * std::mem::size_of::<Run>()
    }
}

/// The verdict for `cost` at `now_ns`, and where the window stands.
#[inline]
fn decide(log: &SlidingLogState, window: &Window, cost: u64, now_ns: u64) -> (Verdict, Look) {
    let look = log.look(window, now_ns);
    let newest_expiry = |at_ns: u64| until(at_ns.saturating_add(window.window_ns), now_ns);
    let verdict = match look.live.checked_add(cost).filter(|&n| n <= window.limit) {
        Some(after) => Verdict {
            allowed: true,
            limit: window.limit,
            remaining: window.limit - after,
            retry_after_ns: 0,
            reset_after_ns: if cost > 0 {
                newest_expiry(look.t_ns)
            } else {
                log.runs
                    .back()
                    .filter(|_| look.live > 0)
                    .map_or(0, |r| newest_expiry(r.at_ns))
            },
        },
        None => {
            // Wait until the oldest `need` units in the window have expired:
            // the run at which the running count reaches `need`. Expired runs
            // and runs short of it form a prefix, so a binary search finds it.
            let need = look.live - (window.limit - cost);
            let start = log.before(look.first);
            let j = log
                .runs
                .partition_point(|r| look.expired(r) || r.end.wrapping_sub(start) < need);
            let retry_at_ns = log.runs.get(j).map_or(u64::MAX, |r| r.at_ns);
            Verdict {
                allowed: false,
                limit: window.limit,
                remaining: window.limit.saturating_sub(look.live),
                retry_after_ns: newest_expiry(retry_at_ns),
                reset_after_ns: log.runs.back().map_or(0, |r| newest_expiry(r.at_ns)),
            }
        }
    };
    (verdict, look)
}

/// Spends `cost` units at `now_ns`.
///
/// `window` must be validated (its `limit` at most
/// [`SLIDING_LOG_LIMIT_MAX`], which bounds the log) and `cost <=
/// window.limit` (checked at the edge; asserted here). A denied request
/// returns the state unchanged. Allocates only when the log records an
/// instant it has no room for.
#[inline]
pub fn throttle(
    state: Option<SlidingLogState>,
    window: &Window,
    cost: u64,
    now_ns: u64,
) -> Decision<SlidingLogState> {
    assert!(
        cost <= window.limit,
        "cost must be checked against the limit at the edge"
    );
    // An empty VecDeque does not allocate.
    let mut log = state.unwrap_or_default();
    let (verdict, look) = decide(&log, window, cost, now_ns);
    if verdict.allowed {
        log.prune(look.first);
        if cost > 0 {
            log.record(look.t_ns, cost, window.limit);
        }
    }
    // A denial returns the log untouched (and an absent log, having room
    // for any cost <= limit, is never denied).
    let state = (!log.runs.is_empty()).then_some(log);
    Decision { verdict, state }
}

/// Answers as [`throttle`] would, changing nothing.
#[inline]
pub fn peek(state: Option<&SlidingLogState>, window: &Window, cost: u64, now_ns: u64) -> Verdict {
    match state {
        Some(log) => decide(log, window, cost, now_ns).0,
        None => decide(&SlidingLogState::default(), window, cost, now_ns).0,
    }
}

/// Gives `units` back by removing the newest admissions still in the
/// window (saturating: refunding more than the window holds empties it).
/// The verdict is what a cost-0 [`peek`] says afterwards.
pub fn refund(
    state: Option<SlidingLogState>,
    window: &Window,
    units: u64,
    now_ns: u64,
) -> Decision<SlidingLogState> {
    let mut log = state.unwrap_or_default();
    let look = log.look(window, now_ns);
    log.prune(look.first);
    let mut units = units;
    while units > 0 {
        let Some(back) = log.runs.back().copied() else {
            break;
        };
        let run_units = back.end.wrapping_sub(log.before(log.runs.len() - 1));
        if run_units <= units {
            log.runs.pop_back();
            units -= run_units;
        } else {
            if let Some(b) = log.runs.back_mut() {
                b.end = back.end.wrapping_sub(units);
            }
            units = 0;
        }
    }
    let state = (!log.runs.is_empty()).then_some(log);
    Decision {
        verdict: peek(state.as_ref(), window, 0, now_ns),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::fixed_window;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    /// A multiple of a minute.
    const T0: u64 = 1_700_000_040 * S;

    fn window(limit: u64, window_ns: u64) -> Window {
        Window::new(limit, window_ns).unwrap()
    }

    /// 100 at 59.9 s and 100 more at 60.1 s: a fixed window (edge at 60 s)
    /// admits all 200; the log, for which 59.9 s is inside (0.1 s, 60.1 s],
    /// admits none of the second hundred.
    #[test]
    fn no_burst_across_a_window_edge() {
        let w = window(100, 60 * S);
        let (mut log, mut fixed) = (None, None);
        for _ in 0..100 {
            let d = throttle(log, &w, 1, T0 + 59_900 * MS);
            assert!(d.verdict.allowed);
            log = d.state;
            fixed = fixed_window::throttle(fixed, &w, 1, T0 + 59_900 * MS).state;
        }
        assert_eq!(log.as_ref().map(|l| l.runs.len()), Some(1), "one run");
        for _ in 0..100 {
            let d = throttle(log.clone(), &w, 1, T0 + 60_100 * MS);
            assert!(!d.verdict.allowed);
            assert_eq!(d.state, log);
            assert_eq!(d.verdict.retry_after_ns, 59_800 * MS);
            let f = fixed_window::throttle(fixed, &w, 1, T0 + 60_100 * MS);
            assert!(f.verdict.allowed, "the fixed window's boundary burst");
            fixed = f.state;
        }
    }

    /// An admission exactly W old has expired; one nanosecond younger has not.
    #[test]
    fn expiry_is_exactly_w() {
        let w = window(1, 60 * S);
        let d = throttle(None, &w, 1, 0);
        assert!(d.verdict.allowed);
        assert_eq!(d.verdict.reset_after_ns, 60 * S);
        let denied = throttle(d.state.clone(), &w, 1, 59_999 * MS);
        assert!(!denied.verdict.allowed);
        assert_eq!(denied.verdict.retry_after_ns, MS);
        let later = throttle(d.state, &w, 1, 60_000 * MS);
        assert!(later.verdict.allowed);
        assert_eq!(
            later.state.map(|l| l.runs().collect::<Vec<_>>()),
            Some(vec![(60 * S, 1)])
        );
    }

    #[test]
    fn equal_instants_are_distinct_admissions() {
        let w = window(5, S);
        let d = throttle(None, &w, 2, T0);
        let d = throttle(d.state, &w, 3, T0);
        assert!(d.verdict.allowed);
        assert_eq!(d.verdict.remaining, 0);
        let log = d.state.unwrap();
        assert_eq!(log.runs().collect::<Vec<_>>(), vec![(T0, 5)]);
        assert!(
            !throttle(Some(log.clone()), &w, 1, T0 + S - 1)
                .verdict
                .allowed
        );
        assert!(throttle(Some(log), &w, 5, T0 + S).verdict.allowed);
    }

    #[test]
    fn retry_waits_for_the_oldest_units_needed() {
        let w = window(4, 10 * S);
        let mut log = None;
        for (t, cost) in [(0, 1), (2, 2), (5, 1)] {
            log = throttle(log, &w, cost, T0 + t * S).state;
        }
        // Full at 6 s. Cost 1 waits for the run at 0 (expires at 10 s);
        // cost 3 for the runs at 0 and 2 (12 s); cost 4 for all (15 s).
        for (cost, retry_s) in [(1, 4), (2, 6), (3, 6), (4, 9)] {
            let v = peek(log.as_ref(), &w, cost, T0 + 6 * S);
            assert!(!v.allowed);
            assert_eq!(v.retry_after_ns, retry_s * S, "cost {cost}");
            assert_eq!(v.reset_after_ns, 9 * S);
        }
    }

    #[test]
    fn refund_removes_the_newest() {
        let w = window(10, 10 * S);
        let mut log = None;
        for (t, cost) in [(0, 3), (1, 3), (2, 3)] {
            log = throttle(log, &w, cost, T0 + t * S).state;
        }
        let r = refund(log, &w, 4, T0 + 3 * S);
        assert_eq!(r.verdict.remaining, 5);
        let kept: Vec<_> = r.state.as_ref().unwrap().runs().collect();
        assert_eq!(kept, vec![(T0, 3), (T0 + S, 2)]);
        let r = refund(r.state, &w, 100, T0 + 3 * S);
        assert_eq!((r.state, r.verdict.remaining), (None, 10));
        assert_eq!(refund(None, &w, 1, T0).state, None);
    }

    #[test]
    fn clock_stepping_back_records_at_the_newest() {
        let w = window(2, 10 * S);
        let d = throttle(None, &w, 1, T0 + 5 * S);
        // The clock steps back 100 s: measured and recorded at T0 + 5 s.
        let d = throttle(d.state, &w, 1, T0 - 95 * S);
        assert!(d.verdict.allowed);
        assert_eq!(
            d.state.as_ref().unwrap().runs().collect::<Vec<_>>(),
            vec![(T0 + 5 * S, 2)]
        );
        let denied = throttle(d.state.clone(), &w, 1, T0 - 95 * S);
        assert!(!denied.verdict.allowed);
        assert_eq!(denied.verdict.retry_after_ns, 110 * S);
    }

    #[test]
    fn memory_is_bounded_by_the_limit() {
        let w = window(10, S);
        let mut log = None;
        for t in 0..1_000 {
            log = throttle(log, &w, 1, T0 + t * S / 50).state;
            let l = log.as_ref().unwrap();
            assert!(l.runs.len() <= 10 && l.runs.capacity() <= 10);
        }
        assert_eq!(log.unwrap().heap_bytes(), 10 * 16);
        let w = window(3, S);
        let mut log = None;
        for t in 0..10 {
            log = throttle(log, &w, 1, T0 + t * S / 3).state;
        }
        assert!(log.unwrap().runs.capacity() <= 3);
    }

    #[test]
    fn runs_round_trip_and_corrupt_runs_are_refused() {
        let w = window(100, S);
        let mut log = None;
        for (t, cost) in [(0, 5), (1, 7), (9, 1)] {
            log = throttle(log, &w, cost, T0 + t).state;
        }
        let log = log.unwrap();
        let runs: Vec<_> = log.runs().collect();
        assert_eq!(runs, vec![(T0, 5), (T0 + 1, 7), (T0 + 9, 1)]);
        let back = SlidingLogState::from_runs(runs).unwrap();
        assert_eq!(
            back.runs().collect::<Vec<_>>(),
            log.runs().collect::<Vec<_>>()
        );
        assert_eq!(
            peek(Some(&back), &w, 1, T0 + 10),
            peek(Some(&log), &w, 1, T0 + 10)
        );
        assert!(SlidingLogState::from_runs([(2, 1), (1, 1)]).is_none());
        assert!(SlidingLogState::from_runs([(1, 1), (1, 1)]).is_none());
        assert!(SlidingLogState::from_runs([(1, 0)]).is_none());
        assert!(SlidingLogState::from_runs([(1, SLIDING_LOG_LIMIT_MAX + 1)]).is_none());
        assert!(SlidingLogState::from_runs([(1, u64::MAX), (2, 1)]).is_none());
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let w = window(SLIDING_LOG_LIMIT_MAX, crate::limit::WINDOW_NS_MAX);
        for now in [0, 1, u64::MAX - 1, u64::MAX] {
            let d = throttle(None, &w, w.limit, now);
            assert!(d.verdict.allowed);
            let denied = throttle(d.state.clone(), &w, 1, now);
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

    /// Units of `admitted` in `(t - W, t]`.
    fn in_window(admitted: &[(u64, u64)], w: &Window, t: u64) -> u64 {
        admitted
            .iter()
            .filter(|&&(at, _)| at <= t && at + w.window_ns > t)
            .map(|&(_, n)| n)
            .sum()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Exactness: a request is admitted iff the units still standing in
        /// `(now - W, now]`, plus its cost, fit the limit, and `remaining` is
        /// what is left; so no such interval ever holds more than `limit`.
        /// Refunded units are removed newest first and no longer count.
        #[test]
        fn admitted_is_exactly_the_promise(w in windows(), seq in ops(false)) {
            let mut state = None;
            let mut now = T0;
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (gap, units, is_refund) in seq {
                now += gap.unsigned_abs();
                let units = units.min(w.limit);
                if is_refund {
                    let d = refund(state, &w, units, now);
                    let mut left = units;
                    while left > 0 {
                        match admitted.last_mut() {
                            Some((at, n)) if *at + w.window_ns > now => {
                                let take = left.min(*n);
                                *n -= take;
                                left -= take;
                                if *n == 0 {
                                    admitted.pop();
                                }
                            }
                            _ => break,
                        }
                    }
                    prop_assert_eq!(d.verdict.remaining, w.limit - in_window(&admitted, &w, now));
                    state = d.state;
                    continue;
                }
                let standing = in_window(&admitted, &w, now);
                let d = throttle(state, &w, units, now);
                prop_assert_eq!(d.verdict.allowed, standing + units <= w.limit);
                if d.verdict.allowed {
                    admitted.push((now, units));
                    prop_assert_eq!(d.verdict.remaining, w.limit - standing - units);
                } else {
                    prop_assert_eq!(d.verdict.remaining, w.limit - standing);
                }
                let runs = d.state.as_ref().map_or(0, |l| l.runs.len());
                prop_assert!(runs as u64 <= w.limit);
                state = d.state;
            }
        }

        /// With a clock that only ever steps backward (readings are true time
        /// minus a growing offset), no interval of true time of length W
        /// holds more than `limit` admitted units: the step grants nothing.
        #[test]
        fn clock_stepping_back_grants_nothing(w in windows(), seq in ops(false), steps in prop::collection::vec(0u64..3_000_000_000, 200)) {
            let mut state = None;
            let (mut true_ns, mut offset_ns) = (T0, 0u64);
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for ((gap, units, _), step) in seq.into_iter().zip(steps) {
                true_ns += gap.unsigned_abs();
                if step < 300_000_000 {
                    offset_ns += step * 10;
                }
                let d = throttle(state, &w, units.min(w.limit), true_ns - offset_ns);
                if d.verdict.allowed {
                    admitted.push((true_ns, units.min(w.limit)));
                    prop_assert!(in_window(&admitted, &w, true_ns) <= w.limit);
                }
                state = d.state;
            }
        }

        /// A denial changes nothing, peek answers as throttle, and retrying
        /// exactly retry_after later (and no earlier) is admitted, whatever
        /// the clock does.
        #[test]
        fn denial_peek_and_retry(w in windows(), seq in ops(true)) {
            let mut state: Option<SlidingLogState> = None;
            let mut now = T0;
            for (gap, units, is_refund) in seq {
                now = now.saturating_add_signed(gap);
                let units = units.min(w.limit);
                if is_refund {
                    let d = refund(state, &w, units, now);
                    prop_assert!(d.verdict.remaining <= w.limit);
                    state = d.state;
                    continue;
                }
                let d = throttle(state.clone(), &w, units, now);
                prop_assert_eq!(peek(state.as_ref(), &w, units, now), d.verdict);
                if !d.verdict.allowed {
                    prop_assert_eq!(&d.state, &state);
                    let retry = d.verdict.retry_after_ns;
                    prop_assert!(retry > 0);
                    prop_assert!(throttle(state.clone(), &w, units, now + retry).verdict.allowed);
                    prop_assert!(!throttle(state.clone(), &w, units, now + retry - 1).verdict.allowed);
                }
                state = d.state;
                // Never corrupted: in time order, no empty run, within the limit.
                if let Some(log) = &state {
                    prop_assert!(SlidingLogState::from_runs(log.runs()).is_some());
                    prop_assert!(log.runs().map(|(_, n)| n).sum::<u64>() <= w.limit);
                }
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
            let early = peek(state.as_ref(), &w, cost, now - back);
            let late = peek(state.as_ref(), &w, cost, now);
            prop_assert!(!early.allowed || late.allowed);
            // (`remaining` is after the request, so compare it at cost 0.)
            let early = peek(state.as_ref(), &w, 0, now - back);
            let late = peek(state.as_ref(), &w, 0, now);
            prop_assert!(early.remaining <= late.remaining);
        }
    }
}
