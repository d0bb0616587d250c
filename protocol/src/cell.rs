//! redis-cell's `CL.THROTTLE`, as a pure function
//! `(tat, policy, quantity, now) -> (tat', verdict)`, with the module's
//! argument rules and its reply, so that redis-cell users can point their
//! code at Sluice's RESP listener unchanged.
//!
//! `CL.THROTTLE key max_burst count_per_period period [quantity]` is a GCRA
//! like [`gcra`](crate::gcra), but redis-cell's arithmetic differs from ours
//! in ways a caller can see, so this module does exactly what redis-cell
//! does rather than mapping onto [`gcra::throttle`](crate::gcra::throttle):
//!
//! - The emission interval `I` is `period x 1e9 / count` nanoseconds,
//!   divided in `f64` and truncated to whole nanoseconds (ours rounds up to
//!   2^-32 ns). An interval that truncates to 0 is "Zero rates are not
//!   supported", as are `count = 0` and `period = 0`.
//! - The bucket holds `max_burst + 1` units: the delay variation tolerance
//!   is `I x (max_burst + 1)` and the reply's `limit` is `max_burst + 1`.
//! - `new_tat = max(tat, now) + I x quantity`; the request is limited when
//!   `new_tat - tolerance > now`. A limited request changes nothing.
//! - `retry_after` is `new_tat - tolerance - now` when limited, and -1 s when
//!   allowed *or* when `quantity` exceeds the limit (such a request can never
//!   succeed: it is limited with -1, not an error). `reset_after` is
//!   `new_tat - now` when allowed and `tat - now` when limited.
//! - `remaining` is `(tolerance - reset_after) / I`, computed like redis-cell:
//!   both truncated to whole microseconds, divided in `f64`, truncated; 0
//!   when `tolerance - reset_after <= -I`.
//! - Times are reported in seconds: the whole seconds, plus one when at
//!   least a millisecond is left over (2.0009 s is 2, 2.001 s is 3).
//!   [`CellVerdict`] keeps the nanoseconds; [`CellVerdict::reply`] rounds.
//! - `quantity` defaults to 1; 0 peeks (an allowed 0 stores the same TAT).
//! - Integers parse as Rust's `i64::from_str` does (`+5` is 5, ` 5` is not
//!   a number); a bad one is "Couldn't parse as integer: ARG". Arguments
//!   are parsed in order, then the rate is checked.
//!
//! Where redis-cell has no defined behaviour, this module decides (and
//! says so in the error text):
//!
//! - Negative `max_burst`, `count`, `period` or `quantity` are rejected;
//!   redis-cell computes on with them and answers nonsense.
//! - `period` is at most [`PERIOD_S_MAX`] and a bucket may take at most
//!   [`TOLERANCE_NS_MAX`] to refill from empty; beyond those redis-cell's
//!   `i64` nanoseconds overflow.
//! - An emission interval under 1 microsecond (more than a million per
//!   second): redis-cell divides by zero microseconds there and reports
//!   `remaining` as `i64::MAX`; this module computes it in nanoseconds.
//! - Expiry: redis-cell's key expires after `reset_after` truncated to
//!   milliseconds, so its bucket can vanish up to 1 ms before its TAT; here
//!   a bucket is full exactly at its TAT.
//! - Keys are bytes; redis-cell requires UTF-8.

/// Nanoseconds per second.
const NS_PER_S: i64 = 1_000_000_000;
/// Nanoseconds per millisecond, the resolution of redis-cell's rounding.
const NS_PER_MS: i128 = 1_000_000;
/// Nanoseconds per microsecond, the resolution of redis-cell's `remaining`.
const NS_PER_US: i128 = 1_000;

/// Longest `period`, in seconds: the most whose nanoseconds fit an `i64`.
pub const PERIOD_S_MAX: i64 = i64::MAX / NS_PER_S;
/// Longest time a bucket may take to refill from empty,
/// `(max_burst + 1) x period / count`: 100 years. Every time the decision
/// stores or reports then stays far inside an `i64` of nanoseconds.
pub const TOLERANCE_NS_MAX: u64 = 100 * 366 * 86_400 * NS_PER_S as u64;
/// Arguments after the command name: key, max_burst, count per period,
/// period, and an optional quantity.
pub const ARGS_MIN: usize = 4;
/// See [`ARGS_MIN`].
pub const ARGS_MAX: usize = 5;
/// Most bytes of a bad argument quoted back in an error.
pub const ARG_ECHO_BYTES_MAX: usize = 128;

// A stored TAT is at most now + tolerance: both fit an i64 of ns for
// centuries after the Unix epoch.
const _: () = assert!(TOLERANCE_NS_MAX < (i64::MAX as u64) / 2);

/// Why a `CL.THROTTLE` is refused. The texts are redis-cell's where it has
/// one; the RESP layer prefixes them with `Cell error: ` as the module does.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    #[error("Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]")]
    Usage,
    #[error("Couldn't parse as integer: {0}")]
    NotInteger(String),
    #[error("Zero rates are not supported")]
    ZeroRate,
    #[error("{0} must not be negative")]
    Negative(&'static str),
    #[error("period must be at most {PERIOD_S_MAX} seconds")]
    PeriodTooLong,
    #[error(
        "(max_burst + 1) x period / count must be at most {} seconds",
        TOLERANCE_NS_MAX / NS_PER_S as u64
    )]
    RefillTooLong,
    #[error("key must be 1..={} bytes", crate::message::KEY_BYTES_MAX)]
    Key,
}

/// A validated redis-cell limit, in the units the decision works in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CellPolicy {
    /// `max_burst + 1`: the units a full bucket holds, reported as `limit`.
    pub limit: i64,
    /// The emission interval, ns: `period / count`, truncated.
    pub emission_ns: u64,
    /// The delay variation tolerance, ns: `emission_ns x limit`.
    pub tolerance_ns: u64,
}

impl CellPolicy {
    /// Validates redis-cell's three numbers (period in seconds).
    pub fn new(max_burst: i64, count: i64, period_s: i64) -> Result<CellPolicy, CellError> {
        if count == 0 || period_s == 0 {
            return Err(CellError::ZeroRate);
        }
        if max_burst < 0 {
            return Err(CellError::Negative("max_burst"));
        }
        if count < 0 {
            return Err(CellError::Negative("count per period"));
        }
        if period_s < 0 {
            return Err(CellError::Negative("period"));
        }
        if period_s > PERIOD_S_MAX {
            return Err(CellError::PeriodTooLong);
        }
        // redis-cell: Duration::nanoseconds(((ns as f64) / (n as f64)) as i64).
        let period_ns = period_s * NS_PER_S;
        let emission = ((period_ns as f64) / (count as f64)) as i64;
        let Ok(emission_ns) = u64::try_from(emission) else {
            return Err(CellError::ZeroRate);
        };
        if emission_ns == 0 {
            return Err(CellError::ZeroRate);
        }
        let limit = i128::from(max_burst) + 1;
        let tolerance = i128::from(emission_ns) * limit;
        if tolerance > i128::from(TOLERANCE_NS_MAX) {
            return Err(CellError::RefillTooLong);
        }
        Ok(CellPolicy {
            // Both fit: limit <= tolerance <= TOLERANCE_NS_MAX < i64::MAX.
            limit: limit as i64,
            emission_ns,
            tolerance_ns: tolerance as u64,
        })
    }
}

impl CellPolicy {
    /// The policy from what [`CellPolicy::new`] derived (`limit` =
    /// `max_burst + 1` and the emission interval), as protocol v1's CELL
    /// carries it: the same checks, so a forwarded request is exactly as
    /// valid as the one its entry node parsed.
    pub fn from_parts(limit: i64, emission_ns: u64) -> Result<CellPolicy, CellError> {
        if emission_ns == 0 || emission_ns > i64::MAX as u64 {
            return Err(CellError::ZeroRate);
        }
        if limit < 1 {
            return Err(CellError::Negative("max_burst"));
        }
        let tolerance = i128::from(emission_ns) * i128::from(limit);
        if tolerance > i128::from(TOLERANCE_NS_MAX) {
            return Err(CellError::RefillTooLong);
        }
        Ok(CellPolicy {
            limit,
            emission_ns,
            tolerance_ns: tolerance as u64,
        })
    }
}

/// A parsed, validated `CL.THROTTLE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellRequest<'a> {
    /// The bucket's name.
    pub key: &'a [u8],
    /// The limit.
    pub policy: CellPolicy,
    /// Units to spend; 0 peeks.
    pub quantity: u64,
}

impl<'a> CellRequest<'a> {
    /// Parses the arguments after the command name, in redis-cell's order:
    /// arity, each integer left to right, then the rate, then the quantity.
    pub fn parse(args: &[&'a [u8]]) -> Result<CellRequest<'a>, CellError> {
        if !(ARGS_MIN..=ARGS_MAX).contains(&args.len()) {
            return Err(CellError::Usage);
        }
        let max_burst = parse_i64(args[1])?;
        let count = parse_i64(args[2])?;
        let period_s = parse_i64(args[3])?;
        let quantity = match args.get(4) {
            Some(q) => parse_i64(q)?,
            None => 1,
        };
        let policy = CellPolicy::new(max_burst, count, period_s)?;
        let quantity = u64::try_from(quantity).map_err(|_| CellError::Negative("quantity"))?;
        // After redis-cell's own checks: a key as protocol v1 bounds it.
        if !(1..=crate::message::KEY_BYTES_MAX).contains(&args[0].len()) {
            return Err(CellError::Key);
        }
        Ok(CellRequest {
            key: args[0],
            policy,
            quantity,
        })
    }
}

/// Parses an integer argument as redis-cell does (Rust's `i64::from_str`).
#[inline]
pub fn parse_i64(arg: &[u8]) -> Result<i64, CellError> {
    // The usual argument, up to 18 plain digits, cannot overflow: summed
    // straight (a UTF-8 check and `str::parse` cost about 100 instructions
    // each, four arguments a request). Anything else goes the long way,
    // out of line, so that this part inlines into the caller.
    // One pass that checks and sums (an `all` then a `fold` was two loops
    // of iterator code: about 35 instructions an argument).
    if (1..=18).contains(&arg.len()) {
        let mut v = 0i64;
        for &b in arg {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                return parse_i64_slow(arg);
            }
            v = v * 10 + i64::from(d);
        }
        return Ok(v);
    }
    parse_i64_slow(arg)
}

#[cold]
#[inline(never)]
fn parse_i64_slow(arg: &[u8]) -> Result<i64, CellError> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            let shown = &arg[..arg.len().min(ARG_ECHO_BYTES_MAX)];
            CellError::NotInteger(String::from_utf8_lossy(shown).into_owned())
        })
}

/// What `CL.THROTTLE` answers, with times still in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CellVerdict {
    /// Whether the request was limited (nothing spent).
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: i64,
    /// Units that could still be spent now.
    pub remaining: i64,
    /// Time until the request would be allowed; -1 s when allowed or never.
    pub retry_after_ns: i64,
    /// Time until the bucket is full again.
    pub reset_after_ns: i64,
}

impl CellVerdict {
    /// Seconds until a retry, rounded as redis-cell rounds; -1 when allowed.
    pub fn retry_after_s(&self) -> i64 {
        round_s(self.retry_after_ns)
    }

    /// Seconds until the bucket is full, rounded as redis-cell rounds.
    pub fn reset_after_s(&self) -> i64 {
        round_s(self.reset_after_ns)
    }

    /// The five integers of the reply, in order.
    pub fn reply(&self) -> [i64; 5] {
        [
            i64::from(self.limited),
            self.limit,
            self.remaining,
            self.retry_after_s(),
            self.reset_after_s(),
        ]
    }
}

/// A decision: the verdict, and the TAT to store afterwards (`None`: the
/// bucket is full, store nothing). A limited request returns the TAT given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellDecision {
    /// What the caller is told.
    pub verdict: CellVerdict,
    /// The bucket's theoretical arrival time, ns, or `None` when full.
    pub tat_ns: Option<u64>,
}

/// Whole seconds, plus one when at least a millisecond is left over; a
/// negative duration keeps its (truncated) whole seconds.
fn round_s(ns: i64) -> i64 {
    // In i64 (a 128-bit division was a library call per field): dividing
    // by a positive constant cannot overflow, and |whole| <= |ns| / 1e9,
    // so whole + 1 fits.
    let whole = ns / NS_PER_S;
    let sub_ms = (ns % NS_PER_S) / NS_PER_MS as i64;
    whole + i64::from(sub_ms > 0)
}

/// `(tolerance - ttl) / I` in units, the way redis-cell computes it.
fn remaining_units(next_ns: i128, emission_ns: i128) -> i64 {
    // The same arithmetic in 64 bits whenever both fit, as they do for
    // every policy CellPolicy::new accepts (its tolerance is at most
    // TOLERANCE_NS_MAX): a 128-bit division and a 128-bit-to-f64
    // conversion were library calls, about 100 instructions a request.
    // Truncating division and the conversion to f64 of the same integer
    // give the same results at either width.
    if let (Ok(next), Ok(emission)) = (i64::try_from(next_ns), i64::try_from(emission_ns)) {
        if emission > 0 {
            let emission_us = emission / NS_PER_US as i64;
            if emission_us == 0 {
                return next / emission;
            }
            return ((next / NS_PER_US as i64) as f64 / emission_us as f64) as i64;
        }
    }
    remaining_units_wide(next_ns, emission_ns)
}

/// [`remaining_units`] at 128 bits.
fn remaining_units_wide(next_ns: i128, emission_ns: i128) -> i64 {
    let emission_us = emission_ns / NS_PER_US;
    if emission_us == 0 {
        // redis-cell divides by zero here (see the module docs).
        return i64::try_from(next_ns / emission_ns).unwrap_or(i64::MAX);
    }
    let next_us = next_ns / NS_PER_US;
    // As redis-cell: f64 division of whole microseconds, truncated
    // (saturating, though both are far below 2^53 here).
    ((next_us as f64) / (emission_us as f64)) as i64
}

/// Spends `quantity` units from the bucket whose TAT is `tat_ns` (absent,
/// or not after `now_ns`, means full) at `now_ns`. `policy` comes from
/// [`CellPolicy::new`]; any `quantity` is accepted.
pub fn throttle(
    tat_ns: Option<u64>,
    policy: &CellPolicy,
    quantity: u64,
    now_ns: u64,
) -> CellDecision {
    let now = i128::from(now_ns);
    // A full bucket (redis-cell: an expired, absent key) counts from now.
    let tat = tat_ns.map_or(now, |t| i128::from(t).max(now));
    let emission = i128::from(policy.emission_ns);
    let tolerance = i128::from(policy.tolerance_ns);
    // Below 2^64 x 2^64: no overflow in i128.
    let increment = emission * i128::from(quantity);
    let new_tat = tat + increment;
    let diff = now - (new_tat - tolerance);
    let never = i128::from(-NS_PER_S);
    let (limited, retry_after, ttl, stored) = if diff < 0 {
        let retry = if increment <= tolerance { -diff } else { never };
        (true, retry, tat - now, tat_ns)
    } else {
        // Allowed means new_tat <= now + tolerance.
        let stored = (new_tat > now).then(|| u64::try_from(new_tat).unwrap_or(u64::MAX));
        (false, never, new_tat - now, stored)
    };
    let next = tolerance - ttl;
    let remaining = if next > -emission {
        remaining_units(next, emission)
    } else {
        0
    };
    let verdict = CellVerdict {
        limited,
        limit: policy.limit,
        remaining,
        // retry <= tat - now and ttl <= tolerance: both bounded by the TATs
        // stored, which stay below i64::MAX; saturate regardless.
        retry_after_ns: saturate(retry_after),
        reset_after_ns: saturate(ttl),
    };
    CellDecision {
        verdict,
        tat_ns: stored,
    }
}

fn saturate(ns: i128) -> i64 {
    i64::try_from(ns).unwrap_or(if ns < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    proptest::proptest! {
        /// Seconds rounded in 64 bits are the seconds rounded in 128, over
        /// every i64 and around the second and millisecond edges.
        #[test]
        fn rounding_in_64_bits_is_rounding_in_128(
            ns in proptest::num::i64::ANY,
            small in -5_000_000_000i64..5_000_000_000,
        ) {
            let wide = |ns: i64| {
                let ns = i128::from(ns);
                let whole = ns / i128::from(NS_PER_S);
                let sub_ms = (ns % i128::from(NS_PER_S)) / NS_PER_MS;
                (whole + i128::from(sub_ms > 0)) as i64
            };
            proptest::prop_assert_eq!(round_s(ns), wide(ns));
            proptest::prop_assert_eq!(round_s(small), wide(small));
        }

        /// The 64-bit remaining count is the 128-bit one, emission
        /// intervals below and above a microsecond, `next` of either sign.
        #[test]
        fn remaining_in_64_bits_is_remaining_in_128(
            next in proptest::prop_oneof![proptest::num::i64::ANY, -10_000i64..10_000_000_000],
            emission in proptest::prop_oneof![1i64..2_000, 1i64..=i64::MAX],
            k in -1_000i64..1_000,
            r in -2i64..=2,
        ) {
            // Also right at a multiple of the interval, where truncation
            // shows.
            let edge = (emission.min(1 << 40) * k).saturating_add(r);
            for next in [next, edge] {
                let (next, emission) = (i128::from(next), i128::from(emission));
                proptest::prop_assert_eq!(
                    remaining_units(next, emission),
                    remaining_units_wide(next, emission)
                );
            }
        }

        /// Integer arguments parse exactly as `i64::from_str` parses them,
        /// the fast path for plain digits included (`/` and `:` are the
        /// bytes either side of the digits).
        #[test]
        fn parse_i64_is_from_str(s in "[-+]?[0-9a :/]{0,20}", n in proptest::num::i64::ANY) {
            let std = |s: &str| s.parse::<i64>().ok();
            proptest::prop_assert_eq!(parse_i64(s.as_bytes()).ok(), std(&s));
            let n = n.to_string();
            proptest::prop_assert_eq!(parse_i64(n.as_bytes()).ok(), std(&n));
            let padded = format!("000{}", n.trim_start_matches('-'));
            proptest::prop_assert_eq!(parse_i64(padded.as_bytes()).ok(), std(&padded));
        }
    }

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * S;

    fn req<'a>(args: &[&'a str]) -> Result<CellRequest<'a>, CellError> {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        CellRequest::parse(&bytes)
    }

    /// A bucket in a one-key store, driven by a manual clock.
    struct Store {
        clock: ManualClock,
        tat_ns: Option<u64>,
    }

    impl Store {
        fn new() -> Store {
            Store {
                clock: ManualClock::new(T0),
                tat_ns: None,
            }
        }

        fn throttle(&mut self, args: &[&str]) -> CellVerdict {
            let r = req(args).expect("valid arguments");
            let d = throttle(self.tat_ns, &r.policy, r.quantity, self.clock.now_ns());
            self.tat_ns = d.tat_ns;
            d.verdict
        }
    }

    #[test]
    fn readme_example() {
        // redis-cell's README: CL.THROTTLE user123 15 30 60 1.
        let mut s = Store::new();
        let v = s.throttle(&["user123", "15", "30", "60", "1"]);
        assert_eq!(v.reply(), [0, 16, 15, -1, 2]);
        // The quantity defaults to 1.
        let v = s.throttle(&["user123", "15", "30", "60"]);
        assert_eq!(v.reply(), [0, 16, 14, -1, 4]);
    }

    /// redis-cell's own table-driven test (limit 5, one per second), with
    /// its unrounded durations.
    #[test]
    fn redis_cell_rate_limit_table() {
        let mut s = Store::new();
        let never = -(S as i64);
        let cases: [(u64, &str, bool, i64, u64, i64); 15] = [
            // (ms after start, quantity, limited, remaining, reset ns, retry ns)
            (0, "6", true, 5, 0, never),
            (0, "1", false, 4, S, never),
            (0, "1", false, 3, 2 * S, never),
            (0, "1", false, 2, 3 * S, never),
            (0, "1", false, 1, 4 * S, never),
            (0, "1", false, 0, 5 * S, never),
            (0, "1", true, 0, 5 * S, S as i64),
            (3_000, "1", false, 2, 3_000 * MS, never),
            (3_100, "1", false, 1, 3_900 * MS, never),
            (4_000, "1", false, 1, 4_000 * MS, never),
            (8_000, "1", false, 4, 1_000 * MS, never),
            (9_500, "1", false, 4, 1_000 * MS, never),
            (9_500, "0", false, 4, S, never),
            (9_500, "2", false, 2, 3 * S, never),
            (9_500, "5", true, 2, 3 * S, 3 * S as i64),
        ];
        for (i, (at_ms, q, limited, remaining, reset_ns, retry_ns)) in cases.into_iter().enumerate()
        {
            s.clock.set(T0 + at_ms * MS);
            let v = s.throttle(&["foo", "4", "1", "1", q]);
            assert_eq!(v.limited, limited, "case {i}");
            assert_eq!(v.limit, 5, "case {i}");
            assert_eq!(v.remaining, remaining, "case {i}");
            assert_eq!(v.reset_after_ns, reset_ns as i64, "case {i}");
            assert_eq!(v.retry_after_ns, retry_ns, "case {i}");
        }
    }

    #[test]
    fn no_burst_one_per_two_seconds() {
        // redis-cell's end-to-end test: max_burst 0, 1 per 2 s.
        let mut s = Store::new();
        let args = ["user123", "0", "1", "2", "1"];
        assert_eq!(s.throttle(&args).reply(), [0, 1, 0, -1, 2]);
        s.clock.advance(1_000);
        assert_eq!(s.throttle(&args).reply(), [1, 1, 0, 2, 2]);
        s.clock.advance(2 * S);
        assert_eq!(s.throttle(&args).reply(), [0, 1, 0, -1, 2]);
    }

    #[test]
    fn seconds_round_up_from_a_millisecond() {
        assert_eq!(round_s(2 * S as i64), 2);
        assert_eq!(round_s((2 * S + MS - 1) as i64), 2);
        assert_eq!(round_s((2 * S + MS) as i64), 3);
        assert_eq!(round_s((S - 1) as i64), 1);
        assert_eq!(round_s(MS as i64 - 1), 0);
        assert_eq!(round_s(0), 0);
        assert_eq!(round_s(-(S as i64)), -1);
        assert_eq!(round_s(-(S as i64) - 5 * MS as i64), -1);
        assert_eq!(round_s(i64::MAX), i64::MAX / S as i64 + 1);
        assert_eq!(round_s(i64::MIN), i64::MIN / S as i64);
    }

    #[test]
    fn quantity_above_the_limit_is_limited_with_no_retry() {
        let mut s = Store::new();
        let v = s.throttle(&["k", "2", "1", "1", "4"]);
        assert_eq!(v.reply(), [1, 3, 3, -1, 0]);
        assert_eq!(s.tat_ns, None, "a limited request stores nothing");
        // Exactly the limit is fine.
        assert_eq!(
            s.throttle(&["k", "2", "1", "1", "3"]).reply(),
            [0, 3, 0, -1, 3]
        );
        // Now over the limit with a spent bucket: still -1, reset counts.
        assert_eq!(
            s.throttle(&["k", "2", "1", "1", "4"]).reply(),
            [1, 3, 0, -1, 3]
        );
    }

    #[test]
    fn quantity_zero_peeks() {
        let mut s = Store::new();
        assert_eq!(
            s.throttle(&["k", "4", "1", "1", "0"]).reply(),
            [0, 5, 5, -1, 0]
        );
        assert_eq!(s.tat_ns, None, "peeking a full bucket stores nothing");
        s.throttle(&["k", "4", "1", "1", "2"]);
        let before = s.tat_ns;
        assert_eq!(
            s.throttle(&["k", "4", "1", "1", "0"]).reply(),
            [0, 5, 3, -1, 2]
        );
        assert_eq!(s.tat_ns, before);
    }

    #[test]
    fn fractional_intervals_truncate_like_redis_cell() {
        // 60 s / 7 = 8.571428571428... s; redis-cell truncates to whole ns.
        let p = CellPolicy::new(0, 7, 60).unwrap();
        assert_eq!(p.emission_ns, 8_571_428_571);
        assert_eq!(p.tolerance_ns, 8_571_428_571);
        let d = throttle(None, &p, 1, T0);
        assert_eq!(d.verdict.reply(), [0, 1, 0, -1, 9]);
        let denied = throttle(d.tat_ns, &p, 1, T0 + 571_428_571);
        assert_eq!(denied.verdict.retry_after_ns, 8_000_000_000);
        assert_eq!(denied.verdict.retry_after_s(), 8);
        // One ns short of the retry time is still limited; at it, allowed.
        assert!(
            throttle(d.tat_ns, &p, 1, T0 + 8_571_428_570)
                .verdict
                .limited
        );
        assert!(
            !throttle(d.tat_ns, &p, 1, T0 + 8_571_428_571)
                .verdict
                .limited
        );
    }

    #[test]
    fn sub_microsecond_intervals_count_remaining_in_ns() {
        // 10 million per second, burst 99: I = 100 ns.
        let p = CellPolicy::new(99, 10_000_000, 1).unwrap();
        assert_eq!(p.emission_ns, 100);
        let d = throttle(None, &p, 1, T0);
        assert_eq!(d.verdict.reply(), [0, 100, 99, -1, 0]);
        assert_eq!(d.verdict.reset_after_ns, 100);
    }

    #[test]
    fn a_stale_tat_is_a_full_bucket() {
        let p = CellPolicy::new(4, 1, 1).unwrap();
        let v = throttle(Some(T0 - S), &p, 1, T0).verdict;
        assert_eq!(v.reply(), [0, 5, 4, -1, 1]);
        // And a clock behind the TAT sees a spent bucket, granting nothing.
        let spent = throttle(None, &p, 5, T0).tat_ns;
        let back = throttle(spent, &p, 1, T0 - 3_600 * S);
        assert!(back.verdict.limited);
        assert_eq!(back.tat_ns, spent);
    }

    #[test]
    fn argument_errors_match_redis_cell() {
        assert_eq!(req(&["k", "1", "1"]), Err(CellError::Usage));
        assert_eq!(req(&["k", "1", "1", "1", "1", "1"]), Err(CellError::Usage));
        assert_eq!(
            CellError::Usage.to_string(),
            "Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]"
        );
        let e = req(&["k", "x", "y", "1"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Couldn't parse as integer: x",
            "first bad one wins"
        );
        for bad in ["", " 1", "1 ", "1.0", "0x10", "9223372036854775808", "1e3"] {
            let e = req(&["k", "1", bad, "1"]).unwrap_err();
            assert_eq!(e, CellError::NotInteger(bad.to_owned()), "{bad:?}");
        }
        // Parse errors come before rate errors, as in redis-cell.
        assert_eq!(
            req(&["k", "1", "0", "1", "q"]).unwrap_err().to_string(),
            "Couldn't parse as integer: q"
        );
        assert_eq!(req(&["k", "+5", "1", "1"]).unwrap().policy.limit, 6);
        assert_eq!(req(&["k", "1", "0", "60"]), Err(CellError::ZeroRate));
        assert_eq!(req(&["k", "1", "1", "0"]), Err(CellError::ZeroRate));
        assert_eq!(req(&["k", "1", "-1", "0"]), Err(CellError::ZeroRate));
        assert_eq!(
            CellError::ZeroRate.to_string(),
            "Zero rates are not supported"
        );
        // More than 1e9 per second truncates to a zero interval.
        assert_eq!(
            req(&["k", "1", "1000000001", "1"]),
            Err(CellError::ZeroRate)
        );
        assert!(req(&["k", "1", "1000000000", "1"]).is_ok());
        assert_eq!(
            req(&["k", "-1", "1", "1"]),
            Err(CellError::Negative("max_burst"))
        );
        assert_eq!(
            req(&["k", "1", "-1", "1"]),
            Err(CellError::Negative("count per period"))
        );
        assert_eq!(
            req(&["k", "1", "1", "-1"]),
            Err(CellError::Negative("period"))
        );
        assert_eq!(
            req(&["k", "1", "1", "1", "-1"]),
            Err(CellError::Negative("quantity"))
        );
        let too_long = (PERIOD_S_MAX + 1).to_string();
        assert_eq!(
            req(&["k", "0", "1000000", &too_long]),
            Err(CellError::PeriodTooLong)
        );
        // One per day with a million in the burst: 2,700 years to refill.
        assert_eq!(
            req(&["k", "1000000", "1", "86400"]),
            Err(CellError::RefillTooLong)
        );
        assert_eq!(
            req(&["k", "9223372036854775807", "1", "1"]),
            Err(CellError::RefillTooLong)
        );
        // Keys as protocol v1 bounds them (redis-cell takes any).
        assert_eq!(req(&["", "1", "1", "1"]), Err(CellError::Key));
        let long = "k".repeat(513);
        assert_eq!(req(&[&long, "1", "1", "1"]), Err(CellError::Key));
        assert!(req(&[&"k".repeat(512), "1", "1", "1"]).is_ok());
        let huge_q = req(&["k", "1", "1", "1", "9223372036854775807"]).unwrap();
        assert_eq!(huge_q.quantity, i64::MAX as u64);
        let d = throttle(None, &huge_q.policy, huge_q.quantity, T0);
        assert_eq!(d.verdict.reply(), [1, 2, 2, -1, 0]);
        // Long arguments are quoted back shortened, and bytes need not be UTF-8.
        let long = "7".repeat(1_000) + "x";
        let CellError::NotInteger(shown) = req(&["k", &long, "1", "1"]).unwrap_err() else {
            panic!("not a parse error");
        };
        assert_eq!(shown.len(), ARG_ECHO_BYTES_MAX);
        assert!(parse_i64(b"\xff1").is_err());
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let p = CellPolicy::new(0, 1, TOLERANCE_NS_MAX as i64 / NS_PER_S).unwrap();
        for now in [0, T0, u64::MAX - 1, u64::MAX] {
            for q in [0, 1, 2, u64::MAX] {
                let d = throttle(None, &p, q, now);
                let _ = throttle(d.tat_ns, &p, q, now);
                let _ = throttle(Some(u64::MAX), &p, q, now);
            }
        }
    }
}
