//! A shard's ground floor: its [`Table`] of buckets (one per thread,
//! touched by that thread only) and the types of a decision on it: what a
//! request asks of the shard that owns its key ([`Op`]; several for one
//! shard travel as a [`Batch`]) and the answer ([`Outcome`]), and the
//! counters a shard publishes for STATS ([`PublishedStats`]). Also the
//! node-wide connection count a connection holds its place in
//! ([`ConnectionGuard`]).
//!
//! Everything else a shard thread runs sits above this module and imports
//! it, never the other way (docs/ARCHITECTURE.md, "Layering"): the thread
//! and the messages it takes (`worker`), what the node's shards and one
//! shard's tasks share (`node`: `Node`, `ShardCore`), the connections and
//! the coordinator, replication, snapshots, forwarding. This module imports
//! only leaves below it (`inbox`, `signal`, `sync`) and the protocol
//! crate.

pub mod bucket_map;
mod changes;
mod fold;
pub mod over_limit;
pub mod table;
pub mod tat;

use std::ops::Range;

use sluice_protocol::cell::{CellPolicy, CellVerdict};
use sluice_protocol::gcra::Verdict;
use sluice_protocol::limit::{Concurrency, Limit};
use sluice_protocol::message::ShardStats;
use sluice_protocol::{Policy, Status};

use crate::inbox::Sender;
use crate::sync::{Arc, AtomicU64, AtomicUsize, Mutex, Ordering};
pub use table::{LimitRef, LimitVerdict, Mode, MultiVerdict, Table};

/// What a request asks of the shard that owns its key.
#[derive(Clone, Debug)]
pub enum Op {
    /// Protocol v1 THROTTLE: spend `cost` units.
    Throttle {
        /// The limit.
        policy: Policy,
        /// Units to spend.
        cost: u64,
    },
    /// Protocol v1 PEEK: answer as THROTTLE would, change nothing.
    Peek {
        /// The limit.
        policy: Policy,
        /// Units to ask about.
        cost: u64,
    },
    /// redis-cell's CL.THROTTLE: spend `quantity` units (0 peeks).
    Cell {
        /// The limit, in redis-cell's terms.
        policy: CellPolicy,
        /// Units to spend.
        quantity: u64,
    },
    /// DECIDE: several limits of one key, resolved (boxed: it is large and
    /// only forwarded for clients that are not shard-aware).
    Decide(Box<DecideOp>),
    /// RELEASE a concurrency lease.
    Release {
        /// The concurrency limit's bucket.
        bucket: u128,
        /// Its numbers.
        limit: Concurrency,
        /// The lease.
        lease_id: u64,
    },
    /// RENEW a concurrency lease.
    Renew {
        /// The concurrency limit's bucket.
        bucket: u128,
        /// Its numbers.
        limit: Concurrency,
        /// The lease.
        lease_id: u64,
    },
}

impl Op {
    /// Whether deciding it may change the table: what a node that may not
    /// admit (a follower, a fenced or stale primary) refuses.
    pub fn changes(&self) -> bool {
        match self {
            Op::Peek { .. } => false,
            Op::Decide(d) => d.mode != Mode::Probe,
            Op::Throttle { .. } | Op::Cell { .. } | Op::Release { .. } | Op::Renew { .. } => true,
        }
    }
}

/// A DECIDE with its limits resolved to buckets ([`DecideOp::EMPTY`]
/// filled in by `ShardCore::resolve`).
#[derive(Clone, Copy, Debug)]
pub struct DecideOp {
    /// What to do.
    pub mode: Mode,
    /// Units.
    pub cost: u64,
    /// Limits in use.
    pub count: u8,
    /// The request's class (each limit's floor for it is in its ref).
    pub priority: sluice_protocol::Priority,
    /// The limits, in request order.
    pub refs: [LimitRef; table::LIMITS_MAX],
}

impl DecideOp {
    /// No limits yet.
    pub const EMPTY: DecideOp = DecideOp {
        mode: Mode::Probe,
        cost: 0,
        count: 0,
        priority: sluice_protocol::Priority::Normal,
        refs: [LimitRef {
            bucket: 0,
            limit: Limit::Concurrency(sluice_protocol::Concurrency {
                limit: 1,
                lease_ns: sluice_protocol::limit::LEASE_NS_MIN,
            }),
            floor: 0,
        }; table::LIMITS_MAX],
    };
}

/// The owning shard's answer to an [`Op`].
#[derive(Clone, Debug)]
pub enum Outcome {
    /// For THROTTLE and PEEK.
    Verdict(Verdict),
    /// For CL.THROTTLE.
    Cell(CellVerdict),
    /// For DECIDE.
    Multi(Box<MultiVerdict>),
    /// For RELEASE and RENEW.
    Lease(LimitVerdict),
    /// For FAILOVER (answered by a task of the connection's own shard).
    Failover(Result<sluice_protocol::replication::FailoverOk, String>),
    /// The request was refused (KEYS_FULL, LEASE_NOT_FOUND).
    Refused(Status),
    /// A request forwarded to another node failed there or on the way
    /// (GROUP_UNAVAILABLE, OUTCOME_UNKNOWN, or the owner's own error), with
    /// the text to pass on.
    Failed(Status, String),
    /// For a RELEASE or RENEW another node answered (with its lease's
    /// remaining life).
    LeaseOk(sluice_protocol::message::LeaseOk),
}

/// One forwarded request.
#[derive(Clone, Debug)]
pub struct FwdItem {
    /// The connection's sequence number for ordering the reply.
    pub seq: u64,
    /// The key's 128-bit hash.
    pub key: u128,
    /// What to do with the key's bucket.
    pub op: Op,
}

/// A connection's requests for one other shard, sent as one message.
#[derive(Debug)]
pub struct Batch {
    /// Where the verdicts go.
    pub reply_to: Sender<BatchReply>,
    /// The requests, in the connection's order.
    pub items: Vec<FwdItem>,
}

/// The answers to one [`Batch`], as `(seq, outcome)`, in the batch's order.
#[derive(Debug)]
pub struct BatchReply(Answers);

/// A [`BatchReply`]'s answers.
#[derive(Debug)]
enum Answers {
    /// Its own.
    Own(Vec<(u64, Outcome)>),
    /// (A shard never sends one.) The answers `range` of requests an entry
    /// point forwarded together for several connections: each connection
    /// takes its own in place, where a vector made for each was one more
    /// write of every answer on a forwarding node, and a cache miss each.
    Shared(Arc<SharedAnswers>, Range<usize>),
}

/// Answers made for several connections at once (see
/// [`BatchReply::shared`]): request `i`'s sequence number in its
/// connection and its outcome.
#[derive(Debug)]
pub struct SharedAnswers {
    seqs: Vec<u64>,
    outcomes: Mutex<Vec<Kept>>,
}

/// An outcome as [`SharedAnswers`] keeps it until its connection takes
/// it: a verdict in place, anything else boxed, so 48 bytes where an
/// [`Outcome`] is 72 (a forwarding node writes one per forwarded request).
#[derive(Debug)]
pub enum Kept {
    /// [`Outcome::Cell`].
    Cell(CellVerdict),
    /// [`Outcome::Verdict`].
    Verdict(Verdict),
    /// Any other outcome.
    Other(Box<Outcome>),
    /// Taken by its connection.
    Taken,
}

impl Kept {
    /// Keeps `outcome`.
    #[inline]
    pub fn new(outcome: Outcome) -> Kept {
        match outcome {
            Outcome::Cell(v) => Kept::Cell(v),
            Outcome::Verdict(v) => Kept::Verdict(v),
            other => Kept::Other(Box::new(other)),
        }
    }

    /// The outcome kept. A verdict is copied out and left in place (it
    /// owns nothing: no write to the answers' memory an answer); anything
    /// else is moved out, leaving [`Kept::Taken`].
    #[inline]
    fn take(&mut self) -> Outcome {
        match self {
            Kept::Cell(v) => Outcome::Cell(*v),
            Kept::Verdict(v) => Outcome::Verdict(*v),
            other => match std::mem::replace(other, Kept::Taken) {
                Kept::Other(o) => *o,
                _ => unreachable!("each answer is taken once"),
            },
        }
    }
}

impl SharedAnswers {
    /// Request `i`'s answer is `outcomes[i]`, for sequence number
    /// `seqs[i]` of its connection.
    pub fn new(seqs: Vec<u64>, outcomes: Vec<Kept>) -> Arc<SharedAnswers> {
        assert_eq!(seqs.len(), outcomes.len(), "an outcome per request");
        Arc::new(SharedAnswers {
            seqs,
            outcomes: Mutex::new(outcomes),
        })
    }
}

impl BatchReply {
    /// Answers of its own.
    pub fn new(outcomes: Vec<(u64, Outcome)>) -> BatchReply {
        BatchReply(Answers::Own(outcomes))
    }

    /// The answers `range` of `all`.
    pub fn shared(all: Arc<SharedAnswers>, range: Range<usize>) -> BatchReply {
        BatchReply(Answers::Shared(all, range))
    }

    /// Passes every answer to `f`, in order.
    pub fn for_each(self, mut f: impl FnMut(u64, Outcome)) {
        match self.0 {
            Answers::Own(outcomes) => {
                for (seq, outcome) in outcomes {
                    f(seq, outcome);
                }
            }
            Answers::Shared(all, range) => {
                let mut outcomes = all.outcomes.lock().unwrap_or_else(|e| e.into_inner());
                // Zipped slices: one bounds check for the range, not two an
                // answer (a forwarding node files one per forwarded op).
                let seqs = &all.seqs[range.clone()];
                for (&seq, kept) in seqs.iter().zip(&mut outcomes[range]) {
                    f(seq, kept.take());
                }
            }
        }
    }

    /// Every answer, in a vector of its own.
    pub fn into_outcomes(self) -> Vec<(u64, Outcome)> {
        match self.0 {
            Answers::Own(outcomes) => outcomes,
            shared => {
                let mut all = Vec::new();
                BatchReply(shared).for_each(|seq, outcome| all.push((seq, outcome)));
                all
            }
        }
    }
}

/// Counts open connections across the node; decremented when dropped.
#[derive(Debug)]
pub struct ConnectionGuard {
    /// Shared with the acceptor, which refuses connections at the limit.
    open: Arc<AtomicUsize>,
    /// Until the connection authenticates (on a node with a token): its
    /// place among those that have not, which a newer connection may take.
    waiting: Option<AuthTicket>,
}

impl ConnectionGuard {
    /// Counts one more connection, unless `max` are already open.
    pub fn try_new(open: &Arc<AtomicUsize>, max: usize) -> Option<ConnectionGuard> {
        let mut n = open.load(Ordering::Relaxed);
        loop {
            if n >= max {
                return None;
            }
            match open.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    return Some(ConnectionGuard {
                        open: open.clone(),
                        waiting: None,
                    })
                }
                Err(seen) => n = seen,
            }
        }
    }

    /// Counts one more connection past the limit: one that takes the place
    /// of an unauthenticated connection told to close (it is still counted
    /// for the moment it takes to go).
    pub fn in_place_of_another(open: &Arc<AtomicUsize>) -> ConnectionGuard {
        open.fetch_add(1, Ordering::AcqRel);
        ConnectionGuard {
            open: open.clone(),
            waiting: None,
        }
    }

    /// The connection has yet to authenticate: listed in `unauthed`.
    pub fn awaiting_auth(mut self, unauthed: &Arc<Unauthed>) -> ConnectionGuard {
        self.waiting = Some(unauthed.register());
        self
    }

    /// The connection authenticated: no longer one a newer may replace.
    pub fn authenticated(&mut self) {
        self.waiting = None;
    }

    /// Notified when a newer connection takes this one's place (none once
    /// authenticated, or on a node without a token).
    pub fn eviction(&self) -> Option<Arc<crate::signal::Signal>> {
        self.waiting.as_ref().map(|t| t.notify.clone())
    }

    /// Connections open across the node right now (for INFO).
    pub fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

/// Connections that have not authenticated yet, oldest first. At the
/// connection limit, a new connection takes the place of the oldest of
/// them, so clients without the token cannot lock out those with it: they
/// can only crowd each other out.
#[derive(Debug, Default)]
pub struct Unauthed {
    next: crate::sync::AtomicU64,
    waiting: crate::sync::Mutex<std::collections::BTreeMap<u64, Arc<crate::signal::Signal>>>,
}

impl Unauthed {
    fn register(self: &Arc<Self>) -> AuthTicket {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(crate::signal::Signal::new());
        self.lock().insert(id, notify.clone());
        AuthTicket {
            id,
            notify,
            registry: self.clone(),
        }
    }

    /// Tells the oldest unauthenticated connection to close; `false` if
    /// there is none.
    pub fn evict_oldest(&self) -> bool {
        match self.lock().pop_first() {
            Some((_, notify)) => {
                // A permit: seen even if the connection is not waiting now.
                notify.notify();
                true
            }
            None => false,
        }
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(
        &self,
    ) -> impl std::ops::DerefMut<Target = std::collections::BTreeMap<u64, Arc<crate::signal::Signal>>> + '_
    {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection's place in [`Unauthed`]; leaves it when dropped.
#[derive(Debug)]
struct AuthTicket {
    id: u64,
    notify: Arc<crate::signal::Signal>,
    registry: Arc<Unauthed>,
}

impl Drop for AuthTicket {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A shard's counters, published by its own thread after each batch of
/// work (single writer, relaxed stores: never on the decision itself) and
/// read by any connection answering STATS.
#[derive(Debug, Default)]
pub struct PublishedStats {
    buckets: AtomicU64,
    bucket_bytes: AtomicU64,
    allowed_total: AtomicU64,
    denied_total: AtomicU64,
    evicted_total: AtomicU64,
    refused_total: AtomicU64,
    /// Spend verdicts by kind (code - 1) and result (0 denied, 1 allowed).
    pub by_kind: [[AtomicU64; 2]; 5],
    /// Bytes read from and written to client connections.
    pub bytes_in: AtomicU64,
    /// See `bytes_in`.
    pub bytes_out: AtomicU64,
    /// Frames handled, by how long handling took: bucket `i` counts those
    /// under `2^i` µs ([`FRAME_TIME_BUCKETS`]; the last, all).
    pub frame_time: [AtomicU64; FRAME_TIME_BUCKETS],
    /// Total ns spent handling frames.
    pub frame_ns_total: AtomicU64,
    /// ERROR replies sent (protocol v1), by status code.
    pub errors: [AtomicU64; ERROR_CODES],
    /// Requests this shard decided for connections on other shards.
    pub forwarded_total: AtomicU64,
    /// Forwarded batches decided, by how long deciding took (buckets as
    /// `frame_time`).
    pub batch_time: [AtomicU64; FRAME_TIME_BUCKETS],
    /// Total ns spent deciding forwarded batches.
    pub batch_ns_total: AtomicU64,
    /// Full syncs this shard completed to a follower.
    pub full_syncs_total: AtomicU64,
    /// Drains acknowledged by the follower, by the time from their SYNC's
    /// write to the ACK that covered them (buckets as `frame_time`): the
    /// replication link's round trip, which a sync reply waits on top of
    /// its decision. Written by the primary's ack reader.
    pub ack_time: [AtomicU64; FRAME_TIME_BUCKETS],
    /// Total ns of the waits `ack_time` counts.
    pub ack_ns_total: AtomicU64,
    /// Reply bytes the shard's connections owe together (as last
    /// published: at least once a second).
    pub reply_bytes_owed: AtomicU64,
}

/// Adds `n` to a counter only one thread writes (a shard's own
/// [`PublishedStats`]): a load and a store, no locked add.
#[inline]
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// Status codes the error counters have room for (0 unused).
pub const ERROR_CODES: usize = 32;

/// Buckets of the frame-time histogram: under 1 µs, 2 µs, ..., 2^16 µs
/// (65 ms), and everything.
pub const FRAME_TIME_BUCKETS: usize = 18;

/// The bucket of the frame-time histogram a duration of `ns` falls in.
pub fn frame_time_bucket(ns: u64) -> usize {
    let us = ns.div_ceil(1_000).max(1);
    // Under 2^i µs for the smallest i with us <= 2^i.
    let i = (64 - (us - 1).leading_zeros()) as usize;
    i.min(FRAME_TIME_BUCKETS - 1)
}

impl PublishedStats {
    /// Publishes `t`'s counters, and `reply_bytes_owed` (what the shard's
    /// connections owe together), for STATS (relaxed stores). The counters
    /// a connection or flow keeps (bytes, frame and batch times, errors,
    /// full syncs) are counted in place by `count_*` instead: they were
    /// copied here on every read (about 60 stores, over 100 instructions a
    /// read at 50 x 1: benches/notes.md).
    pub fn publish(&self, t: &Table, reply_bytes_owed: usize) {
        let c = t.counters_total;
        self.buckets.store(t.len() as u64, Ordering::Relaxed);
        self.bucket_bytes
            .store(t.memory_bytes() as u64, Ordering::Relaxed);
        self.allowed_total.store(c.allowed_total, Ordering::Relaxed);
        self.denied_total.store(c.denied_total, Ordering::Relaxed);
        self.evicted_total.store(c.evicted_total, Ordering::Relaxed);
        self.refused_total.store(c.refused_total, Ordering::Relaxed);
        for (kind, counts) in self.by_kind.iter().zip(c.by_kind) {
            for (slot, n) in kind.iter().zip(counts) {
                slot.store(n, Ordering::Relaxed);
            }
        }
        self.reply_bytes_owed
            .store(reply_bytes_owed as u64, Ordering::Relaxed);
    }

    /// Counts one ERROR reply.
    #[inline]
    pub fn count_error(&self, status: Status) {
        let code = usize::from(status.code()).min(ERROR_CODES - 1);
        bump(&self.errors[code], 1);
    }

    /// Counts bytes read (`true`) or written on a client connection.
    #[inline]
    pub fn count_io(&self, read: bool, n: usize) {
        bump(
            if read {
                &self.bytes_in
            } else {
                &self.bytes_out
            },
            n as u64,
        );
    }

    /// Counts one frame handled in `ns`.
    #[inline]
    pub fn count_frame(&self, ns: u64) {
        bump(&self.frame_time[frame_time_bucket(ns)], 1);
        bump(&self.frame_ns_total, ns);
    }

    /// Counts one forwarded batch of `requests`, decided in `ns`.
    #[inline]
    pub fn count_batch(&self, requests: usize, ns: u64) {
        bump(&self.forwarded_total, requests as u64);
        bump(&self.batch_time[frame_time_bucket(ns)], 1);
        bump(&self.batch_ns_total, ns);
    }

    /// Counts one full sync completed to a follower.
    pub fn count_full_sync(&self) {
        bump(&self.full_syncs_total, 1);
    }

    /// Counts one drain acknowledged `ns` after its SYNC was written.
    pub fn count_ack(&self, ns: u64) {
        bump(&self.ack_time[frame_time_bucket(ns)], 1);
        bump(&self.ack_ns_total, ns);
    }

    /// The counters as last published.
    pub fn read(&self, keys_max: u64) -> ShardStats {
        ShardStats {
            buckets: self.buckets.load(Ordering::Relaxed),
            bucket_bytes: self.bucket_bytes.load(Ordering::Relaxed),
            allowed_total: self.allowed_total.load(Ordering::Relaxed),
            denied_total: self.denied_total.load(Ordering::Relaxed),
            evicted_total: self.evicted_total.load(Ordering::Relaxed),
            refused_total: self.refused_total.load(Ordering::Relaxed),
            keys_max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared reply hands each connection its range, each answer as it
    /// was made (kept in place or boxed), and nothing of another range.
    #[test]
    fn shared_answers_give_each_range_its_own_outcomes() {
        let cell = CellVerdict {
            limited: true,
            limit: 5,
            remaining: 0,
            retry_after_ns: 7,
            reset_after_ns: 9,
        };
        let outcomes = vec![
            Outcome::Cell(cell),
            Outcome::Failed(Status::GroupUnavailable, "down".into()),
            Outcome::Refused(Status::KeysFull),
        ];
        let all = SharedAnswers::new(vec![4, 5, 1], outcomes.into_iter().map(Kept::new).collect());
        let mut got = Vec::new();
        BatchReply::shared(all.clone(), 1..3).for_each(|seq, o| got.push((seq, o)));
        assert_eq!(got.len(), 2);
        assert!(
            matches!(&got[0], (5, Outcome::Failed(Status::GroupUnavailable, t)) if t == "down")
        );
        assert!(matches!(got[1], (1, Outcome::Refused(Status::KeysFull))));
        let first = BatchReply::shared(all, 0..1).into_outcomes();
        assert!(matches!(first[..], [(4, Outcome::Cell(v))] if v.retry_after_ns == 7 && v.limited));
    }
}
