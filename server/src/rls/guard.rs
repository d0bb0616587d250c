//! The rate limit service's way in, as hard as the binary port's: the
//! token on every call, a cap on connections, a deadline to authenticate,
//! and a node-wide budget of request bytes still arriving.
//!
//! - **Token.** With `--auth-token` (and without
//!   `--rls-allow-unauthenticated`), a call must carry the gRPC metadata
//!   `authorization: Bearer TOKEN` (Envoy's `grpc_service.initial_metadata`
//!   sends it). It is checked on the headers, before a byte of the message
//!   is read: a call without it is UNAUTHENTICATED and its body is never
//!   buffered. Wrong tokens count in the per-address budget the other ports
//!   use ([`crate::auth_failures`]): an address past it is refused without
//!   its token being compared.
//! - **Connections.** At most `--rls-connections-max` open; past it a new
//!   one is closed at once. A connection that has not made an authenticated
//!   call within `--auth-timeout-ms` of its start is closed (with a token);
//!   one that sends nothing for `--idle-timeout-ms` (when not 0) too.
//! - **Bytes.** Every byte of a request message, as its DATA frames arrive,
//!   is counted against `--rls-buffer-bytes-max` (all connections) until
//!   the call has its message; a call whose bytes would go past it ends
//!   RESOURCE_EXHAUSTED and gives back what it held. With HTTP/2's windows
//!   ([`STREAM_WINDOW_BYTES`], [`CONNECTION_WINDOW_BYTES`]) and the request
//!   deadline, that bounds what a client can make the node hold.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

pub use crate::admin::RlsStats;
use crate::coordinator::constant_time_eq;
use crate::node::Node;

/// HTTP/2 flow-control window of one call: a whole message of the largest
/// size accepted and its 5-byte gRPC prefix, no more.
pub const STREAM_WINDOW_BYTES: u32 = super::MESSAGE_BYTES_MAX as u32 + 1_024;
/// HTTP/2 flow-control window of one connection: bytes a client may have
/// sent that the service has not yet taken in.
pub const CONNECTION_WINDOW_BYTES: u32 = 1 << 20;
/// Largest header list of a call (Envoy's are a few hundred bytes).
pub const HEADER_LIST_BYTES_MAX: u32 = 16 << 10;

/// What every connection and call of the port checks against.
#[derive(Debug)]
pub struct Gate {
    node: Arc<Node>,
    stats: Arc<RlsStats>,
    /// The token a call must carry; `None`: none needed.
    token: Option<Box<[u8]>>,
    connections_max: usize,
    buffer_bytes_max: usize,
    auth_timeout: Duration,
    /// `None`: never.
    idle_timeout: Option<Duration>,
}

impl Gate {
    /// Counts a call's end: its answer's overall code, or the status that
    /// refused it.
    pub(super) fn count(&self, ended: Result<bool, tonic::Code>) {
        let here = self.stats.ended_here();
        let counter = match ended {
            Ok(over_limit) => &here.answered[usize::from(over_limit)],
            Err(code) => match here.errors.get(code as usize) {
                Some(counter) => counter,
                None => return,
            },
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The gate of `node`'s rate limit port, from its configuration.
    pub fn new(node: Arc<Node>, stats: Arc<RlsStats>) -> Arc<Gate> {
        let c = &node.config;
        let token = c
            .auth_token
            .as_ref()
            .filter(|_| !c.rls_allow_unauthenticated)
            .map(|t| t.as_bytes().into());
        Arc::new(Gate {
            token,
            connections_max: c.rls_connections_max,
            buffer_bytes_max: c.rls_buffer_bytes_max,
            auth_timeout: Duration::from_millis(c.auth_timeout_ms),
            idle_timeout: (c.idle_timeout_ms > 0).then(|| Duration::from_millis(c.idle_timeout_ms)),
            stats,
            node,
        })
    }

    /// `Ok` when `request` may be served; else the UNAUTHENTICATED status
    /// that answers it.
    pub(super) fn admit(
        &self,
        headers: &http::HeaderMap,
        peer: &Peer,
    ) -> Result<(), tonic::Status> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        // Every call's token is checked, even on a connection that has
        // authenticated before.
        let failures = &self.node.auth_failures;
        let now = Instant::now();
        let ip = peer.remote.ip();
        if let Some(wait) = failures.blocked(ip, now) {
            self.stats.unauthenticated.fetch_add(1, Ordering::Relaxed);
            return Err(tonic::Status::unauthenticated(format!(
                "too many failed authentications from this address; retry in {} ms",
                wait.as_millis()
            )));
        }
        let given = headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let Some(given) = given else {
            self.stats.unauthenticated.fetch_add(1, Ordering::Relaxed);
            return Err(tonic::Status::unauthenticated(
                "this node requires a token: send the metadata `authorization: Bearer TOKEN` (Envoy: grpc_service.initial_metadata)",
            ));
        };
        let ok = given
            .strip_prefix(b"Bearer ")
            .is_some_and(|t| constant_time_eq(token, t));
        if !ok {
            failures.failed(ip, now);
            self.stats.unauthenticated.fetch_add(1, Ordering::Relaxed);
            return Err(tonic::Status::unauthenticated("the token is wrong"));
        }
        peer.authed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Takes `n` bytes of the budget; `false` (nothing taken) past it.
    pub(super) fn reserve(&self, n: usize) -> bool {
        let before = self.stats.buffered.fetch_add(n, Ordering::AcqRel);
        if before + n > self.buffer_bytes_max {
            self.stats.buffered.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Gives back `n` bytes [`Gate::reserve`] took.
    pub(super) fn release(&self, n: usize) {
        if n > 0 {
            self.stats.buffered.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// The status of a call refused at the byte budget, counted (and
    /// logged for the first and then one in 1,000).
    pub(super) fn over_budget(&self) -> tonic::Status {
        let over = self.stats.over_budget.fetch_add(1, Ordering::Relaxed);
        if over % 1_000 == 0 {
            tracing::warn!(
                rls_buffer_bytes_max = self.buffer_bytes_max,
                refused = over + 1,
                "rate limit call refused: the node holds --rls-buffer-bytes-max of messages still arriving"
            );
        }
        tonic::Status::resource_exhausted(
            "the rate limit service holds as many request bytes as --rls-buffer-bytes-max allows; retry",
        )
    }
}

/// The port's connections: accepted under the cap.
#[derive(Debug)]
pub struct Incoming {
    listener: TcpListener,
    gate: Arc<Gate>,
    /// After a failed accept (out of descriptors): wait before the next.
    backoff: Option<Pin<Box<Sleep>>>,
}

impl Incoming {
    /// Connections of `listener`, through `gate`.
    pub fn new(listener: TcpListener, gate: Arc<Gate>) -> Incoming {
        Incoming {
            listener,
            gate,
            backoff: None,
        }
    }
}

impl Incoming {
    /// The next connection under the cap (a failed accept, out of
    /// descriptors, is logged and retried after a pause), to be served on
    /// the thread it is handed to ([`Conn::new`]).
    pub async fn accept(&mut self) -> Accepted {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Accepted> {
        let this = self;
        loop {
            if let Some(b) = this.backoff.as_mut() {
                std::task::ready!(b.as_mut().poll(cx));
                this.backoff = None;
            }
            let (stream, remote) = match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(accepted)) => accepted,
                Poll::Ready(Err(e)) => {
                    tracing::warn!(error = %e, "rate limit service accept failed");
                    this.backoff = Some(Box::pin(tokio::time::sleep(Duration::from_millis(10))));
                    continue;
                }
            };
            let gate = &this.gate;
            let stats = &gate.stats;
            if stats.open.fetch_add(1, Ordering::AcqRel) >= gate.connections_max {
                stats.open.fetch_sub(1, Ordering::AcqRel);
                let refused = stats.refused.fetch_add(1, Ordering::Relaxed);
                // The first and then one in 1,000: not a line per
                // connection of a flood.
                if refused % 1_000 == 0 {
                    tracing::warn!(peer = %remote, rls_connections_max = gate.connections_max, refused = refused + 1, "rate limit service connection closed at once: at --rls-connections-max");
                }
                continue;
            }
            let slot = Slot(gate.clone());
            let _ = stream.set_nodelay(true);
            // Out of this runtime's reactor, into the serving thread's.
            match stream.into_std() {
                Ok(stream) => {
                    return Poll::Ready(Accepted {
                        stream,
                        remote,
                        slot,
                    })
                }
                Err(e) => {
                    tracing::debug!(peer = %remote, error = %e, "rate limit service connection lost as it was accepted")
                }
            }
        }
    }
}

/// A connection's place under `--rls-connections-max`, given back when it
/// is dropped (with the connection, wherever it is then).
#[derive(Debug)]
struct Slot(Arc<Gate>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.stats.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection accepted under the cap, not yet served: it is handed to
/// the thread that will serve it (the one holding fewest: `super::start`),
/// whose runtime takes its socket.
#[derive(Debug)]
pub struct Accepted {
    stream: std::net::TcpStream,
    remote: SocketAddr,
    slot: Slot,
}

/// Who is at the other end of a call's connection (a request extension).
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its address.
    pub remote: SocketAddr,
    /// Whether a call of this connection carried the token.
    authed: Arc<AtomicBool>,
}

/// Which deadline a connection is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A call with the token must come before it.
    Auth,
    /// Some bytes must come before it (`--idle-timeout-ms`).
    Idle,
}

/// One connection of the port: its slot under the cap, and its deadline
/// (to authenticate, then to send something).
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    peer: Peer,
    phase: Phase,
    /// `None`: none.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Its place under the cap, and the gate it came through.
    slot: Slot,
}

impl Conn {
    /// `accepted`, served on the calling thread's runtime (its socket
    /// registered there), under the deadline to authenticate (with a
    /// token) or the idle one.
    pub fn new(accepted: Accepted) -> io::Result<Conn> {
        let Accepted {
            stream,
            remote,
            slot,
        } = accepted;
        let stream = TcpStream::from_std(stream)?;
        let gate = &slot.0;
        let (phase, first) = if gate.token.is_some() {
            (Phase::Auth, Some(gate.auth_timeout))
        } else {
            (Phase::Idle, gate.idle_timeout)
        };
        Ok(Conn {
            stream,
            peer: Peer {
                remote,
                authed: Arc::new(AtomicBool::new(gate.token.is_none())),
            },
            phase,
            deadline: first.map(|d| Box::pin(tokio::time::sleep(d))),
            slot,
        })
    }

    /// Who is at the other end.
    pub fn peer(&self) -> Peer {
        self.peer.clone()
    }

    /// Moves to the idle deadline once a call has carried the token.
    fn authenticated(&mut self) {
        if self.phase == Phase::Auth && self.peer.authed.load(Ordering::Relaxed) {
            self.phase = Phase::Idle;
            self.idle_from_now();
        }
    }

    /// Puts the idle deadline `--idle-timeout-ms` from now (or none).
    fn idle_from_now(&mut self) {
        match (self.slot.0.idle_timeout, self.deadline.as_mut()) {
            (Some(idle), Some(d)) => d.as_mut().reset(tokio::time::Instant::now() + idle),
            (Some(idle), None) => self.deadline = Some(Box::pin(tokio::time::sleep(idle))),
            (None, _) => self.deadline = None,
        }
    }

    /// `Err` once the deadline in force has passed.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            let Some(d) = self.deadline.as_mut() else {
                return Ok(());
            };
            if d.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            if self.phase == Phase::Auth && self.peer.authed.load(Ordering::Relaxed) {
                self.authenticated();
                continue;
            }
            self.slot.0.stats.timed_out.fetch_add(1, Ordering::Relaxed);
            let why = match self.phase {
                Phase::Auth => "rate limit service connection made no call with the token within --auth-timeout-ms",
                Phase::Idle => "rate limit service connection idle past --idle-timeout-ms",
            };
            tracing::debug!(peer = ?self.peer.remote, why);
            return Err(io::Error::new(io::ErrorKind::TimedOut, why));
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    match this.phase {
                        Phase::Auth => this.authenticated(),
                        Phase::Idle => this.idle_from_now(),
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.check_deadline(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
