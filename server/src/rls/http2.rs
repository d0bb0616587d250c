//! The rate limit service's gRPC server, on HTTP/2 directly (the `h2`
//! crate): `ShouldRateLimit`, unary, and nothing else.
//!
//! Why not tonic's server: measured, its stack was the cost (issue 39,
//! benches/notes.md). `sluice-rls-floor`, answering OK at once, spent
//! 50.2k instructions a call on tonic + hyper and 32.7k on h2 directly,
//! and 40 % less CPU a call by `/proc`: the routing, the per-call task,
//! the boxed bodies and codecs of a general gRPC server, for one method
//! whose request is one message. What a call does here:
//!
//! - the connection's calls run inside its task (no task a call), each a
//!   future of [`call`], polled as the connection is;
//! - the path must be `ShouldRateLimit`'s (else UNIMPLEMENTED), the token
//!   is checked on the headers ([`Gate::admit`]) before a byte of the
//!   message is read, and each DATA frame's bytes count against
//!   `--rls-buffer-bytes-max` until the call ends ([`Held`]);
//! - the message is one length-prefixed protobuf (uncompressed; at most
//!   [`MESSAGE_BYTES_MAX`]), decoded by prost into envoy-types' request;
//! - the whole call (reading its message included) runs under
//!   `--rls-request-timeout-ms`, or the client's `grpc-timeout` if sooner:
//!   past it, DEADLINE_EXCEEDED. One timer a connection keeps the
//!   deadlines ([`Deadlines`]), not one a call: registering a tokio timer
//!   wrote to the thread's own eventfd whenever the runtime had last
//!   parked with none pending, 0.5-0.7 writes a call (benches/notes.md);
//! - the answer is HEADERS, one DATA and the `grpc-status: 0` trailers; a
//!   refusal is a trailers-only response (`grpc-status`, `grpc-message`),
//!   as tonic writes it.
//!
//! The HTTP/2 limits are the ones SECURITY.md's formula uses: concurrent
//! streams, the stream and connection windows, the header list size and
//! the pending resets.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::stream::FuturesUnordered;
use futures_util::Stream;
use h2::server::SendResponse;
use h2::RecvStream;
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};
use tonic::Status;

use super::guard::{
    Accepted, Conn, Gate, Peer, CONNECTION_WINDOW_BYTES, HEADER_LIST_BYTES_MAX, STREAM_WINDOW_BYTES,
};
use super::request::Request;
use super::{Rls, MESSAGE_BYTES_MAX, STREAMS_PER_CONNECTION_MAX};

/// The one path served.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// gRPC's message prefix: a compressed flag and a 4-byte length.
const PREFIX_BYTES: usize = 5;

/// Serves one connection of the port on the calling thread (its socket
/// moves to this thread's runtime): its TLS handshake, then its calls,
/// until it closes.
pub(super) async fn serve(accepted: Accepted, rls: Arc<Rls>, gate: Arc<Gate>) {
    let timeout = Duration::from_millis(rls.node.config.rls_request_timeout_ms);
    let conn = match Conn::new(accepted) {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!(error = %e, "rate limit service connection lost as it was handed over");
            return;
        }
    };
    let peer = conn.peer();
    match &rls.tls {
        Some(tls) => match tls.accept_io(conn).await {
            Ok(stream) => connection(stream, &rls, &gate, &peer, timeout).await,
            Err(e) => {
                tracing::debug!(peer = ?peer.remote, error = %e, "rate limit service TLS handshake failed")
            }
        },
        None => connection(conn, &rls, &gate, &peer, timeout).await,
    }
}

/// One connection: its HTTP/2 handshake, then its calls, until either side
/// closes it (or its deadline does: [`super::guard::Conn`]).
async fn connection<T>(io: T, rls: &Rls, gate: &Gate, peer: &Peer, timeout: Duration)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
        .initial_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_header_list_size(HEADER_LIST_BYTES_MAX)
        .max_pending_accept_reset_streams(STREAMS_PER_CONNECTION_MAX as usize);
    let mut h2 = match builder.handshake::<_, Bytes>(io).await {
        Ok(h2) => h2,
        Err(e) => {
            return tracing::debug!(peer = ?peer.remote, error = %e, "rate limit service connection ended before HTTP/2 began");
        }
    };
    let mut calls = FuturesUnordered::new();
    let mut deadlines = Deadlines::new();
    // Accepting calls, and whether the connection can still be driven.
    let (mut open, mut alive) = (true, true);
    std::future::poll_fn(|cx| loop {
        // Driving the connection reads what arrived and writes what the
        // calls queued.
        let mut accepted = false;
        while open {
            match h2.poll_accept(cx) {
                Poll::Ready(Some(Ok((request, respond)))) => {
                    let timeout = client_timeout(request.headers())
                        .map_or(timeout, |t| t.min(timeout));
                    let deadline = Instant::now() + timeout;
                    deadlines.arm(deadline);
                    let answer = answer(rls, gate, peer, request);
                    calls.push(Call::new(answer, respond, deadline, timeout, gate, peer));
                    accepted = true;
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(peer = ?peer.remote, error = %e, "rate limit service connection failed");
                    (open, alive) = (false, false);
                }
                Poll::Ready(None) => open = false,
                Poll::Pending => break,
            }
        }
        if !open && alive && h2.poll_closed(cx).is_ready() {
            // The client stopped sending calls (GOAWAY): the ones still
            // answering are driven here until the connection closes.
            alive = false;
        }
        // Calls past their deadline are woken to answer so.
        deadlines.poll_sweep(cx, &mut calls);
        let mut finished = false;
        while let Poll::Ready(Some(())) = Pin::new(&mut calls).poll_next(cx) {
            finished = true;
        }
        if !open && calls.is_empty() {
            return Poll::Ready(());
        }
        // What the calls that just finished queued goes out when the
        // connection is driven again; with nothing new, wait to be woken.
        if !(accepted || finished && alive) {
            return Poll::Pending;
        }
    })
    .await;
}

/// The connection's one timer for its calls' deadlines: armed at the
/// earliest deadline it knows of, it sweeps the calls when it fires,
/// expiring those past theirs, and re-arms at the earliest left. Calls
/// answered before their deadline are not taken out: a sweep finds them
/// gone. Under steady load, with one `--rls-request-timeout-ms` for all,
/// it is re-armed about once a timeout; a timer of each call's own was
/// registered and removed with every call.
struct Deadlines {
    sleep: Pin<Box<Sleep>>,
    /// The deadline `sleep` is set to, while it matters.
    armed: Option<Instant>,
}

impl Deadlines {
    fn new() -> Deadlines {
        // Registered with the runtime's timer only once armed and polled.
        let sleep = Box::pin(tokio::time::sleep_until(Instant::now()));
        Deadlines { sleep, armed: None }
    }

    /// A call with `deadline` has started: the timer fires by then.
    fn arm(&mut self, deadline: Instant) {
        if self.armed.map_or(true, |armed| deadline < armed) {
            self.sleep.as_mut().reset(deadline);
            self.armed = Some(deadline);
        }
    }

    /// Expires the calls past their deadline when the timer has fired, and
    /// re-arms it; leaves it registered to wake `cx` while armed.
    fn poll_sweep<F>(&mut self, cx: &mut Context<'_>, calls: &mut FuturesUnordered<Call<'_, F>>)
    where
        F: Future<Output = Result<RateLimitResponse, Status>>,
    {
        while self.armed.is_some() && self.sleep.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            self.armed = None;
            let next = Pin::new(&mut *calls)
                .iter_pin_mut()
                .filter_map(|call| call.expire_by(now))
                .min();
            if let Some(next) = next {
                self.arm(next);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// One call: its answer under way and the stream the answer goes out
    /// on. Past its deadline ([`Deadlines`] says so) the answer is dropped
    /// unfinished and the call answers DEADLINE_EXCEEDED.
    struct Call<'p, F> {
        #[pin]
        answer: F,
        respond: SendResponse<Bytes>,
        deadline: Instant,
        // For the refusal's message.
        timeout: Duration,
        expired: bool,
        // What wakes the call when it expires: the waker of its last poll.
        waker: Option<Waker>,
        gate: &'p Gate,
        peer: &'p Peer,
    }
}

impl<'p, F> Call<'p, F> {
    fn new(
        answer: F,
        respond: SendResponse<Bytes>,
        deadline: Instant,
        timeout: Duration,
        gate: &'p Gate,
        peer: &'p Peer,
    ) -> Self {
        Call {
            answer,
            respond,
            deadline,
            timeout,
            expired: false,
            waker: None,
            gate,
            peer,
        }
    }

    /// Expires the call (and wakes it to answer so) if its deadline is
    /// past at `now`; else its deadline.
    fn expire_by(self: Pin<&mut Self>, now: Instant) -> Option<Instant> {
        let this = self.project();
        if *this.deadline > now {
            return Some(*this.deadline);
        }
        *this.expired = true;
        if let Some(waker) = this.waker.take() {
            waker.wake();
        }
        None
    }
}

impl<F> Future for Call<'_, F>
where
    F: Future<Output = Result<RateLimitResponse, Status>>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let answered = if *this.expired {
            // DEADLINE_EXCEEDED, as gRPC's spec and docs/ENVOY.md say
            // (tonic's server answered CANCELLED).
            Err(Status::deadline_exceeded(format!(
                "no answer within {} ms (--rls-request-timeout-ms, or the call's grpc-timeout)",
                this.timeout.as_millis()
            )))
        } else {
            match this.answer.poll(cx) {
                Poll::Ready(answered) => answered,
                Poll::Pending => {
                    if !this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *this.waker = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
            }
        };
        let sent = match answered {
            Ok(response) => {
                this.gate
                    .count(Ok(response.overall_code == Code::OverLimit as i32));
                send_ok(this.respond, &response)
            }
            Err(status) => {
                this.gate.count(Err(status.code()));
                send_status(this.respond, status)
            }
        };
        if let Err(e) = sent {
            tracing::debug!(peer = ?this.peer.remote, error = %e, "rate limit service answer not sent");
        }
        Poll::Ready(())
    }
}

/// The call's answer, or the status that refuses it (its deadline is the
/// [`Call`]'s).
async fn answer(
    rls: &Rls,
    gate: &Gate,
    peer: &Peer,
    request: http::Request<RecvStream>,
) -> Result<RateLimitResponse, Status> {
    if request.uri().path() != PATH {
        return Err(Status::unimplemented(format!(
            "this port serves {PATH} only"
        )));
    }
    // Refused here, the message is never read: dropping it resets the
    // stream's sending side.
    gate.admit(request.headers(), peer)?;
    let message = read(gate, request.into_body()).await?;
    // Read where it lies; prost decodes what that read leaves to it
    // (request.rs), and its error is the call's.
    let decoded;
    let request = match Request::parse(&message) {
        Some(request) => request,
        None => {
            decoded = RateLimitRequest::decode(message)
                .map_err(|e| Status::internal(format!("failed to decode Protobuf message: {e}")))?;
            Request::of(&decoded)
        }
    };
    rls.decide_request(&request).await
}

/// The client's deadline (`grpc-timeout`: digits and a unit), if it gave
/// one that parses.
fn client_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let name = http::HeaderName::from_static("grpc-timeout");
    let value = headers.get(name)?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    // gRPC allows at most 8 digits.
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3_600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A call's message bytes held against `--rls-buffer-bytes-max`, given
/// back when the call ends.
struct Held<'g> {
    gate: &'g Gate,
    bytes: usize,
}

impl Held<'_> {
    fn take(&mut self, n: usize) -> Result<(), Status> {
        if !self.gate.reserve(n) {
            return Err(self.gate.over_budget());
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.gate.release(self.bytes);
    }
}

/// Reads the call's one message, whole: its bytes, past the gRPC prefix.
async fn read(gate: &Gate, mut body: RecvStream) -> Result<Bytes, Status> {
    let mut held = Held { gate, bytes: 0 };
    // Usually the message comes in one DATA frame: kept as it came.
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    while let Some(chunk) = std::future::poll_fn(|cx| body.poll_data(cx)).await {
        let chunk =
            chunk.map_err(|e| Status::cancelled(format!("the call's stream ended: {e}")))?;
        let n = chunk.len();
        let _ = body.flow_control().release_capacity(n);
        held.take(n)?;
        match first.take() {
            None if rest.is_empty() => first = Some(chunk),
            None => rest.extend_from_slice(&chunk),
            Some(f) => {
                rest.extend_from_slice(&f);
                rest.extend_from_slice(&chunk);
            }
        }
        let whole = first.as_deref().unwrap_or(&rest);
        if whole.len() >= PREFIX_BYTES && whole.len() > PREFIX_BYTES + check_prefix(whole)? {
            // Nothing is kept past the one message a unary call carries.
            return Err(Status::internal(
                "ShouldRateLimit is unary: its request is one message",
            ));
        }
    }
    let mut whole = first.unwrap_or_else(|| rest.freeze());
    if whole.len() < PREFIX_BYTES {
        return Err(Status::internal("Missing request message."));
    }
    let len = check_prefix(&whole)?;
    if whole.len() < PREFIX_BYTES + len {
        return Err(Status::internal(format!(
            "the request message is cut short: {} of {len} bytes",
            whole.len() - PREFIX_BYTES
        )));
    }
    whole.advance(PREFIX_BYTES);
    Ok(whole.slice(..len))
}

/// The message's length from its prefix, if the message is one this
/// service takes.
fn check_prefix(message: &[u8]) -> Result<usize, Status> {
    if message[0] != 0 {
        return Err(Status::unimplemented(
            "Message compressed, compression not supported.",
        ));
    }
    let len = u32::from_be_bytes([message[1], message[2], message[3], message[4]]) as usize;
    if len > MESSAGE_BYTES_MAX {
        return Err(Status::resource_exhausted(format!(
            "decoded message length too large: found {len} bytes, the limit is: {MESSAGE_BYTES_MAX} bytes"
        )));
    }
    Ok(len)
}

/// HEADERS, the response's one message, and `grpc-status: 0`.
fn send_ok(
    respond: &mut SendResponse<Bytes>,
    response: &RateLimitResponse,
) -> Result<(), h2::Error> {
    let len = response.encoded_len();
    let mut message = BytesMut::with_capacity(PREFIX_BYTES + len);
    message.extend_from_slice(&[0]);
    message.extend_from_slice(&(len as u32).to_be_bytes());
    response
        .encode(&mut message)
        .expect("the buffer holds the encoded length");
    // Made directly, with names known in advance: `Response::builder`
    // and a name given as text cost a parse and a chain of checks a call.
    let mut head = http::Response::new(());
    head.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    let mut stream = respond.send_response(head, false)?;
    stream.send_data(message.freeze(), false)?;
    let mut trailers = http::HeaderMap::with_capacity(1);
    trailers.insert(
        http::HeaderName::from_static("grpc-status"),
        http::HeaderValue::from_static("0"),
    );
    stream.send_trailers(trailers)
}

/// A trailers-only response carrying `status` (tonic's encoding of it).
fn send_status(respond: &mut SendResponse<Bytes>, status: Status) -> Result<(), h2::Error> {
    let (head, ()) = status.into_http::<()>().into_parts();
    respond
        .send_response(http::Response::from_parts(head, ()), true)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_parses_every_unit_and_refuses_the_rest() {
        let t = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            client_timeout(&h)
        };
        assert_eq!(t("2H"), Some(Duration::from_secs(7_200)));
        assert_eq!(t("3M"), Some(Duration::from_secs(180)));
        assert_eq!(t("4S"), Some(Duration::from_secs(4)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("7u"), Some(Duration::from_micros(7)));
        assert_eq!(t("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(t("123456789m"), None, "at most 8 digits");
        assert_eq!(t("m"), None);
        assert_eq!(t("5x"), None);
        assert_eq!(t(""), None);
        assert_eq!(client_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn a_message_prefix_is_checked_for_compression_and_size() {
        let prefix = |flag: u8, len: u32| {
            let mut p = vec![flag];
            p.extend_from_slice(&len.to_be_bytes());
            p
        };
        assert_eq!(check_prefix(&prefix(0, 39)).unwrap(), 39);
        assert_eq!(
            check_prefix(&prefix(0, MESSAGE_BYTES_MAX as u32)).unwrap(),
            MESSAGE_BYTES_MAX
        );
        let over = check_prefix(&prefix(0, MESSAGE_BYTES_MAX as u32 + 1)).unwrap_err();
        assert_eq!(over.code(), tonic::Code::ResourceExhausted);
        let compressed = check_prefix(&prefix(1, 10)).unwrap_err();
        assert_eq!(compressed.code(), tonic::Code::Unimplemented);
    }
}
