//! An HTTP gateway in front of `GET /hello`, limited per API key through a
//! real `sluiced` with [`RateLimitLayer`] (feature `tower`).
//!
//! ```sh
//! cargo run -p sluice-client --example gateway --features tower -- \
//!     --limit token-bucket:5/m --headers ietf
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:8080/hello
//! ```
//!
//! Flags: `--listen ADDR` (127.0.0.1:8080), `--store ADDR` (127.0.0.1:7700)
//! or `--cluster FILE` (a cluster of shard groups),
//! `--limit SPEC` (token-bucket:5/m; repeat it for a composite; reserves
//! such as `,reserve=critical:20%` allowed), `--header NAME` (x-api-key),
//! `--headers ietf|legacy` (ietf), `--on-error open|closed` (open),
//! `--deadline-ms MS` (100: the store call's deadline), `--priority-header
//! NAME` (each request's class, `critical`, `normal` or `low`; none: all
//! normal), `--shed LOW,NORMAL` (the gateway's own load shedder: shed low
//! requests from LOW in flight, normal ones from NORMAL, critical never;
//! off by default), `--slow-ms MS` (how long `GET /slow` takes: 500).
//! A request without the key header gets 401. Prints `gateway listening on
//! ADDR` once it accepts.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use sluice_client::shed::{priority_header, LoadShedLayer, ShedConfig};
use sluice_client::tower::{header_key, HeaderStyle, OnError, Plan, RateLimitLayer};
use sluice_client::{Client, ClientConfig, Cluster, ClusterConfig, Reserved, Topology};

/// What the flags say.
#[derive(Debug)]
struct Flags {
    /// Where the gateway listens.
    listen: String,
    /// The `sluiced` it asks.
    store: String,
    /// The limits of every key, with their reserves.
    limits: Vec<Reserved>,
    /// The header that holds the key.
    header: http::HeaderName,
    /// Which RateLimit headers to send.
    headers: HeaderStyle,
    /// What a store error does.
    on_error: OnError,
    /// The deadline of each store call.
    deadline: Duration,
    /// A cluster file: decide through the cluster client (routing by the
    /// key, failover, local fallback) instead of one node.
    cluster: Option<std::path::PathBuf>,
    /// The header that holds each request's class.
    priority_header: Option<http::HeaderName>,
    /// The load shedder's in-flight thresholds for low and normal.
    shed: Option<(usize, usize)>,
    /// How long `GET /slow` takes.
    slow: Duration,
}

const USAGE: &str =
    "usage: gateway [--listen ADDR] [--store ADDR | --cluster FILE] [--limit SPEC]... \
                     [--header NAME] [--headers ietf|legacy] [--on-error open|closed] \
                     [--deadline-ms MS] [--priority-header NAME] [--shed LOW,NORMAL] \
                     [--slow-ms MS]";

fn parse(mut args: impl Iterator<Item = String>) -> Result<Flags, String> {
    let mut flags = Flags {
        listen: "127.0.0.1:8080".into(),
        store: "127.0.0.1:7700".into(),
        cluster: None,
        limits: Vec::new(),
        header: http::HeaderName::from_static("x-api-key"),
        headers: HeaderStyle::Ietf,
        on_error: OnError::FailOpen,
        deadline: Duration::from_millis(100),
        priority_header: None,
        shed: None,
        slow: Duration::from_millis(500),
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => flags.listen = value,
            "--store" => flags.store = value,
            "--cluster" => flags.cluster = Some(value.into()),
            "--limit" => flags
                .limits
                .push(value.parse().map_err(|e| format!("--limit {value}: {e}"))?),
            "--header" => {
                flags.header = value
                    .parse()
                    .map_err(|e| format!("--header {value}: {e}"))?
            }
            "--headers" => {
                flags.headers = match value.as_str() {
                    "ietf" => HeaderStyle::Ietf,
                    "legacy" => HeaderStyle::Legacy,
                    _ => return Err(format!("--headers is ietf or legacy, not {value}")),
                }
            }
            "--on-error" => {
                flags.on_error = match value.as_str() {
                    "open" => OnError::FailOpen,
                    "closed" => OnError::FailClosed,
                    _ => return Err(format!("--on-error is open or closed, not {value}")),
                }
            }
            "--deadline-ms" => {
                let ms = value
                    .parse()
                    .map_err(|e| format!("--deadline-ms {value}: {e}"))?;
                flags.deadline = Duration::from_millis(ms);
            }
            "--priority-header" => {
                let name = value
                    .parse()
                    .map_err(|e| format!("--priority-header {value}: {e}"))?;
                flags.priority_header = Some(name);
            }
            "--shed" => {
                let bad = || format!("--shed is LOW,NORMAL (requests in flight), not {value}");
                let (low, normal) = value.split_once(',').ok_or_else(bad)?;
                let low = low.parse().map_err(|_| bad())?;
                let normal = normal.parse().map_err(|_| bad())?;
                flags.shed = Some((low, normal));
            }
            "--slow-ms" => {
                let ms = value
                    .parse()
                    .map_err(|e| format!("--slow-ms {value}: {e}"))?;
                flags.slow = Duration::from_millis(ms);
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    if flags.limits.is_empty() {
        flags
            .limits
            .push("token-bucket:5/m".parse().expect("a valid spec"));
    }
    Ok(flags)
}

async fn hello() -> &'static str {
    "hello\n"
}

/// A backend call that takes a while.
async fn slow(delay: Duration) -> &'static str {
    tokio::time::sleep(delay).await;
    "slow\n"
}

async fn run(flags: Flags) -> Result<(), String> {
    let config = ClientConfig {
        deadline: flags.deadline,
        ..ClientConfig::default()
    };
    let limiter: Arc<dyn sluice_client::tower::Limiter> = match &flags.cluster {
        Some(path) => {
            let topology = Topology::load(path).map_err(|e| e.to_string())?;
            let config = ClusterConfig {
                client: config,
                ..ClusterConfig::default()
            };
            Arc::new(Cluster::new(&topology, config).map_err(|e| e.to_string())?)
        }
        None => Arc::new(
            Client::connect_with(&flags.store, config)
                .await
                .map_err(|e| format!("connecting to {}: {e}", flags.store))?,
        ),
    };
    let plan = Plan::reserved(None, flags.limits).map_err(|e| e.to_string())?;
    let mut layer = RateLimitLayer::new(limiter, header_key(flags.header), plan)
        .headers(flags.headers)
        .on_error(flags.on_error);
    if let Some(name) = &flags.priority_header {
        layer = layer.priority_fn(priority_header(name.clone()));
    }
    let delay = flags.slow;
    let app = Router::new()
        .route("/hello", get(hello))
        .route("/slow", get(move || slow(delay)))
        .route_layer(layer);
    // The shedder goes outside the rate limit: a shed request costs the
    // store nothing.
    let app = match flags.shed {
        None => app,
        Some((low, normal)) => {
            let mut config = ShedConfig::default();
            config.low.in_flight = low;
            config.normal.in_flight = normal;
            let mut shed = LoadShedLayer::new(config).map_err(|e| e.to_string())?;
            if let Some(name) = &flags.priority_header {
                shed = shed.priority_fn(priority_header(name.clone()));
            }
            app.route_layer(shed)
        }
    };
    let listener = tokio::net::TcpListener::bind(&flags.listen)
        .await
        .map_err(|e| format!("listening on {}: {e}", flags.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("gateway listening on {addr}");
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let flags = match parse(std::env::args().skip(1)) {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("gateway: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
