//! The daemon's configuration: every limit it enforces, with its default as
//! a named constant, validated once at start-up with messages that name the
//! flag and its allowed range.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use serde::Deserialize;
use sluice_protocol::codec::{FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MAX_LIMIT, HEADER_BYTES};
use sluice_protocol::message::TOKEN_BYTES_MAX;

/// Default listening port.
pub const PORT_DEFAULT: u16 = 7700;
/// Most shards a node may run (the protocol carries the count in a u16 and
/// reserves 0xFFFF).
pub const SHARDS_MAX: u16 = 1024;
/// Default cap on open client connections.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Default requests a connection may have read and not yet answered before
/// the server stops reading from it.
pub const INFLIGHT_MAX_DEFAULT: usize = 8_192;
/// Default most requests in one frame.
pub const BATCH_MAX_DEFAULT: usize = 4_096;
/// Default time SIGTERM waits for connections to finish their in-flight
/// requests before the shards stop.
pub const DRAIN_MS_DEFAULT: u64 = 5_000;
/// Default `--heap-bytes-max`: 1 GiB per shard.
pub const HEAP_BYTES_MAX_DEFAULT: usize = 1 << 30;
/// Default `--snapshot-interval-s`.
pub const SNAPSHOT_INTERVAL_S_DEFAULT: u64 = 60;
/// Default `--auth-timeout-ms`.
pub const AUTH_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default `--frame-timeout-ms`.
pub const FRAME_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default `--reply-bytes-max`: replies one connection may owe before the
/// server stops decoding its requests until they are written.
pub const REPLY_BYTES_MAX_DEFAULT: usize = 1 << 20;
/// Default `--reply-timeout-ms`: how long a write of replies may stay
/// blocked (a client that does not read) before the connection is closed.
pub const REPLY_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default `--admin-timeout-ms`: how long the admin port waits for a
/// whole request (from the connection's start or its last reply).
pub const ADMIN_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default `--admin-connections-max`: open admin connections (scrapers and
/// health checks need a few), apart from `--connections-max`.
pub const ADMIN_CONNECTIONS_MAX_DEFAULT: usize = 64;
/// Default `--rls-connections-max`: open rate limit service connections
/// (Envoy opens one or a few per worker thread), apart from
/// `--connections-max`.
pub const RLS_CONNECTIONS_MAX_DEFAULT: usize = 1_024;
/// Default `--rls-request-timeout-ms`: how long a `ShouldRateLimit` may
/// take from its headers to its answer, its message's arrival included
/// (Envoy's own timeout for the call is 20 ms by default).
pub const RLS_REQUEST_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default `--rls-buffer-bytes-max`: request bytes the rate limit service
/// holds for messages still arriving, all connections together: 64 MiB.
pub const RLS_BUFFER_BYTES_MAX_DEFAULT: usize = 64 << 20;
/// Default `--rls-over-limit-slots`: each shard's published over-limit
/// fixed windows (64 bytes a slot: 64 KiB a shard).
pub const RLS_OVER_LIMIT_SLOTS_DEFAULT: usize = 1_024;
/// Default `--reply-bytes-node-max`: 256 MiB.
pub const REPLY_BYTES_NODE_MAX_DEFAULT: usize = 256 << 20;

/// Default most buckets one shard holds (all kinds together). At the cap,
/// full buckets are evicted; if none is full, new keys are refused
/// (KEYS_FULL) rather than evicting a partly spent bucket, which would hand
/// its client a free burst.
pub const KEYS_MAX_DEFAULT: usize = 20_000_000;

/// Default time a sync-mode primary waits for its follower's ack before it
/// serves alone (and says so: role, logs).
pub const REPLICA_TIMEOUT_MS_DEFAULT: u64 = 300;

/// Shortest `--promote-after-ms`: the primary's lease is half of it, and
/// heartbeats go every 50 ms, so a few must fit in a lease.
pub const PROMOTE_AFTER_MS_MIN: u64 = 200;

/// How `sluiced` writes its log lines (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line of text per event (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields` (with
    /// `message`), `target`.
    Json,
}

/// Which rate-limit headers the Envoy rate limit service asks Envoy to add
/// to its responses (`--rls-headers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RlsHeaders {
    /// None (envoyproxy/ratelimit's default).
    #[default]
    Off,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (the
    /// IETF draft's names, as envoyproxy/ratelimit's
    /// LIMIT_RESPONSE_HEADERS_ENABLED writes them).
    Ratelimit,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    XRatelimit,
}

/// What an entry node answers for a key whose owner group cannot answer
/// (`--forward-failure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForwardFailure {
    /// An error each protocol's clients understand: v1 GROUP_UNAVAILABLE
    /// (or OUTCOME_UNKNOWN), RESP `-TRYAGAIN`, RLS `UNAVAILABLE` (Envoy's
    /// `failure_mode_deny` then decides).
    #[default]
    Error,
    /// Allow, spending nothing (availability over limits).
    Open,
    /// Deny, spending nothing.
    Closed,
}

/// Which connections an entry node forwards over
/// (`--forward-connections`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardConnections {
    /// Every thread that forwards (each shard's, a rate limit service
    /// thread's) has its own connections to each owner's shards: a
    /// forward and its answer cross no thread on this node. A node opens
    /// (threads) x (other groups) x (their shards) connections.
    #[default]
    PerThread,
    /// One set of connections, on the forwarder thread, which every other
    /// thread hands its forwards to (a hop there and back): a node opens
    /// (other groups) x (their shards), for clusters of very many groups.
    Shared,
}

/// Default `--forward-deadline-ms`.
pub const FORWARD_DEADLINE_MS_DEFAULT: u64 = 500;

/// A primary's replication mode (`--replication`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Replication {
    /// A reply that reflects a change leaves only once the follower has
    /// acknowledged it: a kill -9 of the primary loses no decision a client
    /// saw.
    #[default]
    Sync,
    /// Replies do not wait; a crash may re-grant what the primary admitted
    /// in its last unacknowledged interval.
    Async,
}

// A batch must fit in flight, or a frame at the batch limit could never be read.
const _: () = assert!(BATCH_MAX_DEFAULT <= INFLIGHT_MAX_DEFAULT);

/// What `sluiced --help` says after the flags.
const SLUICED_AFTER_HELP: &str = "\
Examples:
  sluiced                                   serve on 127.0.0.1:7700, one shard per core
  sluiced --port 0 --resp-port 0            free ports for both listeners (printed)
  sluiced --config sluice.toml              settings and tiers from a file
  sluiced --replica-of 127.0.0.1:7700 --port 7701   a follower of that primary

Standard output (scripts read it): first line
  sluiced listening on ADDR shards=N
and, with --resp-port, a second line
  sluiced resp listening on ADDR
and, with --admin-port, a line after those
  sluiced admin listening on ADDR
Logs go to standard error (plain text unless it is a terminal).

Environment:
  SLUICE_LOG          log filter: error, warn, info (default), debug, or per module
  SLUICE_AUTH_TOKEN   as --auth-token
  NO_COLOR            no colours in the logs even on a terminal

Signals:
  SIGTERM, SIGINT     stop accepting, answer what was accepted (up to --drain-ms), exit 0;
                      a second one exits at once, with status 1
  SIGHUP              re-read the config file's tiers (the old ones stay if it is invalid)

Exit status: 0 after a clean shutdown; 1 after a second SIGTERM or SIGINT
cut the drain short; 2 for a bad flag, config file or listening address
(for example, the port already in use).";

/// `sluiced`: the Sluice rate-limiting store.
#[derive(Clone, Debug, Parser)]
#[command(name = "sluiced", version, about, after_help = SLUICED_AFTER_HELP)]
pub struct Config {
    /// Address to listen on. Loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,

    /// Port to listen on; 0 picks a free one (printed at start-up).
    #[arg(long, default_value_t = PORT_DEFAULT)]
    pub port: u16,

    /// Also serve RESP2 (redis-cli, redis-benchmark, redis-cell's
    /// CL.THROTTLE) on this port of --bind; 0 picks a free one (printed on
    /// the second line of stdout). Off unless given.
    #[arg(long, value_name = "PORT")]
    pub resp_port: Option<u16>,

    /// Also serve the binary protocol over TLS on this port of --bind
    /// (with --tls-cert and --tls-key): what a follower reaches with
    /// --replica-tls-ca, and any client that speaks TLS. 0 picks a free one
    /// (printed on a line of stdout of its own). Off unless given; --port
    /// still serves in clear beside it.
    #[arg(long, value_name = "PORT")]
    pub tls_port: Option<u16>,

    /// With --tls-port: its certificate chain (PEM). Read and checked at
    /// start.
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,

    /// With --tls-cert: its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,

    /// Also serve the admin HTTP endpoints (GET /metrics for Prometheus,
    /// /health, /ready, /role) on this port of --bind; 0 picks a free one
    /// (printed on a line of stdout of its own). Off unless given.
    #[arg(long, value_name = "PORT")]
    pub admin_port: Option<u16>,

    /// With --admin-port: milliseconds a connection has to send a whole
    /// request, from its start or from its last reply (an idle or
    /// half-sent one is closed then), and a blocked write of a reply may
    /// wait.
    #[arg(long, default_value_t = ADMIN_TIMEOUT_MS_DEFAULT)]
    pub admin_timeout_ms: u64,

    /// With --admin-port: open admin connections at most; past it a new
    /// one is closed at once (its own cap, apart from --connections-max).
    #[arg(long, default_value_t = ADMIN_CONNECTIONS_MAX_DEFAULT)]
    pub admin_connections_max: usize,

    /// Also serve Envoy's rate limit service (gRPC,
    /// `envoy.service.ratelimit.v3.RateLimitService`) on this port of
    /// --bind; 0 picks a free one (printed on a line of stdout of its own).
    /// Needs --rls-config and a sluiced built with the `rls` feature. Off
    /// unless given.
    #[arg(long, value_name = "PORT")]
    pub rls_port: Option<u16>,

    /// The rate limit service's rules: an envoyproxy/ratelimit YAML file,
    /// or a directory of them (every `*.yaml` and `*.yml`, one domain
    /// each). Checked at start; reloaded on SIGHUP (a bad file keeps the
    /// rules in force).
    #[arg(long, value_name = "PATH")]
    pub rls_config: Option<PathBuf>,

    /// Rate-limit headers the rate limit service asks Envoy to add to its
    /// responses, from the limit closest to its end.
    #[arg(long, value_enum, default_value_t = RlsHeaders::Off)]
    pub rls_headers: RlsHeaders,

    /// Threads that serve the rate limit service (HTTP/2, protobuf, the
    /// rule lookup; decisions stay on the shards), each taking connections
    /// from the one socket. 0 (the default; 1 on an entry point with
    /// --forward-connections shared, whose first service thread is its
    /// forwarder's): serve it on the shard threads themselves, each call's
    /// batch for the shard it runs on decided with no hop to another
    /// thread.
    #[arg(long, value_name = "N")]
    pub rls_threads: Option<u16>,

    /// With --rls-port: serve it over TLS with this certificate chain
    /// (PEM; with --rls-tls-key), so that the token and the descriptors do
    /// not cross the network in clear. Read and checked at start.
    #[arg(long, value_name = "PEM")]
    pub rls_tls_cert: Option<PathBuf>,

    /// With --rls-tls-cert: its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PEM")]
    pub rls_tls_key: Option<PathBuf>,

    /// With --auth-token: let the rate limit service answer calls that do
    /// not carry the token (`authorization: Bearer TOKEN` metadata), for
    /// an Envoy that cannot send it and a port only a network policy
    /// reaches. Without it, such calls are UNAUTHENTICATED.
    #[arg(long)]
    pub rls_allow_unauthenticated: bool,

    /// With --rls-port: open rate limit service connections at most; past
    /// it a new one is closed at once (its own cap, apart from
    /// --connections-max).
    #[arg(long, value_name = "N", default_value_t = RLS_CONNECTIONS_MAX_DEFAULT)]
    pub rls_connections_max: usize,

    /// With --rls-port: milliseconds a call may take from its headers to
    /// its answer, its message's arrival included (a shorter `grpc-timeout`
    /// wins); past it the call ends DEADLINE_EXCEEDED and what it held is
    /// freed.
    #[arg(long, value_name = "MS", default_value_t = RLS_REQUEST_TIMEOUT_MS_DEFAULT)]
    pub rls_request_timeout_ms: u64,

    /// With --rls-port: bytes of request messages still arriving that the
    /// service holds, all connections together; a call whose bytes would
    /// go past it ends RESOURCE_EXHAUSTED and frees what it held.
    #[arg(long, value_name = "BYTES", default_value_t = RLS_BUFFER_BYTES_MAX_DEFAULT)]
    pub rls_buffer_bytes_max: usize,

    /// With --rls-port: slots per shard (rounded up to a power of two) of
    /// the fixed windows over their limit that a shard publishes, so that
    /// a call on another thread is denied there without a hop, exactly as
    /// the shard would deny it (a refund or reset withdraws the entry
    /// first). 0 turns it off: every descriptor is asked of its shard.
    #[arg(long, value_name = "N", default_value_t = RLS_OVER_LIMIT_SLOTS_DEFAULT)]
    pub rls_over_limit_slots: usize,

    /// Shard threads; default one per core.
    #[arg(long)]
    pub shards: Option<u16>,

    /// Pin shard thread i to the i-th CPU of this list (like `0,2,4-7`;
    /// wraps around when there are more shards than CPUs). Every CPU must
    /// be one this process may run on. Default: unpinned, the kernel
    /// places the threads.
    #[arg(long, value_name = "LIST")]
    pub cpu_list: Option<crate::affinity::CpuList>,

    /// Most open client connections, both listeners together; past it a new
    /// connection is told TOO_MANY_CONNECTIONS (RESP: `-ERR max number of
    /// clients reached`) and closed.
    #[arg(long, default_value_t = CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,

    /// Largest frame body accepted, in bytes; a larger one closes the
    /// connection with FRAME_TOO_LARGE. Also the largest RESP command (a
    /// whole array, or an inline line) accepted; a larger one is a protocol
    /// error that closes the connection.
    #[arg(long, default_value_t = FRAME_BYTES_MAX_DEFAULT)]
    pub frame_bytes_max: u32,

    /// Most requests in one frame; each request of a larger frame is
    /// answered BATCH_TOO_LARGE.
    #[arg(long, default_value_t = BATCH_MAX_DEFAULT)]
    pub batch_max: usize,

    /// Requests a connection may have unanswered before the server stops
    /// reading from it (back-pressure, not an error).
    #[arg(long, default_value_t = INFLIGHT_MAX_DEFAULT)]
    pub inflight_max: usize,

    /// Milliseconds a graceful shutdown waits for in-flight requests.
    #[arg(long, default_value_t = DRAIN_MS_DEFAULT)]
    pub drain_ms: u64,

    /// With --auth-token: milliseconds a connection has to authenticate
    /// (HELLO; RESP: AUTH or HELLO AUTH) before it is closed.
    #[arg(long, value_name = "MS", default_value_t = AUTH_TIMEOUT_MS_DEFAULT)]
    pub auth_timeout_ms: u64,

    /// Milliseconds a frame (RESP: a command) may stay half-sent before
    /// the connection is closed.
    #[arg(long, value_name = "MS", default_value_t = FRAME_TIMEOUT_MS_DEFAULT)]
    pub frame_timeout_ms: u64,

    /// Milliseconds an authenticated connection may send nothing before it
    /// is closed; 0 (the default) = never (gateways keep connections open).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub idle_timeout_ms: u64,

    /// Bytes of replies a connection may owe (encoded and not yet written,
    /// or held in order behind a request on another shard) before the
    /// server stops decoding its requests until they are written; requests
    /// of one frame past it are answered REPLY_BUFFER_FULL.
    #[arg(long, value_name = "BYTES", default_value_t = REPLY_BYTES_MAX_DEFAULT)]
    pub reply_bytes_max: usize,

    /// Bytes of replies all connections may owe together, each shard
    /// holding its equal part: a connection that finds its shard at its
    /// part stops being decoded, as at --reply-bytes-max, until other
    /// connections' replies are written (clients that never read are closed
    /// after --reply-timeout-ms). Below --reply-bytes-max x shards, it is
    /// also what one connection may owe.
    #[arg(long, value_name = "BYTES", default_value_t = REPLY_BYTES_NODE_MAX_DEFAULT)]
    pub reply_bytes_node_max: usize,

    /// Milliseconds a write of replies may stay blocked (the client does
    /// not read them) before the connection is closed.
    #[arg(long, value_name = "MS", default_value_t = REPLY_TIMEOUT_MS_DEFAULT)]
    pub reply_timeout_ms: u64,

    /// Most buckets per shard, all kinds together; 0 = no cap. At the cap,
    /// full buckets are evicted; if none is full, new keys are refused
    /// (KEYS_FULL) rather than evicting a partly spent bucket.
    #[arg(long, default_value_t = KEYS_MAX_DEFAULT)]
    pub keys_max: usize,

    /// Log lines as `text` or `json` (one object per line), on standard
    /// error; SLUICE_LOG filters them.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Keep the buckets across restarts: write them to DIR/sluiced.snapshot
    /// every --snapshot-interval-s and at a graceful shutdown, and load
    /// that file at start. Off unless given.
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,

    /// With --snapshot-dir: seconds between two snapshots (0: only at a
    /// graceful shutdown). A kill -9 loses what changed since the last.
    #[arg(long, value_name = "S", default_value_t = SNAPSHOT_INTERVAL_S_DEFAULT)]
    pub snapshot_interval_s: u64,

    /// With --snapshot-dir: start empty when the snapshot is corrupt,
    /// truncated or not one (instead of refusing to start); the file is
    /// replaced by the next snapshot.
    #[arg(long)]
    pub snapshot_ignore_corrupt: bool,

    /// Most bytes per shard that sliding logs and concurrency lease lists
    /// may hold together (--keys-max bounds how many buckets there are,
    /// this what the variable-size ones weigh: a log of a large limit holds
    /// up to a MiB); at the cap, a spend that would add to them is refused
    /// with KEYS_FULL. 0 = no cap.
    #[arg(long, value_name = "BYTES", default_value_t = HEAP_BYTES_MAX_DEFAULT)]
    pub heap_bytes_max: usize,

    /// TOML file with settings and named tiers; a flag given on the command
    /// line (or by environment) wins over the file. Tiers reload on SIGHUP.
    #[arg(long)]
    pub config: Option<PathBuf>,

    /// Named tiers, from the config file (not a flag).
    #[arg(skip)]
    pub tiers: crate::tiers::Tiers,

    /// When set, every connection must send it in HELLO before anything else
    /// (RESP connections: AUTH).
    #[arg(long, env = "SLUICE_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,

    /// Read the auth token from this file instead (its one trailing
    /// newline dropped), so that it is not in the command line or the
    /// environment. Not with --auth-token.
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,

    /// Start as a follower of the primary at HOST:PORT: a full sync, then
    /// the stream of changed buckets. A follower refuses to spend
    /// (NOT_PRIMARY) until `sluice promote`.
    #[arg(long, value_name = "HOST:PORT")]
    pub replica_of: Option<String>,

    /// On a follower: reach the primary over TLS (the address it follows
    /// is then the primary's --tls-port), trusting the certificates in
    /// this PEM file. The stream of buckets is then encrypted, and the
    /// primary's certificate is checked before anything is sent.
    #[arg(long, value_name = "PEM")]
    pub replica_tls_ca: Option<PathBuf>,

    /// With --replica-tls-ca: the name the primary's certificate must
    /// carry. Default: the host of the address followed (an IP address
    /// must then be in the certificate's subjectAltName).
    #[arg(long, value_name = "NAME")]
    pub replica_tls_name: Option<String>,

    /// With --replica-tls-ca: dial the followed node's host at this port
    /// (its --tls-port) instead of its address's own port. For followers
    /// that learn the address from elsewhere: etcd's leader key
    /// (--coordinator) and --peer carry a node's plain address, which
    /// gateways use too.
    #[arg(long, value_name = "PORT")]
    pub replica_tls_port: Option<u16>,

    /// On a primary: `sync` (a reply that reflects a change waits for the
    /// follower's ack) or `async` (replies never wait).
    #[arg(long, value_enum, default_value_t = Replication::Sync)]
    pub replication: Replication,

    /// Sync mode: milliseconds a reply waits for the follower's ack before
    /// the primary gives up on it and serves alone (with automatic
    /// promotion on, it closes those connections instead: it cannot know
    /// whether the follower has what it decided).
    #[arg(long, default_value_t = REPLICA_TIMEOUT_MS_DEFAULT)]
    pub replica_timeout_ms: u64,

    /// On a follower: promote itself when it has heard nothing from its
    /// primary for this many milliseconds (it must have been in sync). Its
    /// primary then fences itself: it stops admitting once it has had no
    /// ack for half of it, so two primaries never admit at once. Off
    /// unless given.
    #[arg(long, value_name = "MS")]
    pub promote_after_ms: Option<u64>,

    /// The group's other node (HOST:PORT), for a node started as primary:
    /// before it admits anything, and then every PEER_CHECK_MS, it asks the
    /// peer's role, and if the peer is a primary of a newer epoch (it took
    /// over while this node was down, paused or cut off) this node steps
    /// down and follows it.
    #[arg(long, value_name = "HOST:PORT")]
    pub peer: Option<String>,

    /// The address the group's other node reaches this one at, when it is
    /// not the listening address (a proxy, NAT, a container's published
    /// port): a follower announces it to its primary (which hands over to
    /// it), and a promoted node names it as the primary in ROLE.
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,

    /// Run the group's leadership on etcd (`etcd://HOST:PORT[,HOST:PORT...]`):
    /// the node registers under `/sluice/CLUSTER/groups/GROUP/`, campaigns
    /// for the group's leader key with a lease of --leader-ttl-s, and
    /// follows whoever holds it (needs --group and --advertise; replaces
    /// --replica-of, --peer and --promote-after-ms).
    #[arg(long, value_name = "etcd://HOST:PORT,...")]
    pub coordinator: Option<String>,

    /// With --coordinator or --cluster: the group this node belongs to.
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,

    /// The cluster file (the client's: `[[groups]] name, primary,
    /// follower`): the node checks it is listed in --group under its
    /// --advertise (or listening) address, then answers for every key of
    /// the cluster on every port, forwarding the keys of other groups to
    /// their primaries. Re-read on SIGHUP and RELOAD.
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<PathBuf>,

    /// With --cluster: what a key gets when its owner group cannot answer.
    #[arg(long, value_enum, default_value_t = ForwardFailure::Error)]
    pub forward_failure: ForwardFailure,

    /// With --cluster: `per-thread`, every thread that forwards keeps its
    /// own connections to the owners (no hop between threads; more
    /// connections), or `shared`, one set on the forwarder thread
    /// (docs/ARCHITECTURE.md weighs the two).
    #[arg(long, value_enum, default_value_t = ForwardConnections::PerThread)]
    pub forward_connections: ForwardConnections,

    /// With --cluster: how long a forwarded request may wait for its
    /// owner's answer (then: outcome unknown, never resent).
    #[arg(long, value_name = "MS", default_value_t = FORWARD_DEADLINE_MS_DEFAULT)]
    pub forward_deadline_ms: u64,

    /// With --cluster: how long forwarded requests to a group's primary
    /// may wait before the node looks for a newer primary of that group
    /// in the background (a stalled primary: SIGSTOP, a paused VM), and
    /// sends new requests to it once one answers; 0: never (then a stalled
    /// owner costs --forward-deadline-ms).
    #[arg(long, value_name = "MS", default_value_t = sluice_client::STALL_AFTER_MS_DEFAULT)]
    pub forward_stall_after_ms: u64,

    /// With --coordinator: the cluster's name (the second part of every
    /// key), so that several clusters can share one etcd.
    #[arg(long, value_name = "NAME", default_value = CLUSTER_NAME_DEFAULT)]
    pub cluster_name: String,

    /// With --coordinator: the leader key's lease, in seconds. A primary
    /// stops admitting once it has not renewed it for LEADER_FENCE of this
    /// (a follower can take the key only after all of it), so a failover
    /// takes about this long.
    #[arg(long, value_name = "S", default_value_t = LEADER_TTL_S_DEFAULT)]
    pub leader_ttl_s: u64,
}

/// Default `--cluster-name`.
pub const CLUSTER_NAME_DEFAULT: &str = "default";
/// Default `--leader-ttl-s`: etcd's leases count whole seconds.
pub const LEADER_TTL_S_DEFAULT: u64 = 3;

/// A configuration value out of its range.
#[derive(Debug, thiserror::Error)]
#[error("--{field} must be {range}, got {got}")]
pub struct ConfigError {
    /// The flag's name.
    pub field: &'static str,
    /// The allowed range, in words.
    pub range: String,
    /// The value given.
    pub got: String,
}

fn check<T: PartialOrd + std::fmt::Display>(
    field: &'static str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError {
            field,
            range: format!("{lo}..={hi}"),
            got: v.to_string(),
        });
    }
    Ok(())
}

/// What a config file may hold: every setting flag (same names, with `_`),
/// and `[tiers.NAME] limits = ["SPEC", ...]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    bind: Option<IpAddr>,
    port: Option<u16>,
    resp_port: Option<u16>,
    admin_port: Option<u16>,
    admin_timeout_ms: Option<u64>,
    admin_connections_max: Option<usize>,
    rls_port: Option<u16>,
    rls_config: Option<PathBuf>,
    rls_headers: Option<RlsHeaders>,
    rls_threads: Option<u16>,
    rls_allow_unauthenticated: Option<bool>,
    rls_tls_cert: Option<PathBuf>,
    rls_tls_key: Option<PathBuf>,
    tls_port: Option<u16>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    replica_tls_ca: Option<PathBuf>,
    replica_tls_name: Option<String>,
    replica_tls_port: Option<u16>,
    rls_connections_max: Option<usize>,
    rls_request_timeout_ms: Option<u64>,
    rls_buffer_bytes_max: Option<usize>,
    rls_over_limit_slots: Option<usize>,
    shards: Option<u16>,
    cpu_list: Option<crate::affinity::CpuList>,
    connections_max: Option<usize>,
    frame_bytes_max: Option<u32>,
    batch_max: Option<usize>,
    inflight_max: Option<usize>,
    drain_ms: Option<u64>,
    auth_timeout_ms: Option<u64>,
    frame_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    reply_bytes_max: Option<usize>,
    reply_bytes_node_max: Option<usize>,
    reply_timeout_ms: Option<u64>,
    snapshot_dir: Option<PathBuf>,
    heap_bytes_max: Option<usize>,
    log_format: Option<LogFormat>,
    snapshot_interval_s: Option<u64>,
    snapshot_ignore_corrupt: Option<bool>,
    keys_max: Option<usize>,
    auth_token: Option<String>,
    auth_token_file: Option<PathBuf>,
    replica_of: Option<String>,
    replication: Option<Replication>,
    replica_timeout_ms: Option<u64>,
    promote_after_ms: Option<u64>,
    peer: Option<String>,
    advertise: Option<String>,
    coordinator: Option<String>,
    group: Option<String>,
    cluster: Option<PathBuf>,
    forward_failure: Option<ForwardFailure>,
    forward_connections: Option<ForwardConnections>,
    forward_deadline_ms: Option<u64>,
    forward_stall_after_ms: Option<u64>,
    cluster_name: Option<String>,
    leader_ttl_s: Option<u64>,
    #[serde(default)]
    tiers: BTreeMap<String, FileTier>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTier {
    limits: Vec<String>,
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Args(#[from] clap::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Tier {
        path: PathBuf,
        source: crate::tiers::TierError,
    },
    #[error(transparent)]
    Range(#[from] ConfigError),
    #[error("both an auth token (--auth-token, SLUICE_AUTH_TOKEN or auth_token) and --auth-token-file (auth_token_file) are set: keep one")]
    TokenTwice,
    #[error("--auth-token-file {path}: {reason}")]
    TokenFile { path: PathBuf, reason: String },
}

fn read_file(path: &Path) -> Result<FileConfig, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(path, &text)
}

fn parse_file(path: &Path, text: &str) -> Result<FileConfig, LoadError> {
    toml::from_str(text).map_err(|e| LoadError::Parse {
        path: path.to_owned(),
        message: redact_token(text, &e),
    })
}

/// What to print of a parse error: toml's own text (which quotes the
/// source line of the error) unless the error is on an `auth_token` line,
/// whose value is then never printed: neither the line nor the message's
/// quotes of it (a type error says ``invalid type: integer `123` ``).
fn redact_token(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else {
        return e.to_string();
    };
    let start = span.start.min(text.len());
    let line_no = text[..start].matches('\n').count();
    let line = text.lines().nth(line_no).unwrap_or("");
    let key = line.trim_start().trim_start_matches(['"', '\'']);
    if !key.starts_with("auth_token") || key.starts_with("auth_token_file") {
        return e.to_string();
    }
    let mut message = e.message().to_owned();
    if let Some((_, value)) = line.split_once('=') {
        for secret in [value.trim(), value.trim().trim_matches(['"', '\''])] {
            if secret.len() >= 2 {
                message = message.replace(secret, "<redacted>");
            }
        }
    }
    format!(
        "TOML parse error at line {}: {message} (the line holds auth_token: not shown)",
        line_no + 1
    )
}

/// Parses a config file's text and its tiers, as `--config` and RELOAD do
/// (for the fuzzer: fuzz/fuzz_targets/config.rs).
pub fn tiers_of_file_text(text: &str) -> Result<crate::tiers::Tiers, LoadError> {
    let path = Path::new("<text>");
    file_tiers(path, &parse_file(path, text)?)
}

fn file_tiers(path: &Path, file: &FileConfig) -> Result<crate::tiers::Tiers, LoadError> {
    crate::tiers::Tiers::from_specs(
        file.tiers
            .iter()
            .map(|(name, t)| (name.as_str(), t.limits.as_slice())),
    )
    .map_err(|source| LoadError::Tier {
        path: path.to_owned(),
        source,
    })
}

/// The token in `path`: its text, one trailing newline (`\n` or `\r\n`)
/// dropped; an unreadable or empty file is an error that never quotes it.
fn read_token_file(path: &Path) -> Result<String, LoadError> {
    let bad = |reason: String| LoadError::TokenFile {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let token = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if token.is_empty() {
        return Err(bad("the file is empty: it must hold the token".into()));
    }
    Ok(token.to_owned())
}

impl Config {
    /// Parses `args` (flags), then the `--config` file if any, with flags
    /// winning, and validates the result.
    pub fn load<I, T>(args: I) -> Result<Config, LoadError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Config::command().try_get_matches_from(args)?;
        let mut config = Config::from_arg_matches(&matches)?;
        if let Some(path) = config.config.clone() {
            config.merge_file(&path, &matches)?;
        }
        if let Some(path) = &config.auth_token_file {
            if config.auth_token.is_some() {
                return Err(LoadError::TokenTwice);
            }
            config.auth_token = Some(read_token_file(path)?);
        }
        config.validate()?;
        Ok(config)
    }

    /// Takes the tiers of the `--config` file at `path`, and each setting
    /// it has that neither a flag nor an environment variable gave.
    fn merge_file(&mut self, path: &Path, matches: &clap::ArgMatches) -> Result<(), LoadError> {
        let file = read_file(path)?;
        self.tiers = file_tiers(path, &file)?;
        let from_file = |id: &str| {
            !matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        // Settings with a default: the file's value replaces it.
        macro_rules! take {
            ($($field:ident),*) => {$(
                if let Some(v) = file.$field.clone() {
                    if from_file(stringify!($field)) {
                        self.$field = v.into();
                    }
                }
            )*};
        }
        // Settings unset unless given: the file's value sets them.
        macro_rules! take_optional {
            ($($field:ident),*) => {$(
                if let Some(v) = file.$field.clone() {
                    if from_file(stringify!($field)) {
                        self.$field = Some(v);
                    }
                }
            )*};
        }
        take!(
            bind,
            port,
            shards,
            connections_max,
            frame_bytes_max,
            batch_max,
            inflight_max,
            drain_ms,
            auth_timeout_ms,
            frame_timeout_ms,
            idle_timeout_ms,
            reply_bytes_max,
            reply_bytes_node_max,
            reply_timeout_ms,
            admin_timeout_ms,
            admin_connections_max,
            snapshot_interval_s,
            snapshot_ignore_corrupt,
            log_format,
            heap_bytes_max,
            keys_max,
            replication,
            replica_timeout_ms,
            rls_headers,
            rls_allow_unauthenticated,
            rls_connections_max,
            rls_request_timeout_ms,
            rls_buffer_bytes_max,
            rls_over_limit_slots,
            forward_failure,
            forward_connections,
            forward_deadline_ms,
            forward_stall_after_ms,
            cluster_name,
            leader_ttl_s
        );
        take_optional!(
            cluster,
            cpu_list,
            rls_port,
            rls_threads,
            rls_config,
            rls_tls_cert,
            rls_tls_key,
            tls_port,
            tls_cert,
            tls_key,
            replica_tls_ca,
            replica_tls_name,
            replica_tls_port,
            replica_of,
            peer,
            advertise,
            coordinator,
            group,
            promote_after_ms,
            snapshot_dir,
            admin_port,
            resp_port,
            auth_token,
            auth_token_file
        );
        Ok(())
    }

    /// Re-reads the tiers from the `--config` file (what SIGHUP and RELOAD
    /// do). Other settings need a restart; the file must still be valid as a
    /// whole.
    pub fn reload_tiers(&self) -> Result<crate::tiers::Tiers, LoadError> {
        let Some(path) = &self.config else {
            return Ok(crate::tiers::Tiers::default());
        };
        let file = read_file(path)?;
        file_tiers(path, &file)
    }

    /// The defaults, exactly as `sluiced` with no arguments runs.
    pub fn defaults() -> Config {
        Config::parse_from(["sluiced"])
    }

    /// The shard count in force.
    pub fn shard_count(&self) -> u16 {
        self.shards.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            u16::try_from(cores).unwrap_or(SHARDS_MAX).min(SHARDS_MAX)
        })
    }

    /// Checks every field against its range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_limits()?;
        self.validate_rls()?;
        self.validate_cluster()?;
        self.validate_coordinator()
    }

    /// The listeners', connections', replies' and tables' limits, and the
    /// token's length.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        check("shards", self.shard_count(), 1, SHARDS_MAX)?;
        check("connections-max", self.connections_max, 1, 1_000_000)?;
        check(
            "frame-bytes-max",
            self.frame_bytes_max,
            HEADER_BYTES as u32,
            FRAME_BYTES_MAX_LIMIT,
        )?;
        check("batch-max", self.batch_max, 1, self.inflight_max.max(1))?;
        check("inflight-max", self.inflight_max, 1, 1 << 20)?;
        check("drain-ms", self.drain_ms, 0, 600_000)?;
        check("auth-timeout-ms", self.auth_timeout_ms, 1, 600_000)?;
        check("frame-timeout-ms", self.frame_timeout_ms, 1, 3_600_000)?;
        check("idle-timeout-ms", self.idle_timeout_ms, 0, 86_400_000)?;
        check("reply-bytes-max", self.reply_bytes_max, 1 << 10, 1 << 30)?;
        check(
            "reply-bytes-node-max",
            self.reply_bytes_node_max,
            1 << 10,
            1 << 40,
        )?;
        check("reply-timeout-ms", self.reply_timeout_ms, 1, 3_600_000)?;
        check("admin-timeout-ms", self.admin_timeout_ms, 1, 600_000)?;
        check(
            "admin-connections-max",
            self.admin_connections_max,
            1,
            10_000,
        )?;
        check("snapshot-interval-s", self.snapshot_interval_s, 0, 86_400)?;
        check("keys-max", self.keys_max, 0, 1 << 32)?;
        check("replica-timeout-ms", self.replica_timeout_ms, 1, 60_000)?;
        if let Some(ms) = self.promote_after_ms {
            check("promote-after-ms", ms, PROMOTE_AFTER_MS_MIN, 600_000)?;
        }
        if let Some(resp_port) = self.resp_port {
            if resp_port != 0 && resp_port == self.port {
                return Err(ConfigError {
                    field: "resp-port",
                    range: "0 or a port other than --port".to_owned(),
                    got: resp_port.to_string(),
                });
            }
        }
        if let Some(t) = &self.auth_token {
            check("auth-token length", t.len(), 1, TOKEN_BYTES_MAX)?;
        }
        self.validate_tls()
    }

    /// The binary port's TLS (`--tls-*`) and a follower's
    /// (`--replica-tls-*`).
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str, range: &str, got: String| ConfigError {
            field,
            range: range.to_owned(),
            got,
        };
        let shown = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or(String::new(), |p| p.display().to_string())
        };
        match (
            self.tls_port,
            self.tls_cert.is_some(),
            self.tls_key.is_some(),
        ) {
            (None, false, false) => {}
            (Some(port), true, true) => {
                if port != 0
                    && [
                        Some(self.port),
                        self.resp_port,
                        self.admin_port,
                        self.rls_port,
                    ]
                    .contains(&Some(port))
                {
                    return Err(bad(
                        "tls-port",
                        "a port no other listener uses",
                        port.to_string(),
                    ));
                }
            }
            (Some(port), _, _) => {
                return Err(bad(
                    "tls-port",
                    "given with --tls-cert and --tls-key",
                    port.to_string(),
                ))
            }
            (None, _, _) => {
                return Err(bad(
                    "tls-cert",
                    "given with --tls-port (and --tls-key)",
                    shown(&self.tls_cert) + &shown(&self.tls_key),
                ))
            }
        }
        if self.replica_tls_ca.is_none() {
            if let Some(name) = &self.replica_tls_name {
                return Err(bad(
                    "replica-tls-name",
                    "given with --replica-tls-ca",
                    name.clone(),
                ));
            }
            if let Some(port) = self.replica_tls_port {
                return Err(bad(
                    "replica-tls-port",
                    "given with --replica-tls-ca",
                    port.to_string(),
                ));
            }
        }
        Ok(())
    }

    /// The rate limit service's settings (`--rls-*`).
    fn validate_rls(&self) -> Result<(), ConfigError> {
        if let Some(n) = self.rls_threads {
            check("rls-threads", n, 0, SHARDS_MAX)?;
        }
        check("rls-connections-max", self.rls_connections_max, 1, 100_000)?;
        match (&self.rls_tls_cert, &self.rls_tls_key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError {
                    field: "rls-tls-cert",
                    range: "given with --rls-tls-key (both or neither)".to_owned(),
                    got: self
                        .rls_tls_cert
                        .as_ref()
                        .or(self.rls_tls_key.as_ref())
                        .map_or(String::new(), |p| p.display().to_string()),
                });
            }
            (Some(c), Some(_)) if self.rls_port.is_none() => {
                return Err(ConfigError {
                    field: "rls-tls-cert",
                    range: "given with --rls-port".to_owned(),
                    got: c.display().to_string(),
                });
            }
            _ => {}
        }
        check(
            "rls-request-timeout-ms",
            self.rls_request_timeout_ms,
            1,
            600_000,
        )?;
        check(
            "rls-buffer-bytes-max",
            self.rls_buffer_bytes_max,
            1 << 16,
            1 << 40,
        )?;
        check(
            "rls-over-limit-slots",
            self.rls_over_limit_slots,
            0,
            crate::shard::over_limit::SLOTS_MAX,
        )?;
        if let Some(port) = self.rls_port {
            let bad = |range: &str| ConfigError {
                field: "rls-port",
                range: range.to_owned(),
                got: port.to_string(),
            };
            if cfg!(not(feature = "rls")) {
                return Err(bad("unset: this sluiced was built without the rate limit service (cargo build --features sluice-server/rls)"));
            }
            if self.rls_config.is_none() {
                return Err(bad("given with --rls-config PATH (the rules to serve)"));
            }
            if port != 0 && [Some(self.port), self.resp_port, self.admin_port].contains(&Some(port))
            {
                return Err(bad("a port no other listener uses"));
            }
        }
        Ok(())
    }

    /// An entry point's settings (`--cluster`, `--forward-*`).
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        if let Some(c) = &self.cluster {
            if self.group.as_deref().map_or(true, str::is_empty) {
                return Err(ConfigError {
                    field: "cluster",
                    range: "given with --group NAME (the group this node is in)".to_owned(),
                    got: c.display().to_string(),
                });
            }
            check("forward-deadline-ms", self.forward_deadline_ms, 1, 60_000)?;
            check(
                "forward-stall-after-ms",
                self.forward_stall_after_ms,
                0,
                60_000,
            )?;
        }
        Ok(())
    }

    /// Leadership on etcd's settings (`--coordinator`, `--leader-ttl-s`).
    fn validate_coordinator(&self) -> Result<(), ConfigError> {
        if let Some(c) = &self.coordinator {
            let bad = |range: &str| ConfigError {
                field: "coordinator",
                range: range.to_owned(),
                got: c.clone(),
            };
            if cfg!(not(feature = "etcd")) {
                return Err(bad("unset: this sluiced was built without etcd (cargo build --features sluice-server/etcd; it needs protoc)"));
            }
            if c.strip_prefix("etcd://").map_or(true, str::is_empty) {
                return Err(bad("etcd://HOST:PORT[,HOST:PORT...]"));
            }
            if self.group.as_deref().map_or(true, str::is_empty) || self.advertise.is_none() {
                return Err(bad("given with --group NAME and --advertise HOST:PORT"));
            }
            if self.replica_of.is_some() || self.peer.is_some() || self.promote_after_ms.is_some() {
                return Err(bad(
                    "without --replica-of, --peer or --promote-after-ms (etcd decides)",
                ));
            }
            check("leader-ttl-s", self.leader_ttl_s, 1, 600)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_on_loopback() {
        let c = Config::defaults();
        c.validate().unwrap();
        assert!(c.bind.is_loopback());
        assert_eq!(c.port, PORT_DEFAULT);
    }

    #[test]
    fn out_of_range_names_the_flag() {
        let c = Config::parse_from(["sluiced", "--batch-max", "10", "--inflight-max", "5"]);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "batch-max");
        assert!(e.to_string().contains("--batch-max must be 1..=5"), "{e}");
        let c = Config::parse_from(["sluiced", "--shards", "0"]);
        assert_eq!(c.validate().unwrap_err().field, "shards");
        let c = Config::parse_from(["sluiced", "--frame-bytes-max", "7"]);
        assert_eq!(c.validate().unwrap_err().field, "frame-bytes-max");
    }

    #[test]
    fn file_settings_and_tiers_load_and_flags_win() {
        let dir = std::env::temp_dir().join(format!("sluice-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sluice.toml");
        std::fs::write(
            &path,
            "port = 7123\nkeys_max = 1000\ncpu_list = \"0-1\"\n[tiers.free]\nlimits = [\"token-bucket:10/s,burst=20\", \"concurrency:2\"]\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let c = Config::load(["sluiced", "--config", p]).unwrap();
        assert_eq!((c.port, c.keys_max), (7123, 1000));
        assert_eq!(c.cpu_list.map(|l| l.to_string()).as_deref(), Some("0,1"));
        assert_eq!(c.tiers.get(b"free").unwrap().set().len(), 2);
        let c = Config::load(["sluiced", "--config", p, "--port", "7000"]).unwrap();
        assert_eq!(c.port, 7000, "a flag wins over the file");
        std::fs::write(&path, "port = 1\nbogus = 2\n").unwrap();
        assert!(matches!(
            Config::load(["sluiced", "--config", p]),
            Err(LoadError::Parse { .. })
        ));
        std::fs::write(&path, "cpu_list = \"1-0\"\n").unwrap();
        let e = Config::load(["sluiced", "--config", p]).unwrap_err();
        assert!(
            e.to_string().contains("\"1-0\": expected CPU numbers"),
            "{e}"
        );
        std::fs::write(&path, "[tiers.free]\nlimits = [\"token-bucket:0/s\"]\n").unwrap();
        let e = Config::load(["sluiced", "--config", p]).unwrap_err();
        assert!(e.to_string().contains("tier \"free\", limit 0"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn coordinator_needs_group_and_advertise_and_excludes_the_pair_flags() {
        let base = ["sluiced", "--coordinator", "etcd://127.0.0.1:2379"];
        let with = |extra: &[&str]| {
            let mut args: Vec<&str> = base.to_vec();
            args.extend_from_slice(extra);
            Config::parse_from(args).validate()
        };
        assert_eq!(with(&[]).unwrap_err().field, "coordinator");
        let ok = ["--group", "g", "--advertise", "127.0.0.1:7700"];
        assert!(with(&ok).is_ok());
        let mut peer = ok.to_vec();
        peer.extend(["--peer", "127.0.0.1:7701"]);
        assert_eq!(with(&peer).unwrap_err().field, "coordinator");
        let mut ttl = ok.to_vec();
        ttl.extend(["--leader-ttl-s", "0"]);
        assert_eq!(with(&ttl).unwrap_err().field, "leader-ttl-s");
        let bad = Config::parse_from([
            "sluiced",
            "--coordinator",
            "http://x",
            "--group",
            "g",
            "--advertise",
            "a:1",
        ]);
        assert_eq!(bad.validate().unwrap_err().field, "coordinator");
        assert_eq!(
            crate::replication::etcd::endpoints("etcd://a:1,b:2"),
            ["http://a:1", "http://b:2"]
        );
    }

    #[test]
    fn resp_is_off_by_default_and_needs_its_own_port() {
        assert_eq!(Config::defaults().resp_port, None);
        let c = Config::parse_from(["sluiced", "--resp-port", "0"]);
        assert_eq!(c.resp_port, Some(0));
        c.validate().unwrap();
        let c = Config::parse_from(["sluiced", "--port", "7000", "--resp-port", "7000"]);
        assert_eq!(c.validate().unwrap_err().field, "resp-port");
    }
}
