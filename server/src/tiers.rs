//! Named tiers: sets of limits an operator defines once in the config file
//! (`[tiers.free]`, `[tiers.paid]`) and clients name instead of sending
//! numbers. Reloaded without a restart (SIGHUP or the RELOAD request);
//! buckets belong to (key, tier, index), not to the numbers, so they keep
//! their state across a reload and a changed tier applies its new numbers
//! from the next request.

use std::collections::BTreeMap;

use sluice_protocol::message::LimitSet;
use sluice_protocol::priority::Reserved;

/// Most limits one tier (or one request) may name.
pub const TIER_LIMITS_MAX: usize = 8;
/// Longest tier name, in bytes.
pub const TIER_NAME_BYTES_MAX: usize = 64;

/// One tier: its limits, in the order clients see their verdicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tier {
    /// 1..=TIER_LIMITS_MAX validated limits with their reserves
    /// (`reserve=CLASS:P%` in their specs), as a DECIDE carries them.
    set: LimitSet,
}

impl Tier {
    /// The limits (a `[Limit]`) and their reserves.
    #[inline]
    pub fn set(&self) -> &LimitSet {
        &self.set
    }
}

/// Every tier, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tiers {
    by_name: BTreeMap<String, Tier>,
}

/// Why a tier definition is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("tier name {0:?} must be 1..={TIER_NAME_BYTES_MAX} bytes")]
    Name(String),
    #[error("tier {0:?} must have 1..={TIER_LIMITS_MAX} limits")]
    Count(String),
    #[error("tier {tier:?}, limit {index} ({spec:?}): {error}")]
    Limit {
        tier: String,
        index: usize,
        spec: String,
        error: String,
    },
}

impl Tiers {
    /// Builds tiers from `name -> [limit spec, ...]`, validating all of it.
    pub fn from_specs<'a>(
        specs: impl IntoIterator<Item = (&'a str, &'a [String])>,
    ) -> Result<Tiers, TierError> {
        let mut by_name = BTreeMap::new();
        for (name, limits) in specs {
            if name.is_empty() || name.len() > TIER_NAME_BYTES_MAX {
                return Err(TierError::Name(name.to_owned()));
            }
            if limits.is_empty() || limits.len() > TIER_LIMITS_MAX {
                return Err(TierError::Count(name.to_owned()));
            }
            let mut parsed: Vec<Reserved> = Vec::with_capacity(limits.len());
            for (index, spec) in limits.iter().enumerate() {
                let limit: Reserved =
                    spec.parse()
                        .map_err(|e: sluice_protocol::limit::SpecError| TierError::Limit {
                            tier: name.to_owned(),
                            index,
                            spec: spec.clone(),
                            error: e.to_string(),
                        })?;
                parsed.push(limit);
            }
            let set = LimitSet::with_reserves(&parsed).expect("1..=TIER_LIMITS_MAX limits");
            by_name.insert(name.to_owned(), Tier { set });
        }
        Ok(Tiers { by_name })
    }

    /// The tier called `name`.
    pub fn get(&self, name: &[u8]) -> Option<&Tier> {
        std::str::from_utf8(name)
            .ok()
            .and_then(|n| self.by_name.get(n))
    }

    /// How many tiers there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Tier names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn tiers_parse_and_validate() {
        let free = specs(&["token-bucket:10/s,burst=20", "concurrency:5,lease=30s"]);
        let paid = specs(&["sliding-log:1000/m"]);
        let t = Tiers::from_specs([("free", &free[..]), ("paid", &paid[..])]).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(b"free").unwrap().set().len(), 2);
        assert!(t.get(b"gold").is_none());
        let bad = specs(&["token-bucket:0/s"]);
        let e = Tiers::from_specs([("free", &bad[..])]).unwrap_err();
        assert!(matches!(e, TierError::Limit { index: 0, .. }), "{e}");
        let none: Vec<String> = Vec::new();
        assert!(matches!(
            Tiers::from_specs([("empty", &none[..])]),
            Err(TierError::Count(_))
        ));
        let nine = specs(&["fixed-window:1/s"; 9]);
        assert!(matches!(
            Tiers::from_specs([("big", &nine[..])]),
            Err(TierError::Count(_))
        ));
        let long = "x".repeat(65);
        assert!(matches!(
            Tiers::from_specs([(long.as_str(), &free[..])]),
            Err(TierError::Name(_))
        ));
    }
}
