//! envoyproxy/ratelimit's rule files, read as that service reads them, and
//! the lookup that finds a request descriptor's rule.
//!
//! A file holds one domain and a tree of descriptors:
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address          # no value: one limit per address
//!     rate_limit: { unit: minute, requests_per_unit: 60 }
//!   - key: path
//!     value: "/api/*"              # trailing *: any value with this prefix
//!     shadow_mode: true            # counted, never denies
//!     rate_limit: { unit: second, requests_per_unit: 100, name: api }
//!   - key: user
//!     descriptors:                 # nested: (user, plan) pairs
//!       - key: plan
//!         value: free
//!         rate_limit:
//!           unit: hour
//!           requests_per_unit: 1000
//!           algorithm: token_bucket  # Sluice's own key (see below)
//! ```
//!
//! What envoyproxy/ratelimit does, and this does too:
//! - At each level an entry matches the descriptor with its key and value,
//!   else the first wildcard (`value` ending in `*`, in file order) whose
//!   prefix the value has, else the descriptor with its key and no value.
//!   Only a value's last `*` is a wildcard: `/api/*/users` is that text,
//!   `/a*b*` is any value starting `/a*b`. A request value that is a
//!   wildcard's own text (`/api/v1*`) finds that wildcard before the
//!   others, since the reference looks `key_value` up before it scans. An
//!   empty `value` is no value.
//! - A rule applies only where the request's descriptor ends: a request
//!   descriptor with more entries than the matching branch is deep gets no
//!   limit from it.
//! - `unlimited: true` never counts; `shadow_mode` counts and never denies;
//!   `replaces: [{name}]` drops the named rule's limit from a request that
//!   also matches this one.
//! - Units `second`, `minute`, `hour`, `day`, `week` (7 days), `month` (30
//!   days) and `year` (365 days), any case; windows aligned to the Unix
//!   epoch.
//! - `share_threshold: true` on a wildcard: every value the wildcard matches
//!   counts against one limit (its bucket key has the pattern, `files/*`,
//!   where the request's value would be), for the wildcard's own rule and
//!   for the rules below it. Without it each value has its own.
//! - `detailed_metric` and `value_to_metric` are accepted and change
//!   nothing here (they are about envoyproxy/ratelimit's stats); so are
//!   `shadow_mode` on a descriptor without a `rate_limit` and
//!   `requests_per_unit` beside `unlimited: true`, which mean nothing
//!   there either.
//!
//! Where this differs, on purpose (docs/ENVOY.md says why): a key and a
//! value are compared apart, where the reference joins them into one
//! `key_value` string (so there `(a_b, c)` is `(a, b_c)`); a known key in
//! the wrong place, or a `rate_limit` without `requests_per_unit`, is
//! refused, where the reference drops the one and reads 0 for the other.
//!
//! Sluice's addition: `rate_limit.algorithm` is `fixed_window` (the default:
//! envoyproxy/ratelimit's semantics), `token_bucket` (`requests_per_unit`
//! per unit, all of it at once at most), `sliding_window` (an estimated
//! rolling window, 32 bytes a key) or `sliding_log` (an exact rolling
//! window, at most 65,536 per unit).
//!
//! Anything else is refused with the file and the descriptor's path: an
//! unknown key, an empty key, two descriptors with the same key and value at
//! one level, a unit that does not exist, a unit with `unlimited`, a
//! `replaces` entry without a name, `share_threshold: true` on a value that
//! is not a wildcard (as envoyproxy/ratelimit refuses it), a limit beyond
//! what its algorithm can hold, two files with the same domain.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_protocol::limit::{Limit, Window};
use sluice_protocol::Policy;

const NS_PER_S: u64 = 1_000_000_000;

/// A window's length, as envoyproxy/ratelimit names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// From a rule file's `unit` (any case).
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// Its number in Envoy's `RateLimitResponse.RateLimit.Unit`.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// From Envoy's enum number (a descriptor's `limit` override); `None`
    /// for UNKNOWN and numbers Envoy does not define.
    pub fn from_proto(code: i32) -> Option<Unit> {
        Some(match code {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

/// How a rule's limit is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Algorithm {
    /// envoyproxy/ratelimit's: `requests_per_unit` per aligned window.
    #[default]
    FixedWindow,
    /// GCRA: `requests_per_unit` per unit, spread evenly, the whole of it
    /// at once at most.
    TokenBucket,
    /// A rolling window, estimated from two fixed windows.
    SlidingWindow,
    /// A rolling window, exact (one entry per admitted request).
    SlidingLog,
}

impl Algorithm {
    fn parse(text: &str) -> Option<Algorithm> {
        Some(match text {
            "fixed_window" => Algorithm::FixedWindow,
            "token_bucket" => Algorithm::TokenBucket,
            "sliding_window" => Algorithm::SlidingWindow,
            "sliding_log" => Algorithm::SlidingLog,
            _ => return None,
        })
    }
}

/// A limit's numbers: `requests_per_unit` per `unit`, kept by `algorithm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Requests per unit; 0 denies every request.
    pub requests_per_unit: u32,
    /// The window.
    pub unit: Unit,
    /// How it is kept.
    pub algorithm: Algorithm,
}

impl Quota {
    /// The Sluice limit that keeps this quota; `None` for 0 requests (no
    /// request is ever admitted, so nothing is stored).
    pub fn limit(&self) -> Option<Limit> {
        let n = u64::from(self.requests_per_unit);
        let window_ns = self.unit.seconds() * NS_PER_S;
        if n == 0 {
            return None;
        }
        let window = Window {
            limit: n,
            window_ns,
        };
        Some(match self.algorithm {
            Algorithm::FixedWindow => Limit::FixedWindow(window),
            Algorithm::SlidingWindow => Limit::SlidingCounter(window),
            Algorithm::SlidingLog => Limit::SlidingLog(window),
            Algorithm::TokenBucket => Limit::TokenBucket(Policy {
                count: n,
                period_ns: window_ns,
                burst: n,
            }),
        })
    }

    /// `duration_until_reset` in whole seconds, rounded up: for a fixed
    /// window the time to the end of the aligned window (the reference's
    /// `unit - now_s % unit`, to the second), for the others the verdict's
    /// `reset_after_ns` (until the limit is whole again).
    ///
    /// Whole seconds because Envoy keeps only the seconds of it for the
    /// RateLimit-Reset / X-RateLimit-Reset headers; rounded up so that a
    /// client that waits that long finds the limit reset, never a moment
    /// before (the exact nanoseconds, truncated by Envoy, said up to a
    /// second too little).
    pub fn duration_until_reset_s(&self, now_ns: u64, reset_after_ns: u64) -> u64 {
        let reset_ns = match self.algorithm {
            Algorithm::FixedWindow => {
                let window_ns = self.unit.seconds() * NS_PER_S;
                window_ns - now_ns % window_ns
            }
            _ => reset_after_ns,
        };
        reset_ns.div_ceil(NS_PER_S)
    }
}

/// What a descriptor of the tree does to a request it matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `rate_limit.name`, for `replaces` and for the reply's `current_limit`.
    pub name: String,
    /// `None`: `unlimited: true`.
    pub quota: Option<Quota>,
    /// Names of rules this one replaces.
    pub replaces: Vec<String>,
    /// Counted, never denies.
    pub shadow_mode: bool,
    /// By entry position: the wildcard pattern (`files/*`) that stands for
    /// the request's value in the bucket key, where a `share_threshold`
    /// wildcard on the way to this rule matched; empty when none did. Every
    /// value such a wildcard matches then spends from one bucket.
    pub shared: Vec<Option<String>>,
}

impl Rule {
    /// A descriptor's own `limit` (Envoy's override): a fixed window of its
    /// numbers, no name, nothing shared, never in shadow mode (as in
    /// envoyproxy/ratelimit).
    pub fn override_of(requests_per_unit: u32, unit: Unit) -> Rule {
        Rule {
            name: String::new(),
            quota: Some(Quota {
                requests_per_unit,
                unit,
                algorithm: Algorithm::FixedWindow,
            }),
            replaces: Vec::new(),
            shadow_mode: false,
            shared: Vec::new(),
        }
    }

    /// The `(key, value)` entries a request descriptor's bucket is keyed
    /// by: its own, except that an entry a `share_threshold` wildcard
    /// matched has the wildcard's pattern for its value.
    pub fn key_entries<'a>(
        &'a self,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> impl Iterator<Item = (&'a str, &'a str)> {
        entries
            .into_iter()
            .enumerate()
            .map(move |(i, (key, value))| match self.shared.get(i) {
                Some(Some(pattern)) => (key, pattern.as_str()),
                _ => (key, value),
            })
    }
}

/// One level of a domain's tree.
#[derive(Debug, Default)]
struct Level {
    /// `key` -> `value` -> descriptor.
    exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, prefix, descriptor)`, in file order.
    wildcards: Vec<(String, String, Node)>,
    /// `key` -> the descriptor with that key and no value.
    defaults: HashMap<String, Node>,
}

#[derive(Debug, Default)]
struct Node {
    rule: Option<Rule>,
    children: Level,
}

impl Level {
    /// The descriptor for a request entry, in envoyproxy/ratelimit's order:
    /// the same value, else the first wildcard (in file order) whose prefix
    /// the value has, else the key without a value.
    fn find(&self, key: &str, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some(node);
        }
        // A value that is a wildcard's own text (`/api/v1*`) finds that
        // wildcard first, as the reference's lookup by `key_value` does.
        let wildcards = self.wildcards.iter().filter(|(k, _, _)| k == key);
        if let Some(prefix) = value.strip_suffix('*') {
            if let Some((_, _, node)) = wildcards.clone().find(|(_, p, _)| p == prefix) {
                return Some(node);
            }
        }
        if let Some((_, _, node)) = wildcards
            .clone()
            .find(|(_, prefix, _)| value.starts_with(prefix.as_str()))
        {
            return Some(node);
        }
        self.defaults.get(key)
    }
}

/// Every domain's rules.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Level>,
    /// The files they came from.
    files: usize,
}

impl Rules {
    /// The rule for a request descriptor's entries (`(key, value)`, in
    /// order) in `domain`, if one applies.
    pub fn find<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&Rule> {
        let mut level = self.domains.get(domain)?;
        let mut entries = entries.into_iter().peekable();
        while let Some((key, value)) = entries.next() {
            let node = level.find(key, value)?;
            if entries.peek().is_none() {
                return node.rule.as_ref();
            }
            level = &node.children;
        }
        None
    }

    /// Whether `domain` has rules (a descriptor's `limit` override applies
    /// only in a known domain, as in envoyproxy/ratelimit).
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// How many domains.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// How many files they were read from.
    pub fn files(&self) -> usize {
        self.files
    }

    /// Reads `path`: one rule file, or every `*.yaml` / `*.yml` file of a
    /// directory (not its subdirectories), in name order.
    pub fn load(path: &Path) -> Result<Rules, RulesError> {
        let io = |e: std::io::Error| RulesError {
            path: path.to_owned(),
            message: e.to_string(),
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let files: Vec<PathBuf> = if meta.is_dir() {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(path).map_err(io)? {
                let p = entry.map_err(io)?.path();
                let yaml = matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
                if yaml && p.is_file() {
                    files.push(p);
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(RulesError {
                    path: path.to_owned(),
                    message: "no *.yaml or *.yml file in this directory".into(),
                });
            }
            files
        } else {
            vec![path.to_owned()]
        };
        let mut rules = Rules::default();
        for file in &files {
            let text = std::fs::read_to_string(file).map_err(|e| RulesError {
                path: file.clone(),
                message: e.to_string(),
            })?;
            rules.add(&text).map_err(|message| RulesError {
                path: file.clone(),
                message,
            })?;
        }
        Ok(rules)
    }

    /// Adds one file's domain, from its text.
    pub fn add(&mut self, text: &str) -> Result<(), String> {
        let file: FileYaml = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        if file.domain.is_empty() {
            return Err("the domain is empty".into());
        }
        if self.domains.contains_key(&file.domain) {
            return Err(format!("domain {:?} is in another file too", file.domain));
        }
        let level = level(&file.descriptors, &file.domain, &[])?;
        self.domains.insert(file.domain, level);
        self.files += 1;
        Ok(())
    }
}

/// One level of descriptors at `at` (the path, for errors); `shared` holds,
/// by depth, the `share_threshold` patterns of the wildcards above it.
fn level(
    descriptors: &[DescriptorYaml],
    at: &str,
    shared: &[Option<String>],
) -> Result<Level, String> {
    let mut out = Level::default();
    for d in descriptors {
        // An empty value is no value, as in envoyproxy/ratelimit.
        let value = d.value.as_deref().filter(|v| !v.is_empty());
        let here = match value {
            Some(v) => format!("{at}.{}_{v}", d.key),
            None => format!("{at}.{}", d.key),
        };
        if d.key.is_empty() {
            return Err(format!("{here}: a descriptor with an empty key"));
        }
        let mut shared = shared.to_vec();
        shared.push(share(d, &here)?);
        // shadow_mode without a rate_limit means nothing, and is accepted
        // (as envoyproxy/ratelimit accepts it).
        let rule = match &d.rate_limit {
            None => None,
            Some(r) => {
                let mut rule = rule(r, d.shadow_mode, &here)?;
                if shared.iter().any(Option::is_some) {
                    rule.shared.clone_from(&shared);
                }
                Some(rule)
            }
        };
        let node = Node {
            rule,
            children: level(&d.descriptors, &here, &shared)?,
        };
        let duplicate = match value {
            None => out.defaults.insert(d.key.clone(), node).is_some(),
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => {
                    let dup = out
                        .wildcards
                        .iter()
                        .any(|(k, p, _)| *k == d.key && p == prefix);
                    out.wildcards.push((d.key.clone(), prefix.to_owned(), node));
                    dup
                }
                None => out
                    .exact
                    .entry(d.key.clone())
                    .or_default()
                    .insert(v.to_owned(), node)
                    .is_some(),
            },
        };
        if duplicate {
            return Err(format!(
                "{here}: a second descriptor with this key and value"
            ));
        }
    }
    Ok(out)
}

/// A descriptor's `share_threshold`: its wildcard pattern, which every
/// value it matches is counted under; only a wildcard value may share (as
/// envoyproxy/ratelimit requires).
fn share(d: &DescriptorYaml, here: &str) -> Result<Option<String>, String> {
    match &d.value {
        _ if !d.share_threshold => Ok(None),
        Some(v) if v.ends_with('*') => Ok(Some(v.clone())),
        _ => Err(format!(
            "{here}: share_threshold needs a wildcard value (one ending in *)"
        )),
    }
}

fn rule(r: &RateLimitYaml, shadow_mode: bool, here: &str) -> Result<Rule, String> {
    let mut replaces = Vec::new();
    for rep in &r.replaces {
        match &rep.name {
            Some(n) if !n.is_empty() => {
                if r.name.as_deref() == Some(n.as_str()) {
                    return Err(format!("{here}: a rate_limit replaces itself ({n:?})"));
                }
                replaces.push(n.clone());
            }
            _ => return Err(format!("{here}: a replaces entry without a name")),
        }
    }
    let algorithm = match &r.algorithm {
        None => Algorithm::default(),
        Some(a) => Algorithm::parse(a).ok_or_else(|| {
            format!("{here}: algorithm {a:?} is not one of fixed_window, token_bucket, sliding_window, sliding_log")
        })?,
    };
    let quota = if r.unlimited {
        // requests_per_unit is ignored, as envoyproxy/ratelimit ignores it;
        // a unit is refused there too.
        if r.unit.is_some() || r.algorithm.is_some() {
            return Err(format!(
                "{here}: an unlimited rate_limit has no unit or algorithm"
            ));
        }
        None
    } else {
        let unit = r
            .unit
            .as_deref()
            .ok_or_else(|| format!("{here}: a rate_limit without a unit"))?;
        let unit = Unit::parse(unit).ok_or_else(|| {
            format!(
                "{here}: unit {unit:?} is not one of second, minute, hour, day, week, month, year"
            )
        })?;
        let quota = Quota {
            requests_per_unit: r
                .requests_per_unit
                .ok_or_else(|| format!("{here}: a rate_limit without requests_per_unit"))?,
            unit,
            algorithm,
        };
        if let Some(limit) = quota.limit() {
            limit.validate().map_err(|e| format!("{here}: {e}"))?;
        }
        Some(quota)
    };
    Ok(Rule {
        name: r.name.clone().unwrap_or_default(),
        quota,
        replaces,
        shadow_mode,
        shared: Vec::new(),
    })
}

/// A rule file (or directory) that cannot be served.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct RulesError {
    /// The file (or directory).
    pub path: PathBuf,
    /// What is wrong, with the descriptor's path (`domain.key_value...`).
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorYaml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorYaml {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimitYaml>,
    #[serde(default)]
    descriptors: Vec<DescriptorYaml>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: bool,
    /// Every value this wildcard matches spends from one bucket.
    #[serde(default)]
    share_threshold: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitYaml {
    unit: Option<String>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplacesYaml>,
    /// Sluice's: how the limit is kept.
    algorithm: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesYaml {
    name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> Rules {
        let mut r = Rules::default();
        r.add(text).unwrap();
        r
    }

    fn refused(text: &str) -> String {
        Rules::default().add(text).unwrap_err()
    }

    /// envoyproxy/ratelimit's README, example 1 and 2 (a nested key with a
    /// default, and key with a value).
    #[test]
    fn lookup_follows_the_tree_as_envoyproxy_ratelimit_does() {
        let r = rules(
            r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: { unit: second, requests_per_unit: 500 }
  - key: database
    value: default
    rate_limit: { unit: second, requests_per_unit: 500 }
  - key: to_number
    rate_limit: { unit: day, requests_per_unit: 100 }
    descriptors:
      - key: from_number
        value: "9"
        rate_limit: { unit: day, requests_per_unit: 10 }
  - key: path
    value: "/api/*"
    rate_limit: { unit: Minute, requests_per_unit: 7 }
  - key: path
    value: "/api/v2/*"
    rate_limit: { unit: minute, requests_per_unit: 9 }
"#,
        );
        let rpu = |d: &str, e: &[(&str, &str)]| {
            r.find(d, e.iter().copied())
                .map(|rule| rule.quota.unwrap().requests_per_unit)
        };
        assert_eq!(rpu("mongo_cps", &[("database", "users")]), Some(500));
        assert_eq!(rpu("mongo_cps", &[("database", "other")]), None);
        assert_eq!(rpu("mongo_cps", &[("to_number", "1")]), Some(100));
        assert_eq!(
            rpu("mongo_cps", &[("to_number", "1"), ("from_number", "9")]),
            Some(10)
        );
        // Deeper than the branch: no limit.
        assert_eq!(
            rpu("mongo_cps", &[("to_number", "1"), ("from_number", "8")]),
            None
        );
        assert_eq!(
            rpu("mongo_cps", &[("database", "users"), ("extra", "x")]),
            None
        );
        // Wildcards in file order.
        assert_eq!(rpu("mongo_cps", &[("path", "/api/v2/x")]), Some(7));
        assert_eq!(rpu("mongo_cps", &[("path", "/other")]), None);
        assert_eq!(rpu("other_domain", &[("database", "users")]), None);
        let unit = r
            .find("mongo_cps", [("path", "/api/")])
            .unwrap()
            .quota
            .unwrap()
            .unit;
        assert_eq!(unit, Unit::Minute);
    }

    /// Wildcards as envoyproxy/ratelimit matches them: only a `*` that ends
    /// a value is one (by prefix); a `*` anywhere else is a character; a
    /// value that is a wildcard's own text finds that wildcard; an empty
    /// value is no value; precedence exact, wildcard (file order), no value.
    #[test]
    fn wildcards_match_as_envoyproxy_ratelimit_matches_them() {
        let r = rules(
            r#"
domain: d
descriptors:
  - { key: p, value: "/api/*/users", rate_limit: { unit: hour, requests_per_unit: 1 } }
  - { key: p, value: "/api/*", rate_limit: { unit: hour, requests_per_unit: 2 } }
  - { key: p, value: "/api/v1*", rate_limit: { unit: hour, requests_per_unit: 3 } }
  - { key: p, value: "/a*b*", rate_limit: { unit: hour, requests_per_unit: 4 } }
  - { key: p, rate_limit: { unit: hour, requests_per_unit: 5 } }
  - { key: p, value: "/exact", rate_limit: { unit: hour, requests_per_unit: 6 } }
  - { key: h, value: "", rate_limit: { unit: hour, requests_per_unit: 7 } }
  - { key: any, value: "*", rate_limit: { unit: hour, requests_per_unit: 8 } }
  - { key: any, rate_limit: { unit: hour, requests_per_unit: 9 } }
  - key: n
    value: "x*"
    descriptors:
      - { key: m, value: "y", rate_limit: { unit: hour, requests_per_unit: 10 } }
      - { key: m, value: "y*", rate_limit: { unit: hour, requests_per_unit: 11 } }
      - { key: m, rate_limit: { unit: hour, requests_per_unit: 12 } }
"#,
        );
        let rpu = |e: &[(&str, &str)]| {
            r.find("d", e.iter().copied())
                .map(|rule| rule.quota.unwrap().requests_per_unit)
        };
        for (value, want) in [
            // A `*` inside a value is the character.
            ("/api/*/users", 1),
            ("/api/v2/users", 2),
            // The first wildcard in file order wins...
            ("/api/v1/users", 2),
            ("/api/", 2),
            // ...except for a value that is a wildcard's own text.
            ("/api/v1*", 3),
            // Several: the last `*` is the wildcard, the others characters.
            ("/a*bc", 4),
            ("/a*b", 4),
            ("/axbc", 5),
            ("/ab", 5),
            ("/exact", 6),
            ("", 5),
        ] {
            assert_eq!(rpu(&[("p", value)]), Some(want), "{value:?}");
        }
        // `value: ""` is the key's rule for every value.
        assert_eq!(rpu(&[("h", "anything")]), Some(7));
        assert_eq!(rpu(&[("h", "")]), Some(7));
        // `*` alone matches every value, the empty one too, before no value.
        assert_eq!(rpu(&[("any", "")]), Some(8));
        assert_eq!(rpu(&[("any", "z")]), Some(8));
        // The same order one level down.
        assert_eq!(rpu(&[("n", "x1"), ("m", "y")]), Some(10));
        assert_eq!(rpu(&[("n", "x1"), ("m", "yz")]), Some(11));
        assert_eq!(rpu(&[("n", "x1"), ("m", "z")]), Some(12));
        assert_eq!(rpu(&[("n", "z"), ("m", "y")]), None);
        // No value and an empty value are the same descriptor.
        let got = refused("domain: d\ndescriptors: [{key: k}, {key: k, value: ''}]");
        assert!(got.contains("d.k: a second descriptor"), "{got}");
    }

    #[test]
    fn flags_and_algorithms_are_read() {
        let r = rules(
            r#"
domain: d
descriptors:
  - key: a
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 3, name: a, replaces: [{name: b}], algorithm: token_bucket }
  - key: u
    rate_limit: { unlimited: true }
"#,
        );
        let a = r.find("d", [("a", "1")]).unwrap();
        assert!(a.shadow_mode);
        assert_eq!(a.replaces, ["b"]);
        assert_eq!(
            a.quota.unwrap().limit(),
            Some(Limit::TokenBucket(Policy {
                count: 3,
                period_ns: 3_600 * NS_PER_S,
                burst: 3
            }))
        );
        assert_eq!(r.find("d", [("u", "x")]).unwrap().quota, None);
    }

    /// The bucket key of a rule a `share_threshold` wildcard led to.
    fn bucket(r: &Rules, entries: &[(&str, &str)]) -> String {
        let rule = r.find("d", entries.iter().copied()).expect("a rule");
        let parts: Vec<String> = rule
            .key_entries(entries.iter().copied())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.join("/")
    }

    /// envoyproxy/ratelimit's share_threshold: every value a wildcard
    /// matches is counted under the wildcard's pattern, also for a rule
    /// below it; an exact value beside it, and a wildcard without it, keep
    /// the request's value.
    #[test]
    fn share_threshold_keys_a_rule_by_its_wildcard_pattern() {
        let r = rules(
            r#"
domain: d
descriptors:
  - key: file
    value: docs/*
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: file
    value: docs/readme
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: org
    value: org-*
    share_threshold: true
    descriptors:
      - key: user
        value: u*
        rate_limit: { unit: hour, requests_per_unit: 5 }
      - key: team
        value: t*
        share_threshold: true
        rate_limit: { unit: hour, requests_per_unit: 5 }
"#,
        );
        assert_eq!(bucket(&r, &[("file", "docs/a.txt")]), "file=docs/*");
        assert_eq!(bucket(&r, &[("file", "docs/")]), "file=docs/*");
        assert_eq!(bucket(&r, &[("file", "docs/readme")]), "file=docs/readme");
        assert_eq!(
            bucket(&r, &[("org", "org-1"), ("user", "u7")]),
            "org=org-*/user=u7"
        );
        assert_eq!(
            bucket(&r, &[("org", "org-2"), ("team", "t9")]),
            "org=org-*/team=t*"
        );
        for (text, want) in [
            (
                "domain: d\ndescriptors: [{key: k, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 1}}]",
                "d.k: share_threshold needs a wildcard value",
            ),
            (
                "domain: d\ndescriptors: [{key: k, value: v, share_threshold: true}]",
                "d.k_v: share_threshold needs a wildcard value",
            ),
        ] {
            let got = refused(text);
            assert!(got.contains(want), "{text:?}: {got:?} lacks {want:?}");
        }
        // `share_threshold: false` is allowed anywhere.
        rules("domain: d\ndescriptors: [{key: k, value: v, share_threshold: false}]");
    }

    /// Whole seconds, rounded up; a fixed window's is what envoyproxy/
    /// ratelimit computes from the Unix second (`60 - now_s % 60`).
    #[test]
    fn duration_until_reset_is_whole_seconds_rounded_up() {
        let quota = |unit, algorithm| Quota {
            requests_per_unit: 10,
            unit,
            algorithm,
        };
        let minute = quota(Unit::Minute, Algorithm::FixedWindow);
        for (now_ns, want_s) in [
            (0, 60),
            (12 * NS_PER_S, 48),
            (12 * NS_PER_S + 1, 48),
            (12 * NS_PER_S + 999_999_999, 48),
            (59 * NS_PER_S + 1, 1),
            // 2025-11-24T16:00:17.3Z: 43 s to the minute's end.
            (1_764_000_017 * NS_PER_S + 300_000_000, 43),
        ] {
            assert_eq!(minute.duration_until_reset_s(now_ns, 0), want_s, "{now_ns}");
        }
        let bucket = quota(Unit::Hour, Algorithm::TokenBucket);
        assert_eq!(bucket.duration_until_reset_s(5, 0), 0);
        assert_eq!(bucket.duration_until_reset_s(5, 1), 1);
        assert_eq!(bucket.duration_until_reset_s(5, 360 * NS_PER_S), 360);
        assert_eq!(bucket.duration_until_reset_s(5, 360 * NS_PER_S + 1), 361);
    }

    #[test]
    fn bad_files_are_refused_with_where_and_why() {
        let cases = [
            ("domain: ''", "the domain is empty"),
            ("domain: d\ndescriptors: [{key: ''}]", "d.: a descriptor with an empty key"),
            ("domain: d\nbogus: 1", "unknown field `bogus`"),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]",
                "d.k: unit \"fortnight\" is not one of",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: true, unit: second}}]",
                "d.k: an unlimited rate_limit has no unit or algorithm",
            ),
            (
                "domain: d\ndescriptors: [{key: k, value: v}, {key: k, value: v}]",
                "d.k_v: a second descriptor with this key and value",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}}]",
                "d.k: a replaces entry without a name",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second}}]",
                "d.k: a rate_limit without requests_per_unit",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 100000, algorithm: sliding_log}}]",
                "d.k: ",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}}]",
                "d.k: algorithm \"leaky\"",
            ),
            (
                "domain: d\ndescriptors: [{key: k, descriptors: [{key: j, rate_limit: {requests_per_unit: 1}}]}]",
                "d.k.j: a rate_limit without a unit",
            ),
        ];
        for (text, want) in cases {
            let got = refused(text);
            assert!(got.contains(want), "{text:?}: {got:?} lacks {want:?}");
        }
        let mut r = rules("domain: d");
        assert_eq!(
            r.add("domain: d").unwrap_err(),
            "domain \"d\" is in another file too"
        );
    }

    /// What envoyproxy/ratelimit loads and ignores is loaded and ignored:
    /// shadow_mode on a descriptor without a rate_limit, requests_per_unit
    /// beside `unlimited: true`.
    #[test]
    fn what_the_reference_ignores_is_accepted() {
        let r = rules(
            r#"
domain: d
descriptors:
  - key: parent
    shadow_mode: true
    descriptors:
      - { key: child, rate_limit: { unit: minute, requests_per_unit: 4 } }
  - { key: free, rate_limit: { unlimited: true, requests_per_unit: 9 } }
"#,
        );
        let child = r.find("d", [("parent", "p"), ("child", "c")]).unwrap();
        assert!(!child.shadow_mode);
        assert_eq!(child.quota.unwrap().requests_per_unit, 4);
        assert_eq!(r.find("d", [("parent", "p")]), None);
        assert_eq!(r.find("d", [("free", "x")]).unwrap().quota, None);
    }

    #[test]
    fn a_directory_is_every_yaml_file_in_it() {
        let dir = std::env::temp_dir().join(format!("sluice-rls-rules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.yaml"), "domain: a").unwrap();
        std::fs::write(dir.join("b.yml"), "domain: b").unwrap();
        std::fs::write(dir.join("notes.txt"), "not yaml: [").unwrap();
        let r = Rules::load(&dir).unwrap();
        assert_eq!((r.domains(), r.files()), (2, 2));
        std::fs::write(dir.join("c.yaml"), "domain: a").unwrap();
        let e = Rules::load(&dir).unwrap_err();
        assert_eq!(e.path, dir.join("c.yaml"));
        std::fs::remove_dir_all(&dir).unwrap();
        let e = Rules::load(&dir).unwrap_err();
        assert_eq!(e.path, dir);
    }
}
