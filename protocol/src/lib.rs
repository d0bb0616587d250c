//! The shared language of Sluice: everything the server and the client must
//! agree on, and nothing that does I/O.
//!
//! - [`status`]: every wire error code, with its meaning and what a client
//!   should do about it.
//! - [`codec`]: length-prefixed frames (a tokio-util `Decoder` over
//!   `BytesMut`) and the message header that every request and reply carries.
//! - [`message`]: the typed requests and replies of protocol version 1 and
//!   their byte layouts (PROTOCOL.md beside this crate is the spec).
//! - [`policy`]: a limit's numbers (rate per period, burst) and their
//!   validation and human syntax (`10/s`, `100/250ms`).
//! - [`gcra`]: the pure token-bucket decision, `f(state, policy, cost, now)`.
//! - [`limit`]: every limit kind (token bucket, fixed window, sliding log,
//!   sliding counter, concurrency), its spec syntax (`sliding-log:100/1m`),
//!   and the pure decision of each, with what each promises.
//! - [`priority`]: priority classes (critical, normal, low) and the reserved
//!   shares of a limit that only the higher classes may spend.
//! - [`cell`]: redis-cell's `CL.THROTTLE` decision, argument rules and reply,
//!   exactly, for the server's RESP listener.
//! - [`composite`]: the composite decision (all or nothing) over any store
//!   of bucket states, for in-process limiters (the client's fallback).
//! - [`clock`]: where `now` comes from (a monotonic clock, or a manual one in
//!   tests); the decision never reads a clock itself.
//! - [`replication`]: what a follower and its primary exchange (SUBSCRIBE,
//!   SYNC, ACK), the state record of every limit kind, ROLE and PROMOTE.
//! - [`routing`]: how a routing key maps to its 128-bit hash and its shard.
//! - [`ring`]: which shard group of a cluster owns a routing key (rendezvous).
//! - [`identity`]: which requests share a bucket: the 128-bit bucket key of
//!   `(routing key, limit kind, slot)`.

pub mod auth;
pub mod cell;
pub mod clock;
pub mod codec;
mod codes;
pub mod composite;
pub mod gcra;
pub mod identity;
pub mod kind;
pub mod limit;
pub mod message;
pub mod policy;
pub mod priority;
pub mod replication;
pub mod ring;
pub mod routing;
pub mod status;

pub use cell::{CellPolicy, CellVerdict};
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use codec::{DecodeError, Frame, FrameDecoder, FrameWriter, MessageHeader};
pub use gcra::{Bucket, Decision, Verdict};
pub use limit::{Concurrency, Kind, Limit, SpecError, Window};
pub use message::{Hello, HelloOk, Reply, Request, Throttle};
pub use policy::{Policy, PolicyError};
pub use priority::{Priority, Reserved, Reserves};
pub use status::Status;

/// The protocol version this crate speaks. HELLO negotiates it.
pub const PROTOCOL_VERSION: u16 = 1;
