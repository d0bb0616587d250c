//! The Sluice client: what a gateway links to ask "may client X spend N
//! more units now?".
//!
//! One [`Client`] is shared by all of a gateway's tasks (it is `Clone` and
//! cheap to clone). Concurrent calls are multiplexed over few connections:
//! each connection has a writer task that gathers every call queued since
//! its last write into one frame, and a reader task that matches replies to
//! calls by request id. Every call has a deadline.
//!
//! By default the client is *shard-aware*: it learns the node's shard count
//! at HELLO, opens one connection bound to each shard, and sends each key to
//! the connection of the shard that owns it, so the server never forwards.
//!
//! Layout:
//! - [`client`]: `Client`, its configuration and calls.
//! - [`connection`]: one multiplexed connection (handshake, writer, reader).
//! - [`error`]: errors that say what to do next.
//! - [`cluster`]: `Cluster`, many shard groups (with `Cluster::batch`, many
//!   decisions at once); its cluster file needs feature `toml` (on by
//!   default: serde and toml), which a gateway that builds its
//!   `Topology` in code can turn off.
//! - `etcd` (feature `etcd`, off by default): the cluster's layout from
//!   etcd, watched (`Cluster::from_etcd`).
//! - `tower` (feature `tower`, off by default): `RateLimitLayer`, a tower
//!   layer for HTTP gateways that answers 429 with `Retry-After` and the
//!   RateLimit header fields.
//!
//! Besides THROTTLE and PEEK (one token bucket), the client speaks DECIDE:
//! one key, 1..=8 limits of any kind ([`Limit`], inline through
//! [`inline_limits`] or a server tier by name, both a [`Limits`]), decided
//! as one atomic step in a [`Mode`] ([`Client::spend`], [`Client::probe`],
//! [`Client::refund`], [`Client::reset`]); RELEASE and RENEW of the leases
//! a concurrency limit hands out ([`LeaseTarget`]); RELOAD and STATS; and
//! ROLE and PROMOTE ([`Client::role`], [`Client::promote`], [`RoleOk`]).

pub mod client;
pub mod cluster;
pub mod connection;
pub mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod metrics;
#[cfg(feature = "tower")]
pub mod shed;
#[cfg(feature = "tower")]
pub mod tower;

pub use client::{inline_limits, inline_reserved, Client, ClientConfig};
pub use cluster::{
    Answer, Cluster, ClusterConfig, ClusterVerdict, FailurePolicy, Source, Topology,
    STALL_AFTER_MS_DEFAULT,
};
pub use connection::{CellByHash, Op, OwnedLimits, OwnedTarget};
pub use error::{Action, Error};
pub use sluice_protocol::message::{
    DecideOk, LeaseOk, LeaseTarget, LimitSet, LimitVerdict, Limits, Mode, ShardStats, StatsOk,
};
// Replication's `Mode` is renamed: `Mode` is DECIDE's.
pub use sluice_protocol::replication::{Mode as ReplMode, ReplState, Role, RoleOk};
pub use sluice_protocol::{
    Concurrency, Kind, Limit, Policy, Priority, Reserved, Reserves, Status, Verdict, Window,
};
