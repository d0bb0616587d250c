//! What the cluster layer costs per call, next to the single-node client:
//! the same THROTTLE, through `Client` and through a one-group `Cluster`
//! whose group is the same `sluiced` (started here, release build, on a free
//! loopback port), so the difference is the cluster layer (routing, the
//! group's primary lookup, the verdict wrapping). Also the routing alone,
//! in process. Run: `cargo bench -p sluice-benches --bench cluster`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use sluice_client::{
    inline_limits, Client, ClientConfig, Cluster, ClusterConfig, Limit, Policy, Topology,
};

/// A release `sluiced` on a free port, killed when dropped.
struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn server() -> Server {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "sluice-server",
            "--bin",
            "sluiced",
        ])
        .current_dir(root)
        .status()
        .expect("cargo runs");
    assert!(status.success());
    let mut child = Command::new(format!("{root}/target/release/sluiced"))
        .args(["--port", "0", "--shards", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluiced starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .nth(3)
        .expect("listening line")
        .to_owned();
    Server(child, addr)
}

fn bench(c: &mut Criterion) {
    let server = server();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ClientConfig {
        deadline: Duration::from_secs(1),
        ..ClientConfig::default()
    };
    let client = rt
        .block_on(Client::connect_with(server.1.as_str(), config.clone()))
        .unwrap();
    let topology = Topology::new().group("a", &server.1, None);
    let cluster = Cluster::new(
        &topology,
        ClusterConfig {
            client: config,
            ..ClusterConfig::default()
        },
    )
    .unwrap();
    let policy = Policy::new(1_000_000, 1_000_000_000, 1_000_000).unwrap();
    let limits = inline_limits(&[Limit::TokenBucket(policy)]).unwrap();
    // The same DECIDE (one inline token bucket) both ways.
    let mut g = c.benchmark_group("per_call");
    g.bench_function("cluster_spend", |b| {
        b.iter(|| rt.block_on(cluster.spend(b"bench:key", limits, 1)).unwrap())
    });
    g.bench_function("client_spend", |b| {
        b.iter(|| rt.block_on(client.spend(b"bench:key", limits, 1)).unwrap())
    });
    g.finish();
    // The cluster's own work around a call, without the call.
    c.bench_function("cluster_locate_known_primary", |b| {
        b.iter(|| rt.block_on(cluster.locate(std::hint::black_box(b"bench:key"))))
    });
    let ten = (0..10).fold(Topology::new(), |t, i| {
        t.group(&format!("g{i}"), "127.0.0.1:1", None)
    });
    let ten = Cluster::new(&ten, ClusterConfig::default()).unwrap();
    c.bench_function("cluster_route_10_groups", |b| {
        b.iter(|| ten.route(std::hint::black_box(b"user:42")))
    });
    drop(server);
}

criterion_group!(benches, bench);
criterion_main!(benches);
