//! The requests and replies of protocol version 1 and their payload layouts
//! (PROTOCOL.md, "Ops"). Parsing borrows from the frame and never allocates;
//! encoding appends to a [`FrameWriter`].
//!
//! - HELLO, PING, THROTTLE, PEEK: the original ops.
//! - DECIDE: one routing key, 1..=[`LIMITS_MAX`] limits of any kind (inline
//!   [`LimitSet`] or a named tier), checked and applied as one atomic step,
//!   in one of four [`Mode`]s (spend, probe, refund, reset).
//! - RELEASE, RENEW: a concurrency lease by id ([`LeaseOp`]).
//! - RELOAD, STATS: operations on the node.
//!
//! Validation happens here, at the edge, in the order PROTOCOL.md gives:
//! layout (BAD_REQUEST), key (BAD_KEY), limit numbers (INVALID_POLICY),
//! cost (COST_EXCEEDS_BURST). What needs the server's configuration (a
//! tier's existence and limits) the server checks with the same helpers
//! ([`LimitSet::check_cost`], [`LimitSet::concurrency_at`]).
//!
//! [`FrameWriter`]: crate::codec::FrameWriter

mod cluster;
mod consts;
mod encode;
mod error;
pub mod op;
mod read;
mod reply;
mod request;
#[cfg(test)]
mod test_util;

pub use cluster::{put_cluster_ok, ClusterOk, GroupInfo, CLUSTER_TEXT_BYTES_MAX, GROUP_NONE};
pub use consts::{
    CELL_FIXED_BYTES, DENIED_NONE, ERROR_TEXT_BYTES_MAX, FEATURE_CELL_KEY_HASH, KEY_BYTES_MAX,
    LIMITS_MAX, LIMIT_RECORD_BYTES, SHARD_ANY, STATS_RECORDS_MAX, STATS_RECORD_BYTES,
    THROTTLE_FIXED_BYTES, TIER_BYTES_MAX, TOKEN_BYTES_MAX, VERDICT_RECORD_BYTES,
};
pub use encode::{
    put_cell_ok, put_challenge_ok, put_decide_ok, put_error, put_hello_ok, put_lease_ok, put_pong,
    put_reload_ok, put_stats, put_verdict,
};
pub use error::{Detail, LayoutError, RequestError};
pub use reply::{
    parse_cell_ok, DecideOk, HelloOk, LeaseOk, LimitVerdict, Reply, ShardStats, StatsOk,
};
pub use request::{
    cell_hash_at, put_cell, put_cell_hashed, Cell, Decide, Hello, LeaseOp, LeaseTarget, LimitSet,
    Limits, Mode, Request, Stats, Throttle, CELL_KEY_HASH,
};
