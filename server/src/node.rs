//! What a node's shards share ([`Node`]: the config, the role, every
//! shard's inbox, the forwarder) and what the tasks of one shard's thread
//! share ([`ShardCore`]: its table, clock and tiers, and the per-shard state
//! of the coordinator and of replication, whose types those modules own).
//!
//! Both sit above [`shard`](crate::shard), whose table and decision types
//! they hold, and [`mailbox`](crate::mailbox), whose [`ShardMsg`] the
//! node's inboxes carry; below the tasks that use them (connections, the
//! coordinator, replication) and the shard's thread (`worker.rs`) that
//! runs those.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use sluice_protocol::identity::bucket_key;
use sluice_protocol::limit::{Concurrency, Kind};
use sluice_protocol::message::{Decide, LeaseOp, LeaseTarget, LimitSet, Limits, RequestError};
use sluice_protocol::{MonotonicClock, Status};
use tokio::sync::watch;

use crate::config::Config;
use crate::inbox::Sender;
use crate::mailbox::ShardMsg;
use crate::replication::machine::FlowShard;
use crate::replication::ReplNode;
use crate::reply_budget::ShardReplies;
use crate::shard::{table, DecideOp, LimitRef, PublishedStats, Table};
use crate::sync::{Arc, Ordering};
use crate::tiers::Tiers;

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
    /// Each shard's fixed windows over their limit, which it publishes
    /// and any thread may read (`--rls-over-limit-slots`; the rate limit
    /// service denies from it without a hop).
    pub over_limit: Vec<Arc<crate::shard::over_limit::OverLimit>>,
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
    drained_tx: Sender<u16>,
    /// Whether `drained_tx` has been used.
    drained_sent: Cell<bool>,
    /// Reply bytes this shard's connections owe together, and the shard's
    /// share of `--reply-bytes-node-max` (see `coordinator::ReplyShare`).
    pub replies: ShardReplies,
}

impl ShardCore {
    /// Shard `id`'s core, on its own thread: an empty table whose lease ids
    /// are drawn for the node's epoch, the tiers the config loaded, no
    /// connection yet. It reports drained on `drained_tx`.
    pub fn new(
        id: u16,
        node: Arc<Node>,
        clock: MonotonicClock,
        drained_tx: Sender<u16>,
    ) -> ShardCore {
        let tiers = RefCell::new(Arc::new(node.config.tiers.clone()));
        // Lease ids are unique per node and epoch: each shard counts in
        // its own range.
        let base = table::lease_id_base(node.epoch(), id);
        let mut table = Table::with_cap(node.config.keys_max, base);
        table.set_heap_bytes_max(node.config.heap_bytes_max);
        table.publish_over_limit(node.over_limit[usize::from(id)].clone());
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
            replies: ShardReplies::new(reply_share),
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

    /// Publishes the table's counters, and the reply bytes the shard's
    /// connections owe, for STATS ([`PublishedStats::publish`]).
    pub fn publish_stats(&self) {
        self.published()
            .publish(&self.table.borrow(), self.replies.owed());
    }

    /// Counts one ERROR reply.
    #[inline]
    pub fn count_error(&self, status: Status) {
        self.published().count_error(status);
    }

    /// Counts bytes read (`true`) or written on a client connection.
    #[inline]
    pub fn count_io(&self, read: bool, n: usize) {
        self.published().count_io(read, n);
    }

    /// Counts one frame handled in `ns`.
    #[inline]
    pub fn count_frame(&self, ns: u64) {
        self.published().count_frame(ns);
    }

    /// Counts one forwarded batch of `requests`, decided in `ns`.
    #[inline]
    pub fn count_batch(&self, requests: usize, ns: u64) {
        self.published().count_batch(requests, ns);
    }

    /// Counts one full sync completed to a follower.
    pub fn count_full_sync(&self) {
        self.published().count_full_sync();
    }

    /// Counts one drain acknowledged `ns` after its SYNC was written.
    pub fn count_ack(&self, ns: u64) {
        self.published().count_ack(ns);
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
