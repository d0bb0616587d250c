//! Entry points: with `--cluster FILE --group NAME`, every node answers for
//! every key of the cluster, on every port (protocol v1, RESP, the Envoy
//! rate limit service), followers included.
//!
//! A key is decided by its owning group's primary, found by the ring every
//! client uses (`sluice_protocol::ring`), so it lands on the same group
//! whatever the protocol and whichever node is asked. A key of this node's
//! own group is decided here, by its shards, when this node is the
//! group's primary; everything else (other groups' keys, and on a follower
//! its own group's too) goes to the owner's primary through the client
//! crate's [`Cluster`]: the same batching, deadlines, epochs and failover
//! search as a gateway's, not a second implementation.
//!
//! How it runs: every thread that forwards (each shard thread, the
//! forwarder's own thread, a rate limit service thread) has a cluster
//! client of its own, so a forward's connections live on the thread that
//! forwards and no request or reply crosses a thread on its way out
//! ([`Forwarder::cluster_here`]). A coordinator pushes a read's forwarded
//! requests straight onto its thread's turn ([`Forwarder::open`] and
//! [`Forwarder::close`]): the reads of one turn of the thread's loop bound
//! for one group gather in one batch as they are read (a read that spreads
//! over groups goes alone, as the rate limit service's submitted batches
//! do), and each turn's batches go, through one task of the thread, into
//! that client's batch path (the client's writer puts calls queued
//! together into one frame). Each read is answered as one [`BatchReply`],
//! which fills the connection's pipeline slots like an answer from
//! another shard. The price is connections: a node keeps one
//! to each shard of each node it forwards to *per forwarding thread*
//! (docs/ARCHITECTURE.md weighs it). The forwarder's thread keeps the
//! cluster client that follows etcd's layout (or the file's reloads); the
//! others take each new layout from it on their next forward.
//!
//! Safety rules:
//! - Nodes agree on the layout: every forwarding connection's HELLO carries
//!   this node's layout hash (`ring::layout_hash` of the cluster file), and
//!   a node whose hash differs refuses it (LAYOUT_MISMATCH, counted): two
//!   views of the cluster never split a key's counts silently.
//! - A connection that came from a forwarding node is never forwarded
//!   again: a key of another group there is WRONG_GROUP. No loops.
//! - A forwarded spend that gets no answer is outcome-unknown and never
//!   resent (the client crate's rule); its caller hears so.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sluice_client::cluster::Answered;
use sluice_client::{Answer, ClientConfig, Cluster, ClusterConfig, Error, FailurePolicy, Topology};
use sluice_protocol::message::{ClusterOk, DecideOk, GroupInfo};
use sluice_protocol::ring::Ring;
use sluice_protocol::routing::key_hash;
use sluice_protocol::Status;

use crate::config::{Config, ForwardConnections, ForwardFailure};
use crate::inbox::Sender;
use crate::shard::{BatchReply, Kept, MultiVerdict, Outcome, SharedAnswers};

/// Connections the forwarder keeps to each node it forwards to: one per
/// shard of that node (the client's shard-aware mode), so the owner
/// decides each key on the thread that owns it, with no hop.
const FORWARD_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// A request to be decided by another node, owned until it is sent: the
/// cluster client's [`Op`](sluice_client::Op), sent in a batch.
pub use sluice_client::Op as RemoteOp;
pub use sluice_client::{CellByHash, OwnedLimits, OwnedTarget};

/// One read's forwarded requests, answered as one [`BatchReply`].
#[derive(Debug)]
pub struct RemoteBatch {
    /// The connection's reply inbox.
    pub reply_to: Sender<BatchReply>,
    /// The requests, in the connection's order.
    pub items: RemoteItems,
}

/// Requests gathered for other nodes: each one's pipeline seq, op and
/// group (its ring index in `view`, looked up once, when the read told
/// its own keys from others').
#[derive(Debug, Default)]
pub struct RemoteItems {
    seqs: Vec<u64>,
    /// The ops (public: the tests of the pipeline read them).
    pub ops: RemoteOps,
    groups: Vec<usize>,
    /// The view `groups` index, `None` when the items came under two
    /// views (a layout changed mid-read): then they are looked up again.
    view: Option<Arc<View>>,
    mixed: bool,
}

impl RemoteItems {
    /// Empty, with room for `n` requests.
    pub fn with_capacity(n: usize) -> RemoteItems {
        RemoteItems {
            seqs: Vec::with_capacity(n),
            ops: RemoteOps::Cells(Vec::with_capacity(n)),
            groups: Vec::with_capacity(n),
            view: None,
            mixed: false,
        }
    }

    /// The view and group of every request, if they all have one group in
    /// one view.
    fn one_group(&self) -> Option<(*const View, usize)> {
        let view = self.view.as_ref().filter(|_| !self.mixed)?;
        let group = *self.groups.first()?;
        self.groups
            .iter()
            .all(|&g| g == group)
            .then_some((Arc::as_ptr(view), group))
    }

    /// Adds request `seq`, whose key is of group `group` in `view`.
    #[inline]
    pub fn push(&mut self, seq: u64, op: impl IntoRemote, view: &Arc<View>, group: usize) {
        self.note_view(view);
        self.seqs.push(seq);
        op.push_onto(&mut self.ops);
        self.groups.push(group);
    }

    /// Adds `other`'s requests after these (its groups under its view, its
    /// sequence numbers, which stay its connection's: a merged turn
    /// answers each batch apart); returns how many.
    fn append(&mut self, other: RemoteItems) -> usize {
        match &other.view {
            Some(view) => self.note_view(view),
            None => self.mixed = true,
        }
        self.mixed |= other.mixed;
        let n = other.ops.len();
        self.seqs.extend(other.seqs);
        self.ops.extend(other.ops);
        self.groups.extend(other.groups);
        n
    }

    /// The requests from `at` on, taken off these (under `view`; `mixed`
    /// when they came under another view too). What is left was one
    /// group's under one view before them, and is again.
    fn split_off(&mut self, at: usize, view: Arc<View>, mixed: bool) -> RemoteItems {
        let tail = RemoteItems {
            seqs: self.seqs.split_off(at),
            ops: self.ops.split_off(at),
            groups: self.groups.split_off(at),
            view: Some(view),
            mixed,
        };
        self.mixed = false;
        tail
    }

    /// Requests under `view` join: the first view is kept, another one
    /// marks the items mixed (their groups are looked up again).
    #[inline]
    fn note_view(&mut self, view: &Arc<View>) {
        match &self.view {
            None => self.view = Some(view.clone()),
            Some(v) if !Arc::ptr_eq(v, view) => self.mixed = true,
            Some(_) => {}
        }
    }
}

/// A batch's ops. While every one is a CELL by its key's hash (a
/// forwarding node's CL.THROTTLEs, the bulk of what it forwards) they are
/// kept as [`CellByHash`]: 48 bytes, valid by their type, sent and
/// answered with no look at their kind and dropped with no pass over
/// them ([`Cluster::cells_by_hash_with`]), where each pass over a batch's
/// 72-byte ops at load was a cache miss an op (benches/notes.md). The
/// first op of another kind turns them into ops.
#[derive(Debug)]
pub enum RemoteOps {
    /// CELLs by their keys' hash, each its [`RemoteOp::CellByHash`].
    Cells(Vec<CellByHash>),
    /// Ops of any kind.
    Ops(Vec<RemoteOp>),
}

impl Default for RemoteOps {
    fn default() -> RemoteOps {
        RemoteOps::Cells(Vec::new())
    }
}

impl RemoteOps {
    /// How many.
    pub fn len(&self) -> usize {
        match self {
            RemoteOps::Cells(cells) => cells.len(),
            RemoteOps::Ops(ops) => ops.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `op` after these.
    #[inline]
    fn push(&mut self, op: RemoteOp) {
        match (self, op) {
            (
                RemoteOps::Cells(cells),
                RemoteOp::CellByHash {
                    hash,
                    policy,
                    quantity,
                },
            ) => cells.push(CellByHash {
                hash,
                policy,
                quantity,
            }),
            (RemoteOps::Ops(ops), op) => ops.push(op),
            (this, op) => this.make_ops().push(op),
        }
    }

    /// These as ops of any kind (a first op of another kind came).
    #[cold]
    fn make_ops(&mut self) -> &mut Vec<RemoteOp> {
        if let RemoteOps::Cells(cells) = self {
            let mut ops = Vec::with_capacity(cells.capacity().max(cells.len() + 1));
            ops.extend(cells.iter().map(|&c| RemoteOp::from(c)));
            *self = RemoteOps::Ops(ops);
        }
        match self {
            RemoteOps::Ops(ops) => ops,
            RemoteOps::Cells(_) => unreachable!("made ops above"),
        }
    }

    /// These as ops of any kind.
    pub fn into_ops(self) -> Vec<RemoteOp> {
        match self {
            RemoteOps::Cells(cells) => cells.into_iter().map(RemoteOp::from).collect(),
            RemoteOps::Ops(ops) => ops,
        }
    }

    /// Adds `other`'s after these.
    fn extend(&mut self, other: RemoteOps) {
        match (self, other) {
            (RemoteOps::Cells(cells), RemoteOps::Cells(more)) => cells.extend(more),
            (RemoteOps::Ops(ops), RemoteOps::Cells(more)) => {
                ops.extend(more.into_iter().map(RemoteOp::from));
            }
            (this, RemoteOps::Ops(more)) => this.make_ops().extend(more),
        }
    }

    /// Those from `at` on, taken off these.
    fn split_off(&mut self, at: usize) -> RemoteOps {
        match self {
            RemoteOps::Cells(cells) => RemoteOps::Cells(cells.split_off(at)),
            RemoteOps::Ops(ops) => RemoteOps::Ops(ops.split_off(at)),
        }
    }
}

/// What a read forwards: an op, or a CELL by its key's hash (a forwarded
/// CL.THROTTLE), which goes in as it is, with no [`RemoteOp`] made and
/// dropped on the way.
pub trait IntoRemote {
    /// Adds this after `ops`.
    fn push_onto(self, ops: &mut RemoteOps);
}

impl IntoRemote for RemoteOp {
    #[inline]
    fn push_onto(self, ops: &mut RemoteOps) {
        ops.push(self);
    }
}

impl IntoRemote for CellByHash {
    #[inline]
    fn push_onto(self, ops: &mut RemoteOps) {
        match ops {
            RemoteOps::Cells(cells) => cells.push(self),
            ops => ops.make_ops().push(RemoteOp::from(self)),
        }
    }
}

/// A read that forwards, pushing its requests straight onto its thread's
/// turn ([`Forwarder::open`] to [`Forwarder::close`]): the group (under
/// the view) its first request is bound for, where its requests begin in
/// the turn's items for that group, and whether any went elsewhere.
#[derive(Debug)]
pub struct OpenRead {
    view: Arc<View>,
    group: usize,
    start: usize,
    /// A request of another group, or under another view, came.
    spread: bool,
    /// ... under another view.
    other_view: bool,
    /// The read's requests are a batch of their own (not the turn's).
    alone: bool,
}

impl OpenRead {
    /// A read whose requests go in a batch of their own.
    fn alone(view: &Arc<View>, group: usize) -> OpenRead {
        OpenRead {
            view: view.clone(),
            group,
            start: 0,
            spread: false,
            other_view: false,
            alone: true,
        }
    }

    /// Notes a request of the read bound for `group` under `view`.
    #[inline]
    pub fn note(&mut self, view: &Arc<View>, group: usize) {
        if group != self.group || !Arc::ptr_eq(view, &self.view) {
            self.spread = true;
            self.other_view |= !Arc::ptr_eq(view, &self.view);
        }
    }
}

/// The cluster as this node sees it, made anew whenever the cluster
/// client's layout changes (a reload of the file, etcd's watch).
#[derive(Debug)]
pub struct View {
    /// The ring over the groups' names (ownership).
    ring: Ring,
    /// This node's group's index in `ring` (`None` in etcd mode until the
    /// group has registered).
    own: Option<usize>,
    /// The layout hash sent in HELLO and checked against peers'.
    pub hash: u64,
    /// The cluster client's [`Cluster::generation`] this view was made at.
    generation: u64,
    /// The groups (for CLUSTER_OK).
    topology: Topology,
    /// By ring index: whether the group's primary takes a CELL by its
    /// key's hash (the cluster client's flags, kept current as primaries
    /// change).
    cells_by_hash: Vec<Arc<std::sync::atomic::AtomicBool>>,
}

impl View {
    /// The ring index of the group that owns the key of hash `key`.
    #[inline]
    pub fn group_of(&self, key: u128) -> usize {
        self.ring.group_of(key)
    }

    /// Whether group `group` (a ring index) is this node's.
    #[inline]
    pub fn is_own(&self, group: usize) -> bool {
        Some(group) == self.own
    }

    /// Whether group `group`'s primary, as last found, takes a CELL by its
    /// key's hash ([`RemoteOp::CellByHash`]): a forwarded CL.THROTTLE for
    /// it is sent so, and its key not kept.
    #[inline]
    pub fn takes_cells_by_hash(&self, group: usize) -> bool {
        self.cells_by_hash
            .get(group)
            .is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The name of the group that owns `key`.
    pub fn owner(&self, key: u128) -> &str {
        self.ring.owner(key)
    }
}

/// Counters of one destination group, for the admin port.
#[derive(Debug, Default, Clone)]
pub struct GroupCounters {
    /// Requests forwarded to the group.
    pub forwarded: u64,
}

/// Forward round trips: bucket `i` counts those under `2^i` µs (the last,
/// all), like the shard's frame times.
pub const RTT_BUCKETS: usize = 24;

/// What the admin port reads.
#[derive(Debug)]
pub struct ForwardStats {
    /// By destination group's name.
    pub groups: Mutex<BTreeMap<String, GroupCounters>>,
    /// Round trips of forwarded requests (send to answer), by bucket.
    pub rtt: [AtomicU64; RTT_BUCKETS],
    /// Sum of the round trips, ns.
    pub rtt_ns_sum: AtomicU64,
    /// Batches forwarded: each the requests one thread forwarded in one
    /// turn of its loop for one owner group, whatever their connections
    /// (or one read's, when it spans groups): requests over batches is
    /// how many shared a batch's fixed costs.
    pub batches: AtomicU64,
    /// Forward errors by kind: [`ERROR_KINDS`] (shared with the answers'
    /// maker, which counts them as replies are read).
    pub errors: Arc<[AtomicU64; ERROR_KINDS.len()]>,
    /// HELLOs refused because the peer's layout hash differs (counted by
    /// the refusing node).
    pub layout_mismatches: AtomicU64,
    /// Requests refused WRONG_GROUP (a forwarded key this group does not
    /// own).
    pub wrong_group: AtomicU64,
}

/// The kinds of forward error counted, in [`ForwardStats::errors`] order.
pub const ERROR_KINDS: [&str; 4] = ["unavailable", "outcome_unknown", "refused", "other"];

impl Default for ForwardStats {
    fn default() -> Self {
        ForwardStats {
            groups: Mutex::default(),
            rtt: std::array::from_fn(|_| AtomicU64::new(0)),
            rtt_ns_sum: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            errors: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
            layout_mismatches: AtomicU64::new(0),
            wrong_group: AtomicU64::new(0),
        }
    }
}

/// The node's entry-point machinery (see the module doc).
#[derive(Debug)]
pub struct Forwarder {
    /// The cluster file (`None`: the layout comes from etcd, watched by
    /// the cluster client).
    path: Option<PathBuf>,
    /// This node's group.
    group: String,
    /// The address this node is listed under.
    own_addr: String,
    /// What a key gets when its group cannot answer.
    failure: FailurePolicy,
    /// Routes, batches and fails over; its connections carry the layout
    /// hash in HELLO. The forwarder thread's own, and the one that follows
    /// the layout (etcd's watch, the file's reloads).
    cluster: Cluster,
    /// How the other threads' cluster clients are made.
    base: ClusterConfig,
    /// `--forward-connections per-thread`: every thread forwards through
    /// a cluster client of its own; else all through the forwarder
    /// thread's.
    per_thread: bool,
    /// Every other thread's cluster client (see [`Forwarder::cluster_here`]),
    /// for what the node reports of the groups (primaries, epochs).
    locals: Mutex<Vec<Cluster>>,
    /// The current view.
    view: RwLock<Arc<View>>,
    /// The forwarder thread's runtime.
    runtime: tokio::runtime::Handle,
    /// The forwarder thread (where the cluster client's connections live).
    thread: std::thread::ThreadId,
    /// Tells this forwarder's thread-local cluster clients from another's.
    id: u64,
    /// For the admin port.
    pub stats: ForwardStats,
}

/// Forwarders made in this process (ids for [`Forwarder::cluster_here`]).
static FORWARDERS: AtomicU64 = AtomicU64::new(0);

impl Forwarder {
    /// Reads the cluster (the file of `--cluster`, else etcd's layout of
    /// `--coordinator`), checks this node is in it, and starts the
    /// forwarder thread. `own_addr`: `--advertise`, or the listening
    /// address.
    pub fn start(config: &Config, own_addr: String) -> Result<Arc<Forwarder>, String> {
        let group = config.group.clone().expect("validated: needs --group");
        let failure = match config.forward_failure {
            ForwardFailure::Error => FailurePolicy::Error,
            ForwardFailure::Open => FailurePolicy::Open,
            ForwardFailure::Closed => FailurePolicy::Closed,
        };
        let base = ClusterConfig {
            client: ClientConfig {
                deadline: Duration::from_millis(config.forward_deadline_ms),
                connect_timeout: Duration::from_millis(FORWARD_CONNECT_TIMEOUT_MS),
                shard_aware: true,
                auth_token: config.auth_token.clone(),
                known_epoch: 0,
                layout_hash: 0,
            },
            failure,
            send_layout: true,
            stall_after: (config.forward_stall_after_ms > 0)
                .then(|| Duration::from_millis(config.forward_stall_after_ms)),
            ..ClusterConfig::default()
        };
        let (runtime, thread) = spawn_runtime()?;
        let path = config.cluster.clone();
        let cluster = match (&path, &config.coordinator) {
            (Some(path), _) => {
                let topology = load(path, &group, &own_addr)?;
                let _enter = runtime.enter();
                Cluster::new(&topology, base.clone()).map_err(|e| e.to_string())?
            }
            (None, Some(url)) => {
                let own = Topology::new().group(&group, &own_addr, None);
                etcd_cluster(&runtime, url, &config.cluster_name, base.clone(), own)?
            }
            (None, None) => unreachable!("started with --cluster or --coordinator"),
        };
        let view = make_view(&cluster, &group);
        tracing::info!(
            source = %path.as_ref().map_or_else(|| "etcd".to_owned(), |p| p.display().to_string()),
            group = %group,
            groups = view.ring.group_count(),
            layout = format_args!("{:016x}", view.hash),
            "entry point: forwarding other groups' keys to their primaries"
        );
        Ok(Arc::new(Forwarder {
            path,
            group,
            own_addr,
            failure,
            cluster,
            base,
            per_thread: config.forward_connections == ForwardConnections::PerThread,
            locals: Mutex::default(),
            view: RwLock::new(Arc::new(view)),
            runtime,
            thread,
            id: FORWARDERS.fetch_add(1, Ordering::Relaxed),
            stats: ForwardStats::default(),
        }))
    }

    /// The view in force (read once per read by a coordinator), made anew
    /// when the cluster client's layout changed.
    #[inline]
    pub fn view(&self) -> Arc<View> {
        let view = self.view.read().expect("not poisoned").clone();
        if view.generation == self.cluster.generation() {
            return view;
        }
        let fresh = Arc::new(make_view(&self.cluster, &self.group));
        if fresh.hash != view.hash {
            tracing::info!(
                from = format_args!("{:016x}", view.hash),
                to = format_args!("{:016x}", fresh.hash),
                groups = fresh.ring.group_count(),
                "new cluster layout"
            );
        }
        *self.view.write().expect("not poisoned") = fresh.clone();
        fresh
    }

    /// The layout hash in force.
    pub fn layout_hash(&self) -> u64 {
        self.view().hash
    }

    /// This node's group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Re-reads the cluster file (SIGHUP, RELOAD). A file that does not
    /// parse, or no longer lists this node in its group, changes nothing.
    /// Groups whose members did not change keep their connections; a
    /// connection opened under the old layout that reaches a node of the
    /// new one is refused or answered WRONG_GROUP, never counted apart.
    /// In etcd mode there is nothing to re-read: the watch follows etcd.
    pub fn reload(&self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let topology = load(path, &self.group, &self.own_addr)?;
        self.cluster.reload(&topology).map_err(|e| e.to_string())?;
        self.view();
        Ok(())
    }

    /// The groups this node knows: name, primary (as last found, else as
    /// the file says), follower, epoch.
    pub fn groups(&self) -> Vec<(String, String, Option<String>, u64)> {
        let view = self.view();
        let mut known = self.cluster.known();
        for local in self.locals.lock().expect("not poisoned").iter() {
            // Each thread's client learns primaries on its own: the
            // highest epoch any of them saw is the group's.
            for (name, primary, epoch) in local.known() {
                match known.iter_mut().find(|(n, _, _)| *n == name) {
                    Some(k) if epoch > k.2 || (epoch == k.2 && k.1.is_none()) => {
                        *k = (name, primary, epoch);
                    }
                    Some(_) => {}
                    None => known.push((name, primary, epoch)),
                }
            }
        }
        view.topology
            .groups
            .iter()
            .map(|g| {
                let (primary, epoch) = known
                    .iter()
                    .find(|(name, _, _)| *name == g.name)
                    .map(|(_, p, e)| (p.clone(), *e))
                    .unwrap_or((None, 0));
                (
                    g.name.clone(),
                    primary.unwrap_or_else(|| g.primary.clone()),
                    g.follower.clone(),
                    epoch,
                )
            })
            .collect()
    }

    /// Runs `batch`'s calls in a task of the calling thread (through its
    /// own cluster client: no hop) and answers it as one [`BatchReply`]
    /// (in the batch's order).
    ///
    /// The batches a thread submits in one turn of its loop (every
    /// connection read in that turn gives one) are forwarded together: the
    /// first spawns the task, which runs once the turn's other tasks have
    /// run, and it sends those bound for one owner group as one batch (one
    /// task, one deadline), then splits the answers back to each batch's
    /// connection (a batch that spans groups goes alone, so that a slow
    /// group holds up only the connections that asked it). A batch's
    /// fixed costs (the task, its timers, its reply's wake-up) were most
    /// of a forwarded call's when reads are small (a client that does not
    /// pipeline: benches/notes.md).
    pub fn submit(self: &Arc<Self>, batch: RemoteBatch) {
        let turn = self.turn();
        let mut queued = turn.lock().expect("not poisoned");
        queued.batches.push(batch);
        self.flush_later(turn.clone(), queued);
    }

    /// Starts a read that forwards, its first request bound for `group`
    /// under `view`: the items of this thread's turn for that group, for
    /// the read to push its requests onto (the reads of a turn that
    /// forward to one group gather in one batch as they are read, not
    /// copied into one afterwards: on a forwarding node at load that copy
    /// was a cache miss per request, benches/notes.md). The items are the
    /// read's until [`Forwarder::close`], which the read calls before its
    /// thread runs anything else.
    ///
    /// Only where the turn's task runs on the calling thread: with
    /// `--forward-connections shared` it runs on the forwarder's thread,
    /// which could take the turn's batches while a read holds some of
    /// them, so there a read gathers its requests in a batch of its own
    /// (merged with the turn's others when the task runs, as
    /// [`Forwarder::submit`]'s are).
    pub fn open(&self, view: &Arc<View>, group: usize) -> (RemoteItems, OpenRead) {
        let turn = self.turn();
        let mut queued = turn.lock().expect("not poisoned");
        if !queued.here {
            let room = RemoteItems::with_capacity(queued.room.max(ROOM_MIN));
            return (room, OpenRead::alone(view, group));
        }
        queued.open(view, group)
    }

    /// Whether a turn's task runs on the calling thread: it forwards
    /// there, and its runtime is current-thread (a task spawned there runs
    /// only when the thread's other tasks yield, never while a read is
    /// being handled). Fixed for a thread: its [`Turn`] keeps it.
    fn turns_here(&self) -> bool {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let here = Handle::try_current().map(|h| h.runtime_flavor());
        self.forwards_here() && matches!(here, Ok(RuntimeFlavor::CurrentThread))
    }

    /// Ends a read that [`Forwarder::open`]ed (see [`Turn::close`]) and
    /// makes sure the turn's task will forward it.
    pub fn close(
        self: &Arc<Self>,
        open: OpenRead,
        items: RemoteItems,
        reply_to: Sender<BatchReply>,
    ) {
        let turn = self.turn();
        let mut queued = turn.lock().expect("not poisoned");
        queued.close(open, items, reply_to);
        self.flush_later(turn.clone(), queued);
    }

    /// This thread's [`Turn`] of this forwarder.
    fn turn(&self) -> Arc<Mutex<Turn>> {
        TURNS.with(|turns| {
            let mut turns = turns.borrow_mut();
            match turns.iter().find(|(id, _)| *id == self.id) {
                Some((_, turn)) => turn.clone(),
                None => {
                    let turn = Arc::new(Mutex::new(Turn {
                        here: self.turns_here(),
                        ..Turn::default()
                    }));
                    turns.push((self.id, turn.clone()));
                    turn
                }
            }
        })
    }

    /// Spawns the task that forwards `turn`'s batches, unless it is
    /// spawned already and has not run (the first of the turn does).
    fn flush_later(
        self: &Arc<Self>,
        turn: Arc<Mutex<Turn>>,
        mut queued: std::sync::MutexGuard<'_, Turn>,
    ) {
        let first = !std::mem::replace(&mut queued.flushing, true);
        // Where it runs decides how reads join it: see Forwarder::open.
        let here = queued.here;
        drop(queued);
        if !first {
            return;
        }
        let this = self.clone();
        // Boxed: the batch path's state (its timers, its groups' futures)
        // is kilobytes, which the runtime would otherwise copy into and
        // through the task's cell.
        let task = Box::pin(async move {
            let (units, batches) = {
                let mut queued = turn.lock().expect("not poisoned");
                queued.flushing = false;
                let units = std::mem::take(&mut queued.units);
                let batches = std::mem::take(&mut queued.batches);
                // The next turns' units (and reads alone) start with room
                // for twice the largest of late (a maximum that decays by
                // an eighth a turn): one grown past its room moves every
                // request gathered so far, the copy they are gathered in
                // place to avoid (room not written is not a cache line
                // touched).
                let units_max = units.iter().map(|u| u.items.ops.len()).max();
                let batches_max = batches.iter().map(|b| b.items.ops.len()).max();
                let largest = units_max.max(batches_max).unwrap_or(0);
                let decayed = queued.room - queued.room / 8;
                queued.room = decayed.max(2 * largest);
                (units, batches)
            };
            this.run_turn(units, batches).await;
        });
        if here {
            drop(tokio::spawn(task));
        } else {
            drop(self.runtime.spawn(task));
        }
    }

    /// Forwards a turn's batches and answers each (see
    /// [`Forwarder::submit`]): the batches bound for one owner group (under
    /// one view) as one, each batch that spans groups alone. So a group
    /// that is slow to answer (stopped, partitioned: up to the deadline)
    /// delays only the connections that asked it, as it did when every
    /// read forwarded alone.
    async fn run_turn(self: Arc<Self>, units: Vec<Unit>, batches: Vec<RemoteBatch>) {
        let mut units: Vec<(RemoteItems, Vec<AnswerTo>)> =
            units.into_iter().map(|u| (u.items, u.answer_to)).collect();
        units.extend(by_owner(batches).into_iter().map(|mut unit| {
            if unit.len() == 1 {
                // Alone: forwarded as it is, not copied.
                let RemoteBatch { reply_to, items } = unit.pop().expect("one");
                let n = items.ops.len();
                (items, vec![(reply_to, n)])
            } else {
                merge(unit)
            }
        }));
        let first = units.pop().expect("a turn has a batch");
        for (items, answer_to) in units {
            // On this thread too, each with its own deadline.
            let this = self.clone();
            tokio::spawn(Box::pin(
                async move { this.run_unit(items, answer_to).await },
            ));
        }
        self.run_unit(first.0, first.1).await;
    }

    /// Forwards `all` as one batch and answers each of `answer_to` its
    /// share, in order.
    ///
    /// The answers are made once, in the batch's order, and each
    /// connection takes its own from them in place
    /// ([`BatchReply::shared`]): a vector of answers made for each
    /// connection was one more write of every answer, and on a forwarding
    /// node at load every such pass over a batch is a cache miss per
    /// request (benches/notes.md).
    async fn run_unit(&self, all: RemoteItems, answer_to: Vec<AnswerTo>) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        // CELLs by hash of one group under one view (a turn's unit): sent
        // as they are.
        let cells_of = match all.ops {
            RemoteOps::Cells(_) => all.one_group().map(|(_, group)| group),
            RemoteOps::Ops(_) => None,
        };
        let RemoteItems {
            seqs,
            ops,
            groups,
            view,
            mixed,
        } = all;
        let outcomes = match (view, ops, cells_of) {
            (Some(view), RemoteOps::Cells(cells), Some(group)) => {
                self.forward_cells(&view, cells, (group, &groups)).await
            }
            (Some(view), ops, _) if !mixed => {
                self.forward(&view, ops.into_ops(), Some(&groups)).await
            }
            (_, ops, _) => self.forward(&self.view(), ops.into_ops(), None).await,
        };
        let answers = SharedAnswers::new(seqs, outcomes);
        let mut at = 0;
        for (reply_to, n) in answer_to {
            // The connection may be gone: nothing waits for the answer then.
            let _ = reply_to.send(BatchReply::shared(answers.clone(), at..at + n));
            at += n;
        }
    }

    /// Whether the calling thread may call [`Forwarder::forward`] itself
    /// (it has connections of its own, or it is the forwarder thread);
    /// else [`Forwarder::submit`] hands its forwards to the forwarder
    /// thread.
    pub fn forwards_here(&self) -> bool {
        self.per_thread || self.on_thread()
    }

    /// The calling thread's cluster client: the forwarder thread's own, or
    /// one made for this thread at its first forward (from the layout in
    /// force, with the same settings) and brought up to date with every
    /// later layout as it is used. Its connections are made, and live, on
    /// this thread. With it, the client's generation under which `view`'s
    /// ring indices are the client's own, if they are (both were made from
    /// the same layout).
    pub fn cluster_here(&self, view: &View) -> (Cluster, Option<u64>) {
        let generation = self.cluster.generation();
        if !self.per_thread || self.on_thread() {
            let same = (view.generation == generation).then_some(generation);
            return (self.cluster.clone(), same);
        }
        let me = self.id;
        HERE.with(|here| {
            let mut here = here.borrow_mut();
            if let Some((owner, seen, cluster)) = here.as_mut() {
                if *owner == me {
                    if *seen != generation {
                        // Groups whose members did not change keep their
                        // connections (Cluster::reload).
                        if let Err(e) = cluster.reload(&self.cluster.topology().0) {
                            tracing::warn!(error = %e, "a thread's cluster client kept its layout");
                        }
                        cluster.share_cell_by_hash_flags(&self.cluster);
                        *seen = generation;
                    }
                    let same = (view.generation == generation).then(|| cluster.generation());
                    return (cluster.clone(), same);
                }
            }
            let (topology, _) = self.cluster.topology();
            let cluster = Cluster::new(&topology, self.base.clone())
                .expect("the layout in force was validated when it was taken");
            // Its finds are what the view's flags read.
            cluster.share_cell_by_hash_flags(&self.cluster);
            self.locals
                .lock()
                .expect("not poisoned")
                .push(cluster.clone());
            *here = Some((me, generation, cluster.clone()));
            let same = (view.generation == generation).then(|| cluster.generation());
            (cluster, same)
        })
    }

    /// Whether the caller runs on the forwarder thread: then it may call
    /// [`Forwarder::forward`] directly, with no hop to another thread.
    pub fn on_thread(&self) -> bool {
        std::thread::current().id() == self.thread
    }

    /// Runs `f` on the forwarder thread, in the background (the rate
    /// limit service's first thread is this one: see `rls::start`).
    pub fn spawn<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.runtime.spawn(f);
    }

    /// Decides `ops` on their owners through the calling thread's cluster
    /// client's batch path (one frame and one deadline per owner
    /// connection), counted; each answer as the [`Outcome`] its
    /// connection answers, [`Kept`] (made in the batch's one pass over its
    /// replies).
    /// `groups`: each op's group in `view`, if the caller looked them up.
    pub async fn forward(
        &self,
        view: &View,
        ops: Vec<RemoteOp>,
        groups: Option<&[usize]>,
    ) -> Vec<Kept> {
        let looked_up: Vec<usize>;
        let groups = match groups {
            Some(groups) => groups,
            None => {
                looked_up = ops
                    .iter()
                    .map(|op| view.group_of(op.route_hash()))
                    .collect();
                &looked_up
            }
        };
        let (cluster, generation) = self.cluster_here(view);
        let start = Instant::now();
        let route = generation.map(|g| (g, groups));
        let answers = cluster
            .batch_routed_with(ops, route, self.failure, self.keep())
            .await;
        self.count(view, groups, start.elapsed());
        answers
    }

    /// [`Forwarder::forward`] of CELLs by their keys' hash, all of group
    /// `group` in `view` (`groups`: each one's, for the counts).
    async fn forward_cells(
        &self,
        view: &View,
        cells: Vec<CellByHash>,
        (group, groups): (usize, &[usize]),
    ) -> Vec<Kept> {
        let (cluster, generation) = self.cluster_here(view);
        let Some(generation) = generation else {
            // The client's layout is not the view's: routed again.
            let ops = cells.into_iter().map(RemoteOp::from).collect();
            return self.forward(view, ops, None).await;
        };
        let start = Instant::now();
        let answers = cluster
            .cells_by_hash_with(cells, (generation, group), self.failure, self.keep())
            .await;
        self.count(view, groups, start.elapsed());
        answers
    }

    /// A forward's answer as its connection keeps it, made as each reply
    /// is read: the verdicts in place (small, so that it is inlined into
    /// the reply pass), the rest apart.
    fn keep(&self) -> impl Fn(Answered) -> Kept + Clone + Send + Sync + 'static {
        let errors = self.stats.errors.clone();
        move |a: Answered| match a {
            Ok(Answer::Cell(_, v)) => Kept::Cell(v),
            Ok(Answer::Verdict(_, v)) => Kept::Verdict(v),
            other => kept_other(&errors, other),
        }
    }

    /// Counts a batch's forwarded requests (to `groups`, ring indices of
    /// `view`), which took `rtt`.
    fn count(&self, view: &View, groups: &[usize], rtt: Duration) {
        let s = &self.stats;
        {
            let mut counters = s.groups.lock().expect("not poisoned");
            let mut i = 0;
            while i < groups.len() {
                // Runs of one group count under one lookup.
                let g = groups[i];
                let run = groups[i..].iter().take_while(|&&h| h == g).count();
                let name = view.ring.name(g);
                match counters.get_mut(name) {
                    Some(c) => c.forwarded += run as u64,
                    None => {
                        let c = counters.entry(name.to_owned()).or_default();
                        c.forwarded += run as u64;
                    }
                }
                i += run;
            }
        }
        let n = groups.len() as u64;
        let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX);
        let bucket = (64 - us.leading_zeros() as usize).min(RTT_BUCKETS - 1);
        s.rtt[bucket].fetch_add(n, Ordering::Relaxed);
        let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
        s.rtt_ns_sum
            .fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
    }
}

/// A turn's batches in the units forwarded together: those bound for one
/// group under one view as one unit, each other batch alone.
fn by_owner(batches: Vec<RemoteBatch>) -> Vec<Vec<RemoteBatch>> {
    let mut units: Vec<Vec<RemoteBatch>> = Vec::new();
    // (unit, view, group) of the units bound for one group.
    let mut single: Vec<(usize, *const View, usize)> = Vec::new();
    for batch in batches {
        let Some((view, group)) = batch.items.one_group() else {
            units.push(vec![batch]);
            continue;
        };
        match single.iter().find(|(_, v, g)| *v == view && *g == group) {
            Some(&(unit, _, _)) => units[unit].push(batch),
            None => {
                single.push((units.len(), view, group));
                units.push(vec![batch]);
            }
        }
    }
    units
}

/// Where a batch's answers go, and how many requests it has.
type AnswerTo = (Sender<BatchReply>, usize);

/// A turn's batches as one: their requests one after the other (under
/// one view, or marked mixed so that they are looked up again), and
/// where each batch's answers go, with how many it has.
fn merge(batches: Vec<RemoteBatch>) -> (RemoteItems, Vec<AnswerTo>) {
    let n: usize = batches.iter().map(|b| b.items.ops.len()).sum();
    let mut all = RemoteItems::with_capacity(n);
    let answer_to = batches
        .into_iter()
        .map(|RemoteBatch { reply_to, items }| (reply_to, all.append(items)))
        .collect();
    (all, answer_to)
}

/// Which of [`ForwardStats`]'s error counters a forward's error counts under:
/// not applied, outcome unknown, refused by the owner, other.
fn error_kind(e: &Error) -> usize {
    match e {
        Error::Unavailable {
            outcome_unknown: false,
            ..
        } => 0,
        Error::Unavailable { .. } | Error::Timeout(_) | Error::Disconnected => 1,
        Error::Server { .. } => 2,
        _ => 3,
    }
}

/// A forwarded request's answer that is not a verdict, as it is kept for
/// its connection; an error counted by kind.
#[cold]
#[inline(never)]
fn kept_other(errors: &[AtomicU64; ERROR_KINDS.len()], answer: Answered) -> Kept {
    if let Err(e) = &answer {
        errors[error_kind(e)].fetch_add(1, Ordering::Relaxed);
    }
    Kept::new(outcome(answer))
}

/// A forwarded request's answer as the outcome its connection answers.
pub fn outcome(answer: Answered) -> Outcome {
    match answer {
        Ok(Answer::Verdict(_, v)) => Outcome::Verdict(v),
        Ok(Answer::Decide(_, d)) => Outcome::Multi(Box::new(multi(d))),
        Ok(Answer::Cell(_, v)) => Outcome::Cell(v),
        Ok(Answer::Lease(ok)) => Outcome::LeaseOk(ok),
        Err(e) => failed(&e),
    }
}

/// CLUSTER_OK for a node with `forward` (`--cluster`): its layout and
/// groups (empty without), and which group owns `key` (when not empty).
pub fn cluster_ok(forward: Option<&Forwarder>, key: &[u8]) -> ClusterOk {
    let Some(forward) = forward else {
        return ClusterOk::default();
    };
    let view = forward.view();
    let groups: Vec<GroupInfo> = forward
        .groups()
        .into_iter()
        .map(|(name, primary, follower, epoch)| GroupInfo {
            name,
            primary,
            follower: follower.unwrap_or_default(),
            epoch,
        })
        .collect();
    let index = |name: &str| {
        groups
            .iter()
            .position(|g| g.name == name)
            .and_then(|i| u16::try_from(i).ok())
    };
    let owner = (!key.is_empty())
        .then(|| index(view.owner(key_hash(key))))
        .flatten();
    ClusterOk {
        layout: view.hash,
        own: index(forward.group()),
        owner,
        truncated: false,
        groups,
    }
}

/// A forward's error as the outcome its connection answers.
pub fn failed(e: &Error) -> Outcome {
    let status = match e {
        Error::Unavailable {
            outcome_unknown: true,
            ..
        }
        | Error::Timeout(_)
        | Error::Disconnected => Status::OutcomeUnknown,
        Error::Unavailable { .. } | Error::Connect { .. } => Status::GroupUnavailable,
        Error::Server {
            status: Some(s), ..
        } => *s,
        Error::Invalid(_) => Status::BadRequest,
        Error::Server { status: None, .. } | Error::Protocol(_) => Status::Internal,
    };
    let text = match e {
        Error::Server { text, .. } => text.clone(),
        other => format!("{}: {other}", status.text()),
    };
    Outcome::Failed(status, text)
}

/// A DECIDE_OK as the shard's [`MultiVerdict`].
pub fn multi(d: DecideOk) -> MultiVerdict {
    let mut m = MultiVerdict {
        allowed: d.allowed,
        denied_index: d.denied_index,
        retry_after_ns: d.retry_after_ns,
        count: 0,
        verdicts: [crate::shard::table::NO_VERDICT; sluice_protocol::message::LIMITS_MAX],
        priority: d.priority,
    };
    for (slot, v) in m.verdicts.iter_mut().zip(&d.verdicts) {
        *slot = *v;
        m.count += 1;
    }
    m
}

/// The cluster file at `path`, if it lists `own_addr` in `group`.
fn load(path: &std::path::Path, group: &str, own_addr: &str) -> Result<Topology, String> {
    let topology = Topology::load(path).map_err(|e| e.to_string())?;
    let Some(spec) = topology.groups.iter().find(|g| g.name == group) else {
        let names: Vec<&str> = topology.groups.iter().map(|g| g.name.as_str()).collect();
        return Err(format!(
            "{} has no group `{group}` (--group); its groups are {}",
            path.display(),
            names.join(", ")
        ));
    };
    let listed = spec.primary == own_addr || spec.follower.as_deref() == Some(own_addr);
    if !listed {
        return Err(format!(
            "{} does not list this node in group `{group}`: expected `{own_addr}` (--advertise, or the listening address) as its primary or follower, found primary `{}`{}",
            path.display(),
            spec.primary,
            spec.follower
                .as_deref()
                .map(|f| format!(", follower `{f}`"))
                .unwrap_or_default()
        ));
    }
    Ok(topology)
}

/// The view of `cluster`'s layout now, for a node of `group`.
fn make_view(cluster: &Cluster, group: &str) -> View {
    let generation = cluster.generation();
    let (topology, hash) = cluster.topology();
    let ring = Ring::new(topology.groups.iter().map(|g| g.name.as_str()));
    // Flags of another layout (a reload between the reads) are dropped:
    // every group is then sent keys until the next view.
    let (at, flags) = cluster.cell_by_hash_flags();
    let cells_by_hash = if at == generation && flags.len() == ring.group_count() {
        flags
    } else {
        Vec::new()
    };
    View {
        own: ring.index_of(group),
        ring,
        hash,
        generation,
        topology,
        cells_by_hash,
    }
}

/// The cluster client of etcd's layout (`--coordinator`), watched on the
/// forwarder's runtime.
#[cfg(feature = "etcd")]
fn etcd_cluster(
    runtime: &tokio::runtime::Handle,
    url: &str,
    cluster_name: &str,
    base: ClusterConfig,
    own: Topology,
) -> Result<Cluster, String> {
    let url = format!("{url}/{cluster_name}");
    let (tx, rx) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let _ = tx.send(Cluster::from_etcd_or(&url, base, Some(&own)).await);
    });
    rx.recv_timeout(Duration::from_secs(10))
        .map_err(|_| "etcd gave no layout within 10 s".to_owned())?
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "etcd"))]
fn etcd_cluster(
    _: &tokio::runtime::Handle,
    _: &str,
    _: &str,
    _: ClusterConfig,
    _: Topology,
) -> Result<Cluster, String> {
    Err("this sluiced was built without etcd".to_owned())
}

/// Requests a turn's unit has room for at least.
const ROOM_MIN: usize = 64;

/// A thread's forwards of this turn (batches [`Forwarder::submit`]ted,
/// reads gathered by [`Forwarder::open`]), and whether the task that
/// forwards them is spawned and has not run yet.
#[derive(Debug, Default)]
struct Turn {
    /// Batches submitted whole (the rate limit service's, reads that
    /// spread over groups).
    batches: Vec<RemoteBatch>,
    /// The reads bound for one group, gathered as they were read.
    units: Vec<Unit>,
    flushing: bool,
    /// Requests a new unit (or a read alone) has room for: twice the
    /// largest of late.
    room: usize,
    /// The turn's task runs on the thread whose turn it is
    /// ([`Forwarder::turns_here`]): only then do reads join its units.
    here: bool,
}

impl Turn {
    /// See [`Forwarder::open`].
    fn open(&mut self, view: &Arc<View>, group: usize) -> (RemoteItems, OpenRead) {
        let room = self.room.max(ROOM_MIN);
        let items = match self.unit(view, group) {
            Some(unit) => std::mem::take(&mut unit.items),
            None => RemoteItems::with_capacity(room),
        };
        let open = OpenRead {
            view: view.clone(),
            group,
            start: items.ops.len(),
            spread: false,
            other_view: false,
            alone: false,
        };
        (items, open)
    }

    /// `items` back from a read that [`Turn::open`]ed them, whose
    /// requests (those from where it began) are answered to `reply_to` as
    /// one [`BatchReply`]. A read whose requests all went to one group
    /// joins that group's unit; one that spread over groups (or views) is
    /// taken out and goes alone, as a submitted batch that spans groups
    /// does.
    fn close(&mut self, open: OpenRead, mut items: RemoteItems, reply_to: Sender<BatchReply>) {
        let n = items.ops.len() - open.start;
        let OpenRead {
            view,
            group,
            start,
            spread,
            other_view,
            alone,
        } = open;
        if alone {
            return self.batches.push(RemoteBatch { reply_to, items });
        }
        if spread {
            let alone = items.split_off(start, view.clone(), other_view);
            self.batches.push(RemoteBatch {
                reply_to,
                items: alone,
            });
            if let Some(unit) = self.unit(&view, group) {
                unit.items = items;
            }
            return;
        }
        match self.unit(&view, group) {
            Some(unit) => {
                unit.items = items;
                unit.answer_to.push((reply_to, n));
            }
            None => self.units.push(Unit {
                view,
                group,
                items,
                answer_to: vec![(reply_to, n)],
            }),
        }
    }

    /// The unit of the reads bound for `group` under `view`.
    fn unit(&mut self, view: &Arc<View>, group: usize) -> Option<&mut Unit> {
        self.units
            .iter_mut()
            .find(|u| u.group == group && Arc::ptr_eq(&u.view, view))
    }
}

/// A turn's reads bound for one group under one view: their requests, one
/// read's after another's, and where each read's answers go.
#[derive(Debug)]
struct Unit {
    view: Arc<View>,
    group: usize,
    items: RemoteItems,
    answer_to: Vec<AnswerTo>,
}

thread_local! {
    /// This thread's [`Turn`] for each forwarder (by its id). Shared with
    /// the forwarding task, which may run on the forwarder's thread.
    static TURNS: RefCell<Vec<(u64, Arc<Mutex<Turn>>)>> = const { RefCell::new(Vec::new()) };
    /// This thread's cluster client ([`Forwarder::cluster_here`]): the
    /// forwarder it belongs to (its id), the layout generation it last
    /// took, the client.
    static HERE: RefCell<Option<(u64, u64, Cluster)>> = const { RefCell::new(None) };
}

/// The forwarder thread: a current-thread runtime that runs until the
/// process ends (its connections close with it).
fn spawn_runtime() -> Result<(tokio::runtime::Handle, std::thread::ThreadId), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the forwarder's runtime: {e}"))?;
    let handle = runtime.handle().clone();
    let thread = std::thread::Builder::new()
        .name("sluice-forward".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .map_err(|e| format!("cannot start the forwarder thread: {e}"))?;
    Ok((handle, thread.thread().id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> Arc<View> {
        let topology =
            Topology::new()
                .group("a", "127.0.0.1:1", None)
                .group("b", "127.0.0.1:2", None);
        let ring = Ring::new(["a", "b"]);
        Arc::new(View {
            own: ring.index_of("a"),
            ring,
            hash: 1,
            generation: 1,
            topology,
            cells_by_hash: Vec::new(),
        })
    }

    fn batch(seqs: &[u64], view: &Arc<View>) -> (RemoteBatch, crate::inbox::Receiver<BatchReply>) {
        let (reply_to, rx) = crate::inbox::inbox();
        let mut items = RemoteItems::with_capacity(seqs.len());
        for &seq in seqs {
            let op = RemoteOp::Cell {
                key: bytes::Bytes::from(format!("k{seq}")),
                policy: sluice_protocol::cell::CellPolicy::new(4, 5, 60).unwrap(),
                quantity: 1,
            };
            items.push(seq, op, view, 1);
        }
        (RemoteBatch { reply_to, items }, rx)
    }

    fn batch_to(
        seqs: &[u64],
        view: &Arc<View>,
        groups: &[usize],
    ) -> (RemoteBatch, crate::inbox::Receiver<BatchReply>) {
        let (mut b, rx) = batch(seqs, view);
        b.items.groups = groups.to_vec();
        (b, rx)
    }

    /// The batches bound for one group go together; one that spans
    /// groups goes alone (a slow group holds up only its own askers).
    #[test]
    fn a_turns_batches_go_together_by_owner_group() {
        let v = view();
        let (b0, _r0) = batch_to(&[1], &v, &[1]);
        let (b1, _r1) = batch_to(&[2, 3], &v, &[0, 1]);
        let (b2, _r2) = batch_to(&[4], &v, &[0]);
        let (b3, _r3) = batch_to(&[5, 6], &v, &[1, 1]);
        let (b4, _r4) = batch_to(&[7], &v, &[0]);
        let units = by_owner(vec![b0, b1, b2, b3, b4]);
        let seqs: Vec<Vec<Vec<u64>>> = units
            .iter()
            .map(|u| u.iter().map(|b| b.items.seqs.clone()).collect())
            .collect();
        assert_eq!(
            seqs,
            [
                vec![vec![1], vec![5, 6]],
                vec![vec![2, 3]],
                vec![vec![4], vec![7]]
            ]
        );
    }

    /// Pushes a read's requests (`(seq, group)`) as a connection does
    /// between [`Turn::open`] and [`Turn::close`].
    fn read(
        turn: &mut Turn,
        view: &Arc<View>,
        reqs: &[(u64, usize)],
    ) -> crate::inbox::Receiver<BatchReply> {
        let (reply_to, rx) = crate::inbox::inbox();
        let (mut items, mut open) = turn.open(view, reqs[0].1);
        for &(seq, group) in reqs {
            open.note(view, group);
            let (one, _) = batch(&[seq], view);
            items.push(
                seq,
                one.items.ops.into_ops().into_iter().next().unwrap(),
                view,
                group,
            );
        }
        turn.close(open, items, reply_to);
        rx
    }

    /// The reads of a turn bound for one group gather in one unit as they
    /// are read, each read's answers counted; a read that spreads over
    /// groups goes alone and leaves the unit as it found it; another
    /// view's reads are a unit of their own.
    #[test]
    fn a_turns_reads_gather_by_group_and_a_spread_read_goes_alone() {
        let v = view();
        let mut turn = Turn::default();
        let _r1 = read(&mut turn, &v, &[(1, 1), (2, 1)]);
        let _r2 = read(&mut turn, &v, &[(5, 0)]);
        let _r3 = read(&mut turn, &v, &[(7, 1), (8, 0), (9, 1)]);
        let _r4 = read(&mut turn, &v, &[(3, 1)]);
        let other = view();
        let _r5 = read(&mut turn, &other, &[(4, 1)]);
        let units: Vec<(usize, Vec<u64>, Vec<usize>)> = turn
            .units
            .iter()
            .map(|u| {
                let counts = u.answer_to.iter().map(|(_, n)| *n).collect();
                (u.group, u.items.seqs.clone(), counts)
            })
            .collect();
        assert_eq!(
            units,
            [
                (1, vec![1, 2, 3], vec![2, 1]),
                (0, vec![5], vec![1]),
                (1, vec![4], vec![1]),
            ]
        );
        assert!(turn.units.iter().all(|u| !u.items.mixed));
        assert!(Arc::ptr_eq(
            turn.units[2].items.view.as_ref().unwrap(),
            &other
        ));
        let [alone] = turn.batches.as_slice() else {
            panic!("one read went alone: {:?}", turn.batches.len());
        };
        assert_eq!(alone.items.seqs, [7, 8, 9]);
        assert_eq!(alone.items.groups, [1, 0, 1]);
        assert!(!alone.items.mixed, "one view: its groups hold");
        assert_eq!(alone.items.one_group(), None);

        // A read on a thread whose turn another thread runs: a batch of
        // its own, whole, and the units untouched.
        let (reply_to, _r6) = crate::inbox::inbox();
        let mut items = RemoteItems::with_capacity(2);
        for seq in [11, 12] {
            let (one, _) = batch(&[seq], &v);
            items.push(
                seq,
                one.items.ops.into_ops().into_iter().next().unwrap(),
                &v,
                1,
            );
        }
        turn.close(OpenRead::alone(&v, 1), items, reply_to);
        assert_eq!(turn.units[0].items.seqs, [1, 2, 3]);
        assert_eq!(turn.batches.len(), 2);
        assert_eq!(turn.batches[1].items.seqs, [11, 12]);
        assert_eq!(
            turn.batches[1].items.one_group(),
            Some((Arc::as_ptr(&v), 1))
        );
    }

    /// A batch's ops stay CELLs by hash while every one is; the first of
    /// another kind (here a CELL with its key: an owner of an older
    /// version) turns them into ops, in order; merging and splitting keep
    /// the order too.
    #[test]
    fn a_batchs_cells_by_hash_turn_into_ops_in_order_when_another_kind_comes() {
        let policy = sluice_protocol::cell::CellPolicy::new(4, 5, 60).unwrap();
        let by_hash = |h: u64| RemoteOp::CellByHash {
            hash: [h, 0],
            policy,
            quantity: 1,
        };
        let hash_of = |op: &RemoteOp| match op {
            RemoteOp::CellByHash { hash, .. } => hash[0],
            RemoteOp::Cell { .. } => 0,
            other => panic!("{other:?}"),
        };
        let mut ops = RemoteOps::default();
        ops.push(by_hash(1));
        ops.push(by_hash(2));
        assert!(matches!(&ops, RemoteOps::Cells(c) if c.len() == 2));
        let mut more = RemoteOps::default();
        more.push(by_hash(3));
        ops.extend(more);
        assert!(matches!(&ops, RemoteOps::Cells(c) if c.len() == 3));
        ops.push(RemoteOp::Cell {
            key: bytes::Bytes::from_static(b"k"),
            policy,
            quantity: 1,
        });
        assert!(matches!(&ops, RemoteOps::Ops(o) if o.len() == 4));
        let mut tail = RemoteOps::default();
        tail.push(by_hash(5));
        ops.extend(tail);
        let split = ops.split_off(3);
        let seen: Vec<u64> = ops.into_ops().iter().map(hash_of).collect();
        assert_eq!(seen, [1, 2, 3]);
        let seen: Vec<u64> = split.into_ops().iter().map(hash_of).collect();
        assert_eq!(seen, [0, 5]);
    }

    /// A turn's batches go as one, in order, each keeping its own
    /// sequence numbers; batches under two views are looked up again.
    #[test]
    fn a_turns_batches_merge_in_order_and_two_views_mark_them_mixed() {
        let v = view();
        let (one, _rx1) = batch(&[7, 8], &v);
        let (two, _rx2) = batch(&[3], &v);
        let (all, answer_to) = merge(vec![one, two]);
        assert!(!all.mixed);
        assert!(Arc::ptr_eq(all.view.as_ref().unwrap(), &v));
        let ops = all.ops.into_ops();
        let keys: Vec<&[u8]> = ops.iter().map(|op| op.key()).collect();
        assert_eq!(keys, [&b"k7"[..], b"k8", b"k3"]);
        assert_eq!(all.groups, [1, 1, 1]);
        assert_eq!(all.seqs, [7, 8, 3], "each keeps its connection's numbers");
        let counts: Vec<usize> = answer_to.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts, [2, 1]);

        let (one, _rx1) = batch(&[1], &v);
        let (two, _rx2) = batch(&[2], &view());
        let (all, _) = merge(vec![one, two]);
        assert!(
            all.mixed,
            "a second view's ring indices are not the first's"
        );
    }
}
