//! The cluster client's counters reach the `metrics` facade (feature
//! `metrics`): a call to a group that cannot answer is one call, one local
//! verdict and one connect error, as a recorder sees them.

#![cfg(feature = "metrics")]

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use sluice_client::{inline_limits, Cluster, ClusterConfig, Topology};

/// A counter as the recorder saw it: name, labels, value.
type Counted = (String, Vec<(String, String)>, u64);

#[test]
fn a_call_to_a_dead_group_counts_a_call_a_local_verdict_and_an_error() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A port nothing listens on: bound, then released.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let topology = Topology::new().group("a", &addr, None);
            let mut config = ClusterConfig::default();
            config.client.connect_timeout = Duration::from_secs(2);
            let cluster = Cluster::new(&topology, config).unwrap();
            let limits = inline_limits(&["token-bucket:10/s".parse().unwrap()]).unwrap();
            let v = cluster.spend(b"user:1", limits, 1).await.unwrap();
            assert_eq!(v.source, sluice_client::Source::Local);
        });
    });
    let counters: Vec<Counted> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            assert_eq!(key.kind(), MetricKind::Counter);
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            Some((key.key().name().to_owned(), labels, n))
        })
        .collect();
    let get = |name: &str, label: Option<(&str, &str)>| {
        counters
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && label.is_none_or(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|c| c.2)
            .sum::<u64>()
    };
    assert_eq!(get("sluice_client_calls_total", None), 1, "{counters:?}");
    assert_eq!(
        get("sluice_client_verdicts_total", Some(("source", "local"))),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get("sluice_client_verdicts_total", Some(("source", "store"))),
        0
    );
    assert!(
        get("sluice_client_errors_total", Some(("kind", "connect"))) >= 1,
        "{counters:?}"
    );
}
