//! The cluster client's counters reach the `metrics` facade (feature
//! `metrics`): a call to a group that cannot answer is one call, one local
//! verdict and one connect error, as a recorder sees them; a request the
//! load shedder refuses is one shed of its class.

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

/// A request the load shedder refuses is `sluice_client_shed_total` with
/// its class; one it lets through is not counted there.
#[cfg(feature = "tower")]
#[test]
fn a_shed_request_counts_by_class() {
    use sluice_client::shed::{priority_header, LoadShedLayer, ShedConfig, Thresholds};
    use tower_layer::Layer;
    use tower_service::Service;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let none = Thresholds {
        in_flight: 0,
        queue_delay: Duration::ZERO,
    };
    let config = ShedConfig {
        low: none,
        normal: none,
        critical: None,
        retry_after: Duration::from_secs(1),
    };
    let layer = LoadShedLayer::new(config)
        .unwrap()
        .priority_fn(priority_header(http::HeaderName::from_static("x-priority")));
    let mut service = layer.layer(Ok200);
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            for class in ["low", "low", "normal", "critical"] {
                let request = http::Request::builder()
                    .header("x-priority", class)
                    .body(())
                    .unwrap();
                let status = service.call(request).await.unwrap().status();
                assert_eq!(status == 503, class != "critical", "{class}");
            }
        });
    });
    let shed: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "sluice_client_shed_total")
        .map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                panic!("a counter")
            };
            let class = key.key().labels().next().unwrap().value().to_owned();
            (class, n)
        })
        .collect();
    let count = |c: &str| {
        shed.iter()
            .filter(|(k, _)| k == c)
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    assert_eq!(
        (count("low"), count("normal"), count("critical")),
        (2, 1, 0),
        "{shed:?}"
    );
}

/// An inner service that answers 200 at once.
#[cfg(feature = "tower")]
#[derive(Clone)]
struct Ok200;

#[cfg(feature = "tower")]
impl tower_service::Service<http::Request<()>> for Ok200 {
    type Response = http::Response<()>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<http::Response<()>, std::convert::Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(())))
    }
}
