//! A limit's numbers: `count` units per `period_ns`, with a `burst`
//! capacity, and the human syntax used by the CLI and configs
//! (`10/s`, `100/250ms`, `5/m`, `1/d`).

use std::fmt;

/// Nanoseconds per unit of the period syntax.
const NS_PER_MS: u64 = 1_000_000;
const NS_PER_S: u64 = 1_000 * NS_PER_MS;

/// Shortest period a policy may have: 1 microsecond.
pub const PERIOD_NS_MIN: u64 = 1_000;
/// Longest period a policy may have: 366 days.
pub const PERIOD_NS_MAX: u64 = 366 * 86_400 * NS_PER_S;
/// Largest count per period (about 1.1e12: 10 M/s over a whole day fits).
pub const COUNT_MAX: u64 = 1 << 40;
/// Largest burst.
pub const BURST_MAX: u64 = 1 << 40;
/// Longest time a bucket may take to refill from empty (burst x period /
/// count): 10 years. This keeps every time the decision reports inside a
/// `u64` of nanoseconds.
pub const REFILL_NS_MAX: u64 = 10 * 366 * 86_400 * NS_PER_S;
/// Highest rate, in units per second, for which the decision is exact to
/// better than one part in a million (see `gcra`): 10 million per second.
pub const RATE_PER_S_EXACT_MAX: u64 = 10_000_000;

// The other kinds' bounds (re-exported by `limit`), here beside the token
// bucket's because PolicyError names them: this module imports no other
// limit module.

/// Shortest window: the same floor as a token bucket's period, so that any
/// period the CLI accepts for one kind it accepts for all.
pub const WINDOW_NS_MIN: u64 = PERIOD_NS_MIN;
/// Longest window: 366 days, like a token bucket's period.
pub const WINDOW_NS_MAX: u64 = PERIOD_NS_MAX;
/// Largest `limit` of a fixed window or sliding counter: the same as a token
/// bucket's count. Their state is two or three counters whatever the limit.
pub const WINDOW_LIMIT_MAX: u64 = COUNT_MAX;
/// Largest `limit` of a sliding log. The log keeps one 16-byte run per
/// distinct admission instant in the window, at most `limit` runs, so this
/// bounds a key's memory to 1 MiB.
pub const SLIDING_LOG_LIMIT_MAX: u64 = 65_536;
/// Largest `limit` of a concurrency limit. A key keeps one 24-byte lease per
/// holder, at most `limit`, so this bounds a key's memory to 1.5 MiB, and
/// release and renew (a scan of the leases) to `limit` steps.
pub const CONCURRENCY_LIMIT_MAX: u64 = 65_536;
/// Shortest lease: 1 ms. A shorter lease would expire before its holder
/// heard it had been granted.
pub const LEASE_NS_MIN: u64 = NS_PER_MS;
/// Longest lease: 1 day, the longest a crashed holder can keep a slot.
pub const LEASE_NS_MAX: u64 = 86_400 * NS_PER_S;
/// Hundredths of a percent in a whole limit (a reserve's scale;
/// re-exported by `priority`).
pub const BP_WHOLE: u16 = 10_000;

/// A token-bucket policy: `count` units per `period_ns`, up to `burst`
/// units at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Units added per period.
    pub count: u64,
    /// The period, in nanoseconds.
    pub period_ns: u64,
    /// The bucket's capacity: the most units admitted at once.
    pub burst: u64,
}

/// Why a policy or a cost is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("count must be 1..={COUNT_MAX}")]
    Count,
    #[error("period must be {PERIOD_NS_MIN}..={PERIOD_NS_MAX} ns")]
    Period,
    #[error("burst must be 1..={BURST_MAX}")]
    Burst,
    #[error("burst x period / count must be at most {REFILL_NS_MAX} ns")]
    RefillTooLong,
    /// A token bucket's: the cost is more than its burst.
    #[error("cost {cost} exceeds burst {burst}: it could never be admitted")]
    CostExceedsBurst { cost: u64, burst: u64 },
    /// Every other kind's (`limit::Limit::check_cost`), named by its kind:
    /// `limit` is the most units it ever admits at once. The same wire
    /// status, `COST_EXCEEDS_BURST`.
    #[error("cost {cost} exceeds the {kind} limit of {limit}: it could never be admitted")]
    CostExceedsLimit {
        kind: crate::kind::Kind,
        cost: u64,
        limit: u64,
    },
    #[error("window limit must be 1..={}", WINDOW_LIMIT_MAX)]
    WindowLimit,
    /// A reserved share above the whole limit (see the `priority` module).
    #[error(
        "a reserve must be 0..={} hundredths of a percent (0..=100 %)",
        BP_WHOLE
    )]
    Reserve,
    #[error(
        "sliding-log limit must be 1..={} (it bounds the log's memory per key)",
        SLIDING_LOG_LIMIT_MAX
    )]
    SlidingLogLimit,
    #[error("window must be {}..={} ns", WINDOW_NS_MIN, WINDOW_NS_MAX)]
    Window,
    #[error("concurrency limit must be 1..={}", CONCURRENCY_LIMIT_MAX)]
    ConcurrencyLimit,
    #[error("lease must be {}..={} ns", LEASE_NS_MIN, LEASE_NS_MAX)]
    Lease,
}

impl Policy {
    /// A policy from its three numbers, validated.
    pub fn new(count: u64, period_ns: u64, burst: u64) -> Result<Policy, PolicyError> {
        let policy = Policy {
            count,
            period_ns,
            burst,
        };
        policy.validate()?;
        Ok(policy)
    }

    /// Checks every field against its limit. The decision functions assume
    /// a validated policy.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(1..=COUNT_MAX).contains(&self.count) {
            return Err(PolicyError::Count);
        }
        if !(PERIOD_NS_MIN..=PERIOD_NS_MAX).contains(&self.period_ns) {
            return Err(PolicyError::Period);
        }
        if !(1..=BURST_MAX).contains(&self.burst) {
            return Err(PolicyError::Burst);
        }
        // burst x period / count > REFILL_NS_MAX (the time to refill), without
        // the 128-bit division (every THROTTLE validates its policy as it is
        // parsed): floor(x / c) > m exactly when x >= (m + 1) x c, and both
        // products fit a u128.
        let refill = u128::from(self.burst) * u128::from(self.period_ns);
        if refill >= (u128::from(REFILL_NS_MAX) + 1) * u128::from(self.count) {
            return Err(PolicyError::RefillTooLong);
        }
        Ok(())
    }

    /// Checks that `cost` could ever be admitted under this policy.
    pub fn check_cost(&self, cost: u64) -> Result<(), PolicyError> {
        if cost > self.burst {
            return Err(PolicyError::CostExceedsBurst {
                cost,
                burst: self.burst,
            });
        }
        Ok(())
    }
}

/// A rate as written by people: `COUNT/PERIOD`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Units per period.
    pub count: u64,
    /// The period, in nanoseconds.
    pub period_ns: u64,
}

/// Why a rate or period string does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("expected COUNT/PERIOD, like 10/s or 100/250ms, got {0:?}")]
    Rate(String),
    #[error("expected a period like 250ms, s, 10s, m, h or d, got {0:?}")]
    Period(String),
    #[error("expected a positive whole number, got {0:?}")]
    Number(String),
}

impl std::str::FromStr for Rate {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Rate, ParseError> {
        let (count, period) = s
            .split_once('/')
            .ok_or_else(|| ParseError::Rate(s.to_owned()))?;
        let count = parse_positive(count)?;
        let period_ns = parse_period_ns(period)?;
        Ok(Rate { count, period_ns })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, format_period(self.period_ns))
    }
}

/// Parses a positive whole number (surrounding spaces allowed).
pub(crate) fn parse_positive(s: &str) -> Result<u64, ParseError> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ParseError::Number(s.to_owned())),
    }
}

/// Parses a period: an optional positive whole number followed by a unit
/// (`ns`, `us`, `ms`, `s`, `m`, `h`, `d`): `250ms`, `s`, `10s`, `m`, `1d`.
pub fn parse_period_ns(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n = if digits.is_empty() {
        1
    } else {
        parse_positive(digits)?
    };
    let unit_ns = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => NS_PER_MS,
        "s" => NS_PER_S,
        "m" => 60 * NS_PER_S,
        "h" => 3_600 * NS_PER_S,
        "d" => 86_400 * NS_PER_S,
        _ => return Err(ParseError::Period(s.to_owned())),
    };
    n.checked_mul(unit_ns)
        .ok_or_else(|| ParseError::Period(s.to_owned()))
}

/// The shortest exact spelling of a period in the syntax above.
pub fn format_period(ns: u64) -> String {
    const UNITS: [(u64, &str); 7] = [
        (86_400 * NS_PER_S, "d"),
        (3_600 * NS_PER_S, "h"),
        (60 * NS_PER_S, "m"),
        (NS_PER_S, "s"),
        (NS_PER_MS, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    for (unit_ns, name) in UNITS {
        if ns % unit_ns == 0 && ns > 0 {
            let n = ns / unit_ns;
            return if n == 1 {
                name.to_owned()
            } else {
                format!("{n}{name}")
            };
        }
    }
    "0ns".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refill_bound_at_its_edge() {
        // REFILL_NS_MAX + 1 = 7 x 13 x 43 x 8501 x 9506375477: a burst and
        // period whose refill is exactly one nanosecond over, and one less.
        let (period_ns, burst) = (7 * 13 * 43 * 8501, 9_506_375_477);
        assert_eq!(
            u128::from(period_ns) * u128::from(burst),
            u128::from(REFILL_NS_MAX) + 1
        );
        assert_eq!(
            Policy::new(1, period_ns, burst),
            Err(PolicyError::RefillTooLong)
        );
        assert!(Policy::new(1, period_ns, burst - 1).is_ok());
    }

    proptest::proptest! {
        /// The refill bound without a division is the bound with one,
        /// exactly, including at its edge.
        #[test]
        fn the_refill_bound_is_the_divided_one(
            count in 1..=COUNT_MAX,
            period_ns in PERIOD_NS_MIN..=PERIOD_NS_MAX,
            burst in 1..=BURST_MAX,
            edge in proptest::bool::ANY,
        ) {
            // Half the cases sit on the edge: burst x period close to
            // REFILL_NS_MAX x count.
            let burst = if edge {
                let b = (u128::from(REFILL_NS_MAX) * u128::from(count) / u128::from(period_ns))
                    .clamp(1, u128::from(BURST_MAX)) as u64;
                (b + burst % 3).saturating_sub(1).clamp(1, BURST_MAX)
            } else {
                burst
            };
            let p = Policy { count, period_ns, burst };
            let divided = u128::from(burst) * u128::from(period_ns) / u128::from(count)
                > u128::from(REFILL_NS_MAX);
            proptest::prop_assert_eq!(p.validate() == Err(PolicyError::RefillTooLong), divided);
        }
    }

    #[test]
    fn rates_parse() {
        let r: Rate = "10/s".parse().unwrap();
        assert_eq!(
            r,
            Rate {
                count: 10,
                period_ns: NS_PER_S
            }
        );
        let r: Rate = "100/250ms".parse().unwrap();
        assert_eq!(
            r,
            Rate {
                count: 100,
                period_ns: 250 * NS_PER_MS
            }
        );
        let r: Rate = "5/10s".parse().unwrap();
        assert_eq!(r.period_ns, 10 * NS_PER_S);
        assert_eq!("1/d".parse::<Rate>().unwrap().period_ns, 86_400 * NS_PER_S);
        assert_eq!("1/h".parse::<Rate>().unwrap().period_ns, 3_600 * NS_PER_S);
        assert_eq!("7/m".parse::<Rate>().unwrap().period_ns, 60 * NS_PER_S);
        for bad in [
            "10", "0/s", "-1/s", "10/", "10/x", "10/5", "a/s", "10/0s", "10/ms5",
        ] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn periods_format_back() {
        for s in ["250ms", "s", "10s", "m", "h", "d", "1500us", "7ns"] {
            assert_eq!(format_period(parse_period_ns(s).unwrap()), s);
        }
    }

    #[test]
    fn validation_edges() {
        assert!(Policy::new(1, NS_PER_S, 1).is_ok());
        assert_eq!(Policy::new(0, NS_PER_S, 1), Err(PolicyError::Count));
        assert_eq!(
            Policy::new(COUNT_MAX + 1, NS_PER_S, 1),
            Err(PolicyError::Count)
        );
        assert_eq!(
            Policy::new(1, PERIOD_NS_MIN - 1, 1),
            Err(PolicyError::Period)
        );
        assert_eq!(
            Policy::new(1, PERIOD_NS_MAX + 1, 1),
            Err(PolicyError::Period)
        );
        assert_eq!(Policy::new(1, NS_PER_S, 0), Err(PolicyError::Burst));
        assert_eq!(
            Policy::new(1, NS_PER_S, BURST_MAX + 1),
            Err(PolicyError::Burst)
        );
        assert!(Policy::new(1, PERIOD_NS_MAX, 10).is_ok());
        assert_eq!(
            Policy::new(1, PERIOD_NS_MAX, 11),
            Err(PolicyError::RefillTooLong)
        );
        let p = Policy::new(1, NS_PER_S, 20).unwrap();
        assert!(p.check_cost(20).is_ok());
        assert_eq!(
            p.check_cost(21),
            Err(PolicyError::CostExceedsBurst {
                cost: 21,
                burst: 20
            })
        );
    }
}
