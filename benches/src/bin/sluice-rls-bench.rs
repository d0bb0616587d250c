//! A load generator for Envoy's rate limit service: `ShouldRateLimit` calls
//! from `--streams` concurrent callers over `--connections` HTTP/2
//! connections, for `--seconds` (or `--requests` in all), each asking about
//! one descriptor `(--descriptor-key, a value drawn from --keys)` in
//! `--domain`, as an Envoy in front of many clients does. Prints one JSON
//! object: calls per second, latency percentiles in microseconds, and the
//! count of OK, OVER_LIMIT and failed calls. `--descriptors N` asks about N
//! descriptors in each call (consecutive values of the draw).
//!
//! With `--groups A,B,... --owned-by A`, the values are the first
//! `--keys` whose descriptor key the group A owns in the ring of those
//! groups (benches/entry.sh: calls only through a key's owner, or only
//! through another node).
//!
//! `sluice-rls-bench --addr 127.0.0.1:8081 --domain bench --streams 50`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;

#[derive(Debug)]
struct Args {
    addr: String,
    domain: String,
    key: String,
    keys: u64,
    streams: usize,
    connections: usize,
    seconds: f64,
    requests: u64,
    groups: Vec<String>,
    owned_by: Option<String>,
    descriptors: usize,
}

fn args() -> Args {
    let mut a = Args {
        addr: "127.0.0.1:8081".into(),
        domain: "bench".into(),
        key: "remote_address".into(),
        keys: 100_000,
        streams: 50,
        connections: 4,
        seconds: 10.0,
        requests: u64::MAX,
        groups: Vec::new(),
        owned_by: None,
        descriptors: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--addr" => a.addr = value(),
            "--domain" => a.domain = value(),
            "--descriptor-key" => a.key = value(),
            "--keys" => a.keys = value().parse().unwrap_or_else(|_| usage("--keys N")),
            "--streams" => a.streams = value().parse().unwrap_or_else(|_| usage("--streams N")),
            "--connections" => {
                a.connections = value().parse().unwrap_or_else(|_| usage("--connections N"))
            }
            "--seconds" => a.seconds = value().parse().unwrap_or_else(|_| usage("--seconds S")),
            "--requests" => a.requests = value().parse().unwrap_or_else(|_| usage("--requests N")),
            "--groups" => a.groups = value().split(',').map(str::to_owned).collect(),
            "--owned-by" => a.owned_by = Some(value()),
            "--descriptors" => {
                a.descriptors = value()
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage("--descriptors N, at least 1"))
            }
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    if a.streams == 0 || a.connections == 0 || a.keys == 0 {
        usage("--streams, --connections and --keys are at least 1");
    }
    if a.owned_by.is_some() == a.groups.is_empty() {
        usage("--owned-by and --groups go together");
    }
    a
}

/// The descriptor values the load draws from: `10.N` for N below `--keys`,
/// or the first `--keys` such values whose key `--owned-by` owns.
fn values(a: &Args) -> Vec<String> {
    let Some(group) = &a.owned_by else {
        return (0..a.keys).map(|i| format!("10.{i}")).collect();
    };
    let ring = sluice_protocol::ring::Ring::new(a.groups.iter().map(String::as_str));
    (0..)
        .map(|i| format!("10.{i}"))
        .filter(|v| {
            let key = sluice_server::rls::descriptor_key(&a.domain, [(a.key.as_str(), v.as_str())]);
            ring.owner(sluice_protocol::routing::key_hash(&key)) == group
        })
        .take(a.keys as usize)
        .collect()
}

fn usage(why: &str) -> ! {
    eprintln!(
        "sluice-rls-bench: {why}\nusage: sluice-rls-bench [--addr HOST:PORT] [--domain D] [--descriptor-key K] [--keys N] [--streams N] [--connections N] [--seconds S] [--requests N] [--descriptors N] [--groups A,B --owned-by A]"
    );
    std::process::exit(2)
}

fn main() {
    let a = Arc::new(args());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(run(a));
}

async fn run(a: Arc<Args>) {
    let mut channels = Vec::new();
    for _ in 0..a.connections {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", a.addr))
            .unwrap_or_else(|e| usage(&format!("--addr: {e}")))
            .tcp_nodelay(true)
            .connect()
            .await
            .unwrap_or_else(|e| {
                eprintln!("sluice-rls-bench: cannot connect to {}: {e}", a.addr);
                std::process::exit(1)
            });
        channels.push(channel);
    }
    let values = Arc::new(values(&a));
    let issued = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(a.seconds);
    let mut tasks = Vec::new();
    for s in 0..a.streams {
        let mut client = RateLimitServiceClient::new(channels[s % channels.len()].clone());
        let (a, issued, values) = (a.clone(), issued.clone(), values.clone());
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let (mut ok, mut over, mut failed) = (0u64, 0u64, 0u64);
            // xorshift, seeded per stream: keys drawn uniformly.
            let mut x =
                0x9E37_79B9_7F4A_7C15u64 ^ (s as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            while Instant::now() < until && issued.fetch_add(1, Ordering::Relaxed) < a.requests {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // --descriptors of them: consecutive values from the draw.
                let descriptors = (0..a.descriptors as u64)
                    .map(|d| RateLimitDescriptor {
                        entries: vec![Entry {
                            key: a.key.clone(),
                            value: values[((x + d) % values.len() as u64) as usize].clone(),
                        }],
                        ..Default::default()
                    })
                    .collect();
                let request = RateLimitRequest {
                    domain: a.domain.clone(),
                    descriptors,
                    hits_addend: 1,
                };
                let sent = Instant::now();
                match client.should_rate_limit(request).await {
                    Ok(r) => {
                        let us = sent.elapsed().as_micros() as u64;
                        hist.record(us.max(1)).expect("in bounds");
                        if r.into_inner().overall_code == 1 {
                            ok += 1;
                        } else {
                            over += 1;
                        }
                    }
                    Err(_) => failed += 1,
                }
            }
            (hist, ok, over, failed)
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (mut ok, mut over, mut failed) = (0u64, 0u64, 0u64);
    for t in tasks {
        let (h, o, v, f) = t.await.expect("a stream task");
        hist.add(h).expect("same bounds");
        ok += o;
        over += v;
        failed += f;
    }
    let secs = start.elapsed().as_secs_f64();
    let out = serde_json::json!({
        "calls": ok + over,
        "seconds": secs,
        "calls_per_s": (ok + over) as f64 / secs,
        "ok": ok,
        "over_limit": over,
        "failed": failed,
        "p50_us": hist.value_at_quantile(0.50),
        "p99_us": hist.value_at_quantile(0.99),
        "p999_us": hist.value_at_quantile(0.999),
        "max_us": hist.max(),
        "streams": a.streams,
        "connections": a.connections,
    });
    println!("{out}");
}
