//! Every limit kind Sluice enforces, as pure decisions
//! `f(state, limit, cost, now) -> (state', verdict)` that never read a clock,
//! never do I/O and never allocate except to grow a log that must grow.
//!
//! | Kind | State per key | What it promises |
//! |------|---------------|------------------|
//! | [`TokenBucket`](Limit::TokenBucket) ([`gcra`]) | 16 bytes | at most `burst + rate x T` units in any interval of length `T` |
//! | [`FixedWindow`](Limit::FixedWindow) ([`fixed_window`]) | 16 bytes | at most `limit` units per window aligned to the Unix epoch; up to `2 x limit` across a window edge |
//! | [`SlidingLog`](Limit::SlidingLog) ([`sliding_log`]) | 16 bytes per distinct admission instant, at most `limit` | at most `limit` units in every interval `(t - W, t]`, exactly |
//! | [`SlidingCounter`](Limit::SlidingCounter) ([`sliding_counter`]) | 24 bytes | at most `limit` per aligned window, and at most `2 x limit - 1` in any interval of length `W` |
//! | [`Concurrency`](Limit::Concurrency) ([`concurrency`]) | 24 bytes per lease, at most `limit` | at most `limit` slots held by unexpired, unreleased leases at any instant |
//!
//! What every kind shares:
//!
//! - The verdict is [`gcra::Verdict`]: `allowed`, `limit` ([`Limit::limit`]),
//!   `remaining` (units a request could still spend now, after this one),
//!   `retry_after_ns` (0 when allowed; otherwise the earliest time after which
//!   the same request is admitted if nothing else happens meanwhile, rounded
//!   up so that retrying exactly then succeeds) and `reset_after_ns` (time
//!   until all units are back).
//! - A [`Decision`] carries the state to store; `None` means "equivalent to
//!   no state": store nothing, drop what is stored.
//! - A denied request changes nothing: the state comes back as given.
//!   `peek` answers as `throttle` would and changes nothing.
//! - `refund` gives units back and never raises a key above its limit.
//! - A clock that steps backward never hands out units: a decision at an
//!   earlier `now` never admits more than one at a later `now` would, and
//!   state is never moved back in time.
//! - `cost` is checked at the edge ([`Limit::check_cost`]): a cost above the
//!   limit is an error, never an eternal deny. The decision functions assert
//!   it, and assume a limit that passed [`Limit::validate`]; on such input
//!   they never panic (all arithmetic is checked, saturating or `u128`).
//! - `now_ns` is nanoseconds since the Unix epoch (see [`crate::clock`]).

pub mod concurrency;
pub mod fixed_window;
pub mod kinds;
pub mod sliding_counter;
pub mod sliding_log;

use std::fmt;
use std::str::FromStr;

use crate::gcra::{self, Bucket, Verdict};
use crate::policy::{self, format_period, parse_period_ns, ParseError, Policy, PolicyError, Rate};

/// Nanoseconds per second, for the constants below.
const NS_PER_S: u64 = 1_000_000_000;

// The bounds every kind's numbers must keep, kept with the policy's
// (PolicyError names them).
pub use crate::kind::Kind;
pub use crate::policy::{
    CONCURRENCY_LIMIT_MAX, LEASE_NS_MAX, LEASE_NS_MIN, SLIDING_LOG_LIMIT_MAX, WINDOW_LIMIT_MAX,
    WINDOW_NS_MAX, WINDOW_NS_MIN,
};
pub use kinds::LimitKind;

/// The lease when the spec names none (`concurrency:10`): 60 s, longer than
/// the usual HTTP request timeout, short enough that a holder that crashes
/// without releasing frees its slot within a minute.
pub const LEASE_NS_DEFAULT: u64 = 60 * NS_PER_S;

// Every window and lease fits a u64 after adding it to any reasonable now.
const _: () = assert!(WINDOW_NS_MIN > 0 && WINDOW_NS_MIN <= WINDOW_NS_MAX);
const _: () = assert!(WINDOW_NS_MAX < u64::MAX / 2 && LEASE_NS_MAX < u64::MAX / 2);
const _: () = assert!(LEASE_NS_MIN <= LEASE_NS_DEFAULT && LEASE_NS_DEFAULT <= LEASE_NS_MAX);
const _: () = assert!(SLIDING_LOG_LIMIT_MAX <= WINDOW_LIMIT_MAX);
// Logs and lease lists are indexed by usize; even a 32-bit usize holds them.
const _: () = assert!(SLIDING_LOG_LIMIT_MAX <= u32::MAX as u64);
const _: () = assert!(CONCURRENCY_LIMIT_MAX <= u32::MAX as u64);
// The sliding counter computes `limit x window` and `count x window` in a
// u128: 2^40 x 2^55 is far inside it.
const _: () = assert!(WINDOW_LIMIT_MAX <= 1 << 40 && WINDOW_NS_MAX < 1 << 55);

/// A limit of any kind, with its numbers. Validate it with
/// [`Limit::validate`] (parsing does) before deciding with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// `count` per `period_ns`, `burst` at once (GCRA, see [`gcra`]).
    TokenBucket(Policy),
    /// `limit` per window aligned to the epoch (see [`fixed_window`]).
    FixedWindow(Window),
    /// `limit` in every rolling window, exactly (see [`sliding_log`]).
    SlidingLog(Window),
    /// `limit` per rolling window, estimated (see [`sliding_counter`]).
    SlidingCounter(Window),
    /// `limit` leases held at once (see [`concurrency`]).
    Concurrency(Concurrency),
}

/// The numbers of a window kind: `limit` units per `window_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// The most units admitted per window.
    pub limit: u64,
    /// The window's length, in nanoseconds.
    pub window_ns: u64,
}

/// The numbers of a concurrency limit: `limit` slots, each lease held for
/// `lease_ns` unless released or renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Concurrency {
    /// The most slots held at once.
    pub limit: u64,
    /// How long a lease lives without a renew: a holder that dies frees its
    /// slots this long after its last acquire or renew.
    pub lease_ns: u64,
}

/// A decision: the verdict, and the state as it must be stored afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision<S> {
    /// What the caller is told.
    pub verdict: Verdict,
    /// The state to store; `None` means it is equivalent to no state at all:
    /// store nothing (drop what is stored).
    pub state: Option<S>,
}

impl From<gcra::Decision> for Decision<Bucket> {
    #[inline]
    fn from(d: gcra::Decision) -> Self {
        Decision {
            verdict: d.verdict,
            state: d.bucket,
        }
    }
}

impl Window {
    /// A window limit, checked against the bounds every window kind shares
    /// (a sliding log has a lower `limit` bound: see [`Limit::validate`]).
    pub fn new(limit: u64, window_ns: u64) -> Result<Window, PolicyError> {
        let window = Window { limit, window_ns };
        window.validate()?;
        Ok(window)
    }

    /// Checks the bounds every window kind shares.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(1..=WINDOW_LIMIT_MAX).contains(&self.limit) {
            return Err(PolicyError::WindowLimit);
        }
        if !(WINDOW_NS_MIN..=WINDOW_NS_MAX).contains(&self.window_ns) {
            return Err(PolicyError::Window);
        }
        Ok(())
    }

    /// Where the aligned window holding `now_ns` starts: the fixed window
    /// and the sliding counter align their windows to multiples of
    /// `window_ns` since the Unix epoch (`[k x W, (k+1) x W)`), so every
    /// key's windows start at the same instants and a window's start is
    /// known without storing when the key was first seen.
    #[inline]
    pub fn aligned_start_ns(&self, now_ns: u64) -> u64 {
        now_ns - now_ns % self.window_ns
    }
}

impl Concurrency {
    /// A concurrency limit, validated.
    pub fn new(limit: u64, lease_ns: u64) -> Result<Concurrency, PolicyError> {
        let concurrency = Concurrency { limit, lease_ns };
        concurrency.validate()?;
        Ok(concurrency)
    }

    /// Checks both numbers against their bounds.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(1..=CONCURRENCY_LIMIT_MAX).contains(&self.limit) {
            return Err(PolicyError::ConcurrencyLimit);
        }
        if !(LEASE_NS_MIN..=LEASE_NS_MAX).contains(&self.lease_ns) {
            return Err(PolicyError::Lease);
        }
        Ok(())
    }
}

impl Limit {
    /// The limit's kind (its wire code is `kind() as u8`).
    #[inline]
    pub fn kind(&self) -> Kind {
        match self {
            Limit::TokenBucket(_) => Kind::TokenBucket,
            Limit::FixedWindow(_) => Kind::FixedWindow,
            Limit::SlidingLog(_) => Kind::SlidingLog,
            Limit::SlidingCounter(_) => Kind::SlidingCounter,
            Limit::Concurrency(_) => Kind::Concurrency,
        }
    }

    /// The number reported as `limit` in verdicts: the most units this limit
    /// ever admits at once (a token bucket's burst, otherwise `limit`). It is
    /// the quota of the `RateLimit` headers.
    #[inline]
    pub fn limit(&self) -> u64 {
        match self {
            Limit::TokenBucket(p) => p.burst,
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingCounter(w) => w.limit,
            Limit::Concurrency(c) => c.limit,
        }
    }

    /// Checks every number against its kind's bounds. The decision functions
    /// assume a limit that passed this.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self {
            Limit::TokenBucket(p) => p.validate(),
            Limit::FixedWindow(w) | Limit::SlidingCounter(w) => w.validate(),
            Limit::SlidingLog(w) => {
                w.validate()?;
                if w.limit > SLIDING_LOG_LIMIT_MAX {
                    return Err(PolicyError::SlidingLogLimit);
                }
                Ok(())
            }
            Limit::Concurrency(c) => c.validate(),
        }
    }

    /// Checks that `cost` could ever be admitted: `cost <= limit()`. The
    /// error names the token bucket's burst, or the other kinds' limit
    /// (both map to the one wire status, COST_EXCEEDS_BURST).
    #[inline]
    pub fn check_cost(&self, cost: u64) -> Result<(), PolicyError> {
        let limit = self.limit();
        if cost > limit {
            return Err(match self.kind() {
                Kind::TokenBucket => PolicyError::CostExceedsBurst { cost, burst: limit },
                kind => PolicyError::CostExceedsLimit { kind, cost, limit },
            });
        }
        Ok(())
    }
}

/// Why a limit spec (`token-bucket:10/s,burst=20`, ...) is not acceptable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "expected KIND:..., with KIND one of token-bucket, fixed-window, \
         sliding-log, sliding-counter, concurrency; got {0:?}"
    )]
    Kind(String),
    #[error(
        "{kind} does not take the option {option:?} (or names it twice); {kind} takes {allowed}"
    )]
    Option {
        /// The kind whose options these are.
        kind: Kind,
        /// The option as written.
        option: String,
        /// What the kind accepts, for the message.
        allowed: &'static str,
    },
    /// A `reserve=CLASS:P%` option that is not one (see
    /// `priority::Reserved`).
    #[error("reserve {0}")]
    Reserve(String),
    #[error(transparent)]
    Syntax(#[from] ParseError),
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

impl FromStr for Kind {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Kind, SpecError> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| SpecError::Kind(s.to_owned()))
    }
}

/// The CLI's spec syntax, validated:
///
/// - `token-bucket:COUNT/PERIOD[,burst=N]` (burst defaults to COUNT)
/// - `fixed-window:LIMIT/WINDOW`, `sliding-log:LIMIT/WINDOW`,
///   `sliding-counter:LIMIT/WINDOW`
/// - `concurrency:LIMIT[,lease=PERIOD]` (lease defaults to
///   [`LEASE_NS_DEFAULT`])
///
/// Periods are those of [`parse_period_ns`]: an optional count and a unit
/// (`ns`, `us`, `ms`, `s`, `m`, `h`, `d`), so `1m` and `m` are one minute.
impl FromStr for Limit {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Limit, SpecError> {
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| SpecError::Kind(s.to_owned()))?;
        let kind: Kind = kind.parse()?;
        let mut parts = rest.split(',');
        // `split` always yields at least one part.
        let head = parts.next().unwrap_or_default();
        let limit = match kind {
            Kind::TokenBucket => {
                let rate: Rate = head.parse()?;
                let burst = option(kind, "burst=N", "burst", parts)?
                    .map(policy::parse_positive)
                    .transpose()?;
                Limit::TokenBucket(Policy {
                    count: rate.count,
                    period_ns: rate.period_ns,
                    burst: burst.unwrap_or(rate.count),
                })
            }
            Kind::FixedWindow | Kind::SlidingLog | Kind::SlidingCounter => {
                let rate: Rate = head.parse()?;
                option(kind, "no options", "", parts)?;
                let window = Window {
                    limit: rate.count,
                    window_ns: rate.period_ns,
                };
                match kind {
                    Kind::FixedWindow => Limit::FixedWindow(window),
                    Kind::SlidingLog => Limit::SlidingLog(window),
                    _ => Limit::SlidingCounter(window),
                }
            }
            Kind::Concurrency => {
                let limit = policy::parse_positive(head)?;
                let lease_ns = option(kind, "lease=PERIOD", "lease", parts)?
                    .map(parse_period_ns)
                    .transpose()?;
                Limit::Concurrency(Concurrency {
                    limit,
                    lease_ns: lease_ns.unwrap_or(LEASE_NS_DEFAULT),
                })
            }
        };
        limit.validate()?;
        Ok(limit)
    }
}

/// The value of the one option `name=VALUE` a kind accepts, if given; any
/// other option, or the same one twice, is an error.
fn option<'a>(
    kind: Kind,
    allowed: &'static str,
    name: &str,
    parts: impl Iterator<Item = &'a str>,
) -> Result<Option<&'a str>, SpecError> {
    let mut value = None;
    for part in parts {
        match part.split_once('=') {
            Some((key, v)) if key == name && !name.is_empty() && value.is_none() => {
                value = Some(v);
            }
            _ => {
                return Err(SpecError::Option {
                    kind,
                    option: part.to_owned(),
                    allowed,
                })
            }
        }
    }
    Ok(value)
}

/// The spec syntax, with every option written out (so the text means the
/// same even if a default changes); parsing it gives the same limit back.
impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind();
        match self {
            Limit::TokenBucket(p) => {
                let rate = Rate {
                    count: p.count,
                    period_ns: p.period_ns,
                };
                write!(f, "{kind}:{rate},burst={}", p.burst)
            }
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingCounter(w) => {
                let rate = Rate {
                    count: w.limit,
                    period_ns: w.window_ns,
                };
                write!(f, "{kind}:{rate}")
            }
            Limit::Concurrency(c) => {
                write!(f, "{kind}:{},lease={}", c.limit, format_period(c.lease_ns))
            }
        }
    }
}

/// Nanoseconds from `now_ns` until `at_ns` (0 if already past), for the
/// verdict's times.
#[inline]
pub(crate) fn until(at_ns: u64, now_ns: u64) -> u64 {
    at_ns.saturating_sub(now_ns)
}

/// A u128 result as a u64, saturating (reported times and counts).
#[inline]
pub(crate) fn saturate(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = NS_PER_S;

    #[test]
    fn specs_parse() {
        let cases: [(&str, Limit); 8] = [
            (
                "token-bucket:10/s,burst=20",
                Limit::TokenBucket(Policy::new(10, S, 20).unwrap()),
            ),
            (
                "token-bucket:10/s",
                Limit::TokenBucket(Policy::new(10, S, 10).unwrap()),
            ),
            (
                "fixed-window:100/1m",
                Limit::FixedWindow(Window::new(100, 60 * S).unwrap()),
            ),
            (
                "sliding-log:100/1m",
                Limit::SlidingLog(Window::new(100, 60 * S).unwrap()),
            ),
            (
                "sliding-counter:100/1m",
                Limit::SlidingCounter(Window::new(100, 60 * S).unwrap()),
            ),
            (
                "sliding-counter:5/250ms",
                Limit::SlidingCounter(Window::new(5, S / 4).unwrap()),
            ),
            (
                "concurrency:10,lease=30s",
                Limit::Concurrency(Concurrency::new(10, 30 * S).unwrap()),
            ),
            (
                "concurrency:10",
                Limit::Concurrency(Concurrency::new(10, LEASE_NS_DEFAULT).unwrap()),
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(spec.parse::<Limit>(), Ok(want), "{spec}");
        }
        assert_eq!(
            "token-bucket:10/s,burst=20"
                .parse::<Limit>()
                .unwrap()
                .to_string(),
            "token-bucket:10/s,burst=20"
        );
        assert_eq!(
            "fixed-window:100/1m".parse::<Limit>().unwrap().to_string(),
            "fixed-window:100/m"
        );
        assert_eq!(
            "concurrency:10".parse::<Limit>().unwrap().to_string(),
            "concurrency:10,lease=m"
        );
    }

    #[test]
    fn bad_specs_say_why() {
        let kind = |s: &str| matches!(s.parse::<Limit>(), Err(SpecError::Kind(_)));
        assert!(kind("leaky-bucket:10/s"));
        assert!(kind("10/s"));
        assert!(kind("Token-Bucket:10/s"));
        let option = |s: &str| matches!(s.parse::<Limit>(), Err(SpecError::Option { .. }));
        assert!(option("token-bucket:10/s,burst=2,burst=3"));
        assert!(option("token-bucket:10/s,lease=3s"));
        assert!(option("token-bucket:10/s,"));
        assert!(option("fixed-window:10/s,burst=3"));
        assert!(option("concurrency:10,lease=1s,lease=2s"));
        assert!(option("concurrency:10,burst=2"));
        let syntax = |s: &str| matches!(s.parse::<Limit>(), Err(SpecError::Syntax(_)));
        assert!(syntax("token-bucket:10"));
        assert!(syntax("token-bucket:10/s,burst=0"));
        assert!(syntax("token-bucket:10/s,burst=x"));
        assert!(syntax("sliding-log:0/s"));
        assert!(syntax("sliding-log:10/5"));
        assert!(syntax("concurrency:0"));
        assert!(syntax("concurrency:10/s"));
        assert!(syntax("concurrency:10,lease=5"));
        let invalid = |s: &str, e: PolicyError| s.parse::<Limit>() == Err(SpecError::Invalid(e));
        assert!(invalid("sliding-log:65537/m", PolicyError::SlidingLogLimit));
        assert!("sliding-log:65536/m".parse::<Limit>().is_ok());
        assert!(invalid("fixed-window:10/999ns", PolicyError::Window));
        assert!(invalid("fixed-window:10/367d", PolicyError::Window));
        assert!(invalid(
            "sliding-counter:1099511627777/s",
            PolicyError::WindowLimit
        ));
        assert!(invalid("concurrency:65537", PolicyError::ConcurrencyLimit));
        assert!(invalid("concurrency:1,lease=999us", PolicyError::Lease));
        assert!(invalid("concurrency:1,lease=2d", PolicyError::Lease));
        assert!(invalid(
            "token-bucket:1/366d,burst=11",
            PolicyError::RefillTooLong
        ));
    }

    #[test]
    fn kinds_limits_and_costs() {
        for (code, kind) in (1u8..).zip(Kind::ALL) {
            assert_eq!(kind.code(), code);
            assert_eq!(Kind::from_code(code), Some(kind));
            assert_eq!(kind.name().parse::<Kind>(), Ok(kind));
        }
        assert_eq!(Kind::from_code(0), None);
        assert_eq!(Kind::from_code(6), None);
        let tb: Limit = "token-bucket:10/s,burst=20".parse().unwrap();
        assert_eq!((tb.kind(), tb.limit()), (Kind::TokenBucket, 20));
        assert!(tb.check_cost(20).is_ok());
        assert_eq!(
            tb.check_cost(21),
            Err(PolicyError::CostExceedsBurst {
                cost: 21,
                burst: 20
            })
        );
        let c: Limit = "concurrency:3".parse().unwrap();
        assert_eq!((c.kind(), c.limit()), (Kind::Concurrency, 3));
        assert!(c.check_cost(0).is_ok());
        assert_eq!(
            c.check_cost(4),
            Err(PolicyError::CostExceedsLimit {
                kind: Kind::Concurrency,
                cost: 4,
                limit: 3
            })
        );
        assert_eq!(
            c.check_cost(4).unwrap_err().to_string(),
            "cost 4 exceeds the concurrency limit of 3: it could never be admitted"
        );
        let w: Limit = "sliding-log:100/m".parse().unwrap();
        assert_eq!((w.kind(), w.limit()), (Kind::SlidingLog, 100));
    }

    /// Any valid limit of any kind.
    pub(crate) fn limits() -> impl Strategy<Value = Limit> {
        let period = prop_oneof![
            Just(S),
            Just(60 * S),
            WINDOW_NS_MIN..=WINDOW_NS_MAX,
            (1u64..=1_000).prop_map(|n| n * S / 1_000),
        ];
        (
            0u8..5,
            1u64..=WINDOW_LIMIT_MAX,
            period,
            1u64..=BURST_TEST_MAX,
        )
            .prop_filter_map("valid", |(kind, n, ns, burst)| {
                let window = Window {
                    limit: n,
                    window_ns: ns,
                };
                let limit = match kind {
                    0 => Limit::TokenBucket(Policy {
                        count: n,
                        period_ns: ns,
                        burst,
                    }),
                    1 => Limit::FixedWindow(window),
                    2 => Limit::SlidingLog(Window {
                        limit: n % SLIDING_LOG_LIMIT_MAX + 1,
                        window_ns: ns,
                    }),
                    3 => Limit::SlidingCounter(window),
                    _ => Limit::Concurrency(Concurrency {
                        limit: n % CONCURRENCY_LIMIT_MAX + 1,
                        lease_ns: ns.clamp(LEASE_NS_MIN, LEASE_NS_MAX),
                    }),
                };
                limit.validate().is_ok().then_some(limit)
            })
    }

    const BURST_TEST_MAX: u64 = 1 << 20;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Display writes a spec that parses back to the same limit.
        #[test]
        fn display_round_trips(limit in limits()) {
            let text = limit.to_string();
            prop_assert_eq!(text.parse::<Limit>(), Ok(limit), "{}", text);
        }
    }
}
