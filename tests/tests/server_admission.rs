//! Exact admission under concurrency, against a real `sluiced`: many
//! clients racing on the same buckets must together be admitted exactly the
//! burst, whether each key is sent straight to its shard or forwarded by
//! whichever shard the connection landed on.

use std::time::Duration;

use sluice_client::{Client, ClientConfig, Policy};
use sluice_protocol::routing::{key_hash, shard_of};
use sluice_tests::support::Sluiced;
use tokio::task::JoinSet;

const HOUR_NS: u64 = 3_600_000_000_000;

fn config(shard_aware: bool) -> ClientConfig {
    // Generous: these machines are shared and the test builds are debug.
    ClientConfig {
        deadline: Duration::from_secs(20),
        shard_aware,
        ..ClientConfig::default()
    }
}

/// Starts 16 clients (half shard-aware, half on one connection each, so
/// that the server forwards), and has client `c` run `calls(c)`: a list of
/// keys to spend one unit of, `parallel` calls at a time. Returns the
/// number of admissions per key index.
async fn race(
    server: &Sluiced,
    keys: &[String],
    calls: impl Fn(usize) -> Vec<usize>,
    parallel: usize,
) -> Vec<u64> {
    let policy = Policy::new(1, HOUR_NS, 100).unwrap();
    let mut clients = JoinSet::new();
    for c in 0..16 {
        let client = Client::connect_with(server.addr, config(c % 2 == 0))
            .await
            .expect("connect");
        let plan = calls(c);
        let keys = keys.to_vec();
        clients.spawn(async move {
            let mut admitted = vec![0u64; keys.len()];
            for chunk in plan.chunks(parallel) {
                let mut calls = JoinSet::new();
                for &k in chunk {
                    let client = client.clone();
                    let key = keys[k].clone();
                    calls.spawn(
                        async move { (k, client.throttle(key.as_bytes(), policy, 1).await) },
                    );
                }
                while let Some(done) = calls.join_next().await {
                    let (k, verdict) = done.expect("call task");
                    let verdict = verdict.expect("every call gets a verdict");
                    assert_eq!(verdict.limit, 100);
                    if verdict.allowed {
                        admitted[k] += 1;
                    }
                }
            }
            admitted
        });
    }
    let mut total = vec![0u64; keys.len()];
    while let Some(done) = clients.join_next().await {
        for (t, a) in total.iter_mut().zip(done.expect("client task")) {
            *t += a;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_sixteen_clients_admit_exactly_the_burst() {
    let server = Sluiced::start(&["--shards", "2"]);
    let keys = vec!["hot-key".to_owned()];
    let admitted = race(&server, &keys, |_| vec![0; 500], 8).await;
    assert_eq!(admitted, vec![100], "16 x 500 calls at burst 100, rate 1/h");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_keys_over_all_shards_admit_exactly_the_burst_each() {
    let server = Sluiced::start(&["--shards", "4"]);
    let keys: Vec<String> = (0..1_000).map(|i| format!("tenant-{i}")).collect();
    let mut per_shard = vec![0; usize::from(server.shards)];
    for k in &keys {
        per_shard[usize::from(shard_of(key_hash(k.as_bytes()), server.shards))] += 1;
    }
    assert!(
        per_shard.iter().all(|&n| n > 150),
        "keys cover every shard: {per_shard:?}"
    );
    // Each client walks every key 8 times, starting at a different offset:
    // 128 attempts per key in all, interleaved across clients.
    let plan = |c: usize| {
        (0..8 * 1_000)
            .map(|i| (i + c * 61) % 1_000)
            .collect::<Vec<_>>()
    };
    let admitted = race(&server, &keys, plan, 64).await;
    for (k, &a) in admitted.iter().enumerate() {
        assert_eq!(a, 100, "key {} admitted {a}", keys[k]);
    }
}
