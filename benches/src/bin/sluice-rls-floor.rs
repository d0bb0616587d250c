//! The rate limit service's floor: tonic with Envoy's types (envoy-types),
//! `ShouldRateLimit` answered OK at once with one OK status per
//! descriptor, served exactly as `sluiced --rls-port` serves it: `--threads`
//! threads, each a single-threaded tokio runtime, each connection handed
//! by one acceptor to the threads in turn, the same HTTP/2 settings
//! (streams, windows, header list size).
//! No rules, no decision, no shard, no auth: what it leaves out is what
//! Sluice's ratio to it measures (benches/rls.sh, issue 39).
//!
//! `--stack h2` serves the same answers on HTTP/2 directly (the h2 crate,
//! no hyper, no tonic; a connection's calls run inside its task): what
//! the gRPC stack itself costs, measured (benches/notes.md, issue 39).
//!
//! Usage: `sluice-rls-floor [--port N] [--threads N] [--stack tonic|h2]`
//! (0, the default for `--port`, picks a free one); prints
//! `sluice-rls-floor listening on ADDR`, and serves until killed.

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
    eprintln!(
        "sluice-rls-floor: {why}\nusage: sluice-rls-floor [--port N] [--threads N] [--stack tonic|h2]"
    );
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

/// One call on HTTP/2 directly: the request's message read whole, decoded,
/// and answered OK with a status per descriptor.
async fn h2_call(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
) -> Result<(), h2::Error> {
    use prost::Message;
    let mut body = request.into_body();
    let mut message = bytes::BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
    }
    let n = if message.len() >= 5 {
        RateLimitRequest::decode(&message[5..]).map_or(0, |r| r.descriptors.len())
    } else {
        0
    };
    let ok = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    let reply = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![ok; n],
        ..Default::default()
    };
    let len = reply.encoded_len();
    let mut out = bytes::BytesMut::with_capacity(5 + len);
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    reply.encode(&mut out).expect("capacity reserved");
    let response = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("a response");
    let mut send = respond.send_response(response, false)?;
    send.send_data(out.freeze(), false)?;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    send.send_trailers(trailers)
}

/// Serves the connections handed over on `handed` on HTTP/2 directly (h2,
/// no hyper, no tonic).
async fn h2_serve(mut handed: Handed) {
    while let Some(socket) = handed.recv().await {
        let Ok(socket) = tokio::net::TcpStream::from_std(socket) else {
            continue;
        };
        tokio::spawn(async move {
            let mut builder = h2::server::Builder::new();
            builder
                .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
                .initial_window_size(STREAM_WINDOW_BYTES)
                .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                .max_header_list_size(HEADER_LIST_BYTES_MAX);
            let Ok(mut conn) = builder.handshake::<_, bytes::Bytes>(socket).await else {
                return;
            };
            // The connection's calls run inside its task: no spawn a call.
            let mut calls = futures_util::stream::FuturesUnordered::new();
            let mut open = true;
            std::future::poll_fn(|cx| {
                use futures_util::Stream;
                use std::task::Poll;
                loop {
                    // Accepting also drives the connection: it writes what
                    // the calls queued and reads what arrived.
                    let mut accepted = false;
                    while open {
                        match conn.poll_accept(cx) {
                            Poll::Ready(Some(Ok((request, respond)))) => {
                                calls.push(h2_call(request, respond));
                                accepted = true;
                            }
                            Poll::Ready(_) => open = false,
                            Poll::Pending => break,
                        }
                    }
                    let mut finished = false;
                    while let Poll::Ready(Some(_)) = std::pin::Pin::new(&mut calls).poll_next(cx) {
                        finished = true;
                    }
                    if !open && calls.is_empty() {
                        return Poll::Ready(());
                    }
                    if !accepted && !finished {
                        return Poll::Pending;
                    }
                }
            })
            .await;
        });
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut port, mut threads) = (0u16, 1u16);
    let mut h2 = false;
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
            ("--stack", Some(s)) if s == "h2" || s == "tonic" => h2 = s == "h2",
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let listener = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap_or_else(|e| usage(&format!("cannot listen on port {port}: {e}")));
    println!(
        "sluice-rls-floor listening on {}",
        listener.local_addr().expect("a bound address")
    );
    let mut handles = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..threads {
        let (hand, handed) = tokio::sync::mpsc::unbounded_channel();
        servers.push(hand);
        handles.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                if h2 {
                    return h2_serve(handed).await;
                }
                let incoming = futures_util::stream::unfold(handed, |mut handed| async move {
                    let socket = handed.recv().await?;
                    Some((tokio::net::TcpStream::from_std(socket), handed))
                });
                let service =
                    RateLimitServiceServer::new(Floor).max_decoding_message_size(MESSAGE_BYTES_MAX);
                let served = tonic::transport::Server::builder()
                    .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
                    .initial_stream_window_size(STREAM_WINDOW_BYTES)
                    .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                    .http2_max_header_list_size(HEADER_LIST_BYTES_MAX)
                    .add_service(service)
                    .serve_with_incoming(incoming)
                    .await;
                if let Err(e) = served {
                    eprintln!("sluice-rls-floor: {e}");
                }
            })
        }));
    }
    // As sluiced's port: one acceptor hands each connection to the
    // threads in turn (each thread accepting from the one socket left
    // the first awake with every connection of a burst).
    for (socket, turn) in listener.incoming().zip((0..servers.len()).cycle()) {
        let Ok(socket) = socket else { continue };
        let _ = socket.set_nodelay(true);
        socket.set_nonblocking(true).expect("non-blocking");
        let _ = servers[turn].send(socket);
    }
    drop(servers);
    for h in handles {
        let _ = h.join();
    }
}

/// The connections handed to one serving thread.
type Handed = tokio::sync::mpsc::UnboundedReceiver<std::net::TcpStream>;
