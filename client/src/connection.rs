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
use sluice_protocol::codec::{FrameDecoder, FrameWriter, WRITER_FRAME_BYTES_SOFT};
use sluice_protocol::message::{
    parse_cell_ok, Decide, Hello, HelloOk, LeaseOp, LeaseTarget, LimitSet, Limits, Mode, Reply,
    Request, Stats, Throttle,
};
use sluice_protocol::routing::shard_of;
use sluice_protocol::{Concurrency, Policy, Priority, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::Decoder;

use crate::error::Error;

/// Most calls gathered into one frame (the server's default batch limit).
pub const BATCH_MAX: usize = 4_096;

/// Replies of one run staged before they go to their batch (under one
/// lock): few enough that the staging stays in the L1 cache, where a
/// frame's worth (hundreds, 100 bytes each) was written out to memory and
/// read back, two cache misses a reply on a forwarding node.
const STAGED_MAX: usize = 32;

/// A connection's read buffer to start with (a connection that gets small
/// frames keeps it that small).
const READ_BUFFER_BYTES: usize = 4 << 10;

/// The most room a connection's reader keeps ahead of it: four of the
/// largest frames a node writes ([`WRITER_FRAME_BYTES_SOFT`] each).
const READ_ROOM_MAX: usize = 4 * WRITER_FRAME_BYTES_SOFT;

/// The room to keep ahead of a reader whose largest frame so far was
/// `biggest` bytes: four of them (at most [`READ_ROOM_MAX`]), so that a
/// frame split across reads seldom has to be moved to the buffer's front
/// to fit. A forwarding node's frames of replies (tens of KiB) split
/// across a buffer grown to just one of them were nearly all moved: 37
/// instructions of memcpy a forwarded request, against 3 with the room
/// (benches/notes.md).
fn read_room(biggest: usize) -> usize {
    biggest
        .saturating_mul(4)
        .clamp(READ_BUFFER_BYTES, READ_ROOM_MAX)
}

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
    /// CELL of a key known by its routing hash
    /// ([`sluice_protocol::routing::key_hash`]), sent in place of the key
    /// (the CELL_KEY_HASH flag): what a forwarding node sends a group whose
    /// primary announced it takes that (HELLO_OK's
    /// [`FEATURE_CELL_KEY_HASH`](sluice_protocol::message::FEATURE_CELL_KEY_HASH),
    /// [`Cluster::cell_by_hash_flags`](crate::Cluster::cell_by_hash_flags)),
    /// so that the owner need not hash the key again and the forwarding
    /// node need not keep it. A node that does not take it (an older one)
    /// answers BAD_REQUEST: nothing is spent. `hash` is `[low 64 bits,
    /// high 64 bits]` ([`Op::hash_halves`]): a `u128` would align every op
    /// to 16 bytes and make it larger.
    CellByHash {
        hash: [u64; 2],
        policy: sluice_protocol::cell::CellPolicy,
        quantity: u64,
    },
}

/// A CELL of a key known by its routing hash, as [`Op::CellByHash`] is,
/// on its own: what [`Cluster::cells_by_hash_with`](crate::Cluster::cells_by_hash_with)
/// sends (a forwarding node's CL.THROTTLEs). 48 bytes with nothing to
/// drop, where an [`Op`] is 72 and dropped one by one: every pass over a
/// batch's ops on a forwarding node at load is a cache miss an op
/// (benches/notes.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellByHash {
    /// `[low 64 bits, high 64 bits]` of the key's routing hash
    /// ([`Op::hash_halves`]).
    pub hash: [u64; 2],
    /// The limit.
    pub policy: sluice_protocol::cell::CellPolicy,
    /// Units spent (0: a look).
    pub quantity: u64,
}

impl From<CellByHash> for Op {
    fn from(c: CellByHash) -> Op {
        Op::CellByHash {
            hash: c.hash,
            policy: c.policy,
            quantity: c.quantity,
        }
    }
}

/// An op of a [`Batch`]: what its connections encode, and what the
/// cluster client needs of it when it is not answered at once.
pub(crate) trait BatchOp: Clone + Send + Sync + std::fmt::Debug + 'static {
    /// Appends it as one request message.
    fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32);
    /// The routing hash of its key.
    fn route_hash(&self) -> u128;
    /// Whether it spends (an unanswered spend is outcome-unknown).
    fn spends(&self) -> bool;
    /// As an [`Op`] (the seldom paths: its group could not answer).
    fn to_op(&self) -> Op;
}

impl BatchOp for Op {
    #[inline]
    fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
        Op::encode(self, w, buf, request_id);
    }

    fn route_hash(&self) -> u128 {
        Op::route_hash(self)
    }

    fn spends(&self) -> bool {
        Op::spends(self)
    }

    fn to_op(&self) -> Op {
        self.clone()
    }
}

impl BatchOp for CellByHash {
    #[inline]
    fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
        let hash = Op::hash_whole(self.hash);
        sluice_protocol::message::put_cell_hashed(
            w,
            buf,
            request_id,
            hash,
            &self.policy,
            self.quantity,
        );
    }

    fn route_hash(&self) -> u128 {
        Op::hash_whole(self.hash)
    }

    fn spends(&self) -> bool {
        self.quantity > 0
    }

    fn to_op(&self) -> Op {
        Op::from(*self)
    }
}

impl Op {
    /// `hash` as [`Op::CellByHash`] keeps it.
    #[inline]
    pub fn hash_halves(hash: u128) -> [u64; 2] {
        [hash as u64, (hash >> 64) as u64]
    }

    /// What [`Op::hash_halves`] made `halves` of.
    #[inline]
    fn hash_whole(halves: [u64; 2]) -> u128 {
        u128::from(halves[0]) | u128::from(halves[1]) << 64
    }

    /// The routing hash of the key decided (what [`Op::CellByHash`]
    /// carries; the others' key hashed).
    pub fn route_hash(&self) -> u128 {
        match self {
            Op::CellByHash { hash, .. } => Op::hash_whole(*hash),
            op => sluice_protocol::routing::key_hash(op.key()),
        }
    }
}

impl Op {
    /// The key decided; empty for [`Op::CellByHash`] (see
    /// [`Op::route_hash`]).
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Throttle { key, .. }
            | Op::Decide { key, .. }
            | Op::Lease { key, .. }
            | Op::Cell { key, .. } => key,
            Op::CellByHash { .. } => &[],
        }
    }

    /// Whether the store may change something: such a call, once sent and
    /// unanswered, is outcome-unknown and never resent.
    pub fn spends(&self) -> bool {
        match self {
            Op::Throttle { peek, .. } => !peek,
            Op::Decide { mode, .. } => *mode != Mode::Probe,
            Op::Lease { .. } => true,
            Op::Cell { quantity, .. } | Op::CellByHash { quantity, .. } => *quantity > 0,
        }
    }

    /// Appends this op as one request message. A CELL (the forwarded
    /// CL.THROTTLE's op) is written with no dispatch over every request
    /// kind.
    #[inline]
    fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
        match self {
            Op::CellByHash {
                hash,
                policy,
                quantity,
            } => {
                let hash = Op::hash_whole(*hash);
                sluice_protocol::message::put_cell_hashed(
                    w, buf, request_id, hash, policy, *quantity,
                );
            }
            Op::Cell {
                key,
                policy,
                quantity,
            } => {
                let cell = sluice_protocol::message::Cell {
                    key,
                    policy: *policy,
                    quantity: *quantity,
                    hash: None,
                };
                sluice_protocol::message::put_cell(w, buf, request_id, &cell);
            }
            op => op.request().encode(w, buf, request_id),
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
                hash: None,
            }),
            Op::CellByHash {
                hash,
                policy,
                quantity,
            } => Request::Cell(sluice_protocol::message::Cell {
                key: &[],
                policy: *policy,
                quantity: *quantity,
                hash: Some(Op::hash_whole(*hash)),
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

/// A batch as its connections see it: the ops they encode, and where the
/// replies they read go.
pub(crate) trait Sink: Send + Sync + std::fmt::Debug {
    /// How many ops it has.
    fn op_count(&self) -> usize;

    /// Appends ops `items` as request messages, op `items[k]` under
    /// request id `first + k` (one call through the `dyn Sink` for a
    /// run, not one an op).
    fn encode_items(&self, items: &[u32], w: &mut FrameWriter, buf: &mut BytesMut, first: u32);

    /// Each op's shard on a node of `shard_count` shards, in order.
    fn shards(&self, shard_count: u16) -> Vec<usize>;

    /// Gives ops their replies, `(index, reply)`, drained from `staged`
    /// (the first reply given an op counts).
    fn complete_many(&self, staged: &mut Staged);
}

/// Replies read for one run of a batch, given to it a few at a time
/// (STAGED_MAX). A CELL_OK (the reply to a forwarded CL.THROTTLE) is kept
/// apart as its verdict: 48 bytes with its index, where a `Result<Reply,
/// Error>` is 88, and no `Reply` is matched and wrapped on its way.
#[derive(Debug, Default)]
pub(crate) struct Staged {
    /// By op index: any reply (or the error it was).
    pub(crate) replies: Vec<(u32, Result<Reply, Error>)>,
    /// By op index: a CELL_OK's verdict.
    pub(crate) cells: Vec<(u32, sluice_protocol::cell::CellVerdict)>,
}

impl Staged {
    /// `replies`, none of them staged as a verdict.
    #[cfg(test)]
    fn of(replies: Vec<(u32, Result<Reply, Error>)>) -> Staged {
        Staged {
            replies,
            cells: Vec::new(),
        }
    }

    /// How many replies are staged.
    fn len(&self) -> usize {
        self.replies.len() + self.cells.len()
    }
}

/// Ops sent together, whose replies are gathered in place: one
/// completion for the whole batch, not a channel and a timer per call.
/// Each reply becomes its op's answer as it comes (`answer`, a `T`),
/// so the batch's answers are written once: replies kept as they came
/// and turned into answers afterwards were one more pass over the batch,
/// a cache miss per op on a forwarding node (benches/notes.md).
pub(crate) struct Batch<O, T, F> {
    /// In the caller's order.
    pub(crate) ops: Vec<O>,
    /// An op's answer from its reply.
    answer: F,
    /// By op: its answer, or why it has none.
    replies: Mutex<Slots<T>>,
    /// Ops still without a reply.
    left: AtomicUsize,
    /// Woken when `left` reaches 0.
    done: tokio::sync::Notify,
}

impl<O, T, F> std::fmt::Debug for Batch<O, T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("ops", &self.ops.len())
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

/// How a [`Batch`] makes an op's answer from its reply: any function of
/// the op and its reply does; a CELL_OK's verdict may be taken apart (a
/// forwarding node's most frequent reply), with no [`Reply`] made for it.
pub(crate) trait MakeAnswer<O, T> {
    /// Op `op`'s answer from `reply`.
    fn reply(&self, op: &O, reply: Reply) -> T;

    /// Op `op`'s answer from a CELL_OK of verdict `v`.
    #[inline]
    fn cell(&self, op: &O, v: sluice_protocol::cell::CellVerdict) -> T {
        self.reply(op, Reply::Cell(v))
    }
}

impl<O, T, F: Fn(&O, Reply) -> T> MakeAnswer<O, T> for F {
    #[inline]
    fn reply(&self, op: &O, reply: Reply) -> T {
        self(op, reply)
    }
}

impl<O, T, F> Batch<O, T, F>
where
    F: MakeAnswer<O, T>,
{
    pub(crate) fn new(ops: Vec<O>, answer: F) -> Arc<Batch<O, T, F>> {
        let n = ops.len();
        Arc::new(Batch {
            replies: Mutex::new(Slots {
                dense: Vec::with_capacity(n),
                sparse: None,
                answered: 0,
                failed: Vec::new(),
                taken: false,
            }),
            left: AtomicUsize::new(n),
            done: tokio::sync::Notify::new(),
            answer,
            ops,
        })
    }

    /// Resolves once every op has its reply.
    pub(crate) async fn finished(&self) {
        while self.left.load(Ordering::Acquire) > 0 {
            self.done.notified().await;
        }
    }

    /// The answers so far, by op; later replies are dropped.
    pub(crate) fn take(&self) -> Taken<T> {
        let n = self.ops.len();
        let mut slots = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        // A reply that comes after this finds no slot and is dropped.
        slots.taken = true;
        let dense = std::mem::take(&mut slots.dense);
        let sparse = slots.sparse.take();
        let failed = std::mem::take(&mut slots.failed);
        let answered = slots.answered;
        drop(slots);
        let mut answers = match sparse {
            // Every op answered, in order (one connection's replies): as
            // they are.
            None if dense.len() == n => return Taken::whole(dense, failed),
            // Every op answered, out of order (replies from several shard
            // connections interleave): unwrapped in place.
            Some(answers) if answered == n => {
                let all = answers.into_iter().map(|a| a.expect("answered"));
                return Taken::whole(all.collect(), failed);
            }
            None => dense.into_iter().map(Some).collect(),
            Some(answers) => answers,
        };
        answers.resize_with(n, || None);
        Taken {
            all: None,
            answers,
            answered,
            failed,
        }
    }
}

impl<O, T, F> Sink for Batch<O, T, F>
where
    O: BatchOp,
    T: Send,
    F: MakeAnswer<O, T> + Send + Sync,
{
    fn op_count(&self) -> usize {
        self.ops.len()
    }

    fn encode_items(&self, items: &[u32], w: &mut FrameWriter, buf: &mut BytesMut, first: u32) {
        for (k, &i) in items.iter().enumerate() {
            self.ops[i as usize].encode(w, buf, first + k as u32);
        }
    }

    fn shards(&self, shard_count: u16) -> Vec<usize> {
        let of = |op: &O| shard_of(op.route_hash(), shard_count);
        self.ops.iter().map(|op| usize::from(of(op))).collect()
    }

    fn complete_many(&self, staged: &mut Staged) {
        let n = self.ops.len();
        let mut slots = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        let mut filled = 0;
        for (index, v) in staged.cells.drain(..) {
            let index = index as usize;
            if !slots.open(index, n) {
                continue;
            }
            filled += 1;
            slots.answer(index, self.answer.cell(&self.ops[index], v));
        }
        for (index, reply) in staged.replies.drain(..) {
            let index = index as usize;
            if !slots.open(index, n) {
                continue;
            }
            filled += 1;
            match reply {
                Ok(reply) => slots.answer(index, self.answer.reply(&self.ops[index], reply)),
                Err(e) => slots.fail(index, n, e),
            }
        }
        drop(slots);
        if filled > 0 && self.left.fetch_sub(filled, Ordering::AcqRel) == filled {
            self.done.notify_one();
        }
    }
}

/// A batch's answers when [`Batch::take`] came.
#[derive(Debug)]
pub(crate) struct Taken<T> {
    /// Every op's answer, by op, when every op has one; then `answers` is
    /// empty.
    pub(crate) all: Option<Vec<T>>,
    /// By op, when not every op has an answer: its answer, if its reply
    /// came.
    pub(crate) answers: Vec<Option<T>>,
    /// How many ops have an answer.
    pub(crate) answered: usize,
    /// By op (empty if none failed): why its reply was an error.
    pub(crate) failed: Vec<Option<Error>>,
}

impl<T> Taken<T> {
    /// Every op answered: `all`, by op.
    fn whole(all: Vec<T>, failed: Vec<Option<Error>>) -> Taken<T> {
        Taken {
            answered: all.len(),
            all: Some(all),
            answers: Vec::new(),
            failed,
        }
    }
}

/// A batch's answers, by op. Written as they come rather than made all
/// `None` first: replies come in request order, so the vector mostly
/// grows at its end, and a batch's slots are written once, not twice
/// (each pass over a batch's slots was a cache miss per op on a
/// forwarding node: benches/notes.md). While every reply has come in
/// order the answers are kept as they are (`dense`), so a batch answered
/// in full is handed over with no pass that unwraps each one.
#[derive(Debug)]
struct Slots<T> {
    /// While every reply so far came in order, after every earlier op's:
    /// the answers of ops `0..dense.len()`.
    dense: Vec<T>,
    /// Once one came out of order, or after an op that failed (seldom):
    /// by op index, `dense` moved in first; ops past the end have none.
    sparse: Option<Vec<Option<T>>>,
    /// How many ops have an answer.
    answered: usize,
    /// By op index, once one failed (seldom: made then): the error its
    /// connection gave it.
    failed: Vec<Option<Error>>,
    /// [`Batch::take`] came: later replies are dropped.
    taken: bool,
}

impl<T> Slots<T> {
    /// Whether op `index` (of `n`) may take a reply: it has none, and the
    /// answers were not taken.
    #[inline]
    fn open(&self, index: usize, n: usize) -> bool {
        let unanswered = match &self.sparse {
            None => index >= self.dense.len(),
            Some(answers) => answers.get(index).map_or(true, Option::is_none),
        };
        !self.taken
            && index < n
            && unanswered
            && self.failed.get(index).map_or(true, Option::is_none)
    }

    /// Op `index`'s answer (after [`Slots::open`]).
    #[inline]
    fn answer(&mut self, index: usize, answer: T) {
        if self.sparse.is_none() && index == self.dense.len() {
            self.dense.push(answer);
        } else {
            self.answer_sparse(index, answer);
        }
        self.answered += 1;
    }

    /// [`Slots::answer`] out of order, or past a gap.
    #[cold]
    fn answer_sparse(&mut self, index: usize, answer: T) {
        let dense = &mut self.dense;
        let answers = self
            .sparse
            .get_or_insert_with(|| std::mem::take(dense).into_iter().map(Some).collect());
        if index >= answers.len() {
            // A gap (its replies come later, or never).
            answers.resize_with(index + 1, || None);
        }
        answers[index] = Some(answer);
    }

    /// Op `index`'s error, of `n` ops (after [`Slots::open`]).
    #[cold]
    fn fail(&mut self, index: usize, n: usize, e: Error) {
        if self.failed.is_empty() {
            self.failed.resize_with(n, || None);
        }
        self.failed[index] = Some(e);
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
    Batch {
        batch: Arc<dyn Sink>,
        items: Vec<u32>,
    },
}

/// Ops of a batch sent under consecutive request ids: `first` is op
/// `items[0]`'s, `first + k` op `items[k]`'s. One entry for a frame's
/// worth of a batch's ops, where one map entry (and one `Arc` of the
/// batch) per op was most of a forwarding node's bookkeeping.
#[derive(Debug)]
struct Run {
    first: u32,
    batch: Arc<dyn Sink>,
    items: Vec<u32>,
    /// Replies still to come.
    left: usize,
}

/// Callers waiting for replies.
#[derive(Debug, Default)]
struct Waiting {
    /// Single calls, by request id.
    one: HashMap<u32, oneshot::Sender<Result<Reply, Error>>, BuildHasherDefault<IdHasher>>,
    /// Batches' runs, in the order sent (so replies, which come in
    /// request order, mostly find theirs at the front).
    runs: std::collections::VecDeque<Run>,
}

impl Waiting {
    /// The run that request id `id` belongs to (its first id), and the
    /// op's index in its batch.
    #[inline]
    fn run_of(&self, id: u32) -> Option<(u32, u32)> {
        // Mostly the oldest run's: looked at first, with no iterator.
        let at = |run: &Run| {
            let k = id.wrapping_sub(run.first) as usize;
            (k < run.items.len()).then(|| (run.first, run.items[k]))
        };
        match self.runs.front().and_then(at) {
            Some(found) => Some(found),
            None => self.runs.iter().skip(1).find_map(at),
        }
    }

    /// Gives `staged` to the batch of the run whose first id is `first`,
    /// under one lock; a run all answered goes.
    fn answer(&mut self, first: u32, staged: &mut Staged) {
        let Some(at) = self.runs.iter().position(|r| r.first == first) else {
            staged.replies.clear();
            staged.cells.clear();
            return;
        };
        let n = staged.len();
        let run = &mut self.runs[at];
        run.batch.complete_many(staged);
        run.left = run.left.saturating_sub(n);
        if run.left == 0 {
            self.runs.remove(at);
        }
    }
}

/// Callers waiting for replies, by request id.
type Pending = Arc<Mutex<Waiting>>;

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
    pub fn send_batch(&self, batch: &Arc<dyn Sink>, items: Vec<u32>) {
        let queued = Queued::Batch {
            batch: batch.clone(),
            items,
        };
        if let Err(mpsc::error::SendError(Queued::Batch { batch, items })) = self.tx.send(queued) {
            fail_items(&*batch, &items, || Error::Disconnected);
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
    let mut rbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
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
            for q in calls.drain(..) {
                match q {
                    Queued::One { call, reply } => {
                        let request_id = next(&mut next_id);
                        call.encode(&mut w, &mut buf, request_id);
                        pending.one.insert(request_id, reply);
                    }
                    Queued::Batch { batch, items } if items.is_empty() => drop(batch),
                    Queued::Batch { batch, items } => {
                        let first = run_ids(&mut next_id, items.len() as u32);
                        batch.encode_items(&items, &mut w, &mut buf, first);
                        pending.runs.push_back(Run {
                            first,
                            batch,
                            left: items.len(),
                            items,
                        });
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
    let mut replies = Staged {
        replies: Vec::with_capacity(STAGED_MAX),
        cells: Vec::with_capacity(STAGED_MAX),
    };
    // The largest frame read so far.
    let mut biggest = 0;
    'read: loop {
        loop {
            let buffered = rbuf.len();
            let frame = match decoder.decode(&mut rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'read fatal = Some((0, e.to_string())),
            };
            biggest = biggest.max(buffered - rbuf.len());
            let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
            // A run's replies in this frame, given to its batch a few at
            // a time (STAGED_MAX).
            let mut staged: Option<u32> = None;
            for (h, p) in frame.messages() {
                if h.op == sluice_protocol::message::op::CELL_OK {
                    // A forwarded CL.THROTTLE's (most replies an entry node
                    // reads): staged as its verdict.
                    let at =
                        parse_cell_ok(p).and_then(|v| Some((pending.run_of(h.request_id)?, v)));
                    if let Some(((first, index), v)) = at {
                        if staged != Some(first) || replies.len() == STAGED_MAX {
                            flush(&mut pending, &mut staged, &mut replies);
                            staged = Some(first);
                        }
                        replies.cells.push((index, v));
                        continue;
                    }
                }
                let Some(reply) = Reply::parse(h, p) else {
                    flush(&mut pending, &mut staged, &mut replies);
                    break 'read fatal = Some((0, format!("unreadable reply op {:#04x}", h.op)));
                };
                if h.request_id == 0 {
                    if let Reply::Error { code, text } = reply {
                        fatal = Some((code, text));
                    }
                    continue;
                }
                let reply = match reply {
                    Reply::Error { code, text } => Err(Error::server(code, text)),
                    other => Ok(other),
                };
                if let Some((first, index)) = pending.run_of(h.request_id) {
                    if staged != Some(first) || replies.len() == STAGED_MAX {
                        flush(&mut pending, &mut staged, &mut replies);
                        staged = Some(first);
                    }
                    replies.replies.push((index, reply));
                } else if let Some(tx) = pending.one.remove(&h.request_id) {
                    let _ = tx.send(reply);
                }
            }
            flush(&mut pending, &mut staged, &mut replies);
        }
        let room = read_room(biggest);
        if rbuf.capacity() - rbuf.len() < room / 4 {
            rbuf.reserve(room);
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

/// The request id after `id` (0 is reserved for connection-level errors).
fn next(id: &mut u32) -> u32 {
    *id = id.wrapping_add(1).max(1);
    *id
}

/// The first of `n` consecutive request ids after `id`, and `id` moved to
/// the last: a run that would pass `u32::MAX` starts again at 1 (ids wrap
/// there anyway; 0 is never one).
fn run_ids(id: &mut u32, n: u32) -> u32 {
    if id.checked_add(n).is_none() {
        *id = 0;
    }
    let first = *id + 1;
    *id += n;
    first
}

/// Gives the replies staged for the run whose first id is `staged` to its
/// batch.
fn flush(pending: &mut Waiting, staged: &mut Option<u32>, replies: &mut Staged) {
    if let Some(first) = staged.take() {
        pending.answer(first, replies);
    }
}

fn fail_all(pending: &Pending, err: impl Fn() -> Error) {
    let waiting = std::mem::take(&mut *pending.lock().unwrap_or_else(|e| e.into_inner()));
    for (_, tx) in waiting.one {
        let _ = tx.send(Err(err()));
    }
    for run in waiting.runs {
        // Ops answered already keep their replies (the first counts).
        fail_items(&*run.batch, &run.items, &err);
    }
}

/// Ops `items` of `batch` answered `err()`.
pub(crate) fn fail_items(batch: &dyn Sink, items: &[u32], err: impl Fn() -> Error) {
    let mut staged = Staged {
        replies: items.iter().map(|&i| (i, Err(err()))).collect(),
        cells: Vec::new(),
    };
    batch.complete_many(&mut staged);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_ids_is_consecutive_never_zero_and_wraps_whole() {
        let mut id = 0;
        assert_eq!(run_ids(&mut id, 3), 1);
        assert_eq!(id, 3);
        assert_eq!(next(&mut id), 4);
        // Up to u32::MAX exactly fits; one more starts again at 1.
        id = u32::MAX - 3;
        assert_eq!(run_ids(&mut id, 3), u32::MAX - 2);
        assert_eq!(id, u32::MAX);
        assert_eq!(run_ids(&mut id, 2), 1);
        assert_eq!(id, 2);
        id = u32::MAX - 1;
        assert_eq!(run_ids(&mut id, 5), 1, "a run never spans the wrap");
        assert_eq!(next(&mut { u32::MAX }), 1, "0 is never an id");
    }

    #[test]
    fn a_readers_room_follows_its_largest_frame_within_bounds() {
        assert_eq!(
            read_room(0),
            READ_BUFFER_BYTES,
            "small frames: the small buffer"
        );
        assert_eq!(read_room(10_000), 40_000);
        assert_eq!(read_room(1 << 20), READ_ROOM_MAX, "never past the cap");
        assert_eq!(read_room(usize::MAX), READ_ROOM_MAX);
    }

    /// A batch answered in full is handed over whole, whatever the order
    /// its replies came in (several shard connections interleave theirs).
    #[test]
    fn a_batch_answered_in_full_is_handed_over_whole_in_op_order() {
        for order in [[0u32, 1, 2, 3], [1, 0, 3, 2], [3, 2, 1, 0]] {
            let batch = Batch::new(ops(4), |op: &Op, _: Reply| op.key().to_vec());
            for i in order {
                batch.complete_many(&mut Staged::of(vec![(i, Ok(Reply::Pong))]));
            }
            let taken = batch.take();
            let all = taken.all.expect("every op answered");
            assert_eq!(all, [b"k0", b"k1", b"k2", b"k3"], "{order:?}");
            assert!(taken.answers.is_empty());
            assert_eq!(taken.answered, 4);
        }
        // One op short: by op, with a hole.
        let batch = Batch::new(ops(3), |op: &Op, _: Reply| op.key().to_vec());
        for i in [0, 2] {
            batch.complete_many(&mut Staged::of(vec![(i, Ok(Reply::Pong))]));
        }
        let taken = batch.take();
        assert!(taken.all.is_none());
        let got: Vec<bool> = taken.answers.iter().map(Option::is_some).collect();
        assert_eq!(got, [true, false, true]);
    }

    /// Runs a read loop whose one run is `batch`'s `n` ops (request ids
    /// 1 ..= n), over a socket that `frame` is then written to; the
    /// socket's other end, kept open.
    async fn read_loop_given(batch: Arc<dyn Sink>, n: u32, frame: &[u8]) -> TcpStream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, server) = tokio::join!(client, listener.accept());
        let (read, _write) = client.unwrap().into_split();
        let (mut server, _) = server.unwrap();
        let pending: Pending = Arc::default();
        pending.lock().unwrap().runs.push_back(Run {
            first: 1,
            batch,
            items: (0..n).collect(),
            left: n as usize,
        });
        let decoder = FrameDecoder::default();
        tokio::spawn(read_loop(read, BytesMut::new(), decoder, pending));
        server.write_all(frame).await.unwrap();
        server
    }

    /// The read loop stages a CELL_OK as its verdict, beside the other
    /// replies of its run; each op gets its own, whatever came between
    /// (an error, another kind of reply), and a CELL_OK that is not a
    /// valid one ends the connection as any unreadable reply does.
    #[tokio::test]
    async fn cell_oks_are_staged_as_verdicts_beside_the_other_replies() {
        use sluice_protocol::cell::CellVerdict;
        use sluice_protocol::message::{put_cell_ok, put_error, put_pong};
        use sluice_protocol::Status;
        let verdict = |remaining| CellVerdict {
            limited: false,
            limit: 5,
            remaining,
            retry_after_ns: -1,
            reset_after_ns: 0,
        };
        let batch = Batch::new(ops(5), |_: &Op, reply: Reply| match reply {
            Reply::Cell(v) => Some(v.remaining),
            _ => None,
        });
        let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
        put_cell_ok(&mut w, &mut buf, 1, &verdict(4));
        put_error(&mut w, &mut buf, 2, Status::NotPrimary, "moved");
        put_cell_ok(&mut w, &mut buf, 3, &verdict(2));
        put_pong(&mut w, &mut buf, 4);
        put_cell_ok(&mut w, &mut buf, 5, &verdict(1));
        w.finish(&mut buf);
        let done = batch.done.notified();
        let _server = read_loop_given(batch.clone(), 5, &buf).await;
        let ten = Duration::from_secs(10);
        tokio::time::timeout(ten, done).await.expect("answered");
        let taken = batch.take();
        let answers: Vec<Option<Option<i64>>> = match taken.all {
            Some(all) => all.into_iter().map(Some).collect(),
            None => taken.answers,
        };
        let want = [
            Some(Some(4)),
            None,
            Some(Some(2)),
            Some(None),
            Some(Some(1)),
        ];
        assert_eq!(answers, want);
        let failed = taken.failed.get(1).and_then(|e| e.as_ref()?.status());
        assert_eq!(failed, Some(Status::NotPrimary));
        // A CELL_OK whose reserved bytes are not zero is unreadable: the
        // connection's waiting ops fail.
        let batch = Batch::new(ops(1), |_: &Op, _: Reply| ());
        let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
        put_cell_ok(&mut w, &mut buf, 1, &verdict(4));
        w.finish(&mut buf);
        let bad = buf.len() - 40 + 3;
        buf[bad] = 1;
        let done = batch.done.notified();
        let _server = read_loop_given(batch.clone(), 1, &buf).await;
        tokio::time::timeout(ten, done).await.expect("failed");
        let taken = batch.take();
        assert!(
            matches!(taken.failed.first(), Some(Some(Error::Protocol(_)))),
            "{:?}",
            taken.failed
        );
    }

    #[test]
    fn a_batchs_slots_keep_the_first_reply_and_none_after_take() {
        let remaining = |v| {
            Ok(Reply::Throttle(sluice_protocol::Verdict {
                remaining: v,
                ..Default::default()
            }))
        };
        // An answer is made from its op and reply as the reply comes.
        let batch = Batch::new(ops(5), |op: &Op, reply: Reply| match reply {
            Reply::Throttle(v) => (op.key().to_vec(), v.remaining),
            _ => unreachable!(),
        });
        let give = |index: u32, reply| batch.complete_many(&mut Staged::of(vec![(index, reply)]));
        give(0, remaining(10));
        give(2, remaining(12)); // past the end: the gap waits
        give(1, Err(Error::server(11, String::new()))); // the gap failed
        give(1, remaining(99)); // the first reply counts
        give(0, remaining(99)); // ... an answer's too
        give(5, remaining(99)); // no such op
        assert_eq!(batch.left.load(Ordering::Relaxed), 2);
        let taken = batch.take();
        give(3, remaining(13)); // taken: too late
        assert_eq!(batch.left.load(Ordering::Relaxed), 2);
        let got: Vec<Option<u64>> = taken
            .answers
            .iter()
            .map(|a| a.as_ref().map(|a| a.1))
            .collect();
        assert_eq!(got, [Some(10), None, Some(12), None, None]);
        assert_eq!(taken.answers[0].as_ref().unwrap().0, b"k0");
        assert_eq!(taken.answered, 2);
        let failed: Vec<Option<u16>> = taken
            .failed
            .iter()
            .map(|e| match e {
                Some(Error::Server { code, .. }) => Some(*code),
                _ => None,
            })
            .collect();
        assert_eq!(failed, [None, Some(11), None, None, None]);
    }

    /// A CELL op goes with its key; a CELL by hash with the hash in place
    /// of the key, flagged so.
    #[test]
    fn a_cell_by_hash_goes_with_the_hash_in_place_of_the_key() {
        let frame = |op: &Op| {
            let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
            op.encode(&mut w, &mut buf, 5);
            w.finish(&mut buf);
            let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
            let (h, p) = frame.messages().next().unwrap();
            (h.flags, p.to_vec())
        };
        let keyed = &ops(1)[0];
        let (flags, p) = frame(keyed);
        assert_eq!(flags, 0);
        assert_eq!(&p[sluice_protocol::message::CELL_FIXED_BYTES..], b"k0");
        let hash = sluice_protocol::routing::key_hash(b"k0");
        let by_hash = Op::CellByHash {
            hash: Op::hash_halves(hash),
            policy: sluice_protocol::cell::CellPolicy::new(1, 1, 1).unwrap(),
            quantity: 1,
        };
        assert_eq!((by_hash.route_hash(), keyed.route_hash()), (hash, hash));
        let (flags, p) = frame(&by_hash);
        assert_eq!(flags, sluice_protocol::message::CELL_KEY_HASH);
        assert_eq!(sluice_protocol::message::cell_hash_at(&p), hash);
        // The same bytes as the request it is.
        let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
        by_hash.request().encode(&mut w, &mut buf, 5);
        w.finish(&mut buf);
        let frame2 = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(frame2.messages().next().unwrap().1, &p[..]);
    }

    fn ops(n: usize) -> Vec<Op> {
        (0..n)
            .map(|i| Op::Cell {
                key: bytes::Bytes::from(format!("k{i}")),
                policy: sluice_protocol::cell::CellPolicy::new(1, 1, 1).unwrap(),
                quantity: 1,
            })
            .collect()
    }

    #[test]
    fn replies_find_their_run_and_a_run_answered_goes() {
        let batch = Batch::new(ops(10), |_: &Op, _: Reply| ());
        let sink: Arc<dyn Sink> = batch.clone();
        let mut w = Waiting::default();
        w.runs.push_back(Run {
            first: 10,
            batch: sink.clone(),
            items: vec![4, 7, 9],
            left: 3,
        });
        w.runs.push_back(Run {
            first: 13,
            batch: sink.clone(),
            items: vec![0],
            left: 1,
        });
        assert_eq!(w.run_of(9), None);
        assert_eq!(w.run_of(10), Some((10, 4)));
        assert_eq!(w.run_of(12), Some((10, 9)));
        assert_eq!(w.run_of(13), Some((13, 0)));
        assert_eq!(w.run_of(14), None);
        let reply = || Err(Error::Disconnected);
        // The second run answered first (the first is then at index 1:
        // found by its first id, not by where it stood).
        w.answer(13, &mut Staged::of(vec![(0, reply())]));
        assert_eq!(w.runs.len(), 1);
        w.answer(10, &mut Staged::of(vec![(4, reply()), (7, reply())]));
        assert_eq!(w.runs.len(), 1);
        w.answer(10, &mut Staged::of(vec![(9, reply())]));
        assert!(w.runs.is_empty(), "all four answered");
        assert_eq!(w.run_of(11), None);
        // Each op's reply landed once, in its slot.
        let got = batch.take().failed;
        let answered: Vec<usize> = (0..10).filter(|&i| got[i].is_some()).collect();
        assert_eq!(answered, vec![0, 4, 7, 9]);
    }

    /// A forwarding node's batch of CELLs by hash is 48 bytes an op with
    /// nothing to drop: what spares it the passes an `Op` batch costs
    /// (benches/notes.md, stop 61).
    #[test]
    fn a_cell_by_hash_is_small_and_owns_nothing() {
        assert_eq!(std::mem::size_of::<CellByHash>(), 48);
        assert!(!std::mem::needs_drop::<CellByHash>());
        assert!(std::mem::needs_drop::<Op>(), "an op may own its key");
    }
}
