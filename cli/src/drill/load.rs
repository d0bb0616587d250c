//! The drill's load: keys of every limit kind, a few hot ones pushed far
//! over their limits and many cold ones well under them, spent through the
//! cluster client by many concurrent callers at a set rate; and the record
//! of every verdict they got.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_client::{inline_limits, Cluster, Limits, Source};
use sluice_protocol::clock::{Clock, MonotonicClock};
use sluice_protocol::Limit;
use tokio::task::JoinSet;

/// The limit of each kind the drill's keys use, in order: token bucket,
/// fixed window, sliding log, sliding counter, concurrency. Hot keys see
/// far more than these allow; cold keys far less.
pub const POLICIES: [&str; 5] = [
    "token-bucket:10/s,burst=20",
    "fixed-window:20/2s",
    "sliding-log:20/2s",
    "sliding-counter:20/2s",
    "concurrency:4,lease=1s",
];

/// The most calls one caller has in flight (calls to a stopped node wait
/// for their deadline); at the cap, the caller skips its turn.
pub const INFLIGHT_PER_CALLER: usize = 64;

/// What the load looks like.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Decisions per second, over all callers.
    pub rate: f64,
    /// Concurrent callers.
    pub callers: usize,
    /// Hot keys per limit kind.
    pub hot_keys: usize,
    /// Cold keys per limit kind.
    pub cold_keys: usize,
    /// The share of calls that go to hot keys.
    pub hot_share: f64,
    /// Distinguishes this run's keys from any other's.
    pub prefix: String,
    /// Seeds the callers' key choices.
    pub seed: u64,
    /// Empty: spend through the cluster client (each key to its owner).
    /// Else the nodes' addresses: each call goes, over protocol v1, to one
    /// of them chosen at random (followers included), whose entry point
    /// forwards it to the key's owner (`sluiced --cluster`).
    pub entry_nodes: Vec<String>,
}

/// One key the drill spends.
#[derive(Clone, Debug)]
pub struct DrillKey {
    /// The routing key.
    pub name: String,
    /// Index into [`POLICIES`].
    pub kind: usize,
    /// Pushed over its limit.
    pub hot: bool,
}

/// Every key and its limits.
#[derive(Debug)]
pub struct Plan {
    /// Hot keys first (`hot_keys` per kind), then cold ones.
    pub keys: Vec<DrillKey>,
    /// The parsed policies, by kind.
    pub limits: Vec<Limit>,
    sets: Vec<Limits<'static>>,
    hot: usize,
}

impl Plan {
    /// The keys of `options`.
    pub fn new(options: &LoadOptions) -> Plan {
        let limits: Vec<Limit> = POLICIES
            .iter()
            .map(|p| p.parse().expect("the drill's policies parse"))
            .collect();
        let sets = limits
            .iter()
            .map(|l| inline_limits(std::slice::from_ref(l)).expect("one limit"))
            .collect();
        let short = ["tb", "fw", "sl", "sc", "cc"];
        let mut keys = Vec::new();
        for (hot, n) in [(true, options.hot_keys), (false, options.cold_keys)] {
            for (kind, short) in short.iter().enumerate() {
                for i in 0..n {
                    let heat = if hot { "hot" } else { "cold" };
                    keys.push(DrillKey {
                        name: format!("{}:{short}:{heat}:{i}", options.prefix),
                        kind,
                        hot,
                    });
                }
            }
        }
        Plan {
            keys,
            limits,
            sets,
            hot: options.hot_keys * POLICIES.len(),
        }
    }

    /// The key a caller spends next, for a random `r`.
    fn pick(&self, r: u64, hot_share: f64) -> usize {
        let cold = self.keys.len() - self.hot;
        let to_hot =
            self.hot > 0 && (cold == 0 || (r >> 11) as f64 / (1u64 << 53) as f64 <= hot_share);
        let r = r.rotate_left(17);
        if to_hot {
            (r % self.hot as u64) as usize
        } else {
            self.hot + (r % cold as u64) as usize
        }
    }
}

/// Where a verdict came from, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The group's primary.
    Store,
    /// The local fallback limiter.
    Local,
    /// Fail-open.
    Open,
    /// Fail-closed.
    Closed,
    /// No verdict at all: the call returned an error.
    Error,
}

impl Origin {
    /// `store`, `local`, `open`, `closed` or `error`.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Store => "store",
            Origin::Local => "local",
            Origin::Open => "open",
            Origin::Closed => "closed",
            Origin::Error => "error",
        }
    }
}

/// One verdict the drill got.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// When the call was sent, ns since the Unix epoch.
    pub send_ns: u64,
    /// When its verdict came.
    pub recv_ns: u64,
    /// Index into [`Plan::keys`].
    pub key: u32,
    /// Index into the node list the callers were given; `u16::MAX` for
    /// none (a fallback).
    pub node: u16,
    /// The group, by index of the topology.
    pub group: u16,
    /// The epoch the client knew for the group.
    pub epoch: u64,
    /// Who decided.
    pub origin: Origin,
    /// The verdict said allowed.
    pub allowed: bool,
    /// The store may have applied it without saying so.
    pub unknown: bool,
}

/// Runs the load until `stop`; returns every verdict.
pub async fn run(
    cluster: Arc<Cluster>,
    plan: Arc<Plan>,
    options: LoadOptions,
    nodes: Arc<HashMap<String, u16>>,
    groups: Arc<HashMap<String, u16>>,
    stop: Arc<AtomicBool>,
) -> Vec<Record> {
    let clock = MonotonicClock::new();
    let entries = Arc::new(connect_entries(&options.entry_nodes).await);
    let callers = options.callers.max(1);
    let period = Duration::from_secs_f64(callers as f64 / options.rate.max(1.0));
    let mut set = JoinSet::new();
    for c in 0..callers {
        let (cluster, plan, nodes, groups, stop, entries) = (
            cluster.clone(),
            plan.clone(),
            nodes.clone(),
            groups.clone(),
            stop.clone(),
            entries.clone(),
        );
        let hot_share = options.hot_share;
        let mut rng = options.seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        set.spawn(async move {
            let mut out = Vec::new();
            // Open loop: a call that hangs (its node stopped) does not hold
            // up the calls after it, as requests keep coming to a gateway
            // whatever its limiter does; up to INFLIGHT_PER_CALLER at once.
            let mut inflight = JoinSet::new();
            // Callers start spread over one period, not all at once.
            tokio::time::sleep(period.mul_f64(c as f64 / callers as f64)).await;
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                while let Some(done) = inflight.try_join_next() {
                    out.extend(done.ok());
                }
                if inflight.len() >= INFLIGHT_PER_CALLER {
                    continue;
                }
                let k = plan.pick(xorshift(&mut rng), hot_share);
                let (cluster, plan, nodes, groups) =
                    (cluster.clone(), plan.clone(), nodes.clone(), groups.clone());
                if entries.is_empty() {
                    inflight.spawn(async move {
                        call(&cluster, &plan, k, &nodes, &groups, clock).await
                    });
                } else {
                    let e = (xorshift(&mut rng) % entries.len() as u64) as usize;
                    let entry = entries[e].clone();
                    inflight.spawn(async move {
                        call_entry(&cluster, &plan, k, entry, &groups, clock).await
                    });
                }
            }
            while let Some(done) = inflight.join_next().await {
                out.extend(done.ok());
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(done) = set.join_next().await {
        if let Ok(records) = done {
            all.extend(records);
        }
    }
    all.sort_by_key(|r| r.send_ns);
    all
}

/// One call and its record.
async fn call(
    cluster: &Cluster,
    plan: &Plan,
    k: usize,
    nodes: &HashMap<String, u16>,
    groups: &HashMap<String, u16>,
    clock: MonotonicClock,
) -> Record {
    let key = &plan.keys[k];
    let send_ns = clock.now_ns();
    let got = cluster
        .spend(key.name.as_bytes(), plan.sets[key.kind], 1)
        .await;
    let recv_ns = clock.now_ns();
    match got {
        Ok(v) => Record {
            // A call refused unapplied (NOT_PRIMARY from a stale primary
            // that resumed) and sent again was decided after the resend:
            // the judge places the decision from then on.
            send_ns: send_ns + v.resent_after.map_or(0, |d| d.as_nanos() as u64),
            recv_ns,
            key: k as u32,
            node: v
                .node
                .as_ref()
                .and_then(|n| nodes.get(&**n).copied())
                .unwrap_or(u16::MAX),
            group: groups.get(&v.group).copied().unwrap_or(u16::MAX),
            epoch: v.epoch,
            origin: match v.source {
                Source::Store => Origin::Store,
                Source::Local => Origin::Local,
                Source::Open => Origin::Open,
                Source::Closed => Origin::Closed,
            },
            allowed: v.allowed(),
            unknown: v.outcome_unknown,
        },
        Err(_) => Record {
            send_ns,
            recv_ns,
            key: k as u32,
            node: u16::MAX,
            group: groups
                .get(&cluster.route(key.name.as_bytes()).0)
                .copied()
                .unwrap_or(u16::MAX),
            epoch: 0,
            origin: Origin::Error,
            allowed: false,
            unknown: false,
        },
    }
}

/// An entry node: its index in the node list, and a protocol v1 client
/// (not cluster-aware: the node forwards what it does not own).
type Entry = (u16, sluice_client::Client);

/// A client to each entry node (all up at the start of the load).
async fn connect_entries(addrs: &[String]) -> Vec<Entry> {
    let config = sluice_client::ClientConfig {
        deadline: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        ..sluice_client::ClientConfig::default()
    };
    let mut out = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        match sluice_client::Client::connect_with(addr.as_str(), config.clone()).await {
            Ok(c) => out.push((i as u16, c)),
            Err(e) => eprintln!("drill: entry node {addr}: {e}"),
        }
    }
    out
}

/// One call through an entry node and its record. The node that decided
/// is the owner's primary, which the entry does not name: the record
/// names the entry node and, for an answer, `u64::MAX` as the epoch (the
/// report then counts any answer after a fault as the group's recovery:
/// a killed primary answers nothing, a paused one nothing before SIGCONT,
/// and after it only NOT_PRIMARY).
async fn call_entry(
    cluster: &Cluster,
    plan: &Plan,
    k: usize,
    (node, client): Entry,
    groups: &HashMap<String, u16>,
    clock: MonotonicClock,
) -> Record {
    use sluice_protocol::Status;
    let key = &plan.keys[k];
    let send_ns = clock.now_ns();
    let got = client
        .decide(
            key.name.as_bytes(),
            plan.sets[key.kind],
            sluice_client::Mode::Spend,
            1,
        )
        .await;
    let recv_ns = clock.now_ns();
    let group = groups
        .get(&cluster.route(key.name.as_bytes()).0)
        .copied()
        .unwrap_or(u16::MAX);
    let mut r = Record {
        send_ns,
        recv_ns,
        key: k as u32,
        node,
        group,
        epoch: u64::MAX,
        origin: Origin::Store,
        allowed: false,
        unknown: false,
    };
    match got {
        Ok(d) => r.allowed = d.allowed,
        Err(e) => {
            r.origin = Origin::Error;
            r.epoch = 0;
            // Sent and not answered, here or between the entry and the
            // owner: it may have been applied.
            r.unknown = matches!(
                e,
                sluice_client::Error::Timeout(_) | sluice_client::Error::Disconnected
            ) || e.status() == Some(Status::OutcomeUnknown);
        }
    }
    r
}

/// xorshift64: the callers' key choices (seeded, repeatable).
pub fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}
