//! A follower's copy against real processes: it converges to its primary's
//! state for every limit kind, with another shard count; a large full sync
//! happens while the primary keeps answering; a follower that falls behind
//! (paused) and comes back resyncs; a follower refuses to spend; a bucket
//! years from refilled (kept apart from the 24-byte slots) arrives whole;
//! sync drains wait for the one in flight (group commit) and then ship.

use std::time::{Duration, Instant};

use sluice_client::{inline_limits, Client, ClientConfig, Error, Mode, Status};
use sluice_tests::repl::{self, start_pair, wait_role};
use sluice_tests::support::specs;
use tokio::task::JoinSet;

/// Every kind, each spent a different number of times per key.
const KINDS: [&str; 5] = [
    "token-bucket:1/h,burst=50",
    "fixed-window:50/1d",
    "sliding-log:50/1h",
    "sliding-counter:50/1h",
    "concurrency:50,lease=1h",
];

/// What a node answers to a probe (cost 0) of every kind for `key`.
async fn remaining(c: &Client, key: &[u8]) -> Vec<u64> {
    let lim = inline_limits(&specs(&KINDS)).unwrap();
    let ok = c.decide(key, lim, Mode::Probe, 0).await.expect("probe");
    ok.verdicts.iter().map(|v| v.verdict.remaining).collect()
}

async fn big_client(addr: std::net::SocketAddr) -> Client {
    let config = ClientConfig {
        deadline: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    Client::connect_with(addr, config).await.expect("connect")
}

/// Polls until the follower answers every key as the primary does.
async fn converge(primary: &Client, follower: &Client, keys: &[String]) {
    let start = Instant::now();
    loop {
        let mut differ = None;
        for k in keys {
            let (p, f) = (
                remaining(primary, k.as_bytes()).await,
                remaining(follower, k.as_bytes()).await,
            );
            if p != f {
                differ = Some((k.clone(), p, f));
                break;
            }
        }
        match differ {
            None => return,
            Some(d) if start.elapsed() > Duration::from_secs(20) => {
                panic!("follower never converged: {d:?}")
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_with_another_shard_count_converges_for_every_kind() {
    let (primary, follower) = start_pair(&["--shards", "3"], &["--shards", "2"]).await;
    let p = big_client(primary.addr).await;
    let f = big_client(follower.addr).await;
    let lim = inline_limits(&specs(&KINDS)).unwrap();
    let keys: Vec<String> = (0..200).map(|i| format!("client:{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        for _ in 0..(i % 7 + 1) {
            assert!(p.spend(k.as_bytes(), lim, 1).await.unwrap().allowed);
        }
    }
    // Refunds and resets replicate too.
    p.decide(b"client:3", lim, Mode::Refund, 2).await.unwrap();
    p.decide(b"client:4", lim, Mode::Reset, 0).await.unwrap();
    converge(&p, &f, &keys).await;
    assert_eq!(remaining(&f, b"client:4").await, vec![50; 5]);
    // A follower refuses to spend, and says where the primary is.
    match f.spend(b"client:1", lim, 1).await {
        Err(Error::Server {
            status: Some(Status::NotPrimary),
            text,
            ..
        }) => assert!(text.contains(&primary.addr.to_string()), "{text}"),
        other => panic!("a follower spent: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_sync_of_a_large_table_while_the_primary_answers() {
    let keys_total: u64 = std::env::var("SLUICE_TEST_SYNC_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let primary = sluice_tests::support::Sluiced::start(&["--shards", "2"]);
    let p = big_client(primary.addr).await;
    let policy = sluice_client::Policy::new(1, 3_600_000_000_000, 10).unwrap();
    // Fill: many calls in flight, batched by the client.
    let start = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..64u64 {
        let p = p.clone();
        set.spawn(async move {
            for i in (t..keys_total).step_by(64) {
                let key = format!("k{i}");
                assert!(p.throttle(key.as_bytes(), policy, 1).await.unwrap().allowed);
            }
        });
    }
    while set.join_next().await.is_some() {}
    eprintln!("filled {keys_total} keys in {:?}", start.elapsed());
    let of = primary.addr.to_string();
    let follower = sluice_tests::support::Sluiced::start(&["--shards", "2", "--replica-of", &of]);
    // The primary keeps answering during the sync.
    let sync_start = Instant::now();
    let mut answered = 0u64;
    let mut worst = Duration::ZERO;
    loop {
        let t = Instant::now();
        assert!(p.throttle(b"during-sync", policy, 0).await.unwrap().allowed);
        worst = worst.max(t.elapsed());
        answered += 1;
        let r = repl::role(follower.addr).await.unwrap();
        if repl::streaming(&r) {
            assert!(
                r.keys_synced >= keys_total,
                "synced {} of {keys_total}",
                r.keys_synced
            );
            break;
        }
        assert!(
            sync_start.elapsed() < Duration::from_secs(120),
            "full sync too slow"
        );
    }
    eprintln!(
        "full sync of {keys_total} keys: {:?}; primary answered {answered} calls meanwhile, slowest {worst:?}",
        sync_start.elapsed()
    );
    let f = big_client(follower.addr).await;
    for i in [0, keys_total / 2, keys_total - 1] {
        let key = format!("k{i}");
        let v = f.peek(key.as_bytes(), policy, 0).await.unwrap();
        assert_eq!(v.remaining, 9, "{key} on the follower");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_that_falls_behind_resyncs() {
    let (primary, follower) = start_pair(&["--shards", "2"], &["--shards", "2"]).await;
    let p = big_client(primary.addr).await;
    let lim = inline_limits(&specs(&KINDS)).unwrap();
    let keys: Vec<String> = (0..50).map(|i| format!("behind:{i}")).collect();
    for k in &keys[..25] {
        p.spend(k.as_bytes(), lim, 1).await.unwrap();
    }
    // Paused: sync-mode replies wait at most replica_timeout_ms, then the
    // primary serves alone (and says so) and drops the follower.
    follower.signal("STOP");
    let t = Instant::now();
    for k in &keys {
        assert!(p.spend(k.as_bytes(), lim, 1).await.unwrap().allowed);
    }
    eprintln!("50 spends with the follower paused: {:?}", t.elapsed());
    let r = wait_role(primary.addr, Duration::from_secs(10), |r| {
        r.state == sluice_client::ReplState::Alone
    })
    .await;
    assert_eq!(r.follower, "", "the primary says it is alone");
    follower.signal("CONT");
    wait_role(follower.addr, Duration::from_secs(20), repl::streaming).await;
    let f = big_client(follower.addr).await;
    converge(&p, &f, &keys).await;
}

/// Async mode: no reply waits for an ack, so a paused follower is noticed
/// by the flow's write, which blocks once the socket buffers are full; it
/// ends after FLOW_WRITE_TIMEOUT_MS (10 s) and the primary serves alone
/// (before, it stayed "streaming" and kept every bucket changed since in its
/// change log). Resumed, the follower resyncs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_is_dropped_by_an_async_primary() {
    let (primary, follower) = start_pair(
        &["--shards", "1", "--replication", "async"],
        &["--shards", "1"],
    )
    .await;
    follower.signal("STOP");
    let paused = Instant::now();
    // Sliding logs of up to 1,000 entries on 50 keys: every drain carries
    // each changed key's whole log (16 bytes an entry), far more than the
    // socket buffers between the two hold, from a few thousand requests.
    let load = std::process::Command::new(sluice_tests::support::binary("sluice"))
        .args([
            "--addr",
            &primary.addr.to_string(),
            "bench",
            "--connections",
            "4",
        ])
        .args(["--pipeline", "16", "--keys", "50", "--requests", "40000"])
        .args([
            "--kind",
            "sliding-log",
            "--rate",
            "1000/h",
            "--duration-s",
            "60",
        ])
        .output()
        .expect("sluice bench runs");
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    let r = wait_role(primary.addr, Duration::from_secs(40), |r| {
        r.state == sluice_client::ReplState::Alone
    })
    .await;
    assert_eq!(r.follower, "", "the primary says it is alone");
    assert!(
        paused.elapsed() >= Duration::from_secs(10),
        "dropped after {:?}, before the write timeout",
        paused.elapsed()
    );
    follower.signal("CONT");
    wait_role(follower.addr, Duration::from_secs(60), repl::streaming).await;
}

/// Sends one inline RESP command and reads what comes back within a moment.
async fn resp(addr: std::net::SocketAddr, command: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{command}\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_role_info_and_readonly_on_a_follower() {
    let (primary, follower) = start_pair(&["--resp-port", "0"], &["--resp-port", "0"]).await;
    let (p, f) = (primary.resp_addr.unwrap(), follower.resp_addr.unwrap());
    let role = resp(p, "ROLE").await;
    assert!(role.starts_with("*3\r\n$6\r\nmaster\r\n:"), "{role:?}");
    let role = resp(f, "ROLE").await;
    let port = primary.addr.port().to_string();
    assert!(
        role.starts_with(&format!(
            "*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$9\r\nconnected\r\n"
        )),
        "{role:?}"
    );
    let info = resp(f, "INFO replication").await;
    assert!(
        info.contains("role:slave\r\n") && info.contains("master_link_status:up\r\n"),
        "{info:?}"
    );
    let refused = resp(f, "CL.THROTTLE k 10 1 60").await;
    assert!(refused.starts_with("-READONLY "), "{refused:?}");
    let allowed = resp(p, "CL.THROTTLE k 10 1 60").await;
    assert!(allowed.starts_with("*5\r\n:0\r\n"), "{allowed:?}");
}

/// A token bucket years from refilled (1,000 units at one a day, all
/// spent: kept whole in the shard's side map, past what a 24-byte slot
/// holds) reaches the follower spent, with its whole wait. Fails when the
/// follower stores it as if refilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_years_from_refilled_replicates_whole() {
    let (primary, follower) = start_pair(&["--shards", "2"], &["--shards", "3"]).await;
    let p = big_client(primary.addr).await;
    let f = big_client(follower.addr).await;
    let set = specs(&["token-bucket:1/d,burst=1000"]);
    let lim = inline_limits(&set).unwrap();
    assert!(p.spend(b"years", lim, 1000).await.unwrap().allowed);
    let start = Instant::now();
    loop {
        let probe = f.decide(b"years", lim, Mode::Probe, 0).await.unwrap();
        let v = probe.verdicts[0].verdict;
        if v.remaining == 0 {
            assert!(
                v.reset_after_ns > 999 * 86_400_000_000_000,
                "reset after {} ns",
                v.reset_after_ns
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the follower never saw the bucket spent: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One sample (`series`, labels included) on a node's admin port.
async fn sample(admin: std::net::SocketAddr, series: &'static str) -> f64 {
    let (code, scrape) =
        tokio::task::spawn_blocking(move || sluice_tests::support::http_get(admin, "/metrics"))
            .await
            .unwrap();
    assert_eq!(code, 200);
    sluice_tests::support::metric_sample(&scrape, series)
}

/// `sluice_replication_stream_syncs_total` on a node's admin port.
async fn syncs_sent(admin: std::net::SocketAddr) -> f64 {
    sample(admin, "sluice_replication_stream_syncs_total").await
}

/// The primary's ack histogram (one shard): acks counted, seconds summed.
async fn acks(admin: std::net::SocketAddr) -> (f64, f64) {
    (
        sample(admin, "sluice_replication_ack_seconds_count{shard=\"0\"}").await,
        sample(admin, "sluice_replication_ack_seconds_sum{shard=\"0\"}").await,
    )
}

/// Sync mode's group commit: while a drain waits for its ack, the next one
/// waits too (the changes made meanwhile gather into it), and once the ack
/// comes everything gathered ships and every held reply goes. The follower
/// is paused, so the drain in flight is never acknowledged while spends
/// arrive one by one; without the wait each spend is shipped in a drain of
/// its own (and heartbeats every 50 ms besides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_drains_wait_for_the_one_in_flight_then_ship_together() {
    let (primary, follower) = start_pair(
        &[
            "--shards",
            "1",
            "--replication",
            "sync",
            "--replica-timeout-ms",
            "20000",
            "--admin-port",
            "0",
        ],
        &["--shards", "1"],
    )
    .await;
    let admin = primary.admin_addr.expect("the admin line was printed");
    let p = big_client(primary.addr).await;
    let f = big_client(follower.addr).await;
    let policy = sluice_client::Policy::new(1, 3_600_000_000_000, 50).unwrap();
    follower.signal("STOP");
    // An idle flow sends a heartbeat every 50 ms: after this, one SYNC is
    // in flight that the paused follower will not acknowledge.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = syncs_sent(admin).await;
    let (acks_before, ack_s_before) = acks(admin).await;
    let mut spends = JoinSet::new();
    const SPENDS: u64 = 6;
    for i in 0..SPENDS {
        let p = p.clone();
        spends.spawn(async move { p.throttle(format!("group:{i}").as_bytes(), policy, 1).await });
        // Time for the primary to take the spend (and, without the group
        // commit, to drain it) before the next arrives.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = syncs_sent(admin).await - before;
    assert!(
        spends.len() == SPENDS as usize && spends.try_join_next().is_none(),
        "no reply leaves before the follower has the state"
    );
    assert!(
        held <= 1.0,
        "{held} SYNCs sent while one waited for its ack (at most the drain in flight)"
    );
    follower.signal("CONT");
    while let Some(v) = tokio::time::timeout(Duration::from_secs(10), spends.join_next())
        .await
        .expect("held replies go once the follower acknowledges")
    {
        assert!(v.unwrap().unwrap().allowed);
    }
    for i in 0..SPENDS {
        let key = format!("group:{i}");
        let left = f.peek(key.as_bytes(), policy, 0).await.unwrap();
        assert_eq!(left.remaining, 49, "the follower has {key}'s spend");
    }
    // The drain that waited through the pause was acknowledged at least
    // 300 ms after its SYNC left (the spends and waits above), and the
    // primary's ack histogram says so: a link round trip an operator can
    // read, not only the lag's last sample.
    let (acks_after, ack_s_after) = acks(admin).await;
    assert!(acks_after > acks_before, "no ack counted");
    assert!(
        ack_s_after - ack_s_before >= 0.3,
        "acks summed {} s across a pause of over 0.3 s",
        ack_s_after - ack_s_before
    );
}
