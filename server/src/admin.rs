//! The admin HTTP listener (`--admin-port`): Prometheus metrics, health,
//! readiness and the node's role, for operators, scrapers and load
//! balancers.
//!
//! It runs on the main runtime (the acceptor's), never on a shard thread.
//! A scrape reads what the shards already publish for STATS (a few relaxed
//! atomics per shard) and the replication state: the hot path does nothing
//! more for it.
//!
//! - `GET /metrics`: the Prometheus text exposition format (version 0.0.4),
//!   written here directly: it is a few lines of text per metric, and
//!   `promtool check metrics` checks it in the tests.
//! - `GET /health`: 200 while the process serves (alive).
//! - `GET /ready`: 200 when this node is worth sending traffic to: a
//!   primary that admits, or a follower streaming from its primary; 503
//!   otherwise (and from the start of a shutdown), with the reason.
//! - `GET /role`: the node's role as JSON (what `sluice role` prints).
//!
//! Its own limits, so that connections to it cannot exhaust the process's
//! file descriptors or hold memory for ever: at most
//! `--admin-connections-max` open (past it a new one is closed at once,
//! and counted), and `--admin-timeout-ms` for each whole request, from the
//! connection's start or its last reply (not renewed by bytes that trickle
//! in: a half-sent request is closed then), and for a blocked write.

use std::fmt::Write as _;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{header, Method, Request, Response, StatusCode};
use sluice_protocol::replication::{ReplState, Role, RoleOk};
use sluice_protocol::{Clock, MonotonicClock};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::node::Node;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// What the endpoints read.
#[derive(Debug)]
pub struct AdminState {
    /// The node.
    pub node: Arc<Node>,
    /// Open client connections (the acceptor's count).
    pub open: Arc<AtomicUsize>,
    /// Connections refused at `--connections-max`.
    pub refused: Arc<AtomicU64>,
    /// Set once a shutdown has begun.
    pub draining: AtomicBool,
    /// The node's clock (for the role's fencing state).
    pub clock: MonotonicClock,
    /// The last snapshot written: when (ns since the Unix epoch; 0 for
    /// none yet), how long it took (µs), buckets and bytes.
    pub snapshot: [AtomicU64; 4],
    /// Snapshots that failed to be written.
    pub snapshot_failures: AtomicU64,
    /// Open admin connections (against `--admin-connections-max`).
    pub admin_open: Arc<AtomicUsize>,
    /// Admin connections closed at once at `--admin-connections-max`.
    pub admin_refused: AtomicU64,
    /// The rate limit port's.
    pub rls: Arc<RlsStats>,
}

/// The rate limit port's counters (`/metrics`; zero without `--rls-port`).
#[derive(Debug, Default)]
pub struct RlsStats {
    /// Connections open.
    pub open: std::sync::atomic::AtomicUsize,
    /// Connections closed at once at `--rls-connections-max`.
    pub refused: std::sync::atomic::AtomicU64,
    /// Connections closed for not authenticating in time or idling.
    pub timed_out: std::sync::atomic::AtomicU64,
    /// Calls refused UNAUTHENTICATED.
    pub unauthenticated: std::sync::atomic::AtomicU64,
    /// Calls ended RESOURCE_EXHAUSTED at `--rls-buffer-bytes-max`.
    pub over_budget: std::sync::atomic::AtomicU64,
    /// Request bytes held now for messages still arriving.
    pub buffered: std::sync::atomic::AtomicUsize,
    /// Calls denied from a shard's published over-limit windows, with no
    /// hop to the shard (`--rls-over-limit-slots`).
    pub over_limit_denied: std::sync::atomic::AtomicU64,
    /// How calls ended, counted by the threads that serve the port, each
    /// in a slot of its own (summed when scraped): every call counts, and
    /// one counter written by every thread would move its cache line
    /// between their cores on every call.
    pub ended: [crossbeam_utils::CachePadded<CallsEnded>; ENDED_SLOTS],
    /// The threads that serve the port, by name, and the connections each
    /// holds (set when the port starts).
    pub serving: std::sync::OnceLock<Arc<[(String, std::sync::atomic::AtomicUsize)]>>,
}

/// Slots of [`RlsStats::ended`]: threads past this many share them.
pub const ENDED_SLOTS: usize = 16;

/// One slot of the rate limit port's call counts.
#[derive(Debug, Default)]
pub struct CallsEnded {
    /// Calls answered, by their overall code: OK, then OVER_LIMIT.
    pub answered: [std::sync::atomic::AtomicU64; 2],
    /// Calls ended with a gRPC error status instead, by its code.
    pub errors: [std::sync::atomic::AtomicU64; 17],
}

impl RlsStats {
    /// This thread's slot of [`RlsStats::ended`].
    pub fn ended_here(&self) -> &CallsEnded {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static SLOT: usize = NEXT.fetch_add(1, Relaxed) % ENDED_SLOTS;
        }
        &self.ended[SLOT.with(|s| *s)]
    }
}

/// gRPC's status codes by number, as its spec names them (the label of
/// `sluice_rls_call_errors_total`; 0, OK, is never an error).
const GRPC_STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// Serves the admin endpoints on `listener` until the runtime stops:
/// HTTP/1.1 on plain hyper, one task a connection.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AdminState>) {
    let mut listener = Capped {
        inner: listener,
        timeout: Duration::from_millis(state.node.config.admin_timeout_ms),
        state: state.clone(),
    };
    loop {
        let (io, _peer) = listener.accept().await;
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = answer(&state, &request);
                std::future::ready(Ok::<_, std::convert::Infallible>(response))
            });
            // Ends with the connection: closed by the client, or by
            // `Timed` at its deadline.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                .await;
        });
    }
}

/// The endpoints: GET (and HEAD) of the four paths; any other method on
/// them is 405, any other path 404.
fn answer<B>(state: &AdminState, request: &Request<B>) -> Response<String> {
    let path = request.uri().path();
    let known = matches!(path, "/metrics" | "/health" | "/ready" | "/role");
    if !known {
        return plain(StatusCode::NOT_FOUND, String::new());
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, String::new());
        let allow = header::HeaderValue::from_static("GET,HEAD");
        response.headers_mut().insert(header::ALLOW, allow);
        return response;
    }
    match path {
        "/metrics" => typed(
            "text/plain; version=0.0.4; charset=utf-8",
            exposition(state),
        ),
        "/health" => plain(StatusCode::OK, "ok\n".to_owned()),
        "/ready" => ready(state),
        _ => role(state),
    }
}

/// A text/plain reply.
fn plain(status: StatusCode, body: String) -> Response<String> {
    let mut response = typed("text/plain; charset=utf-8", body);
    *response.status_mut() = status;
    response
}

/// A 200 of `content_type`.
fn typed(content_type: &'static str, body: String) -> Response<String> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

/// The admin listener with its connection cap.
struct Capped {
    /// The socket.
    inner: tokio::net::TcpListener,
    /// `--admin-timeout-ms`, for each connection's [`Timed`].
    timeout: Duration,
    /// The count of open connections, the cap and the refusals' counter.
    state: Arc<AdminState>,
}

impl Capped {
    /// The next connection under the cap (those past it are closed at
    /// once and counted).
    async fn accept(&mut self) -> (Timed, std::net::SocketAddr) {
        let max = self.state.node.config.admin_connections_max;
        loop {
            let (stream, peer) = match self.inner.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: back off briefly.
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let open = &self.state.admin_open;
            if open.fetch_add(1, Ordering::AcqRel) >= max {
                open.fetch_sub(1, Ordering::AcqRel);
                let refused = self.state.admin_refused.fetch_add(1, Ordering::Relaxed);
                // One line for the first and then one per 1,000, not one
                // per connection of a flood.
                if refused % 1_000 == 0 {
                    tracing::warn!(%peer, admin_connections_max = max, refused = refused + 1, "admin connection closed at once: at --admin-connections-max");
                }
                drop(stream);
                continue;
            }
            let timed = Timed {
                stream,
                deadline: Box::pin(tokio::time::sleep(self.timeout)),
                timeout: self.timeout,
                open: open.clone(),
            };
            return (timed, peer);
        }
    }
}

/// An admin connection with its deadline: a whole request must arrive,
/// and a blocked write of a reply must move, before it; every reply bytes
/// written pushes it `timeout` ahead. Bytes read never do, so a client
/// that trickles a request in is closed as one that sends nothing.
struct Timed {
    /// The socket.
    stream: tokio::net::TcpStream,
    /// When the connection is closed unless a reply is written first.
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// `--admin-timeout-ms`.
    timeout: Duration,
    /// The open connections' count, given back when dropped.
    open: Arc<AtomicUsize>,
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Timed {
    /// `Ready(Err)` once the deadline has passed (and registers for it).
    fn expired(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "admin connection: --admin-timeout-ms passed",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Poll::Ready(e) = self.expired(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                let next = tokio::time::Instant::now() + self.timeout;
                self.deadline.as_mut().reset(next);
                Poll::Ready(Ok(n))
            }
            Poll::Pending => match self.expired(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

fn role_now(state: &AdminState) -> RoleOk {
    state.node.repl.role_ok(state.clock.now_ns())
}

fn ready(state: &AdminState) -> Response<String> {
    let r = role_now(state);
    let serving = match r.role {
        Role::Primary => state.node.repl.admits(state.clock.now_ns()),
        Role::Follower => r.state == ReplState::Streaming,
    };
    let why_not = if state.draining.load(Ordering::Acquire) {
        Some("shutting down".to_owned())
    } else if serving {
        None
    } else {
        Some(format!("{} {}", r.role.name(), r.state.name()))
    };
    match why_not {
        None => plain(StatusCode::OK, "ready\n".to_owned()),
        Some(why) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

fn role(state: &AdminState) -> Response<String> {
    let r = role_now(state);
    let body = serde_json::json!({
        "role": r.role.name(),
        "state": r.state.name(),
        "mode": r.mode.name(),
        "epoch": r.epoch,
        "lag_seconds": r.lag_us as f64 / 1e6,
        "keys_synced": r.keys_synced,
        "stream_bytes": r.stream_bytes,
        "stream_records": r.stream_records,
        "primary": r.primary,
        "follower": r.follower,
    });
    typed("application/json", format!("{body}\n"))
}

/// One metric family: its HELP and TYPE lines, then its samples.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// A time histogram per shard, with buckets 1 µs, 2 µs, ..., 65 ms (see
/// [`crate::shard::frame_time_bucket`]): `counts` and `total_ns` pick the
/// shard's published counts and their sum.
fn time_histogram(
    out: &mut String,
    node: &Node,
    name: &str,
    help: &str,
    counts: impl Fn(&crate::shard::PublishedStats) -> &[AtomicU64],
    total_ns: impl Fn(&crate::shard::PublishedStats) -> &AtomicU64,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (i, p) in node.stats.iter().enumerate() {
        let mut cumulative = 0u64;
        for (b, n) in counts(p).iter().enumerate() {
            cumulative += n.load(Ordering::Relaxed);
            let le = if b + 1 == crate::shard::FRAME_TIME_BUCKETS {
                "+Inf".to_owned()
            } else {
                format!("{}", (1u64 << b) as f64 / 1e6)
            };
            let _ = writeln!(
                out,
                "{name}_bucket{{shard=\"{i}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = total_ns(p).load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{shard=\"{i}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{shard=\"{i}\"}} {cumulative}");
    }
}

/// The rate limit port's families.
fn rls_metrics(out: &mut String, rls: &RlsStats) {
    use std::sync::atomic::Ordering::Relaxed;
    let one = |v: u64| [(String::new(), v.to_string())];
    let families: [(&str, &str, &str, u64); 7] = [
        (
            "sluice_rls_connections_open",
            "gauge",
            "Rate limit service connections open (against --rls-connections-max).",
            rls.open.load(Relaxed) as u64,
        ),
        (
            "sluice_rls_connections_refused_total",
            "counter",
            "Rate limit service connections closed at once at --rls-connections-max.",
            rls.refused.load(Relaxed),
        ),
        (
            "sluice_rls_connections_timed_out_total",
            "counter",
            "Rate limit service connections closed for making no call with the token within --auth-timeout-ms, or idling past --idle-timeout-ms.",
            rls.timed_out.load(Relaxed),
        ),
        (
            "sluice_rls_unauthenticated_total",
            "counter",
            "Rate limit calls refused UNAUTHENTICATED (no token, a wrong one, or from a blocked address).",
            rls.unauthenticated.load(Relaxed),
        ),
        (
            "sluice_rls_buffer_refused_total",
            "counter",
            "Rate limit calls ended RESOURCE_EXHAUSTED at --rls-buffer-bytes-max.",
            rls.over_budget.load(Relaxed),
        ),
        (
            "sluice_rls_buffered_bytes",
            "gauge",
            "Bytes of rate limit request messages still arriving, held now.",
            rls.buffered.load(Relaxed) as u64,
        ),
        (
            "sluice_rls_over_limit_denied_total",
            "counter",
            "Rate limit calls denied from a shard's published over-limit windows, with no hop to the shard (--rls-over-limit-slots).",
            rls.over_limit_denied.load(Relaxed),
        ),
    ];
    for (name, kind, help, v) in families {
        family(out, name, kind, help, &one(v));
    }
    let sum = |count: &dyn Fn(&CallsEnded) -> u64| -> String {
        rls.ended
            .iter()
            .map(|slot| count(slot))
            .sum::<u64>()
            .to_string()
    };
    let answered = [("ok", 0), ("over_limit", 1)].map(|(code, i)| {
        (
            format!("code=\"{code}\""),
            sum(&|c| c.answered[i].load(Relaxed)),
        )
    });
    family(
        out,
        "sluice_rls_calls_total",
        "counter",
        "Rate limit calls answered, by their overall code.",
        &answered,
    );
    let errors: Vec<(String, String)> = (1..GRPC_STATUS_NAMES.len())
        .map(|code| {
            let name = GRPC_STATUS_NAMES[code];
            (
                format!("status=\"{name}\""),
                sum(&|c| c.errors[code].load(Relaxed)),
            )
        })
        .collect();
    family(
        out,
        "sluice_rls_call_errors_total",
        "counter",
        "Rate limit calls ended with a gRPC error status instead of an answer (Envoy's failure_mode_deny decides them), by status.",
        &errors,
    );
    rls_thread_connections(out, rls);
}

/// `sluice_rls_thread_connections`: the connections each thread serving
/// the rate limit port holds.
fn rls_thread_connections(out: &mut String, rls: &RlsStats) {
    use std::sync::atomic::Ordering::Relaxed;
    let held: Vec<(String, String)> = rls
        .serving
        .get()
        .map(|serving| {
            serving
                .iter()
                .map(|(name, n)| (format!("thread=\"{name}\""), n.load(Relaxed).to_string()))
                .collect()
        })
        .unwrap_or_default();
    family(
        out,
        "sluice_rls_thread_connections",
        "gauge",
        "Rate limit service connections each serving thread holds (a new one goes to the thread holding fewest).",
        &held,
    );
}

/// Requests this node forwarded to each group's primary (`--cluster`), as
/// samples of `sluice_forwarded_requests_total`.
fn forwarded_to_groups(forward: &crate::forward::Forwarder) -> Vec<(String, String)> {
    let groups = forward.stats.groups.lock().expect("not poisoned");
    groups
        .iter()
        .map(|(g, c)| (format!("group=\"{g}\""), c.forwarded.to_string()))
        .collect()
}

/// An entry point's forwarding (`--cluster`): batches, round trips, and
/// errors by kind (its requests by group are written with the per-shard
/// ones: [`forwarded_to_groups`]).
fn forward_metrics(out: &mut String, forward: &crate::forward::Forwarder) {
    let s = &forward.stats;
    family(
        out,
        "sluice_forward_batches_total",
        "counter",
        "Batches of forwarded requests: each what one thread forwarded to one owner group in one turn of its loop, for all its connections (a read that spans groups goes alone); sluice_forwarded_requests_total over this: requests a batch.",
        &[(String::new(), s.batches.load(Ordering::Relaxed).to_string())],
    );
    let name = "sluice_forward_seconds";
    let _ = writeln!(out, "# HELP {name} Round trips of forwarded requests, from the forwarder's send to the owner's answer (or the error).");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0u64;
    for (b, n) in s.rtt.iter().enumerate() {
        cumulative += n.load(Ordering::Relaxed);
        let le = if b + 1 == crate::forward::RTT_BUCKETS {
            "+Inf".to_owned()
        } else {
            format!("{}", (1u64 << b) as f64 / 1e6)
        };
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let sum = s.rtt_ns_sum.load(Ordering::Relaxed) as f64 / 1e9;
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {cumulative}");
    let mut errors: Vec<(String, String)> = crate::forward::ERROR_KINDS
        .iter()
        .zip(s.errors.iter())
        .map(|(kind, n)| {
            (
                format!("kind=\"{kind}\""),
                n.load(Ordering::Relaxed).to_string(),
            )
        })
        .collect();
    errors.push((
        "kind=\"layout_mismatch\"".to_owned(),
        s.layout_mismatches.load(Ordering::Relaxed).to_string(),
    ));
    errors.push((
        "kind=\"wrong_group\"".to_owned(),
        s.wrong_group.load(Ordering::Relaxed).to_string(),
    ));
    family(
        out,
        "sluice_forward_errors_total",
        "counter",
        "Forwarding errors by kind: unavailable (no primary of the group answered; not applied), outcome_unknown (sent, no answer in time), refused (the owner answered an error), other; layout_mismatch and wrong_group count what this node refused of other nodes' forwards.",
        &errors,
    );
    family(
        out,
        "sluice_cluster_layout",
        "gauge",
        "The cluster layout this node forwards with (the hash in a label; always 1).",
        &[(
            format!(
                "layout=\"{:016x}\",group=\"{}\"",
                forward.layout_hash(),
                forward.group()
            ),
            "1".to_owned(),
        )],
    );
}

/// The whole scrape: every family, in the order scrapers and the tests
/// have always seen them.
pub fn exposition(state: &AdminState) -> String {
    let node = &state.node;
    let keys_max = node.config.keys_max as u64;
    let shards: Vec<_> = node.stats.iter().map(|s| s.read(keys_max)).collect();
    let mut out = String::with_capacity(4096);
    decision_metrics(&mut out, node, &shards);
    shard_traffic_metrics(&mut out, node);
    error_metrics(&mut out, node);
    bucket_metrics(&mut out, &shards, keys_max);
    connection_metrics(&mut out, state);
    if node.config.rls_port.is_some() {
        rls_metrics(&mut out, &state.rls);
    }
    replication_metrics(&mut out, state);
    if node.config.snapshot_dir.is_some() {
        snapshot_metrics(&mut out, state);
    }
    if let Some(forward) = &node.forward {
        forward_metrics(&mut out, forward);
    }
    process_metrics(&mut out, node);
    out
}

/// The one sample of a family without labels.
fn unlabelled(value: impl ToString) -> [(String, String); 1] {
    [(String::new(), value.to_string())]
}

/// One sample per shard, labelled `shard="i"`, of a counter or gauge the
/// shard publishes.
fn per_shard_published(
    node: &Node,
    f: impl Fn(&crate::shard::PublishedStats) -> &AtomicU64,
) -> Vec<(String, String)> {
    node.stats
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                format!("shard=\"{i}\""),
                f(p).load(Ordering::Relaxed).to_string(),
            )
        })
        .collect()
}

/// Spend decisions by shard and result, and verdicts by limit kind.
fn decision_metrics(
    out: &mut String,
    node: &Node,
    shards: &[sluice_protocol::message::ShardStats],
) {
    let mut decisions = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        decisions.push((
            format!("shard=\"{i}\",result=\"allowed\""),
            s.allowed_total.to_string(),
        ));
        decisions.push((
            format!("shard=\"{i}\",result=\"denied\""),
            s.denied_total.to_string(),
        ));
    }
    family(
        out,
        "sluice_decisions_total",
        "counter",
        "Spend decisions since the process started, by shard and result.",
        &decisions,
    );
    let mut by_kind = Vec::new();
    for (i, p) in node.stats.iter().enumerate() {
        for (kind, counts) in sluice_protocol::limit::Kind::ALL.iter().zip(&p.by_kind) {
            for (result, n) in ["denied", "allowed"].iter().zip(counts) {
                by_kind.push((
                    format!("shard=\"{i}\",kind=\"{}\",result=\"{result}\"", kind.name()),
                    n.load(Ordering::Relaxed).to_string(),
                ));
            }
        }
    }
    family(
        out,
        "sluice_limit_verdicts_total",
        "counter",
        "Spend verdicts by shard, limit kind and result (a composite counts one per limit).",
        &by_kind,
    );
}

/// Each shard's bytes, frame and batch times, forwarded requests, owed
/// replies, and its replication acks and full syncs.
fn shard_traffic_metrics(out: &mut String, node: &Node) {
    family(
        out,
        "sluice_received_bytes_total",
        "counter",
        "Bytes read from client connections (both protocols).",
        &per_shard_published(node, |p| &p.bytes_in),
    );
    family(
        out,
        "sluice_sent_bytes_total",
        "counter",
        "Bytes written to client connections (both protocols).",
        &per_shard_published(node, |p| &p.bytes_out),
    );
    // Whole-frame time on the connection's shard, and the owner shard's
    // time to decide a batch forwarded to it.
    time_histogram(
        out,
        node,
        "sluice_frame_handling_seconds",
        "Time a shard took to handle one frame of requests (decide or forward each, encode the replies).",
        |p| &p.frame_time,
        |p| &p.frame_ns_total,
    );
    time_histogram(
        out,
        node,
        "sluice_forwarded_batch_seconds",
        "Time a shard took to decide one batch of requests forwarded to it by another shard.",
        |p| &p.batch_time,
        |p| &p.batch_ns_total,
    );
    // One family for both kinds of forward (a second HELP for the same
    // name is an exposition promtool, and Prometheus, refuse).
    let mut forwarded = per_shard_published(node, |p| &p.forwarded_total);
    if let Some(forward) = &node.forward {
        forwarded.extend(forwarded_to_groups(forward));
    }
    family(
        out,
        "sluice_forwarded_requests_total",
        "counter",
        "Requests forwarded: by shard, those a shard decided for connections on other shards of this node (the key was its own); by group (--cluster), those this node forwarded to the primary of the group that owns their key.",
        &forwarded,
    );
    family(
        out,
        "sluice_reply_bytes_owed",
        "gauge",
        "Bytes of replies the shard's connections owe (not yet written); each shard holds at most its part of --reply-bytes-node-max.",
        &per_shard_published(node, |p| &p.reply_bytes_owed),
    );
    time_histogram(
        out,
        node,
        "sluice_replication_ack_seconds",
        "Primary: time from a drain's SYNC written to the follower's ACK covering it (the replication link's round trip; a sync reply waits it on top of its decision).",
        |p| &p.ack_time,
        |p| &p.ack_ns_total,
    );
    family(
        out,
        "sluice_replication_full_syncs_total",
        "counter",
        "Full syncs a shard completed to a follower (one per shard each time a follower subscribes).",
        &per_shard_published(node, |p| &p.full_syncs_total),
    );
}

/// ERROR replies by status code, every shard together.
fn error_metrics(out: &mut String, node: &Node) {
    let mut errors = Vec::new();
    for status in sluice_protocol::Status::ALL {
        let code = usize::from(status.code()).min(crate::shard::ERROR_CODES - 1);
        let n: u64 = node
            .stats
            .iter()
            .map(|p| p.errors[code].load(Ordering::Relaxed))
            .sum();
        errors.push((
            format!("code=\"{}\",text=\"{}\"", status.code(), status.text()),
            n.to_string(),
        ));
    }
    family(
        out,
        "sluice_errors_total",
        "counter",
        "ERROR replies sent (protocol v1), by code.",
        &errors,
    );
}

/// Each shard's buckets, their memory, evictions and refusals at the cap,
/// and the cap itself.
fn bucket_metrics(
    out: &mut String,
    shards: &[sluice_protocol::message::ShardStats],
    keys_max: u64,
) {
    let per_shard = |f: fn(&sluice_protocol::message::ShardStats) -> u64| -> Vec<(String, String)> {
        shards
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("shard=\"{i}\""), f(s).to_string()))
            .collect()
    };
    family(
        out,
        "sluice_buckets",
        "gauge",
        "Buckets the shard holds now, every kind together.",
        &per_shard(|s| s.buckets),
    );
    family(
        out,
        "sluice_bucket_bytes",
        "gauge",
        "Bytes of memory the shard's bucket tables hold.",
        &per_shard(|s| s.bucket_bytes),
    );
    family(
        out,
        "sluice_evictions_total",
        "counter",
        "Full buckets dropped to stay under --keys-max.",
        &per_shard(|s| s.evicted_total),
    );
    family(
        out,
        "sluice_keys_full_total",
        "counter",
        "Requests refused with KEYS_FULL (a new bucket at the cap, none full to drop).",
        &per_shard(|s| s.refused_total),
    );
    family(
        out,
        "sluice_keys_max",
        "gauge",
        "The per-shard bucket cap (--keys-max; 0 = none).",
        &unlabelled(keys_max),
    );
}

/// Client connections open and refused, failed authentications, and
/// admin connections refused.
fn connection_metrics(out: &mut String, state: &AdminState) {
    family(
        out,
        "sluice_connections_open",
        "gauge",
        "Client connections open, both listeners together.",
        &unlabelled(state.open.load(Ordering::Relaxed)),
    );
    family(
        out,
        "sluice_connections_refused_total",
        "counter",
        "Connections refused at --connections-max.",
        &unlabelled(state.refused.load(Ordering::Relaxed)),
    );
    family(
        out,
        "sluice_auth_failures_total",
        "counter",
        "Failed authentications (binary HELLO, RESP AUTH / HELLO AUTH, rate limit calls with a wrong token), attempts refused from a blocked address included.",
        &unlabelled(state.node.auth_failures.total.load(Ordering::Relaxed)),
    );
    family(
        out,
        "sluice_admin_connections_refused_total",
        "counter",
        "Admin connections closed at once at --admin-connections-max.",
        &unlabelled(state.admin_refused.load(Ordering::Relaxed)),
    );
}

/// The node's replication role, state and epoch, its lag, and the
/// stream's bytes, records and syncs.
fn replication_metrics(out: &mut String, state: &AdminState) {
    let r = role_now(state);
    let roles = [Role::Primary, Role::Follower].map(|role| {
        (
            format!("role=\"{}\"", role.name()),
            u8::from(r.role == role).to_string(),
        )
    });
    family(
        out,
        "sluice_replication_role",
        "gauge",
        "1 for the node's replication role.",
        &roles,
    );
    let states = [
        ReplState::Alone,
        ReplState::Syncing,
        ReplState::Streaming,
        ReplState::Down,
        ReplState::Fenced,
    ]
    .map(|st| {
        (
            format!("state=\"{}\"", st.name()),
            u8::from(r.state == st).to_string(),
        )
    });
    family(
        out,
        "sluice_replication_state",
        "gauge",
        "1 for the node's replication state.",
        &states,
    );
    family(
        out,
        "sluice_replication_epoch",
        "gauge",
        "The node's replication epoch.",
        &unlabelled(r.epoch),
    );
    family(
        out,
        "sluice_replication_lag_seconds",
        "gauge",
        "How far the follower is behind (a follower's own view; a primary's of its follower).",
        &unlabelled(r.lag_us as f64 / 1e6),
    );
    family(
        out,
        "sluice_replication_stream_bytes_total",
        "counter",
        "Bytes of replication stream sent (primary) or received (follower).",
        &unlabelled(r.stream_bytes),
    );
    family(
        out,
        "sluice_replication_stream_records_total",
        "counter",
        "Bucket records of replication stream sent (primary) or received (follower).",
        &unlabelled(r.stream_records),
    );
    family(
        out,
        "sluice_replication_stream_syncs_total",
        "counter",
        "SYNC messages of replication stream sent (primary) or received (follower): records / syncs is the records a drain carries.",
        &unlabelled(state.node.repl.stream_syncs.load(Ordering::Relaxed)),
    );
}

/// The last snapshot's age, duration, buckets and bytes, and the failures
/// (with `--snapshot-dir`).
fn snapshot_metrics(out: &mut String, state: &AdminState) {
    let node = &state.node;
    let [written_ns, took_us, buckets, bytes] =
        state.snapshot.each_ref().map(|a| a.load(Ordering::Relaxed));
    let age = if written_ns == 0 {
        // None yet: as old as the process.
        node.started.elapsed().as_secs_f64()
    } else {
        state.clock.now_ns().saturating_sub(written_ns) as f64 / 1e9
    };
    family(
        out,
        "sluice_snapshot_age_seconds",
        "gauge",
        "Seconds since the last snapshot was written (since the start, before the first).",
        &unlabelled(format!("{age:.3}")),
    );
    family(
        out,
        "sluice_snapshot_duration_seconds",
        "gauge",
        "How long the last snapshot took, from asking the shards to the file's fsync.",
        &unlabelled(took_us as f64 / 1e6),
    );
    family(
        out,
        "sluice_snapshot_buckets",
        "gauge",
        "Buckets in the last snapshot.",
        &unlabelled(buckets),
    );
    family(
        out,
        "sluice_snapshot_bytes",
        "gauge",
        "Size of the last snapshot file.",
        &unlabelled(bytes),
    );
    family(
        out,
        "sluice_snapshot_failures_total",
        "counter",
        "Snapshots that could not be written.",
        &unlabelled(state.snapshot_failures.load(Ordering::Relaxed)),
    );
}

/// The process's uptime and the node's identity.
fn process_metrics(out: &mut String, node: &Node) {
    family(
        out,
        "sluice_uptime_seconds",
        "gauge",
        "Seconds since the process started.",
        &unlabelled(format!("{:.3}", node.started.elapsed().as_secs_f64())),
    );
    family(
        out,
        "sluice_info",
        "gauge",
        "The node's version, shard count and identity (always 1).",
        &[(
            format!(
                "version=\"{}\",shards=\"{}\",node_id=\"{:016x}\"",
                env!("CARGO_PKG_VERSION"),
                node.shard_count,
                node.node_id
            ),
            "1".to_owned(),
        )],
    );
}
