//! The optional RESP2 listener (`--resp-port`): a Redis-compatible subset,
//! so that `redis-cli`, `redis-benchmark` and redis-cell's users work
//! against Sluice unchanged. It is not the fast path (protocol v1 is), but
//! it is served the same way: connections are placed on shard threads
//! round robin, each is a coordinator that decides its own shard's keys
//! inline and forwards the rest in batches, and pipelined commands are
//! answered in order, as many replies per write as are ready.
//!
//! Layout:
//! - [`parser`]: RESP2 arrays and inline commands, bounded, resumable.
//! - [`command`]: what each command means and answers, and RESP2 replies.
//! - [`connection`]: one connection's task on its shard thread.
//! - [`role`]: ROLE and `INFO replication` in Redis's shapes.
//!
//! `CL.THROTTLE`'s decision is `sluice_protocol::cell`, on the same shard
//! tables (and bucket records) as protocol v1's THROTTLE.

pub mod command;
pub mod connection;
pub mod parser;
pub mod role;
