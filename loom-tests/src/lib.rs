//! Loom models of the structures the server shares between threads.
//!
//! The server's own files are compiled here, not copies: `#[path]` pulls in
//! `server/src/sync.rs` (which, under `--cfg sluice_loom`, hands out loom's
//! `Arc` and `Mutex`) and `server/src/inbox.rs` (which takes them from
//! `crate::sync`). The models live in `tests/` and run only under that cfg:
//!
//! ```text
//! RUSTFLAGS="--cfg sluice_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p sluice-loom-tests --release --target-dir target/loom
//! ```
//!
//! Without the cfg this crate is empty, so `cargo build --workspace` does not
//! compile loom.
//!
//! Layout:
//! - [`inbox`]: the server's MPSC inbox, as is.
//! - [`lease`]: a follower's receipts and its decision to promote itself.
//! - [`signal`]: the permit that evicts an unauthenticated connection.
//! - [`over_limit`]: a shard's published over-limit windows.
//! - `tests/handoff.rs`: connection to shard and back, several producers,
//!   shutdown racing with sends, end of stream; a shard's one answer
//!   through `inbox::oneshot` (or its absence), and shards reporting they
//!   drained. Every channel between the server's threads is an inbox (the
//!   tokio channels the shards used for these went: loom cannot see into
//!   them).
//! - [`over_limit`] and `tests/over_limit.rs`: a shard's published
//!   over-limit windows, read by another thread while the shard replaces
//!   and withdraws them: a reader never takes one entry's fields for
//!   another's.
//! - `tests/promotion.rs`: no ack renews the old primary's lease once the
//!   follower has decided to promote.

// The shim also re-exports atomics the inbox does not use; they are used by
// the server, so the warning here says nothing about the shim.
#[cfg(sluice_loom)]
#[allow(unused_imports)]
#[path = "../../server/src/sync.rs"]
mod sync;

#[cfg(sluice_loom)]
#[path = "../../server/src/inbox.rs"]
pub mod inbox;

#[cfg(sluice_loom)]
#[path = "../../server/src/replication/lease.rs"]
pub mod lease;

#[cfg(sluice_loom)]
#[path = "../../server/src/signal.rs"]
pub mod signal;

#[cfg(sluice_loom)]
#[path = "../../server/src/shard/over_limit.rs"]
pub mod over_limit;
