//! `sluiced`, the Sluice daemon: N shard threads, each owning its keys on a
//! single-threaded loop, behind one TCP listener speaking protocol v1 (and,
//! optionally, a second one speaking RESP2).
//!
//! Layout:
//! - [`config`]: flags, defaults and limits, validated at start-up.
//! - [`server`]: bind, accept, hand connections to shards, shut down.
//! - [`worker`]: a shard thread: its runtime, its message loop, the tasks
//!   it starts (connections, replication flows, the heap sweep).
//! - [`mailbox`]: [`mailbox::ShardMsg`], what other threads may ask of a
//!   shard thread (the one type its senders import).
//! - [`node`]: what the node's shards share ([`node::Node`]) and what one
//!   shard thread's tasks share ([`node::ShardCore`]).
//! - [`shard`]: the ground floor: a shard's [`shard::Table`] and the types
//!   of a decision on it (imports nothing above it; docs/ARCHITECTURE.md,
//!   "Layering").
//! - `coordinator`: the read-decide-write loop both connection kinds run
//!   (flush, sync-replication wait, drain, back-pressure, linger);
//!   `reply_budget` the per-shard reply bytes it bounds.
//! - [`connection`]: protocol v1's side of that loop (decode, route,
//!   decide or forward, reply in order; a HELLO's move to another shard).
//! - [`resp`]: the optional RESP2 listener's parser, commands and
//!   connection (redis-cli, redis-benchmark, redis-cell's CL.THROTTLE).
//! - [`pipeline`]: the reply ordering and forwarding both connection kinds
//!   share.
//! - [`replication`]: role and epoch, a primary shard's flow to its
//!   follower, the follower's flows and how it applies them.
//! - [`inbox`]: the queue other threads use to reach a shard (loom-checked).
//! - [`sync`]: the shim every sync primitive comes through (std or loom).
//!
//! docs/ARCHITECTURE.md walks one request through these.

pub mod admin;
pub mod affinity;
pub mod auth_failures;
pub mod challenge;
pub mod config;
pub mod connection;
mod coordinator;
pub mod forward;
pub mod inbox;
pub mod mailbox;
pub mod node;
pub mod pipeline;
pub mod replication;
mod reply_budget;
pub mod resp;
#[cfg(feature = "rls")]
pub mod rls;
pub mod server;
pub mod shard;
pub mod signal;
pub mod snapshot;
pub mod stream;
mod sync;
pub mod tiers;
pub mod worker;

pub use config::Config;
pub use server::{Server, StartError};
