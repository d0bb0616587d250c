//! Replication helpers: start a primary and its follower, ask a node its
//! role and wait for a role to hold, a TCP proxy the test can sever (a cut
//! link), and the spend workload of the failover tests (many concurrent
//! callers on one key, counting what they were told).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_client::{Client, ClientConfig, Error, Limits, RoleOk, Status};
use tokio::task::JoinSet;

/// The drill's TCP proxy (a cut link): `sever` drops every connection and
/// refuses new ones, `mend` lets them through again.
pub use sluice_cli::drill::proxy::Proxy;

use crate::support::Sluiced;

/// A client with deadlines generous enough for debug builds on shared
/// machines, one connection (the server forwards), for control calls.
pub async fn control(addr: SocketAddr) -> Result<Client, Error> {
    let config = ClientConfig {
        deadline: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        shard_aware: false,
        ..ClientConfig::default()
    };
    Client::connect_with(addr, config).await
}

/// The node's ROLE.
pub async fn role(addr: SocketAddr) -> Result<RoleOk, Error> {
    control(addr).await?.role().await
}

/// Polls ROLE until `pred` holds; panics after `timeout`.
pub async fn wait_role(
    addr: SocketAddr,
    timeout: Duration,
    pred: impl Fn(&RoleOk) -> bool,
) -> RoleOk {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        match role(addr).await {
            Ok(r) if pred(&r) => return r,
            other => last = Some(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{addr}: role never became as expected; last {last:?}");
}

/// Whether a node's role says it streams (full sync done).
pub fn streaming(r: &RoleOk) -> bool {
    r.state == sluice_client::ReplState::Streaming
}

/// Starts a primary with `primary_args`, then its follower with
/// `follower_args` and `--replica-of`, and waits until both stream.
pub async fn start_pair(primary_args: &[&str], follower_args: &[&str]) -> (Sluiced, Sluiced) {
    let primary = Sluiced::start(primary_args);
    let of = primary.addr.to_string();
    let mut args = vec!["--replica-of", of.as_str()];
    args.extend_from_slice(follower_args);
    let follower = Sluiced::start(&args);
    wait_role(follower.addr, Duration::from_secs(20), streaming).await;
    wait_role(primary.addr, Duration::from_secs(20), streaming).await;
    (primary, follower)
}

/// What a spend workload was told.
#[derive(Debug, Default)]
pub struct Tally {
    /// Verdicts that said allowed.
    pub admitted: AtomicU64,
    /// Calls that got no verdict (error, timeout, lost connection): each
    /// may or may not have been applied.
    pub unknown: AtomicU64,
    /// Calls refused with NOT_PRIMARY (not applied).
    pub not_primary: AtomicU64,
    /// When each admission was seen.
    pub admitted_at: Mutex<Vec<Instant>>,
}

impl Tally {
    /// Admissions seen so far.
    pub fn admitted(&self) -> u64 {
        self.admitted.load(Ordering::Relaxed)
    }

    /// Calls without a verdict so far.
    pub fn unknown(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }
}

/// How a phase of the workload ends for each caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// At the first call without a verdict (the node died).
    Error,
    /// At the first denial (the limit is spent).
    Denied,
}

/// `callers` concurrent callers (over 8 clients) spend 1 unit of `key`
/// under `limits` through `addr` in a loop, until `until`; NOT_PRIMARY
/// answers make a caller pause and go on (a planned failover switches
/// `target` to the new primary). Returns when every caller has stopped or
/// `deadline` passed.
pub async fn spend(
    target: Arc<Mutex<SocketAddr>>,
    key: &'static [u8],
    limits: Limits<'static>,
    tally: Arc<Tally>,
    callers: usize,
    until: Until,
    deadline: Duration,
) {
    let start = Instant::now();
    let config = ClientConfig {
        deadline: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let mut clients = Vec::new();
    for _ in 0..8 {
        let addr = *target.lock().unwrap();
        let client = Client::connect_with(addr, config.clone()).await;
        clients.push(client.expect("connect"));
    }
    let mut set = JoinSet::new();
    for c in 0..callers {
        let mut client = clients[c % clients.len()].clone();
        let tally = tally.clone();
        let target = target.clone();
        let config = config.clone();
        set.spawn(async move {
            let mut connected_to = *target.lock().unwrap();
            while start.elapsed() < deadline {
                let now_target = *target.lock().unwrap();
                if now_target != connected_to {
                    match Client::connect_with(now_target, config.clone()).await {
                        Ok(c) => {
                            client = c;
                            connected_to = now_target;
                        }
                        Err(_) => continue,
                    }
                }
                match client.spend(key, limits, 1).await {
                    Ok(ok) if ok.allowed => {
                        tally.admitted.fetch_add(1, Ordering::Relaxed);
                        tally.admitted_at.lock().unwrap().push(Instant::now());
                    }
                    Ok(_) if until == Until::Denied => return,
                    Ok(_) => {}
                    Err(Error::Server {
                        status: Some(Status::NotPrimary),
                        ..
                    }) => {
                        tally.not_primary.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(e) => {
                        if std::env::var_os("SLUICE_TEST_VERBOSE").is_some() {
                            eprintln!("spend: no verdict: {e}");
                        }
                        tally.unknown.fetch_add(1, Ordering::Relaxed);
                        if until == Until::Error {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
}
