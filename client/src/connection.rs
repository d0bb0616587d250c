//! One multiplexed connection: the HELLO handshake, then a writer task that
//! batches every queued call into one frame per write, and a reader task
//! that routes replies back to their callers by request id.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::message::{
    Decide, Hello, HelloOk, LeaseOp, LeaseTarget, LimitSet, Limits, Mode, Reply, Request, Stats,
    Throttle,
};
use sluice_protocol::{Concurrency, Policy, Priority, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::Decoder;

use crate::error::Error;

/// Most calls gathered into one frame (the server's default batch limit).
pub const BATCH_MAX: usize = 4_096;

/// A request owned by the call until the writer encodes it.
#[derive(Debug)]
pub(crate) enum Call {
    Ping,
    /// A decision (THROTTLE, PEEK, DECIDE, RELEASE, RENEW, CELL).
    Op(Op),
    Reload,
    /// One page of STATS, from `shard_first` on.
    Stats {
        shard_first: u16,
    },
    /// ROLE: the node's role and replication state.
    Role,
    /// PROMOTE: make the node (a follower) the primary.
    Promote,
    /// FAILOVER: planned handover from the node (a primary) to its follower.
    Failover,
    /// CLUSTER: the node's view of the cluster (and a key's owner).
    Cluster {
        key: Box<[u8]>,
    },
}

/// One decision about one key, owned: a call of a batch
/// ([`Cluster::batch`](crate::Cluster::batch)), which is how a node
/// forwards the requests another group owns.
#[derive(Clone, Debug)]
pub enum Op {
    /// THROTTLE (or PEEK, changing nothing): one inline token bucket.
    Throttle {
        key: Bytes,
        policy: Policy,
        cost: u64,
        peek: bool,
    },
    /// DECIDE in any mode.
    Decide {
        mode: Mode,
        key: Bytes,
        limits: OwnedLimits,
        cost: u64,
        priority: Priority,
    },
    /// RELEASE (`renew == false`) or RENEW of one lease.
    Lease {
        renew: bool,
        key: Bytes,
        target: OwnedTarget,
        lease_id: u64,
    },
    /// CELL: redis-cell's CL.THROTTLE (a node forwarding for RESP).
    Cell {
        key: Bytes,
        policy: sluice_protocol::cell::CellPolicy,
        quantity: u64,
    },
}

impl Op {
    /// The key decided.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Throttle { key, .. }
            | Op::Decide { key, .. }
            | Op::Lease { key, .. }
            | Op::Cell { key, .. } => key,
        }
    }

    /// Whether the store may change something: such a call, once sent and
    /// unanswered, is outcome-unknown and never resent.
    pub fn spends(&self) -> bool {
        match self {
            Op::Throttle { peek, .. } => !peek,
            Op::Decide { mode, .. } => *mode != Mode::Probe,
            Op::Lease { .. } => true,
            Op::Cell { quantity, .. } => *quantity > 0,
        }
    }

    /// The request this op is.
    fn request(&self) -> Request<'_> {
        match self {
            Op::Throttle {
                key,
                policy,
                cost,
                peek,
            } => {
                let t = Throttle {
                    key,
                    policy: *policy,
                    cost: *cost,
                };
                if *peek {
                    Request::Peek(t)
                } else {
                    Request::Throttle(t)
                }
            }
            Op::Decide {
                mode,
                key,
                limits,
                cost,
                priority,
            } => Request::Decide(Decide {
                mode: *mode,
                key,
                limits: limits.borrow(),
                cost: *cost,
                priority: *priority,
            }),
            Op::Lease {
                renew,
                key,
                target,
                lease_id,
            } => {
                let op = LeaseOp {
                    key,
                    target: target.borrow(),
                    lease_id: *lease_id,
                };
                if *renew {
                    Request::Renew(op)
                } else {
                    Request::Release(op)
                }
            }
            Op::Cell {
                key,
                policy,
                quantity,
            } => Request::Cell(sluice_protocol::message::Cell {
                key,
                policy: *policy,
                quantity: *quantity,
            }),
        }
    }
}

/// [`Limits`] that outlive the caller's borrow until the writer encodes them.
/// Inline limits are boxed so that every [`Op`] (THROTTLE's too) stays
/// small on its way through the channel.
#[derive(Clone, Debug)]
pub enum OwnedLimits {
    Inline(Box<LimitSet>),
    Tier(Box<str>),
}

impl OwnedLimits {
    /// Owns `limits`.
    pub fn new(limits: &Limits<'_>) -> OwnedLimits {
        match limits {
            Limits::Inline(set) => OwnedLimits::Inline(Box::new(*set)),
            Limits::Tier(name) => OwnedLimits::Tier((*name).into()),
        }
    }

    /// Borrows them back.
    pub fn borrow(&self) -> Limits<'_> {
        match self {
            OwnedLimits::Inline(set) => Limits::Inline(**set),
            OwnedLimits::Tier(name) => Limits::Tier(name),
        }
    }
}

/// A [`LeaseTarget`] that outlives the caller's borrow.
#[derive(Clone, Debug)]
pub enum OwnedTarget {
    Inline { index: u8, limit: Concurrency },
    Tier { name: Box<str>, index: u8 },
}

impl OwnedTarget {
    /// Owns `target`.
    pub fn new(target: &LeaseTarget<'_>) -> OwnedTarget {
        match *target {
            LeaseTarget::Inline { index, limit } => OwnedTarget::Inline { index, limit },
            LeaseTarget::Tier { name, index } => OwnedTarget::Tier {
                name: name.into(),
                index,
            },
        }
    }

    /// Borrows it back.
    pub fn borrow(&self) -> LeaseTarget<'_> {
        match self {
            OwnedTarget::Inline { index, limit } => LeaseTarget::Inline {
                index: *index,
                limit: *limit,
            },
            OwnedTarget::Tier { name, index } => LeaseTarget::Tier {
                name,
                index: *index,
            },
        }
    }
}

impl Call {
    /// Appends this call as one request message.
    fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
        let request = match self {
            Call::Ping => Request::Ping,
            Call::Op(op) => op.request(),
            Call::Reload => Request::Reload,
            Call::Stats { shard_first } => Request::Stats(Stats {
                shard_first: *shard_first,
            }),
            Call::Role => Request::Role,
            Call::Promote => Request::Promote,
            Call::Failover => Request::Failover,
            Call::Cluster { key } => Request::Cluster { key },
        };
        request.encode(w, buf, request_id);
    }
}

/// Ops sent together, whose replies are gathered in place: one
/// completion for the whole batch, not a channel and a timer per call.
#[derive(Debug)]
pub(crate) struct Batch {
    /// In the caller's order.
    pub(crate) ops: Vec<Op>,
    /// By op: its reply, once it came (or its connection failed).
    replies: Mutex<Vec<Option<Result<Reply, Error>>>>,
    /// Ops still without a reply.
    left: AtomicUsize,
    /// Woken when `left` reaches 0.
    done: tokio::sync::Notify,
}

impl Batch {
    pub(crate) fn new(ops: Vec<Op>) -> Arc<Batch> {
        let n = ops.len();
        Arc::new(Batch {
            replies: Mutex::new((0..n).map(|_| None).collect()),
            left: AtomicUsize::new(n),
            done: tokio::sync::Notify::new(),
            ops,
        })
    }

    /// Op `index`'s reply (the first one given counts).
    pub(crate) fn complete(&self, index: u32, reply: Result<Reply, Error>) {
        let mut replies = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        // Taken already (the caller stopped waiting), or answered.
        let Some(slot @ None) = replies.get_mut(index as usize) else {
            return;
        };
        *slot = Some(reply);
        drop(replies);
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.notify_one();
        }
    }

    /// Resolves once every op has its reply.
    pub(crate) async fn finished(&self) {
        while self.left.load(Ordering::Acquire) > 0 {
            self.done.notified().await;
        }
    }

    /// The replies so far, by op (`None`: none came).
    pub(crate) fn take(&self) -> Vec<Option<Result<Reply, Error>>> {
        // A reply that comes after this finds no slot and is dropped.
        std::mem::take(&mut *self.replies.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What the writer is given.
#[derive(Debug)]
enum Queued {
    /// One call, answered on its channel.
    One {
        call: Call,
        reply: oneshot::Sender<Result<Reply, Error>>,
    },
    /// Ops `items` of `batch`, answered in it.
    Batch { batch: Arc<Batch>, items: Vec<u32> },
}

/// Who waits for a request id's reply.
#[derive(Debug)]
enum Waiter {
    One(oneshot::Sender<Result<Reply, Error>>),
    Batch(Arc<Batch>, u32),
}

impl Waiter {
    fn answer(self, reply: Result<Reply, Error>) {
        match self {
            Waiter::One(tx) => {
                let _ = tx.send(reply);
            }
            Waiter::Batch(batch, index) => batch.complete(index, reply),
        }
    }
}

/// Callers waiting for replies, by request id.
type Pending = Arc<Mutex<HashMap<u32, Waiter, BuildHasherDefault<IdHasher>>>>;

/// Request ids come from a counter: one multiply spreads them, where
/// SipHash cost a forwarding node a few percent of its time.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A live connection's handle. Dropping every clone ends its tasks.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Calls to the writer task.
    tx: mpsc::UnboundedSender<Queued>,
    /// What HELLO answered.
    pub hello: HelloOk,
}

impl Conn {
    /// Connects, sends HELLO (binding `shard` if given) and starts the
    /// writer and reader tasks.
    pub async fn open(
        addr: SocketAddr,
        shard: Option<u16>,
        token: &[u8],
        timeout: Duration,
        (epoch, layout): (u64, u64),
    ) -> Result<Conn, Error> {
        let connect_err = |source| Error::Connect {
            addr: addr.to_string(),
            source,
        };
        let handshake = async {
            let mut stream = TcpStream::connect(addr).await.map_err(connect_err)?;
            stream.set_nodelay(true).map_err(connect_err)?;
            let (hello, rbuf) = handshake_with(&mut stream, shard, token, epoch, layout).await?;
            Ok::<_, Error>((stream, rbuf, FrameDecoder::default(), hello))
        };
        let (stream, rbuf, decoder, hello) = tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| Error::Timeout(timeout))??;
        let (read, write) = stream.into_split();
        let pending: Pending = Arc::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let (reader_done_tx, reader_done) = oneshot::channel();
        tokio::spawn(write_loop(write, rx, pending.clone(), reader_done));
        tokio::spawn(async move {
            read_loop(read, rbuf, decoder, pending).await;
            drop(reader_done_tx);
        });
        Ok(Conn { tx, hello })
    }

    /// Whether the connection has ended (its writer is gone).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Sends ops `items` of `batch` (their replies go to the batch; a
    /// closed connection answers them DISCONNECTED at once).
    pub fn send_batch(&self, batch: &Arc<Batch>, items: Vec<u32>) {
        let queued = Queued::Batch {
            batch: batch.clone(),
            items,
        };
        if let Err(mpsc::error::SendError(Queued::Batch { batch, items })) = self.tx.send(queued) {
            for i in items {
                batch.complete(i, Err(Error::Disconnected));
            }
        }
    }

    /// Sends `call` and waits for its reply until `deadline`.
    pub async fn call(&self, call: Call, deadline: Duration) -> Result<Reply, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Queued::One { call, reply })
            .map_err(|_| Error::Disconnected)?;
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Disconnected),
            Err(_) => Err(Error::Timeout(deadline)),
        }
    }
}

/// Sends HELLO on a fresh connection (binding `shard` if given) and reads
/// HELLO_OK. Returns it with any bytes read past it.
pub async fn handshake(
    stream: &mut TcpStream,
    shard: Option<u16>,
    token: &[u8],
) -> Result<(HelloOk, BytesMut), Error> {
    handshake_at(stream, shard, token, 0).await
}

/// [`handshake`], telling the node the highest epoch the caller knows for
/// its group (0: none).
pub async fn handshake_at(
    stream: &mut TcpStream,
    shard: Option<u16>,
    token: &[u8],
    epoch: u64,
) -> Result<(HelloOk, BytesMut), Error> {
    handshake_with(stream, shard, token, epoch, 0).await
}

/// [`handshake_at`] from a node that forwards, with its cluster layout
/// hash (0: none): a node whose layout differs answers LAYOUT_MISMATCH.
pub async fn handshake_with(
    stream: &mut TcpStream,
    shard: Option<u16>,
    token: &[u8],
    epoch: u64,
    layout: u64,
) -> Result<(HelloOk, BytesMut), Error> {
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::new();
    let hello = Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        shard,
        token,
        epoch,
        layout,
    };
    Request::Hello(hello).encode(&mut w, &mut buf, 1);
    w.finish(&mut buf);
    stream
        .write_all(&buf)
        .await
        .map_err(|_| Error::Disconnected)?;
    let mut rbuf = BytesMut::with_capacity(4096);
    let mut decoder = FrameDecoder::default();
    let frame = loop {
        if let Some(f) = decoder
            .decode(&mut rbuf)
            .map_err(|e| not_a_frame(&rbuf, &e))?
        {
            break f;
        }
        if stream
            .read_buf(&mut rbuf)
            .await
            .map_err(|_| Error::Disconnected)?
            == 0
        {
            return Err(Error::Disconnected);
        }
    };
    let (h, p) = frame.messages().next().expect("a frame holds a message");
    match Reply::parse(h, p) {
        Some(Reply::HelloOk(ok)) => Ok((ok, rbuf)),
        Some(Reply::Error { code, text }) => Err(Error::server(code, text)),
        _ => Err(Error::Protocol("expected HELLO_OK".into())),
    }
}

/// HELLO's answer is no frame: a Redis server (sluiced's RESP listener,
/// or Redis itself) answered in RESP, or the bytes are just bad.
fn not_a_frame(rbuf: &[u8], e: &sluice_protocol::codec::DecodeError) -> Error {
    match rbuf.first() {
        Some(b'-' | b'+' | b'*' | b'$' | b':' | b'%' | b'_') => Error::Protocol(
            "the node answered in the Redis protocol (RESP): this is a RESP port (sluiced --resp-port, or Redis); sluice and sluice-client use sluiced's --port (default 7700)".into(),
        ),
        _ => Error::Protocol(e.to_string()),
    }
}

/// Gathers every queued call into one frame per write. Ends when every
/// handle is gone or the reader has ended (`reader_done` resolves), and
/// then fails whatever is still waiting.
async fn write_loop(
    mut write: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    pending: Pending,
    mut reader_done: oneshot::Receiver<()>,
) {
    let mut calls = Vec::with_capacity(BATCH_MAX);
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut next_id: u32 = 1;
    loop {
        let n = tokio::select! {
            n = rx.recv_many(&mut calls, BATCH_MAX) => n,
            _ = &mut reader_done => 0,
        };
        if n == 0 {
            break;
        }
        let mut w = FrameWriter::new();
        {
            let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
            // Id 0 is reserved for connection-level errors.
            let mut next = || {
                next_id = next_id.wrapping_add(1).max(1);
                next_id
            };
            for q in calls.drain(..) {
                match q {
                    Queued::One { call, reply } => {
                        let request_id = next();
                        call.encode(&mut w, &mut buf, request_id);
                        pending.insert(request_id, Waiter::One(reply));
                    }
                    Queued::Batch { batch, items } => {
                        for i in items {
                            let request_id = next();
                            let op = &batch.ops[i as usize];
                            op.request().encode(&mut w, &mut buf, request_id);
                            pending.insert(request_id, Waiter::Batch(batch.clone(), i));
                        }
                    }
                }
            }
        }
        w.finish(&mut buf);
        if write.write_all(&buf).await.is_err() {
            break;
        }
        buf.clear();
    }
    fail_all(&pending, || Error::Disconnected);
}

/// Routes each reply to its caller; on the end of the stream (or a
/// connection-level error) fails every caller still waiting.
async fn read_loop(
    mut read: OwnedReadHalf,
    mut rbuf: BytesMut,
    mut decoder: FrameDecoder,
    pending: Pending,
) {
    let mut fatal: Option<(u16, String)> = None;
    'read: loop {
        loop {
            let frame = match decoder.decode(&mut rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'read fatal = Some((0, e.to_string())),
            };
            let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
            for (h, p) in frame.messages() {
                let Some(reply) = Reply::parse(h, p) else {
                    break 'read fatal = Some((0, format!("unreadable reply op {:#04x}", h.op)));
                };
                if h.request_id == 0 {
                    if let Reply::Error { code, text } = reply {
                        fatal = Some((code, text));
                    }
                    continue;
                }
                if let Some(waiter) = pending.remove(&h.request_id) {
                    waiter.answer(match reply {
                        Reply::Error { code, text } => Err(Error::server(code, text)),
                        other => Ok(other),
                    });
                }
            }
        }
        match read.read_buf(&mut rbuf).await {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    match fatal {
        Some((0, text)) => fail_all(&pending, || Error::Protocol(text.clone())),
        Some((code, text)) => fail_all(&pending, || Error::server(code, text.clone())),
        None => fail_all(&pending, || Error::Disconnected),
    }
}

fn fail_all(pending: &Pending, err: impl Fn() -> Error) {
    let drained: Vec<_> = pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
        .collect();
    for (_, waiter) in drained {
        waiter.answer(Err(err()));
    }
}
