//! Composite limits against a real `sluiced`: a DECIDE with several limits
//! admits all or nothing, a denial consumes nothing anywhere (no token, no
//! window unit, no lease), and the composite wait is the longest of the
//! limits' waits; the same holds whether the key goes straight to its shard
//! or is forwarded, and for many keys racing over every shard.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sluice_client::{inline_limits, Client, DecideOk, Kind, LeaseTarget, Limit, Limits};
use sluice_protocol::routing::{key_hash, shard_of};
use sluice_tests::support::{client, specs, Sluiced};
use tokio::task::JoinSet;

/// 5 per second (burst 5), 3 per minute, 10 at once: the minute window is
/// the one that denies the 4th request.
const COMPOSITE: [&str; 3] = [
    "token-bucket:5/s,burst=5",
    "fixed-window:3/m",
    "concurrency:10,lease=30s",
];
const MINUTE_NS: u64 = 60_000_000_000;

fn composite() -> Limits<'static> {
    inline_limits(&specs(&COMPOSITE)).unwrap()
}

fn kinds(ok: &DecideOk) -> Vec<Kind> {
    ok.verdicts.iter().map(|v| v.kind).collect()
}

/// Waits, if need be, until the current minute window (windows are aligned
/// to the epoch, so the same for every key) has at least 20 s left, so that
/// no test here sees a `fixed-window:3/m` roll over. Waits at most 20 s.
async fn fresh_minute(client: &Client) {
    let window = inline_limits(&specs(&["fixed-window:1/m"])).unwrap();
    // A cost-1 probe reports the time until the window ends.
    let probe = client.probe(b"window-clock", window, 1).await.unwrap();
    let left_ns = probe.verdicts[0].verdict.reset_after_ns;
    assert!(left_ns > 0 && left_ns <= MINUTE_NS, "{probe:?}");
    if left_ns < MINUTE_NS / 3 {
        tokio::time::sleep(Duration::from_nanos(left_ns) + Duration::from_millis(100)).await;
    }
}

/// Checks one denial of the composite: the fixed window alone denies, the
/// others say what they would have left, nothing took a lease, and the
/// composite wait is the largest wait.
fn assert_denied_by_the_window(ok: &DecideOk) {
    assert!(!ok.allowed, "{ok:?}");
    assert_eq!(ok.denied_index, Some(1), "{ok:?}");
    let v = &ok.verdicts;
    assert!(v[0].verdict.allowed && !v[1].verdict.allowed && v[2].verdict.allowed);
    assert!(v.iter().all(|v| v.lease_id == 0), "a denial takes no lease");
    let largest = v.iter().map(|v| v.verdict.retry_after_ns).max().unwrap();
    assert_eq!(ok.retry_after_ns, largest);
    assert_eq!(ok.retry_after_ns, v[1].verdict.retry_after_ns);
    assert!(ok.retry_after_ns > 0 && ok.retry_after_ns <= MINUTE_NS);
    assert_eq!(v[2].verdict.remaining, 6, "7 free slots, less this one");
}

async fn all_or_nothing(shard_aware: bool) {
    let server = Sluiced::start(&["--shards", "3"]);
    let client = client(&server, shard_aware).await;
    fresh_minute(&client).await;
    let key = b"composite-key";
    let start = Instant::now();
    let mut leases = HashSet::new();
    for i in 0..3 {
        let ok = client.spend(key, composite(), 1).await.unwrap();
        assert!(ok.allowed && ok.denied_index.is_none(), "{i}: {ok:?}");
        assert_eq!(ok.retry_after_ns, 0);
        assert_eq!(
            kinds(&ok),
            [Kind::TokenBucket, Kind::FixedWindow, Kind::Concurrency]
        );
        assert_eq!(ok.verdicts[1].verdict.remaining, 2 - i);
        assert_eq!(ok.verdicts[2].verdict.remaining, 9 - i);
        assert_eq!((ok.verdicts[0].lease_id, ok.verdicts[1].lease_id), (0, 0));
        assert!(
            leases.insert(ok.verdicts[2].lease_id),
            "a new lease each time"
        );
    }
    assert!(!leases.contains(&0));
    // Ten denials in a row, each by the window alone. Had a denial consumed
    // a token, the bucket (2 left, one back per 200 ms) would run dry and
    // deny too; had it taken a lease, the free slots would fall.
    for _ in 0..10 {
        let ok = client.spend(key, composite(), 1).await.unwrap();
        assert_denied_by_the_window(&ok);
    }
    // A PROBE answers as the SPEND did, and changes nothing either.
    let probe = client.probe(key, composite(), 1).await.unwrap();
    assert_denied_by_the_window(&probe);
    let now = client.probe(key, composite(), 0).await.unwrap();
    assert!(now.allowed, "cost 0 reads the state: {now:?}");
    assert_eq!(now.verdicts[1].verdict.remaining, 0, "the window is spent");
    assert_eq!(
        now.verdicts[2].verdict.remaining, 7,
        "three leases, no more"
    );
    let tokens = now.verdicts[0].verdict.remaining;
    assert!(
        tokens >= 2,
        "3 of 5 tokens spent, none by the denials: {tokens} left after {:?}",
        start.elapsed()
    );
    // The leases belong to position 2 of the inline limits.
    let Limit::Concurrency(c) = specs(&COMPOSITE)[2] else {
        unreachable!()
    };
    for lease in leases {
        let target = LeaseTarget::Inline { index: 2, limit: c };
        let ok = client.release(key, target, lease).await.unwrap();
        assert_eq!(ok.verdict.lease_id, lease);
    }
    let now = client.probe(key, composite(), 0).await.unwrap();
    assert_eq!(now.verdicts[2].verdict.remaining, 10, "every slot is back");
}

#[tokio::test]
async fn a_composite_admits_all_or_nothing() {
    all_or_nothing(true).await;
}

#[tokio::test]
async fn a_composite_admits_all_or_nothing_when_forwarded() {
    all_or_nothing(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_composites_on_every_shard_admit_exactly_the_window() {
    let server = Sluiced::start(&["--shards", "4"]);
    let direct = client(&server, true).await;
    let forwarded = client(&server, false).await;
    fresh_minute(&direct).await;
    let keys: Vec<String> = (0..200).map(|i| format!("tenant-{i}")).collect();
    let mut per_shard = vec![0; usize::from(server.shards)];
    for k in &keys {
        per_shard[usize::from(shard_of(key_hash(k.as_bytes()), server.shards))] += 1;
    }
    assert!(
        per_shard.iter().all(|&n| n > 20),
        "keys cover every shard: {per_shard:?}"
    );
    // Eight concurrent spends per key, half of them forwarded.
    let mut calls = JoinSet::new();
    for (k, key) in keys.iter().enumerate() {
        for attempt in 0..8 {
            let c = if attempt % 2 == 0 {
                direct.clone()
            } else {
                forwarded.clone()
            };
            let key = key.clone();
            calls.spawn(async move { (k, c.spend(key.as_bytes(), composite(), 1).await) });
        }
    }
    let mut admitted = vec![0u32; keys.len()];
    while let Some(done) = calls.join_next().await {
        let (k, ok) = done.expect("call task");
        let ok = ok.expect("every call gets an answer");
        if ok.allowed {
            admitted[k] += 1;
            assert_ne!(ok.verdicts[2].lease_id, 0);
        } else {
            assert_a_racing_denial(&ok);
        }
    }
    for (k, &a) in admitted.iter().enumerate() {
        assert_eq!(a, 3, "key {} admitted {a} of 8", keys[k]);
    }
    for key in &keys {
        let now = forwarded
            .probe(key.as_bytes(), composite(), 0)
            .await
            .unwrap();
        assert_eq!(now.verdicts[1].verdict.remaining, 0, "{key}");
        assert_eq!(now.verdicts[2].verdict.remaining, 7, "{key}: three leases");
    }
}

/// A racing denial: the window denied (it is the only limit that can), no
/// lease was taken, and the wait is the largest wait.
fn assert_a_racing_denial(ok: &DecideOk) {
    assert_eq!(ok.denied_index, Some(1), "{ok:?}");
    assert!(ok.verdicts.iter().all(|v| v.lease_id == 0));
    let largest = ok.verdicts.iter().map(|v| v.verdict.retry_after_ns).max();
    assert_eq!(Some(ok.retry_after_ns), largest);
}
