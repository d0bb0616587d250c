//! Named tiers against a real `sluiced --config FILE`: a client names a
//! tier instead of sending limits; SIGHUP and the RELOAD op swap the tiers
//! without touching buckets; an unknown tier is UNKNOWN_TIER; a bad file is
//! CONFIG_INVALID and leaves the old tiers in force.

use std::time::{Duration, Instant};

use sluice_client::{Action, Client, Error, Kind, LeaseTarget, Limits, Mode, Priority, Status};
use sluice_tests::support::{client, tiers_toml, ConfigFile, Sluiced};

/// Longest a test waits for a SIGHUP to take effect.
const RELOAD_WAIT: Duration = Duration::from_secs(5);

fn status<T: std::fmt::Debug>(r: Result<T, Error>) -> Status {
    match r {
        Err(e) => e
            .status()
            .unwrap_or_else(|| panic!("not a server error: {e}")),
        Ok(ok) => panic!("expected an error, got {ok:?}"),
    }
}

/// Probes `key` in `tier` at cost 0 until its first limit reports `limit`.
async fn wait_for_limit(client: &Client, key: &[u8], tier: &str, limit: u64) -> u64 {
    let start = Instant::now();
    loop {
        let now = client.probe(key, Limits::Tier(tier), 0).await.unwrap();
        let v = now.verdicts[0].verdict;
        if v.limit == limit {
            return v.remaining;
        }
        assert!(
            start.elapsed() < RELOAD_WAIT,
            "tier {tier} still reports limit {} after {RELOAD_WAIT:?}",
            v.limit
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sighup_reloads_a_tier_and_its_buckets_keep_their_state() {
    let config = ConfigFile::new(&tiers_toml(&[("free", &["token-bucket:2/h,burst=2"])]));
    let mut server = Sluiced::start(&["--shards", "2", "--config", config.arg()]);
    let client = client(&server, true).await;
    let key = b"tenant-7";
    let free = Limits::Tier("free");
    for i in 0..2 {
        let ok = client.spend(key, free, 1).await.unwrap();
        assert!(ok.allowed, "{ok:?}");
        assert_eq!(ok.verdicts.len(), 1);
        assert_eq!(ok.verdicts[0].kind, Kind::TokenBucket);
        assert_eq!(ok.verdicts[0].verdict.limit, 2);
        assert_eq!(ok.verdicts[0].verdict.remaining, 1 - i);
    }
    let third = client.spend(key, free, 1).await.unwrap();
    assert!(!third.allowed);
    assert_eq!(third.denied_index, Some(0));
    assert!(third.retry_after_ns > 0);
    assert_eq!(
        status(client.spend(key, free, 3).await),
        Status::CostExceedsBurst,
        "the server checks a tier's costs"
    );
    config.write(&tiers_toml(&[("free", &["token-bucket:2/h,burst=5"])]));
    server.hangup();
    // Two units are still spent: 3 of the new 5 remain, not 5.
    let remaining = wait_for_limit(&client, key, "free", 5).await;
    assert_eq!(remaining, 3, "the bucket kept its state across the reload");
    let ok = client.spend(key, free, 1).await.unwrap();
    assert!(ok.allowed);
    assert_eq!(ok.verdicts[0].verdict.remaining, 2);
    let e = client
        .spend(key, Limits::Tier("gold"), 1)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::UnknownTier));
    assert_eq!(e.action(), Action::GiveUp);
    assert_eq!(
        e.to_string(),
        r#"server said unknown tier (15): "gold" is not one of this node's tiers (free)"#
    );
    assert!(server.is_running());
}

#[tokio::test]
async fn the_reload_op_swaps_tiers_and_a_bad_file_changes_nothing() {
    let free: &[&str] = &["token-bucket:10/h", "concurrency:2,lease=30s"];
    let config = ConfigFile::new(&tiers_toml(&[("free", free)]));
    let mut server = Sluiced::start(&["--config", config.arg()]);
    let client = client(&server, false).await;
    let key = b"tenant-9";
    let paid = Limits::Tier("paid");
    assert_eq!(
        status(client.spend(key, paid, 1).await),
        Status::UnknownTier
    );
    let both = tiers_toml(&[("free", free), ("paid", &["sliding-counter:100/h"])]);
    config.write(&both);
    assert_eq!(client.reload().await.unwrap(), 2);
    let ok = client.spend(key, paid, 1).await.unwrap();
    assert!(ok.allowed);
    assert_eq!(ok.verdicts[0].kind, Kind::SlidingCounter);
    assert_eq!(ok.verdicts[0].verdict.remaining, 99);
    // A tier's lease is named by the tier and the limit's position in it.
    let ok = client.spend(key, Limits::Tier("free"), 1).await.unwrap();
    let lease = ok.verdicts[1].lease_id;
    assert_ne!(lease, 0);
    let not_concurrency = LeaseTarget::Tier {
        name: "free",
        index: 0,
    };
    let e = client.release(key, not_concurrency, lease).await;
    assert_eq!(status(e), Status::BadRequest);
    let target = LeaseTarget::Tier {
        name: "free",
        index: 1,
    };
    let renewed = client.renew(key, target, lease).await.unwrap();
    assert!(renewed.expires_after_ns > 29_000_000_000);
    let released = client.release(key, target, lease).await.unwrap();
    assert_eq!(released.verdict.verdict.remaining, 2);
    // Bad files: CONFIG_INVALID, and the old tiers stay in force.
    let bad_files = [
        "[tiers.paid]\nlimits = [\"token-bucket:0/s\"]\n".to_owned(),
        "[tiers.paid\n".to_owned(),
        "[tiers.paid]\nlimits = []\n".to_owned(),
        format!("{both}\nno_such_setting = 1\n"),
    ];
    for bad in &bad_files {
        config.write(bad);
        let e = client.reload().await.unwrap_err();
        assert_eq!(e.status(), Some(Status::ConfigInvalid), "{bad:?}: {e}");
        let ok = client.spend(key, paid, 1).await.unwrap();
        assert!(ok.allowed, "{bad:?}");
        assert_eq!(ok.verdicts[0].kind, Kind::SlidingCounter, "{bad:?}");
        let free = client.probe(key, Limits::Tier("free"), 0).await.unwrap();
        assert_eq!(free.verdicts.len(), 2, "{bad:?}");
    }
    // SIGHUP with a bad file is survived too.
    server.hangup();
    config.write(&tiers_toml(&[
        ("free", free),
        ("paid", &["sliding-counter:100/h"]),
        ("gold", &["token-bucket:1000/s"]),
    ]));
    assert_eq!(client.reload().await.unwrap(), 3);
    assert!(
        client
            .spend(key, Limits::Tier("gold"), 1)
            .await
            .unwrap()
            .allowed
    );
    assert!(server.is_running());
}

#[tokio::test]
async fn without_a_config_file_there_are_no_tiers() {
    let server = Sluiced::start(&[]);
    let client = client(&server, true).await;
    // Nothing to reload is an error, not "0 tiers".
    let reload = client.reload().await;
    assert_eq!(status(reload), Status::ConfigInvalid);
    let e = client.probe(b"k", Limits::Tier("free"), 1).await;
    assert_eq!(status(e), Status::UnknownTier);
}

/// A fleet usage shedder is a tier on a shared key with reserves: a
/// backend that takes 10 concurrent calls, 20 % kept for critical ones and
/// 50 % for normal and critical. Through a client that is not
/// shard-aware (so the node forwards half the keys to their shard),
/// `low` holds at most 5 leases, `normal` 3 more, `critical` the last 2;
/// every verdict names its class; a released lease goes to whoever asks
/// next within their class's share. A reserve in a tier that is not one
/// stops the start with the tier, the limit and the reason.
#[tokio::test]
async fn reserves_in_a_tier_keep_the_last_slots_for_critical_calls() {
    let search = "concurrency:10,lease=30s,reserve=critical:20%,reserve=normal:50%";
    let config = ConfigFile::new(&tiers_toml(&[("search", &[search])]));
    let server = Sluiced::start(&["--shards", "2", "--config", config.arg()]);
    let client = client(&server, false).await;
    let tier = Limits::Tier("search");
    for key in [&b"backend:search"[..], b"backend:other"] {
        let mut leases = Vec::new();
        let take = |class| {
            let client = &client;
            async move {
                let ok = client
                    .decide_as(key, tier, Mode::Spend, 1, class)
                    .await
                    .unwrap();
                assert_eq!(ok.priority, class);
                ok
            }
        };
        for (class, share) in [
            (Priority::Low, 5),
            (Priority::Normal, 3),
            (Priority::Critical, 2),
        ] {
            for i in 0..share {
                let ok = take(class).await;
                assert!(ok.allowed, "{class} #{i}: {ok:?}");
                leases.push(ok.verdicts[0].lease_id);
            }
            let denied = take(class).await;
            assert!(!denied.allowed, "{class} past its share: {denied:?}");
            // Honest: the earliest lease expires within the 30 s lease.
            let wait = denied.retry_after_ns;
            assert!(wait > 29_000_000_000 && wait <= 30_000_000_000, "{wait}");
            assert_eq!(denied.verdicts[0].verdict.remaining, 0);
        }
        // One lease back, so 9 held and 1 free: low needs 6 free (its 1
        // and the 5 reserved above it), normal 3, critical 1.
        let target = LeaseTarget::Tier {
            name: "search",
            index: 0,
        };
        client.release(key, target, leases[0]).await.unwrap();
        assert!(!take(Priority::Low).await.allowed);
        assert!(!take(Priority::Normal).await.allowed);
        assert!(take(Priority::Critical).await.allowed);
    }
    drop(server);
    let bad = ConfigFile::new(&tiers_toml(&[(
        "search",
        &["concurrency:10,reserve=critical:120%"],
    )]));
    let out = std::process::Command::new(sluice_tests::support::binary("sluiced"))
        .args(["--port", "0", "--config", bad.arg()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tier \"search\", limit 0") && err.contains("0..=100"),
        "{err}"
    );
}
