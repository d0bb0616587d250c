//! Start-up and shutdown: bind the listeners (protocol v1, and RESP when
//! `--resp-port` is given), start the shard threads, accept connections
//! and hand each to a shard (round robin across both listeners, each
//! counted against `connections_max`), and on shutdown drain every shard
//! (connections of both kinds) before stopping any.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use sluice_protocol::codec::FrameWriter;
use sluice_protocol::{message, MonotonicClock, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::config::{Config, ConfigError};
use crate::inbox;
use crate::mailbox::{Adopt, AdoptResp, ShardMsg};
use crate::node::Node;
use crate::shard::over_limit::OverLimit;
use crate::shard::ConnectionGuard;
use crate::sync::{Arc, AtomicUsize};
use crate::worker;

/// How long a refused connection is given to read its error before close.
const REFUSAL_LINGER_MS: u64 = 1_000;
/// What a RESP connection over `connections_max` is told (Redis's words).
const RESP_REFUSAL: &[u8] = b"-ERR max number of clients reached\r\n";

/// Which listener a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listener {
    /// Protocol v1.
    V1,
    /// RESP2.
    Resp,
    /// Protocol v1 over TLS (`--tls-port`).
    Tls,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start a shard thread: {0}")]
    Thread(std::io::Error),
    #[error("--rls-config {0}")]
    Rls(String),
    #[error("{0}")]
    RlsTls(String),
    #[error("{0}")]
    Tls(String),
    #[error("--cluster: {0}")]
    Cluster(String),
    #[error("snapshot {path}: {reason}; fix or remove the file, or start with --snapshot-ignore-corrupt to start empty (the next snapshot replaces it)")]
    Snapshot {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// Why the server stopped with a failure (after its drain).
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("the final snapshot was not written to {path}: {reason}; the snapshot on disk, if any, is older than the state clients were told (marked by sluiced.snapshot.failed beside it)")]
    Snapshot {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// A bound, running node whose acceptor has not started yet.
#[derive(Debug)]
pub struct Server {
    /// The protocol v1 listening socket.
    listener: TcpListener,
    /// The RESP listening socket, when `--resp-port` enabled it.
    resp_listener: Option<TcpListener>,
    /// Protocol v1 over TLS, when `--tls-port` enabled it.
    tls_listener: Option<(TcpListener, crate::stream::Acceptor)>,
    /// What the shards share.
    node: Arc<Node>,
    /// The shard threads, joined at shutdown.
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Shards report here once drained.
    drained_rx: inbox::Receiver<u16>,
    /// The admin HTTP listener, with --admin-port; served from `serve`.
    admin_listener: Option<TcpListener>,
    /// What it reads (the open-connection count lives there too).
    admin: Arc<crate::admin::AdminState>,
    /// Connections yet to authenticate (with --auth-token), oldest first.
    unauthed: Arc<crate::shard::Unauthed>,
    /// The rate limit service's listener and state, with --rls-port.
    #[cfg(feature = "rls")]
    rls: Option<(std::net::TcpListener, Arc<crate::rls::Rls>)>,
    /// SIGHUP's handler, installed at bind: a SIGHUP that comes right after
    /// the port is announced reloads instead of ending the process.
    hangup: Hangup,
}

impl Server {
    /// Validates `config`, binds, and starts the shard threads. Must be
    /// called inside a tokio runtime (the listener registers with it).
    pub fn bind(config: Config) -> Result<Server, StartError> {
        config.validate()?;
        let started = Instant::now();
        let listener = listen(SocketAddr::new(config.bind, config.port))?;
        let resp_listener = match config.resp_port {
            Some(port) => Some(listen(SocketAddr::new(config.bind, port))?),
            None => None,
        };
        let tls_listener = match (config.tls_port, &config.tls_cert, &config.tls_key) {
            (Some(port), Some(cert), Some(key)) => {
                let acceptor = crate::stream::acceptor(cert, key).map_err(StartError::Tls)?;
                Some((listen(SocketAddr::new(config.bind, port))?, acceptor))
            }
            _ => None,
        };
        let replica_tls = match &config.replica_tls_ca {
            Some(ca) => Some(
                crate::stream::connector(
                    ca,
                    config.replica_tls_name.clone(),
                    config.replica_tls_port,
                )
                .map_err(StartError::Tls)?,
            ),
            None => None,
        };
        let admin_listener = match config.admin_port {
            Some(port) => Some(listen(SocketAddr::new(config.bind, port))?),
            None => None,
        };
        // The rules are checked before anything starts.
        #[cfg(feature = "rls")]
        let rls_start = RlsStart::bind(&config)?;
        let shard_count = config.shard_count();
        check_cpu_list(&config)?;
        let clock = MonotonicClock::new();
        let (drained_tx, drained_rx) = inbox::inbox();
        let shards = Shards::spawn(&config, shard_count, &drained_tx, clock)?;
        let node_id = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let repl = crate::replication::ReplNode::new(
            config.replica_of.as_deref(),
            config.peer.as_deref(),
            bound_addr(&listener).to_string(),
            config.replication,
            config.coordinator.is_some(),
        );
        let forward = start_forwarder(&config, &listener)?;
        // Read only by the rate limit service: without it, nothing is
        // published.
        let over_limit_slots = match config.rls_port {
            Some(_) => config.rls_over_limit_slots,
            None => 0,
        };
        let node = Arc::new(Node {
            config,
            shard_count,
            node_id,
            repl,
            shards: shards.senders,
            addr: bound_addr(&listener),
            resp_addr: resp_listener.as_ref().map(bound_addr),
            started,
            stats: (0..shard_count).map(|_| Default::default()).collect(),
            over_limit: (0..shard_count)
                .map(|_| Arc::new(OverLimit::new(over_limit_slots)))
                .collect(),
            forward,
            auth_failures: Default::default(),
            replica_tls,
        });
        for tx in shards.node_txs {
            tx.send(node.clone())
                .expect("a shard thread waits for its node");
        }
        if let Some(dir) = node.config.snapshot_dir.clone() {
            load_snapshot(&node, &dir)?;
        }
        let admin = Arc::new(admin_state(&node, clock));
        #[cfg(feature = "rls")]
        let rls = match rls_start {
            Some(start) => Some(start.start(&node, clock, admin.rls.clone())?),
            None => None,
        };
        Ok(Server {
            #[cfg(feature = "rls")]
            rls,
            listener,
            resp_listener,
            tls_listener,
            admin_listener,
            admin,
            node,
            drained_rx,
            threads: shards.threads,
            unauthed: Arc::default(),
            hangup: Hangup::new(),
        })
    }

    /// The address actually bound (the port is real even when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.node.addr
    }

    /// The admin listener's address, when `--admin-port` enabled it.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener.as_ref().map(bound_addr)
    }

    /// The RESP listener's address, when `--resp-port` enabled it.
    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.node.resp_addr
    }

    /// The TLS listener's address, when `--tls-port` enabled it.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_listener.as_ref().map(|(l, _)| bound_addr(l))
    }

    /// The rate limit service's address, when `--rls-port` enabled it.
    pub fn rls_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "rls")]
        if let Some((listener, _)) = &self.rls {
            return listener.local_addr().ok();
        }
        None
    }

    /// How many shards serve.
    pub fn shard_count(&self) -> u16 {
        self.node.shard_count
    }

    /// Accepts connections until `shutdown` completes, then drains and
    /// stops every shard and joins their threads. `Err` when the final
    /// snapshot could not be written (the process should then exit with a
    /// failure: what is on disk is older than what clients were told).
    pub async fn serve(mut self, shutdown: impl Future<Output = ()>) -> Result<(), StopError> {
        tokio::pin!(shutdown);
        if let Some(listener) = self.admin_listener.take() {
            tokio::spawn(crate::admin::serve(listener, self.admin.clone()));
        }
        #[cfg(feature = "rls")]
        let rls = self.start_rls();
        let snapshots = Arc::new(tokio::sync::Mutex::new(()));
        self.spawn_periodic_snapshots(&snapshots);
        let mut next_shard = 0usize;
        let mut hangup = std::mem::replace(&mut self.hangup, Hangup::none());
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => (Listener::V1, accepted),
                accepted = accept(self.resp_listener.as_ref()) => (Listener::Resp, accepted),
                accepted = accept(self.tls_listener.as_ref().map(|(l, _)| l)) => (Listener::Tls, accepted),
                () = hangup.recv() => {
                    #[cfg(feature = "rls")]
                    let rls_only = match &rls {
                        Some(rls) => {
                            let _ = rls.reload("SIGHUP");
                            self.node.config.config.is_none()
                        }
                        None => false,
                    };
                    #[cfg(not(feature = "rls"))]
                    let rls_only = false;
                    // Logged either way by reload_tiers (a node with no
                    // config file says it has nothing to reload, unless
                    // the signal was for the rate limit rules alone).
                    if !rls_only {
                        let _ = self.node.reload_tiers("SIGHUP");
                    }
                    continue;
                }
                () = &mut shutdown => break,
            };
            match accepted {
                (kind, Ok((stream, _peer))) => {
                    self.adopt(kind, stream, next_shard);
                    next_shard = (next_shard + 1) % self.node.shards.len();
                }
                (_, Err(e)) => {
                    // Out of descriptors and the like: back off briefly
                    // rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        tracing::info!("shutting down: draining connections");
        self.admin
            .draining
            .store(true, crate::sync::Ordering::Release);
        drop(self.listener);
        drop(self.resp_listener);
        drop(self.tls_listener);
        drain_shards(&self.node, &mut self.drained_rx).await;
        let stopped = final_snapshot(&self.node, &self.admin, &snapshots).await;
        for tx in &self.node.shards {
            let _ = tx.send(ShardMsg::Stop);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        tracing::info!("stopped");
        stopped
    }

    /// Starts the rate limit service's threads (`--rls-port`); returns
    /// the service, for SIGHUP to reload its rules.
    #[cfg(feature = "rls")]
    fn start_rls(&mut self) -> Option<Arc<crate::rls::Rls>> {
        let (listener, rls) = self.rls.take()?;
        // By default on the shard threads: a call is decided where it was
        // read, for the keys its shard owns, and forwarded from there for
        // other groups' (each thread has its own connections). With
        // `--forward-connections shared` one thread of its own, the
        // forwarder's, where those connections live (benches/notes.md).
        let shared =
            self.node.config.forward_connections == crate::config::ForwardConnections::Shared;
        let default = if self.node.forward.is_some() && shared {
            1
        } else {
            0
        };
        let threads = self.node.config.rls_threads.unwrap_or(default);
        let stats = self.admin.rls.clone();
        if let Err(e) = crate::rls::start(listener, rls.clone(), stats, threads) {
            tracing::error!(error = %e, "cannot start the rate limit service's threads");
        }
        Some(rls)
    }

    /// With `--snapshot-dir` and `--snapshot-interval-s` above 0: a task
    /// that writes a snapshot every interval, one at a time under `lock`.
    fn spawn_periodic_snapshots(&self, lock: &Arc<tokio::sync::Mutex<()>>) {
        let interval_s = self.node.config.snapshot_interval_s;
        if let (Some(dir), true) = (self.node.config.snapshot_dir.clone(), interval_s > 0) {
            let (node, lock, admin) = (self.node.clone(), lock.clone(), self.admin.clone());
            tokio::spawn(async move {
                let period = Duration::from_secs(interval_s);
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let _one_at_a_time = lock.lock().await;
                    // Logged and marked on disk by write_snapshot; the
                    // next tick tries again.
                    let _ = write_snapshot(&node, &admin, &dir, "periodic").await;
                }
            });
        }
    }

    fn adopt(&self, kind: Listener, stream: TcpStream, shard: usize) {
        let needs_auth = self.node.config.auth_token.is_some();
        let guard =
            match ConnectionGuard::try_new(&self.admin.open, self.node.config.connections_max) {
                Some(guard) => guard,
                None if needs_auth && self.unauthed.evict_oldest() => {
                    tracing::debug!(
                        ?kind,
                        "at the connection limit: the oldest unauthenticated connection makes room"
                    );
                    ConnectionGuard::in_place_of_another(&self.admin.open)
                }
                None => {
                    tracing::warn!(
                        connections_max = self.node.config.connections_max,
                        ?kind,
                        "refusing a connection"
                    );
                    self.admin
                        .refused
                        .fetch_add(1, crate::sync::Ordering::Relaxed);
                    tokio::spawn(refuse(stream, kind));
                    return;
                }
            };
        let guard = if needs_auth {
            guard.awaiting_auth(&self.unauthed)
        } else {
            guard
        };
        let _ = stream.set_nodelay(true);
        if let (Listener::Tls, Some((_, acceptor))) = (kind, &self.tls_listener) {
            // The handshake on this runtime (its CPU is not a shard's),
            // within the time a client has to authenticate, holding the
            // connection's slot; then the session moves to its shard.
            let (node, acceptor) = (self.node.clone(), acceptor.clone());
            tokio::spawn(async move {
                let limit = Duration::from_millis(node.config.auth_timeout_ms);
                let session = match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                    Ok(Ok(session)) => session,
                    Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => return tracing::debug!("TLS handshake timed out"),
                };
                match session.park() {
                    Ok(moving) => adopt_v1(&node, shard, moving, guard),
                    Err(e) => tracing::warn!(error = %e, "could not hand a connection over"),
                }
            });
            return;
        }
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "could not hand a connection over"),
        };
        match kind {
            Listener::V1 | Listener::Tls => {
                adopt_v1(
                    &self.node,
                    shard,
                    crate::stream::Moving::Plain(stream),
                    guard,
                );
            }
            Listener::Resp => {
                // Refused only while shutting down; the socket then just
                // closes.
                let _ =
                    self.node.shards[shard].send(ShardMsg::AdoptResp(AdoptResp { stream, guard }));
            }
        }
    }
}

/// Hands a protocol v1 connection (plain or TLS) to `shard`.
fn adopt_v1(node: &Node, shard: usize, stream: crate::stream::Moving, guard: ConnectionGuard) {
    let msg = ShardMsg::Adopt(Adopt {
        stream,
        read_buf: BytesMut::new(),
        hello_request_id: None,
        authed: node.config.auth_token.is_none(),
        forwarded: None,
        guard,
    });
    // Refused only while shutting down; the socket then just closes.
    let _ = node.shards[shard].send(msg);
}

/// The rate limit service's socket, rules and TLS, bound and read before
/// anything starts.
#[cfg(feature = "rls")]
struct RlsStart {
    /// `--rls-port`'s socket.
    listener: TcpListener,
    /// `--rls-config`'s rules, checked.
    rules: crate::rls::rules::Rules,
    /// `--rls-tls-cert` and `--rls-tls-key`, read and checked.
    tls: Option<crate::stream::Acceptor>,
}

#[cfg(feature = "rls")]
impl RlsStart {
    /// Binds `--rls-port` and reads its rules and TLS, when it is given.
    fn bind(config: &Config) -> Result<Option<RlsStart>, StartError> {
        let (Some(port), Some(path)) = (config.rls_port, &config.rls_config) else {
            return Ok(None);
        };
        Ok(Some(RlsStart {
            listener: listen(SocketAddr::new(config.bind, port))?,
            rules: crate::rls::rules::Rules::load(path)
                .map_err(|e| StartError::Rls(e.to_string()))?,
            tls: match (&config.rls_tls_cert, &config.rls_tls_key) {
                (Some(cert), Some(key)) => {
                    Some(crate::rls::load_tls(cert, key).map_err(StartError::RlsTls)?)
                }
                _ => None,
            },
        }))
    }

    /// The service over `node`, and its socket, handed off this runtime
    /// (it is served from its own runtime's threads).
    fn start(
        self,
        node: &Arc<Node>,
        clock: MonotonicClock,
        stats: Arc<crate::admin::RlsStats>,
    ) -> Result<(std::net::TcpListener, Arc<crate::rls::Rls>), StartError> {
        let rls = crate::rls::Rls::new(node.clone(), clock, self.rules, self.tls, stats);
        let listener = self.listener.into_std().map_err(StartError::Thread)?;
        Ok((listener, Arc::new(rls)))
    }
}

/// `--cpu-list` names only CPUs this process may run on.
fn check_cpu_list(config: &Config) -> Result<(), StartError> {
    let Some(list) = &config.cpu_list else {
        return Ok(());
    };
    let bad = |range: String| ConfigError {
        field: "cpu-list",
        range,
        got: list.to_string(),
    };
    let allowed = crate::affinity::allowed().map_err(|e| bad(format!("unset here ({e})")))?;
    if let Some(cpu) = list.outside(&allowed) {
        return Err(bad(format!(
            "CPUs this process may run on ({}; CPU {cpu} is not)",
            crate::affinity::CpuList::from_cpus(allowed)
        ))
        .into());
    }
    Ok(())
}

/// The shard threads, started, each waiting to be sent its node.
struct Shards {
    /// Each shard's inbox.
    senders: Vec<inbox::Sender<ShardMsg>>,
    /// Where each shard thread waits for the node.
    node_txs: Vec<crate::sync::mpsc::Sender<Arc<Node>>>,
    /// The threads, joined at shutdown.
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Shards {
    /// Starts `shard_count` shard threads (pinned per `--cpu-list`), each
    /// reporting its drain on `drained_tx`.
    fn spawn(
        config: &Config,
        shard_count: u16,
        drained_tx: &inbox::Sender<u16>,
        clock: MonotonicClock,
    ) -> Result<Shards, StartError> {
        let mut shards = Shards {
            senders: Vec::new(),
            node_txs: Vec::new(),
            threads: Vec::new(),
        };
        for id in 0..shard_count {
            let (tx, rx) = inbox::inbox();
            let (node_tx, node_rx) = crate::sync::mpsc::channel();
            let cpu = config.cpu_list.as_ref().map(|l| l.for_shard(id));
            let thread = worker::spawn(id, cpu, rx, node_rx, drained_tx.clone(), clock)
                .map_err(StartError::Thread)?;
            shards.senders.push(tx);
            shards.node_txs.push(node_tx);
            shards.threads.push(thread);
        }
        Ok(shards)
    }
}

/// The forwarder of an entry point: with `--cluster FILE`, or etcd's
/// layout with `--coordinator` (every node an entry point).
fn start_forwarder(
    config: &Config,
    listener: &TcpListener,
) -> Result<Option<Arc<crate::forward::Forwarder>>, StartError> {
    if config.cluster.is_none() && config.coordinator.is_none() {
        return Ok(None);
    }
    let own = config
        .advertise
        .clone()
        .unwrap_or_else(|| bound_addr(listener).to_string());
    Ok(Some(
        crate::forward::Forwarder::start(config, own).map_err(StartError::Cluster)?,
    ))
}

/// What the admin endpoints read, every count at 0.
fn admin_state(node: &Arc<Node>, clock: MonotonicClock) -> crate::admin::AdminState {
    crate::admin::AdminState {
        node: node.clone(),
        open: Arc::new(AtomicUsize::new(0)),
        refused: Arc::new(crate::sync::AtomicU64::new(0)),
        draining: crate::sync::AtomicBool::new(false),
        clock,
        snapshot: Default::default(),
        snapshot_failures: crate::sync::AtomicU64::new(0),
        admin_open: Arc::new(AtomicUsize::new(0)),
        admin_refused: crate::sync::AtomicU64::new(0),
        rls: Default::default(),
    }
}

/// Tells every shard to drain its connections, and waits until all have
/// (at most `--drain-ms`).
async fn drain_shards(node: &Node, drained_rx: &mut inbox::Receiver<u16>) {
    for tx in &node.shards {
        let _ = tx.send(ShardMsg::Drain);
    }
    let drain = Duration::from_millis(node.config.drain_ms);
    let mut drained = 0;
    let all_drained = tokio::time::timeout(drain, async {
        let mut ids = Vec::new();
        while drained < node.shards.len() && drained_rx.recv_many(&mut ids).await {
            drained += ids.len();
            ids.clear();
        }
    });
    if all_drained.await.is_err() {
        tracing::warn!(
            drain_ms = node.config.drain_ms,
            "drain timed out; closing the rest"
        );
    }
}

/// With `--snapshot-dir`: the snapshot written once every connection is
/// done, so the table on disk is what clients were told.
async fn final_snapshot(
    node: &Arc<Node>,
    admin: &crate::admin::AdminState,
    lock: &tokio::sync::Mutex<()>,
) -> Result<(), StopError> {
    let Some(dir) = node.config.snapshot_dir.clone() else {
        return Ok(());
    };
    // Every connection is done: the table is what clients were told.
    let _one_at_a_time = lock.lock().await;
    write_snapshot(node, admin, &dir, "shutdown")
        .await
        .map_err(|reason| StopError::Snapshot {
            path: crate::snapshot::path(&dir),
            reason,
        })
}

/// Loads `dir`'s snapshot, if there is one, into the shards (before any
/// connection): all of it checked first, each bucket to the shard that owns
/// it now.
fn load_snapshot(node: &Node, dir: &std::path::Path) -> Result<(), StartError> {
    let path = crate::snapshot::path(dir);
    let marker = crate::snapshot::failed_path(dir);
    if let Some(what) = crate::snapshot::read_failed(dir) {
        tracing::warn!(
            marker = %marker.display(),
            what = what.trim_end(),
            "the last snapshot write failed: the snapshot loaded (if any) is older than the node's last state, so buckets spent after it come back refilled; the marker goes with the next snapshot written"
        );
    }
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %path.display(), "no snapshot yet: starting empty");
            return Ok(());
        }
        Err(e) => {
            return Err(StartError::Snapshot {
                path,
                reason: e.to_string(),
            })
        }
    };
    let started = Instant::now();
    // Each record goes to the shard that owns its bucket now, as it is
    // read (none is used unless the whole file checks).
    let count = node.shard_count;
    let mut per_shard: Vec<Vec<_>> = (0..count).map(|_| Vec::new()).collect();
    let hint = crate::snapshot::records_hint(&bytes);
    for v in &mut per_shard {
        // Hashes spread evenly: a little over an even part each.
        v.reserve_exact(hint / usize::from(count) + hint / (usize::from(count) * 64) + 16);
    }
    let mut records = 0usize;
    let decoded = crate::snapshot::decode_with(&bytes, |r| {
        records += 1;
        per_shard[usize::from(sluice_protocol::routing::shard_of(r.key, count))].push(r);
    });
    drop(bytes);
    let loaded = match decoded {
        Ok(l) => l,
        Err(e) if node.config.snapshot_ignore_corrupt => {
            tracing::warn!(path = %path.display(), error = %e, "snapshot unusable: starting empty (--snapshot-ignore-corrupt)");
            return Ok(());
        }
        Err(e) => {
            return Err(StartError::Snapshot {
                path,
                reason: e.to_string(),
            })
        }
    };
    node.repl.observe_epoch(loaded.epoch);
    let (done_tx, done_rx) = crate::sync::mpsc::channel();
    for (tx, records) in node.shards.iter().zip(per_shard) {
        let _ = tx.send(ShardMsg::Load(records, done_tx.clone()));
    }
    drop(done_tx);
    for _ in 0..count {
        let _ = done_rx.recv();
    }
    tracing::info!(
        path = %path.display(),
        buckets = records,
        written_by_shards = loaded.shard_count,
        ms = started.elapsed().as_millis() as u64,
        "snapshot loaded"
    );
    Ok(())
}

/// Asks every shard for its buckets and writes them as `dir`'s snapshot
/// (the file on a blocking thread); logs the outcome. A failure counts in
/// `sluice_snapshot_failures_total` and leaves the marker
/// `sluiced.snapshot.failed` (a success removes it); `Err` says why.
async fn write_snapshot(
    node: &Arc<Node>,
    admin: &crate::admin::AdminState,
    dir: &std::path::Path,
    why: &str,
) -> Result<(), String> {
    let written = write_snapshot_file(node, admin, dir, why).await;
    let marked = match &written {
        Ok(()) => crate::snapshot::clear_failed(dir),
        Err(error) => {
            admin
                .snapshot_failures
                .fetch_add(1, crate::sync::Ordering::Relaxed);
            let now_ns = sluice_protocol::Clock::now_ns(&MonotonicClock::new());
            tracing::error!(
                why,
                %error,
                path = %crate::snapshot::path(dir).display(),
                "snapshot not written: the snapshot on disk, if any, is older than the node's state"
            );
            crate::snapshot::mark_failed(dir, why, error, now_ns)
        }
    };
    if let Err(e) = marked {
        let marker = crate::snapshot::failed_path(dir);
        tracing::warn!(path = %marker.display(), error = %e, "cannot update the snapshot failure marker");
    }
    written
}

/// [`write_snapshot`] without the failure's bookkeeping.
async fn write_snapshot_file(
    node: &Arc<Node>,
    admin: &crate::admin::AdminState,
    dir: &std::path::Path,
    why: &str,
) -> Result<(), String> {
    let started = Instant::now();
    let mut waits = Vec::new();
    for tx in &node.shards {
        let (done, rx) = crate::inbox::oneshot();
        if tx.send(ShardMsg::Snapshot(done)).is_ok() {
            waits.push(rx);
        }
    }
    let mut parts = Vec::new();
    for rx in waits {
        match rx.recv().await {
            Some(part) => parts.push(part),
            None => return Err("a shard did not answer the snapshot".into()),
        }
    }
    let collect_ms = started.elapsed().as_millis() as u64;
    let buckets: u64 = parts.iter().map(|p| p.0).sum();
    let written_ns = sluice_protocol::Clock::now_ns(&MonotonicClock::new());
    let (epoch, shards, dir) = (node.epoch(), node.shard_count, dir.to_owned());
    // Sealing (a checksum over every chunk) and writing, off the runtime.
    let wrote = tokio::task::spawn_blocking(move || {
        let image = crate::snapshot::Image::new(epoch, shards, written_ns, parts);
        crate::snapshot::write_atomic(&dir, &image).map(|()| image.file_bytes())
    })
    .await;
    let written = match wrote {
        Ok(w) => w.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let size = written?;
    let took_us = started.elapsed().as_micros() as u64;
    for (slot, v) in admin
        .snapshot
        .iter()
        .zip([written_ns, took_us, buckets, size])
    {
        slot.store(v, crate::sync::Ordering::Relaxed);
    }
    tracing::info!(
        why,
        buckets,
        bytes = size,
        ms = took_us / 1_000,
        collect_ms,
        "snapshot written"
    );
    Ok(())
}

/// Binds a non-blocking listener on `addr` (inside the runtime).
fn listen(addr: SocketAddr) -> Result<TcpListener, StartError> {
    let std_listener =
        std::net::TcpListener::bind(addr).map_err(|source| StartError::Bind { addr, source })?;
    std_listener
        .set_nonblocking(true)
        .map_err(|source| StartError::Bind { addr, source })?;
    TcpListener::from_std(std_listener).map_err(|source| StartError::Bind { addr, source })
}

/// The address a listener actually bound (the port is real even when 0 was
/// asked).
fn bound_addr(listener: &TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .expect("a bound listener has an address")
}

/// Accepts on `listener`; never resolves when there is none.
async fn accept(
    listener: Option<&TcpListener>,
) -> std::io::Result<(TcpStream, std::net::SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Tells a connection over the limit why it is closed, in its listener's
/// protocol, then closes it, reading (and dropping) what it sent meanwhile
/// so the close is clean.
async fn refuse(mut stream: TcpStream, kind: Listener) {
    let mut buf = BytesMut::new();
    match kind {
        // A TLS client would read clear bytes as a broken record: it is
        // just closed.
        Listener::Tls => return,
        Listener::V1 => {
            let mut w = FrameWriter::new();
            message::put_error(
                &mut w,
                &mut buf,
                0,
                Status::TooManyConnections,
                Status::TooManyConnections.text(),
            );
            w.finish(&mut buf);
        }
        Listener::Resp => buf.extend_from_slice(RESP_REFUSAL),
    }
    let _ = stream.try_write(&buf);
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let linger = tokio::time::sleep(Duration::from_millis(REFUSAL_LINGER_MS));
    tokio::pin!(linger);
    loop {
        tokio::select! {
            n = stream.read(&mut sink) => if !matches!(n, Ok(n) if n > 0) { break },
            () = &mut linger => break,
        }
    }
}

/// SIGHUP, where the platform has it: the operator's "reload the tiers".
#[derive(Debug)]
struct Hangup {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    fn new() -> Hangup {
        #[cfg(unix)]
        {
            let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
            if let Err(e) = &signal {
                tracing::warn!(error = %e, "no SIGHUP handler; reload with the RELOAD request");
            }
            Hangup {
                signal: signal.ok(),
            }
        }
        #[cfg(not(unix))]
        Hangup {}
    }

    /// No handler: `recv` never resolves.
    fn none() -> Hangup {
        Hangup {
            #[cfg(unix)]
            signal: None,
        }
    }

    /// Resolves at each SIGHUP; never, without a handler.
    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(s) = &mut self.signal {
            if s.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await;
    }
}
