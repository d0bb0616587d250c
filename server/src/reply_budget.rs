//! The reply bytes a shard's connections owe together ([`ShardReplies`]):
//! per-shard state that the shard's `ShardCore` (node.rs)
//! holds and each connection's `ReplyShare` (in the coordinator) keeps its
//! part of. A leaf: it imports nothing of the crate, so the node can hold
//! it without importing the coordinator that uses it.

use std::cell::Cell;

/// The reply bytes a shard's connections owe together (written nowhere
/// yet, or held behind forwarded requests), against the shard's share of
/// `--reply-bytes-node-max`: the node-wide bound on what clients that do
/// not read can make it hold. Each connection keeps its own part in a
/// [`ReplyShare`]; a connection that finds the shard at its share stops
/// decoding (as at its own `--reply-bytes-max`) until others' replies are
/// written, and is woken then.
#[derive(Debug)]
pub struct ShardReplies {
    /// Bytes owed, all connections together (as they last settled).
    pub(crate) owed: Cell<usize>,
    /// The shard's share of `--reply-bytes-node-max`.
    pub(crate) share: usize,
    /// Whether a connection stopped at the share and waits for `freed`.
    pub(crate) blocked: Cell<bool>,
    /// Told when the shard falls back under its share.
    pub(crate) freed: tokio::sync::Notify,
}

impl ShardReplies {
    pub fn new(share: usize) -> ShardReplies {
        ShardReplies {
            owed: Cell::new(0),
            share,
            blocked: Cell::new(false),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// Bytes owed by all the shard's connections together.
    pub fn owed(&self) -> usize {
        self.owed.get()
    }

    /// Resolves when the shard falls back under its share, after a
    /// connection stopped at it.
    pub(crate) fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }
}
