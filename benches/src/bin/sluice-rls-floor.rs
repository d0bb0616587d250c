//! The rate limit service's floor: tonic with Envoy's types (envoy-types),
//! `ShouldRateLimit` answered OK at once with one OK status per
//! descriptor, served exactly as `sluiced --rls-port` serves it: `--threads`
//! threads, each a single-threaded tokio runtime accepting from the one
//! socket, the same HTTP/2 settings (streams, windows, header list size).
//! No rules, no decision, no shard, no auth: what it leaves out is what
//! Sluice's ratio to it measures (benches/rls.sh, issue 39).
//!
//! Usage: `sluice-rls-floor [--port N] [--threads N]` (0, the default for
//! `--port`, picks a free one); prints `sluice-rls-floor listening on
//! ADDR`, and serves until killed.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_server::rls::guard::{
    CONNECTION_WINDOW_BYTES, HEADER_LIST_BYTES_MAX, STREAM_WINDOW_BYTES,
};
use sluice_server::rls::{MESSAGE_BYTES_MAX, STREAMS_PER_CONNECTION_MAX};

fn usage(why: &str) -> ! {
    eprintln!("sluice-rls-floor: {why}\nusage: sluice-rls-floor [--port N] [--threads N]");
    std::process::exit(2)
}

/// Answers every call OK, a status per descriptor.
#[derive(Debug, Default)]
struct Floor;

#[tonic::async_trait]
impl RateLimitService for Floor {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let n = request.get_ref().descriptors.len();
        let ok = DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![ok; n],
            ..Default::default()
        }))
    }
}

/// sluiced's allocator, so that the ratio to this floor is the work's.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut port, mut threads) = (0u16, 1u16);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--port", Some(p)) => port = p.parse().unwrap_or_else(|_| usage("--port N")),
            ("--threads", Some(n)) => {
                threads = n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage("--threads N, at least 1"))
            }
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let listener = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap_or_else(|e| usage(&format!("cannot listen on port {port}: {e}")));
    listener.set_nonblocking(true).expect("non-blocking");
    println!(
        "sluice-rls-floor listening on {}",
        listener.local_addr().expect("a bound address")
    );
    let mut handles = Vec::new();
    for _ in 0..threads {
        let listener = listener.try_clone().expect("a listener clone");
        handles.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let service =
                    RateLimitServiceServer::new(Floor).max_decoding_message_size(MESSAGE_BYTES_MAX);
                let served = tonic::transport::Server::builder()
                    .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
                    .initial_stream_window_size(STREAM_WINDOW_BYTES)
                    .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                    .http2_max_header_list_size(HEADER_LIST_BYTES_MAX)
                    .add_service(service)
                    .serve_with_incoming(
                        tonic::transport::server::TcpIncoming::from(listener)
                            .with_nodelay(Some(true)),
                    )
                    .await;
                if let Err(e) = served {
                    eprintln!("sluice-rls-floor: {e}");
                }
            })
        }));
    }
    for h in handles {
        let _ = h.join();
    }
}
