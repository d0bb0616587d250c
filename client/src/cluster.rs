//! The cluster client: many shard groups, each a primary with an optional
//! follower; every decision routed to its group by consistent hashing of the
//! client id (`sluice_protocol::ring`, rendezvous hashing over the group
//! names), sent to the group's current primary (inside the group the
//! single-node [`Client`] sends each key straight to its shard), failed over
//! to the follower when the primary dies, and decided by a local limiter
//! when the group cannot answer at all.
//!
//! What a caller learns from each call ([`ClusterVerdict`]):
//! - `source`: where the verdict came from: the store, the local fallback,
//!   or the failure policy's fixed answer (open / closed).
//! - `outcome_unknown`: the spend was sent to the store and no answer came
//!   (the node died or the deadline passed): the store may have applied it.
//!   The call is never resent elsewhere (that could charge the client
//!   twice); the failure policy answers it, and the flag says so.
//!
//! Failover: a call that was not sent (no connection), or that the node
//! refused without applying it (NOT_PRIMARY, SHUTTING_DOWN), makes the
//! group look for its primary: it asks every member's ROLE (host names are
//! resolved again each time, so a DNS name that lists a group's members
//! works) and takes the primary of the highest epoch; then the call is sent
//! there. A group whose members all fail is searched again at most every
//! [`ClusterConfig::search_interval`]; in between its calls go straight to
//! the failure policy. The members are asked at once, and a search ends as
//! soon as one answers as the admitting primary of an epoch newer than the
//! group's: a member that accepts TCP but never answers (a stopped
//! process) costs nothing then.
//!
//! Stalls: a primary that stops answering without closing its sockets
//! (SIGSTOP, a paused VM) neither refuses nor drops a call, so nothing
//! above would move the group. When a call to the primary has waited
//! [`ClusterConfig::stall_after`] (or timed out, if the deadline is
//! shorter), the group starts a *stall watch* in the background: every
//! `search_interval` it asks the other members' ROLE, and as soon as one is
//! the admitting primary of a strictly newer epoch, NEW calls go there. The
//! calls already sent to the stalled node stay where they are (outcome
//! unknown if they time out; never resent). The watch ends when the stalled
//! node answers a PING (the stall is over and no one was promoted), when
//! the group has moved, or after [`STALL_WATCH_MS_MAX`] (the next stalled
//! call starts another). A node of an older epoch is never taken back, so
//! the old primary's return (fenced) does not make the client flap.
//!
//! Local fallback: the same decision code as the server
//! (`sluice_protocol::composite`), with every limit scaled by
//! [`ClusterConfig::local_share`] (for example 1/N for N gateways), for the
//! keys of the groups that cannot answer, until they answer again. Tiers are
//! named on the server only, so a tier request that the store cannot answer
//! gets [`ClusterConfig::tier_fallback`] instead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use sluice_protocol::composite::{self, LimitAt, Store};
use sluice_protocol::gcra::Verdict;
use sluice_protocol::identity::bucket_key;
use sluice_protocol::limit::{Kind, Limit, Window};
use sluice_protocol::message::{DecideOk, LimitSet, LimitVerdict, Limits, Mode};
use sluice_protocol::replication::{ReplState, Role, State};
use sluice_protocol::ring::Ring;
use sluice_protocol::routing::key_hash;
use sluice_protocol::{Clock, MonotonicClock, Policy, Priority, Status};

use crate::{Client, ClientConfig, Error};

mod batch;
pub use batch::{Answer, Answered};

/// Default shortest time between two searches for a group's primary.
pub const SEARCH_INTERVAL_MS_DEFAULT: u64 = 50;
/// Default time a call to a group's primary may wait before the group
/// looks for a newer primary ([`ClusterConfig::stall_after`]): below the
/// followers' usual `--promote-after-ms` (300 in the drills), so that the
/// watch is already asking when the follower takes over.
pub const STALL_AFTER_MS_DEFAULT: u64 = 250;
/// Longest one stall watch runs; a call that still waits after that starts
/// another.
pub const STALL_WATCH_MS_MAX: u64 = 10_000;

/// One shard group: a primary and an optional follower.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "toml", derive(serde::Deserialize))]
#[cfg_attr(feature = "toml", serde(deny_unknown_fields))]
pub struct GroupSpec {
    /// The group's name: routing hashes it, so keep it stable.
    pub name: String,
    /// The primary's address (`host:port`; a name is resolved at connect).
    pub primary: String,
    /// The follower's address.
    #[cfg_attr(feature = "toml", serde(default))]
    pub follower: Option<String>,
}

/// A cluster: its groups. In TOML (feature `toml`, on by default):
///
/// ```toml
/// [[groups]]
/// name = "a"
/// primary = "127.0.0.1:7700"
/// follower = "127.0.0.1:7701"   # optional
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "toml", derive(serde::Deserialize))]
#[cfg_attr(feature = "toml", serde(deny_unknown_fields))]
pub struct Topology {
    /// The groups, in any order (routing depends on the names only).
    pub groups: Vec<GroupSpec>,
}

impl Topology {
    /// Parses a cluster file's text.
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Topology, Error> {
        let t: Topology =
            toml::from_str(text).map_err(|e| Error::Invalid(format!("cluster file: {e}")))?;
        t.validate()?;
        Ok(t)
    }

    /// Reads a cluster file.
    #[cfg(feature = "toml")]
    pub fn load(path: &std::path::Path) -> Result<Topology, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", path.display())))?;
        Topology::from_toml(&text)
    }

    /// A builder's start: no groups.
    pub fn new() -> Topology {
        Topology::default()
    }

    /// Adds a group (builder style).
    pub fn group(mut self, name: &str, primary: &str, follower: Option<&str>) -> Topology {
        self.groups.push(GroupSpec {
            name: name.to_owned(),
            primary: primary.to_owned(),
            follower: follower.map(str::to_owned),
        });
        self
    }

    /// The layout hash nodes exchange when they forward to each other
    /// ([`sluice_protocol::ring::layout_hash`]).
    pub fn layout_hash(&self) -> u64 {
        sluice_protocol::ring::layout_hash(
            self.groups
                .iter()
                .map(|g| (g.name.as_str(), g.primary.as_str(), g.follower.as_deref())),
        )
    }

    fn validate(&self) -> Result<(), Error> {
        if self.groups.is_empty() {
            return Err(Error::Invalid("a cluster needs at least one group".into()));
        }
        Ring::try_new(self.groups.iter().map(|g| g.name.as_str()))
            .map(|_| ())
            .map_err(|e| Error::Invalid(format!("cluster groups: {e}")))
    }
}

/// What a call gets when its group cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Allow: availability over limits.
    Open,
    /// Deny: limits over availability.
    Closed,
    /// Decide in-process, with a share of each limit (the default).
    Local,
    /// Answer [`Error::Unavailable`]: the caller decides (a node that
    /// forwards for Envoy or a Redis client passes it on as its own
    /// protocol's error).
    Error,
}

/// What one call to a group's primary came to.
enum StoreCall<T> {
    /// The primary answered (the node, the group, and, when the call was
    /// sent again after a refusal, how long after it began).
    Answered(T, Arc<str>, Arc<Group>, Option<Duration>),
    /// The group could not answer; `unknown`: it was sent and may have
    /// been applied.
    Unavailable { group: Arc<Group>, unknown: bool },
    /// The store refused the call itself (a bad request, say).
    Failed(Error),
}

/// The error of a call whose group could not answer.
fn unavailable(group: &Group, unknown: bool) -> Error {
    let primary = group
        .primary
        .read()
        .expect("not poisoned")
        .as_ref()
        .map_or_else(|| group.spec.primary.clone(), |(a, _)| a.to_string());
    Error::Unavailable {
        group: group.spec.name.clone(),
        primary,
        outcome_unknown: unknown,
        last_error: group.last_error.lock().expect("not poisoned").clone(),
    }
}

/// Where a verdict came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The group's primary decided it.
    Store,
    /// The local fallback limiter decided it (the group could not answer).
    Local,
    /// The failure policy allowed it without deciding.
    Open,
    /// The failure policy denied it without deciding.
    Closed,
}

impl Source {
    /// `store`, `local`, `open` or `closed`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::Local => "local",
            Source::Open => "open",
            Source::Closed => "closed",
        }
    }
}

/// How a [`Cluster`] behaves.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Each group's connections (deadline per call, connect timeout, token).
    pub client: ClientConfig,
    /// What a call gets when its group cannot answer.
    pub failure: FailurePolicy,
    /// The share of each limit the local fallback enforces, as
    /// numerator / denominator (for example 1/8 with 8 gateways).
    pub local_share: (u64, u64),
    /// What a tier request gets when the store cannot answer (tiers are
    /// known to the server only): `Open` or `Closed`.
    pub tier_fallback: FailurePolicy,
    /// Shortest time between two searches for a group's primary.
    pub search_interval: Duration,
    /// For a node that forwards (`sluiced --cluster`): every connection's
    /// HELLO carries the current layout's hash ([`Topology::layout_hash`],
    /// taken anew at each reload), so that a node with another layout
    /// refuses it. Off for gateways.
    pub send_layout: bool,
    /// How long a call to a group's primary may wait before the group looks
    /// for a primary of a newer epoch in the background (the module's
    /// "Stalls"); `None` turns stall detection off (calls then move only
    /// after a refusal, a dropped connection or a timeout). Set it a little
    /// below the followers' `--promote-after-ms`.
    pub stall_after: Option<Duration>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            client: ClientConfig::default(),
            failure: FailurePolicy::Local,
            local_share: (1, 1),
            tier_fallback: FailurePolicy::Open,
            search_interval: Duration::from_millis(SEARCH_INTERVAL_MS_DEFAULT),
            send_layout: false,
            stall_after: Some(Duration::from_millis(STALL_AFTER_MS_DEFAULT)),
        }
    }
}

/// A decision and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterVerdict {
    /// Who decided.
    pub source: Source,
    /// The group the key belongs to.
    pub group: String,
    /// The decision (for `Open`/`Closed`: one verdict per limit, with the
    /// limit's numbers and nothing spent).
    pub decision: DecideOk,
    /// The spend was sent to the store and no answer came: it may have
    /// been applied there too.
    pub outcome_unknown: bool,
    /// The node that decided (its address as the topology names it), for
    /// `Source::Store`; `None` for a fallback verdict.
    pub node: Option<Arc<str>>,
    /// The group's epoch as this client knows it (the epoch of the primary
    /// it found); 0 before any primary was found.
    pub epoch: u64,
    /// For a store verdict whose call a node first refused without
    /// applying it (NOT_PRIMARY: a stale primary that resumed, say) and
    /// that was then sent to the group's new primary: how long after the
    /// call began it was sent there. The decision happened after that;
    /// the drill's judge needs it to place the decision in time.
    pub resent_after: Option<Duration>,
}

impl ClusterVerdict {
    /// Whether the request may go ahead.
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }
}

/// Counters a gateway can export.
#[derive(Debug, Default)]
pub struct ClusterStats {
    /// Calls made.
    pub calls_total: AtomicU64,
    /// Verdicts by source.
    pub store_total: AtomicU64,
    /// Local fallback verdicts.
    pub local_total: AtomicU64,
    /// Fail-open verdicts.
    pub open_total: AtomicU64,
    /// Fail-closed verdicts.
    pub closed_total: AtomicU64,
    /// Calls whose outcome at the store is unknown.
    pub unknown_total: AtomicU64,
    /// Times a group moved to another primary.
    pub failovers_total: AtomicU64,
    /// Stall watches started (a call to a primary waited `stall_after`).
    pub stalls_total: AtomicU64,
    /// Times a stall watch moved a group to a newer primary.
    pub stall_moves_total: AtomicU64,
}

/// A group's state in the client.
#[derive(Debug)]
struct Group {
    /// What the topology says.
    spec: GroupSpec,
    /// The hash of the layout the group was made in (kept across reloads
    /// only to layouts of the same hash when it is sent: see
    /// [`Cluster::reload`]), which its connections' HELLO names.
    layout_hash: u64,
    /// The connection to the group's current primary, if known.
    /// The address is shared, so that every verdict can name it without
    /// an allocation.
    primary: RwLock<Option<(Arc<str>, Client)>>,
    /// The highest epoch seen for the group.
    epoch: AtomicU64,
    /// Held by the one caller searching for the primary.
    searching: tokio::sync::Mutex<()>,
    /// When the last search found nothing.
    failed_at: Mutex<Option<Instant>>,
    /// The local fallback's buckets for this group's keys.
    local: Mutex<LocalTable>,
    /// The last error a call or search of this group met, for the text of
    /// [`Error::Unavailable`] (a refused HELLO's LAYOUT_MISMATCH, say).
    last_error: Mutex<Option<String>>,
    /// Set while a stall watch runs for the group (at most one at a time).
    watching: AtomicBool,
    /// Woken when a primary is installed, so that a search waiting on a
    /// member that does not answer ends as soon as a stall watch found one.
    installed: tokio::sync::Notify,
    /// Whether the primary last installed takes a CELL by its key's hash
    /// ([`Op::CellByHash`](crate::Op::CellByHash)): false until one is
    /// found. Shared with whoever builds ops for the group
    /// ([`Cluster::cell_by_hash_flags`]), and with other clients' groups of
    /// the same name ([`Cluster::share_cell_by_hash_flags`]).
    cells_by_hash: Mutex<Arc<AtomicBool>>,
}

impl Group {
    fn note_error(&self, e: &Error) {
        *self.last_error.lock().expect("not poisoned") = Some(e.to_string());
    }
}

/// Routing and groups, swapped whole by a reload.
#[derive(Debug)]
struct Layout {
    ring: Ring,
    /// By ring index.
    groups: Vec<Arc<Group>>,
    /// [`Topology::layout_hash`] of the topology it was made from.
    hash: u64,
    /// [`Cluster::generation`] when it was taken.
    generation: u64,
}

#[derive(Debug)]
pub(crate) struct Inner {
    config: ClusterConfig,
    layout: RwLock<Arc<Layout>>,
    /// Raised by every reload (a layout watcher compares it).
    generation: AtomicU64,
    stats: ClusterStats,
    clock: MonotonicClock,
}

/// A handle to a cluster of shard groups, shared by every task of a
/// gateway (clone it freely).
#[derive(Clone, Debug)]
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
}

impl Cluster {
    /// A cluster client for `topology`. Connects lazily: a group that is
    /// down at start is served by the failure policy until it answers.
    pub fn new(topology: &Topology, config: ClusterConfig) -> Result<Cluster, Error> {
        topology.validate()?;
        let layout = layout(topology, &HashMap::new(), 0);
        Ok(Cluster {
            inner: Arc::new(Inner {
                config,
                layout: RwLock::new(Arc::new(layout)),
                generation: AtomicU64::new(0),
                stats: ClusterStats::default(),
                clock: MonotonicClock::new(),
            }),
        })
    }

    /// Takes a changed topology: groups keep their connections and local
    /// buckets by name; calls in flight finish on the layout they started
    /// with. With [`ClusterConfig::send_layout`] (a node that forwards), a
    /// topology of another layout hash keeps no group: every connection is
    /// made anew, so that the layout each one's HELLO names is the one its
    /// keys are routed by, which lets the owner trust that name instead of
    /// looking each key up again.
    pub fn reload(&self, topology: &Topology) -> Result<(), Error> {
        topology.validate()?;
        let old = self.layout();
        let renew = self.inner.config.send_layout && topology.layout_hash() != old.hash;
        let by_name: HashMap<String, Arc<Group>> = old
            .groups
            .iter()
            .filter(|g| !renew && topology.groups.iter().any(|s| s == &g.spec))
            .map(|g| (g.spec.name.clone(), g.clone()))
            .collect();
        let mut current = self.inner.layout.write().expect("not poisoned");
        let generation = current.generation + 1;
        *current = Arc::new(layout(topology, &by_name, generation));
        self.inner.generation.store(generation, Ordering::Release);
        Ok(())
    }

    /// Raised by every reload (of a file, or from etcd's watch): a caller
    /// that keeps something derived from [`Cluster::topology`] compares it.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// The topology in force (groups in the ring's order) and its
    /// [`Topology::layout_hash`].
    pub fn topology(&self) -> (Topology, u64) {
        let layout = self.layout();
        let groups = layout.groups.iter().map(|g| g.spec.clone()).collect();
        (Topology { groups }, layout.hash)
    }

    /// Re-reads a cluster file and takes it (see [`Cluster::reload`]); an
    /// invalid file changes nothing.
    #[cfg(feature = "toml")]
    pub fn reload_file(&self, path: &std::path::Path) -> Result<(), Error> {
        self.reload(&Topology::load(path)?)
    }

    /// By ring index of the layout in force (made at the
    /// [`Cluster::generation`] returned with them): whether each group's
    /// primary, as last found, takes a CELL by its key's hash
    /// ([`Op::CellByHash`](crate::Op::CellByHash)). Kept current as
    /// primaries change; false while a group has none. A forwarding node
    /// reads them as it builds each op.
    pub fn cell_by_hash_flags(&self) -> (u64, Vec<Arc<AtomicBool>>) {
        let layout = self.layout();
        let flags = layout
            .groups
            .iter()
            .map(|g| g.cells_by_hash.lock().expect("not poisoned").clone())
            .collect();
        (layout.generation, flags)
    }

    /// Makes this client's groups write [`Cluster::cell_by_hash_flags`]
    /// into `from`'s groups of the same name: a forwarding node's
    /// per-thread clients, which make the connections, keep current the
    /// flags its view (made from `from`) reads. Call again after a reload
    /// (that makes groups anew).
    pub fn share_cell_by_hash_flags(&self, from: &Cluster) {
        let (ours, theirs) = (self.layout(), from.layout());
        for g in &ours.groups {
            if let Some(t) = theirs.groups.iter().find(|t| t.spec.name == g.spec.name) {
                let shared = t.cells_by_hash.lock().expect("not poisoned").clone();
                let mut mine = g.cells_by_hash.lock().expect("not poisoned");
                if !Arc::ptr_eq(&mine, &shared) {
                    // What this client found so far is not lost.
                    if mine.load(Ordering::Relaxed) {
                        shared.store(true, Ordering::Relaxed);
                    }
                    *mine = shared;
                }
            }
        }
    }

    fn layout(&self) -> Arc<Layout> {
        self.inner.layout.read().expect("not poisoned").clone()
    }

    /// The counters.
    pub fn stats(&self) -> &ClusterStats {
        &self.inner.stats
    }

    /// The name of the group that owns the key of 128-bit hash `hash`
    /// (`sluice_protocol::routing::key_hash`).
    pub fn owner_of(&self, hash: u128) -> String {
        let layout = self.layout();
        layout.ring.owner(hash).to_owned()
    }

    /// Every group as this client knows it now: name, current primary (as
    /// last found; `None` before any call found one) and epoch. Asks no one.
    pub fn known(&self) -> Vec<(String, Option<String>, u64)> {
        let layout = self.layout();
        layout
            .groups
            .iter()
            .map(|g| {
                let primary = g.primary.read().expect("not poisoned");
                (
                    g.spec.name.clone(),
                    primary.as_ref().map(|(a, _)| a.to_string()),
                    g.epoch.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// The group that owns `key`, and the node serving it now (its primary
    /// as last found, else the configured primary).
    pub fn route(&self, key: &[u8]) -> (String, String) {
        let layout = self.layout();
        let g = &layout.groups[layout.ring.group_of(key_hash(key))];
        let node = g
            .primary
            .read()
            .expect("not poisoned")
            .as_ref()
            .map_or_else(|| g.spec.primary.clone(), |(a, _)| a.to_string());
        (g.spec.name.clone(), node)
    }

    /// Makes the group `name` look for its primary again on its next call
    /// (its leader changed, as etcd says).
    #[cfg(feature = "etcd")]
    pub(crate) fn forget_group(&self, name: &str) {
        let layout = self.layout();
        if let Some(g) = layout.groups.iter().find(|g| g.spec.name == name) {
            *g.primary.write().expect("not poisoned") = None;
            *g.failed_at.lock().expect("not poisoned") = None;
        }
    }

    /// The group that owns `key` and its current primary's address, asking
    /// the members' ROLE if no primary is known; `None` for the node when
    /// no member admits.
    pub async fn locate(&self, key: &[u8]) -> (String, Option<String>) {
        let layout = self.layout();
        let group = &layout.groups[layout.ring.group_of(key_hash(key))];
        (group.spec.name.clone(), self.current(group).await)
    }

    /// Every group's name and current primary (as [`Cluster::locate`]).
    pub async fn primaries(&self) -> Vec<(String, Option<String>)> {
        let layout = self.layout();
        let mut out = Vec::new();
        for group in &layout.groups {
            out.push((group.spec.name.clone(), self.current(group).await));
        }
        out
    }

    /// The group's primary's address, searching if none is known.
    async fn current(&self, group: &Group) -> Option<String> {
        self.primary_of(group, false).await?;
        let primary = group.primary.read().expect("not poisoned");
        primary.as_ref().map(|(addr, _)| addr.to_string())
    }

    /// THROTTLE a token bucket (the same bucket as DECIDE's one inline
    /// token-bucket limit), through the key's group.
    pub async fn throttle(
        &self,
        key: &[u8],
        policy: Policy,
        cost: u64,
    ) -> Result<ClusterVerdict, Error> {
        let limits = crate::inline_limits(&[Limit::TokenBucket(policy)])?;
        self.decide(key, limits, Mode::Spend, cost).await
    }

    /// Spends `cost` of every limit (or none).
    pub async fn spend(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        cost: u64,
    ) -> Result<ClusterVerdict, Error> {
        self.decide(key, limits, Mode::Spend, cost).await
    }

    /// The failure policy calls use unless told another.
    #[cfg(feature = "tower")]
    pub(crate) fn failure(&self) -> FailurePolicy {
        self.inner.config.failure
    }

    /// A DECIDE through the key's group: the store's verdict, or the
    /// failure policy's.
    pub async fn decide(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        mode: Mode,
        cost: u64,
    ) -> Result<ClusterVerdict, Error> {
        let failure = self.inner.config.failure;
        self.decide_with(key, limits, mode, cost, failure).await
    }

    /// [`Cluster::decide`] with this call's own failure policy (a route
    /// that must fail closed, say, on a client that fails open).
    pub async fn decide_with(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        mode: Mode,
        cost: u64,
        failure: FailurePolicy,
    ) -> Result<ClusterVerdict, Error> {
        self.decide_as(key, limits, mode, cost, failure, Priority::Normal)
            .await
    }

    /// [`Cluster::decide_with`] for a request of class `priority`, which
    /// may spend the reserves of its class and those below; the local
    /// fallback applies the same reserves to its share of each limit.
    pub async fn decide_as(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        mode: Mode,
        cost: u64,
        failure: FailurePolicy,
        priority: Priority,
    ) -> Result<ClusterVerdict, Error> {
        let stats = &self.inner.stats;
        stats.calls_total.fetch_add(1, Ordering::Relaxed);
        crate::metrics::call();
        let spends = mode != Mode::Probe;
        let call = |client: Client| async move {
            client.decide_as(key, limits, mode, cost, priority).await
        };
        let (group, unknown) = match self.store_call(key, spends, call).await {
            StoreCall::Answered(decision, node, group, resent_after) => {
                return Ok(ClusterVerdict {
                    source: Source::Store,
                    group: group.spec.name.clone(),
                    decision,
                    outcome_unknown: false,
                    node: Some(node),
                    epoch: group.epoch.load(Ordering::Relaxed),
                    resent_after,
                })
            }
            StoreCall::Failed(e) => return Err(e),
            StoreCall::Unavailable { group, unknown } => (group, unknown),
        };
        self.decide_unavailable(
            &group,
            key,
            limits,
            (mode, priority),
            cost,
            failure,
            unknown,
        )
    }

    /// A DECIDE's answer when its group could not answer: the failure
    /// policy's (an error under [`FailurePolicy::Error`]).
    #[allow(clippy::too_many_arguments)]
    fn decide_unavailable(
        &self,
        group: &Group,
        key: &[u8],
        limits: Limits<'_>,
        mode_priority: (Mode, Priority),
        cost: u64,
        failure: FailurePolicy,
        unknown: bool,
    ) -> Result<ClusterVerdict, Error> {
        if failure == FailurePolicy::Error {
            return Err(unavailable(group, unknown));
        }
        Ok(self.fallback(group, key, limits, mode_priority, cost, failure, unknown))
    }

    /// redis-cell's `CL.THROTTLE` of `key` through its group (what a node
    /// forwards for a RESP client). When the group cannot answer: an
    /// [`Error::Unavailable`] under [`FailurePolicy::Error`] (or `Local`:
    /// redis-cell's arithmetic has no local share), else the policy's
    /// fixed answer (open: allowed, closed: limited), with nothing spent.
    pub async fn cell(
        &self,
        key: &[u8],
        policy: sluice_protocol::cell::CellPolicy,
        quantity: u64,
        failure: FailurePolicy,
    ) -> Result<(Source, sluice_protocol::cell::CellVerdict), Error> {
        let stats = &self.inner.stats;
        stats.calls_total.fetch_add(1, Ordering::Relaxed);
        crate::metrics::call();
        let call = |client: Client| async move { client.cell(key, policy, quantity).await };
        let (group, unknown) = match self.store_call(key, quantity > 0, call).await {
            StoreCall::Answered(v, ..) => return Ok((Source::Store, v)),
            StoreCall::Failed(e) => return Err(e),
            StoreCall::Unavailable { group, unknown } => (group, unknown),
        };
        self.cell_unavailable(&group, policy, failure, unknown)
    }

    /// A CELL's answer when its group could not answer: under open or
    /// closed the policy's fixed answer, with nothing spent; else an
    /// [`Error::Unavailable`] (redis-cell's arithmetic has no local share).
    fn cell_unavailable(
        &self,
        group: &Group,
        policy: sluice_protocol::cell::CellPolicy,
        failure: FailurePolicy,
        unknown: bool,
    ) -> Result<(Source, sluice_protocol::cell::CellVerdict), Error> {
        let stats = &self.inner.stats;
        let limited = match failure {
            FailurePolicy::Open => false,
            FailurePolicy::Closed => true,
            FailurePolicy::Local | FailurePolicy::Error => return Err(unavailable(group, unknown)),
        };
        let (source, counter) = if limited {
            (Source::Closed, &stats.closed_total)
        } else {
            (Source::Open, &stats.open_total)
        };
        counter.fetch_add(1, Ordering::Relaxed);
        crate::metrics::verdict(source);
        let v = sluice_protocol::cell::CellVerdict {
            limited,
            limit: policy.limit,
            remaining: if limited { 0 } else { policy.limit },
            retry_after_ns: -1_000_000_000,
            reset_after_ns: 0,
        };
        Ok((source, v))
    }

    /// RELEASE (`renew == false`) or RENEW of a lease of `key`, through
    /// its group. When the group cannot answer: [`Error::Unavailable`]
    /// (a lease has no fixed or local answer).
    pub async fn lease(
        &self,
        key: &[u8],
        target: sluice_protocol::message::LeaseTarget<'_>,
        lease_id: u64,
        renew: bool,
        _failure: FailurePolicy,
    ) -> Result<sluice_protocol::message::LeaseOk, Error> {
        self.inner.stats.calls_total.fetch_add(1, Ordering::Relaxed);
        crate::metrics::call();
        let call = |client: Client| async move {
            if renew {
                client.renew(key, target, lease_id).await
            } else {
                client.release(key, target, lease_id).await
            }
        };
        match self.store_call(key, true, call).await {
            StoreCall::Answered(ok, ..) => Ok(ok),
            StoreCall::Failed(e) => Err(e),
            StoreCall::Unavailable { group, unknown } => Err(unavailable(&group, unknown)),
        }
    }

    /// One call to the key's group's primary: at most one search and one
    /// resend per call. A call that was not applied may go to the primary
    /// found; one that may have been applied (`spends`, sent, no answer)
    /// never goes anywhere else. A call that waits `stall_after` (or times
    /// out) starts the group's stall watch, and keeps waiting.
    async fn store_call<T, F, Fut>(&self, key: &[u8], spends: bool, call: F) -> StoreCall<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let stats = &self.inner.stats;
        let layout = self.layout();
        let group = layout.groups[layout.ring.group_of(key_hash(key))].clone();
        let began = Instant::now();
        for attempt in 0..2 {
            let Some((node, client)) = self.primary_of(&group, attempt > 0).await else {
                break;
            };
            let resent_after = (attempt > 0).then(|| began.elapsed());
            let sent = call(client.clone());
            let answer = match self.inner.config.stall_after {
                None => sent.await,
                Some(after) => {
                    tokio::pin!(sent);
                    match tokio::time::timeout(after, &mut sent).await {
                        Ok(answer) => answer,
                        Err(_) => {
                            self.suspect(&group, &node, &client);
                            sent.await
                        }
                    }
                }
            };
            match answer {
                Ok(answer) => {
                    stats.store_total.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::verdict(Source::Store);
                    return StoreCall::Answered(answer, node, group, resent_after);
                }
                Err(e) if not_applied(&e) => {
                    crate::metrics::error(&e);
                    group.note_error(&e);
                    forget(&group, &node)
                }
                Err(e @ (Error::Timeout(_) | Error::Disconnected)) => {
                    crate::metrics::error(&e);
                    group.note_error(&e);
                    if matches!(e, Error::Timeout(_)) {
                        // A deadline shorter than `stall_after`: the
                        // timeout is the first sign of a stall.
                        self.suspect(&group, &node, &client);
                    }
                    // Only if no newer primary replaced it meanwhile.
                    forget(&group, &node);
                    if spends {
                        crate::metrics::outcome_unknown();
                        stats.unknown_total.fetch_add(1, Ordering::Relaxed);
                        return StoreCall::Unavailable {
                            group,
                            unknown: true,
                        };
                    }
                }
                Err(e) => {
                    crate::metrics::error(&e);
                    return StoreCall::Failed(e);
                }
            }
        }
        StoreCall::Unavailable {
            group,
            unknown: false,
        }
    }

    /// The group's primary: the one known, or (if `search` or none is
    /// known) a search of every member's ROLE, at most every
    /// `search_interval` while nothing answers. While a stall watch runs,
    /// a call waits for that search no longer than its deadline (then the
    /// failure policy answers it, as not sent): the watch, not this
    /// search, is what finds the new primary, and a caller must not queue
    /// behind a search held up by the stalled node.
    async fn primary_of(&self, group: &Group, search: bool) -> Option<(Arc<str>, Client)> {
        let known = group.primary.read().expect("not poisoned").clone();
        if let (false, Some(found)) = (search, known.as_ref()) {
            return Some(found.clone());
        }
        if group.watching.load(Ordering::Acquire) {
            let deadline = self.inner.config.client.deadline;
            tokio::time::timeout(deadline, self.search_locked(group, search, known))
                .await
                .ok()
                .flatten()
        } else {
            self.search_locked(group, search, known).await
        }
    }

    /// [`Cluster::primary_of`]'s search, one caller at a time.
    async fn search_locked(
        &self,
        group: &Group,
        search: bool,
        known: Option<(Arc<str>, Client)>,
    ) -> Option<(Arc<str>, Client)> {
        let _one = group.searching.lock().await;
        // A stall watch may install a newer primary while this search
        // waits on a member that does not answer: take that one.
        let installed = group.installed.notified();
        tokio::pin!(installed);
        installed.as_mut().enable();
        // Someone else may have found one while we waited (a search that
        // was asked for because `known` failed wants another than `known`).
        if let Some(found) = group.primary.read().expect("not poisoned").as_ref() {
            let same = known
                .as_ref()
                .is_some_and(|(a, _)| Arc::ptr_eq(a, &found.0));
            if !search || !same {
                return Some(found.clone());
            }
        }
        if let Some(t) = *group.failed_at.lock().expect("not poisoned") {
            if t.elapsed() < self.inner.config.search_interval {
                return None;
            }
        }
        let found = tokio::select! {
            found = self.search(group) => found,
            () = installed => {
                return group.primary.read().expect("not poisoned").clone();
            }
        };
        match found {
            Some((epoch, addr, client)) => {
                let addr: Arc<str> = Arc::from(addr);
                if self.install(group, epoch, &addr, &client, false) {
                    Some((addr, client))
                } else {
                    // Something newer was installed meanwhile.
                    group.primary.read().expect("not poisoned").clone()
                }
            }
            None => {
                *group.failed_at.lock().expect("not poisoned") = Some(Instant::now());
                None
            }
        }
    }

    /// Makes `client` at `addr` the group's primary, if `epoch` is at least
    /// the group's (`newer`: above it); says whether it did. Wakes a search
    /// that waits.
    fn install(
        &self,
        group: &Group,
        epoch: u64,
        addr: &Arc<str>,
        client: &Client,
        newer: bool,
    ) -> bool {
        {
            let mut primary = group.primary.write().expect("not poisoned");
            let known = group.epoch.load(Ordering::Relaxed);
            if epoch < known || (newer && epoch == known) {
                return false;
            }
            let moved = primary.is_some() || known > 0 || epoch > known;
            *primary = Some((addr.clone(), client.clone()));
            group
                .cells_by_hash
                .lock()
                .expect("not poisoned")
                .store(client.takes_cells_by_hash(), Ordering::Relaxed);
            group.epoch.store(epoch, Ordering::Relaxed);
            *group.failed_at.lock().expect("not poisoned") = None;
            if moved {
                self.inner
                    .stats
                    .failovers_total
                    .fetch_add(1, Ordering::Relaxed);
                crate::metrics::failover(&group.spec.name);
            }
        }
        group.installed.notify_waiters();
        true
    }

    /// Asks every member for its role; connects to the admitting primary of
    /// the highest epoch (see [`Cluster::ask_roles`]). A newer epoch always
    /// wins over an older one.
    async fn search(&self, group: &Group) -> Option<(u64, String, Client)> {
        let members: Vec<String> = std::iter::once(&group.spec.primary)
            .chain(group.spec.follower.as_ref())
            .cloned()
            .collect();
        let known = group.epoch.load(Ordering::Relaxed);
        let (epoch, addr) = self.ask_roles(group, members, known).await?;
        if epoch < known {
            // Only an older primary answers: it is stale, not ours.
            return None;
        }
        let client = self.connect_primary(group, &addr, epoch).await?;
        Some((epoch, addr, client))
    }

    /// Asks the ROLE of every one of `members` at once. Returns the
    /// admitting (primary, not fenced) member of the highest epoch once all
    /// have answered or failed, or, as soon as one answers, a member of an
    /// epoch above `early` (nothing answering can be more current than a
    /// promotion the group has not seen yet).
    async fn ask_roles(
        &self,
        group: &Group,
        members: Vec<String>,
        early: u64,
    ) -> Option<(u64, String)> {
        let config = &self.inner.config.client;
        let probe_config = ClientConfig {
            shard_aware: false,
            ..config.clone()
        };
        let mut asks = tokio::task::JoinSet::new();
        for (i, addr) in members.into_iter().enumerate() {
            let probe_config = probe_config.clone();
            asks.spawn(async move {
                let c = Client::connect_with(addr.as_str(), probe_config).await;
                let r = match c {
                    Ok(c) => c.role().await,
                    Err(e) => Err(e),
                };
                (i, addr, r)
            });
        }
        // (epoch, member index, address): of two admitting members of one
        // epoch, the one listed first wins, whichever answered first, so
        // that every client (and the drill's judge) picks the same one.
        let mut best: Option<(u64, usize, String)> = None;
        while let Some(done) = asks.join_next().await {
            let Ok((i, addr, r)) = done else { continue };
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    crate::metrics::error(&e);
                    group.note_error(&e);
                    continue;
                }
            };
            let admits = r.role == Role::Primary && r.state != ReplState::Fenced;
            let better = best
                .as_ref()
                .map_or(true, |&(e, j, _)| r.epoch > e || (r.epoch == e && i < j));
            if admits && better {
                best = Some((r.epoch, i, addr));
                if r.epoch > early {
                    break;
                }
            }
        }
        best.map(|(epoch, _, addr)| (epoch, addr))
    }

    /// The group's client for the primary at `addr`, whose HELLO carries
    /// `epoch` (a stale primary learns it) and the layout hash if sent.
    async fn connect_primary(&self, group: &Group, addr: &str, epoch: u64) -> Option<Client> {
        let config = &self.inner.config.client;
        let layout_hash = if self.inner.config.send_layout {
            group.layout_hash
        } else {
            config.layout_hash
        };
        let config = ClientConfig {
            known_epoch: epoch,
            layout_hash,
            ..config.clone()
        };
        match Client::connect_with(addr, config).await {
            Ok(client) => Some(client),
            Err(e) => {
                group.note_error(&e);
                None
            }
        }
    }

    /// A call to `node` (the group's primary when the call was sent) has
    /// waited `stall_after` or timed out: starts the group's stall watch,
    /// unless one runs or the group has moved already.
    fn suspect(&self, group: &Arc<Group>, node: &Arc<str>, client: &Client) {
        if self.inner.config.stall_after.is_none() || !is_current(group, node) {
            return;
        }
        if group.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner
            .stats
            .stalls_total
            .fetch_add(1, Ordering::Relaxed);
        tokio::spawn(watch_stall(
            Arc::downgrade(&self.inner),
            group.clone(),
            node.clone(),
            client.clone(),
        ));
    }

    /// The failure policy's answer for a group that could not answer.
    #[allow(clippy::too_many_arguments)]
    fn fallback(
        &self,
        group: &Group,
        key: &[u8],
        limits: Limits<'_>,
        (mode, priority): (Mode, Priority),
        cost: u64,
        failure: FailurePolicy,
        outcome_unknown: bool,
    ) -> ClusterVerdict {
        let config = &self.inner.config;
        let stats = &self.inner.stats;
        let policy = match (failure, limits) {
            (FailurePolicy::Local, Limits::Tier(_)) => config.tier_fallback,
            (p, _) => p,
        };
        let (source, decision) = match (policy, limits) {
            (FailurePolicy::Local, Limits::Inline(set)) => {
                let now_ns = self.inner.clock.now_ns();
                let d = group.local.lock().expect("not poisoned").decide(
                    key,
                    &limits,
                    &set,
                    config.local_share,
                    (mode, priority),
                    cost,
                    now_ns,
                );
                stats.local_total.fetch_add(1, Ordering::Relaxed);
                crate::metrics::verdict(Source::Local);
                (Source::Local, d)
            }
            (FailurePolicy::Closed, _) => {
                stats.closed_total.fetch_add(1, Ordering::Relaxed);
                crate::metrics::verdict(Source::Closed);
                (Source::Closed, fixed(limits, false))
            }
            _ => {
                stats.open_total.fetch_add(1, Ordering::Relaxed);
                crate::metrics::verdict(Source::Open);
                (Source::Open, fixed(limits, true))
            }
        };
        ClusterVerdict {
            source,
            group: group.spec.name.clone(),
            decision,
            outcome_unknown,
            node: None,
            epoch: group.epoch.load(Ordering::Relaxed),
            resent_after: None,
        }
    }
}

/// The layout for `topology`, reusing `keep`'s groups by name.
fn layout(topology: &Topology, keep: &HashMap<String, Arc<Group>>, generation: u64) -> Layout {
    let ring = Ring::new(topology.groups.iter().map(|g| g.name.as_str()));
    let hash = topology.layout_hash();
    let groups = (0..ring.group_count())
        .map(|i| {
            let name = ring.name(i);
            keep.get(name).cloned().unwrap_or_else(|| {
                let spec = topology
                    .groups
                    .iter()
                    .find(|g| g.name == name)
                    .expect("the ring's names are the topology's")
                    .clone();
                Arc::new(Group {
                    spec,
                    layout_hash: hash,
                    primary: RwLock::new(None),
                    epoch: AtomicU64::new(0),
                    searching: tokio::sync::Mutex::new(()),
                    failed_at: Mutex::new(None),
                    local: Mutex::new(LocalTable::default()),
                    last_error: Mutex::new(None),
                    watching: AtomicBool::new(false),
                    installed: tokio::sync::Notify::new(),
                    cells_by_hash: Mutex::default(),
                })
            })
        })
        .collect();
    Layout {
        ring,
        groups,
        hash,
        generation,
    }
}

/// Drops the group's primary if it is still `node` (a stall watch may
/// have replaced it with a newer one, which stays): the next call searches.
fn forget(group: &Group, node: &Arc<str>) {
    let mut primary = group.primary.write().expect("not poisoned");
    if primary.as_ref().is_some_and(|(a, _)| Arc::ptr_eq(a, node)) {
        *primary = None;
    }
}

/// Whether `node` is still the group's primary (the same installation).
fn is_current(group: &Group, node: &Arc<str>) -> bool {
    group
        .primary
        .read()
        .expect("not poisoned")
        .as_ref()
        .is_some_and(|(a, _)| Arc::ptr_eq(a, node))
}

/// A group's stall watch (see the module's "Stalls"): until the group has
/// moved, the stalled node answers a PING, the cluster is dropped or
/// [`STALL_WATCH_MS_MAX`] has passed, asks the other members' ROLE every
/// `search_interval` and installs the first admitting primary of an epoch
/// above the stalled one's.
async fn watch_stall(cluster: Weak<Inner>, group: Arc<Group>, node: Arc<str>, stalled: Client) {
    let started = Instant::now();
    let stalled_epoch = group.epoch.load(Ordering::Relaxed);
    let others: Vec<String> = std::iter::once(&group.spec.primary)
        .chain(group.spec.follower.as_ref())
        .filter(|a| a.as_str() != &*node)
        .cloned()
        .collect();
    let interval = match cluster.upgrade() {
        Some(inner) if !others.is_empty() => inner.config.search_interval,
        // No other member could have taken over.
        _ => {
            group.watching.store(false, Ordering::Release);
            return;
        }
    };
    // One PING for the whole watch (sent again if it fails): its answer
    // says the node is back.
    let mut ping = Box::pin(async move {
        while stalled.ping().await.is_err() {
            tokio::time::sleep(interval).await;
        }
    });
    loop {
        let Some(inner) = cluster.upgrade() else {
            break;
        };
        let cluster = Cluster { inner };
        let moved =
            !is_current(&group, &node) && group.primary.read().expect("not poisoned").is_some();
        if moved
            || group.epoch.load(Ordering::Relaxed) > stalled_epoch
            || started.elapsed() > Duration::from_millis(STALL_WATCH_MS_MAX)
        {
            break;
        }
        let next = Instant::now() + cluster.inner.config.search_interval;
        let newer = async {
            let (epoch, addr) = cluster
                .ask_roles(&group, others.clone(), stalled_epoch)
                .await?;
            if epoch <= stalled_epoch {
                return None;
            }
            let client = cluster.connect_primary(&group, &addr, epoch).await?;
            Some((epoch, addr, client))
        };
        tokio::select! {
            found = newer => {
                if let Some((epoch, addr, client)) = found {
                    let addr: Arc<str> = Arc::from(addr);
                    if cluster.install(&group, epoch, &addr, &client, true) {
                        cluster
                            .inner
                            .stats
                            .stall_moves_total
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
            }
            () = &mut ping => break,
        }
        tokio::time::sleep_until(next.into()).await;
    }
    group.watching.store(false, Ordering::Release);
}

/// Errors after which the request was surely not applied: it may go to
/// another node.
fn not_applied(e: &Error) -> bool {
    match e {
        Error::Connect { .. } => true,
        Error::Server {
            status: Some(s), ..
        } => matches!(
            s,
            Status::NotPrimary | Status::ShuttingDown | Status::TooManyConnections
        ),
        _ => false,
    }
}

/// Open or closed: every limit's numbers, nothing spent.
fn fixed(limits: Limits<'_>, allowed: bool) -> DecideOk {
    let verdicts = match limits {
        Limits::Inline(set) => set
            .iter()
            .map(|l| LimitVerdict {
                kind: l.kind(),
                verdict: Verdict {
                    allowed,
                    limit: limit_of(l),
                    remaining: if allowed { limit_of(l) } else { 0 },
                    retry_after_ns: 0,
                    reset_after_ns: 0,
                },
                lease_id: 0,
            })
            .collect(),
        Limits::Tier(_) => vec![LimitVerdict {
            kind: Kind::TokenBucket,
            verdict: Verdict {
                allowed,
                ..Verdict::default()
            },
            lease_id: 0,
        }],
    };
    let mut d = DecideOk::from_verdicts(verdicts);
    d.retry_after_ns = 0;
    d
}

fn limit_of(l: &Limit) -> u64 {
    match l {
        Limit::TokenBucket(p) => p.burst,
        Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingCounter(w) => w.limit,
        Limit::Concurrency(c) => c.limit,
    }
}

/// A limit scaled to `share` (never below 1 unit).
fn scaled(l: &Limit, (num, den): (u64, u64)) -> Limit {
    let s = |v: u64| (u128::from(v) * u128::from(num) / u128::from(den.max(1))).max(1) as u64;
    match *l {
        Limit::TokenBucket(p) => Limit::TokenBucket(Policy {
            count: s(p.count),
            burst: s(p.burst),
            ..p
        }),
        Limit::FixedWindow(w) => Limit::FixedWindow(Window {
            limit: s(w.limit),
            ..w
        }),
        Limit::SlidingLog(w) => Limit::SlidingLog(Window {
            limit: s(w.limit),
            ..w
        }),
        Limit::SlidingCounter(w) => Limit::SlidingCounter(Window {
            limit: s(w.limit),
            ..w
        }),
        Limit::Concurrency(c) => Limit::Concurrency(sluice_protocol::Concurrency {
            limit: s(c.limit),
            ..c
        }),
    }
}

/// The local fallback's buckets (one table per group; bounded by what the
/// group's clients spend while it is down, and dropped bucket by bucket as
/// they refill).
#[derive(Debug, Default)]
struct LocalTable {
    states: HashMap<(u128, Kind), State>,
    next_lease_id: u64,
}

impl Store for LocalTable {
    fn get(&self, bucket: u128, kind: Kind) -> Option<&State> {
        self.states.get(&(bucket, kind))
    }

    fn put(&mut self, bucket: u128, kind: Kind, state: Option<State>) {
        match state {
            Some(s) => {
                self.states.insert((bucket, kind), s);
            }
            None => {
                self.states.remove(&(bucket, kind));
            }
        }
    }
}

impl LocalTable {
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &mut self,
        key: &[u8],
        limits: &Limits<'_>,
        set: &LimitSet,
        share: (u64, u64),
        (mode, priority): (Mode, Priority),
        cost: u64,
        now_ns: u64,
    ) -> DecideOk {
        let hash = key_hash(key);
        let refs: Vec<LimitAt> = set
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let limit = scaled(l, share);
                LimitAt {
                    bucket: bucket_key(hash, l.kind(), limits.slot(i as u8)),
                    limit,
                    floor: set.reserves(i).floor(limit_of(&limit), priority),
                }
            })
            .collect();
        // A cost above a scaled limit can never pass locally: deny, spend
        // nothing (the pure functions require cost <= limit).
        if matches!(mode, Mode::Spend | Mode::Probe)
            && refs.iter().any(|r| cost > limit_of(&r.limit))
        {
            let verdicts = refs
                .iter()
                .map(|r| LimitVerdict {
                    kind: r.limit.kind(),
                    verdict: Verdict {
                        allowed: cost <= limit_of(&r.limit),
                        limit: limit_of(&r.limit),
                        ..Verdict::default()
                    },
                    lease_id: 0,
                })
                .collect();
            return DecideOk::from_verdicts(verdicts).for_class(priority);
        }
        let mut next_lease_id = self.next_lease_id;
        let d = composite::decide(
            self,
            &refs,
            mode,
            cost,
            now_ns,
            &mut next_lease_id,
            priority,
        );
        self.next_lease_id = next_lease_id;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "toml")]
    #[test]
    fn topology_file_parses_and_validates() {
        let t = Topology::from_toml(
            r#"
            [[groups]]
            name = "a"
            primary = "127.0.0.1:7700"
            follower = "127.0.0.1:7701"

            [[groups]]
            name = "b"
            primary = "sluice-b.example:7700"
            "#,
        )
        .unwrap();
        assert_eq!(t.groups.len(), 2);
        assert_eq!(t.groups[1].follower, None);
        assert!(Topology::from_toml("").is_err());
        let dup = "[[groups]]\nname='a'\nprimary='x:1'\n[[groups]]\nname='a'\nprimary='y:1'\n";
        assert!(Topology::from_toml(dup).is_err());
        assert!(Topology::from_toml("[[groups]]\nname='a'\nprimary='x:1'\nextra=1\n").is_err());
    }

    fn spec(name: &str, port: u16) -> GroupSpec {
        GroupSpec {
            name: name.into(),
            primary: format!("127.0.0.1:{port}"),
            follower: None,
        }
    }

    /// Whether each group of `before` is the same object in `after`.
    fn kept(before: &Layout, after: &Layout) -> Vec<bool> {
        before
            .groups
            .iter()
            .map(|g| after.groups.iter().any(|h| Arc::ptr_eq(g, h)))
            .collect()
    }

    /// A forwarding node's groups (and so their connections) never
    /// outlive a change of layout hash: each group's connections name, in
    /// HELLO, the layout the group was made in, and the owner trusts that
    /// name. A gateway's groups are kept by name, as before.
    #[test]
    fn a_reload_to_another_layout_renews_a_forwarding_nodes_groups() {
        let two = Topology {
            groups: vec![spec("a", 1), spec("b", 2)],
        };
        let three = Topology {
            groups: vec![spec("a", 1), spec("b", 2), spec("c", 3)],
        };
        for send_layout in [true, false] {
            let config = ClusterConfig {
                send_layout,
                ..ClusterConfig::default()
            };
            let cluster = Cluster::new(&two, config).unwrap();
            let first = cluster.layout();
            cluster.reload(&three).unwrap();
            let second = cluster.layout();
            assert_eq!(kept(&first, &second), vec![!send_layout; 2]);
            assert!(second
                .groups
                .iter()
                .all(|g| !send_layout || g.layout_hash == three.layout_hash()));
            // The same layout again (a SIGHUP with the file unchanged).
            cluster.reload(&three).unwrap();
            assert_eq!(kept(&second, &cluster.layout()), vec![true; 3]);
        }
    }

    /// A forwarding node's view reads the flags of its main client, while
    /// its per-thread clients make the connections: what a thread's client
    /// finds must show in the main one's flags, before and after a reload
    /// that makes its groups anew. (Without the sharing, the view read
    /// false for ever and every forwarded CL.THROTTLE carried its key.)
    #[test]
    fn a_threads_finds_show_in_the_flags_its_view_reads() {
        let two = Topology {
            groups: vec![spec("a", 1), spec("b", 2)],
        };
        let three = Topology {
            groups: vec![spec("a", 1), spec("b", 2), spec("c", 3)],
        };
        let config = ClusterConfig {
            send_layout: true,
            ..ClusterConfig::default()
        };
        let main = Cluster::new(&two, config.clone()).unwrap();
        let thread = Cluster::new(&two, config).unwrap();
        let found = |c: &Cluster, g: usize| {
            let flag = c.layout().groups[g].cells_by_hash.lock().unwrap().clone();
            flag.store(true, Ordering::Relaxed);
        };
        let flags = |c: &Cluster| -> Vec<bool> {
            let (_, flags) = c.cell_by_hash_flags();
            flags.iter().map(|f| f.load(Ordering::Relaxed)).collect()
        };
        // What the thread found before it shared is kept.
        found(&thread, 0);
        thread.share_cell_by_hash_flags(&main);
        assert_eq!(flags(&main), [true, false]);
        found(&thread, 1);
        assert_eq!(flags(&main), [true, true]);
        // A reload to another layout makes every group anew, in both.
        main.reload(&three).unwrap();
        thread.reload(&three).unwrap();
        assert_eq!(flags(&main), [false, false, false]);
        thread.share_cell_by_hash_flags(&main);
        found(&thread, 2);
        assert_eq!(flags(&main), [false, false, true]);
    }

    #[test]
    fn local_fallback_enforces_the_share() {
        let mut t = LocalTable::default();
        let lim: Limit = "token-bucket:1/h,burst=100".parse().unwrap();
        let limits = crate::inline_limits(&[lim]).unwrap();
        let Limits::Inline(set) = limits else {
            unreachable!("inline")
        };
        let spend = (Mode::Spend, Priority::Normal);
        let admitted = (0..200)
            .filter(|_| {
                t.decide(b"k", &limits, &set, (1, 4), spend, 1, 1_000)
                    .allowed
            })
            .count();
        assert_eq!(admitted, 25, "a quarter of the burst");
        // A cost above the scaled limit is denied, not a panic.
        assert!(
            !t.decide(b"k", &limits, &set, (1, 4), spend, 30, 1_000)
                .allowed
        );
    }

    #[test]
    fn local_fallback_keeps_the_reserves_of_its_share() {
        let mut t = LocalTable::default();
        let r: sluice_protocol::Reserved = "token-bucket:1/h,burst=100,reserve=critical:20%"
            .parse()
            .unwrap();
        let set = LimitSet::with_reserves(&[r]).unwrap();
        let limits = Limits::Inline(set);
        let count = |t: &mut LocalTable, class| {
            (0..200)
                .filter(|_| {
                    t.decide(b"k", &limits, &set, (1, 4), (Mode::Spend, class), 1, 1_000)
                        .allowed
                })
                .count()
        };
        // A quarter of 100 is 25, of which 20 % (5) only critical may spend.
        assert_eq!(count(&mut t, Priority::Normal), 20);
        let last = t.decide(
            b"k",
            &limits,
            &set,
            (1, 4),
            (Mode::Probe, Priority::Normal),
            1,
            1_000,
        );
        assert_eq!(
            (last.priority, last.verdicts[0].verdict.remaining),
            (Priority::Normal, 0)
        );
        assert_eq!(count(&mut t, Priority::Critical), 5);
    }
}
