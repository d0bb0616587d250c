//! What other threads may ask of a shard: [`ShardMsg`], the one message
//! type of a shard's inbox, and the connections it carries ([`Adopt`],
//! [`AdoptResp`]). The shard's thread (`worker.rs`) takes them and acts;
//! the connection, pipeline and replication tasks send them to reach
//! another shard. Kept apart from the thread that runs them so that
//! senders import only this, and the node (which holds each shard's
//! `Sender<ShardMsg>`) sits below the tasks (docs/ARCHITECTURE.md,
//! "Layering").

use std::net::TcpStream as StdTcpStream;

use bytes::BytesMut;
use sluice_protocol::replication::Record;
use sluice_protocol::Bucket;

use crate::inbox::{self, OnceSender};
use crate::shard::{Batch, ConnectionGuard};
use crate::sync::Arc;
use crate::tiers::Tiers;

/// What other threads may ask of a shard.
#[derive(Debug)]
pub enum ShardMsg {
    /// Serve this connection from now on.
    Adopt(Adopt),
    /// Serve this RESP connection from now on.
    AdoptResp(AdoptResp),
    /// Decide these requests for keys this shard owns and reply.
    Batch(Batch),
    /// Use these tiers from now on (a reload).
    Tiers(Arc<Tiers>),
    /// Follower: clear the table, a new full sync starts.
    Reset(Reset),
    /// Follower: start a flow from a primary shard on this shard.
    Flow(StartFlow),
    /// Follower: apply these records (from a flow on another shard).
    Apply(Apply),
    /// Follower: make room for this many more buckets of each kind (a full
    /// sync of this following attempt is about to arrive).
    Reserve(u64, [u64; 5]),
    /// Planned failover: say once the follower has everything this shard
    /// changed.
    Handover(crate::inbox::OnceSender<bool>),
    /// Planned failover: this shard's flow hands over at this epoch.
    Takeover(u64),
    /// Snapshot: encode this shard's buckets (a chunk of keys at a time,
    /// between other work) and send them.
    Snapshot(crate::inbox::OnceSender<crate::snapshot::ShardPart>),
    /// Snapshot, at start (before any connection): store these buckets.
    Load(
        Vec<sluice_protocol::replication::Record>,
        crate::sync::mpsc::Sender<()>,
    ),
    /// Run this on the shard's thread, inside its runtime (the rate limit
    /// service served on the shard threads: `--rls-threads 0`).
    Run(Job),
    /// Shutdown, step 1: stop reading new requests, finish the ones in
    /// flight, close connections, then report drained. Keep serving
    /// batches: other shards' connections may still be finishing.
    Drain,
    /// Shutdown, step 2: every shard has drained; stop the thread.
    Stop,
}

/// Work for a shard's thread ([`ShardMsg::Run`]).
pub struct Job(pub Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

/// A connection moving to a shard: freshly accepted, or bound to this shard
/// by its HELLO on another.
#[derive(Debug)]
pub struct Adopt {
    /// The socket (plain or TLS), registered with no runtime.
    pub stream: crate::stream::Moving,
    /// Bytes already read from it and not yet decoded.
    pub read_buf: BytesMut,
    /// Set when HELLO moved the connection: the id to answer HELLO_OK to.
    pub hello_request_id: Option<u32>,
    /// Whether the connection has authenticated.
    pub authed: bool,
    /// The layout hash its HELLO carried if it came from a forwarding node
    /// of the same layout (such a connection is never forwarded further).
    pub forwarded: Option<u64>,
    /// Keeps the connection counted while it lives.
    pub guard: ConnectionGuard,
}

/// A freshly accepted RESP connection (it never moves between shards).
#[derive(Debug)]
pub struct AdoptResp {
    /// The socket, non-blocking, not registered with any runtime.
    pub stream: StdTcpStream,
    /// Keeps the connection counted while it lives.
    pub guard: ConnectionGuard,
}

// A follower's messages to its shards (replication/follower.rs sends
// them; worker.rs acts on them).

/// A token bucket's record as `SyncReader::parse_buckets` gives it: its
/// key and state (`None`: absent). 48 bytes, where a [`Record`] is 80.
pub type TokenRecord = (u128, Option<Bucket>);

/// Records for a shard of this node, from a flow on another shard.
#[derive(Debug)]
pub struct Apply {
    /// The following attempt they belong to (older ones are dropped).
    pub generation: u64,
    /// The records but token buckets', in stream order.
    pub records: Vec<Record>,
    /// The token-bucket records (`None`: absent), in stream order.
    pub buckets: Vec<TokenRecord>,
    /// Told once they are applied.
    pub done: OnceSender<()>,
}

/// Start one flow on this shard.
#[derive(Debug)]
pub struct StartFlow {
    /// The following attempt.
    pub generation: u64,
    /// The primary's address.
    pub primary: String,
    /// The primary shard this flow streams.
    pub primary_shard: u16,
    /// Told when the flow ends (any reason).
    pub ended: inbox::Sender<u64>,
}

/// Clear the table for a new full sync, then say so.
#[derive(Debug)]
pub struct Reset {
    /// The following attempt that starts.
    pub generation: u64,
    /// Told once the table is empty.
    pub done: OnceSender<()>,
}
