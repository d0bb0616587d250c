//! Replication: a primary streams the state of every bucket it changes to
//! one follower, per shard flow; the follower applies it and refuses to
//! spend until it is promoted.
//!
//! - [`ReplNode`]: the node's role, epoch and replication state, shared by
//!   every thread and changeable at run time (promotion).
//! - [`primary`]: a primary shard's flow: the full sync of its table, then
//!   the stream of changed buckets; the acks that let sync-mode replies go.
//! - [`follower`]: the follower's side: connect to the primary, one flow per
//!   primary shard, apply records on the shard that owns each key (the
//!   follower's layout, which may differ), ack.
//! - [`machine`]: the two flows' decisions as sans-IO machines (time and
//!   parsed data in; SYNCs, releases, acks and promotions out), which the
//!   tasks of [`primary`] and [`follower`] drive in production and
//!   `server/tests/simulation.rs` drives under simulated faults.
//!
//! What is promised (README, "Replication"): in sync mode a reply that
//! reflects a change leaves the primary only after the follower has
//! acknowledged that change (the follower acks only what it has applied),
//! so kill -9 of a streaming primary then `sluice promote` admits nothing a
//! client was not already told; in async mode a crash can re-grant what
//! the primary admitted in the interval not yet acknowledged (the lag,
//! reported by ROLE).

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod follower;
pub mod lease;
pub mod machine;
pub mod primary;

use sluice_protocol::replication::{Mode, ReplState, Role, RoleOk};

use crate::config::Replication;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// How often an idle flow sends an empty SYNC (the follower acks it, so
/// both sides learn the link is alive).
pub const HEARTBEAT_MS: u64 = 50;
/// How far past its own epoch a node believes an epoch a peer or client
/// tells it in HELLO: epochs rise by one per promotion (or to an etcd
/// revision), so a jump of more than 2^32 is a bug or an attack, and
/// adopting it would leave the group a few steps from u64::MAX, where no
/// promotion could raise it. Such a HELLO is refused with BAD_REQUEST.
pub const EPOCH_JUMP_MAX: u64 = 1 << 32;
/// Async mode: how long a flow lets changes gather before a drain (sync
/// mode, where replies wait for it, drains as soon as the shard is free or
/// its last drain is acknowledged: see [`SYNC_GROUP_ENTRIES`]).
pub const ASYNC_DRAIN_MS: u64 = 1;
/// Sync mode's group commit: while a drain is unacknowledged, the next one
/// waits for its ack (the changes made meanwhile gather into it) unless
/// this many change entries already wait. Each drain costs the two sides a
/// write, a read and a wake-up, about 18 us of CPU between them here; 50
/// clients a request at a time made 5 decisions a drain without the wait,
/// 20 with it. At 64 entries a drain's own cost is about that of its
/// decisions, and waiting longer only delays pipelined clients' replies
/// by a round trip (waiting for every ack took 50 x 64 from 0.72 to 0.61
/// of the primary alone). Measurements: benches/notes.md, "Replication".
pub const SYNC_GROUP_ENTRIES: usize = 64;
/// Slots of each fixed-size table a full sync reads per step before it
/// yields to the shard's other work (so a large table's full sync never
/// stalls the shard for long).
pub const FULL_SYNC_SLOTS_PER_STEP: usize = 8_192;
/// A flow whose write to its follower stays blocked this long (the
/// follower stopped reading: paused, or its host gone without a reset)
/// ends, and the shard serves alone until the follower resyncs. Without
/// it, in async mode (where no reply waits for an ack) the primary would
/// keep every bucket changed since in its change log.
pub const FLOW_WRITE_TIMEOUT_MS: u64 = 10_000;
/// A follower that lost its primary waits this long before trying again.
pub const RECONNECT_MS: u64 = 200;
/// How often a primary with `--peer` asks its peer's role (and how long
/// it waits for the answer).
pub const PEER_CHECK_MS: u64 = 500;
/// Longest lease a primary holds (it stops admitting when it has had no
/// ack for this long): half the follower's `--promote-after-ms`, at most
/// this, so a primary cut off from its follower stops within 200 ms.
pub const LEASE_MS_MAX: u64 = 200;
/// How often a follower with `--promote-after-ms` looks at the silence.
pub const WATCHDOG_MS: u64 = 10;
/// Why PROMOTE and FAILOVER are refused with `--coordinator` (a
/// [`ReplNode::coordinated`] node): the text both answer with.
pub const COORDINATED: &str = "leadership is held in etcd (--coordinator): the node that holds the group's leader key is the primary; stop this node (or let its lease lapse) to move it";

/// The node's place in its group, shared by every thread: written by
/// promotion and by the replication tasks, read by every connection.
#[derive(Debug)]
pub struct ReplNode {
    /// [`Role`] code.
    role: AtomicU64,
    /// Raised by every promotion.
    epoch: AtomicU64,
    /// [`ReplState`] code.
    state: AtomicU64,
    /// The primary's replication mode (from `--replication`).
    pub mode: Mode,
    /// Lag in microseconds (see [`RoleOk::lag_us`]).
    pub lag_us: AtomicU64,
    /// Buckets moved by full syncs.
    pub keys_synced: AtomicU64,
    /// SYNC payload bytes sent (primary) or received (follower).
    pub stream_bytes: AtomicU64,
    /// Records sent (primary) or received (follower).
    pub stream_records: AtomicU64,
    /// SYNC messages sent (primary) or received (follower): records over
    /// this are the records a drain carries (see [`SYNC_GROUP_ENTRIES`]).
    pub stream_syncs: AtomicU64,
    /// Follower: bumped every time it starts following anew (and at
    /// promotion), so that flows of an older attempt stop.
    pub follow_gen: AtomicU64,
    /// Follower: flows whose full sync is done, in this attempt.
    pub flows_synced: AtomicU64,
    /// Primary: flows attached / flows streaming.
    pub flows_attached: AtomicU64,
    /// Primary: flows whose full sync is done.
    pub flows_streaming: AtomicU64,
    /// Primary: clock time of the last ack from the follower.
    pub last_ack_ns: AtomicU64,
    /// Primary: the lease the follower's acks renew, in ns; 0 = no
    /// fencing (the follower does not promote itself).
    pub lease_ns: AtomicU64,
    /// Primary with `--peer`: 1 until the first look at the peer's role
    /// (it admits nothing until it knows it is not stale).
    pub probing: AtomicU64,
    /// Primary during a planned failover: 1 while it hands over.
    pub handing_over: AtomicU64,
    /// Primary: the newer epoch a client said it saw (0: none); see
    /// [`ReplNode::saw_epoch`].
    pub stale: AtomicU64,
    /// Follower: receipts of SYNCs and the decision to promote itself.
    pub watch: lease::Watch,
    /// Leadership is held in etcd (`--coordinator`): the node admits only
    /// while `coord_until_ns` is ahead (see [`etcd`]).
    pub coordinated: bool,
    /// With `coordinated`: clock time until which the leader key's lease
    /// surely holds (renewals move it forward; 0 = not leader).
    pub coord_until_ns: AtomicU64,
    /// With `coordinated`, sync mode: 1 once this leader has erased every
    /// other node's `synced` record in etcd (none of them may take over),
    /// so it may admit with no follower streaming. A flow that completes a
    /// full sync sets it back to 0 before the follower can see it complete.
    pub solo: AtomicU64,
    /// The primary's address (follower) or our own (primary).
    primary: Mutex<String>,
    /// The follower's address as seen by a primary.
    follower: Mutex<String>,
    /// HELLOs refused for an epoch beyond belief (their log is sampled).
    incredible_epochs: AtomicU64,
}

impl ReplNode {
    /// A primary (`replica_of` unset) or a follower of `replica_of`; a
    /// primary with a `peer` starts probing (see [`ReplNode::probing`]).
    pub fn new(
        replica_of: Option<&str>,
        peer: Option<&str>,
        own_addr: String,
        mode: Replication,
        coordinated: bool,
    ) -> ReplNode {
        let (role, primary) = match replica_of {
            Some(p) => (Role::Follower, p.to_owned()),
            // With etcd, a follower of nobody until it learns the leader.
            None if coordinated => (Role::Follower, String::new()),
            None => (Role::Primary, own_addr),
        };
        let state = match role {
            Role::Primary => ReplState::Alone,
            Role::Follower => ReplState::Down,
        };
        ReplNode {
            role: AtomicU64::new(u64::from(role.code())),
            epoch: AtomicU64::new(0),
            state: AtomicU64::new(u64::from(state.code())),
            mode: match mode {
                Replication::Sync => Mode::Sync,
                Replication::Async => Mode::Async,
            },
            lag_us: AtomicU64::new(0),
            keys_synced: AtomicU64::new(0),
            stream_bytes: AtomicU64::new(0),
            stream_records: AtomicU64::new(0),
            stream_syncs: AtomicU64::new(0),
            follow_gen: AtomicU64::new(0),
            flows_synced: AtomicU64::new(0),
            flows_attached: AtomicU64::new(0),
            flows_streaming: AtomicU64::new(0),
            last_ack_ns: AtomicU64::new(0),
            lease_ns: AtomicU64::new(0),
            probing: AtomicU64::new(u64::from(replica_of.is_none() && peer.is_some())),
            handing_over: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            watch: lease::Watch::default(),
            coordinated,
            coord_until_ns: AtomicU64::new(0),
            solo: AtomicU64::new(0),
            primary: Mutex::new(primary),
            follower: Mutex::new(String::new()),
            incredible_epochs: AtomicU64::new(0),
        }
    }

    /// The node's role now.
    #[inline]
    pub fn role(&self) -> Role {
        Role::from_code(self.role.load(Ordering::Acquire) as u8).expect("a valid role code")
    }

    /// Whether this node admits (spends, refunds, resets).
    #[inline]
    pub fn is_primary(&self) -> bool {
        self.role() == Role::Primary
    }

    /// Whether this node may admit at `now_ns`: it is primary, knows it is
    /// not stale (`--peer`), is not handing over, and (when its follower
    /// may promote itself) holds the lease its follower's acks renew.
    #[inline]
    pub fn admits(&self, now_ns: u64) -> bool {
        self.is_primary()
            && self.probing.load(Ordering::Relaxed) == 0
            && self.handing_over.load(Ordering::Relaxed) == 0
            && self.stale.load(Ordering::Relaxed) == 0
            && !self.fenced(now_ns)
    }

    /// Whether the lease has run out: the follower may be promoting.
    #[inline]
    pub fn fenced(&self, now_ns: u64) -> bool {
        let lease_ns = self.lease_ns.load(Ordering::Relaxed);
        (lease_ns > 0 && now_ns.saturating_sub(self.last_ack_ns.load(Ordering::Relaxed)) > lease_ns)
            || (self.coordinated && now_ns >= self.coord_until_ns.load(Ordering::Acquire))
    }

    /// Whether this primary fences itself (its follower may promote).
    pub fn fencing(&self) -> bool {
        self.coordinated || self.lease_ns.load(Ordering::Relaxed) > 0
    }

    /// The node's epoch.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether an epoch a HELLO carries is believable: below u64::MAX (no
    /// promotion could pass it) and at most [`EPOCH_JUMP_MAX`] past ours.
    pub fn epoch_credible(&self, epoch: u64) -> bool {
        epoch < u64::MAX && epoch <= self.epoch().saturating_add(EPOCH_JUMP_MAX)
    }

    /// Logs a HELLO's epoch refused as not credible: the first, then one
    /// in 1,000 (a client that repeats it does not flood the log).
    pub fn log_incredible_epoch(&self, seen: u64) {
        let n = self.incredible_epochs.fetch_add(1, Ordering::Relaxed);
        if n % 1_000 == 0 {
            tracing::warn!(
                own = self.epoch(),
                seen,
                refused = n + 1,
                "a HELLO carried an epoch far beyond this node's: refused (BAD_REQUEST), not adopted"
            );
        }
    }

    /// Learns an epoch (a follower adopts its primary's); never lowers it.
    pub fn observe_epoch(&self, epoch: u64) {
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    /// The replication state now.
    pub fn state(&self) -> ReplState {
        ReplState::from_code(self.state.load(Ordering::Acquire) as u8).expect("a valid state code")
    }

    /// Sets the replication state.
    pub fn set_state(&self, state: ReplState) {
        let old = self.state.swap(u64::from(state.code()), Ordering::AcqRel);
        if old != u64::from(state.code()) {
            tracing::info!(
                from = ReplState::from_code(old as u8).map_or("?", |s| s.name()),
                to = state.name(),
                "replication state"
            );
        }
    }

    /// Records the primary's address (a follower learning whom to follow).
    pub fn set_primary(&self, addr: &str) {
        *self.primary.lock().expect("not poisoned") = addr.to_owned();
    }

    /// Records the follower's address (empty: none).
    pub fn set_follower(&self, addr: String) {
        *self.follower.lock().expect("not poisoned") = addr;
    }

    /// The follower's address as its SUBSCRIBE gave it (empty: none).
    pub fn follower(&self) -> String {
        self.follower.lock().expect("not poisoned").clone()
    }

    /// The primary's address as this node knows it.
    pub fn primary(&self) -> String {
        self.primary.lock().expect("not poisoned").clone()
    }

    /// Makes this follower the primary: raises the epoch past every epoch
    /// it has seen and stops following. `Err` with the reason on a primary.
    pub fn promote(&self, own_addr: String) -> Result<u64, String> {
        self.promote_to(own_addr, 0)
    }

    /// [`ReplNode::promote`] to at least epoch `epoch_min` (a planned
    /// handover names the epoch).
    pub fn promote_to(&self, own_addr: String, epoch_min: u64) -> Result<u64, String> {
        self.become_primary(own_addr, |old| Some(old.checked_add(1)?.max(epoch_min)))
    }

    /// [`ReplNode::promote`] at exactly `epoch`: etcd's revision of the
    /// leader key, already unique and above every earlier leader's. A node
    /// may have learnt that very epoch before promoting (a follower's HELLO
    /// carries the leader key it saw), so "one past the highest seen" would
    /// give a primary an epoch that etcd never issued, which the next
    /// leader's revision could equal. Refused if a newer epoch was seen.
    pub fn promote_at(&self, own_addr: String, epoch: u64) -> Result<u64, String> {
        let seen = self.epoch();
        if seen > epoch {
            return Err(format!("epoch {seen} was seen, newer than {epoch}"));
        }
        self.become_primary(own_addr, |_| Some(epoch))
    }

    /// Follower to primary at the epoch `epoch(old)`; `None` from it (the
    /// epoch cannot rise: it is u64::MAX) refuses the promotion.
    fn become_primary(
        &self,
        own_addr: String,
        epoch: impl Fn(u64) -> Option<u64>,
    ) -> Result<u64, String> {
        let follower = u64::from(Role::Follower.code());
        let primary = u64::from(Role::Primary.code());
        if self
            .role
            .compare_exchange(follower, primary, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(format!("already primary at epoch {}", self.epoch()));
        }
        let raised = self
            .epoch
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                Some(epoch(old)?.max(old))
            });
        let Ok(old) = raised else {
            self.role.store(follower, Ordering::Release);
            tracing::error!(
                epoch = self.epoch(),
                "promotion refused: the epoch is at its maximum"
            );
            return Err(format!(
                "epoch {} is at its maximum: no promotion can raise it (never wraps to 0)",
                self.epoch()
            ));
        };
        self.follow_gen.fetch_add(1, Ordering::AcqRel);
        let epoch = epoch(old).expect("it stored").max(old);
        *self.primary.lock().expect("not poisoned") = own_addr;
        self.watch.set_in_sync(false);
        self.set_state(ReplState::Alone);
        tracing::warn!(epoch, "promoted to primary");
        Ok(epoch)
    }

    /// A client (or follower) says it has seen `epoch`. Epochs rise only
    /// through promotions of this group's follower, so a primary that sees
    /// a newer one is stale: it stops admitting (`stale` joins `admits`)
    /// until its peer check steps it down (`--peer`) or an operator lifts
    /// it (`sluice promote`). A follower just learns the epoch.
    pub fn saw_epoch(&self, epoch: u64) {
        let own = self.epoch();
        if epoch <= own {
            return;
        }
        if self.is_primary() {
            if self.stale.swap(epoch, Ordering::AcqRel) == 0 {
                tracing::warn!(
                    own,
                    seen = epoch,
                    "a client saw a newer epoch: this primary is stale; not admitting"
                );
            }
        } else {
            self.observe_epoch(epoch);
        }
    }

    /// Ends a fenced primary's fence by hand (`sluice promote` on it: the
    /// operator knows the follower is gone): a new epoch, no lease.
    pub fn unfence(&self) -> Result<u64, String> {
        if !self.is_primary() {
            return Err("not primary".into());
        }
        self.lease_ns.store(0, Ordering::Relaxed);
        self.probing.store(0, Ordering::Relaxed);
        self.handing_over.store(0, Ordering::Relaxed);
        let stale = self.stale.swap(0, Ordering::AcqRel);
        let seen = self.epoch.fetch_max(stale, Ordering::AcqRel).max(stale);
        let Some(epoch) = seen.checked_add(1) else {
            return Err(format!(
                "epoch {seen} is at its maximum: no promotion can raise it"
            ));
        };
        self.epoch.store(epoch, Ordering::Release);
        tracing::warn!(epoch, "fence lifted by hand: serving alone");
        Ok(epoch)
    }

    /// A primary learns of a newer primary at `primary` (epoch `epoch`):
    /// it stops admitting at once and becomes its follower.
    pub fn step_down(&self, primary: &str, epoch: u64) {
        self.role
            .store(u64::from(Role::Follower.code()), Ordering::Release);
        self.observe_epoch(epoch);
        *self.primary.lock().expect("not poisoned") = primary.to_owned();
        self.lease_ns.store(0, Ordering::Relaxed);
        self.probing.store(0, Ordering::Relaxed);
        self.handing_over.store(0, Ordering::Relaxed);
        self.stale.store(0, Ordering::Relaxed);
        self.set_follower(String::new());
        self.set_state(ReplState::Down);
        tracing::warn!(
            primary,
            epoch,
            "a newer primary exists: stepping down to follow it"
        );
    }

    /// What ROLE answers at `now_ns`.
    pub fn role_ok(&self, now_ns: u64) -> RoleOk {
        let state = if self.is_primary() && self.fenced(now_ns) {
            ReplState::Fenced
        } else {
            self.state()
        };
        RoleOk {
            role: self.role(),
            state,
            mode: self.mode,
            epoch: self.epoch(),
            lag_us: self.lag_us.load(Ordering::Relaxed),
            keys_synced: self.keys_synced.load(Ordering::Relaxed),
            stream_bytes: self.stream_bytes.load(Ordering::Relaxed),
            stream_records: self.stream_records.load(Ordering::Relaxed),
            primary: self.primary(),
            follower: self.follower.lock().expect("not poisoned").clone(),
        }
    }

    /// The NOT_PRIMARY error text: why, and where to go instead.
    pub fn not_primary_text(&self) -> String {
        if self.is_primary() {
            let why = if self.handing_over.load(Ordering::Relaxed) != 0 {
                "handing over to its follower"
            } else if self.stale.load(Ordering::Relaxed) != 0 {
                "stale: a client has seen a newer epoch (the follower took over)"
            } else if self.probing.load(Ordering::Relaxed) != 0 {
                "checking whether its peer took over"
            } else if self.coordinated {
                "fenced: it has not renewed its leader lease in etcd in time (another node may take the lead)"
            } else {
                "fenced: no ack from its follower within its lease (the follower may have been promoted)"
            };
            return format!(
                "not primary: this node is {why}; epoch {}; ask its follower or retry",
                self.epoch()
            );
        }
        format!(
            "not primary: this node follows {} at epoch {}; send spends there",
            self.primary(),
            self.epoch()
        )
    }
}

#[cfg(all(test, not(sluice_loom)))]
mod tests {
    use super::*;

    fn coordinated() -> ReplNode {
        ReplNode::new(None, None, "me".into(), Replication::Sync, true)
    }

    #[test]
    fn promote_at_takes_etcds_epoch_even_once_it_was_seen() {
        // A follower's HELLO told this node the leader key's revision
        // before it promoted: its epoch must still be that revision.
        let n = coordinated();
        n.observe_epoch(4);
        assert_eq!(n.promote_at("me".into(), 4), Ok(4));
        assert_eq!(n.epoch(), 4);
        assert!(n.is_primary());
    }

    #[test]
    fn promote_at_refuses_an_epoch_older_than_one_seen() {
        let n = coordinated();
        n.observe_epoch(9);
        assert!(n.promote_at("me".into(), 5).is_err());
        assert!(!n.is_primary());
        assert_eq!(n.epoch(), 9);
    }

    #[test]
    fn a_promotion_at_the_maximum_epoch_is_refused_never_wrapped() {
        let n = ReplNode::new(Some("p:1"), None, "me".into(), Replication::Sync, false);
        n.observe_epoch(u64::MAX);
        assert!(n.promote("me".into()).is_err());
        assert!(!n.is_primary());
        assert_eq!(n.epoch(), u64::MAX);
        // One below: the last promotion there is.
        let m = ReplNode::new(Some("p:1"), None, "me".into(), Replication::Sync, false);
        m.observe_epoch(u64::MAX - 1);
        assert_eq!(m.promote("me".into()), Ok(u64::MAX));
    }

    #[test]
    fn epochs_far_beyond_our_own_are_not_credible() {
        let n = ReplNode::new(Some("p:1"), None, "me".into(), Replication::Sync, false);
        n.observe_epoch(7);
        assert!(n.epoch_credible(0));
        assert!(n.epoch_credible(7 + EPOCH_JUMP_MAX));
        assert!(!n.epoch_credible(8 + EPOCH_JUMP_MAX));
        assert!(!n.epoch_credible(u64::MAX));
    }

    #[test]
    fn promote_to_goes_past_every_epoch_seen() {
        let n = ReplNode::new(Some("p:1"), None, "me".into(), Replication::Sync, false);
        n.observe_epoch(4);
        assert_eq!(n.promote_to("me".into(), 4), Ok(5));
        let m = ReplNode::new(Some("p:1"), None, "me".into(), Replication::Sync, false);
        assert_eq!(m.promote_to("me".into(), 7), Ok(7));
    }
}
