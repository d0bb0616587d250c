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

use crate::shard::ShardCore;
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
    let node = &core.node;
    let config = &node.config;
    let repl = &node.repl;
    let me = node.advertised();
    let keys = Keys::new(
        &config.cluster_name,
        config.group.as_deref().unwrap_or_default(),
        &me,
    );
    let ttl_s = config.leader_ttl_s;
    let ttl = i64::try_from(ttl_s).unwrap_or(i64::MAX);
    let quarter = Duration::from_millis(ttl_s * 1_000 / 4);
    let fence_ns = ttl_s * 1_000_000_000 * LEADER_FENCE.0 / LEADER_FENCE.1;
    // No per-request timeout on the channel: gRPC sends it as a deadline,
    // and etcd would end the keep-alive streams at it. Each call is
    // bounded by `within` instead.
    let options = ConnectOptions::new().with_connect_timeout(quarter);
    let coordinator = config.coordinator.as_deref().unwrap_or_default();
    let mut client = within(
        quarter,
        Client::connect(endpoints(coordinator), Some(options)),
    )
    .await
    .map_err(|x| format!("connect: {x}"))?;
    let mut leading: Option<Leading> = None;
    if let Some(lease) = held.lead {
        // Resume our lead if etcd still has our lease. While etcd does not
        // answer, keep it: the gate closes on its own (the issue's "keeps
        // serving until its lease would expire, then stops"), and only a
        // definite answer, or a gate closed for a whole TTL (the lease is
        // surely gone), makes us let go.
        let ttl_ns = ttl_s * 1_000_000_000;
        let gate = repl.coord_until_ns.load(Ordering::Acquire);
        let sent_ns = core.clock.now_ns();
        let surely_gone = sent_ns > gate.saturating_add(ttl_ns);
        let resumed = if surely_gone {
            Ok(None)
        } else {
            match within(quarter, client.lease_keep_alive(lease)).await {
                Ok((mut keeper, mut stream)) => {
                    match renew(&mut keeper, &mut stream, quarter).await {
                        Ok(true) => Ok(Some((keeper, stream))),
                        Ok(false) => Ok(None),
                        Err(e) => Err(e),
                    }
                }
                Err(e) if e.contains("not found") => Ok(None),
                Err(e) => Err(e),
            }
        };
        match resumed? {
            Some((keeper, stream)) if repl.is_primary() => {
                repl.coord_until_ns
                    .store(sent_ns.saturating_add(fence_ns), Ordering::Release);
                leading = Some(Leading {
                    epoch: i64::try_from(held.led.unwrap_or_else(|| repl.epoch()))
                        .unwrap_or(i64::MAX),
                    lease,
                    keeper,
                    stream,
                });
            }
            _ => {
                tracing::warn!("the leader lease expired while etcd was away: stepping down");
                step_down(core, held, "", repl.epoch());
            }
        }
    } else if repl.is_primary() {
        step_down(core, held, "", repl.epoch());
    }
    let member = within(quarter, client.lease_grant(ttl, None))
        .await
        .map_err(|x| format!("member lease: {x}"))?
        .id();
    within(
        quarter,
        client.put(
            keys.member.as_str(),
            me.as_str(),
            Some(PutOptions::new().with_lease(member)),
        ),
    )
    .await
    .map_err(|x| format!("register: {x}"))?;
    let (mut member_keeper, mut member_stream) = within(quarter, client.lease_keep_alive(member))
        .await
        .map_err(|x| format!("member keep-alive: {x}"))?;
    tracing::info!(prefix = %keys.prefix, "registered in etcd");
    // The follower whose `synced` record we wrote while leading.
    let mut marked: Option<String> = None;
    let mut renewed_at = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(POLL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if renewed_at.elapsed() >= quarter {
            renewed_at = Instant::now();
            if !renew(&mut member_keeper, &mut member_stream, quarter)
                .await
                .map_err(|x| format!("member renewal: {x}"))?
            {
                return Err("this node's member lease expired".into());
            }
            if let Some(l) = leading.as_mut() {
                let sent_ns = core.clock.now_ns();
                if renew(&mut l.keeper, &mut l.stream, quarter).await? {
                    repl.coord_until_ns
                        .store(sent_ns.saturating_add(fence_ns), Ordering::Release);
                } else {
                    tracing::warn!("the leader lease expired: stepping down");
                    leading = None;
                    step_down(core, held, "", repl.epoch());
                }
            }
        }
        let unfollowed = repl.mode == Mode::Sync
            && repl.state() != ReplState::Streaming
            && repl.solo.load(Ordering::Acquire) == 0;
        if let Some(epoch) = leading.as_ref().filter(|_| unfollowed).map(|l| l.epoch) {
            // No follower in sync: erase every node's record of being
            // one, while the key is still ours, then admit alone.
            let done = within(quarter, erase_marks(&mut client, &keys, epoch, &me))
                .await
                .map_err(|x| format!("going solo: {x}"))?;
            if done {
                marked = None;
                repl.solo.store(1, Ordering::Release);
                tracing::warn!(
                    "no follower in sync: serving alone (etcd says no one else may take over)"
                );
            }
        } else if let Some(epoch) = leading.as_ref().map(|l| l.epoch) {
            let follower = repl.follower();
            let complete = repl.state() == ReplState::Streaming && !follower.is_empty();
            if complete && marked.as_deref() != Some(follower.as_str()) {
                // The follower has all of it on every shard: it may take
                // over. From here nothing is admitted alone, so the record
                // stays true until it is erased.
                repl.solo.store(0, Ordering::Release);
                // Erased first: an earlier follower's record must not
                // outlive its place (etcd takes no put inside a range the
                // same transaction deletes).
                let record = format!("{}{follower}", keys.synced_prefix);
                let put = Txn::new()
                    .when(ours(&keys, epoch, &me))
                    .and_then(vec![TxnOp::put(record, epoch.to_string(), None)]);
                let done = within(quarter, async {
                    if !erase_marks(&mut client, &keys, epoch, &me).await? {
                        return Ok(false);
                    }
                    let r = client.txn(put).await.map_err(|e| e.to_string())?;
                    Ok::<_, String>(r.succeeded())
                })
                .await
                .map_err(|x| format!("synced record: {x}"))?;
                if done {
                    tracing::info!(%follower, epoch, "follower in sync: it may take over");
                    marked = Some(follower);
                }
            }
        }
        let seen = within(quarter, read(&mut client, &keys))
            .await
            .map_err(|x| format!("read: {x}"))?;
        match seen.leader {
            Some((addr, _)) if addr == me => {
                // Ours; or, with no lease of ours, a key of an earlier life
                // of this node: it expires on its own.
            }
            Some((addr, epoch)) => {
                if let Some(l) = leading.take() {
                    let _ = within(quarter, client.lease_revoke(l.lease)).await;
                }
                if repl.is_primary() {
                    tracing::warn!(leader = %addr, epoch, "etcd names another leader: stepping down");
                }
                step_down(core, held, &addr, epoch);
                repl.observe_epoch(epoch);
                if held.following.as_deref() != Some(addr.as_str()) {
                    held.following = Some(addr.clone());
                    held.led = None;
                    repl.set_primary(&addr);
                    tokio::task::spawn_local(super::follower::follow(core.clone(), addr));
                }
            }
            None if leading.is_none() => {
                let sync = repl.mode == Mode::Sync;
                // The last leader itself, if it has followed no one since
                // (its table is what it admitted), may lead again.
                let was_last = seen.last_leader.as_deref() == Some(me.as_str())
                    && seen.last_epoch.is_some()
                    && seen.last_epoch == held.led;
                if sync && seen.last_epoch.is_some() && !repl.watch.in_sync() && !was_last {
                    // Not in sync with the last leader: taking over would
                    // serve a partial copy. Wait for it to come back.
                    continue;
                }
                let sent_ns = core.clock.now_ns();
                let won = within(
                    quarter,
                    campaign(&mut client, &keys, &seen, &me, ttl, sync && !was_last),
                )
                .await
                .map_err(|x| format!("campaign: {x}"))?;
                if let Some((l, epoch)) = won {
                    match repl.promote_at(me.clone(), epoch) {
                        Ok(epoch) => {
                            tracing::warn!(epoch, "took the leader key: primary");
                            repl.coord_until_ns
                                .store(sent_ns.saturating_add(fence_ns), Ordering::Release);
                            held.lead = Some(l.lease);
                            held.led = Some(epoch);
                            leading = Some(l);
                            held.following = None;
                            marked = None;
                            renewed_at = Instant::now();
                        }
                        Err(why) => {
                            tracing::warn!(%why, "won the leader key but cannot promote: giving it back");
                            let _ = within(quarter, client.lease_revoke(l.lease)).await;
                        }
                    }
                }
            }
            None => {}
        }
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
