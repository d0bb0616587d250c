//! The bucket cap against a real `sluiced --keys-max 2 --shards 1`: at the
//! cap a request that needs a new bucket is refused with KEYS_FULL (never
//! by evicting a partly spent bucket), a full bucket is dropped to make
//! room, and STATS counts both.

use std::time::{Duration, Instant};

use sluice_client::{inline_limits, Action, Limits, Status};
use sluice_tests::support::{client, json_object, sluice_cli, specs, Sluiced};

/// Longest a test waits for a bucket to refill.
const REFILL_WAIT: Duration = Duration::from_secs(5);

fn slow() -> Limits<'static> {
    inline_limits(&specs(&["token-bucket:1/h,burst=10"])).unwrap()
}

#[tokio::test]
async fn at_the_cap_a_new_key_is_refused_and_a_full_bucket_makes_room() {
    let server = Sluiced::start(&["--keys-max", "2", "--shards", "1"]);
    let client = client(&server, true).await;
    for key in [&b"a"[..], b"b"] {
        let ok = client.spend(key, slow(), 3).await.unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.verdicts[0].verdict.remaining, 7);
    }
    let e = client.spend(b"c", slow(), 1).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::KeysFull), "{e}");
    assert_eq!(e.action(), Action::Retry);
    // A probe needs no bucket; the partly spent buckets are untouched.
    assert!(client.probe(b"c", slow(), 1).await.unwrap().allowed);
    for key in [&b"a"[..], b"b"] {
        let now = client.probe(key, slow(), 0).await.unwrap();
        assert_eq!(now.verdicts[0].verdict.remaining, 7, "not evicted");
    }
    // The command line exits 2, with THROTTLE as with DECIDE.
    for args in [
        &["throttle", "d", "--limit", "token-bucket:1/h,burst=10"][..],
        &["throttle", "d", "--rate", "1/h", "--burst", "10"],
    ] {
        let out = sluice_cli(&server, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("keys full"), "{stderr}");
    }
    let out = sluice_cli(&server, &["stats", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let stats = json_object(&out);
    assert_eq!(stats["shard_count"], 1);
    let shard = &stats["shards"][0];
    assert_eq!(
        (shard["buckets"].as_u64(), shard["keys_max"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(shard["refused"].as_u64().unwrap() >= 3, "{shard}");
    assert_eq!(stats["total"]["refused"], shard["refused"]);
    assert!(shard["bytes"].as_u64().unwrap() > 0);
    assert!(shard["allowed"].as_u64().unwrap() >= 2);
    // Reset "b": its bucket is gone, and a bucket that refills within a
    // millisecond takes the room. Once full it is dropped for a new key.
    client.reset(b"b", slow()).await.unwrap();
    let fast = inline_limits(&specs(&["token-bucket:1000/s,burst=1"])).unwrap();
    assert!(client.spend(b"fast", fast, 1).await.unwrap().allowed);
    let start = Instant::now();
    loop {
        match client.spend(b"e", slow(), 1).await {
            Ok(ok) => break assert!(ok.allowed),
            Err(e) => assert_eq!(e.status(), Some(Status::KeysFull)),
        }
        assert!(
            start.elapsed() < REFILL_WAIT,
            "the full bucket was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.shards.len(), 1);
    assert!(stats.shards[0].evicted_total >= 1, "{stats:?}");
    assert_eq!(stats.shards[0].buckets, 2);
    let a = client.probe(b"a", slow(), 0).await.unwrap();
    assert_eq!(
        a.verdicts[0].verdict.remaining, 7,
        "a partly spent bucket stays"
    );
}

#[tokio::test]
async fn stats_cover_every_shard() {
    let server = Sluiced::start(&["--shards", "5", "--keys-max", "1000"]);
    let client = client(&server, true).await;
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    for key in &keys {
        assert!(
            client
                .spend(key.as_bytes(), slow(), 10)
                .await
                .unwrap()
                .allowed
        );
        assert!(
            !client
                .spend(key.as_bytes(), slow(), 1)
                .await
                .unwrap()
                .allowed
        );
    }
    let stats = client.stats().await.unwrap();
    assert_eq!((stats.shard_count, stats.shard_first), (5, 0));
    assert_eq!(stats.shards.len(), 5);
    let sum = |f: fn(&sluice_client::ShardStats) -> u64| stats.shards.iter().map(f).sum::<u64>();
    assert_eq!(sum(|s| s.buckets), 100);
    assert_eq!(sum(|s| s.allowed_total), 100);
    assert_eq!(sum(|s| s.denied_total), 100);
    assert!(stats
        .shards
        .iter()
        .all(|s| s.keys_max == 1000 && s.buckets > 0));
    let out = sluice_cli(&server, &["stats"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Header, a row per shard, the total, then the node's replication.
    assert_eq!(lines.len(), 1 + 5 + 1 + 1, "{text}");
    assert!(
        lines[7].starts_with("replication: role=primary epoch=0 state=alone"),
        "{text}"
    );
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["shard", "buckets", "bytes", "allowed", "denied", "evicted", "refused", "keys_max"]
    );
    let total: Vec<&str> = lines[6].split_whitespace().collect();
    assert_eq!(
        (total[0], total[1], total[3], total[4]),
        ("total", "100", "100", "100")
    );
}
