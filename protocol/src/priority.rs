//! Priority classes and reserved shares: when a shared limit runs hot, the
//! requests that matter keep a share of it.
//!
//! Every DECIDE carries a class, [`Priority`]: `critical`, `normal` (what
//! a client that sends none gets) or `low`. Any limit may carry
//! [`Reserves`]: `reserve=critical:20%` means the last 20 % of the limit
//! can be spent only by `critical` requests, `reserve=normal:50%` the last
//! 50 % only by `normal` or `critical` ones. So with both, `low` is denied
//! once less than half the limit remains, `normal` once less than a fifth
//! remains, and `critical` may use all of it.
//!
//! The rule, for every limit kind, is one transformation of the kind's own
//! decision: a class must leave its *floor* (the part reserved for the
//! classes above it, [`Reserves::floor`]) untouched, so a request of
//! `cost` is admitted for that class exactly when the kind would admit
//! `cost + floor` now, and then only `cost` is spent. Its `remaining` and
//! `retry_after` are those of the class: what the class could still spend,
//! and when retrying is admitted for it. With no reserves, or for
//! `critical`, the floor is 0 and the decision is exactly the plain one.
//! A request that needs more than the whole limit (`cost + floor > limit`)
//! is never admitted for its class: its `retry_after` is [`RETRY_NEVER`].

use std::fmt;
use std::str::FromStr;

use crate::gcra::Verdict;
use crate::limit::{Limit, SpecError};
use crate::policy::PolicyError;

crate::codes::wire_codes! {
    /// A request's priority class. The numbers are the wire codes (bits 0-1
    /// of a request header's `flags`; see PROTOCOL.md): never reuse one.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub enum Priority {
        /// The default, and what a request that names no class gets.
        #[default]
        Normal = 0 => "normal",
        /// Batch, test and other traffic that is shed first.
        Low = 1 => "low",
        /// Traffic that must get through: spends every reserve.
        Critical = 2 => "critical",
    }
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::Critical];

    /// The class's rank: low 0, normal 1, critical 2 (higher goes first).
    #[inline]
    pub fn rank(self) -> u8 {
        match self {
            Priority::Low => 0,
            Priority::Normal => 1,
            Priority::Critical => 2,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a class name is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("priority must be critical, normal or low; got {0:?}")]
pub struct PriorityError(pub String);

impl FromStr for Priority {
    type Err = PriorityError;

    fn from_str(s: &str) -> Result<Priority, PriorityError> {
        Priority::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PriorityError(s.to_owned()))
    }
}

pub use crate::policy::BP_WHOLE;

/// What `retry_after_ns` says when the class can never be admitted at this
/// cost: the cost plus its floor is more than the whole limit.
pub const RETRY_NEVER: u64 = u64::MAX;

/// A limit's reserved shares, in hundredths of a percent of its `limit`
/// (0 ..= [`BP_WHOLE`]); all zero for none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reserves {
    /// The last share only `critical` requests may spend.
    pub critical_bp: u16,
    /// The last share only `normal` and `critical` requests may spend.
    pub normal_bp: u16,
}

impl Reserves {
    /// No reserves: every class decides as today.
    pub const NONE: Reserves = Reserves {
        critical_bp: 0,
        normal_bp: 0,
    };

    /// Sets the share reserved for `class` (critical or normal; a share
    /// for low keeps nothing and is ignored).
    pub fn set(&mut self, class: Priority, bp: u16) {
        match class {
            Priority::Critical => self.critical_bp = bp,
            Priority::Normal => self.normal_bp = bp,
            Priority::Low => {}
        }
    }

    /// Whether there are none.
    #[inline]
    pub fn is_none(&self) -> bool {
        self.critical_bp == 0 && self.normal_bp == 0
    }

    /// Checks each share is at most the whole limit.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.critical_bp > BP_WHOLE || self.normal_bp > BP_WHOLE {
            return Err(PolicyError::Reserve);
        }
        Ok(())
    }

    /// The units of `limit` that `class` must leave untouched: the largest
    /// share reserved for a class above it, rounded up (a reserve of 20 %
    /// of 9 keeps 2 units). 0 for `critical`, and for every class without
    /// reserves.
    #[inline]
    pub fn floor(&self, limit: u64, class: Priority) -> u64 {
        let bp = match class {
            Priority::Critical => 0,
            Priority::Normal => self.critical_bp,
            Priority::Low => self.critical_bp.max(self.normal_bp),
        };
        if bp == 0 {
            return 0;
        }
        let whole = u128::from(BP_WHOLE);
        let units = (u128::from(limit) * u128::from(bp)).div_ceil(whole);
        // bp <= BP_WHOLE, so units <= limit.
        units as u64
    }
}

/// The verdict for a class whose floor is `floor` units of a limit of
/// `limit`, from the kind's own decision `plain(c)` of `c` units now
/// (a probe: it changes nothing). See the module docs for the rule.
#[inline]
pub fn probe(floor: u64, limit: u64, cost: u64, plain: impl FnOnce(u64) -> Verdict) -> Verdict {
    if floor == 0 {
        return plain(cost);
    }
    match cost.checked_add(floor).filter(|&need| need <= limit) {
        Some(need) => {
            let v = plain(need);
            if v.allowed {
                // remaining = available - cost - floor: the class's.
                v
            } else {
                Verdict {
                    remaining: v.remaining.saturating_sub(floor),
                    ..v
                }
            }
        }
        None => {
            let v = plain(0);
            Verdict {
                allowed: false,
                remaining: v.remaining.saturating_sub(floor),
                retry_after_ns: RETRY_NEVER,
                ..v
            }
        }
    }
}

/// The class's view of a verdict the kind's plain decision gave (a spend
/// that [`probe`] admitted, a refund, a reset): what it could still spend
/// leaves the floor alone.
#[inline]
pub fn for_class(floor: u64, v: Verdict) -> Verdict {
    Verdict {
        remaining: v.remaining.saturating_sub(floor),
        ..v
    }
}

/// A limit and its reserves: what a spec such as
/// `token-bucket:1000/s,burst=2000,reserve=critical:20%,reserve=normal:50%`
/// names, and what a tier holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reserved {
    /// The limit.
    pub limit: Limit,
    /// Its reserves (none unless the spec names some).
    pub reserves: Reserves,
}

impl From<Limit> for Reserved {
    fn from(limit: Limit) -> Reserved {
        Reserved {
            limit,
            reserves: Reserves::NONE,
        }
    }
}

/// A limit spec ([`Limit`]'s syntax) with any number of
/// `reserve=CLASS:P%` options among its options, each class at most once:
/// CLASS `critical` or `normal` (a reserve for `low` would keep nothing
/// from anyone), P a percentage of the limit with up to two decimals
/// (`20%`, `12.5%`, `0.25%`), at most 100.
impl FromStr for Reserved {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Reserved, SpecError> {
        let mut reserves = Reserves::NONE;
        let mut seen = [false; 2];
        let mut rest = Vec::new();
        for part in s.split(',') {
            let Some(value) = part.strip_prefix("reserve=") else {
                rest.push(part);
                continue;
            };
            let (class, bp) = parse_reserve(value)?;
            let i = usize::from(class == Priority::Normal);
            if std::mem::replace(&mut seen[i], true) {
                return Err(SpecError::Reserve(format!(
                    "{part:?}: each class is reserved for at most once"
                )));
            }
            reserves.set(class, bp);
        }
        let limit: Limit = rest.join(",").parse()?;
        Ok(Reserved { limit, reserves })
    }
}

/// One reserve, `CLASS:P%` (what follows `reserve=` in a spec): CLASS
/// `critical` or `normal`, P a percentage with up to two decimals, at most
/// 100; the class and the share in hundredths of a percent.
pub fn parse_reserve(value: &str) -> Result<(Priority, u16), SpecError> {
    let bad = |why: &str| SpecError::Reserve(format!("\"reserve={value}\": {why}"));
    let (class, share) = value
        .split_once(':')
        .ok_or_else(|| bad("expected reserve=CLASS:P%"))?;
    let class: Priority = class
        .parse()
        .map_err(|e: PriorityError| bad(&e.to_string()))?;
    let bp = parse_share_bp(share).ok_or_else(|| {
        bad("the share must be a percentage 0..=100 with up to two decimals, such as 20%")
    })?;
    if class == Priority::Low {
        return Err(bad(
            "a reserve for low keeps nothing from anyone: reserve for critical or normal",
        ));
    }
    Ok((class, bp))
}

/// `P%` with up to two decimals, 0 ..= 100, as hundredths of a percent.
fn parse_share_bp(s: &str) -> Option<u16> {
    let number = s.strip_suffix('%')?;
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || whole.len() > 3 || frac.len() > 2 {
        return None;
    }
    if !whole
        .bytes()
        .chain(frac.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u32 = whole.parse().ok()?;
    let frac: u32 = format!("{frac:0<2}").parse().ok()?;
    let bp = whole * 100 + frac;
    (bp <= u32::from(BP_WHOLE)).then_some(bp as u16)
}

/// The spec syntax: the limit's, then each reserve (parsing it gives the
/// same value back).
impl fmt::Display for Reserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.limit)?;
        for (class, bp) in [
            (Priority::Critical, self.reserves.critical_bp),
            (Priority::Normal, self.reserves.normal_bp),
        ] {
            if bp != 0 {
                let (whole, frac) = (bp / 100, bp % 100);
                if frac == 0 {
                    write!(f, ",reserve={class}:{whole}%")?;
                } else {
                    write!(f, ",reserve={class}:{whole}.{frac:02}%")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{concurrency, fixed_window, sliding_counter, sliding_log, Kind};
    use crate::{gcra, Concurrency, Policy, Window};
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn specs_parse_print_and_refuse_clearly() {
        let r: Reserved = "token-bucket:1000/s,burst=2000,reserve=critical:20%,reserve=normal:50%"
            .parse()
            .unwrap();
        assert_eq!(
            r.reserves,
            Reserves {
                critical_bp: 2000,
                normal_bp: 5000
            }
        );
        assert_eq!(r.limit.limit(), 2000);
        assert_eq!(r.to_string().parse::<Reserved>().unwrap(), r);
        let r: Reserved = "concurrency:10,reserve=normal:12.5%,lease=5s"
            .parse()
            .unwrap();
        assert_eq!(r.reserves.normal_bp, 1250);
        assert_eq!(
            r.to_string(),
            "concurrency:10,lease=5s,reserve=normal:12.50%"
        );
        // No reserves: exactly the limit's own syntax.
        let plain: Reserved = "fixed-window:5/m".parse().unwrap();
        assert_eq!(
            plain,
            Reserved::from("fixed-window:5/m".parse::<Limit>().unwrap())
        );
        for (bad, says) in [
            ("fixed-window:5/m,reserve=low:10%", "low keeps nothing"),
            (
                "fixed-window:5/m,reserve=critical:10%,reserve=critical:5%",
                "at most once",
            ),
            ("fixed-window:5/m,reserve=critical:101%", "0..=100"),
            ("fixed-window:5/m,reserve=critical:10", "percentage"),
            ("fixed-window:5/m,reserve=critical:1.234%", "two decimals"),
            (
                "fixed-window:5/m,reserve=vip:10%",
                "critical, normal or low",
            ),
            ("fixed-window:5/m,reserve=10%", "CLASS:P%"),
        ] {
            let e = bad.parse::<Reserved>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn floors_follow_the_issue_example() {
        let r = Reserves {
            critical_bp: 2000,
            normal_bp: 5000,
        };
        assert_eq!(r.floor(2000, Priority::Critical), 0);
        assert_eq!(r.floor(2000, Priority::Normal), 400);
        assert_eq!(r.floor(2000, Priority::Low), 1000);
        // Rounded up: a reserve never keeps less than its share.
        assert_eq!(r.floor(9, Priority::Normal), 2);
        // A normal reserve below the critical one: low keeps the larger.
        let odd = Reserves {
            critical_bp: 3000,
            normal_bp: 1000,
        };
        assert_eq!(odd.floor(100, Priority::Low), 30);
        assert_eq!(Reserves::NONE.floor(100, Priority::Low), 0);
    }

    /// A limit of each kind and a state reached by spending `spent` units
    /// `age_ns` ago, decided through the kind's own pure functions.
    #[derive(Clone, Debug)]
    struct Case {
        limit: Limit,
        reserves: Reserves,
        spent: Vec<(u64, u64)>,
        cost: u64,
    }

    fn limits() -> impl Strategy<Value = Limit> {
        prop_oneof![
            (1u64..50, 1u64..60, 1u64..50).prop_map(|(count, secs, burst)| {
                Limit::TokenBucket(Policy {
                    count,
                    period_ns: secs * S,
                    burst,
                })
            }),
            (1u64..50, 1u64..60).prop_map(|(limit, secs)| Limit::FixedWindow(Window {
                limit,
                window_ns: secs * S
            })),
            (1u64..50, 1u64..60).prop_map(|(limit, secs)| Limit::SlidingLog(Window {
                limit,
                window_ns: secs * S
            })),
            (1u64..50, 1u64..60).prop_map(|(limit, secs)| Limit::SlidingCounter(Window {
                limit,
                window_ns: secs * S
            })),
            (1u64..50, 1u64..60).prop_map(|(limit, secs)| Limit::Concurrency(Concurrency {
                limit,
                lease_ns: secs * S
            })),
        ]
    }

    fn cases() -> impl Strategy<Value = Case> {
        (
            limits(),
            (0u16..=BP_WHOLE, 0u16..=BP_WHOLE),
            proptest::collection::vec((0u64..20, 0u64..30 * S), 0..12),
            0u64..60,
        )
            .prop_map(|(limit, (c, n), spent, cost)| Case {
                cost: cost % (limit.limit() + 1),
                limit,
                reserves: Reserves {
                    critical_bp: c,
                    normal_bp: n,
                },
                spent,
            })
    }

    /// One bucket of any kind, spent through the kinds' pure functions.
    #[derive(Clone, Debug)]
    enum Bucket {
        Token(Option<gcra::Bucket>),
        Fixed(Option<fixed_window::FixedWindowState>),
        Log(Option<sliding_log::SlidingLogState>),
        Counter(Option<sliding_counter::SlidingCounterState>),
        Leases(Option<concurrency::ConcurrencyState>),
    }

    impl Bucket {
        fn new(limit: &Limit) -> Bucket {
            match limit.kind() {
                Kind::TokenBucket => Bucket::Token(None),
                Kind::FixedWindow => Bucket::Fixed(None),
                Kind::SlidingLog => Bucket::Log(None),
                Kind::SlidingCounter => Bucket::Counter(None),
                Kind::Concurrency => Bucket::Leases(None),
            }
        }

        fn peek(&self, limit: &Limit, cost: u64, now: u64) -> Verdict {
            match (self, limit) {
                (Bucket::Token(b), Limit::TokenBucket(p)) => gcra::peek(*b, p, cost, now),
                (Bucket::Fixed(s), Limit::FixedWindow(w)) => fixed_window::peek(*s, w, cost, now),
                (Bucket::Log(l), Limit::SlidingLog(w)) => {
                    sliding_log::peek(l.as_ref(), w, cost, now)
                }
                (Bucket::Counter(s), Limit::SlidingCounter(w)) => {
                    sliding_counter::peek(*s, w, cost, now)
                }
                (Bucket::Leases(l), Limit::Concurrency(c)) => {
                    concurrency::peek(l.as_ref(), c, cost, now)
                }
                _ => unreachable!("bucket of the limit's kind"),
            }
        }

        fn spend(&mut self, limit: &Limit, cost: u64, now: u64, lease: u64) -> Verdict {
            match (self, limit) {
                (Bucket::Token(b), Limit::TokenBucket(p)) => {
                    let d = gcra::throttle(*b, p, cost, now);
                    *b = d.bucket;
                    d.verdict
                }
                (Bucket::Fixed(s), Limit::FixedWindow(w)) => {
                    let d = fixed_window::throttle(*s, w, cost, now);
                    *s = d.state;
                    d.verdict
                }
                (Bucket::Log(l), Limit::SlidingLog(w)) => {
                    let d = sliding_log::throttle(l.take(), w, cost, now);
                    *l = d.state;
                    d.verdict
                }
                (Bucket::Counter(s), Limit::SlidingCounter(w)) => {
                    let d = sliding_counter::throttle(*s, w, cost, now);
                    *s = d.state;
                    d.verdict
                }
                (Bucket::Leases(l), Limit::Concurrency(c)) => {
                    let d = concurrency::acquire(l.take(), c, cost, lease, now);
                    *l = d.state;
                    d.verdict
                }
                _ => unreachable!("bucket of the limit's kind"),
            }
        }
    }

    /// The bucket after the case's history, and the time of the decision.
    fn history(case: &Case) -> (Bucket, u64) {
        let mut bucket = Bucket::new(&case.limit);
        let mut now = 1_000 * S;
        for (i, &(units, gap)) in case.spent.iter().enumerate() {
            now += gap;
            let units = units.min(case.limit.limit());
            bucket.spend(&case.limit, units, now, i as u64 + 1);
        }
        (bucket, now)
    }

    fn class_verdict(case: &Case, bucket: &Bucket, class: Priority, now: u64) -> Verdict {
        let limit = case.limit.limit();
        let floor = case.reserves.floor(limit, class);
        probe(floor, limit, case.cost, |c| {
            bucket.peek(&case.limit, c, now)
        })
    }

    proptest! {
        /// A higher class is never denied where a lower class of the same
        /// cost would be admitted, never told to wait longer, and never
        /// told it has less left.
        #[test]
        fn a_higher_class_never_fares_worse(case in cases()) {
            let (bucket, now) = history(&case);
            let [low, normal, critical] =
                Priority::ALL.map(|p| class_verdict(&case, &bucket, p, now));
            for (lower, higher) in [(low, normal), (normal, critical)] {
                prop_assert!(!lower.allowed || higher.allowed, "{lower:?} {higher:?}");
                prop_assert!(higher.retry_after_ns <= lower.retry_after_ns);
                // (An admitted verdict counts what is left after it, a
                // denied one what is left now: compare like with like.)
                if higher.allowed == lower.allowed {
                    prop_assert!(higher.remaining >= lower.remaining);
                }
            }
        }

        /// Critical traffic is decided by the plain limit, whatever the
        /// reserves; and with no reserves every class is.
        #[test]
        fn critical_and_unreserved_decide_exactly_as_today(case in cases()) {
            let (bucket, now) = history(&case);
            let plain = bucket.peek(&case.limit, case.cost, now);
            prop_assert_eq!(class_verdict(&case, &bucket, Priority::Critical, now), plain);
            let bare = Case { reserves: Reserves::NONE, ..case.clone() };
            for class in Priority::ALL {
                prop_assert_eq!(class_verdict(&bare, &bucket, class, now), plain);
            }
        }

        /// The class's numbers are honest: an admitted spend leaves the
        /// floor untouched, `remaining` more of the same class is admitted
        /// right after, and retrying a denial at `retry_after` is admitted
        /// for that class.
        #[test]
        fn remaining_and_retry_after_hold_for_the_class(case in cases(), class_rank in 0usize..3) {
            let class = Priority::ALL[class_rank];
            let (mut bucket, now) = history(&case);
            let limit = case.limit.limit();
            let floor = case.reserves.floor(limit, class);
            let v = class_verdict(&case, &bucket, class, now);
            if v.allowed {
                let spent = for_class(floor, bucket.spend(&case.limit, case.cost, now, 999));
                prop_assert!(spent.allowed);
                prop_assert_eq!(spent.remaining, v.remaining);
                // `remaining` more units fit for this class, one more does not
                // (windows estimate; the exact kinds promise it).
                if case.limit.kind() != Kind::SlidingCounter {
                    let more = probe(floor, limit, v.remaining, |c| bucket.peek(&case.limit, c, now));
                    prop_assert!(more.allowed, "{v:?} then {more:?}");
                }
                // And the floor is still there for the classes above.
                let plain = bucket.peek(&case.limit, 0, now);
                prop_assert!(plain.remaining >= floor);
            } else if v.retry_after_ns != RETRY_NEVER {
                let later = now + v.retry_after_ns;
                let again = probe(floor, limit, case.cost, |c| bucket.peek(&case.limit, c, later));
                prop_assert!(again.allowed, "{v:?} at +{}: {again:?}", v.retry_after_ns);
            } else {
                prop_assert!(case.cost + floor > limit);
            }
        }
    }
}
