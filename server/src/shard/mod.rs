//! A shard: one thread, one single-threaded tokio runtime, one [`Table`].
//! This module holds a shard's types: the messages other threads send it
//! ([`ShardMsg`]; a [`Batch`] of [`Op`]s is answered with [`Outcome`]s),
//! what its tasks share ([`ShardCore`]) and what the node's shards share
//! ([`Node`]). The thread itself (start-up, the message loop, the tasks it
//! spawns) is [`worker`](crate::worker)'s, which sits above the connection
//! and replication tasks it runs; nothing here imports them.
//!
//! The shard thread runs the connection tasks it was handed (each a
//! coordinator: parse, validate, route), protocol v1 and RESP alike, and
//! executes every decision on the keys it owns directly on its table. Other
//! threads reach it only through its [`inbox`](crate::inbox): new
//! connections, forwarded batches of requests for its keys, and the two
//! steps of shutdown.

pub mod bucket_map;
mod changes;
mod fold;
pub mod table;
pub mod tat;

use std::cell::{Cell, RefCell};
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::time::Instant;

use bytes::BytesMut;
use sluice_protocol::cell::{CellPolicy, CellVerdict};
use sluice_protocol::gcra::Verdict;
use sluice_protocol::limit::{Concurrency, Limit};
use sluice_protocol::{MonotonicClock, Policy, Status};
use tokio::sync::watch;

use crate::config::Config;
use crate::inbox::Sender;
use crate::replication::primary::FlowShard;
use crate::replication::{follower, ReplNode};
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering};
use crate::tiers::Tiers;
use crossbeam_utils::CachePadded;
use sluice_protocol::identity::bucket_key;
use sluice_protocol::limit::Kind;
use sluice_protocol::message::ShardStats;
use sluice_protocol::message::{Decide, LeaseOp, LeaseTarget, LimitSet, Limits, RequestError};
pub use table::{LimitRef, LimitVerdict, Mode, MultiVerdict, Table};

/// What other threads may ask of a shard.
#[derive(Debug)]
pub enum ShardMsg {
    /// Serve this connection from now on.
    Adopt(Adopt),
    /// Serve this RESP connection from now on.
    AdoptResp(AdoptResp),
    /// Decide these requests for keys this shard owns and reply.
    Batch(Batch),
    /// Use these tiers from now on (a reload).
    Tiers(Arc<Tiers>),
    /// Follower: clear the table, a new full sync starts.
    Reset(follower::Reset),
    /// Follower: start a flow from a primary shard on this shard.
    Flow(follower::StartFlow),
    /// Follower: apply these records (from a flow on another shard).
    Apply(follower::Apply),
    /// Follower: make room for this many more buckets of each kind (a full
    /// sync of this following attempt is about to arrive).
    Reserve(u64, [u64; 5]),
    /// Planned failover: say once the follower has everything this shard
    /// changed.
    Handover(crate::inbox::OnceSender<bool>),
    /// Planned failover: this shard's flow hands over at this epoch.
    Takeover(u64),
    /// Snapshot: encode this shard's buckets (a chunk of keys at a time,
    /// between other work) and send them.
    Snapshot(crate::inbox::OnceSender<crate::snapshot::ShardPart>),
    /// Snapshot, at start (before any connection): store these buckets.
    Load(
        Vec<sluice_protocol::replication::Record>,
        crate::sync::mpsc::Sender<()>,
    ),
    /// Run this on the shard's thread, inside its runtime (the rate limit
    /// service served on the shard threads: `--rls-threads 0`).
    Run(Job),
    /// Shutdown, step 1: stop reading new requests, finish the ones in
    /// flight, close connections, then report drained. Keep serving
    /// batches: other shards' connections may still be finishing.
    Drain,
    /// Shutdown, step 2: every shard has drained; stop the thread.
    Stop,
}

/// Work for a shard's thread ([`ShardMsg::Run`]).
pub struct Job(pub Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

/// A connection moving to a shard: freshly accepted, or bound to this shard
/// by its HELLO on another.
#[derive(Debug)]
pub struct Adopt {
    /// The socket (plain or TLS), registered with no runtime.
    pub stream: crate::stream::Moving,
    /// Bytes already read from it and not yet decoded.
    pub read_buf: BytesMut,
    /// Set when HELLO moved the connection: the id to answer HELLO_OK to.
    pub hello_request_id: Option<u32>,
    /// Whether the connection has authenticated.
    pub authed: bool,
    /// Whether its HELLO came from a forwarding node of the same layout
    /// (such a connection is never forwarded further).
    pub forwarded: bool,
    /// Keeps the connection counted while it lives.
    pub guard: ConnectionGuard,
}

/// A freshly accepted RESP connection (it never moves between shards).
#[derive(Debug)]
pub struct AdoptResp {
    /// The socket, non-blocking, not registered with any runtime.
    pub stream: StdTcpStream,
    /// Keeps the connection counted while it lives.
    pub guard: ConnectionGuard,
}

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
/// filled in by [`ShardCore::resolve`]).
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
pub struct BatchReply {
    /// One per forwarded request.
    pub outcomes: Vec<(u64, Outcome)>,
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

/// What a node's shards share, read-only: who they are and how to reach
/// each other.
#[derive(Debug)]
pub struct Node {
    /// The validated configuration.
    pub config: Config,
    /// Shards on this node.
    pub shard_count: u16,
    /// Random identity of this process, announced in HELLO_OK.
    pub node_id: u64,
    /// Role, epoch and replication state (they change at run time).
    pub repl: ReplNode,
    /// Every shard's inbox, by shard id.
    pub shards: Vec<Sender<ShardMsg>>,
    /// The protocol v1 listener's address.
    pub addr: SocketAddr,
    /// The RESP listener's address, when `--resp-port` enabled it.
    pub resp_addr: Option<SocketAddr>,
    /// When the node started (INFO's uptime).
    pub started: Instant,
    /// Each shard's counters as it last published them (STATS reads them).
    pub stats: Vec<CachePadded<PublishedStats>>,
    /// With `--cluster`: the entry point's view of the cluster and its
    /// forwarder (keys of other groups go to their primaries).
    pub forward: Option<Arc<crate::forward::Forwarder>>,
    /// Failed authentications by source address: the budget that blocks
    /// a guesser, and `sluice_auth_failures_total`.
    pub auth_failures: crate::auth_failures::AuthFailures,
    /// With `--replica-tls-ca`: how a follower opens TLS to its primary
    /// (the trusted certificates, and `--replica-tls-name`).
    pub replica_tls: Option<crate::stream::ReplicaTls>,
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

impl Node {
    /// The address the group's other node reaches this one at:
    /// `--advertise`, else the listening address.
    pub fn advertised(&self) -> String {
        self.config
            .advertise
            .clone()
            .unwrap_or_else(|| self.addr.to_string())
    }

    /// The node's epoch now.
    pub fn epoch(&self) -> u64 {
        self.repl.epoch()
    }

    /// Re-reads the tiers from the config file and hands them to every
    /// shard (each swaps them in between two messages). The old tiers stay
    /// in force if the file is not valid; a node started without a config
    /// file has nothing to reload, and says so. Logs the outcome whichever
    /// way the reload was asked for (`trigger`: SIGHUP or RELOAD).
    pub fn reload_tiers(&self, trigger: &str) -> Result<Arc<Tiers>, String> {
        if let Some(forward) = &self.forward {
            // The cluster file too (--cluster): a bad one keeps the old.
            if let Err(text) = forward.reload() {
                tracing::warn!(trigger, error = %text, "cluster file reload refused; the old layout stays");
                return Err(format!("--cluster: {text}"));
            }
            if self.config.config.is_none() {
                tracing::info!(trigger, "cluster file reloaded");
                return Ok(Arc::new(Tiers::default()));
            }
        }
        if self.config.config.is_none() {
            let text = "no config file to reload: sluiced was started without --config FILE, so it has no tiers".to_owned();
            tracing::warn!(trigger, "{text}");
            return Err(text);
        }
        let tiers = match self.config.reload_tiers() {
            Ok(t) => Arc::new(t),
            Err(e) => {
                let text = e.to_string();
                tracing::warn!(trigger, error = %text, "reload refused; the old tiers stay");
                return Err(text);
            }
        };
        for tx in &self.shards {
            let _ = tx.send(ShardMsg::Tiers(tiers.clone()));
        }
        tracing::info!(trigger, tiers = tiers.len(), "tiers reloaded");
        Ok(tiers)
    }
}

/// Everything a shard thread's tasks share. Lives on that thread only
/// (`Rc`, `RefCell`): no locks, no atomics.
#[derive(Debug)]
pub struct ShardCore {
    /// This shard's id.
    pub id: u16,
    /// The node this shard belongs to.
    pub node: Arc<Node>,
    /// The buckets this shard owns.
    pub table: RefCell<Table>,
    /// The time authority for decisions.
    pub clock: MonotonicClock,
    /// Flips to true at Drain; every connection task watches it.
    pub draining: watch::Sender<bool>,
    /// Connection tasks alive on this shard.
    pub connections: Cell<usize>,
    /// The named tiers in force on this shard (swapped by a reload).
    pub tiers: RefCell<Arc<Tiers>>,
    /// Primary: this shard's flow to the follower.
    pub flow: RefCell<FlowShard>,
    /// Follower: the following attempt this shard's table belongs to
    /// (records of older attempts are dropped).
    pub follow_gen: Cell<u64>,
    /// The epoch this shard's lease ids are drawn for (see
    /// [`ShardCore::sync_epoch`]).
    pub lease_epoch: Cell<u64>,
    /// Told this shard's id once it has drained.
    drained_tx: crate::inbox::Sender<u16>,
    /// Whether `drained_tx` has been used.
    drained_sent: Cell<bool>,
    /// Reply bytes this shard's connections owe together, and the shard's
    /// share of `--reply-bytes-node-max` (see `coordinator::ReplyShare`).
    pub replies: crate::coordinator::ShardReplies,
}

impl ShardCore {
    /// Shard `id`'s core, on its own thread: an empty table whose lease ids
    /// are drawn for the node's epoch, the tiers the config loaded, no
    /// connection yet. It reports drained on `drained_tx`.
    pub fn new(
        id: u16,
        node: Arc<Node>,
        clock: MonotonicClock,
        drained_tx: crate::inbox::Sender<u16>,
    ) -> ShardCore {
        let tiers = RefCell::new(Arc::new(node.config.tiers.clone()));
        // Lease ids are unique per node and epoch: each shard counts in
        // its own range.
        let base = table::lease_id_base(node.epoch(), id);
        let mut table = Table::with_cap(node.config.keys_max, base);
        table.set_heap_bytes_max(node.config.heap_bytes_max);
        let lease_epoch = Cell::new(node.epoch());
        let reply_share = node.config.reply_bytes_node_max / usize::from(node.shard_count.max(1));
        ShardCore {
            id,
            tiers,
            flow: RefCell::default(),
            follow_gen: Cell::new(0),
            lease_epoch,
            table: RefCell::new(table),
            node,
            clock,
            draining: watch::channel(false).0,
            connections: Cell::new(0),
            drained_tx,
            drained_sent: Cell::new(false),
            replies: crate::coordinator::ShardReplies::new(reply_share),
        }
    }

    /// A DECIDE's limits as buckets: inline ones as sent (validated by the
    /// parser), a tier's as in force on this shard (UNKNOWN_TIER if none,
    /// and its limits checked against the cost).
    pub fn resolve(
        &self,
        key_hash: u128,
        d: &Decide<'_>,
        op: &mut DecideOp,
    ) -> Result<(), RequestError> {
        let tiers = self.tiers.borrow();
        // Borrowed, not copied: a set is 300 bytes.
        let set: &LimitSet = match &d.limits {
            Limits::Inline(set) => set,
            Limits::Tier(name) => {
                let tier = tiers
                    .get(name.as_bytes())
                    .ok_or_else(|| unknown_tier(name))?;
                let set = tier.set();
                set.check_cost(d.mode, d.cost)?;
                set
            }
        };
        op.mode = d.mode;
        op.cost = d.cost;
        op.count = set.len() as u8;
        op.priority = d.priority;
        for (i, limit) in set.iter().enumerate() {
            let bucket = bucket_key(key_hash, limit.kind(), d.limits.slot(i as u8));
            op.refs[i] = LimitRef {
                bucket,
                limit: *limit,
                floor: set.reserves(i).floor(limit.limit(), d.priority),
            };
        }
        Ok(())
    }

    /// The bucket and numbers of the concurrency limit a RELEASE or RENEW
    /// names.
    pub fn resolve_lease(
        &self,
        key_hash: u128,
        l: &LeaseOp<'_>,
    ) -> Result<(u128, Concurrency), RequestError> {
        let limit = match l.target {
            LeaseTarget::Inline { limit, .. } => limit,
            LeaseTarget::Tier { name, index } => {
                let tiers = self.tiers.borrow();
                let tier = tiers
                    .get(name.as_bytes())
                    .ok_or_else(|| unknown_tier(name))?;
                tier.set().concurrency_at(index)?
            }
        };
        Ok((
            bucket_key(key_hash, Kind::Concurrency, l.target.slot()),
            limit,
        ))
    }

    /// Whether this shard may admit now: the node admits (see
    /// [`ReplNode::admits`]), and, when sync mode and fencing are both on,
    /// this shard's flow is streaming (with no follower to hold its
    /// changes, nothing it admitted would survive a promotion) or, on
    /// etcd, no other node may take over (`ReplNode::solo`).
    #[inline]
    pub fn admits(&self, now_ns: u64) -> bool {
        let repl = &self.node.repl;
        repl.admits(now_ns)
            && (repl.mode != sluice_protocol::replication::Mode::Sync
                || !repl.fencing()
                || self.flow.borrow().is_streaming()
                || repl.solo.load(Ordering::Acquire) == 1)
    }

    /// Moves lease ids to the node's epoch if it changed (a promotion),
    /// before anything can acquire in the new epoch. One relaxed load.
    #[inline]
    pub fn sync_epoch(&self) {
        let epoch = self.node.epoch();
        if self.lease_epoch.get() != epoch {
            self.lease_epoch.set(epoch);
            self.table
                .borrow_mut()
                .set_lease_id_base(table::lease_id_base(epoch, self.id));
        }
    }

    /// This shard's published counters: written by this shard's thread
    /// only, read by STATS and the admin port on any.
    #[inline]
    fn published(&self) -> &PublishedStats {
        &self.node.stats[usize::from(self.id)]
    }

    /// Publishes the table's counters for STATS (relaxed stores). The
    /// counters a connection or flow keeps (bytes, frame and batch times,
    /// errors, full syncs) are counted in place by `count_*` instead: they
    /// were copied here on every read (about 60 stores, over 100
    /// instructions a read at 50 x 1: benches/notes.md).
    pub fn publish_stats(&self) {
        let t = self.table.borrow();
        let c = t.counters_total;
        let p = self.published();
        p.buckets.store(t.len() as u64, Ordering::Relaxed);
        p.bucket_bytes
            .store(t.memory_bytes() as u64, Ordering::Relaxed);
        p.allowed_total.store(c.allowed_total, Ordering::Relaxed);
        p.denied_total.store(c.denied_total, Ordering::Relaxed);
        p.evicted_total.store(c.evicted_total, Ordering::Relaxed);
        p.refused_total.store(c.refused_total, Ordering::Relaxed);
        for (kind, counts) in p.by_kind.iter().zip(c.by_kind) {
            for (slot, n) in kind.iter().zip(counts) {
                slot.store(n, Ordering::Relaxed);
            }
        }
        p.reply_bytes_owed
            .store(self.replies.owed() as u64, Ordering::Relaxed);
    }

    /// Counts one ERROR reply.
    #[inline]
    pub fn count_error(&self, status: Status) {
        let code = usize::from(status.code()).min(ERROR_CODES - 1);
        bump(&self.published().errors[code], 1);
    }

    /// Counts bytes read (`true`) or written on a client connection.
    #[inline]
    pub fn count_io(&self, read: bool, n: usize) {
        let p = self.published();
        bump(if read { &p.bytes_in } else { &p.bytes_out }, n as u64);
    }

    /// Counts one frame handled in `ns`.
    #[inline]
    pub fn count_frame(&self, ns: u64) {
        let p = self.published();
        bump(&p.frame_time[frame_time_bucket(ns)], 1);
        bump(&p.frame_ns_total, ns);
    }

    /// Counts one forwarded batch of `requests`, decided in `ns`.
    #[inline]
    pub fn count_batch(&self, requests: usize, ns: u64) {
        let p = self.published();
        bump(&p.forwarded_total, requests as u64);
        bump(&p.batch_time[frame_time_bucket(ns)], 1);
        bump(&p.batch_ns_total, ns);
    }

    /// Counts one full sync completed to a follower.
    pub fn count_full_sync(&self) {
        bump(&self.published().full_syncs_total, 1);
    }

    /// Counts one drain acknowledged `ns` after its SYNC was written.
    pub fn count_ack(&self, ns: u64) {
        let p = self.published();
        bump(&p.ack_time[frame_time_bucket(ns)], 1);
        bump(&p.ack_ns_total, ns);
    }

    /// Called by a connection task as it ends.
    pub fn connection_closed(&self) {
        self.connections.set(self.connections.get() - 1);
        self.report_if_drained();
    }

    /// Reports drained (once) if Drain came and no connection is left.
    pub fn report_if_drained(&self) {
        if *self.draining.borrow()
            && self.connections.get() == 0
            && !self.drained_sent.replace(true)
        {
            let _ = self.drained_tx.send(self.id);
        }
    }
}

impl ShardCore {
    /// UNKNOWN_TIER's text: the name asked for and the tiers this node has
    /// (an error path: the words are built only here).
    pub fn unknown_tier_text(&self, name: &str) -> String {
        let tiers = self.tiers.borrow();
        let known: Vec<&str> = tiers.names().collect();
        if known.is_empty() {
            format!(
                "unknown tier: {name:?}: this node has no tiers (define [tiers.NAME] in the file given to sluiced --config)"
            )
        } else {
            format!(
                "unknown tier: {name:?} is not one of this node's tiers ({})",
                known.join(", ")
            )
        }
    }
}

fn unknown_tier(name: &str) -> RequestError {
    tracing::debug!(tier = name, "unknown tier");
    RequestError::from(Status::UnknownTier)
}
