//! The read-decide-write loop every client connection runs on its shard
//! thread, whatever protocol it speaks: protocol v1 (`connection`) and
//! RESP (`resp::connection`) each implement [`Handler`], their side of the loop (decode and handle what was read,
//! encode the replies forwarded requests fill in, say whether to linger on
//! close and what becomes of a socket the loop hands on), and [`run`] does
//! the rest.
//!
//! Each turn: in sync replication mode, wait until the follower has what
//! the encoded replies reflect (if it may not have it and a fencing lease
//! is on, the connection drops without them: the client must not learn
//! they were admitted); write every encoded reply in one write; hand the
//! socket on if the handler asks; at shutdown (Drain) stop reading; once
//! closing with nothing in flight, close (lingering first if the handler
//! asks). Otherwise wait for the first of: forwarded replies coming back,
//! bytes to read (not while `inflight_max` requests are unanswered, which
//! pushes back on the peer through TCP), Drain.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use crate::stream::{Moving, Stream};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::node::ShardCore;
use crate::pipeline::{Pipeline, Protocol};
use crate::replication::primary::replication_wait;
use crate::shard::BatchReply;

/// Spare read-buffer capacity kept before each read (and a write buffer's
/// first capacity).
pub(crate) const READ_CHUNK_BYTES: usize = 16 << 10;

/// A read or write buffer that grew past this (a large frame, a burst of
/// replies) is given back once empty, so that an idle connection holds
/// [`READ_CHUNK_BYTES`], not the most it ever needed.
pub(crate) const BUFFER_KEEP_BYTES: usize = 64 << 10;

/// After closing on bad input, how long the loop keeps reading (and
/// dropping) what the peer still sends, for a handler that asks to linger:
/// the close is then a FIN after the error reply, not a reset that could
/// make the peer lose that reply.
pub(crate) const ERROR_LINGER_MS: u64 = 1_000;

/// A protocol's side of the loop: everything of a connection but the socket
/// and the bytes read and not yet handled, which the loop owns.
pub(crate) trait Handler: Sized {
    /// The protocol's use of the [`Pipeline`].
    type Protocol: Protocol;
    /// Why the loop hands the socket on.
    type Handoff;
    /// What log lines call this kind of connection.
    const NAME: &'static str;

    /// The shard this connection runs on.
    fn core(&self) -> &Rc<ShardCore>;
    /// Replies in request order, and requests out at other shards.
    fn pipe(&mut self) -> &mut Pipeline<Self::Protocol>;
    /// Whether the connection stops reading and closes once every pending
    /// reply is written.
    fn closing(&self) -> bool;
    /// Stop reading; close once every pending reply is written.
    fn close(&mut self);
    /// Once the socket is registered, before the first turn: handles bytes
    /// that came with the socket.
    fn started(&mut self, _rbuf: &mut BytesMut) {}
    /// Decodes and handles the whole requests in `rbuf` (consuming them),
    /// then sends the forwarded batches that produced. It stops early,
    /// leaving requests in `rbuf` and [`Handler::backlog`] set, once the
    /// connection owes `--reply-bytes-max` or has `--inflight-max`
    /// requests unanswered.
    fn handle_read(&mut self, rbuf: &mut BytesMut);
    /// Whether the last [`Handler::handle_read`] left whole requests in
    /// `rbuf`: the loop reads no more, and hands them over again once the
    /// replies are written (or forwarded ones come back).
    fn backlog(&self) -> bool;
    /// Fills the slots an owner's reply answers and encodes the replies
    /// that makes ready, in order.
    fn fill(&mut self, reply: BatchReply);
    /// The encoded replies, ready to write (the loop clears them once
    /// written).
    fn output(&mut self) -> &mut BytesMut;
    /// Brings the shard's count of reply bytes owed up to date with this
    /// connection's ([`ReplyShare::settle`]).
    fn settle_replies(&mut self);
    /// Once the replies are written: whether the socket moves on.
    fn take_handoff(&mut self) -> Option<Self::Handoff> {
        None
    }
    /// Whether the connection has authenticated (or needs not): until it
    /// has, `--auth-timeout-ms` runs.
    fn authed(&self) -> bool;
    /// Until authenticated: notified when a newer connection takes this
    /// one's place at the connection limit.
    fn eviction(&self) -> Option<std::sync::Arc<crate::signal::Signal>>;
    /// Whether to linger on close (see [`ERROR_LINGER_MS`]).
    fn linger_on_close(&self) -> bool {
        false
    }
    /// What becomes of a socket the loop handed on. The connection is
    /// still counted on its shard: this must call
    /// [`ShardCore::connection_closed`] when it stops being a client
    /// connection of this shard.
    fn hand_off(
        self,
        stream: Stream,
        rbuf: BytesMut,
        handoff: Self::Handoff,
    ) -> impl Future<Output = ()>;
}

/// One connection's part of its shard's [`ShardReplies`](crate::reply_budget::ShardReplies); gives it back
/// when dropped (the connection closed or moved to another shard).
#[derive(Debug)]
pub(crate) struct ReplyShare {
    core: Rc<ShardCore>,
    /// What this connection last added to the shard's total.
    settled: usize,
}

impl ReplyShare {
    pub(crate) fn new(core: Rc<ShardCore>) -> ReplyShare {
        ReplyShare { core, settled: 0 }
    }

    /// Whether a connection that owes `owed` must stop decoding: it owes
    /// `--reply-bytes-max`, or with the rest of its shard's connections the
    /// shard's share of `--reply-bytes-node-max`.
    #[inline]
    pub(crate) fn full(&self, owed: usize, reply_max: usize) -> bool {
        if owed >= reply_max {
            return true;
        }
        let r = &self.core.replies;
        let full = r.owed.get() - self.settled + owed >= r.share;
        if full {
            r.blocked.set(true);
        }
        full
    }

    /// Brings the shard's total up to date with what the connection owes
    /// now; wakes the connections that stopped at the share once it is
    /// back under.
    #[inline]
    pub(crate) fn settle(&mut self, owed: usize) {
        if owed == self.settled {
            return;
        }
        let r = &self.core.replies;
        let total = r.owed.get() - self.settled + owed;
        r.owed.set(total);
        self.settled = owed;
        if r.blocked.get() && total < r.share {
            r.blocked.set(false);
            r.freed.notify_waiters();
        }
    }
}

impl Drop for ReplyShare {
    fn drop(&mut self) {
        self.settle(0);
    }
}

/// Serves one connection until it closes, or until the handler takes the
/// socket on; then the connection stops counting on its shard.
pub(crate) async fn run<H: Handler>(stream: Moving, mut rbuf: BytesMut, mut handler: H) {
    let core = handler.core().clone();
    let mut stream = match stream.attach() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "could not register a {}", H::NAME);
            core.connection_closed();
            return;
        }
    };
    handler.started(&mut rbuf);
    let handoff = match serve(&mut stream, &mut rbuf, &mut handler).await {
        Ok(handoff) => handoff,
        Err(e) => {
            tracing::debug!(shard = core.id, error = %e, "{} ended", H::NAME);
            None
        }
    };
    match handoff {
        Some(h) => handler.hand_off(stream, rbuf, h).await,
        None => core.connection_closed(),
    }
}

/// The read-decide-write loop. `Ok(Some(h))` when the socket moves on.
async fn serve<H: Handler>(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    h: &mut H,
) -> std::io::Result<Option<H::Handoff>> {
    let core = h.core().clone();
    let draining = core.draining.subscribe();
    // Made once per connection, like the timers: a `changed()` made anew
    // each turn registered with the watch and left it again (two locks a
    // turn, about 1 % of a shard's CPU at 50 x 1). Draining only ever
    // begins, so once it has fired it is not polled again.
    let mut drain_rx = draining.clone();
    let drain_begins = drain_rx.changed();
    let mut drain_armed = true;
    let mut replies = Vec::new();
    let config = &core.node.config;
    let inflight_max = config.inflight_max;
    // Timers, each made once per connection and reset only when it is on:
    // the authentication deadline (until authenticated), a half-sent frame
    // (while bytes of one wait in `rbuf`), silence (with --idle-timeout-ms).
    let ms = std::time::Duration::from_millis;
    let auth = tokio::time::sleep(ms(config.auth_timeout_ms));
    let half_sent = tokio::time::sleep(ms(config.frame_timeout_ms));
    let silent = tokio::time::sleep(ms(config.idle_timeout_ms.max(1)));
    let eviction = h.eviction();
    let evicted = async {
        match &eviction {
            Some(signal) => signal.wait().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(auth, half_sent, silent, evicted, drain_begins);
    let mut half_sent_on = false;
    // The read buffer has held more than BUFFER_KEEP_BYTES since it was
    // last given back.
    let mut grown = false;
    let idle_on = config.idle_timeout_ms > 0;
    loop {
        if !flush(stream, h, &core, ms(config.reply_timeout_ms)).await? {
            return Ok(None);
        }
        if let Some(handoff) = h.take_handoff() {
            return Ok(Some(handoff));
        }
        if *draining.borrow() {
            h.close();
        }
        if h.closing() && h.pipe().is_empty() {
            finish(stream, h.linger_on_close() && !*draining.borrow()).await;
            return Ok(None);
        }
        // Requests held back until the replies were written: on with them,
        // before reading more. Back to the top if any went.
        if h.backlog() && !h.closing() && took_backlog(h, rbuf) {
            continue;
        }
        let can_read = !h.closing() && !h.backlog() && h.pipe().len() < inflight_max;
        if !can_read {
            // Not reading is ours (back-pressure): a frame cut off in
            // `rbuf` is not the peer's fault; its clock starts again when
            // reading does.
            half_sent_on = false;
        }
        grown |= make_room(rbuf);
        tokio::select! {
            biased;
            () = h.pipe().recv(&mut replies), if h.pipe().awaiting() => {
                for reply in replies.drain(..) {
                    h.fill(reply);
                }
            }
            read = stream.read_buf(rbuf), if can_read => {
                let timers = Timers {
                    half_sent: half_sent.as_mut(),
                    silent: idle_on.then_some(silent.as_mut()),
                    config,
                };
                on_read(h, rbuf, read?, (&mut half_sent_on, &mut grown), timers);
            }
            _ = &mut drain_begins, if drain_armed && !h.closing() => drain_armed = false,
            // Stopped at the shard's share of --reply-bytes-node-max: on
            // once other connections' replies are written.
            () = core.replies.freed(), if h.backlog() && !h.closing() => {}
            () = &mut evicted, if !h.authed() && !h.closing() => {
                close_for(h, Closed::Evicted);
            }
            () = &mut auth, if !h.authed() && !h.closing() => close_for(h, Closed::NoAuth),
            () = &mut half_sent, if half_sent_on && !h.closing() => {
                close_for(h, Closed::HalfSent);
            }
            () = &mut silent, if idle_on && h.pipe().is_empty() && !h.closing() => {
                close_for(h, Closed::Idle);
            }
        }
    }
}

/// Why a connection's own timer or signal closed it.
#[derive(Clone, Copy, Debug)]
enum Closed {
    /// A newer unauthenticated connection needed its place.
    Evicted,
    /// No authentication within --auth-timeout-ms.
    NoAuth,
    /// A frame stayed half-sent for --frame-timeout-ms.
    HalfSent,
    /// Silent for --idle-timeout-ms.
    Idle,
}

/// Closes `h` for `why`, saying so at debug level.
#[cold]
fn close_for<H: Handler>(h: &mut H, why: Closed) {
    let shard = h.core().id;
    match why {
        Closed::Evicted => tracing::debug!(
            shard,
            "closing a {} that had not authenticated: a newer one needs its place",
            H::NAME
        ),
        Closed::NoAuth => tracing::debug!(
            shard,
            "closing a {} that did not authenticate in time",
            H::NAME
        ),
        Closed::HalfSent => {
            tracing::debug!(shard, "closing a {} whose frame stayed half-sent", H::NAME)
        }
        Closed::Idle => tracing::debug!(shard, "closing an idle {}", H::NAME),
    }
    h.close();
}

/// Ends the stream: FIN, then (`linger`) reads until the peer closes too,
/// so that its last requests' replies are not lost to a reset.
async fn finish(stream: &mut Stream, linger_on: bool) {
    let _ = stream.shutdown().await;
    if linger_on {
        linger(stream).await;
    }
}

/// Writes what the connection owes, once the follower has the changes it
/// reflects (sync mode). `false`: the connection is over (the follower
/// may be promoted without those changes, or the peer does not read).
#[inline]
async fn flush<H: Handler>(
    stream: &mut Stream,
    h: &mut H,
    core: &ShardCore,
    reply_timeout: std::time::Duration,
) -> std::io::Result<bool> {
    // What the last turn's decoding and filling added to what the
    // connection owes, counted on its shard.
    h.settle_replies();
    if let Some(wait) = replication_wait(core) {
        // Sync mode: these replies reflect changes the follower must
        // have first.
        if !wait.await && core.node.repl.fencing() {
            // The follower may be promoted without them: the client
            // must not learn they were admitted. It sees the
            // connection drop (outcome unknown).
            return Ok(false);
        }
    }
    let out = h.output();
    if !out.is_empty() {
        if !write_within(stream, out, reply_timeout).await? {
            tracing::debug!(
                shard = core.id,
                bytes = out.len(),
                "closing a {} that does not read its replies",
                H::NAME
            );
            return Ok(false);
        }
        core.count_io(false, out.len());
        out.clear();
        if out.capacity() > BUFFER_KEEP_BYTES {
            *out = BytesMut::with_capacity(READ_CHUNK_BYTES);
        }
        h.settle_replies();
    }
    Ok(true)
}

/// The timers a read may reset: the half-sent frame's, and silence's
/// (`None` without --idle-timeout-ms).
struct Timers<'a> {
    half_sent: Pin<&'a mut tokio::time::Sleep>,
    silent: Option<Pin<&'a mut tokio::time::Sleep>>,
    config: &'a crate::config::Config,
}

/// Whether handling what waits in `rbuf` took any of it.
#[inline]
fn took_backlog<H: Handler>(h: &mut H, rbuf: &mut BytesMut) -> bool {
    let before = rbuf.len();
    h.handle_read(rbuf);
    rbuf.len() != before
}

/// Room for a read's chunk in `rbuf`; whether it now holds more than
/// [`BUFFER_KEEP_BYTES`].
#[inline]
fn make_room(rbuf: &mut BytesMut) -> bool {
    if rbuf.capacity() - rbuf.len() < READ_CHUNK_BYTES {
        rbuf.reserve(READ_CHUNK_BYTES);
    }
    rbuf.capacity() > BUFFER_KEEP_BYTES
}

/// A read of `read` bytes into `rbuf`: counted, handled (0: the peer is
/// gone or finished sending; a partial request is dropped, pending
/// replies still go out), then `after_read`.
#[inline]
fn on_read<H: Handler>(
    h: &mut H,
    rbuf: &mut BytesMut,
    read: usize,
    (half_sent_on, grown): (&mut bool, &mut bool),
    t: Timers<'_>,
) {
    h.core().count_io(true, read);
    if read == 0 {
        h.close();
    } else {
        h.handle_read(rbuf);
        after_read(rbuf, half_sent_on, grown, t);
    }
}

/// After a read was handled: the read buffer given back if it grew and is
/// empty, and the timers reset as the read says (the clock is read only
/// when one is: most reads, whole frames with no idle timeout, reset
/// none).
#[inline]
fn after_read(rbuf: &mut BytesMut, half_sent_on: &mut bool, grown: &mut bool, t: Timers<'_>) {
    let ms = std::time::Duration::from_millis;
    let now = tokio::time::Instant::now;
    if rbuf.is_empty() {
        *half_sent_on = false;
        // (Frames split off `rbuf` share its allocation: its capacity now
        // says nothing of what it holds.)
        if *grown {
            *rbuf = BytesMut::with_capacity(READ_CHUNK_BYTES);
            *grown = false;
        }
    } else if !*half_sent_on {
        *half_sent_on = true;
        let mut half_sent = t.half_sent;
        half_sent
            .as_mut()
            .reset(now() + ms(t.config.frame_timeout_ms));
    }
    if let Some(mut silent) = t.silent {
        silent.as_mut().reset(now() + ms(t.config.idle_timeout_ms));
    }
}

/// Writes all of `out`: at once if the socket takes it (the common case,
/// with no timer), else within `timeout`. `false`: the peer did not read
/// it in time.
#[inline]
async fn write_within(
    stream: &mut Stream,
    out: &[u8],
    timeout: std::time::Duration,
) -> std::io::Result<bool> {
    let rest = match stream.try_write(out) {
        Ok(n) => &out[n..],
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => out,
        Err(e) => return Err(e),
    };
    if rest.is_empty() {
        return Ok(true);
    }
    let write = async {
        stream.write_all(rest).await?;
        // A TLS stream may hold the last record until flushed.
        stream.flush().await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(written) => written.map(|()| true),
        Err(_elapsed) => Ok(false),
    }
}

/// Reads and drops what the peer sends until it closes its side too, or
/// [`ERROR_LINGER_MS`] pass.
async fn linger(stream: &mut Stream) {
    let deadline = tokio::time::sleep(std::time::Duration::from_millis(ERROR_LINGER_MS));
    tokio::pin!(deadline);
    let mut sink = [0u8; 4096];
    loop {
        tokio::select! {
            n = stream.read(&mut sink) => if !matches!(n, Ok(n) if n > 0) { return },
            () = &mut deadline => return,
        }
    }
}

/// Longest secret [`constant_time_eq`] compares in constant time: the
/// longest auth token (PROTOCOL.md, HELLO's `token_len`).
pub(crate) const SECRET_BYTES_MAX: usize = 256;

/// Compares a secret with what a peer sent, in time that depends on
/// neither where they differ nor the secret's length (both are padded to
/// [`SECRET_BYTES_MAX`]; `subtle` keeps the compiler from short-cutting).
/// Only a `given` longer than that takes longer, and it never matches.
pub(crate) fn constant_time_eq(secret: &[u8], given: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let pad = |b: &[u8]| {
        let mut out = [0u8; SECRET_BYTES_MAX];
        let n = b.len().min(SECRET_BYTES_MAX);
        out[..n].copy_from_slice(&b[..n]);
        out
    };
    let (s, g) = (pad(secret), pad(given));
    let same_bytes = s.ct_eq(&g);
    let same_len = (secret.len() as u64).ct_eq(&(given.len() as u64));
    bool::from(same_bytes & same_len)
}

#[cfg(all(test, not(sluice_loom)))]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn secrets_match_only_byte_for_byte_and_length_for_length() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3cres"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        // Zero padding does not make a prefix match.
        assert!(!constant_time_eq(b"s3cret", b"s3cret\0"));
        assert!(!constant_time_eq(b"s3cret", b""));
        let long = [b'a'; 256];
        assert!(constant_time_eq(&long, &long));
        let longer = [b'a'; 300];
        assert!(!constant_time_eq(&long, &longer));
    }
}
