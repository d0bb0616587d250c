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
//! `--limit SPEC` (token-bucket:5/m; repeat it for a composite), `--header
//! NAME` (x-api-key), `--headers ietf|legacy` (ietf), `--on-error
//! open|closed` (open), `--deadline-ms MS` (100: the store call's deadline).
//! A request without the key header gets 401. Prints `gateway listening on
//! ADDR` once it accepts.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use sluice_client::tower::{header_key, HeaderStyle, OnError, Plan, RateLimitLayer};
use sluice_client::{Client, ClientConfig, Cluster, ClusterConfig, Limit, Topology};

/// What the flags say.
#[derive(Debug)]
struct Flags {
    /// Where the gateway listens.
    listen: String,
    /// The `sluiced` it asks.
    store: String,
    /// The limits of every key.
    limits: Vec<Limit>,
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
}

const USAGE: &str =
    "usage: gateway [--listen ADDR] [--store ADDR | --cluster FILE] [--limit SPEC]... \
                     [--header NAME] [--headers ietf|legacy] [--on-error open|closed] \
                     [--deadline-ms MS]";

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
    let plan = Plan::inline(flags.limits).map_err(|e| e.to_string())?;
    let layer = RateLimitLayer::new(limiter, header_key(flags.header), plan)
        .headers(flags.headers)
        .on_error(flags.on_error);
    let app = Router::new().route("/hello", get(hello)).route_layer(layer);
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
