//! [`Client`]: routing, deadlines and reconnection over [`Conn`]s.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_protocol::message::{
    DecideOk, HelloOk, LeaseOk, LeaseTarget, LimitSet, Limits, Mode, Reply, StatsOk, KEY_BYTES_MAX,
    LIMITS_MAX, TIER_BYTES_MAX,
};
use sluice_protocol::replication::RoleOk;
use sluice_protocol::routing::{key_hash, shard_of, ROUTING_XXH3_128_MULSHIFT};
use sluice_protocol::{Limit, Policy, Priority, Reserved, Verdict};

use crate::connection::{fail_items, Call, Conn, Op, OwnedLimits, OwnedTarget, Sink};
use crate::error::Error;

/// Default deadline of a call.
pub const DEADLINE_MS_DEFAULT: u64 = 5;
/// Default time allowed to connect and complete HELLO.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;

/// How a [`Client`] behaves.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How long a call may take, end to end.
    pub deadline: Duration,
    /// How long connecting (TCP and HELLO) may take.
    pub connect_timeout: Duration,
    /// One connection per shard, each key sent to its owner (no server
    /// forwarding); when false, one connection carries every key.
    pub shard_aware: bool,
    /// Sent in HELLO when the server requires it.
    pub auth_token: Option<String>,
    /// The highest epoch the caller has seen for this node's group, sent
    /// in HELLO (0: none): a primary older than that learns it is stale
    /// and stops admitting. The cluster client sets it per group.
    pub known_epoch: u64,
    /// The cluster layout hash of a node that forwards through this client
    /// (`sluice_protocol::ring::layout_hash`), sent in HELLO; 0 (the
    /// default) for a gateway. A node with another layout refuses the
    /// HELLO with LAYOUT_MISMATCH.
    pub layout_hash: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            deadline: Duration::from_millis(DEADLINE_MS_DEFAULT),
            connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS_DEFAULT),
            shard_aware: true,
            auth_token: None,
            known_epoch: 0,
            layout_hash: 0,
        }
    }
}

/// One connection slot: the connection in use, replaced when it dies.
#[derive(Debug)]
struct Slot {
    /// The shard the connection is bound to, if shard-aware.
    shard: Option<u16>,
    /// The live connection.
    conn: Mutex<Arc<Conn>>,
    /// Held while reconnecting, so that one caller reconnects and the rest
    /// wait for it.
    reconnecting: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    config: ClientConfig,
    hello: HelloOk,
    /// One per shard when shard-aware, else one.
    slots: Vec<Slot>,
}

/// A handle to one Sluice node, shared by every task of a gateway.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects with the default configuration.
    pub async fn connect(addr: impl tokio::net::ToSocketAddrs) -> Result<Client, Error> {
        Client::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects: HELLO on one connection to learn the shard layout, then,
    /// when shard-aware, one connection bound to each shard.
    pub async fn connect_with(
        addr: impl tokio::net::ToSocketAddrs,
        config: ClientConfig,
    ) -> Result<Client, Error> {
        let addr = resolve(addr).await?;
        let token = config.auth_token.clone().unwrap_or_default();
        let epoch = (config.known_epoch, config.layout_hash);
        let first = Conn::open(addr, None, token.as_bytes(), config.connect_timeout, epoch).await?;
        let hello = first.hello;
        if hello.routing != ROUTING_XXH3_128_MULSHIFT {
            return Err(Error::Protocol(format!(
                "unknown routing scheme {}",
                hello.routing
            )));
        }
        let slots = if config.shard_aware && hello.shard_count > 1 {
            let mut slots = Vec::with_capacity(usize::from(hello.shard_count));
            for shard in 0..hello.shard_count {
                let timeout = config.connect_timeout;
                let conn = Conn::open(addr, Some(shard), token.as_bytes(), timeout, epoch).await?;
                slots.push(Slot::new(Some(shard), conn));
            }
            slots
        } else {
            vec![Slot::new(None, first)]
        };
        Ok(Client {
            inner: Arc::new(Inner {
                addr,
                config,
                hello,
                slots,
            }),
        })
    }

    /// What the node said at HELLO: shard count, node id, epoch.
    pub fn hello(&self) -> HelloOk {
        self.inner.hello
    }

    /// Whether the node takes a CELL by its key's hash on this client's
    /// connections (HELLO_OK's CELL_KEY_HASH: a node of this version asked
    /// with a layout, as a forwarding node asks).
    pub fn takes_cells_by_hash(&self) -> bool {
        self.inner.hello.features & sluice_protocol::message::FEATURE_CELL_KEY_HASH != 0
    }

    /// Round trip to the node (on the first connection).
    pub async fn ping(&self) -> Result<Duration, Error> {
        let start = Instant::now();
        match self.call(0, Call::Ping).await? {
            Reply::Pong => Ok(start.elapsed()),
            other => Err(unexpected(&other)),
        }
    }

    /// Spends `cost` units of `key`'s bucket under `policy`.
    pub async fn throttle(&self, key: &[u8], policy: Policy, cost: u64) -> Result<Verdict, Error> {
        self.throttle_or_peek(key, policy, cost, false).await
    }

    /// Answers as `throttle` would, spending and creating nothing.
    pub async fn peek(&self, key: &[u8], policy: Policy, cost: u64) -> Result<Verdict, Error> {
        self.throttle_or_peek(key, policy, cost, true).await
    }

    async fn throttle_or_peek(
        &self,
        key: &[u8],
        policy: Policy,
        cost: u64,
        peek: bool,
    ) -> Result<Verdict, Error> {
        check_key(key)?;
        policy
            .validate()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        policy
            .check_cost(cost)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let slot = self.slot_of(key);
        let call = Call::Op(Op::Throttle {
            key: bytes::Bytes::copy_from_slice(key),
            policy,
            cost,
            peek,
        });
        match self.call(slot, call).await? {
            Reply::Throttle(v) if !peek => Ok(v),
            Reply::Peek(v) if peek => Ok(v),
            other => Err(unexpected(&other)),
        }
    }

    /// The cluster as the node sees it (CLUSTER): its layout hash and
    /// groups (empty for a node without `--cluster`), and, for a non-empty
    /// `key`, the group that owns it.
    pub async fn cluster(&self, key: &[u8]) -> Result<sluice_protocol::message::ClusterOk, Error> {
        if key.len() > KEY_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "key must be at most {KEY_BYTES_MAX} bytes"
            )));
        }
        let call = Call::Cluster { key: key.into() };
        match self.call(0, call).await? {
            Reply::Cluster(ok) => Ok(ok),
            other => Err(unexpected(&other)),
        }
    }

    /// redis-cell's `CL.THROTTLE` of `key` (CELL): what a node forwards for
    /// a RESP client, decided by the owner with redis-cell's arithmetic on
    /// the same bucket as a CL.THROTTLE sent to its RESP port.
    pub async fn cell(
        &self,
        key: &[u8],
        policy: sluice_protocol::cell::CellPolicy,
        quantity: u64,
    ) -> Result<sluice_protocol::cell::CellVerdict, Error> {
        check_key(key)?;
        let call = Call::Op(Op::Cell {
            key: bytes::Bytes::copy_from_slice(key),
            policy,
            quantity,
        });
        match self.call(self.slot_of(key), call).await? {
            Reply::Cell(v) => Ok(v),
            other => Err(unexpected(&other)),
        }
    }

    /// Decides `limits` for `key` as one atomic step, in `mode` (DECIDE):
    /// with [`Mode::Spend`], every limit admits and is applied, or nothing
    /// is. The arguments are checked before sending ([`Error::Invalid`]):
    /// the key, a tier name's length, every inline limit's numbers, a
    /// RESET's cost of 0, and for SPEND and PROBE a cost that fits every
    /// inline limit (a tier's limits are the server's to check).
    pub async fn decide(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        mode: Mode,
        cost: u64,
    ) -> Result<DecideOk, Error> {
        self.decide_as(key, limits, mode, cost, Priority::Normal)
            .await
    }

    /// [`Client::decide`] for a request of class `priority`: it may spend
    /// the reserves its class and the classes below it keep, and the
    /// verdicts are its class's (see [`sluice_protocol::priority`]).
    pub async fn decide_as(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        mode: Mode,
        cost: u64,
        priority: Priority,
    ) -> Result<DecideOk, Error> {
        check_decide(key, &limits, mode, cost)?;
        let call = Call::Op(Op::Decide {
            mode,
            key: bytes::Bytes::copy_from_slice(key),
            limits: OwnedLimits::new(&limits),
            cost,
            priority,
        });
        match self.call(self.slot_of(key), call).await? {
            Reply::Decide(ok) => Ok(ok),
            other => Err(unexpected(&other)),
        }
    }

    /// Spends `cost` units of every limit, or none if any denies; each
    /// admitted concurrency limit acquires a lease (its `lease_id`).
    pub async fn spend(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        cost: u64,
    ) -> Result<DecideOk, Error> {
        self.decide(key, limits, Mode::Spend, cost).await
    }

    /// Answers as [`Client::spend`] would, changing and creating nothing.
    pub async fn probe(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        cost: u64,
    ) -> Result<DecideOk, Error> {
        self.decide(key, limits, Mode::Probe, cost).await
    }

    /// Gives `cost` units back to every limit (never above its limit; leases
    /// are left alone: release them by id).
    pub async fn refund(
        &self,
        key: &[u8],
        limits: Limits<'_>,
        cost: u64,
    ) -> Result<DecideOk, Error> {
        self.decide(key, limits, Mode::Refund, cost).await
    }

    /// Clears every limit's bucket (and drops every lease).
    pub async fn reset(&self, key: &[u8], limits: Limits<'_>) -> Result<DecideOk, Error> {
        self.decide(key, limits, Mode::Reset, 0).await
    }

    /// Gives back the lease `lease_id` that a SPEND of `key` acquired from
    /// the concurrency limit `target` (RELEASE).
    pub async fn release(
        &self,
        key: &[u8],
        target: LeaseTarget<'_>,
        lease_id: u64,
    ) -> Result<LeaseOk, Error> {
        self.lease(key, target, lease_id, false).await
    }

    /// Extends the lease `lease_id` by its limit's `lease_ns` from now
    /// (RENEW); the reply says how long it now has.
    pub async fn renew(
        &self,
        key: &[u8],
        target: LeaseTarget<'_>,
        lease_id: u64,
    ) -> Result<LeaseOk, Error> {
        self.lease(key, target, lease_id, true).await
    }

    async fn lease(
        &self,
        key: &[u8],
        target: LeaseTarget<'_>,
        lease_id: u64,
        renew: bool,
    ) -> Result<LeaseOk, Error> {
        check_lease(key, &target, lease_id)?;
        let call = Call::Op(Op::Lease {
            renew,
            key: bytes::Bytes::copy_from_slice(key),
            target: OwnedTarget::new(&target),
            lease_id,
        });
        match self.call(self.slot_of(key), call).await? {
            Reply::Release(ok) if !renew => Ok(ok),
            Reply::Renew(ok) if renew => Ok(ok),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks the node to re-read its configuration file, as SIGHUP does
    /// (RELOAD). Returns how many tiers it now defines; a bad file is
    /// [`Status::ConfigInvalid`](sluice_protocol::Status::ConfigInvalid)
    /// and leaves the old tiers in force.
    pub async fn reload(&self) -> Result<u32, Error> {
        match self.call(0, Call::Reload).await? {
            Reply::Reload { tier_count } => Ok(tier_count),
            other => Err(unexpected(&other)),
        }
    }

    /// The node's role (primary or follower), epoch and replication state
    /// (ROLE).
    pub async fn role(&self) -> Result<RoleOk, Error> {
        match self.call(0, Call::Role).await? {
            Reply::Role(ok) => Ok(*ok),
            other => Err(unexpected(&other)),
        }
    }

    /// Makes the node the primary (PROMOTE), as when its primary has died.
    /// Returns the node's new epoch.
    pub async fn promote(&self) -> Result<u64, Error> {
        match self.call(0, Call::Promote).await? {
            Reply::Promote { epoch } => Ok(epoch),
            other => Err(unexpected(&other)),
        }
    }

    /// Planned handover (FAILOVER, sent to the primary): the primary stops
    /// admitting, waits until its follower has everything, hands over at a
    /// new epoch and follows it. Returns the new epoch and how long the
    /// group admitted nothing. Takes up to a few seconds: give this call a
    /// deadline of that order.
    pub async fn failover(&self) -> Result<sluice_protocol::replication::FailoverOk, Error> {
        match self.call(0, Call::Failover).await? {
            Reply::Failover(ok) => Ok(ok),
            other => Err(unexpected(&other)),
        }
    }

    /// Every shard's counters (STATS), reading as many pages as the node
    /// sends: the result has `shard_first` 0 and one record per shard.
    pub async fn stats(&self) -> Result<StatsOk, Error> {
        let mut all = StatsOk {
            shard_count: 0,
            shard_first: 0,
            shards: Vec::new(),
        };
        // One page per request; a page that adds nothing ends the loop, so
        // this runs at most `shard_count` times.
        loop {
            let shard_first = u16::try_from(all.shards.len())
                .map_err(|_| Error::Protocol("more than 65,535 shard records".into()))?;
            let page = match self.call(0, Call::Stats { shard_first }).await? {
                Reply::Stats(page) => page,
                other => return Err(unexpected(&other)),
            };
            if page.shard_first != shard_first
                || (shard_first > 0 && page.shard_count != all.shard_count)
            {
                return Err(Error::Protocol(format!(
                    "STATS from shard {shard_first} answered shard {} of {}",
                    page.shard_first, page.shard_count
                )));
            }
            all.shard_count = page.shard_count;
            let added = page.shards.len();
            all.shards.extend(page.shards);
            if all.shards.len() >= usize::from(all.shard_count) {
                return Ok(all);
            }
            if added == 0 {
                return Err(Error::Protocol(format!(
                    "STATS stopped at shard {shard_first} of {}",
                    all.shard_count
                )));
            }
        }
    }

    /// The slot whose connection serves `key`: its shard's when shard-aware.
    fn slot_of(&self, key: &[u8]) -> usize {
        if self.inner.slots.len() > 1 {
            self.slot_of_hash(key_hash(key))
        } else {
            0
        }
    }

    /// [`Client::slot_of`] the key of routing hash `hash`.
    fn slot_of_hash(&self, hash: u128) -> usize {
        if self.inner.slots.len() > 1 {
            usize::from(shard_of(hash, self.inner.hello.shard_count))
        } else {
            0
        }
    }

    /// Sends every op of `batch`, each on its shard's connection (one
    /// message per connection: its writer puts it in one frame),
    /// reconnecting a connection that died first; an op that cannot be
    /// sent is answered in the batch (a failed reconnect's error: not
    /// applied). Its replies come into `batch`.
    pub(crate) async fn send_batch(&self, batch: &Arc<dyn Sink>) {
        let slots = self.inner.slots.len();
        let items: Vec<Vec<u32>> = if slots == 1 {
            vec![(0..batch.op_count() as u32).collect()]
        } else {
            // Each slot's list sized once: grown from empty, they were a
            // forwarding node's most frequent reallocation.
            let of: Vec<usize> = batch.shards(self.inner.hello.shard_count);
            let mut counts = vec![0usize; slots];
            for &s in &of {
                counts[s] += 1;
            }
            let mut items: Vec<Vec<u32>> = counts.into_iter().map(Vec::with_capacity).collect();
            for (i, &s) in of.iter().enumerate() {
                items[s].push(i as u32);
            }
            items
        };
        let deadline = self.inner.config.deadline;
        for (slot, items) in self.inner.slots.iter().zip(items) {
            if items.is_empty() {
                continue;
            }
            let mut conn = slot.current();
            if conn.is_closed() {
                let reconnect = tokio::time::timeout(deadline, self.reconnect(slot, &conn)).await;
                match reconnect.map_err(|_| Error::Timeout(deadline)) {
                    Ok(Ok(fresh)) => conn = fresh,
                    Ok(Err(e)) | Err(e) => {
                        fail_items(&**batch, &items, || e.copy());
                        continue;
                    }
                }
            }
            conn.send_batch(batch, items);
        }
    }

    /// Sends `call` on slot `index`, reconnecting it first if it died.
    async fn call(&self, index: usize, call: Call) -> Result<Reply, Error> {
        let start = Instant::now();
        let deadline = self.inner.config.deadline;
        let slot = &self.inner.slots[index];
        let mut conn = slot.current();
        if conn.is_closed() {
            let reconnect = self.reconnect(slot, &conn);
            conn = tokio::time::timeout(deadline, reconnect)
                .await
                .map_err(|_| Error::Timeout(deadline))??;
        }
        conn.call(call, deadline.saturating_sub(start.elapsed()))
            .await
    }

    async fn reconnect(&self, slot: &Slot, dead: &Arc<Conn>) -> Result<Arc<Conn>, Error> {
        let _one_at_a_time = slot.reconnecting.lock().await;
        let current = slot.current();
        if !Arc::ptr_eq(&current, dead) && !current.is_closed() {
            return Ok(current);
        }
        let token = self.inner.config.auth_token.clone().unwrap_or_default();
        let conn = Conn::open(
            self.inner.addr,
            slot.shard,
            token.as_bytes(),
            self.inner.config.connect_timeout,
            (self.inner.config.known_epoch, self.inner.config.layout_hash),
        )
        .await?;
        if conn.hello.shard_count != self.inner.hello.shard_count {
            return Err(Error::Protocol(format!(
                "the node now has {} shards, not {}: connect a new client",
                conn.hello.shard_count, self.inner.hello.shard_count
            )));
        }
        let conn = Arc::new(conn);
        *slot.conn.lock().unwrap_or_else(|e| e.into_inner()) = conn.clone();
        Ok(conn)
    }
}

impl Slot {
    fn new(shard: Option<u16>, conn: Conn) -> Slot {
        Slot {
            shard,
            conn: Mutex::new(Arc::new(conn)),
            reconnecting: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Arc<Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

async fn resolve(addr: impl tokio::net::ToSocketAddrs) -> Result<SocketAddr, Error> {
    let mut addrs = tokio::net::lookup_host(addr)
        .await
        .map_err(|source| Error::Connect {
            addr: "(unresolved)".into(),
            source,
        })?;
    addrs.next().ok_or_else(|| Error::Connect {
        addr: "(unresolved)".into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
    })
}

/// [`inline_limits`] with each limit's reserves (`reserve=CLASS:P%`
/// in its spec; see [`sluice_protocol::priority`]).
pub fn inline_reserved(limits: &[Reserved]) -> Result<Limits<'static>, Error> {
    LimitSet::with_reserves(limits)
        .map(Limits::Inline)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "name 1..={LIMITS_MAX} limits, not {}",
                limits.len()
            ))
        })
}

/// The inline limits `limits`, in order, for [`Client::decide`]:
/// [`Error::Invalid`] unless there are 1..=[`LIMITS_MAX`] (their numbers are
/// checked when deciding).
pub fn inline_limits(limits: &[Limit]) -> Result<Limits<'static>, Error> {
    LimitSet::new(limits).map(Limits::Inline).ok_or_else(|| {
        Error::Invalid(format!(
            "name 1..={LIMITS_MAX} limits, not {}",
            limits.len()
        ))
    })
}

#[inline]
pub(crate) fn check_key(key: &[u8]) -> Result<(), Error> {
    if !key_ok(key) {
        return Err(Error::Invalid(format!(
            "a key must be 1..={KEY_BYTES_MAX} bytes"
        )));
    }
    Ok(())
}

/// Whether `key` is a key protocol v1 takes (1..=KEY_BYTES_MAX bytes).
#[inline]
pub(crate) fn key_ok(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= KEY_BYTES_MAX
}

fn check_tier(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > TIER_BYTES_MAX {
        return Err(Error::Invalid(format!(
            "a tier name must be 1..={TIER_BYTES_MAX} bytes"
        )));
    }
    Ok(())
}

/// What the server would refuse in a DECIDE without looking at its state,
/// in the server's order (key, limits, cost).
pub(crate) fn check_decide(
    key: &[u8],
    limits: &Limits<'_>,
    mode: Mode,
    cost: u64,
) -> Result<(), Error> {
    if mode == Mode::Reset && cost != 0 {
        return Err(Error::Invalid("a reset takes cost 0".into()));
    }
    check_key(key)?;
    match limits {
        Limits::Inline(set) => {
            set.validate().map_err(|e| Error::Invalid(e.to_string()))?;
            set.check_cost(mode, cost)
                .map_err(|e| Error::Invalid(e.to_string()))
        }
        Limits::Tier(name) => check_tier(name),
    }
}

/// What the server would refuse in a RELEASE or RENEW without looking at
/// its state.
pub(crate) fn check_lease(
    key: &[u8],
    target: &LeaseTarget<'_>,
    lease_id: u64,
) -> Result<(), Error> {
    if lease_id == 0 {
        return Err(Error::Invalid("lease id 0 names no lease".into()));
    }
    let index = match *target {
        LeaseTarget::Inline { index, .. } | LeaseTarget::Tier { index, .. } => index,
    };
    if usize::from(index) >= LIMITS_MAX {
        return Err(Error::Invalid(format!(
            "a limit index must be 0..{LIMITS_MAX}, not {index}"
        )));
    }
    if let LeaseTarget::Tier { name, .. } = target {
        check_tier(name)?;
    }
    check_key(key)?;
    if let LeaseTarget::Inline { limit, .. } = target {
        limit
            .validate()
            .map_err(|e| Error::Invalid(format!("limit {index}: {e}")))?;
    }
    Ok(())
}

pub(crate) fn unexpected(reply: &Reply) -> Error {
    Error::Protocol(format!("unexpected reply {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::Concurrency;

    fn limits(specs: &[&str]) -> Vec<Limit> {
        specs.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn invalid(r: Result<(), Error>) -> String {
        match r {
            Err(Error::Invalid(text)) => text,
            other => panic!("expected Error::Invalid, got {other:?}"),
        }
    }

    #[test]
    fn inline_limits_hold_one_to_eight() {
        let one = limits(&["token-bucket:5/s"]);
        assert!(inline_limits(&one).is_ok());
        assert!(inline_limits(&[one[0]; LIMITS_MAX]).is_ok());
        assert!(matches!(inline_limits(&[]), Err(Error::Invalid(_))));
        let nine = [one[0]; LIMITS_MAX + 1];
        assert!(matches!(inline_limits(&nine), Err(Error::Invalid(_))));
    }

    #[test]
    fn decide_arguments_are_checked_like_the_server_does() {
        let set = limits(&[
            "token-bucket:5/s,burst=5",
            "fixed-window:3/m",
            "concurrency:10",
        ]);
        let set = inline_limits(&set).unwrap();
        for mode in [Mode::Spend, Mode::Probe, Mode::Refund] {
            assert!(check_decide(b"k", &set, mode, 3).is_ok());
        }
        assert!(check_decide(b"k", &set, Mode::Reset, 0).is_ok());
        // The key.
        assert!(invalid(check_decide(b"", &set, Mode::Spend, 1)).contains("key"));
        let long = [b'k'; KEY_BYTES_MAX + 1];
        assert!(check_decide(&long, &set, Mode::Spend, 1).is_err());
        assert!(check_decide(&long[1..], &set, Mode::Spend, 1).is_ok());
        // The cost fits every limit (the fixed window's 3) for SPEND and
        // PROBE; a refund gives back any number; a reset takes 0.
        for mode in [Mode::Spend, Mode::Probe] {
            let text = invalid(check_decide(b"k", &set, mode, 4));
            assert!(
                text.contains("limit 1") && text.contains("exceeds"),
                "{text}"
            );
        }
        assert!(check_decide(b"k", &set, Mode::Refund, u64::MAX).is_ok());
        assert!(invalid(check_decide(b"k", &set, Mode::Reset, 1)).contains("reset"));
        // Every limit's numbers, naming the bad one.
        let bad = Limit::Concurrency(Concurrency {
            limit: 1,
            lease_ns: 1,
        });
        let with_bad = inline_limits(&[limits(&["sliding-log:9/s"])[0], bad]).unwrap();
        let text = invalid(check_decide(b"k", &with_bad, Mode::Spend, 1));
        assert!(text.contains("limit 1"), "{text}");
        // A tier's name, not its limits.
        assert!(check_decide(b"k", &Limits::Tier("free"), Mode::Spend, u64::MAX).is_ok());
        assert!(check_decide(b"k", &Limits::Tier(""), Mode::Spend, 1).is_err());
        let name = "t".repeat(TIER_BYTES_MAX + 1);
        assert!(check_decide(b"k", &Limits::Tier(&name), Mode::Spend, 1).is_err());
        assert!(check_decide(b"k", &Limits::Tier(&name[1..]), Mode::Spend, 1).is_ok());
    }

    #[test]
    fn lease_arguments_are_checked_like_the_server_does() {
        let limit = Concurrency::new(2, 1_000_000_000).unwrap();
        let inline = |index| LeaseTarget::Inline { index, limit };
        assert!(check_lease(b"k", &inline(7), 1).is_ok());
        assert!(invalid(check_lease(b"k", &inline(0), 0)).contains("lease id 0"));
        assert!(invalid(check_lease(b"k", &inline(8), 1)).contains("index"));
        assert!(check_lease(b"", &inline(0), 1).is_err());
        let bad = LeaseTarget::Inline {
            index: 2,
            limit: Concurrency {
                limit: 0,
                lease_ns: 1_000_000_000,
            },
        };
        assert!(invalid(check_lease(b"k", &bad, 1)).contains("limit 2"));
        let tier = |name, index| LeaseTarget::Tier { name, index };
        assert!(check_lease(b"k", &tier("free", 1), 5).is_ok());
        assert!(check_lease(b"k", &tier("", 1), 5).is_err());
        assert!(check_lease(b"k", &tier("free", 8), 5).is_err());
    }
}
