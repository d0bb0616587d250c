//! The token-bucket decision as GCRA (the generic cell rate algorithm), a
//! pure function of `(bucket, policy, cost, now)`.
//!
//! A bucket is one number: its *theoretical arrival time* (TAT), the instant
//! at which it will be full again. Each admitted unit pushes the TAT one
//! emission interval `I = period / count` into the future; a request of cost
//! `c` is admitted when the pushed TAT stays within `burst x I` of now.
//!
//! Exactness: times are kept in 96.32 fixed point (nanoseconds shifted left
//! by 32 bits) in a `u128`, and `I` is rounded *up* to a whole multiple of
//! 2^-8 ns ([`I_QUANTUM_BITS`]). Rounding up means the promise "at most
//! `burst + rate x T` units in any interval `T`" holds exactly; the
//! shortfall is below `1 / (256 x I)` of the rate with `I` in ns, and none
//! when `I` is a whole number of 2^-8 ns: 3 million a second per key (`I`
//! = 333.33 ns) admits 1 unit in 128,000 fewer than the rate, 3 a second
//! 1 in 8.5e10 fewer, and a thousand a second (1 ms) loses nothing. Why 2^-8 and not
//! the 2^-32 the fixed point could carry: every TAT is then a whole number
//! of 2^-8 ns (whole-ns times plus multiples of `I`), so a store can keep a
//! bucket in 64 bits (its TAT in 2^-8 ns modulo 2^64, a range of +-1.1
//! years around now) with nothing lost, half the 16 bytes the TAT takes
//! here (see the server's `shard::tat`). Reported times are rounded up to whole
//! nanoseconds, so a caller that retries exactly `retry_after_ns` later is
//! admitted.
//!
//! A clock that steps backward makes a bucket look *more* spent (the TAT is
//! further ahead of now), never less: it grants nothing and changes nothing
//! on a denial.

use crate::policy::Policy;

/// Fractional bits of the fixed-point times.
const FRAC_BITS: u32 = 32;

/// The emission interval is a whole multiple of `2^-I_QUANTUM_BITS` ns, so
/// every TAT is too: its low `FRAC_BITS - I_QUANTUM_BITS` bits are zero.
pub const I_QUANTUM_BITS: u32 = 8;

/// The low bits of `tat_fp` that are always zero (see [`I_QUANTUM_BITS`]).
pub const TAT_ZERO_BITS: u32 = FRAC_BITS - I_QUANTUM_BITS;

/// A GCRA bucket: its theoretical arrival time in 96.32 fixed-point
/// nanoseconds. A bucket whose TAT is not after now is full, which is the
/// same as no bucket at all, so the store may drop it.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    bytemuck::Zeroable,
    bytemuck::Pod,
)]
#[repr(C)]
pub struct Bucket {
    /// Theoretical arrival time, ns << 32.
    pub tat_fp: u128,
}

impl Bucket {
    /// Whether the bucket is full at `now_ns` (and so may be dropped).
    #[inline]
    pub fn is_full(&self, now_ns: u64) -> bool {
        self.tat_fp <= to_fp(now_ns)
    }

    /// The bucket whose TAT is `tat_ns` whole nanoseconds: how a shard
    /// stores a redis-cell bucket (see `cell`), so that a key is one bucket
    /// whichever protocol spends from it.
    #[inline]
    pub fn from_tat_ns(tat_ns: u64) -> Bucket {
        Bucket {
            tat_fp: to_fp(tat_ns),
        }
    }

    /// The TAT in whole nanoseconds, rounded up (never earlier than stored).
    #[inline]
    pub fn tat_ns(&self) -> u64 {
        ceil_ns(self.tat_fp)
    }
}

/// What the caller is told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// Whether the request was admitted (its cost was spent).
    pub allowed: bool,
    /// The bucket's capacity (the policy's burst).
    pub limit: u64,
    /// Units that could still be spent now, after this request.
    pub remaining: u64,
    /// Time until a request of this cost would be admitted; 0 when allowed.
    pub retry_after_ns: u64,
    /// Time until the bucket is full again.
    pub reset_after_ns: u64,
}

/// A decision: the verdict, and the bucket as it must be stored afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What the caller is told.
    pub verdict: Verdict,
    /// The bucket to store; `None` means "full": store nothing (drop it).
    pub bucket: Option<Bucket>,
}

#[inline]
fn to_fp(ns: u64) -> u128 {
    u128::from(ns) << FRAC_BITS
}

/// Fixed point to whole nanoseconds, rounded up, saturating at `u64::MAX`.
#[inline]
fn ceil_ns(fp: u128) -> u64 {
    let ns = (fp + ((1u128 << FRAC_BITS) - 1)) >> FRAC_BITS;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// The emission interval of one unit, fixed point, rounded up to a whole
/// multiple of 2^-8 ns: `ceil((period << 8) / count) << 24`. With
/// `period = q x count + r`, that is `(q << 32) + (ceil((r << 8) / count)
/// << 24)` exactly, and for a count under 2^32 (every practical limit) both
/// parts are 64-bit divisions: no 128-bit division (`__udivti3`, a call and
/// a loop) on every decision.
#[inline]
fn emission_fp(policy: &Policy) -> u128 {
    let (period, count) = (policy.period_ns, policy.count);
    if count >> 32 == 0 {
        let (q, r) = (period / count, period % count);
        (u128::from(q) << FRAC_BITS)
            + (u128::from((r << I_QUANTUM_BITS).div_ceil(count)) << TAT_ZERO_BITS)
    } else {
        (u128::from(period) << I_QUANTUM_BITS).div_ceil(u128::from(count)) << TAT_ZERO_BITS
    }
}

/// `n / d` (the whole units in a span), with a 64-bit division when both
/// fit, as they do but for the largest bursts.
#[inline]
fn units_in(n: u128, d: u128) -> u128 {
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) => u128::from(n / d),
        _ => n / d,
    }
}

/// Spends `cost` units from `bucket` (absent = full) at `now_ns`.
///
/// `policy` must be validated and `cost <= policy.burst` (both are checked at
/// the edge, where a request is decoded); this function asserts it.
/// A denied request returns the bucket unchanged.
///
/// Decided by [`throttle_q8`] in 64-bit arithmetic wherever the bucket's
/// lead on now is a whole number of 2^-8 ns below 2^63 of them (every
/// bucket this module produces, within 1.14 years) and the policy's depth
/// fits too; otherwise in 128 bits. The two agree bit for bit (a property
/// test holds them to it), so which one ran is never visible.
#[inline]
pub fn throttle(bucket: Option<Bucket>, policy: &Policy, cost: u64, now_ns: u64) -> Decision {
    let now = to_fp(now_ns);
    let ahead = bucket.map_or(0, |b| b.tat_fp.saturating_sub(now));
    if ahead & ((1 << TAT_ZERO_BITS) - 1) == 0 {
        if let Ok(spent) = u64::try_from(ahead >> TAT_ZERO_BITS) {
            if let Some((verdict, new)) = throttle_q8(spent, policy, cost) {
                let bucket = if verdict.allowed {
                    (new > 0).then(|| Bucket {
                        tat_fp: now + (u128::from(new) << TAT_ZERO_BITS),
                    })
                } else {
                    bucket
                };
                return Decision { verdict, bucket };
            }
        }
    }
    throttle_wide(bucket, policy, cost, now_ns)
}

/// [`throttle`] in 128-bit arithmetic, for every bucket and policy: the
/// reference the 64-bit path is held to, and the path for what it declines.
#[cold]
fn throttle_wide(bucket: Option<Bucket>, policy: &Policy, cost: u64, now_ns: u64) -> Decision {
    assert!(
        cost <= policy.burst,
        "cost must be checked against burst at the edge"
    );
    let i = emission_fp(policy);
    let tau = i * u128::from(policy.burst);
    let now = to_fp(now_ns);
    let tat = bucket.map_or(now, |b| b.tat_fp).max(now);
    let new_tat = tat + i * u128::from(cost);
    let horizon = new_tat - now;
    if horizon <= tau {
        let verdict = Verdict {
            allowed: true,
            limit: policy.burst,
            remaining: to_units(units_in(tau - horizon, i)),
            retry_after_ns: 0,
            reset_after_ns: ceil_ns(horizon),
        };
        let bucket = (new_tat > now).then_some(Bucket { tat_fp: new_tat });
        Decision { verdict, bucket }
    } else {
        let spent = tat - now;
        let verdict = Verdict {
            allowed: false,
            limit: policy.burst,
            remaining: to_units(units_in(tau.saturating_sub(spent), i)),
            retry_after_ns: ceil_ns(horizon - tau),
            reset_after_ns: ceil_ns(spent),
        };
        Decision { verdict, bucket }
    }
}

/// [`throttle`] in 64-bit arithmetic, for a store that keeps TATs in
/// 2^-8 ns units relative to now (see [`I_QUANTUM_BITS`]): `spent` is how
/// far the bucket's TAT is ahead of now in those units (0 for a full or
/// absent bucket), and the result is the verdict with the new `spent`
/// (0: full, drop the bucket; unchanged on a denial). The same decision,
/// bit for bit, as `throttle` on the bucket `now + spent` (every quantity
/// is a whole multiple of 2^-8 ns, so nothing is lost by the narrower
/// units), with one 64-bit division for the interval where `throttle`
/// has two and 128-bit products.
///
/// `None` when the policy's depth is 2^63 units (1.14 years) or more, or
/// `spent` is: the caller decides with [`throttle`].
#[inline]
pub fn throttle_q8(spent: u64, policy: &Policy, cost: u64) -> Option<(Verdict, u64)> {
    let i = interval_q8(policy)?;
    decide_q8(spent, policy, cost, i, |x| x / i)
}

/// [`throttle_q8`] with no division: the policy's interval and its
/// reciprocal come from `memo`, which computes them when the policy differs
/// from the last one it saw (a store that keeps one per shard divides once
/// per change of policy, where most traffic repeats a few). The same
/// result as [`throttle_q8`], always (a property test holds them to it).
#[inline]
pub fn throttle_q8_memo(
    spent: u64,
    policy: &Policy,
    cost: u64,
    memo: &mut IntervalMemo,
) -> Option<(Verdict, u64)> {
    let (i, reciprocal) = memo.of(policy)?;
    decide_q8(spent, policy, cost, i, |x| div_by(x, i, reciprocal))
}

/// The emission interval in 2^-8 ns units, rounded up. `None` if it does
/// not fit 64 bits. A validated period is below 2^55 ns, so `period << 8`
/// fits; the `checked_mul` is for unvalidated policies.
#[inline]
fn interval_q8(policy: &Policy) -> Option<u64> {
    Some(
        policy
            .period_ns
            .checked_mul(1 << I_QUANTUM_BITS)?
            .div_ceil(policy.count),
    )
}

/// The last policy's interval ([`interval_q8`], at least 1 for a valid
/// policy) and its reciprocal `u64::MAX / interval`, keyed by the
/// policy's period and count. Empty (count 0, which no valid policy has)
/// until first used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntervalMemo {
    period_ns: u64,
    count: u64,
    interval: u64,
    reciprocal: u64,
}

impl IntervalMemo {
    /// `(interval, reciprocal)` for `policy`; `None` as [`interval_q8`].
    #[inline]
    pub fn of(&mut self, policy: &Policy) -> Option<(u64, u64)> {
        if self.count != policy.count || self.period_ns != policy.period_ns {
            self.refill(policy)?;
        }
        Some((self.interval, self.reciprocal))
    }

    #[cold]
    #[inline(never)]
    fn refill(&mut self, policy: &Policy) -> Option<()> {
        if policy.count == 0 {
            return None;
        }
        let interval = interval_q8(policy)?.max(1);
        *self = IntervalMemo {
            period_ns: policy.period_ns,
            count: policy.count,
            interval,
            reciprocal: u64::MAX / interval,
        };
        Some(())
    }
}

/// `x / d` for `d >= 1`, given `reciprocal = u64::MAX / d`: the high half
/// of `x * reciprocal` is the quotient or one below it, and one comparison
/// tells which. (`reciprocal >= 2^64 / d - 1`, so `x * reciprocal / 2^64 >=
/// x / d - x / 2^64 > x / d - 1`; and it is at most `x / d`.)
#[inline(always)]
fn div_by(x: u64, d: u64, reciprocal: u64) -> u64 {
    let q = ((u128::from(x) * u128::from(reciprocal)) >> 64) as u64;
    // `q <= x / d`, so `q * d <= x`: no overflow.
    q + u64::from(x - q * d >= d)
}

/// The decision of [`throttle_q8`] on interval `i`, with `div(x)` = `x / i`.
#[inline(always)]
fn decide_q8(
    spent: u64,
    policy: &Policy,
    cost: u64,
    i: u64,
    div: impl Fn(u64) -> u64,
) -> Option<(Verdict, u64)> {
    assert!(
        cost <= policy.burst,
        "cost must be checked against burst at the edge"
    );
    let tau = i.checked_mul(policy.burst).filter(|&t| t < 1 << 63)?;
    if spent >= 1 << 63 {
        return None;
    }
    // Below 2^64: both terms are below 2^63.
    let new = spent + i * cost;
    let ns = |q: u64| q.div_ceil(1 << I_QUANTUM_BITS);
    Some(if new <= tau {
        let verdict = Verdict {
            allowed: true,
            limit: policy.burst,
            remaining: div(tau - new),
            retry_after_ns: 0,
            reset_after_ns: ns(new),
        };
        (verdict, new)
    } else {
        let verdict = Verdict {
            allowed: false,
            limit: policy.burst,
            remaining: div(tau.saturating_sub(spent)),
            retry_after_ns: ns(new - tau),
            reset_after_ns: ns(spent),
        };
        (verdict, spent)
    })
}

/// Answers as [`throttle`] would, changing nothing: the bucket to store is
/// always the one given.
#[inline]
pub fn peek(bucket: Option<Bucket>, policy: &Policy, cost: u64, now_ns: u64) -> Verdict {
    throttle(bucket, policy, cost, now_ns).verdict
}

/// Gives `units` back to `bucket` at `now_ns` (the upstream failed, the work
/// was not done): the TAT moves back by `units x I`, but never before now,
/// so a refund can fill a bucket but never beyond its burst, and never banks
/// units for later. Refunding more than was spent is harmless (it saturates).
///
/// The verdict is what a cost-0 [`peek`] says afterwards; a bucket that the
/// refund fills is `None` (drop it).
#[inline]
pub fn refund(bucket: Option<Bucket>, policy: &Policy, units: u64, now_ns: u64) -> Decision {
    let now = to_fp(now_ns);
    let tat = bucket.map_or(now, |b| b.tat_fp);
    // Saturating: `units` is not bounded by the burst, and a refund of more
    // than the bucket holds simply fills it.
    let back = emission_fp(policy).saturating_mul(u128::from(units));
    let new_tat = tat.saturating_sub(back).max(now);
    let bucket = (new_tat > now).then_some(Bucket { tat_fp: new_tat });
    Decision {
        verdict: peek(bucket, policy, 0, now_ns),
        bucket,
    }
}

#[inline]
fn to_units(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * S;

    fn policy(count: u64, period_ns: u64, burst: u64) -> Policy {
        Policy::new(count, period_ns, burst).unwrap()
    }

    #[test]
    fn burst_then_deny_then_refill() {
        let p = policy(10, S, 20);
        let mut b = None;
        for k in 0..20 {
            let d = throttle(b, &p, 1, T0);
            assert!(d.verdict.allowed, "unit {k}");
            assert_eq!(d.verdict.remaining, 19 - k);
            b = d.bucket;
        }
        let d = throttle(b, &p, 1, T0);
        assert!(!d.verdict.allowed);
        assert_eq!(d.verdict.retry_after_ns, S / 10);
        assert_eq!(d.verdict.reset_after_ns, 2 * S);
        assert_eq!(d.bucket, b, "a denial changes nothing");
        // One emission interval later exactly one unit is back.
        let d = throttle(b, &p, 1, T0 + S / 10);
        assert!(d.verdict.allowed);
        assert_eq!(d.verdict.remaining, 0);
    }

    #[test]
    fn full_bucket_is_dropped_and_peek_creates_nothing() {
        let p = policy(1, S, 1);
        let d = throttle(None, &p, 1, T0);
        let b = d.bucket.expect("a spent bucket is stored");
        assert!(!b.is_full(T0));
        assert!(b.is_full(T0 + S));
        // Cost 0 on a full bucket stores nothing.
        assert_eq!(throttle(None, &p, 0, T0).bucket, None);
        let v = peek(None, &p, 1, T0);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn extreme_rates_are_exact() {
        // 10 million per second, burst 1: every 100 ns exactly one unit.
        let p = policy(10_000_000, S, 1);
        let mut b = None;
        let mut admitted = 0u64;
        for t in 0..1_000_000u64 {
            let d = throttle(b, &p, 1, T0 + t * 10);
            if d.verdict.allowed {
                admitted += 1;
            }
            b = d.bucket;
        }
        assert_eq!(admitted, 100_000, "10 ms at 10 M/s");
        // 3 million per second is not a whole number of ns per unit; with a
        // burst of 10 the 100 ns arrival grid loses nothing to jitter.
        let p = policy(3_000_000, S, 10);
        let mut b = None;
        let mut admitted = 0u64;
        for t in 0..3_000_000u64 {
            let d = throttle(b, &p, 1, T0 + t * 100);
            if d.verdict.allowed {
                admitted += 1;
            }
            b = d.bucket;
        }
        // The burst, plus 300 ms at 3 M/s, less what rounding I up to
        // 2^-8 ns costs: I = 333.33.. ns becomes 333.3359375 ns, 1 part in
        // 128,000, so about 7 units of the 900,000 (never more, by the
        // promise; the bound is 1 / (256 x I) of them, 10.5).
        assert!(
            (900_010 - 11..=900_010 - 6).contains(&admitted),
            "admitted {admitted}"
        );
        // One per day.
        let day = 86_400 * S;
        let p = policy(1, day, 1);
        let d = throttle(None, &p, 1, T0);
        assert!(d.verdict.allowed);
        let d2 = throttle(d.bucket, &p, 1, T0 + day - 1);
        assert!(!d2.verdict.allowed);
        assert_eq!(d2.verdict.retry_after_ns, 1);
        assert!(throttle(d.bucket, &p, 1, T0 + day).verdict.allowed);
    }

    #[test]
    fn clock_stepping_back_grants_nothing() {
        let p = policy(1, S, 2);
        let d = throttle(None, &p, 2, T0);
        assert!(d.verdict.allowed);
        // The clock jumps back an hour: the bucket looks more spent, not less.
        let back = throttle(d.bucket, &p, 1, T0 - 3_600 * S);
        assert!(!back.verdict.allowed);
        assert_eq!(back.bucket, d.bucket);
        assert_eq!(back.verdict.retry_after_ns, 3_601 * S);
    }

    #[test]
    fn retry_after_rounds_up() {
        // 3 per second: the interval is 333_333_333.33 ns.
        let p = policy(3, S, 1);
        let d = throttle(None, &p, 1, T0);
        let denied = throttle(d.bucket, &p, 1, T0);
        assert_eq!(denied.verdict.retry_after_ns, 333_333_334);
        assert!(!throttle(d.bucket, &p, 1, T0 + 333_333_333).verdict.allowed);
        assert!(throttle(d.bucket, &p, 1, T0 + 333_333_334).verdict.allowed);
    }

    #[test]
    fn refund_gives_back_but_never_beyond_burst() {
        let p = policy(10, S, 20);
        let d = throttle(None, &p, 20, T0);
        let r = refund(d.bucket, &p, 5, T0);
        assert_eq!(r.verdict.remaining, 5);
        assert_eq!(r.verdict.reset_after_ns, 3 * S / 2);
        assert!(throttle(r.bucket, &p, 5, T0).verdict.allowed);
        assert!(!throttle(r.bucket, &p, 6, T0).verdict.allowed);
        // Refunding more than was spent fills the bucket: no state.
        let r = refund(d.bucket, &p, 1_000, T0);
        assert_eq!((r.bucket, r.verdict.remaining), (None, 20));
        assert_eq!(refund(None, &p, u64::MAX, T0).bucket, None);
        // A refund never banks units: 1 s later the bucket refilled 10 of
        // the 20 on its own, and a refund of 15 only fills it.
        let r = refund(d.bucket, &p, 15, T0 + S);
        assert_eq!((r.bucket, r.verdict.remaining), (None, 20));
        let max = policy(crate::policy::COUNT_MAX, crate::policy::PERIOD_NS_MAX, 1);
        let _ = refund(Some(Bucket { tat_fp: u128::MAX }), &max, u64::MAX, u64::MAX);
    }

    /// A policy strategy over the whole supported range, kept to policies
    /// that refill within a few simulated hours so arrival sequences matter.
    fn policies() -> impl Strategy<Value = Policy> {
        (
            1u64..=10_000_000,
            prop_oneof![Just(S), Just(S / 4), Just(60 * S), Just(7 * S / 3)],
            1u64..=50,
        )
            .prop_filter_map("valid", |(count, period_ns, burst)| {
                Policy::new(count, period_ns, burst).ok()
            })
    }

    /// Arrivals: (gap since the previous arrival in ns, cost), with time
    /// sometimes stepping backward.
    fn arrivals() -> impl Strategy<Value = Vec<(i64, u64)>> {
        prop::collection::vec(
            (
                prop_oneof![8 => 0i64..2_000_000_000, 1 => -1_000_000_000i64..0],
                0u64..=8,
            ),
            1..200,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The 64-bit paths give exactly what the 128-bit arithmetic
        /// does, for every policy the validator admits and every span.
        #[test]
        fn the_64_bit_divisions_are_exact(
            count in prop_oneof![1u64..=1_000, 1u64..=u64::from(u32::MAX), 1u64..=crate::policy::COUNT_MAX],
            period_ns in crate::policy::PERIOD_NS_MIN..=crate::policy::PERIOD_NS_MAX,
            n in any::<u128>(),
            d in 1u128..,
            small in any::<u64>(),
        ) {
            let p = Policy { count, period_ns, burst: 1 };
            prop_assert_eq!(emission_fp(&p), (u128::from(period_ns) << I_QUANTUM_BITS).div_ceil(u128::from(count)) << TAT_ZERO_BITS);
            prop_assert!(emission_fp(&p) >= to_fp(period_ns).div_ceil(u128::from(count)), "rounded up");
            prop_assert_eq!(units_in(n, d), n / d);
            let (a, b) = (u128::from(small), u128::from(small / 3 + 1));
            prop_assert_eq!(units_in(a, b), a / b);
        }

        /// The reciprocal division is the division, for every dividend
        /// and divisor: small, large, powers of two and their neighbours,
        /// and dividends at and around multiples of the divisor.
        #[test]
        fn division_by_reciprocal_is_division(
            d in prop_oneof![1u64..=1_000, any::<u64>().prop_map(|d| d.max(1)), (0u32..64).prop_map(|b| 1u64 << b), (1u32..64).prop_map(|b| (1u64 << b) - 1), (1u32..64).prop_map(|b| (1u64 << b) + 1)],
            x in any::<u64>(),
            near in 0u8..3,
        ) {
            let x = match near {
                0 => x,
                // A multiple of d, or one below it.
                _ => (x / d * d).saturating_sub(u64::from(near - 1)),
            };
            prop_assert_eq!(div_by(x, d, u64::MAX / d), x / d);
            prop_assert_eq!(div_by(u64::MAX, d, u64::MAX / d), u64::MAX / d);
            prop_assert_eq!(div_by(0, d, u64::MAX / d), 0);
        }

        /// `throttle_q8` decides exactly as `throttle`, on every bucket
        /// state, wherever it answers at all.
        #[test]
        fn the_64_bit_relative_decision_is_throttle(
            count in prop_oneof![1u64..=1_000, 1u64..=crate::policy::COUNT_MAX],
            period_ns in prop_oneof![Just(S), Just(7 * S / 3), crate::policy::PERIOD_NS_MIN..=crate::policy::PERIOD_NS_MAX],
            burst in prop_oneof![1u64..=100, 1u64..=crate::policy::BURST_MAX],
            where_ in 0u8..4,
            spent_pick in any::<u64>(),
            cost_pick in any::<u64>(),
        ) {
            let p = Policy { count, period_ns, burst };
            prop_assume!(p.validate().is_ok());
            let cost = cost_pick % (p.burst + 1);
            // The depth, in 2^-8 ns (when it fits).
            let tau = (emission_fp(&p) * u128::from(burst)) >> TAT_ZERO_BITS;
            let spent = match where_ {
                0 => 0,
                1 => spent_pick >> 1,
                // Around the depth and below it, where decisions turn.
                _ => u64::try_from(tau).unwrap_or(u64::MAX >> 1).saturating_sub(spent_pick % (emission_fp(&p) >> TAT_ZERO_BITS).max(1) as u64 * u64::from(where_ - 1)),
            };
            // The division-free form, with a memo fresh, of another
            // policy, and of this one: always the same answer.
            let mut memo = IntervalMemo::default();
            let q8 = throttle_q8(spent, &p, cost);
            prop_assert_eq!(throttle_q8_memo(spent, &p, cost, &mut memo), q8);
            prop_assert_eq!(throttle_q8_memo(spent, &p, cost, &mut memo), q8);
            let other = Policy { count: count % 1_000 + 1, period_ns: S, burst: 1 };
            let _ = throttle_q8_memo(0, &other, 0, &mut memo);
            prop_assert_eq!(throttle_q8_memo(spent, &p, cost, &mut memo), q8);
            if let Some((v, new)) = q8 {
                let b = (spent > 0).then(|| Bucket { tat_fp: to_fp(T0) + (u128::from(spent) << TAT_ZERO_BITS) });
                let d = throttle_wide(b, &p, cost, T0);
                prop_assert_eq!(v, d.verdict);
                let want = d.bucket.map_or(0, |b| ((b.tat_fp - to_fp(T0)) >> TAT_ZERO_BITS) as u64);
                prop_assert_eq!(new, want);
            } else {
                prop_assert!(spent >= 1 << 63 || tau >= 1 << 63, "q8 declined a policy that fits");
            }
        }

        /// `throttle` (the 64-bit path where it can, the 128-bit one where
        /// it cannot) decides exactly as the 128-bit arithmetic alone, on
        /// any bucket: absent, behind now, a whole number of 2^-8 ns ahead,
        /// off that grid (a bucket this module never makes, but a caller
        /// can), near and past the 64-bit path's reach.
        #[test]
        fn throttle_is_its_128_bit_arithmetic(
            count in prop_oneof![1u64..=1_000, 1u64..=crate::policy::COUNT_MAX],
            period_ns in prop_oneof![Just(S), Just(7 * S / 3), crate::policy::PERIOD_NS_MIN..=crate::policy::PERIOD_NS_MAX],
            burst in prop_oneof![1u64..=100, 1u64..=crate::policy::BURST_MAX],
            kind in 0u8..6,
            pick in any::<u128>(),
            cost_pick in any::<u64>(),
            now in prop_oneof![Just(T0), any::<u64>()],
        ) {
            let p = Policy { count, period_ns, burst };
            prop_assume!(p.validate().is_ok());
            let cost = cost_pick % (p.burst + 1);
            let i = emission_fp(&p);
            let tau = i * u128::from(burst);
            let at = |ahead: u128| Some(Bucket { tat_fp: to_fp(now).saturating_add(ahead) });
            let bucket = match kind {
                0 => None,
                1 => Some(Bucket { tat_fp: to_fp(now).saturating_sub(pick % (to_fp(now) + 1)) }),
                // On the 2^-8 ns grid, around the depth where decisions turn.
                2 => at(tau.saturating_sub(pick % (2 * i)) & !((1 << TAT_ZERO_BITS) - 1)),
                3 => at((pick % (1 << 64)) << TAT_ZERO_BITS),
                4 => at(pick % (tau + 2 * i)),
                _ => Some(Bucket { tat_fp: pick }),
            };
            prop_assert_eq!(throttle(bucket, &p, cost, now), throttle_wide(bucket, &p, cost, now));
        }

        /// Admitted units in any window of length T never exceed
        /// burst + rate x T (windows measured on the times actually seen,
        /// which only grow in this property).
        #[test]
        fn admitted_never_exceeds_promise(p in policies(), gaps in prop::collection::vec((0u64..500_000_000, 1u64..=8), 1..300)) {
            let mut b = None;
            let mut now = T0;
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (gap, cost) in gaps {
                now += gap;
                let cost = cost.min(p.burst);
                let d = throttle(b, &p, cost, now);
                if d.verdict.allowed {
                    admitted.push((now, cost));
                }
                b = d.bucket;
            }
            for (i, &(start, _)) in admitted.iter().enumerate() {
                let mut units = 0u128;
                for &(t, c) in &admitted[i..] {
                    units += u128::from(c);
                    let window_ns = u128::from(t - start);
                    // units <= burst + count * window / period, in integers.
                    let bound = u128::from(p.burst) * u128::from(p.period_ns) + u128::from(p.count) * window_ns;
                    prop_assert!(units * u128::from(p.period_ns) <= bound,
                        "{units} units in {window_ns} ns under {p:?}");
                }
            }
        }

        /// A denied request changes nothing, whatever the clock does.
        #[test]
        fn denial_changes_nothing(p in policies(), seq in arrivals()) {
            let mut b = None;
            let mut now = T0;
            for (gap, cost) in seq {
                now = now.saturating_add_signed(gap);
                let cost = cost.min(p.burst);
                let d = throttle(b, &p, cost, now);
                if !d.verdict.allowed {
                    prop_assert_eq!(d.bucket, b);
                    prop_assert!(d.verdict.retry_after_ns > 0);
                }
                prop_assert_eq!(peek(b, &p, cost, now), d.verdict);
                b = d.bucket;
            }
        }

        /// Refunds count as units not spent: net of refunds, admitted units
        /// in any window of length T never exceed burst + rate x T, and no
        /// refund lifts `remaining` above the burst.
        #[test]
        fn refunds_never_exceed_promise(p in policies(), gaps in prop::collection::vec((0u64..500_000_000, 1u64..=8, prop::bool::weighted(0.2)), 1..200)) {
            let mut b = None;
            let mut now = T0;
            // (time, units): positive admitted, negative refunded.
            let mut events: Vec<(u64, i128)> = Vec::new();
            for (gap, units, is_refund) in gaps {
                now += gap;
                let units = units.min(p.burst);
                if is_refund {
                    let d = refund(b, &p, units, now);
                    prop_assert!(d.verdict.remaining <= p.burst);
                    prop_assert!(d.bucket.map_or(true, |nb| b.is_some_and(|ob| nb.tat_fp < ob.tat_fp)));
                    events.push((now, -i128::from(units)));
                    b = d.bucket;
                    continue;
                }
                let d = throttle(b, &p, units, now);
                if d.verdict.allowed {
                    events.push((now, i128::from(units)));
                }
                b = d.bucket;
            }
            for (i, &(start, _)) in events.iter().enumerate() {
                let mut units = 0i128;
                for &(t, n) in &events[i..] {
                    units += n;
                    let window_ns = i128::from(t - start);
                    let bound = i128::from(p.burst) * i128::from(p.period_ns) + i128::from(p.count) * window_ns;
                    prop_assert!(units * i128::from(p.period_ns) <= bound,
                        "{} net units in {} ns under {:?}", units, window_ns, p);
                }
            }
        }

        /// Retrying exactly retry_after later is admitted.
        #[test]
        fn retry_after_is_enough(p in policies(), seq in arrivals()) {
            let mut b = None;
            let mut now = T0;
            for (gap, cost) in seq {
                now = now.saturating_add_signed(gap);
                let cost = cost.min(p.burst);
                let d = throttle(b, &p, cost, now);
                if !d.verdict.allowed {
                    let later = now + d.verdict.retry_after_ns;
                    prop_assert!(throttle(b, &p, cost, later).verdict.allowed);
                    if d.verdict.retry_after_ns > 1 {
                        prop_assert!(!throttle(b, &p, cost, later - 1).verdict.allowed,
                            "retry_after is not the earliest time");
                    }
                }
                b = d.bucket;
            }
        }
    }
}
