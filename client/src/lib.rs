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

pub mod bench;
pub mod client;
pub mod connection;
pub mod error;

pub use client::{Client, ClientConfig};
pub use error::{Action, Error};
pub use sluice_protocol::{Policy, Verdict};
