//! The drill's judge: from the calls a client made on one key and what it
//! was told, how many units a *correct* limiter with the key's policy could
//! not have admitted (over-admission), and how many denials a correct
//! limiter would surely have admitted (under-admission). Pure functions of
//! the recorded times; the servers' own counters play no part.
//!
//! A call is known only by when it was sent (`send_ns`) and when its answer
//! came (`recv_ns`): the decision happened at some instant in between. The
//! judge never guesses that instant; it takes whichever end makes its claim
//! safe, so that every unit it reports is one no schedule of decision times
//! could explain:
//!
//! - **Over-admission** replays the admissions through a *lenient* shadow
//!   of the policy: each admission is checked as late as possible (at
//!   `recv_ns`, when the most has refilled or expired) and charged as early
//!   as possible (at `send_ns`, so it leaves windows and leases soonest). An
//!   admission even that shadow must refuse is over-admitted; it is counted
//!   and not charged (so one lost bucket is counted once, not again on
//!   every later admission). The replay needs an order of decisions, which
//!   the times alone do not give when windows overlap: it is run twice, in
//!   the order the calls were sent (right when answers were held back after
//!   their decision: replies wait in order behind a slow one on a
//!   connection) and in the order their answers came (right when a decision
//!   came late in its window: a call held by a paused entry node, or sent
//!   again after a refusal), and for each episode (over events no more than
//!   2 s apart) the reading that finds fewer units over is the verdict.
//!   With short windows (every call answered within a millisecond) both
//!   orders are the same. For a token bucket
//!   that is exactly the bound `B + R x T` on every interval of length `T`;
//!   for a sliding log, at most `N` in any interval of length `W`; for a
//!   fixed window, at most `N` per aligned window; for a sliding counter,
//!   its estimate `prev x (W - e) / W + cur <= N` (hence at most `N` per
//!   aligned window); for concurrency, at most `N` leases held at once
//!   (the drill never releases: a lease is held for its whole lease time).
//! - **Under-admission** checks each denial against a *strict* shadow: the
//!   history is every call that may have been applied (every admission, by
//!   the store or a fallback, and every call whose outcome is unknown), each
//!   charged as late as possible, and the denial is checked as early as
//!   possible (at `send_ns`). A denial that shadow would still have admitted
//!   is under-admitted: a correct limiter, having admitted everything the
//!   client saw admitted, had room for it; the shadow then charges it, as
//!   that limiter would have.

use std::collections::{BTreeMap, VecDeque};

use sluice_protocol::limit::{Concurrency, Window};
use sluice_protocol::{Limit, Policy};

/// One call on a key, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// When it was sent (ns since the Unix epoch).
    pub send_ns: u64,
    /// When its verdict came.
    pub recv_ns: u64,
    /// Units asked for.
    pub cost: u64,
    /// The verdict said allowed.
    pub allowed: bool,
    /// The store decided it (not a fallback).
    pub store: bool,
    /// The store may have applied it though the client was not told (a
    /// deadline passed or the connection dropped).
    pub maybe_applied: bool,
    /// The caller got a verdict (the store's or a fallback's); `false` for
    /// an error, which is no denial (nothing a client was refused by a
    /// limit) and, unless `maybe_applied`, no spend either.
    pub verdict: bool,
}

/// What the judge found on one key: each event is `(ns, units)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Store admissions beyond the policy (the replication promise).
    pub over: Vec<(u64, u64)>,
    /// Admissions from any source beyond the policy (what the gateway let
    /// through, fallbacks included).
    pub over_with_fallback: Vec<(u64, u64)>,
    /// Denials (from any source) a correct limiter would have admitted.
    pub under: Vec<(u64, u64)>,
}

/// Judges the calls on one key under `limit`. `calls` may be in any order.
pub fn audit(limit: &Limit, calls: &[Call]) -> Findings {
    let mut by_send: Vec<Call> = calls.to_vec();
    by_send.sort_by_key(|c| (c.send_ns, c.recv_ns));
    let mut by_recv: Vec<&Call> = by_send.iter().collect();
    by_recv.sort_by_key(|c| (c.recv_ns, c.send_ns));
    let over = fewest(
        lenient(limit, by_send.iter().filter(|c| c.allowed && c.store)),
        lenient(
            limit,
            by_recv.iter().copied().filter(|c| c.allowed && c.store),
        ),
    );
    let over_with_fallback = fewest(
        lenient(limit, by_send.iter().filter(|c| c.allowed)),
        lenient(limit, by_recv.iter().copied().filter(|c| c.allowed)),
    );
    let under = strict(limit, &by_send);
    Findings {
        over,
        over_with_fallback,
        under,
    }
}

/// Events of two readings closer than this (in either) belong to one
/// episode (a fault's disturbance), judged as a whole.
const EPISODE_GAP_NS: u64 = 2_000_000_000;

/// Of two readings of the same admissions, episode by episode, the one
/// that finds fewer units over: each is the replay of one decision order
/// the calls' windows allow, so the judge keeps whichever explains more
/// (per episode: one fault may hold answers back, another decide late).
fn fewest(a: Vec<(u64, u64)>, b: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64, bool)> = a
        .iter()
        .map(|&(at, units)| (at, units, false))
        .chain(b.iter().map(|&(at, units)| (at, units, true)))
        .collect();
    all.sort_by_key(|e| e.0);
    let mut out = Vec::new();
    let mut start = 0;
    while start < all.len() {
        let mut end = start + 1;
        while end < all.len() && all[end].0 - all[end - 1].0 <= EPISODE_GAP_NS {
            end += 1;
        }
        let episode = &all[start..end];
        let units =
            |second: bool| -> u64 { episode.iter().filter(|e| e.2 == second).map(|e| e.1).sum() };
        let second = units(true) < units(false);
        out.extend(
            episode
                .iter()
                .filter(|e| e.2 == second)
                .map(|&(at, units, _)| (at, units)),
        );
        start = end;
    }
    out
}

/// The over-admitted admissions among `admitted`, replayed in the order
/// given.
fn lenient<'a>(limit: &Limit, admitted: impl Iterator<Item = &'a Call>) -> Vec<(u64, u64)> {
    let mut shadow = Shadow::new(limit);
    admitted
        .filter(|c| !shadow.lenient_admit(c))
        .map(|c| (c.recv_ns, c.cost))
        .collect()
}

/// The denials (of `by_send`, in send order) a correct limiter would surely
/// have admitted.
fn strict(limit: &Limit, by_send: &[Call]) -> Vec<(u64, u64)> {
    let history: Vec<&Call> = by_send
        .iter()
        .filter(|c| c.allowed || c.maybe_applied)
        .collect();
    let mut shadow = Shadow::new(limit);
    let mut next = 0;
    // Everything sent before the latest answer seen so far may have been
    // decided before the denial at hand: a superset, which only makes the
    // claim safer.
    let mut horizon = 0;
    let mut out = Vec::new();
    for d in by_send.iter().filter(|c| !c.allowed && c.verdict) {
        horizon = horizon.max(d.recv_ns);
        while next < history.len() && history[next].send_ns < horizon {
            shadow.strict_note(history[next]);
            next += 1;
        }
        if shadow.strict_would_admit(d) {
            out.push((d.recv_ns, d.cost));
            // A correct limiter would have spent it: the denials after it
            // are judged against that.
            shadow.strict_note(d);
        }
    }
    out
}

/// A shadow limiter: the lenient and the strict reading of one policy.
#[derive(Debug)]
enum Shadow {
    /// GCRA as a theoretical arrival time, in ns (as f64, exact enough:
    /// the drill's times are within hours of each other).
    Bucket {
        /// Nanoseconds per unit.
        t: f64,
        /// Nanoseconds of burst: `burst x t`.
        bt: f64,
        /// The theoretical arrival time, relative to `base`.
        tat: f64,
        base: u64,
    },
    /// Units per aligned window index.
    Fixed { w: Window, per: BTreeMap<u64, u64> },
    /// Like `Fixed`, judged by the sliding counter's estimate.
    Counter { w: Window, per: BTreeMap<u64, u64> },
    /// Charged `(send, recv, units)` entries that may still be in the
    /// window.
    Log {
        w: Window,
        live: VecDeque<(u64, u64, u64)>,
    },
    /// Charged leases `(send, recv, units)` that may still be held.
    Leases {
        c: Concurrency,
        live: VecDeque<(u64, u64, u64)>,
    },
}

impl Shadow {
    fn new(limit: &Limit) -> Shadow {
        match *limit {
            Limit::TokenBucket(Policy {
                count,
                period_ns,
                burst,
            }) => {
                let t = period_ns as f64 / count as f64;
                Shadow::Bucket {
                    t,
                    bt: burst as f64 * t,
                    tat: f64::NEG_INFINITY,
                    base: 0,
                }
            }
            Limit::FixedWindow(w) => Shadow::Fixed {
                w,
                per: BTreeMap::new(),
            },
            Limit::SlidingCounter(w) => Shadow::Counter {
                w,
                per: BTreeMap::new(),
            },
            Limit::SlidingLog(w) => Shadow::Log {
                w,
                live: VecDeque::new(),
            },
            Limit::Concurrency(c) => Shadow::Leases {
                c,
                live: VecDeque::new(),
            },
        }
    }

    /// Lenient: whether a correct limiter could have admitted `call` after
    /// everything charged so far; if so, charges it.
    fn lenient_admit(&mut self, call: &Call) -> bool {
        let (s, r, c) = (call.send_ns, call.recv_ns, call.cost);
        match self {
            Shadow::Bucket { t, bt, tat, base } => {
                if *base == 0 {
                    *base = s;
                }
                // Signed: a replay in answer order may meet a call sent
                // before the first one it charged.
                let since = |at: u64| (i128::from(at) - i128::from(*base)) as f64;
                let (s, r) = (since(s), since(r));
                let cost = c as f64 * *t;
                // A millionth of a unit of slack for float rounding, in the
                // server's favour.
                if tat.max(r) + cost - r <= *bt + *t * 1e-6 {
                    *tat = tat.max(s) + cost;
                    true
                } else {
                    false
                }
            }
            Shadow::Fixed { w, per } => {
                // The earliest window it could have been decided in that
                // has room.
                for k in s / w.window_ns..=r / w.window_ns {
                    let used = per.entry(k).or_insert(0);
                    if *used + c <= w.limit {
                        *used += c;
                        return true;
                    }
                }
                false
            }
            Shadow::Counter { w, per } => {
                if counter_fits(w, per, c, r) {
                    *per.entry(s / w.window_ns).or_insert(0) += c;
                    true
                } else {
                    false
                }
            }
            Shadow::Log { w, live } => {
                // Charged at send: in the window ending at r if sent after
                // r - W.
                let from = r.saturating_sub(w.window_ns);
                while live.front().is_some_and(|&(es, _, _)| es <= from) {
                    live.pop_front();
                }
                let held: u64 = live.iter().filter(|e| e.0 > from).map(|e| e.2).sum();
                if held + c <= w.limit {
                    live.push_back((s, r, c));
                    true
                } else {
                    false
                }
            }
            Shadow::Leases { c: conc, live } => {
                // Surely held at r: granted by recv, expiring no sooner
                // than send + lease.
                let held: u64 = live
                    .iter()
                    .filter(|&&(ls, lr, _)| lr <= r && ls + conc.lease_ns > r)
                    .map(|e| e.2)
                    .sum();
                if held + c <= conc.limit {
                    live.push_back((s, r, c));
                    if live.len() > 4 * conc.limit as usize + 64 {
                        live.retain(|&(ls, _, _)| ls + conc.lease_ns > r);
                    }
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Strict: charges a call that may have been applied, as late as it
    /// could have been.
    fn strict_note(&mut self, call: &Call) {
        let (s, r, c) = (call.send_ns, call.recv_ns, call.cost);
        match self {
            Shadow::Bucket { t, tat, base, .. } => {
                if *base == 0 {
                    *base = s;
                }
                let r = (r - *base) as f64;
                *tat = tat.max(r) + c as f64 * *t;
            }
            // Counted in every window it could have fallen in.
            Shadow::Fixed { w, per } | Shadow::Counter { w, per } => {
                for k in s / w.window_ns..=r / w.window_ns {
                    *per.entry(k).or_insert(0) += c;
                }
            }
            Shadow::Log { live, .. } | Shadow::Leases { live, .. } => live.push_back((s, r, c)),
        }
    }

    /// Strict: whether a correct limiter would surely have admitted `call`
    /// (whatever its decision instant) after everything noted.
    fn strict_would_admit(&mut self, call: &Call) -> bool {
        let (s, r, c) = (call.send_ns, call.recv_ns, call.cost);
        match self {
            Shadow::Bucket { t, bt, tat, base } => {
                if *base == 0 {
                    *base = s;
                }
                let s = s.saturating_sub(*base) as f64;
                // Room at the earliest instant (the least refilled), with a
                // millionth of a unit of slack against the claim.
                tat.max(s) + c as f64 * *t - s <= *bt - *t * 1e-6
            }
            Shadow::Fixed { w, per } => (s / w.window_ns..=r / w.window_ns)
                .all(|k| per.get(&k).copied().unwrap_or(0) + c <= w.limit),
            Shadow::Counter { w, per } => {
                let k = s / w.window_ns;
                if r / w.window_ns != k {
                    return false;
                }
                // The earliest instant weighs the previous window most.
                counter_fits(w, per, c, s)
            }
            Shadow::Log { w, live } => {
                // Could be in the window at some instant in [s, r]: answered
                // after s - W and sent before r.
                let from = s.saturating_sub(w.window_ns);
                while live.front().is_some_and(|&(_, er, _)| er <= from) {
                    live.pop_front();
                }
                let held: u64 = live
                    .iter()
                    .filter(|&&(es, er, _)| er > from && es < r)
                    .map(|e| e.2)
                    .sum();
                held + c <= w.limit
            }
            Shadow::Leases { c: conc, live } => {
                // Could be held at some instant in [s, r]: sent before r,
                // expiring (at the latest, recv + lease) after s.
                while live
                    .front()
                    .is_some_and(|&(_, lr, _)| lr + conc.lease_ns <= s)
                {
                    live.pop_front();
                }
                let held: u64 = live
                    .iter()
                    .filter(|&&(ls, lr, _)| ls < r && lr + conc.lease_ns > s)
                    .map(|e| e.2)
                    .sum();
                held + c <= conc.limit
            }
        }
    }
}

/// The sliding counter's exact admission test at `at`, in integers, with
/// the units `per` aligned window: `prev x (W - e) + (cur + c) x W <=
/// limit x W`.
fn counter_fits(w: &Window, per: &BTreeMap<u64, u64>, c: u64, at: u64) -> bool {
    let k = at / w.window_ns;
    let e = at % w.window_ns;
    let cur = per.get(&k).copied().unwrap_or(0);
    let prev = k
        .checked_sub(1)
        .and_then(|p| per.get(&p))
        .copied()
        .unwrap_or(0);
    let big = u128::from;
    let wn = big(w.window_ns);
    big(prev) * (wn - big(e.min(w.window_ns))) + (big(cur) + big(c)) * wn <= big(w.limit) * wn
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    /// A base far from 0, as real times are.
    const T0: u64 = 1_800_000_000_000 * MS;

    fn call(at_ms: u64, allowed: bool) -> Call {
        Call {
            send_ns: T0 + at_ms * MS,
            recv_ns: T0 + at_ms * MS + MS / 10,
            cost: 1,
            allowed,
            store: true,
            maybe_applied: false,
            verdict: true,
        }
    }

    /// A call `ms` after an aligned second (windows start there).
    fn aligned(ms: u64, allowed: bool) -> Call {
        let base = 1_800_000_000_000u64; // ms since the epoch, aligned
        Call {
            send_ns: (base + ms) * MS,
            recv_ns: (base + ms) * MS + MS / 10,
            allowed,
            ..call(0, true)
        }
    }

    fn limit(spec: &str) -> Limit {
        spec.parse().unwrap()
    }

    fn units(events: &[(u64, u64)]) -> u64 {
        events.iter().map(|e| e.1).sum()
    }

    /// A correct GCRA's verdicts for calls every `gap_ms`, as the server
    /// would give them (decided at send).
    fn correct_bucket(count: u64, burst: u64, gap_ms: u64, n: u64) -> Vec<Call> {
        let t = 1_000 * MS / count;
        let mut tat = 0u64;
        (0..n)
            .map(|i| {
                let now = T0 + i * gap_ms * MS;
                let new_tat = tat.max(now) + t;
                let ok = new_tat - now <= burst * t;
                if ok {
                    tat = new_tat;
                }
                call(i * gap_ms, ok)
            })
            .collect()
    }

    #[test]
    fn a_correct_token_bucket_is_neither_over_nor_under() {
        let calls = correct_bucket(10, 20, 7, 5_000);
        let f = audit(&limit("token-bucket:10/s,burst=20"), &calls);
        assert_eq!(units(&f.over), 0);
        assert_eq!(units(&f.under), 0);
    }

    #[test]
    fn a_bucket_that_forgets_is_over_by_the_burst() {
        // The bucket is spent, then (a failover that lost its state) it is
        // full again: the burst is granted twice.
        let mut calls = correct_bucket(10, 20, 5, 400); // 2 s
        let again = correct_bucket(10, 20, 5, 400);
        calls.extend(again.into_iter().map(|mut c| {
            c.send_ns += 2_000 * MS;
            c.recv_ns += 2_000 * MS;
            c
        }));
        let f = audit(&limit("token-bucket:10/s,burst=20"), &calls);
        // The first run spent its last token at 1.9 s; by 2.0 s one has
        // come back, so of the second burst of 20, 19 are too many.
        assert_eq!(units(&f.over), 19);
        assert_eq!(f.over, f.over_with_fallback);
    }

    #[test]
    fn slow_answers_are_never_held_against_the_server() {
        // 21 admissions in 1 s of sends under 10/s burst 20: too many if
        // decided at send, but each answer took 200 ms, so the decisions may
        // have been spread over 1.2 s: 20 + 2 refilled.
        let calls: Vec<Call> = (0..21)
            .map(|i| Call {
                send_ns: T0 + i * 50 * MS,
                recv_ns: T0 + i * 50 * MS + 200 * MS,
                ..call(0, true)
            })
            .collect();
        let f = audit(&limit("token-bucket:10/s,burst=20"), &calls);
        assert_eq!(units(&f.over), 0);
        // With quick answers, call k at 34k ms fits while k + 1 <= 20 +
        // 0.34 k: 29 calls fit (0..=28), a 30th is one too many.
        let quick = |n: u64| -> Vec<Call> { (0..n).map(|i| call(i * 34, true)).collect() };
        let tb = limit("token-bucket:10/s,burst=20");
        assert_eq!(units(&audit(&tb, &quick(29)).over), 0);
        assert_eq!(units(&audit(&tb, &quick(30)).over), 1);
    }

    #[test]
    fn a_decision_late_in_its_window_is_not_over() {
        // A correct bucket (10/s, burst 20) under a call every 5 ms for 4 s:
        // spent after its burst, then one admission every 100 ms. One of
        // those, decided at 3.0 s or later, was sent a second earlier and
        // held by a paused entry node until then: in send order it looks
        // like one admission too many at 2 s, in answer order it fits.
        let tb = limit("token-bucket:10/s,burst=20");
        let mut calls = correct_bucket(10, 20, 5, 800);
        let k = calls
            .iter()
            .position(|c| c.allowed && c.send_ns >= T0 + 3_000 * MS)
            .unwrap();
        calls[k].send_ns -= 1_000 * MS;
        let sent_order: Vec<Call> = {
            let mut v: Vec<Call> = calls.iter().filter(|c| c.allowed).copied().collect();
            v.sort_by_key(|c| c.send_ns);
            v
        };
        assert_eq!(
            units(&lenient(&tb, sent_order.iter())),
            1,
            "the old reading"
        );
        assert_eq!(units(&audit(&tb, &calls).over), 0);
        // The same call answered at once, at 2 s: one too many either way.
        calls[k].recv_ns = calls[k].send_ns + MS;
        assert_eq!(units(&audit(&tb, &calls).over), 1);
    }

    #[test]
    fn an_answer_order_replay_takes_calls_sent_before_its_first() {
        // The first answer came for the second call sent: no overflow.
        let calls = vec![
            Call {
                recv_ns: T0 + 50 * MS,
                ..call(0, true)
            },
            call(10, true),
        ];
        for l in [
            "token-bucket:10/s,burst=20",
            "sliding-log:20/s",
            "fixed-window:20/s",
        ] {
            assert_eq!(units(&audit(&limit(l), &calls).over), 0, "{l}");
        }
    }

    #[test]
    fn each_episode_is_read_in_the_order_that_explains_it() {
        // Two readings that each find one unit over, in different
        // episodes: each episode keeps the reading that finds none.
        let s = 1_000_000_000;
        assert_eq!(fewest(vec![(10 * s, 1)], vec![(20 * s, 1)]), vec![]);
        // One episode: the fewer units win, whatever their times.
        assert_eq!(
            fewest(vec![(10 * s, 1), (11 * s, 1)], vec![(11 * s, 1)]),
            vec![(11 * s, 1)]
        );
        // Both find it: a real over-admission stays.
        assert_eq!(
            fewest(vec![(10 * s, 2)], vec![(10 * s, 2)]),
            vec![(10 * s, 2)]
        );
    }

    #[test]
    fn an_error_is_no_denial() {
        // A bucket that admits everything: calls that got an error (the
        // group could not answer) are not denials a limiter made.
        let mut calls: Vec<Call> = (0..5).map(|i| call(i * 10, true)).collect();
        calls.push(Call {
            allowed: false,
            verdict: false,
            store: false,
            ..call(60, true)
        });
        let tb = limit("token-bucket:10/s,burst=20");
        assert_eq!(units(&audit(&tb, &calls).under), 0);
        // The same call as a denial is one a correct limiter would admit.
        calls.last_mut().unwrap().verdict = true;
        assert_eq!(units(&audit(&tb, &calls).under), 1);
    }

    #[test]
    fn fallback_admissions_count_only_in_the_fallback_figure() {
        let mut calls = correct_bucket(10, 20, 5, 200);
        for i in 0..30 {
            calls.push(Call {
                store: false,
                ..call(1_000 + i, true)
            });
        }
        let f = audit(&limit("token-bucket:10/s,burst=20"), &calls);
        assert_eq!(units(&f.over), 0);
        assert!(units(&f.over_with_fallback) >= 20);
    }

    #[test]
    fn denials_with_room_are_under_admission() {
        // One admission, then denials of a fresh bucket: 19 had room.
        let mut calls = vec![call(0, true)];
        calls.extend((1..=30).map(|i| call(i, false)));
        let f = audit(&limit("token-bucket:10/s,burst=20"), &calls);
        assert_eq!(units(&f.under), 19);
        assert_eq!(units(&f.over), 0);
    }

    #[test]
    fn calls_of_unknown_outcome_excuse_later_denials() {
        // 20 calls timed out (they may have been applied), then denials:
        // a correct limiter may be spent.
        let mut calls: Vec<Call> = (0..20)
            .map(|i| Call {
                maybe_applied: true,
                verdict: true,
                store: false,
                ..call(i, false)
            })
            .collect();
        calls.extend((20..40).map(|i| call(i, false)));
        let f = audit(&limit("token-bucket:10/s,burst=20"), &calls);
        // The timed-out calls themselves are denials (the fallback said no)
        // with room before them: the first of them surely had room.
        let after: Vec<_> = f.under.iter().filter(|e| e.0 > T0 + 20 * MS).collect();
        assert!(after.is_empty(), "{after:?}");
    }

    #[test]
    fn fixed_window_counts_per_aligned_window() {
        let w = limit("fixed-window:5/1s");
        let at = |ms| aligned(ms, true);
        // 5 at the end of one window, 5 at the start of the next: correct.
        let mut calls: Vec<Call> = (0..5).map(|i| at(990 + i)).collect();
        calls.extend((0..5).map(|i| at(1_000 + i)));
        assert_eq!(units(&audit(&w, &calls).over), 0);
        // A sixth in the second window is over.
        calls.push(at(1_500));
        assert_eq!(units(&audit(&w, &calls).over), 1);
        // A denial in a window with 4 admitted is under.
        let mut calls: Vec<Call> = (0..4).map(|i| at(2_000 + i)).collect();
        calls.push(aligned(2_100, false));
        assert_eq!(units(&audit(&w, &calls).under), 1);
    }

    /// `fits` is within `spec`; with `extra` added, one unit is over.
    fn one_too_many(spec: &str, mut fits: Vec<Call>, extra: Call) {
        let l = limit(spec);
        assert_eq!(units(&audit(&l, &fits).over), 0, "{spec}");
        fits.push(extra);
        assert_eq!(units(&audit(&l, &fits).over), 1, "{spec}");
    }

    #[test]
    fn sliding_log_holds_in_every_interval() {
        // 5 at t = 0..4 ms, 5 more at 1001..1005 ms: correct; one at 500 ms
        // is over (6 in [0, 500]).
        let calls = (0..5).chain(1_001..1_006).map(|i| call(i, true)).collect();
        one_too_many("sliding-log:5/1s", calls, call(500, true));
    }

    #[test]
    fn sliding_counter_judges_by_its_estimate() {
        // 10 in the first window; 5 at the middle of the next: the estimate
        // there is 10 x 0.5 + cur, so 5 fit and a sixth does not.
        let calls = (0..10)
            .chain(1_500..1_505)
            .map(|i| aligned(i, true))
            .collect();
        one_too_many("sliding-counter:10/1s", calls, aligned(1_510, true));
    }

    #[test]
    fn concurrency_counts_leases_held_at_once() {
        let c = limit("concurrency:3,lease=1s");
        // 3 leases, then a 4th while they are held: over; a 5th after they
        // expired: fine.
        let calls = vec![
            call(0, true),
            call(1, true),
            call(2, true),
            call(500, true),
            call(1_700, true),
        ];
        let f = audit(&c, &calls);
        assert_eq!(units(&f.over), 1);
        // A denial while only 2 may be held is under.
        let calls = vec![call(0, true), call(1, true), call(5, false)];
        assert_eq!(units(&audit(&c, &calls).under), 1);
    }
}
