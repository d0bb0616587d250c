//! Concurrency limit: at most `limit` slots held at once. A request acquires
//! `cost` slots under a *lease* and gives them back when it finishes
//! (release). A lease lives `lease_ns` after its acquire or its last renew;
//! a holder that dies without releasing frees its slots when its lease
//! expires. **At no instant do unexpired, unreleased leases hold more than
//! `limit` slots.**
//!
//! - Lease ids come from the caller (the shard hands out unique ids), so
//!   this module stays pure. An id must not name a live lease of the same
//!   key (asserted in debug builds); a `u64` counter per shard never
//!   repeats in practice.
//! - Expiry is lazy: an expired lease holds nothing from the instant it
//!   expires (`expires_ns <= now`), and is removed at the next decision on
//!   its key that changes the state.
//! - Release or renew of an id that names no live lease (unknown, already
//!   released, or expired) is [`LeaseNotFound`] and changes nothing: a
//!   holder whose lease expired must not believe it still holds a slot that
//!   someone else may have taken.
//! - Renew moves the expiry to `now + lease_ns`, never earlier than it was
//!   (a clock that stepped back, or a shorter `lease_ns`, never shortens a
//!   lease).
//! - A cost of 0 peeks: the verdict says whether a slot is free; no lease is
//!   recorded.
//! - Verdict: `remaining` is the slots free after the request;
//!   `retry_after_ns`, when denied, is the time until enough leases expire
//!   to admit it (a release may free slots sooner); `reset_after_ns` is the
//!   time until every current lease has expired.
//!
//! The state is the leases, 24 bytes each, sorted by expiry, at most `limit`
//! of them (each holds at least one slot); storage grows only when a lease
//! is added and never beyond `limit` leases. Acquire is a binary search and
//! an insert (at the end, when leases all have the same `lease_ns`);
//! release and renew scan the leases. A state with no live lease is
//! equivalent to none.
//!
//! A clock that steps backward makes leases look younger, so it frees
//! nothing early: it grants no slots.

use super::{until, Concurrency, Decision, CONCURRENCY_LIMIT_MAX};
use crate::gcra::Verdict;

/// One holder's slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The id the shard gave it at acquire, named by release and renew.
    pub id: u64,
    /// When it frees itself unless renewed, ns since the epoch: it holds
    /// its slots while `now < expires_ns`.
    pub expires_ns: u64,
    /// Slots it holds (the acquire's cost, at least 1).
    pub units: u64,
}

/// A concurrency limit's state: the leases, soonest expiry first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConcurrencyState {
    /// Sorted by `(expires_ns, id)`, so the expired ones are a prefix.
    leases: Vec<Lease>,
    /// Sum of `units` over `leases`, so that counting the live slots only
    /// walks the expired prefix.
    held: u64,
}

/// A release or renew named no live lease: unknown, already released, or
/// expired. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no such lease: unknown, released or expired")]
pub struct LeaseNotFound;

/// What a release or renew did, and the state afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseDecision {
    /// `Ok` when the lease was released (or renewed); [`LeaseNotFound`]
    /// when the id names no live lease, in which case nothing changed.
    pub outcome: Result<(), LeaseNotFound>,
    /// The slots as a cost-0 peek sees them afterwards, and the state to
    /// store.
    pub decision: Decision<ConcurrencyState>,
}

/// Where the leases stand at a given time.
#[derive(Clone, Copy, Debug)]
struct Look {
    /// Index of the first live lease.
    first: usize,
    /// Slots held by live leases.
    live: u64,
}

impl ConcurrencyState {
    /// The leases as they stand at `now_ns`.
    #[inline]
    fn look(&self, now_ns: u64) -> Look {
        let first = self.leases.partition_point(|l| l.expires_ns <= now_ns);
        let expired: u64 = self.leases[..first].iter().map(|l| l.units).sum();
        Look {
            first,
            live: self.held - expired,
        }
    }

    /// Drops the leases before `first` (expired).
    #[inline]
    fn prune(&mut self, look: Look) {
        self.leases.drain(..look.first);
        self.held = look.live;
    }

    /// Inserts `lease` in expiry order, growing storage at most to `limit`.
    #[inline]
    fn insert(&mut self, lease: Lease, limit: u64) {
        let len = self.leases.len();
        if len == self.leases.capacity() {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let target = len.saturating_mul(2).max(4).min(limit).max(len + 1);
            self.leases.reserve_exact(target - len);
        }
        let key = (lease.expires_ns, lease.id);
        let at = self.leases.partition_point(|l| (l.expires_ns, l.id) <= key);
        self.leases.insert(at, lease);
        self.held += lease.units;
    }

    /// The index of the live lease `id`, if any.
    #[inline]
    fn find(&self, look: Look, id: u64) -> Option<usize> {
        self.leases[look.first..]
            .iter()
            .position(|l| l.id == id)
            .map(|i| look.first + i)
    }

    /// Whether every lease has expired at `now_ns` (the state is equivalent
    /// to none and the store may drop it).
    #[inline]
    pub fn is_full(&self, now_ns: u64) -> bool {
        self.look(now_ns).live == 0
    }

    /// The leases, soonest expiry first, for snapshots and replication
    /// ([`ConcurrencyState::from_leases`] rebuilds the state). May include
    /// leases that have expired but not yet been pruned.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// Rebuilds a state from [`ConcurrencyState::leases`], in any order.
    /// `None` (a corrupt record) if a lease holds no slot, two share an id,
    /// or they hold more than [`CONCURRENCY_LIMIT_MAX`] slots in all (no
    /// state that decisions produce holds more).
    pub fn from_leases(leases: impl IntoIterator<Item = Lease>) -> Option<ConcurrencyState> {
        let mut state = ConcurrencyState::default();
        for lease in leases {
            state.held = state.held.checked_add(lease.units)?;
            // Checked before pushing, so a corrupt record cannot make this
            // allocate more than a real state would.
            if lease.units == 0 || state.held > CONCURRENCY_LIMIT_MAX {
                return None;
            }
            state.leases.push(lease);
        }
        state.leases.sort_unstable_by_key(|l| l.id);
        if state.leases.windows(2).any(|w| w[0].id == w[1].id) {
            return None;
        }
        state.leases.sort_unstable_by_key(|l| (l.expires_ns, l.id));
        state.leases.shrink_to_fit();
        Some(state)
    }

    /// Bytes of heap the state holds, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.leases.capacity() * std::mem::size_of::<Lease>()
    }
}

/// The verdict for acquiring `cost` slots at `now_ns`.
#[inline]
fn decide(
    state: &ConcurrencyState,
    limit: &Concurrency,
    cost: u64,
    now_ns: u64,
) -> (Verdict, Look) {
    let look = state.look(now_ns);
    let latest_ns = state
        .leases
        .last()
        .filter(|_| look.live > 0)
        .map_or(0, |l| l.expires_ns);
    let verdict = match look.live.checked_add(cost).filter(|&n| n <= limit.limit) {
        Some(after) => {
            let new_ns = if cost > 0 {
                now_ns.saturating_add(limit.lease_ns)
            } else {
                0
            };
            Verdict {
                allowed: true,
                limit: limit.limit,
                remaining: limit.limit - after,
                retry_after_ns: 0,
                reset_after_ns: until(latest_ns.max(new_ns), now_ns),
            }
        }
        None => {
            // Wait for the soonest-expiring leases that free enough slots.
            let need = look.live - (limit.limit - cost);
            let mut freed = 0u64;
            let retry_at_ns = state.leases[look.first..]
                .iter()
                .find(|l| {
                    freed += l.units;
                    freed >= need
                })
                .map_or(latest_ns, |l| l.expires_ns);
            Verdict {
                allowed: false,
                limit: limit.limit,
                remaining: limit.limit.saturating_sub(look.live),
                retry_after_ns: until(retry_at_ns, now_ns),
                reset_after_ns: until(latest_ns, now_ns),
            }
        }
    };
    (verdict, look)
}

/// Acquires `cost` slots at `now_ns` under the new lease `lease_id`, which
/// expires at `now_ns + limit.lease_ns` unless released or renewed.
///
/// `limit` must be validated and `cost <= limit.limit` (checked at the
/// edge; asserted here); `lease_id` must not name a live lease of this key.
/// A denied request (or a cost of 0) records no lease and returns the state
/// unchanged.
#[inline]
pub fn acquire(
    state: Option<ConcurrencyState>,
    limit: &Concurrency,
    cost: u64,
    lease_id: u64,
    now_ns: u64,
) -> Decision<ConcurrencyState> {
    assert!(
        cost <= limit.limit,
        "cost must be checked against the limit at the edge"
    );
    // An empty Vec does not allocate.
    let mut leases = state.unwrap_or_default();
    let (verdict, look) = decide(&leases, limit, cost, now_ns);
    if verdict.allowed && cost > 0 {
        debug_assert!(
            leases.find(look, lease_id).is_none(),
            "lease id {lease_id} is already live on this key"
        );
        leases.prune(look);
        let lease = Lease {
            id: lease_id,
            expires_ns: now_ns.saturating_add(limit.lease_ns),
            units: cost,
        };
        leases.insert(lease, limit.limit);
    }
    // A denial has live leases (an absent or expired state has room for
    // any cost <= limit), so it returns the state untouched.
    let state = (!leases.is_full(now_ns)).then_some(leases);
    Decision { verdict, state }
}

/// Answers as [`acquire`] would, changing nothing.
#[inline]
pub fn peek(
    state: Option<&ConcurrencyState>,
    limit: &Concurrency,
    cost: u64,
    now_ns: u64,
) -> Verdict {
    match state {
        Some(s) => decide(s, limit, cost, now_ns).0,
        None => decide(&ConcurrencyState::default(), limit, cost, now_ns).0,
    }
}

/// Frees the slots of lease `lease_id`. [`LeaseNotFound`] if no live lease
/// has that id (then nothing changes).
pub fn release(
    state: Option<ConcurrencyState>,
    limit: &Concurrency,
    lease_id: u64,
    now_ns: u64,
) -> LeaseDecision {
    update(state, limit, lease_id, now_ns, |leases, i| {
        let lease = leases.leases.remove(i);
        leases.held -= lease.units;
    })
}

/// Extends lease `lease_id` to `now_ns + limit.lease_ns` (never shortening
/// it). [`LeaseNotFound`] if no live lease has that id (then nothing
/// changes: an expired lease cannot be revived, its slots may be taken).
pub fn renew(
    state: Option<ConcurrencyState>,
    limit: &Concurrency,
    lease_id: u64,
    now_ns: u64,
) -> LeaseDecision {
    update(state, limit, lease_id, now_ns, |leases, i| {
        let mut lease = leases.leases.remove(i);
        leases.held -= lease.units;
        lease.expires_ns = lease.expires_ns.max(now_ns.saturating_add(limit.lease_ns));
        leases.insert(lease, limit.limit);
    })
}

/// Applies `change` to the live lease `lease_id` (by index), then drops the
/// expired leases; or, if there is no such lease, changes nothing.
fn update(
    state: Option<ConcurrencyState>,
    limit: &Concurrency,
    lease_id: u64,
    now_ns: u64,
    change: impl FnOnce(&mut ConcurrencyState, usize),
) -> LeaseDecision {
    let mut leases = state.unwrap_or_default();
    let look = leases.look(now_ns);
    let outcome = match leases.find(look, lease_id) {
        Some(i) => {
            change(&mut leases, i);
            // The change touched a live lease only: the expired prefix is
            // where it was.
            let look = leases.look(now_ns);
            leases.prune(look);
            Ok(())
        }
        None => Err(LeaseNotFound),
    };
    let state = (!leases.leases.is_empty()).then_some(leases);
    LeaseDecision {
        outcome,
        decision: Decision {
            verdict: peek(state.as_ref(), limit, 0, now_ns),
            state,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * S;

    fn concurrency(limit: u64, lease_ns: u64) -> Concurrency {
        Concurrency::new(limit, lease_ns).unwrap()
    }

    #[test]
    fn acquire_release_renew_expire() {
        let c = concurrency(2, 30 * S);
        let a = acquire(None, &c, 1, 1, T0);
        assert!(a.verdict.allowed);
        assert_eq!((a.verdict.remaining, a.verdict.reset_after_ns), (1, 30 * S));
        let b = acquire(a.state, &c, 1, 2, T0 + 10 * S);
        assert_eq!((b.verdict.remaining, b.verdict.reset_after_ns), (0, 30 * S));
        let denied = acquire(b.state.clone(), &c, 1, 3, T0 + 10 * S);
        assert!(!denied.verdict.allowed);
        assert_eq!(denied.state, b.state);
        assert_eq!(
            denied.verdict.retry_after_ns,
            20 * S,
            "lease 1 expires at 30 s"
        );
        assert_eq!(denied.verdict.reset_after_ns, 30 * S);
        // Renew lease 1 at 20 s: it now expires at 50 s, lease 2 at 40 s first.
        let r = renew(b.state.clone(), &c, 1, T0 + 20 * S);
        assert_eq!(r.outcome, Ok(()));
        let v = peek(r.decision.state.as_ref(), &c, 1, T0 + 20 * S);
        assert_eq!(
            (v.allowed, v.retry_after_ns, v.reset_after_ns),
            (false, 20 * S, 30 * S)
        );
        // Release lease 2: one slot free.
        let rel = release(r.decision.state, &c, 2, T0 + 21 * S);
        assert_eq!(rel.outcome, Ok(()));
        assert_eq!(rel.decision.verdict.remaining, 1);
        // Releasing it again, or an unknown id, is not found and changes nothing.
        let again = release(rel.decision.state.clone(), &c, 2, T0 + 21 * S);
        assert_eq!(again.outcome, Err(LeaseNotFound));
        assert_eq!(again.decision.state, rel.decision.state);
        assert_eq!(release(None, &c, 9, T0).outcome, Err(LeaseNotFound));
        // Lease 1 expires by itself at 50 s: renewing it after is not found.
        let late = renew(rel.decision.state.clone(), &c, 1, T0 + 50 * S);
        assert_eq!(late.outcome, Err(LeaseNotFound));
        assert!(rel.decision.state.as_ref().unwrap().is_full(T0 + 50 * S));
        let fresh = acquire(rel.decision.state, &c, 2, 4, T0 + 50 * S);
        assert!(fresh.verdict.allowed);
        assert_eq!(
            fresh.state.unwrap().leases().len(),
            1,
            "expired lease pruned"
        );
    }

    #[test]
    fn multi_slot_leases_and_cost_zero() {
        let c = concurrency(5, S);
        let a = acquire(None, &c, 3, 1, T0);
        let b = acquire(a.state, &c, 2, 2, T0 + 1);
        let v = peek(b.state.as_ref(), &c, 3, T0 + 2);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ns, S - 2, "lease 1 alone frees 3");
        let v = peek(b.state.as_ref(), &c, 4, T0 + 2);
        assert_eq!(v.retry_after_ns, S - 1, "both must go");
        let z = acquire(b.state.clone(), &c, 0, 3, T0 + 2);
        assert!(z.verdict.allowed);
        assert_eq!(z.verdict.remaining, 0);
        assert_eq!(z.state, b.state, "cost 0 records nothing");
        assert_eq!(acquire(None, &c, 0, 1, T0).state, None);
    }

    #[test]
    fn clock_stepping_back_frees_nothing() {
        let c = concurrency(1, 10 * S);
        let a = acquire(None, &c, 1, 1, T0);
        let back = acquire(a.state.clone(), &c, 1, 2, T0 - 3_600 * S);
        assert!(!back.verdict.allowed);
        assert_eq!(back.verdict.retry_after_ns, 3_610 * S);
        // A renew from the past does not shorten the lease.
        let r = renew(a.state, &c, 1, T0 - 3_600 * S);
        assert_eq!(
            r.decision.state.unwrap().leases()[0].expires_ns,
            T0 + 10 * S
        );
    }

    #[test]
    fn memory_is_bounded_and_leases_round_trip() {
        let c = concurrency(10, S);
        let mut state = None;
        for id in 0..1_000u64 {
            state = acquire(state, &c, 1, id, T0 + id * S / 20).state;
            let s = state.as_ref().unwrap();
            assert!(s.leases().len() <= 10 && s.leases.capacity() <= 10);
        }
        let s = state.unwrap();
        assert_eq!(s.heap_bytes(), 10 * 24);
        let mut leases = s.leases().to_vec();
        leases.reverse();
        assert_eq!(
            ConcurrencyState::from_leases(leases.clone())
                .unwrap()
                .leases(),
            s.leases()
        );
        leases.push(leases[0]);
        assert!(
            ConcurrencyState::from_leases(leases).is_none(),
            "duplicate id"
        );
        let zero = Lease {
            id: 1,
            expires_ns: 1,
            units: 0,
        };
        assert!(ConcurrencyState::from_leases([zero]).is_none());
        let huge = Lease {
            units: CONCURRENCY_LIMIT_MAX + 1,
            ..zero
        };
        assert!(ConcurrencyState::from_leases([huge]).is_none());
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let c = concurrency(CONCURRENCY_LIMIT_MAX, crate::limit::LEASE_NS_MAX);
        for now in [0, 1, u64::MAX - 1, u64::MAX] {
            let d = acquire(None, &c, c.limit, 1, now);
            assert!(d.verdict.allowed);
            let denied = acquire(d.state.clone(), &c, 1, 2, now);
            assert!(!denied.verdict.allowed || now == u64::MAX);
            let _ = renew(d.state.clone(), &c, 1, now);
            let _ = release(d.state, &c, 1, now);
        }
    }

    /// The state's invariants: sorted by expiry, `held` is the sum, no
    /// empty lease, no id twice, at most `limit` slots.
    fn assert_sound(state: &Option<ConcurrencyState>, c: &Concurrency) {
        let Some(s) = state else { return };
        let rebuilt = ConcurrencyState::from_leases(s.leases().iter().copied()).unwrap();
        assert_eq!(rebuilt.leases(), s.leases());
        assert_eq!(rebuilt.held, s.held);
        assert!(s.held <= c.limit);
    }

    #[derive(Clone, Copy, Debug)]
    enum Op {
        Acquire(u64),
        /// Releases the n-th lease ever handed out (maybe long gone).
        Release(u64),
        Renew(u64),
    }

    fn limits() -> impl Strategy<Value = Concurrency> {
        (1u64..=10, prop_oneof![Just(S), Just(S / 4), Just(60 * S)])
            .prop_map(|(limit, lease_ns)| concurrency(limit, lease_ns))
    }

    fn ops(back: bool) -> impl Strategy<Value = Vec<(i64, Op)>> {
        let gap = if back {
            prop_oneof![8 => 0i64..500_000_000, 1 => -2_000_000_000i64..0].boxed()
        } else {
            prop_oneof![0i64..1_000, 0i64..500_000_000].boxed()
        };
        let op = prop_oneof![
            4 => (0u64..=4).prop_map(Op::Acquire),
            2 => (0u64..40).prop_map(Op::Release),
            1 => (0u64..40).prop_map(Op::Renew),
        ];
        prop::collection::vec((gap, op), 1..150)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Against a model of leases (held from acquire until release or
        /// expiry): slots held never exceed the limit, acquire is admitted
        /// exactly when the slots are free, and release / renew find
        /// exactly the live leases.
        #[test]
        fn held_never_exceeds_limit(c in limits(), seq in ops(false)) {
            let mut state = None;
            let mut now = T0;
            // id -> (expires_ns, units, released)
            let mut model: HashMap<u64, (u64, u64, bool)> = HashMap::new();
            let mut next_id = 0u64;
            for (gap, op) in seq {
                now += gap.unsigned_abs();
                let live = |m: &HashMap<u64, (u64, u64, bool)>, id: u64| {
                    m.get(&id).is_some_and(|&(exp, _, released)| !released && exp > now)
                };
                let held = |m: &HashMap<u64, (u64, u64, bool)>| -> u64 {
                    m.iter().filter(|&(&id, _)| live(m, id)).map(|(_, &(_, u, _))| u).sum()
                };
                let before = held(&model);
                match op {
                    Op::Acquire(cost) => {
                        let cost = cost.min(c.limit);
                        let d = acquire(state, &c, cost, next_id, now);
                        prop_assert_eq!(d.verdict.allowed, before + cost <= c.limit);
                        if d.verdict.allowed && cost > 0 {
                            model.insert(next_id, (now + c.lease_ns, cost, false));
                        }
                        next_id += 1;
                        state = d.state;
                    }
                    Op::Release(id) | Op::Renew(id) => {
                        let found = live(&model, id);
                        let d = match op {
                            Op::Release(_) => release(state, &c, id, now),
                            _ => renew(state, &c, id, now),
                        };
                        prop_assert_eq!(d.outcome.is_ok(), found);
                        if let (true, Some(m)) = (found, model.get_mut(&id)) {
                            match op {
                                Op::Release(_) => m.2 = true,
                                _ => m.0 = m.0.max(now + c.lease_ns),
                            }
                        }
                        state = d.decision.state;
                    }
                }
                let after = held(&model);
                prop_assert!(after <= c.limit);
                prop_assert_eq!(peek(state.as_ref(), &c, 0, now).remaining, c.limit - after);
                let stored = state.as_ref().map_or(0, |s| s.leases().len());
                prop_assert!(stored as u64 <= c.limit);
            }
        }

        /// A denial changes nothing, peek answers as acquire, and retrying
        /// exactly retry_after later (and no earlier) is admitted, whatever
        /// the clock does.
        #[test]
        fn denial_peek_and_retry(c in limits(), seq in ops(true)) {
            let mut state: Option<ConcurrencyState> = None;
            let mut now = T0;
            for (id, (gap, op)) in (0u64..).zip(seq) {
                now = now.saturating_add_signed(gap);
                match op {
                    Op::Acquire(cost) => {
                        let cost = cost.min(c.limit);
                        let d = acquire(state.clone(), &c, cost, id, now);
                        prop_assert_eq!(peek(state.as_ref(), &c, cost, now), d.verdict);
                        if !d.verdict.allowed {
                            prop_assert_eq!(&d.state, &state);
                            let retry = d.verdict.retry_after_ns;
                            prop_assert!(retry > 0);
                            prop_assert!(peek(state.as_ref(), &c, cost, now + retry).allowed);
                            prop_assert!(!peek(state.as_ref(), &c, cost, now + retry - 1).allowed);
                        }
                        state = d.state;
                        assert_sound(&state, &c);
                    }
                    Op::Release(n) => {
                        let d = release(state.clone(), &c, n, now);
                        if d.outcome.is_err() {
                            prop_assert_eq!(&d.decision.state, &state);
                        }
                        state = d.decision.state;
                        assert_sound(&state, &c);
                    }
                    Op::Renew(n) => {
                        let d = renew(state.clone(), &c, n, now);
                        if d.outcome.is_err() {
                            prop_assert_eq!(&d.decision.state, &state);
                        }
                        state = d.decision.state;
                        assert_sound(&state, &c);
                    }
                }
            }
        }

        /// Time only frees slots: an earlier now (a clock that stepped
        /// back) never admits more than a later one would.
        #[test]
        fn earlier_never_admits_more(c in limits(), seq in ops(true), back in 0u64..200_000_000_000, cost in 0u64..=10) {
            let mut state = None;
            let mut now = T0;
            for (id, (gap, op)) in (0u64..).zip(seq) {
                now = now.saturating_add_signed(gap);
                state = match op {
                    Op::Acquire(cost) => acquire(state, &c, cost.min(c.limit), id, now).state,
                    Op::Release(n) => release(state, &c, n, now).decision.state,
                    Op::Renew(n) => renew(state, &c, n, now).decision.state,
                };
            }
            let cost = cost.min(c.limit);
            let early = peek(state.as_ref(), &c, cost, now - back);
            let late = peek(state.as_ref(), &c, cost, now);
            prop_assert!(!early.allowed || late.allowed);
            // (`remaining` is after the request, so compare it at cost 0.)
            let early = peek(state.as_ref(), &c, 0, now - back);
            let late = peek(state.as_ref(), &c, 0, now);
            prop_assert!(early.remaining <= late.remaining);
        }
    }
}
