//! `sluiced`, the Sluice daemon: N shard threads, each owning its keys on a
//! single-threaded loop, behind one TCP listener speaking protocol v1 (and,
//! optionally, a second one speaking RESP2).
//!
//! Layout:
//! - [`config`]: flags, defaults and limits, validated at start-up.
//! - [`server`]: bind, accept, hand connections to shards, shut down.
//! - [`shard`]: a shard thread, its messages and its [`shard::Table`].
//! - [`connection`]: one protocol v1 connection's coordinator task
//!   (decode, route, decide or forward, reply in order).
//! - [`resp`]: the optional RESP2 listener's parser, commands and
//!   connection task (redis-cli, redis-benchmark, redis-cell's CL.THROTTLE).
//! - [`pipeline`]: the reply ordering and forwarding both connection kinds
//!   share.
//! - [`replication`]: role and epoch, a primary shard's flow to its
//!   follower, the follower's flows and how it applies them.
//! - [`inbox`]: the queue other threads use to reach a shard (loom-checked).
//! - [`sync`]: the shim every sync primitive comes through (std or loom).
//!
//! docs/ARCHITECTURE.md walks one request through these.

pub mod config;
pub mod connection;
pub mod inbox;
pub mod pipeline;
pub mod replication;
pub mod resp;
pub mod server;
pub mod shard;
mod sync;
pub mod tiers;

pub use config::Config;
pub use server::{Server, StartError};
