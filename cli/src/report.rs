//! What the `sluice` command line prints for each reply: one human line
//! (or table), or exactly one JSON object with `--json`. Kept in the library
//! so that the output's shape is unit-tested without a server.
//!
//! A composite DECIDE_OK is summed up by one verdict ([`summary`]): its
//! `allowed` and `retry_after` are the composite ones (the largest wait, so
//! that waiting that long satisfies every limit), and its `limit`,
//! `remaining` and `reset_after` are those of the first limit that denied,
//! or, when every limit admitted, of the limit with the least `remaining`
//! (the first such): the limit a caller is closest to hitting. This is the
//! limit PROTOCOL.md says the `RateLimit` headers should describe.

use serde_json::{json, Value};
use sluice_protocol::message::{DecideOk, LeaseOk, LimitVerdict, ShardStats, StatsOk};
use sluice_protocol::replication::RoleOk;
use sluice_protocol::Verdict;

/// Milliseconds, rounded up so that waiting that long is always enough.
pub fn ceil_ms(ns: u64) -> u64 {
    ns.div_ceil(1_000_000)
}

/// `allowed limit=5 remaining=4 retry_after=0ms reset_after=200ms`.
pub fn verdict_line(v: &Verdict) -> String {
    format!(
        "{} limit={} remaining={} retry_after={}ms reset_after={}ms",
        if v.allowed { "allowed" } else { "denied" },
        v.limit,
        v.remaining,
        ceil_ms(v.retry_after_ns),
        ceil_ms(v.reset_after_ns)
    )
}

/// A verdict as the JSON object THROTTLE and PEEK print: exactly `allowed`,
/// `limit`, `remaining`, `retry_after_ms`, `reset_after_ms`.
pub fn verdict_json(v: &Verdict) -> Value {
    json!({
        "allowed": v.allowed,
        "limit": v.limit,
        "remaining": v.remaining,
        "retry_after_ms": ceil_ms(v.retry_after_ns),
        "reset_after_ms": ceil_ms(v.reset_after_ns),
    })
}

/// The position of the verdict that sums up `ok` (see the module
/// documentation): [`DecideOk::summary_index`].
pub fn summary_index(ok: &DecideOk) -> usize {
    ok.summary_index()
}

/// One verdict for the whole of `ok` (see the module documentation).
pub fn summary(ok: &DecideOk) -> Verdict {
    let v = ok
        .verdicts
        .get(summary_index(ok))
        .map(|v| v.verdict)
        .unwrap_or_default();
    Verdict {
        allowed: ok.allowed,
        limit: v.limit,
        remaining: v.remaining,
        retry_after_ns: ok.retry_after_ns,
        reset_after_ns: v.reset_after_ns,
    }
}

/// `  [0] token-bucket allowed limit=5 ... reset_after=200ms[ lease=ID]`.
fn limit_line(index: usize, v: &LimitVerdict) -> String {
    let mut line = format!("  [{index}] {} {}", v.kind, verdict_line(&v.verdict));
    if v.lease_id != 0 {
        line.push_str(&format!(" lease={}", v.lease_id));
    }
    line
}

/// The summary line, then one indented line per limit.
pub fn decide_text(ok: &DecideOk) -> String {
    let mut text = verdict_line(&summary(ok));
    // The class only when it is not the default, so plain output stays.
    if ok.priority != sluice_protocol::Priority::Normal {
        text.push_str(&format!(" priority={}", ok.priority));
    }
    for (i, v) in ok.verdicts.iter().enumerate() {
        text.push('\n');
        text.push_str(&limit_line(i, v));
    }
    text
}

/// One limit's verdict as JSON; `lease_id` is null when there is none.
fn limit_json(v: &LimitVerdict) -> Value {
    json!({
        "kind": v.kind.name(),
        "allowed": v.verdict.allowed,
        "limit": v.verdict.limit,
        "remaining": v.verdict.remaining,
        "retry_after_ms": ceil_ms(v.verdict.retry_after_ns),
        "reset_after_ms": ceil_ms(v.verdict.reset_after_ns),
        "lease_id": (v.lease_id != 0).then_some(v.lease_id),
    })
}

/// The summary's five keys (as [`verdict_json`]), `denied_index` (null when
/// every limit admitted), `priority` (the class the verdicts are for) and
/// `verdicts`, one object per limit.
pub fn decide_json(ok: &DecideOk) -> Value {
    let mut v = verdict_json(&summary(ok));
    let map = v.as_object_mut().expect("verdict_json is an object");
    map.insert("denied_index".into(), json!(ok.denied_index));
    map.insert("priority".into(), json!(ok.priority.name()));
    let verdicts = ok.verdicts.iter().map(limit_json).collect();
    map.insert("verdicts".into(), Value::Array(verdicts));
    v
}

/// `released lease=7 limit=1 remaining=1 reset_after=0ms`, or for a renew
/// `renewed lease=7 expires_after=30000ms limit=1 remaining=0 ...`.
pub fn lease_text(ok: &LeaseOk, renew: bool) -> String {
    let v = &ok.verdict.verdict;
    let what = if renew {
        format!(
            "renewed lease={} expires_after={}ms",
            ok.verdict.lease_id,
            ceil_ms(ok.expires_after_ns)
        )
    } else {
        format!("released lease={}", ok.verdict.lease_id)
    };
    format!(
        "{what} limit={} remaining={} reset_after={}ms",
        v.limit,
        v.remaining,
        ceil_ms(v.reset_after_ns)
    )
}

/// `lease_id`, `limit`, `remaining`, `reset_after_ms` and `expires_after_ms`
/// (0 after a release).
pub fn lease_json(ok: &LeaseOk) -> Value {
    let v = &ok.verdict.verdict;
    json!({
        "lease_id": ok.verdict.lease_id,
        "limit": v.limit,
        "remaining": v.remaining,
        "reset_after_ms": ceil_ms(v.reset_after_ns),
        "expires_after_ms": ceil_ms(ok.expires_after_ns),
    })
}

/// The columns of the stats table and of each JSON shard object, in order.
const STATS_COLUMNS: [&str; 7] = [
    "buckets", "bytes", "allowed", "denied", "evicted", "refused", "keys_max",
];

fn stats_values(s: &ShardStats) -> [u64; 7] {
    [
        s.buckets,
        s.bucket_bytes,
        s.allowed_total,
        s.denied_total,
        s.evicted_total,
        s.refused_total,
        s.keys_max,
    ]
}

/// Every shard's counters summed (`keys_max` too: the node's cap).
pub fn stats_total(stats: &StatsOk) -> ShardStats {
    stats
        .shards
        .iter()
        .fold(ShardStats::default(), |t, s| ShardStats {
            buckets: t.buckets.saturating_add(s.buckets),
            bucket_bytes: t.bucket_bytes.saturating_add(s.bucket_bytes),
            allowed_total: t.allowed_total.saturating_add(s.allowed_total),
            denied_total: t.denied_total.saturating_add(s.denied_total),
            evicted_total: t.evicted_total.saturating_add(s.evicted_total),
            refused_total: t.refused_total.saturating_add(s.refused_total),
            keys_max: t.keys_max.saturating_add(s.keys_max),
        })
}

/// A table: a header, one row per shard and a `total` row, right-aligned.
pub fn stats_text(stats: &StatsOk) -> String {
    let first = usize::from(stats.shard_first);
    let mut rows: Vec<Vec<String>> = vec![std::iter::once("shard")
        .chain(STATS_COLUMNS)
        .map(str::to_owned)
        .collect()];
    let named = stats
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| ((first + i).to_string(), *s))
        .chain(std::iter::once(("total".to_owned(), stats_total(stats))));
    for (name, s) in named {
        let values = stats_values(&s).map(|n| n.to_string());
        rows.push(std::iter::once(name).chain(values).collect());
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let lines: Vec<String> = rows
        .iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:>w$}"))
                .collect();
            cells.join("  ")
        })
        .collect();
    lines.join("\n")
}

fn shard_json(s: &ShardStats) -> serde_json::Map<String, Value> {
    STATS_COLUMNS
        .iter()
        .zip(stats_values(s))
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect()
}

/// `shard_count`, `shards` (each with its `shard` number and the table's
/// columns) and `total`.
pub fn stats_json(stats: &StatsOk) -> Value {
    let shards: Vec<Value> = stats
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut m = shard_json(s);
            m.insert("shard".into(), json!(usize::from(stats.shard_first) + i));
            Value::Object(m)
        })
        .collect();
    json!({
        "shard_count": stats.shard_count,
        "shards": shards,
        "total": Value::Object(shard_json(&stats_total(stats))),
    })
}

/// Microseconds as (fractional) milliseconds: 400 is 0.4.
pub fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1_000.0
}

/// `role=follower epoch=3 state=streaming mode=sync lag_ms=0.4
/// keys_synced=12345 primary=127.0.0.1:7700 follower=` (one line; an
/// address the node does not have is empty).
pub fn role_text(r: &RoleOk) -> String {
    format!(
        "role={} epoch={} state={} mode={} lag_ms={} keys_synced={} primary={} follower={}",
        r.role.name(),
        r.epoch,
        r.state.name(),
        r.mode.name(),
        us_to_ms(r.lag_us),
        r.keys_synced,
        r.primary,
        r.follower
    )
}

/// Exactly `role`, `epoch`, `state`, `mode`, `lag_ms` (a float),
/// `keys_synced`, `primary` and `follower` (strings, `""` when none).
pub fn role_json(r: &RoleOk) -> Value {
    json!({
        "role": r.role.name(),
        "epoch": r.epoch,
        "state": r.state.name(),
        "mode": r.mode.name(),
        "lag_ms": us_to_ms(r.lag_us),
        "keys_synced": r.keys_synced,
        "stream_bytes": r.stream_bytes,
        "stream_records": r.stream_records,
        "primary": r.primary,
        "follower": r.follower,
    })
}

/// `sluice role --json`'s `cluster`: the layout hash, this node's group
/// and every group the node knows (name, primary, follower, epoch).
pub fn cluster_json(c: &sluice_protocol::message::ClusterOk) -> Value {
    let group = c
        .own
        .and_then(|i| c.groups.get(usize::from(i)))
        .map(|g| g.name.clone());
    let groups: Vec<Value> = c
        .groups
        .iter()
        .map(|g| {
            json!({
                "name": g.name,
                "primary": g.primary,
                "follower": (!g.follower.is_empty()).then_some(&g.follower),
                "epoch": g.epoch,
            })
        })
        .collect();
    json!({
        "layout": format!("{:016x}", c.layout),
        "group": group,
        "groups": groups,
        "truncated": c.truncated,
    })
}

/// `promoted: epoch=4`.
pub fn promote_text(epoch: u64) -> String {
    format!("promoted: epoch={epoch}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::replication::{Mode as ReplMode, ReplState, Role};
    use sluice_protocol::Kind;

    fn lv(kind: Kind, allowed: bool, remaining: u64, retry_ns: u64, lease_id: u64) -> LimitVerdict {
        LimitVerdict {
            kind,
            verdict: Verdict {
                allowed,
                limit: 10 + remaining,
                remaining,
                retry_after_ns: retry_ns,
                reset_after_ns: 1_000_000 * (remaining + 1),
            },
            lease_id,
        }
    }

    #[test]
    fn a_denial_is_summed_up_by_the_first_denier_and_the_longest_wait() {
        let ok = DecideOk::from_verdicts(vec![
            lv(Kind::TokenBucket, true, 4, 0, 0),
            lv(Kind::FixedWindow, false, 0, 1_500_001, 0),
            lv(Kind::SlidingLog, false, 1, 9_000_000, 0),
            lv(Kind::Concurrency, true, 9, 0, 0),
        ]);
        assert_eq!(summary_index(&ok), 1);
        let s = summary(&ok);
        assert_eq!(
            s,
            Verdict {
                allowed: false,
                limit: 10,
                remaining: 0,
                retry_after_ns: 9_000_000,
                reset_after_ns: 1_000_000,
            }
        );
        let v = decide_json(&ok);
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "allowed",
                "denied_index",
                "limit",
                "priority",
                "remaining",
                "reset_after_ms",
                "retry_after_ms",
                "verdicts"
            ]
        );
        assert_eq!(v["denied_index"], 1);
        assert_eq!(v["retry_after_ms"], 9);
        assert_eq!(v["verdicts"].as_array().unwrap().len(), 4);
        assert_eq!(
            v["verdicts"][1],
            json!({
                "kind": "fixed-window",
                "allowed": false,
                "limit": 10,
                "remaining": 0,
                "retry_after_ms": 2,
                "reset_after_ms": 1,
                "lease_id": null,
            })
        );
        assert_eq!(v["verdicts"][3]["kind"], "concurrency");
    }

    #[test]
    fn an_admission_is_summed_up_by_the_least_remaining_and_shows_leases() {
        let ok = DecideOk::from_verdicts(vec![
            lv(Kind::TokenBucket, true, 4, 0, 0),
            lv(Kind::SlidingCounter, true, 2, 0, 0),
            lv(Kind::Concurrency, true, 2, 0, 77),
        ]);
        assert_eq!(summary_index(&ok), 1, "the first of equal minima");
        let v = decide_json(&ok);
        assert_eq!(v["allowed"], true);
        assert_eq!(v["denied_index"], Value::Null);
        assert_eq!(
            (v["limit"].as_u64(), v["remaining"].as_u64()),
            (Some(12), Some(2))
        );
        assert_eq!(v["reset_after_ms"], 3);
        assert_eq!(v["verdicts"][2]["lease_id"], 77);
        assert_eq!(v["verdicts"][0]["lease_id"], Value::Null);
        let text = decide_text(&ok);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "allowed limit=12 remaining=2 retry_after=0ms reset_after=3ms",
                "  [0] token-bucket allowed limit=14 remaining=4 retry_after=0ms reset_after=5ms",
                "  [1] sliding-counter allowed limit=12 remaining=2 retry_after=0ms reset_after=3ms",
                "  [2] concurrency allowed limit=12 remaining=2 retry_after=0ms reset_after=3ms lease=77",
            ]
        );
    }

    #[test]
    fn the_throttle_shapes_are_unchanged() {
        let v = Verdict {
            allowed: false,
            limit: 2,
            remaining: 0,
            retry_after_ns: 1,
            reset_after_ns: 2_000_000,
        };
        assert_eq!(
            verdict_line(&v),
            "denied limit=2 remaining=0 retry_after=1ms reset_after=2ms"
        );
        assert_eq!(
            verdict_json(&v),
            json!({"allowed": false, "limit": 2, "remaining": 0, "retry_after_ms": 1, "reset_after_ms": 2})
        );
    }

    #[test]
    fn leases_print_their_id_and_life() {
        let ok = LeaseOk {
            verdict: lv(Kind::Concurrency, true, 1, 0, 9),
            expires_after_ns: 30_000_000_000,
        };
        assert_eq!(
            lease_text(&ok, true),
            "renewed lease=9 expires_after=30000ms limit=11 remaining=1 reset_after=2ms"
        );
        assert!(lease_text(&ok, false).starts_with("released lease=9 limit=11 "));
        assert_eq!(
            lease_json(&ok),
            json!({"lease_id": 9, "limit": 11, "remaining": 1, "reset_after_ms": 2, "expires_after_ms": 30000})
        );
    }

    #[test]
    fn stats_have_a_row_per_shard_and_a_total() {
        let shard = |n: u64| ShardStats {
            buckets: n,
            bucket_bytes: 100 * n,
            allowed_total: 2 * n,
            denied_total: 3,
            evicted_total: 0,
            refused_total: n,
            keys_max: 2,
        };
        let stats = StatsOk {
            shard_count: 2,
            shard_first: 0,
            shards: vec![shard(1), shard(20)],
        };
        let v = stats_json(&stats);
        assert_eq!(v["shard_count"], 2);
        assert_eq!(
            v["shards"][1],
            json!({"shard": 1, "buckets": 20, "bytes": 2000, "allowed": 40, "denied": 3,
                   "evicted": 0, "refused": 20, "keys_max": 2})
        );
        assert_eq!(v["total"]["refused"], 21);
        assert_eq!(v["total"]["keys_max"], 4);
        assert!(v["total"].get("shard").is_none());
        let text = stats_text(&stats);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[0],
            "shard  buckets  bytes  allowed  denied  evicted  refused  keys_max"
        );
        assert_eq!(
            lines[3],
            "total       21   2100       42       6        0       21         4"
        );
    }

    fn follower() -> RoleOk {
        RoleOk {
            role: Role::Follower,
            state: ReplState::Streaming,
            mode: ReplMode::Sync,
            epoch: 3,
            lag_us: 400,
            keys_synced: 12_345,
            stream_bytes: 0,
            stream_records: 0,
            primary: "127.0.0.1:7700".into(),
            follower: String::new(),
        }
    }

    #[test]
    fn role_prints_one_line() {
        assert_eq!(
            role_text(&follower()),
            "role=follower epoch=3 state=streaming mode=sync lag_ms=0.4 keys_synced=12345 \
             primary=127.0.0.1:7700 follower="
        );
        let primary = RoleOk {
            role: Role::Primary,
            state: ReplState::Alone,
            mode: ReplMode::Async,
            epoch: 1,
            lag_us: 0,
            keys_synced: 0,
            stream_bytes: 0,
            stream_records: 0,
            primary: "10.0.0.1:7700".into(),
            follower: "10.0.0.2:51234".into(),
        };
        assert_eq!(
            role_text(&primary),
            "role=primary epoch=1 state=alone mode=async lag_ms=0 keys_synced=0 \
             primary=10.0.0.1:7700 follower=10.0.0.2:51234"
        );
        assert_eq!(promote_text(4), "promoted: epoch=4");
    }

    #[test]
    fn role_json_has_exactly_its_keys_and_types() {
        let v = role_json(&follower());
        let map = v.as_object().unwrap();
        let mut keys: Vec<&str> = map.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "epoch",
                "follower",
                "keys_synced",
                "lag_ms",
                "mode",
                "primary",
                "role",
                "state",
                "stream_bytes",
                "stream_records"
            ]
        );
        assert_eq!(v["role"], "follower");
        assert_eq!(v["epoch"].as_u64(), Some(3));
        assert_eq!(v["state"], "streaming");
        assert_eq!(v["mode"], "sync");
        assert!(v["lag_ms"].is_f64());
        assert_eq!(v["lag_ms"].as_f64(), Some(0.4));
        assert_eq!(v["keys_synced"].as_u64(), Some(12_345));
        assert_eq!(v["primary"], "127.0.0.1:7700");
        assert_eq!(v["follower"], "");
        // A whole number of milliseconds is still a float.
        let none = role_json(&RoleOk {
            lag_us: 0,
            ..follower()
        });
        assert!(none["lag_ms"].is_f64());
        assert_eq!(none.to_string().matches("\"lag_ms\":0.0").count(), 1);
        // Every role, state and mode prints its word.
        for (role, word) in [(Role::Primary, "primary"), (Role::Follower, "follower")] {
            let r = RoleOk { role, ..follower() };
            assert_eq!(role_json(&r)["role"], word);
        }
        for (state, word) in [
            (ReplState::Alone, "alone"),
            (ReplState::Syncing, "syncing"),
            (ReplState::Streaming, "streaming"),
            (ReplState::Down, "down"),
        ] {
            let r = RoleOk {
                state,
                ..follower()
            };
            assert_eq!(role_json(&r)["state"], word);
        }
        let r = RoleOk {
            mode: ReplMode::Async,
            ..follower()
        };
        assert_eq!(role_json(&r)["mode"], "async");
    }
}
