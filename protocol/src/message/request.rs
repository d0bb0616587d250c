//! The requests: their types, parsing and validation, and encoding.

use std::ops::Deref;

use bytes::{BufMut, BytesMut};

use super::consts::{
    CELL_FIXED_BYTES, DECIDE_FIXED_BYTES, HELLO_FIXED_BYTES, KEY_BYTES_MAX, LEASE_FIXED_BYTES,
    LIMITS_MAX, LIMIT_RECORD_BYTES, SHARD_ANY, STATS_PAGED_BYTES, THROTTLE_FIXED_BYTES,
    TIER_BYTES_MAX, TOKEN_BYTES_MAX,
};
use super::error::{LayoutError, RequestError};
use super::op;
use super::read::{u16_at, u64_at};
use crate::cell::CellPolicy;
use crate::codec::{message_header, FrameWriter, MessageHeader, HEADER_BYTES};
use crate::identity::Slot;
use crate::limit::{Concurrency, Kind, Limit, Window};
use crate::policy::Policy;
use crate::priority::{Priority, Reserved, Reserves};
use crate::status::Status;

/// HELLO: version negotiation, authentication and an optional shard binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    /// Lowest protocol version the client speaks.
    pub version_min: u16,
    /// Highest protocol version the client speaks.
    pub version_max: u16,
    /// The shard this connection wants to be served by, if any.
    pub shard: Option<u16>,
    /// The auth token; empty when the client has none.
    pub token: &'a [u8],
    /// The highest epoch the client has seen in its group (0: none; then
    /// not sent, and the payload has its original layout). A primary that
    /// learns of a newer epoch than its own is stale: it stops admitting
    /// (and, with `--peer`, steps down to follow the newer primary).
    pub epoch: u64,
    /// The cluster layout hash of a node that forwards to this one
    /// ([`ring::layout_hash`](crate::ring::layout_hash); 0: not a
    /// forwarding node, and not sent). A node whose own layout differs
    /// refuses the HELLO with LAYOUT_MISMATCH, so two nodes that disagree
    /// on who owns a key never split its counts; a connection that sent it
    /// is never forwarded further (WRONG_GROUP for a key of another group).
    pub layout: u64,
}

/// CELL: redis-cell's `CL.THROTTLE` over protocol v1, what a node
/// forwards to a key's owner for a RESP client (the owner decides with
/// redis-cell's arithmetic, `cell::throttle`, on the same bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell<'a> {
    /// The bucket's name; 1..=KEY_BYTES_MAX bytes. Empty in a CELL that
    /// carries the key's hash instead (`hash`).
    pub key: &'a [u8],
    /// The limit, validated ([`CellPolicy::from_parts`]).
    pub policy: CellPolicy,
    /// Units to spend; 0 peeks.
    pub quantity: u64,
    /// The key's hash ([`crate::routing::key_hash`]) in place of the key:
    /// a CELL with the [`CELL_KEY_HASH`] flag, which a forwarding node
    /// sends to an owner whose HELLO_OK announced
    /// [`FEATURE_CELL_KEY_HASH`](crate::message::FEATURE_CELL_KEY_HASH)
    /// (the owner decides by the hash and need not hash the key again).
    /// `None`: the key is in `key`.
    pub hash: Option<u128>,
}

/// CELL's header flag: the payload carries the key's 16-byte hash
/// (XXH3-128, little-endian) where the key would be, and `key_len` is 16.
pub const CELL_KEY_HASH: u8 = 0x01;

/// THROTTLE and PEEK: spend (or ask about) `cost` units of `key`'s bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle<'a> {
    /// The routing key (client id); 1..=KEY_BYTES_MAX bytes.
    pub key: &'a [u8],
    /// The limit, inline.
    pub policy: Policy,
    /// Units to spend; at most `policy.burst`.
    pub cost: u64,
}

crate::codes::wire_codes! {
    /// What a DECIDE does with its limits. The numbers are the wire codes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Mode {
        /// Check every limit and, if all admit, apply all; if any denies,
        /// nothing is consumed. Admitted concurrency limits acquire a lease.
        Spend = 0,
        /// Answer exactly as `Spend` would; change and create nothing.
        Probe = 1,
        /// Give `cost` units back to every limit (never above its limit).
        Refund = 2,
        /// Clear the buckets (concurrency: drop every lease). Cost must be 0.
        Reset = 3,
    }
}

impl Mode {
    /// Whether the cost is a request to admit, and so must fit every limit
    /// (COST_EXCEEDS_BURST otherwise). A refund's cost is units to give
    /// back, any number; a reset has none.
    #[inline]
    pub const fn checks_cost(self) -> bool {
        matches!(self, Mode::Spend | Mode::Probe)
    }
}

/// Filler for the unused entries of a [`LimitSet`]: never read.
const UNUSED: Limit = Limit::Concurrency(Concurrency {
    limit: 0,
    lease_ns: 0,
});

/// 1..=[`LIMITS_MAX`] limits, stored inline so that parsing a DECIDE never
/// allocates and a request can be moved to its shard by value. Derefs to
/// `[Limit]`; position `i` is the limit's slot ([`Slot::Inline`]).
#[derive(Clone, Copy)]
pub struct LimitSet {
    /// The limits in `..len`; the rest is [`UNUSED`].
    limits: [Limit; LIMITS_MAX],
    /// Limit `i`'s reserved shares ([`Reserves::NONE`] for none).
    reserves: [Reserves; LIMITS_MAX],
    /// How many limits there are: 1..=LIMITS_MAX.
    len: u8,
}

impl LimitSet {
    /// The set of `limits`, in order; `None` unless there are
    /// 1..=[`LIMITS_MAX`]. The limits are not validated (see
    /// [`LimitSet::validate`]).
    pub fn new(limits: &[Limit]) -> Option<LimitSet> {
        let mut set = LimitSet::unset(limits.len())?;
        set.limits[..limits.len()].copy_from_slice(limits);
        Some(set)
    }

    /// The set of `limits` with their reserves, in order; `None` unless
    /// there are 1..=[`LIMITS_MAX`]. Not validated.
    pub fn with_reserves(limits: &[Reserved]) -> Option<LimitSet> {
        let mut set = LimitSet::unset(limits.len())?;
        for (i, r) in limits.iter().enumerate() {
            set.limits[i] = r.limit;
            set.reserves[i] = r.reserves;
        }
        Some(set)
    }

    /// `len` unused limits without reserves, for the caller to fill in.
    fn unset(len: usize) -> Option<LimitSet> {
        (1..=LIMITS_MAX).contains(&len).then_some(LimitSet {
            limits: [UNUSED; LIMITS_MAX],
            reserves: [Reserves::NONE; LIMITS_MAX],
            len: len as u8,
        })
    }

    /// Limit `i`'s reserved shares ([`Reserves::NONE`] past the end).
    #[inline]
    pub fn reserves(&self, i: usize) -> Reserves {
        if i < usize::from(self.len) {
            self.reserves[i]
        } else {
            Reserves::NONE
        }
    }

    /// Whether any limit has reserves (none: every class decides alike).
    #[inline]
    pub fn has_reserves(&self) -> bool {
        self.reserves[..usize::from(self.len)]
            .iter()
            .any(|r| !r.is_none())
    }

    /// Limit `i` and its reserves.
    pub fn reserved(&self, i: usize) -> Option<Reserved> {
        self.get(i).map(|&limit| Reserved {
            limit,
            reserves: self.reserves[i],
        })
    }

    /// The limits, in order.
    #[inline]
    pub fn as_slice(&self) -> &[Limit] {
        &self.limits[..usize::from(self.len)]
    }

    /// Checks every limit's numbers ([`Limit::validate`]): INVALID_POLICY
    /// naming the first bad limit.
    pub fn validate(&self) -> Result<(), RequestError> {
        for (i, limit) in self.iter().enumerate() {
            limit
                .validate()
                .and_then(|()| self.reserves[i].validate())
                .map_err(|e| RequestError::from(e).at(i))?;
        }
        Ok(())
    }

    /// Checks that a request of `cost` in `mode` could ever be admitted:
    /// for SPEND and PROBE, `cost <= limit()` of every limit
    /// (COST_EXCEEDS_BURST naming the first that is smaller). REFUND and
    /// RESET always pass. The server calls this for a tier's limits.
    pub fn check_cost(&self, mode: Mode, cost: u64) -> Result<(), RequestError> {
        if !mode.checks_cost() {
            return Ok(());
        }
        for (i, limit) in self.iter().enumerate() {
            limit
                .check_cost(cost)
                .map_err(|e| RequestError::from(e).at(i))?;
        }
        Ok(())
    }

    /// The concurrency limit at `index`, as RELEASE and RENEW of a tier
    /// need: BAD_REQUEST if there is no limit there or it is of another
    /// kind.
    pub fn concurrency_at(&self, index: u8) -> Result<Concurrency, RequestError> {
        match self.get(usize::from(index)) {
            Some(Limit::Concurrency(c)) => Ok(*c),
            Some(other) => Err(
                RequestError::from(LayoutError::NotConcurrency(other.kind()))
                    .at(usize::from(index)),
            ),
            None => Err(LayoutError::LimitIndex.into()),
        }
    }
}

impl Deref for LimitSet {
    type Target = [Limit];

    #[inline]
    fn deref(&self) -> &[Limit] {
        self.as_slice()
    }
}

impl PartialEq for LimitSet {
    fn eq(&self, other: &LimitSet) -> bool {
        let n = usize::from(self.len);
        self.as_slice() == other.as_slice() && self.reserves[..n] == other.reserves[..n]
    }
}

impl Eq for LimitSet {}

impl std::hash::Hash for LimitSet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
        self.reserves[..usize::from(self.len)].hash(state);
    }
}

impl std::fmt::Debug for LimitSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.has_reserves() {
            let all = (0..usize::from(self.len)).filter_map(|i| self.reserved(i));
            f.debug_list().entries(all).finish()
        } else {
            f.debug_list().entries(self.as_slice()).finish()
        }
    }
}

/// Where a DECIDE's limits come from.
// Inline limits are stored inline (see `Request`): no allocation in parse.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limits<'a> {
    /// Sent in the request, validated.
    Inline(LimitSet),
    /// A tier of the server's configuration, by name (1..=TIER_BYTES_MAX
    /// bytes of UTF-8); the server resolves it (UNKNOWN_TIER if absent).
    Tier(&'a str),
}

impl<'a> Limits<'a> {
    /// The bucket slot of the limit at `index` (see [`crate::identity`]).
    #[inline]
    pub fn slot(&self, index: u8) -> Slot<'a> {
        match self {
            Limits::Inline(_) => Slot::Inline(index),
            Limits::Tier(name) => Slot::Tier {
                name: name.as_bytes(),
                index,
            },
        }
    }
}

/// The header `flags` bits that carry a request's priority class.
pub const PRIORITY_BITS: u8 = 0b11;

/// DECIDE: one routing key, several limits, one atomic step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decide<'a> {
    /// What to do with the limits.
    pub mode: Mode,
    /// The routing key (client id); 1..=KEY_BYTES_MAX bytes.
    pub key: &'a [u8],
    /// The limits, inline or by tier.
    pub limits: Limits<'a>,
    /// SPEND/PROBE: units to admit (at most every limit's `limit()`);
    /// REFUND: units to give back (any number); RESET: 0.
    pub cost: u64,
    /// The request's class: which reserves it may spend (bits 0-1 of the
    /// header's `flags`; `Normal` when a client sends none).
    pub priority: Priority,
}

/// Which concurrency limit a RELEASE or RENEW is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseTarget<'a> {
    /// The limit sent again in the request; `index` is its position in the
    /// inline DECIDE that acquired the lease (it names the bucket).
    Inline {
        /// Position among the acquiring DECIDE's inline limits.
        index: u8,
        /// The limit's numbers (validated): `lease_ns` is what RENEW
        /// extends the lease by.
        limit: Concurrency,
    },
    /// Limit `index` of a tier; the server checks that it exists and is a
    /// concurrency limit ([`LimitSet::concurrency_at`]).
    Tier {
        /// The tier's name (1..=TIER_BYTES_MAX bytes of UTF-8).
        name: &'a str,
        /// The limit's position in the tier.
        index: u8,
    },
}

impl<'a> LeaseTarget<'a> {
    /// The bucket slot of the targeted limit (see [`crate::identity`]).
    #[inline]
    pub fn slot(&self) -> Slot<'a> {
        match *self {
            LeaseTarget::Inline { index, .. } => Slot::Inline(index),
            LeaseTarget::Tier { name, index } => Slot::Tier {
                name: name.as_bytes(),
                index,
            },
        }
    }
}

/// RELEASE and RENEW: give back, or extend, one concurrency lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseOp<'a> {
    /// The routing key the lease was acquired under.
    pub key: &'a [u8],
    /// The concurrency limit that holds the lease.
    pub target: LeaseTarget<'a>,
    /// The lease, as DECIDE_OK reported it; never 0.
    pub lease_id: u64,
}

/// STATS: per-shard counters, from shard `shard_first` on (0 for an empty
/// payload, the usual request).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// The first shard to report; a node with more shards than one reply
    /// holds is read in pages.
    pub shard_first: u16,
}

/// A request, as parsed from one message.
// Decide carries up to LIMITS_MAX limits inline (about 300 bytes) so that
// parsing never allocates and the server can move it to a shard by value;
// boxing it would allocate on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Hello(Hello<'a>),
    Ping,
    Throttle(Throttle<'a>),
    Peek(Throttle<'a>),
    Decide(Decide<'a>),
    Release(LeaseOp<'a>),
    Renew(LeaseOp<'a>),
    Reload,
    Stats(Stats),
    /// ROLE: the node's role, epoch and replication state.
    Role,
    /// PROMOTE: make this follower the primary (raises the epoch).
    Promote,
    /// FAILOVER: planned handover to the follower.
    Failover,
    /// CELL: a forwarded `CL.THROTTLE`.
    Cell(Cell<'a>),
    /// CLUSTER: the cluster as the node sees it, and (with a key, else
    /// empty) which group owns the key.
    Cluster {
        key: &'a [u8],
    },
    /// CHALLENGE: before HELLO, asks the node to prove it knows the token
    /// ([`crate::auth`]); the peer's nonce.
    Challenge {
        nonce: [u8; crate::auth::NONCE_BYTES],
    },
}

impl<'a> Request<'a> {
    /// Parses and validates one request message.
    #[inline]
    pub fn parse(header: MessageHeader, payload: &'a [u8]) -> Result<Request<'a>, RequestError> {
        if header.flags != 0 {
            return Request::parse_flagged(header, payload);
        }
        match header.op {
            op::THROTTLE => Ok(Request::Throttle(parse_throttle(payload)?)),
            op::PEEK => Ok(Request::Peek(parse_throttle(payload)?)),
            op::DECIDE => Ok(Request::Decide(parse_decide(payload, Priority::Normal)?)),
            op::PING if payload.is_empty() => Ok(Request::Ping),
            op::PING => Err(Status::BadRequest.into()),
            op::HELLO => parse_hello(payload),
            op::RELEASE => Ok(Request::Release(parse_lease_op(payload)?)),
            op::RENEW => Ok(Request::Renew(parse_lease_op(payload)?)),
            op::RELOAD if payload.is_empty() => Ok(Request::Reload),
            op::RELOAD => Err(LayoutError::Length.into()),
            op::STATS => Ok(Request::Stats(parse_stats(payload)?)),
            op::CELL => Ok(Request::Cell(parse_cell(payload)?)),
            op::CLUSTER => super::cluster::parse_cluster(payload)
                .map(|key| Request::Cluster { key })
                .ok_or_else(|| Status::BadRequest.into()),
            op::CHALLENGE => payload
                .try_into()
                .map(|nonce| Request::Challenge { nonce })
                .map_err(|_| LayoutError::Length.into()),
            crate::replication::op::ROLE if payload.is_empty() => Ok(Request::Role),
            crate::replication::op::PROMOTE if payload.is_empty() => Ok(Request::Promote),
            crate::replication::op::FAILOVER if payload.is_empty() => Ok(Request::Failover),
            crate::replication::op::ROLE
            | crate::replication::op::PROMOTE
            | crate::replication::op::FAILOVER => Err(LayoutError::Length.into()),
            _ => Err(Status::UnknownOp.into()),
        }
    }

    /// A request with `flags`: only THROTTLE, PEEK and DECIDE have any,
    /// a priority class in bits 0-1 (THROTTLE and PEEK carry no reserves,
    /// so their class changes nothing; it is accepted so a client can send
    /// every request with its class).
    #[cold]
    fn parse_flagged(
        header: MessageHeader,
        payload: &'a [u8],
    ) -> Result<Request<'a>, RequestError> {
        if header.op == op::CELL && header.flags == CELL_KEY_HASH {
            return Request::parse_cell_hashed(payload);
        }
        let priority = match (
            header.flags & !PRIORITY_BITS,
            Priority::from_code(header.flags),
        ) {
            (0, Some(p)) => p,
            _ => return Err(Status::BadRequest.into()),
        };
        match header.op {
            op::THROTTLE => Ok(Request::Throttle(parse_throttle(payload)?)),
            op::PEEK => Ok(Request::Peek(parse_throttle(payload)?)),
            op::DECIDE => Ok(Request::Decide(parse_decide(payload, priority)?)),
            _ => Err(Status::BadRequest.into()),
        }
    }

    /// A CELL that carries its key's hash ([`CELL_KEY_HASH`]): what
    /// [`Request::parse`] makes of a CELL with that flag, for a caller
    /// that checked the flag itself (an owner's hot path; `parse` reaches
    /// it through its cold branch for flagged requests).
    #[inline]
    pub fn parse_cell_hashed(payload: &'a [u8]) -> Result<Request<'a>, RequestError> {
        if payload.len() != CELL_FIXED_BYTES + 16 || u16_at(payload, 24) != 16 {
            return Err(Status::BadRequest.into());
        }
        let policy = CellPolicy::from_parts(u64_at(payload, 0) as i64, u64_at(payload, 8))
            .map_err(|_| RequestError::from(Status::InvalidPolicy))?;
        Ok(Request::Cell(Cell {
            key: &[],
            policy,
            quantity: u64_at(payload, 16),
            hash: Some(cell_hash_at(payload)),
        }))
    }

    /// Appends this request as one message.
    pub fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
        match self {
            Request::Hello(h) => w.message(buf, op::HELLO, request_id, |b| {
                b.put_u16_le(h.version_min);
                b.put_u16_le(h.version_max);
                b.put_u16_le(h.shard.unwrap_or(SHARD_ANY));
                b.put_u16_le(h.token.len() as u16);
                b.put_slice(h.token);
                if h.epoch != 0 || h.layout != 0 {
                    b.put_u64_le(h.epoch);
                }
                if h.layout != 0 {
                    b.put_u64_le(h.layout);
                }
            }),
            Request::Cell(c) => put_cell(w, buf, request_id, c),
            Request::Cluster { key } => w.message(buf, op::CLUSTER, request_id, |b| {
                super::cluster::put_cluster(b, key)
            }),
            Request::Challenge { nonce } => {
                w.message(buf, op::CHALLENGE, request_id, |b| b.put_slice(nonce))
            }
            Request::Ping => w.message(buf, op::PING, request_id, |_| {}),
            Request::Throttle(t) => {
                w.message(buf, op::THROTTLE, request_id, |b| put_throttle(b, t))
            }
            Request::Peek(t) => w.message(buf, op::PEEK, request_id, |b| put_throttle(b, t)),
            Request::Decide(d) => {
                w.message_flagged(buf, op::DECIDE, d.priority.code(), request_id, |b| {
                    put_decide(b, d)
                })
            }
            Request::Release(l) => w.message(buf, op::RELEASE, request_id, |b| put_lease_op(b, l)),
            Request::Renew(l) => w.message(buf, op::RENEW, request_id, |b| put_lease_op(b, l)),
            Request::Reload => w.message(buf, op::RELOAD, request_id, |_| {}),
            Request::Role => w.message(buf, crate::replication::op::ROLE, request_id, |_| {}),
            Request::Promote => w.message(buf, crate::replication::op::PROMOTE, request_id, |_| {}),
            Request::Failover => {
                w.message(buf, crate::replication::op::FAILOVER, request_id, |_| {})
            }
            // The usual request, from shard 0, is the empty payload.
            Request::Stats(s) => w.message(buf, op::STATS, request_id, |b| {
                if s.shard_first != 0 {
                    b.put_u16_le(s.shard_first);
                    b.put_u16_le(0);
                }
            }),
        }
    }
}

fn parse_hello(payload: &[u8]) -> Result<Request<'_>, RequestError> {
    if payload.len() < HELLO_FIXED_BYTES {
        return Err(Status::BadRequest.into());
    }
    let token_len = usize::from(u16_at(payload, 6));
    let token_end = HELLO_FIXED_BYTES + token_len;
    // The epoch is optional: a client that knows none sends the original
    // layout.
    // So is the layout hash, after the epoch (a forwarding node's).
    let (epoch, layout) = match payload.len().checked_sub(token_end) {
        Some(0) => (0, 0),
        Some(8) => (u64_at(payload, token_end), 0),
        Some(16) => (u64_at(payload, token_end), u64_at(payload, token_end + 8)),
        _ => return Err(Status::BadRequest.into()),
    };
    if token_len > TOKEN_BYTES_MAX {
        return Err(Status::BadRequest.into());
    }
    let shard = u16_at(payload, 4);
    Ok(Request::Hello(Hello {
        version_min: u16_at(payload, 0),
        version_max: u16_at(payload, 2),
        shard: (shard != SHARD_ANY).then_some(shard),
        token: &payload[HELLO_FIXED_BYTES..token_end],
        epoch,
        layout,
    }))
}

/// CELL: `limit` (i64), `emission_ns` (u64), `quantity` (u64), key.
fn parse_cell(payload: &[u8]) -> Result<Cell<'_>, RequestError> {
    if payload.len() < CELL_FIXED_BYTES {
        return Err(Status::BadRequest.into());
    }
    let key_len = usize::from(u16_at(payload, 24));
    if payload.len() != CELL_FIXED_BYTES + key_len {
        return Err(Status::BadRequest.into());
    }
    if key_len == 0 || key_len > KEY_BYTES_MAX {
        return Err(Status::BadKey.into());
    }
    let policy = CellPolicy::from_parts(u64_at(payload, 0) as i64, u64_at(payload, 8))
        .map_err(|_| RequestError::from(Status::InvalidPolicy))?;
    Ok(Cell {
        key: &payload[CELL_FIXED_BYTES..],
        policy,
        quantity: u64_at(payload, 16),
        hash: None,
    })
}

/// The key hash of a CELL payload that carries one ([`CELL_KEY_HASH`]);
/// the caller checked its length.
#[inline]
pub fn cell_hash_at(payload: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&payload[CELL_FIXED_BYTES..CELL_FIXED_BYTES + 16]);
    u128::from_le_bytes(b)
}

/// Appends a CELL: header and fixed part assembled on the stack, then the
/// key, each copied once into the buffer, with one check of its room (an
/// entry node writes one per forwarded CL.THROTTLE; a check per field was
/// 22 of its 2,366 instructions a call, benches/notes.md). What
/// [`Request::encode`] writes for a [`Request::Cell`]; public so that a
/// caller with a CELL in hand skips that function's dispatch.
pub fn put_cell(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, c: &Cell<'_>) {
    if let Some(hash) = c.hash {
        return put_cell_hashed(w, buf, request_id, hash, &c.policy, c.quantity);
    }
    let len = CELL_FIXED_BYTES + c.key.len();
    let len = u16::try_from(len).expect("payload fits a u16 length");
    let mut m = [0u8; HEADER_BYTES + CELL_FIXED_BYTES];
    m[..HEADER_BYTES].copy_from_slice(&message_header(op::CELL, request_id, len));
    let p = &mut m[HEADER_BYTES..];
    p[..8].copy_from_slice(&c.policy.limit.to_le_bytes());
    p[8..16].copy_from_slice(&c.policy.emission_ns.to_le_bytes());
    p[16..24].copy_from_slice(&c.quantity.to_le_bytes());
    p[24..26].copy_from_slice(&(c.key.len() as u16).to_le_bytes());
    w.message_parts(buf, &m, c.key);
}

/// Appends a CELL that carries its key's hash in place of the key
/// ([`CELL_KEY_HASH`]): fixed size, assembled on the stack and copied
/// once. What [`put_cell`] writes for a [`Cell`] with a `hash`.
pub fn put_cell_hashed(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    hash: u128,
    policy: &CellPolicy,
    quantity: u64,
) {
    const LEN: usize = CELL_FIXED_BYTES + 16;
    let mut m = [0u8; HEADER_BYTES + LEN];
    m[..HEADER_BYTES].copy_from_slice(&message_header(op::CELL, request_id, LEN as u16));
    m[1] = CELL_KEY_HASH;
    let p = &mut m[HEADER_BYTES..];
    p[..8].copy_from_slice(&policy.limit.to_le_bytes());
    p[8..16].copy_from_slice(&policy.emission_ns.to_le_bytes());
    p[16..24].copy_from_slice(&quantity.to_le_bytes());
    p[24..26].copy_from_slice(&16u16.to_le_bytes());
    p[26..].copy_from_slice(&hash.to_le_bytes());
    w.message_whole(buf, &m);
}

#[inline]
fn parse_throttle(payload: &[u8]) -> Result<Throttle<'_>, RequestError> {
    if payload.len() < THROTTLE_FIXED_BYTES {
        return Err(Status::BadRequest.into());
    }
    let key_len = usize::from(u16_at(payload, 32));
    if payload.len() != THROTTLE_FIXED_BYTES + key_len {
        return Err(Status::BadRequest.into());
    }
    if key_len == 0 || key_len > KEY_BYTES_MAX {
        return Err(Status::BadKey.into());
    }
    let policy = Policy {
        count: u64_at(payload, 0),
        period_ns: u64_at(payload, 8),
        burst: u64_at(payload, 16),
    };
    policy.validate()?;
    let cost = u64_at(payload, 24);
    policy.check_cost(cost)?;
    Ok(Throttle {
        key: &payload[THROTTLE_FIXED_BYTES..],
        policy,
        cost,
    })
}

fn put_throttle(b: &mut BytesMut, t: &Throttle<'_>) {
    b.put_u64_le(t.policy.count);
    b.put_u64_le(t.policy.period_ns);
    b.put_u64_le(t.policy.burst);
    b.put_u64_le(t.cost);
    b.put_u16_le(t.key.len() as u16);
    b.put_slice(t.key);
}

/// BAD_KEY unless `key` is 1..=KEY_BYTES_MAX bytes.
#[inline]
fn check_key(key: &[u8]) -> Result<(), RequestError> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(Status::BadKey.into());
    }
    Ok(())
}

/// A tier name: 1..=TIER_BYTES_MAX bytes of UTF-8.
fn parse_tier(name: &[u8]) -> Result<&str, LayoutError> {
    if name.is_empty() || name.len() > TIER_BYTES_MAX {
        return Err(LayoutError::TierName);
    }
    std::str::from_utf8(name).map_err(|_| LayoutError::TierName)
}

/// Bytes 1, 6 and 7 of a limit record's first 8 (little-endian): reserved.
const RECORD_RESERVED_BYTES: u64 = 0xffff_0000_0000_ff00;

/// One limit record's layout: a known kind, zero reserved bytes, `c = 0`
/// for the kinds that have no third number; with its reserves (bytes 2..6,
/// `u16 critical_bp, u16 normal_bp`). The numbers are not validated.
fn parse_limit_record(r: &[u8]) -> Result<(Limit, Reserves), LayoutError> {
    debug_assert_eq!(r.len(), LIMIT_RECORD_BYTES);
    // The record's first 8 bytes at once: kind, a reserved byte, the two
    // reserves, two reserved bytes.
    let head = u64_at(r, 0);
    let kind = Kind::from_code(head as u8).ok_or(LayoutError::Kind(r[0]))?;
    if head & RECORD_RESERVED_BYTES != 0 {
        return Err(LayoutError::Reserved);
    }
    let reserves = Reserves {
        critical_bp: (head >> 16) as u16,
        normal_bp: (head >> 32) as u16,
    };
    let (a, b, c) = (u64_at(r, 8), u64_at(r, 16), u64_at(r, 24));
    if kind != Kind::TokenBucket && c != 0 {
        return Err(LayoutError::UnusedField(kind));
    }
    let window = Window {
        limit: a,
        window_ns: b,
    };
    let limit = match kind {
        Kind::TokenBucket => Limit::TokenBucket(Policy {
            count: a,
            period_ns: b,
            burst: c,
        }),
        Kind::FixedWindow => Limit::FixedWindow(window),
        Kind::SlidingLog => Limit::SlidingLog(window),
        Kind::SlidingCounter => Limit::SlidingCounter(window),
        Kind::Concurrency => Limit::Concurrency(Concurrency {
            limit: a,
            lease_ns: b,
        }),
    };
    Ok((limit, reserves))
}

fn put_limit_record(b: &mut BytesMut, limit: &Limit, reserves: Reserves) {
    let (a, bb, c) = match *limit {
        Limit::TokenBucket(p) => (p.count, p.period_ns, p.burst),
        Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingCounter(w) => {
            (w.limit, w.window_ns, 0)
        }
        Limit::Concurrency(c) => (c.limit, c.lease_ns, 0),
    };
    b.put_u8(limit.kind().code());
    b.put_u8(0);
    b.put_u16_le(reserves.critical_bp);
    b.put_u16_le(reserves.normal_bp);
    b.put_bytes(0, 2);
    b.put_u64_le(a);
    b.put_u64_le(bb);
    b.put_u64_le(c);
}

/// The inline limits of a DECIDE (1..=LIMITS_MAX records, checked by the
/// caller), layout only.
#[inline]
fn parse_limit_records(records: &[u8]) -> Result<LimitSet, RequestError> {
    let count = records.len() / LIMIT_RECORD_BYTES;
    let mut set = LimitSet::unset(count).ok_or(LayoutError::LimitCount)?;
    for (i, r) in records.chunks_exact(LIMIT_RECORD_BYTES).enumerate() {
        let (limit, reserves) = parse_limit_record(r).map_err(|e| RequestError::from(e).at(i))?;
        set.limits[i] = limit;
        set.reserves[i] = reserves;
    }
    Ok(set)
}

/// DECIDE: `u8 mode, u8 limit_count, u16 key_len, u16 tier_len, u16 0,
/// u64 cost`, key, tier name, limit records.
fn parse_decide(p: &[u8], priority: Priority) -> Result<Decide<'_>, RequestError> {
    if p.len() < DECIDE_FIXED_BYTES {
        return Err(LayoutError::Length.into());
    }
    let limit_count = usize::from(p[1]);
    let key_len = usize::from(u16_at(p, 2));
    let tier_len = usize::from(u16_at(p, 4));
    let tier_at = DECIDE_FIXED_BYTES + key_len;
    let records_at = tier_at + tier_len;
    if p.len() != records_at + limit_count * LIMIT_RECORD_BYTES {
        return Err(LayoutError::Length.into());
    }
    if u16_at(p, 6) != 0 {
        return Err(LayoutError::Reserved.into());
    }
    let mode = Mode::from_code(p[0]).ok_or(LayoutError::Mode(p[0]))?;
    let cost = u64_at(p, 8);
    if mode == Mode::Reset && cost != 0 {
        return Err(LayoutError::ResetCost.into());
    }
    let limits = match (tier_len, limit_count) {
        (0, 0) => return Err(LayoutError::NoLimits.into()),
        (0, n) if n > LIMITS_MAX => return Err(LayoutError::LimitCount.into()),
        (0, _) => Limits::Inline(parse_limit_records(&p[records_at..])?),
        (_, 0) => Limits::Tier(parse_tier(&p[tier_at..records_at])?),
        (_, _) => return Err(LayoutError::TierAndLimits.into()),
    };
    let key = &p[DECIDE_FIXED_BYTES..tier_at];
    check_key(key)?;
    if let Limits::Inline(set) = &limits {
        set.validate()?;
        set.check_cost(mode, cost)?;
    }
    Ok(Decide {
        mode,
        key,
        limits,
        cost,
        priority,
    })
}

fn put_decide(b: &mut BytesMut, d: &Decide<'_>) {
    let (tier, limits, set): (&[u8], &[Limit], Option<&LimitSet>) = match &d.limits {
        Limits::Inline(set) => (b"", set.as_slice(), Some(set)),
        Limits::Tier(name) => (name.as_bytes(), &[], None),
    };
    b.put_u8(d.mode.code());
    b.put_u8(limits.len() as u8);
    b.put_u16_le(d.key.len() as u16);
    b.put_u16_le(tier.len() as u16);
    b.put_u16_le(0);
    b.put_u64_le(d.cost);
    b.put_slice(d.key);
    b.put_slice(tier);
    for (i, limit) in limits.iter().enumerate() {
        let reserves = set.map_or(Reserves::NONE, |s| s.reserves(i));
        put_limit_record(b, limit, reserves);
    }
}

/// RELEASE/RENEW: `u16 key_len, u16 tier_len, u8 limit_index, u8[3] 0,
/// u64 lease_id`, key, tier name, and without a tier one concurrency
/// limit record.
fn parse_lease_op(p: &[u8]) -> Result<LeaseOp<'_>, RequestError> {
    if p.len() < LEASE_FIXED_BYTES {
        return Err(LayoutError::Length.into());
    }
    let key_len = usize::from(u16_at(p, 0));
    let tier_len = usize::from(u16_at(p, 2));
    let index = p[4];
    let tier_at = LEASE_FIXED_BYTES + key_len;
    let record_at = tier_at + tier_len;
    let record_bytes = if tier_len == 0 { LIMIT_RECORD_BYTES } else { 0 };
    if p.len() != record_at + record_bytes {
        return Err(LayoutError::Length.into());
    }
    if p[5..8].iter().any(|&b| b != 0) {
        return Err(LayoutError::Reserved.into());
    }
    let lease_id = u64_at(p, 8);
    if lease_id == 0 {
        return Err(LayoutError::LeaseIdZero.into());
    }
    if usize::from(index) >= LIMITS_MAX {
        return Err(LayoutError::LimitIndex.into());
    }
    let target = if tier_len == 0 {
        let at = |e: LayoutError| RequestError::from(e).at(usize::from(index));
        // A lease names its limit; reserves weigh on acquiring only.
        let limit = match parse_limit_record(&p[record_at..]).map_err(at)?.0 {
            Limit::Concurrency(c) => c,
            other => return Err(at(LayoutError::NotConcurrency(other.kind()))),
        };
        LeaseTarget::Inline { index, limit }
    } else {
        let name = parse_tier(&p[tier_at..record_at])?;
        LeaseTarget::Tier { name, index }
    };
    let key = &p[LEASE_FIXED_BYTES..tier_at];
    check_key(key)?;
    if let LeaseTarget::Inline { index, limit } = &target {
        limit
            .validate()
            .map_err(|e| RequestError::from(e).at(usize::from(*index)))?;
    }
    Ok(LeaseOp {
        key,
        target,
        lease_id,
    })
}

fn put_lease_op(b: &mut BytesMut, l: &LeaseOp<'_>) {
    let (tier, index, limit): (&[u8], u8, Option<Concurrency>) = match l.target {
        LeaseTarget::Inline { index, limit } => (b"", index, Some(limit)),
        LeaseTarget::Tier { name, index } => (name.as_bytes(), index, None),
    };
    b.put_u16_le(l.key.len() as u16);
    b.put_u16_le(tier.len() as u16);
    b.put_u8(index);
    b.put_bytes(0, 3);
    b.put_u64_le(l.lease_id);
    b.put_slice(l.key);
    b.put_slice(tier);
    if let Some(c) = limit {
        put_limit_record(b, &Limit::Concurrency(c), Reserves::NONE);
    }
}

/// STATS: empty (from shard 0), or `u16 shard_first, u16 0`.
fn parse_stats(p: &[u8]) -> Result<Stats, RequestError> {
    match p.len() {
        0 => Ok(Stats::default()),
        STATS_PAGED_BYTES if u16_at(p, 2) != 0 => Err(LayoutError::Reserved.into()),
        STATS_PAGED_BYTES => Ok(Stats {
            shard_first: u16_at(p, 0),
        }),
        _ => Err(LayoutError::Length.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::error::Detail;
    use crate::message::test_util::{one_message, S};
    use crate::policy::PolicyError;

    /// Encodes `r` as one message and parses it back to the same request.
    fn assert_round_trips(r: Request<'_>) {
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        r.encode(&mut w, &mut buf, 99);
        w.finish(&mut buf);
        let (h, p) = one_message(&mut buf);
        assert_eq!(h.request_id, 99);
        assert_eq!(Request::parse(h, &p).unwrap(), r);
    }

    #[test]
    fn priority_travels_in_the_flags_and_reserves_in_the_records() {
        let reserved: Vec<Reserved> = [
            "token-bucket:1000/s,burst=2000,reserve=critical:20%,reserve=normal:50%",
            "concurrency:10,reserve=normal:12.5%",
            "fixed-window:5/m",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let set = LimitSet::with_reserves(&reserved).unwrap();
        assert!(set.has_reserves());
        assert_eq!(set.reserves(1).normal_bp, 1250);
        assert_eq!(set.reserved(0), Some(reserved[0]));
        for priority in Priority::ALL {
            let d = Decide {
                mode: Mode::Spend,
                key: b"user:42",
                limits: Limits::Inline(set),
                cost: 1,
                priority,
            };
            assert_round_trips(Request::Decide(d));
            // The class is bits 0-1 of the flags; the reserves bytes 2..6.
            let mut buf = BytesMut::new();
            let mut w = FrameWriter::new();
            Request::Decide(d).encode(&mut w, &mut buf, 5);
            w.finish(&mut buf);
            let (h, p) = one_message(&mut buf);
            assert_eq!(h.flags, priority.code());
            let record = &p[DECIDE_FIXED_BYTES + 7..][..LIMIT_RECORD_BYTES];
            assert_eq!(&record[..8], &[1, 0, 0xd0, 0x07, 0x88, 0x13, 0, 0]);
        }
        // Without reserves, the record is exactly the old one.
        let plain = LimitSet::new(&[reserved[2].limit]).unwrap();
        assert!(!plain.has_reserves());
        assert_eq!(plain, LimitSet::with_reserves(&[reserved[2]]).unwrap());
        assert_ne!(
            plain,
            LimitSet::with_reserves(&[Reserved {
                reserves: Reserves {
                    critical_bp: 1,
                    normal_bp: 0
                },
                ..reserved[2]
            }])
            .unwrap()
        );
    }

    #[test]
    fn flags_and_reserves_out_of_range_are_refused() {
        let set = LimitSet::new(&["fixed-window:5/m".parse().unwrap()]).unwrap();
        let d = Decide {
            mode: Mode::Spend,
            key: b"k",
            limits: Limits::Inline(set),
            cost: 1,
            priority: Priority::Normal,
        };
        let mut payload = BytesMut::new();
        put_decide(&mut payload, &d);
        let h = |op, flags| MessageHeader {
            op,
            flags,
            request_id: 1,
        };
        let status = |hd, p: &[u8]| Request::parse(hd, p).map(|_| ()).map_err(|e| e.status);
        assert_eq!(status(h(op::DECIDE, 2), &payload), Ok(()));
        // Class code 3, and any bit above the class: BAD_REQUEST.
        assert_eq!(status(h(op::DECIDE, 3), &payload), Err(Status::BadRequest));
        assert_eq!(status(h(op::DECIDE, 4), &payload), Err(Status::BadRequest));
        assert_eq!(
            status(h(op::DECIDE, 0x81), &payload),
            Err(Status::BadRequest)
        );
        // THROTTLE and PEEK accept a class (they carry no reserves); other
        // ops take no flags.
        let policy = Policy::new(10, 1_000_000_000, 20).unwrap();
        let mut t = BytesMut::new();
        put_throttle(
            &mut t,
            &Throttle {
                key: b"k",
                policy,
                cost: 1,
            },
        );
        assert_eq!(status(h(op::THROTTLE, 1), &t), Ok(()));
        assert_eq!(status(h(op::PEEK, 2), &t), Ok(()));
        assert_eq!(status(h(op::RELOAD, 1), &[]), Err(Status::BadRequest));
        // A reserve above 100 %: INVALID_POLICY, naming the limit.
        let at = DECIDE_FIXED_BYTES + 1;
        let mut bad = payload.to_vec();
        bad[at + 2..at + 4].copy_from_slice(&10_001u16.to_le_bytes());
        let e = Request::parse(h(op::DECIDE, 0), &bad).unwrap_err();
        assert_eq!((e.status, e.limit_index), (Status::InvalidPolicy, Some(0)));
        let mut whole = payload.to_vec();
        whole[at + 4..at + 6].copy_from_slice(&10_000u16.to_le_bytes());
        assert!(Request::parse(h(op::DECIDE, 0), &whole).is_ok());
        // The bytes around them stay reserved.
        for byte in [1, 6, 7] {
            let mut bad = payload.to_vec();
            bad[at + byte] = 1;
            assert_eq!(
                status(h(op::DECIDE, 0), &bad),
                Err(Status::BadRequest),
                "byte {byte}"
            );
        }
    }

    #[test]
    fn a_cell_is_the_same_bytes_whatever_its_key_length() {
        for len in [0, 1, 64, 65, 300, KEY_BYTES_MAX] {
            let key = vec![b'k'; len];
            let c = Cell {
                key: &key,
                policy: CellPolicy::new(14, 30, 60).unwrap(),
                quantity: 2,
                hash: None,
            };
            // Field by field, as the wire format reads.
            let mut want = BytesMut::new();
            want.put_u32_le((8 + CELL_FIXED_BYTES + len) as u32);
            want.put_u8(op::CELL);
            want.put_u8(0);
            want.put_u16_le((CELL_FIXED_BYTES + len) as u16);
            want.put_u32_le(9);
            want.put_i64_le(c.policy.limit);
            want.put_u64_le(c.policy.emission_ns);
            want.put_u64_le(2);
            want.put_u16_le(len as u16);
            want.put_slice(&key);
            let mut w = FrameWriter::new();
            let mut got = BytesMut::new();
            Request::Cell(c).encode(&mut w, &mut got, 9);
            w.finish(&mut got);
            assert_eq!(got, want, "key of {len} bytes");
            if len > 0 {
                // (An empty key is encodable, and refused when read.)
                assert_round_trips(Request::Cell(c));
            }
        }
    }

    #[test]
    fn a_cell_with_its_keys_hash_is_fixed_size_and_round_trips() {
        let hash = crate::routing::key_hash(b"user:42");
        let c = Cell {
            key: &[],
            policy: CellPolicy::new(14, 30, 60).unwrap(),
            quantity: 2,
            hash: Some(hash),
        };
        let mut want = BytesMut::new();
        want.put_u32_le((8 + CELL_FIXED_BYTES + 16) as u32);
        want.put_u8(op::CELL);
        want.put_u8(CELL_KEY_HASH);
        want.put_u16_le((CELL_FIXED_BYTES + 16) as u16);
        want.put_u32_le(9);
        want.put_i64_le(c.policy.limit);
        want.put_u64_le(c.policy.emission_ns);
        want.put_u64_le(2);
        want.put_u16_le(16);
        want.put_slice(&hash.to_le_bytes());
        let mut w = FrameWriter::new();
        let mut got = BytesMut::new();
        Request::Cell(c).encode(&mut w, &mut got, 9);
        w.finish(&mut got);
        assert_eq!(got, want);
        assert_round_trips(Request::Cell(c));
        // Its layout checked: 16 bytes of hash, `key_len` 16, no other
        // flag (a priority class is no CELL's).
        let payload = &want[12..];
        let hdr = |flags| MessageHeader {
            op: op::CELL,
            flags,
            request_id: 9,
        };
        for bad in [&payload[..payload.len() - 1], &[payload, b"x"].concat()[..]] {
            let e = Request::parse(hdr(CELL_KEY_HASH), bad).unwrap_err();
            assert_eq!(e.status, Status::BadRequest);
        }
        let mut len15 = payload.to_vec();
        len15[24] = 15;
        let e = Request::parse(hdr(CELL_KEY_HASH), &len15).unwrap_err();
        assert_eq!(e.status, Status::BadRequest);
        for flags in [0x02, CELL_KEY_HASH | 0x02] {
            let e = Request::parse(hdr(flags), payload).unwrap_err();
            assert_eq!(e.status, Status::BadRequest, "flags {flags:#x}");
        }
        // Without the flag the same bytes are a CELL of a 16-byte key.
        match Request::parse(hdr(0), payload).unwrap() {
            Request::Cell(k) => assert_eq!((k.key, k.hash), (&hash.to_le_bytes()[..], None)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_round_trip() {
        let policy = Policy::new(10, 1_000_000_000, 20).unwrap();
        let reqs = [
            Request::Ping,
            Request::Hello(Hello {
                version_min: 1,
                version_max: 3,
                shard: Some(2),
                token: b"secret",
                epoch: 7,
                layout: 0,
            }),
            Request::Hello(Hello {
                version_min: 1,
                version_max: 1,
                shard: None,
                token: b"",
                epoch: 0,
                layout: 0,
            }),
            Request::Hello(Hello {
                version_min: 1,
                version_max: 1,
                shard: None,
                token: b"t",
                epoch: 0,
                layout: 0x0123_4567_89ab_cdef,
            }),
            Request::Cell(Cell {
                key: b"user:42",
                policy: CellPolicy::new(14, 30, 60).unwrap(),
                quantity: 2,
                hash: None,
            }),
            Request::Cluster { key: b"user:42" },
            Request::Cluster { key: b"" },
            Request::Challenge { nonce: [7; 16] },
            Request::Throttle(Throttle {
                key: b"user:42",
                policy,
                cost: 3,
            }),
            Request::Peek(Throttle {
                key: b"k",
                policy,
                cost: 0,
            }),
        ];
        for r in reqs {
            assert_round_trips(r);
        }
    }

    #[test]
    fn bad_requests_get_their_status() {
        let policy = Policy::new(10, 1_000_000_000, 20).unwrap();
        let h = |op| MessageHeader {
            op,
            flags: 0,
            request_id: 1,
        };
        let status = |hd, p: &[u8]| Request::parse(hd, p).unwrap_err().status;
        assert_eq!(status(h(0x42), &[]), Status::UnknownOp);
        assert_eq!(status(h(op::PING), &[1]), Status::BadRequest);
        assert_eq!(
            status(
                MessageHeader {
                    op: op::PING,
                    flags: 1,
                    request_id: 1
                },
                &[]
            ),
            Status::BadRequest
        );
        assert_eq!(status(h(op::THROTTLE), &[0; 10]), Status::BadRequest);
        let encode = |key: &[u8], p: Policy, cost| {
            let mut b = BytesMut::new();
            put_throttle(
                &mut b,
                &Throttle {
                    key,
                    policy: p,
                    cost,
                },
            );
            b.to_vec()
        };
        assert_eq!(
            status(h(op::THROTTLE), &encode(b"", policy, 1)),
            Status::BadKey
        );
        assert_eq!(
            status(
                h(op::THROTTLE),
                &encode(&[b'x'; KEY_BYTES_MAX + 1], policy, 1)
            ),
            Status::BadKey
        );
        assert!(
            Request::parse(h(op::THROTTLE), &encode(&[b'x'; KEY_BYTES_MAX], policy, 1)).is_ok()
        );
        assert_eq!(
            status(h(op::THROTTLE), &encode(b"k", policy, 21)),
            Status::CostExceedsBurst
        );
        let zero = Policy { count: 0, ..policy };
        assert_eq!(
            status(h(op::THROTTLE), &encode(b"k", zero, 1)),
            Status::InvalidPolicy
        );
        let mut long = encode(b"k", policy, 1);
        long.push(0);
        assert_eq!(status(h(op::THROTTLE), &long), Status::BadRequest);
    }

    fn composite() -> LimitSet {
        LimitSet::new(&[
            "token-bucket:5/s,burst=5".parse().unwrap(),
            "fixed-window:100/1m".parse().unwrap(),
            "sliding-log:10/s".parse().unwrap(),
            "sliding-counter:1000/1h".parse().unwrap(),
            "concurrency:10,lease=30s".parse().unwrap(),
        ])
        .unwrap()
    }

    fn decide(mode: Mode, limits: Limits<'static>, cost: u64) -> Decide<'static> {
        Decide {
            mode,
            key: b"user:42",
            limits,
            cost,
            priority: Priority::Normal,
        }
    }

    fn lease_inline(index: u8) -> LeaseOp<'static> {
        LeaseOp {
            key: b"user:42",
            target: LeaseTarget::Inline {
                index,
                limit: Concurrency::new(10, 30 * S).unwrap(),
            },
            lease_id: 7,
        }
    }

    fn header(op: u8) -> MessageHeader {
        MessageHeader {
            op,
            flags: 0,
            request_id: 1,
        }
    }

    /// The payload `encode` writes for `r`.
    fn payload(r: &Request<'_>) -> Vec<u8> {
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        r.encode(&mut w, &mut buf, 1);
        w.finish(&mut buf);
        one_message(&mut buf).1
    }

    fn parse_err(op: u8, p: &[u8]) -> RequestError {
        Request::parse(header(op), p).unwrap_err()
    }

    fn status(op: u8, p: &[u8]) -> Status {
        parse_err(op, p).status
    }

    fn layout(op: u8, p: &[u8]) -> LayoutError {
        match parse_err(op, p) {
            RequestError {
                status: Status::BadRequest,
                detail: Some(Detail::Layout(e)),
                ..
            } => e,
            other => panic!("expected a layout error, got {other:?}"),
        }
    }

    #[test]
    fn new_requests_round_trip() {
        let set = composite();
        let one = LimitSet::new(&["concurrency:1,lease=1ms".parse().unwrap()]).unwrap();
        let mut reqs = vec![
            Request::Decide(decide(Mode::Probe, Limits::Inline(one), 1)),
            Request::Decide(decide(Mode::Spend, Limits::Tier("free"), u64::MAX)),
            Request::Decide(decide(Mode::Reset, Limits::Tier("é"), 0)),
            Request::Release(lease_inline(4)),
            Request::Renew(lease_inline(0)),
            Request::Renew(LeaseOp {
                key: &[b'k'; KEY_BYTES_MAX],
                target: LeaseTarget::Tier {
                    name: "paid",
                    index: 7,
                },
                lease_id: u64::MAX,
            }),
            Request::Reload,
            Request::Stats(Stats { shard_first: 0 }),
            Request::Stats(Stats { shard_first: 9 }),
        ];
        for mode in [Mode::Spend, Mode::Probe, Mode::Refund] {
            reqs.push(Request::Decide(decide(mode, Limits::Inline(set), 1)));
        }
        let full = LimitSet::new(&[set[0]; LIMITS_MAX]).unwrap();
        reqs.push(Request::Decide(decide(
            Mode::Refund,
            Limits::Inline(full),
            99,
        )));
        for r in reqs {
            assert_round_trips(r);
        }
    }

    #[test]
    fn decide_payload_sizes_are_the_spec() {
        let d = decide(Mode::Spend, Limits::Inline(composite()), 1);
        assert_eq!(payload(&Request::Decide(d)).len(), 16 + 7 + 5 * 32);
        let t = decide(Mode::Spend, Limits::Tier("free"), 1);
        assert_eq!(payload(&Request::Decide(t)).len(), 16 + 7 + 4);
        assert_eq!(
            payload(&Request::Release(lease_inline(2))).len(),
            16 + 7 + 32
        );
        assert_eq!(payload(&Request::Reload).len(), 0);
        assert_eq!(
            payload(&Request::Stats(Stats { shard_first: 3 })),
            [3, 0, 0, 0]
        );
    }

    #[test]
    fn malformed_decides_are_bad_requests() {
        let op = op::DECIDE;
        let good = payload(&Request::Decide(decide(
            Mode::Spend,
            Limits::Inline(composite()),
            1,
        )));
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut p = good.clone();
            f(&mut p);
            p
        };
        // Records start after the 16 fixed bytes and the 7-byte key.
        let rec = |i: usize| 23 + 32 * i;
        assert_eq!(layout(op, &good[..15]), LayoutError::Length);
        assert_eq!(layout(op, &with(&|p| p.push(0))), LayoutError::Length);
        assert_eq!(layout(op, &good[..good.len() - 1]), LayoutError::Length);
        assert_eq!(layout(op, &with(&|p| p[1] = 4)), LayoutError::Length);
        assert_eq!(layout(op, &with(&|p| p[7] = 1)), LayoutError::Reserved);
        assert_eq!(layout(op, &with(&|p| p[0] = 4)), LayoutError::Mode(4));
        let reset = with(&|p| p[0] = Mode::Reset.code());
        assert_eq!(layout(op, &reset), LayoutError::ResetCost);
        // A record's reserved bytes, kind, and unused third number.
        assert_eq!(
            layout(op, &with(&|p| p[rec(2) + 7] = 1)),
            LayoutError::Reserved
        );
        assert_eq!(layout(op, &with(&|p| p[rec(1)] = 0)), LayoutError::Kind(0));
        assert_eq!(layout(op, &with(&|p| p[rec(4)] = 6)), LayoutError::Kind(6));
        assert_eq!(
            parse_err(op, &with(&|p| p[rec(4)] = 6)).limit_index,
            Some(4)
        );
        assert_eq!(
            layout(op, &with(&|p| p[rec(1) + 24] = 1)),
            LayoutError::UnusedField(Kind::FixedWindow)
        );
        assert_eq!(
            layout(op, &with(&|p| p[rec(4) + 31] = 1)),
            LayoutError::UnusedField(Kind::Concurrency)
        );
        // Neither a tier nor limits; both; too many limits.
        let none = with(&|p| {
            p[1] = 0;
            p.truncate(rec(0));
        });
        assert_eq!(layout(op, &none), LayoutError::NoLimits);
        let both = with(&|p| {
            p[4] = 4;
            p.splice(rec(0)..rec(0), *b"free");
        });
        assert_eq!(layout(op, &both), LayoutError::TierAndLimits);
        let nine = with(&|p| {
            p[1] = 9;
            let r = p[rec(0)..rec(1)].to_vec();
            p.truncate(rec(0));
            for _ in 0..9 {
                p.extend_from_slice(&r);
            }
        });
        assert_eq!(layout(op, &nine), LayoutError::LimitCount);
        // Tier names: UTF-8, 1..=64 bytes.
        let tier = |name: &[u8]| {
            let mut p = good[..16].to_vec();
            p[1] = 0;
            p[4..6].copy_from_slice(&(name.len() as u16).to_le_bytes());
            p.extend_from_slice(b"user:42");
            p.extend_from_slice(name);
            p
        };
        assert!(Request::parse(header(op), &tier(&[b'x'; TIER_BYTES_MAX])).is_ok());
        assert_eq!(
            layout(op, &tier(&[b'x'; TIER_BYTES_MAX + 1])),
            LayoutError::TierName
        );
        assert_eq!(layout(op, &tier(&[0xff, 0xfe])), LayoutError::TierName);
    }

    #[test]
    fn decide_keys_policies_and_costs_get_their_status() {
        let op = op::DECIDE;
        let enc = |key: &'static [u8], limits: &[Limit], mode: Mode, cost: u64| {
            let mut b = BytesMut::new();
            put_decide(
                &mut b,
                &Decide {
                    mode,
                    key,
                    limits: Limits::Inline(LimitSet::new(limits).unwrap()),
                    cost,
                    priority: Priority::Normal,
                },
            );
            b.to_vec()
        };
        let set = composite();
        assert_eq!(status(op, &enc(b"", &set, Mode::Spend, 1)), Status::BadKey);
        let long: &'static [u8] = &[b'x'; KEY_BYTES_MAX + 1];
        assert_eq!(status(op, &enc(long, &set, Mode::Spend, 1)), Status::BadKey);
        // Every kind's numbers are validated, naming the limit.
        let bad: [Limit; 6] = [
            Limit::TokenBucket(Policy {
                count: 0,
                period_ns: S,
                burst: 1,
            }),
            Limit::FixedWindow(Window {
                limit: 1,
                window_ns: 999,
            }),
            Limit::SlidingLog(Window {
                limit: crate::limit::SLIDING_LOG_LIMIT_MAX + 1,
                window_ns: S,
            }),
            Limit::SlidingCounter(Window {
                limit: 0,
                window_ns: S,
            }),
            Limit::Concurrency(Concurrency {
                limit: 1,
                lease_ns: 1,
            }),
            Limit::Concurrency(Concurrency {
                limit: 0,
                lease_ns: S,
            }),
        ];
        for limit in bad {
            let e = parse_err(op, &enc(b"k", &[set[0], limit], Mode::Spend, 1));
            assert_eq!(e.status, Status::InvalidPolicy, "{limit:?}");
            assert_eq!(e.limit_index, Some(1), "{limit:?}");
            // A bad key is reported before a bad limit, a bad layout before both.
            let e = parse_err(op, &enc(b"", &[set[0], limit], Mode::Spend, 1));
            assert_eq!(e.status, Status::BadKey);
            let mut p = enc(b"", &[limit, set[0]], Mode::Spend, 1);
            p[16 + 32] = 9;
            assert_eq!(status(op, &p), Status::BadRequest);
        }
        // The cost must fit every limit for SPEND and PROBE (the token
        // bucket's burst is 5, the sliding log's limit 10).
        for mode in [Mode::Spend, Mode::Probe] {
            assert!(Request::parse(header(op), &enc(b"k", &set, mode, 5)).is_ok());
            let e = parse_err(op, &enc(b"k", &set, mode, 6));
            assert_eq!(e.status, Status::CostExceedsBurst);
            assert_eq!(e.limit_index, Some(0));
            assert_eq!(
                e.to_string(),
                "cost exceeds burst: limit 0: cost 6 exceeds burst 5: it could never be admitted"
            );
        }
        // A refund gives back any number of units; a tier's costs are the
        // server's to check.
        assert!(Request::parse(header(op), &enc(b"k", &set, Mode::Refund, u64::MAX)).is_ok());
        let tier = payload(&Request::Decide(decide(
            Mode::Spend,
            Limits::Tier("t"),
            u64::MAX,
        )));
        assert!(Request::parse(header(op), &tier).is_ok());
        let e = parse_err(op, &enc(b"k", &[set[0], bad[1]], Mode::Spend, 1));
        assert_eq!(
            e.to_string(),
            format!("invalid policy: limit 1: {}", PolicyError::Window)
        );
    }

    #[test]
    fn malformed_lease_ops_get_their_status() {
        for op in [op::RELEASE, op::RENEW] {
            let good = payload(&Request::Release(lease_inline(2)));
            let with = |f: &dyn Fn(&mut Vec<u8>)| {
                let mut p = good.clone();
                f(&mut p);
                p
            };
            let rec = 16 + 7;
            assert!(Request::parse(header(op), &good).is_ok());
            assert_eq!(layout(op, &good[..15]), LayoutError::Length);
            assert_eq!(layout(op, &good[..good.len() - 1]), LayoutError::Length);
            assert_eq!(layout(op, &with(&|p| p.push(0))), LayoutError::Length);
            assert_eq!(layout(op, &with(&|p| p[6] = 1)), LayoutError::Reserved);
            assert_eq!(
                layout(op, &with(&|p| p[rec + 1] = 1)),
                LayoutError::Reserved
            );
            assert_eq!(
                layout(op, &with(&|p| p[8..16].fill(0))),
                LayoutError::LeaseIdZero
            );
            assert_eq!(layout(op, &with(&|p| p[4] = 8)), LayoutError::LimitIndex);
            assert_eq!(layout(op, &with(&|p| p[rec] = 0)), LayoutError::Kind(0));
            assert_eq!(
                layout(op, &with(&|p| p[rec] = Kind::SlidingLog.code())),
                LayoutError::NotConcurrency(Kind::SlidingLog)
            );
            assert_eq!(
                layout(op, &with(&|p| p[rec + 24] = 1)),
                LayoutError::UnusedField(Kind::Concurrency)
            );
            let zero_limit = with(&|p| p[rec + 8..rec + 16].fill(0));
            let e = parse_err(op, &zero_limit);
            assert_eq!((e.status, e.limit_index), (Status::InvalidPolicy, Some(2)));
            let no_key = with(&|p| {
                p[0] = 0;
                p.drain(16..23);
            });
            assert_eq!(status(op, &no_key), Status::BadKey);
            // A tier takes no record; its name is checked like DECIDE's.
            let tier = payload(&Request::Release(LeaseOp {
                key: b"k",
                target: LeaseTarget::Tier {
                    name: "free",
                    index: 1,
                },
                lease_id: 3,
            }));
            let mut extra = tier.clone();
            extra.extend_from_slice(&good[rec..]);
            assert_eq!(layout(op, &extra), LayoutError::Length);
            let mut bad_name = tier.clone();
            bad_name[17] = 0xff;
            assert_eq!(layout(op, &bad_name), LayoutError::TierName);
        }
    }

    #[test]
    fn malformed_node_ops_are_bad_requests() {
        assert_eq!(layout(op::RELOAD, &[0]), LayoutError::Length);
        assert_eq!(layout(op::STATS, &[0, 0]), LayoutError::Length);
        assert_eq!(layout(op::STATS, &[0; 5]), LayoutError::Length);
        assert_eq!(layout(op::STATS, &[1, 0, 0, 1]), LayoutError::Reserved);
        assert_eq!(
            Request::parse(header(op::STATS), &[0; 4]),
            Ok(Request::Stats(Stats { shard_first: 0 }))
        );
    }

    #[test]
    fn limit_sets_hold_one_to_eight_and_check_for_the_server() {
        let set = composite();
        assert!(LimitSet::new(&[]).is_none());
        assert!(LimitSet::new(&[set[0]; LIMITS_MAX + 1]).is_none());
        assert_eq!(set.len(), 5);
        assert_eq!(set.as_slice()[4].kind(), Kind::Concurrency);
        assert!(set.check_cost(Mode::Refund, u64::MAX).is_ok());
        assert!(set.check_cost(Mode::Reset, u64::MAX).is_ok());
        assert_eq!(
            set.check_cost(Mode::Probe, 11).unwrap_err().limit_index,
            Some(0)
        );
        assert_eq!(
            set.concurrency_at(4).ok(),
            Concurrency::new(10, 30 * S).ok()
        );
        let e = set.concurrency_at(1).unwrap_err();
        assert_eq!(e.status, Status::BadRequest);
        assert_eq!(
            e.detail,
            Some(Detail::Layout(LayoutError::NotConcurrency(
                Kind::FixedWindow
            )))
        );
        assert_eq!(
            set.concurrency_at(5).unwrap_err().detail,
            Some(Detail::Layout(LayoutError::LimitIndex))
        );
        // Equality ignores the unused entries.
        let a = LimitSet::new(&set[..2]).unwrap();
        assert_eq!(a, LimitSet::new(&[set[0], set[1]]).unwrap());
        assert_ne!(a, set);
        assert_eq!(Limits::Inline(a).slot(1), Slot::Inline(1));
        assert_eq!(
            Limits::Tier("free").slot(2),
            Slot::Tier {
                name: b"free",
                index: 2
            }
        );
        assert_eq!(lease_inline(3).target.slot(), Slot::Inline(3));
    }
}
