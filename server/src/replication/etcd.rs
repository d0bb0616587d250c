//! Leadership on etcd (`--coordinator etcd://...`), Patroni's way: the
//! group's primary is whoever holds the leader key, a key bound to a lease
//! that the primary renews; a primary that cannot renew stops admitting
//! before the lease can have expired in etcd, and a follower takes the key
//! only once it is gone, in a transaction.
//!
//! Keys, under `/sluice/CLUSTER/groups/GROUP/`:
//!
//! - `leader`: the primary's advertised address, bound to its leader lease
//!   (TTL `--leader-ttl-s`). Its create revision is the group's **epoch**:
//!   etcd revisions are totally ordered across the whole cluster, and every
//!   new leader key has a higher one.
//! - `last`: the address of the latest leader, written in the same
//!   transaction as `leader` and never expiring: its mod revision is the
//!   epoch of the latest leader, even after its key has expired.
//! - `members/ADDR`: each node's advertised address, bound to a lease of
//!   its own (who is up, for operators and clients).
//! - `synced/ADDR`: the epoch of the leader that node ADDR has a complete
//!   copy of. Only a leader writes it, for its follower, once that
//!   follower's full sync is complete on every shard, and only while the
//!   key is its own; it erases every such record before it admits alone.
//!   In sync mode a node may take the leader key only if its record names
//!   the latest leader's epoch (the transaction compares it) and, by its
//!   own account, no new full sync has begun since. (A follower that wrote
//!   its own record could rewrite it right after the leader erased it,
//!   with its link down and its copy about to fall behind.)
//!
//! The node's loop (on shard 0): every [`POLL_MS`] it reads the group's
//! keys; it follows the leader it sees, campaigns when there is none, and
//! renews its leases every quarter of the TTL. A leader admits only until
//! [`LEADER_FENCE`] of the TTL after the *send* of its last successful
//! renewal: etcd counts the TTL from when it received that renewal, later,
//! so the key is still ours when we stop, with half the TTL to spare for
//! clocks that run at different rates.
//!
//! In sync mode, leadership on etcd implies fencing (`ReplNode::fencing`):
//! a primary never serves alone; with no follower streaming it admits
//! nothing (its follower may be the next primary, and must have everything
//! a client was told).

use std::rc::Rc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp,
};
use sluice_protocol::replication::{Mode, ReplState};
use sluice_protocol::Clock;

use crate::node::ShardCore;
use crate::sync::Ordering;

/// How often the node reads its group's keys.
pub const POLL_MS: u64 = 100;
/// A leader admits for this share of the TTL after the send of its last
/// successful renewal (numerator, denominator).
pub const LEADER_FENCE: (u64, u64) = (1, 2);
/// After a failed session (etcd unreachable), wait this long to reconnect.
pub const RETRY_MS: u64 = 500;

/// The group's keys.
#[derive(Debug, Clone)]
pub struct Keys {
    /// `/sluice/CLUSTER/groups/GROUP/`.
    pub prefix: String,
    /// `.../leader`.
    pub leader: String,
    /// `.../last`.
    pub last: String,
    /// `.../members/ME`.
    pub member: String,
    /// `.../synced/ME`.
    pub synced: String,
    /// `.../synced/`.
    pub synced_prefix: String,
}

impl Keys {
    /// The keys of node `me` in `group` of `cluster`.
    pub fn new(cluster: &str, group: &str, me: &str) -> Keys {
        let prefix = format!("/sluice/{cluster}/groups/{group}/");
        Keys {
            leader: format!("{prefix}leader"),
            last: format!("{prefix}last"),
            member: format!("{prefix}members/{me}"),
            synced: format!("{prefix}synced/{me}"),
            synced_prefix: format!("{prefix}synced/"),
            prefix,
        }
    }
}

/// What the group's keys say.
#[derive(Debug, Default)]
struct Seen {
    /// The leader's address and epoch.
    leader: Option<(String, u64)>,
    /// The latest leader's epoch (mod revision of `last`), if there ever
    /// was one.
    last_epoch: Option<u64>,
    /// The latest leader's address.
    last_leader: Option<String>,
}

/// Our hold on the leader key.
struct Leading {
    /// The key's create revision: the epoch we lead at.
    epoch: i64,
    lease: i64,
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
}

/// The endpoints of `etcd://HOST:PORT,HOST:PORT`.
pub fn endpoints(coordinator: &str) -> Vec<String> {
    coordinator
        .strip_prefix("etcd://")
        .unwrap_or(coordinator)
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("http://{h}"))
        .collect()
}

/// What outlives one connection to etcd.
#[derive(Debug, Default)]
struct Held {
    /// The leader we follow (a follow task runs for it).
    following: Option<String>,
    /// Our leader lease, while we lead: a new session resumes it if etcd
    /// still has it, so a short outage costs no failover.
    lead: Option<i64>,
    /// The epoch we last led at, unless we have followed anyone since: if
    /// it is still the latest leader's, our table holds all it admitted.
    led: Option<u64>,
}

/// The node's leadership loop, for as long as the node runs.
pub async fn run(core: Rc<ShardCore>) {
    let mut held = Held::default();
    loop {
        if let Err(e) = session(&core, &mut held).await {
            // The renewals stopped; a leader keeps admitting only until its
            // gate closes (LEADER_FENCE of the TTL after its last renewal),
            // and the next session resumes or gives up the lead.
            tracing::warn!(error = %e, "etcd session ended");
        }
        tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
    }
}

/// Lets go of the lead here (etcd lets go when the lease runs out).
fn step_down(core: &ShardCore, held: &mut Held, leader: &str, epoch: u64) {
    let repl = &core.node.repl;
    repl.coord_until_ns.store(0, Ordering::Release);
    repl.solo.store(0, Ordering::Release);
    held.lead = None;
    if repl.is_primary() {
        repl.step_down(leader, epoch);
    }
}

/// One connection to etcd: register, then follow or lead until an error.
async fn session(core: &Rc<ShardCore>, held: &mut Held) -> Result<(), String> {
    let mut s = Session::connect(core, held).await?;
    s.resume_lead().await?;
    let mut member = s.register().await?;
    s.renewed_at = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(POLL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if s.renewed_at.elapsed() >= s.quarter {
            s.renewed_at = Instant::now();
            s.renew_leases(&mut member).await?;
        }
        s.mark_followers().await?;
        let seen = within(s.quarter, read(&mut s.client, &s.keys))
            .await
            .map_err(|x| format!("read: {x}"))?;
        match seen.leader {
            Some((addr, _)) if addr == s.me => {
                // Ours; or, with no lease of ours, a key of an earlier life
                // of this node: it expires on its own.
            }
            Some((addr, epoch)) => s.follow_leader(addr, epoch).await,
            None if s.leading.is_none() => s.try_lead(&seen).await?,
            None => {}
        }
    }
}

/// A lease's keep-alive: the requests' sender and the answers' stream.
struct KeepAlive {
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
}

/// One connection to etcd and what the node holds through it.
struct Session<'a> {
    /// The node (its replication state, clock and config).
    core: &'a Rc<ShardCore>,
    /// What outlives this session.
    held: &'a mut Held,
    /// The connection.
    client: Client,
    /// The group's keys.
    keys: Keys,
    /// This node's advertised address (the value of the keys it writes).
    me: String,
    /// `--leader-ttl-s`.
    ttl_s: u64,
    /// The same, as etcd's lease grant takes it.
    ttl: i64,
    /// A quarter of the TTL: the renewal period, and the bound on each
    /// call to etcd.
    quarter: Duration,
    /// How long a leader admits after the send of a successful renewal
    /// ([`LEADER_FENCE`] of the TTL).
    fence_ns: u64,
    /// Our hold on the leader key, while we lead.
    leading: Option<Leading>,
    /// The follower whose `synced` record we wrote while leading.
    marked: Option<String>,
    /// When the leases were last renewed.
    renewed_at: Instant,
}

impl<'a> Session<'a> {
    /// Connects to the `--coordinator` endpoints.
    async fn connect(core: &'a Rc<ShardCore>, held: &'a mut Held) -> Result<Session<'a>, String> {
        let node = &core.node;
        let config = &node.config;
        let me = node.advertised();
        let keys = Keys::new(
            &config.cluster_name,
            config.group.as_deref().unwrap_or_default(),
            &me,
        );
        let ttl_s = config.leader_ttl_s;
        let quarter = Duration::from_millis(ttl_s * 1_000 / 4);
        // No per-request timeout on the channel: gRPC sends it as a deadline,
        // and etcd would end the keep-alive streams at it. Each call is
        // bounded by `within` instead.
        let options = ConnectOptions::new().with_connect_timeout(quarter);
        let coordinator = config.coordinator.as_deref().unwrap_or_default();
        let client = within(
            quarter,
            Client::connect(endpoints(coordinator), Some(options)),
        )
        .await
        .map_err(|x| format!("connect: {x}"))?;
        Ok(Session {
            core,
            held,
            client,
            keys,
            me,
            ttl_s,
            ttl: i64::try_from(ttl_s).unwrap_or(i64::MAX),
            quarter,
            fence_ns: ttl_s * 1_000_000_000 * LEADER_FENCE.0 / LEADER_FENCE.1,
            leading: None,
            marked: None,
            renewed_at: Instant::now(),
        })
    }

    /// Resumes an earlier session's lead if etcd still has its lease, and
    /// steps down otherwise (a primary with no lease to resume too).
    async fn resume_lead(&mut self) -> Result<(), String> {
        let core = self.core;
        let repl = &core.node.repl;
        let Some(lease) = self.held.lead else {
            if repl.is_primary() {
                step_down(core, self.held, "", repl.epoch());
            }
            return Ok(());
        };
        // Resume our lead if etcd still has our lease. While etcd does not
        // answer, keep it: the gate closes on its own (the issue's "keeps
        // serving until its lease would expire, then stops"), and only a
        // definite answer, or a gate closed for a whole TTL (the lease is
        // surely gone), makes us let go.
        let ttl_ns = self.ttl_s * 1_000_000_000;
        let gate = repl.coord_until_ns.load(Ordering::Acquire);
        let sent_ns = core.clock.now_ns();
        let surely_gone = sent_ns > gate.saturating_add(ttl_ns);
        let resumed = if surely_gone {
            Ok(None)
        } else {
            self.keep_alive(lease).await
        };
        match resumed? {
            Some(KeepAlive { keeper, stream }) if repl.is_primary() => {
                repl.coord_until_ns
                    .store(sent_ns.saturating_add(self.fence_ns), Ordering::Release);
                self.leading = Some(Leading {
                    epoch: i64::try_from(self.held.led.unwrap_or_else(|| repl.epoch()))
                        .unwrap_or(i64::MAX),
                    lease,
                    keeper,
                    stream,
                });
            }
            _ => {
                tracing::warn!("the leader lease expired while etcd was away: stepping down");
                step_down(core, self.held, "", repl.epoch());
            }
        }
        Ok(())
    }

    /// A renewed keep-alive of an earlier lease, or `None` when etcd says
    /// it has expired.
    async fn keep_alive(&mut self, lease: i64) -> Result<Option<KeepAlive>, String> {
        match within(self.quarter, self.client.lease_keep_alive(lease)).await {
            Ok((mut keeper, mut stream)) => {
                match renew(&mut keeper, &mut stream, self.quarter).await {
                    Ok(true) => Ok(Some(KeepAlive { keeper, stream })),
                    Ok(false) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            Err(e) if e.contains("not found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `members/ME` under a lease of this node's own; returns the
    /// lease's keep-alive.
    async fn register(&mut self) -> Result<KeepAlive, String> {
        let quarter = self.quarter;
        let member = within(quarter, self.client.lease_grant(self.ttl, None))
            .await
            .map_err(|x| format!("member lease: {x}"))?
            .id();
        within(
            quarter,
            self.client.put(
                self.keys.member.as_str(),
                self.me.as_str(),
                Some(PutOptions::new().with_lease(member)),
            ),
        )
        .await
        .map_err(|x| format!("register: {x}"))?;
        let (keeper, stream) = within(quarter, self.client.lease_keep_alive(member))
            .await
            .map_err(|x| format!("member keep-alive: {x}"))?;
        tracing::info!(prefix = %self.keys.prefix, "registered in etcd");
        Ok(KeepAlive { keeper, stream })
    }

    /// Renews the member lease, and the leader lease while we lead: a
    /// leader whose lease etcd says has expired steps down.
    async fn renew_leases(&mut self, member: &mut KeepAlive) -> Result<(), String> {
        let core = self.core;
        let repl = &core.node.repl;
        if !renew(&mut member.keeper, &mut member.stream, self.quarter)
            .await
            .map_err(|x| format!("member renewal: {x}"))?
        {
            return Err("this node's member lease expired".into());
        }
        if let Some(l) = self.leading.as_mut() {
            let sent_ns = core.clock.now_ns();
            if renew(&mut l.keeper, &mut l.stream, self.quarter).await? {
                repl.coord_until_ns
                    .store(sent_ns.saturating_add(self.fence_ns), Ordering::Release);
            } else {
                tracing::warn!("the leader lease expired: stepping down");
                self.leading = None;
                step_down(core, self.held, "", repl.epoch());
            }
        }
        Ok(())
    }

    /// While we lead: in sync mode with no follower in sync, erase every
    /// `synced` record and admit alone; else write the record of a
    /// follower newly in sync.
    async fn mark_followers(&mut self) -> Result<(), String> {
        let repl = &self.core.node.repl;
        let unfollowed = repl.mode == Mode::Sync
            && repl.state() != ReplState::Streaming
            && repl.solo.load(Ordering::Acquire) == 0;
        let Some(epoch) = self.leading.as_ref().map(|l| l.epoch) else {
            return Ok(());
        };
        if unfollowed {
            self.go_solo(epoch).await
        } else {
            self.mark_synced(epoch).await
        }
    }

    /// No follower in sync: erases every node's record of being one,
    /// while the key is still ours, then admits alone.
    async fn go_solo(&mut self, epoch: i64) -> Result<(), String> {
        let done = within(
            self.quarter,
            erase_marks(&mut self.client, &self.keys, epoch, &self.me),
        )
        .await
        .map_err(|x| format!("going solo: {x}"))?;
        if done {
            self.marked = None;
            self.core.node.repl.solo.store(1, Ordering::Release);
            tracing::warn!(
                "no follower in sync: serving alone (etcd says no one else may take over)"
            );
        }
        Ok(())
    }

    /// Writes the `synced` record of a follower that has newly completed
    /// its full sync (and erases any other).
    async fn mark_synced(&mut self, epoch: i64) -> Result<(), String> {
        let repl = &self.core.node.repl;
        let follower = repl.follower();
        let complete = repl.state() == ReplState::Streaming && !follower.is_empty();
        if !complete || self.marked.as_deref() == Some(follower.as_str()) {
            return Ok(());
        }
        // The follower has all of it on every shard: it may take over.
        // From here nothing is admitted alone, so the record stays true
        // until it is erased.
        repl.solo.store(0, Ordering::Release);
        // Erased first: an earlier follower's record must not outlive its
        // place (etcd takes no put inside a range the same transaction
        // deletes).
        let (client, keys, me) = (&mut self.client, &self.keys, self.me.as_str());
        let record = format!("{}{follower}", keys.synced_prefix);
        let put = Txn::new()
            .when(ours(keys, epoch, me))
            .and_then(vec![TxnOp::put(record, epoch.to_string(), None)]);
        let done = within(self.quarter, async {
            if !erase_marks(client, keys, epoch, me).await? {
                return Ok(false);
            }
            let r = client.txn(put).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(r.succeeded())
        })
        .await
        .map_err(|x| format!("synced record: {x}"))?;
        if done {
            tracing::info!(%follower, epoch, "follower in sync: it may take over");
            self.marked = Some(follower);
        }
        Ok(())
    }

    /// etcd names another leader: let go of ours, step down, and follow
    /// it (unless we already do).
    async fn follow_leader(&mut self, addr: String, epoch: u64) {
        let core = self.core;
        let repl = &core.node.repl;
        if let Some(l) = self.leading.take() {
            let _ = within(self.quarter, self.client.lease_revoke(l.lease)).await;
        }
        if repl.is_primary() {
            tracing::warn!(leader = %addr, epoch, "etcd names another leader: stepping down");
        }
        step_down(core, self.held, &addr, epoch);
        repl.observe_epoch(epoch);
        if self.held.following.as_deref() != Some(addr.as_str()) {
            self.held.following = Some(addr.clone());
            self.held.led = None;
            repl.set_primary(&addr);
            tokio::task::spawn_local(super::follower::follow(core.clone(), addr));
        }
    }

    /// No leader: campaigns for the key (unless, in sync mode, this node
    /// is not in sync with the last leader), and becomes primary if it
    /// wins.
    async fn try_lead(&mut self, seen: &Seen) -> Result<(), String> {
        let core = self.core;
        let repl = &core.node.repl;
        let sync = repl.mode == Mode::Sync;
        // The last leader itself, if it has followed no one since (its
        // table is what it admitted), may lead again.
        let was_last = seen.last_leader.as_deref() == Some(self.me.as_str())
            && seen.last_epoch.is_some()
            && seen.last_epoch == self.held.led;
        if sync && seen.last_epoch.is_some() && !repl.watch.in_sync() && !was_last {
            // Not in sync with the last leader: taking over would serve a
            // partial copy. Wait for it to come back.
            return Ok(());
        }
        let sent_ns = core.clock.now_ns();
        let won = within(
            self.quarter,
            campaign(
                &mut self.client,
                &self.keys,
                seen,
                &self.me,
                self.ttl,
                sync && !was_last,
            ),
        )
        .await
        .map_err(|x| format!("campaign: {x}"))?;
        let Some((l, epoch)) = won else {
            return Ok(());
        };
        match repl.promote_at(self.me.clone(), epoch) {
            Ok(epoch) => {
                tracing::warn!(epoch, "took the leader key: primary");
                repl.coord_until_ns
                    .store(sent_ns.saturating_add(self.fence_ns), Ordering::Release);
                self.held.lead = Some(l.lease);
                self.held.led = Some(epoch);
                self.leading = Some(l);
                self.held.following = None;
                self.marked = None;
                self.renewed_at = Instant::now();
            }
            Err(why) => {
                tracing::warn!(%why, "won the leader key but cannot promote: giving it back");
                let _ = within(self.quarter, self.client.lease_revoke(l.lease)).await;
            }
        }
        Ok(())
    }
}

/// `f`, or an error once `limit` has passed.
async fn within<T, E: std::fmt::Display>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// The transaction's guard: the leader key is still the one we created.
fn ours(keys: &Keys, epoch: i64, me: &str) -> Vec<Compare> {
    vec![
        Compare::create_revision(keys.leader.as_str(), CompareOp::Equal, epoch),
        Compare::value(keys.leader.as_str(), CompareOp::Equal, me),
    ]
}

/// Erases every `synced` record while the leader key is ours (`false` if
/// it is not).
async fn erase_marks(
    client: &mut Client,
    keys: &Keys,
    epoch: i64,
    me: &str,
) -> Result<bool, String> {
    let txn = Txn::new()
        .when(ours(keys, epoch, me))
        .and_then(vec![TxnOp::delete(
            keys.synced_prefix.as_str(),
            Some(DeleteOptions::new().with_prefix()),
        )]);
    let r = client.txn(txn).await.map_err(|e| e.to_string())?;
    Ok(r.succeeded())
}

/// One keep-alive of a lease; `false` when etcd says it has expired.
async fn renew(
    keeper: &mut etcd_client::LeaseKeeper,
    stream: &mut etcd_client::LeaseKeepAliveStream,
    timeout: Duration,
) -> Result<bool, String> {
    let once = async {
        keeper.keep_alive().await?;
        stream.message().await
    };
    match tokio::time::timeout(timeout, once).await {
        Ok(Ok(Some(r))) => Ok(r.ttl() > 0),
        Ok(Ok(None)) => Err("the keep-alive stream ended".into()),
        // etcd forgot the lease: it expired.
        Ok(Err(e)) if e.to_string().contains("not found") => Ok(false),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no keep-alive answer in time".into()),
    }
}

/// The group's keys, as this node needs them.
async fn read(client: &mut Client, keys: &Keys) -> Result<Seen, String> {
    let resp = client
        .get(keys.prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| e.to_string())?;
    let mut seen = Seen::default();
    for kv in resp.kvs() {
        let key = kv.key_str().unwrap_or_default();
        let value = kv.value_str().unwrap_or_default().to_owned();
        let revision = |r: i64| u64::try_from(r).unwrap_or(0);
        if key == keys.leader {
            seen.leader = Some((value, revision(kv.create_revision())));
        } else if key == keys.last {
            seen.last_epoch = Some(revision(kv.mod_revision()));
            seen.last_leader = Some(value);
        }
    }
    Ok(seen)
}

/// Tries to take the leader key: in one transaction, only if there is no
/// leader, the latest leader is still the one we saw, and (`check_synced`:
/// sync mode, once there has been a leader, unless we were it) our
/// `synced` record names its epoch. Returns our hold and the new epoch if
/// we won.
async fn campaign(
    client: &mut Client,
    keys: &Keys,
    seen: &Seen,
    me: &str,
    ttl: i64,
    check_synced: bool,
) -> Result<Option<(Leading, u64)>, String> {
    let lease = client
        .lease_grant(ttl, None)
        .await
        .map_err(|x| format!("campaign lease: {x}"))?
        .id();
    let mut when = vec![Compare::version(keys.leader.as_str(), CompareOp::Equal, 0)];
    match seen.last_epoch {
        Some(last) => {
            let last = i64::try_from(last).unwrap_or(i64::MAX);
            when.push(Compare::mod_revision(
                keys.last.as_str(),
                CompareOp::Equal,
                last,
            ));
            if check_synced {
                when.push(Compare::value(
                    keys.synced.as_str(),
                    CompareOp::Equal,
                    last.to_string(),
                ));
            }
        }
        None => when.push(Compare::version(keys.last.as_str(), CompareOp::Equal, 0)),
    }
    let txn = Txn::new().when(when).and_then(vec![
        TxnOp::put(
            keys.leader.as_str(),
            me,
            Some(PutOptions::new().with_lease(lease)),
        ),
        TxnOp::put(keys.last.as_str(), me, None),
    ]);
    let resp = client
        .txn(txn)
        .await
        .map_err(|x| format!("campaign: {x}"))?;
    if !resp.succeeded() {
        // Unbounded here: the caller bounds the whole campaign.
        let _ = client.lease_revoke(lease).await;
        return Ok(None);
    }
    let epoch = resp
        .header()
        .map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0));
    let (keeper, stream) = client
        .lease_keep_alive(lease)
        .await
        .map_err(|x| format!("leader keep-alive: {x}"))?;
    Ok(Some((
        Leading {
            epoch: i64::try_from(epoch).unwrap_or(i64::MAX),
            lease,
            keeper,
            stream,
        },
        epoch,
    )))
}
