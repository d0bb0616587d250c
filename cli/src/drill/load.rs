//! The drill's load: keys of every limit kind, a few hot ones pushed far
//! over their limits and many cold ones well under them, spent by many
//! concurrent callers at a set rate through the cluster client or through
//! the nodes' entry points (protocol v1, RESP's CL.THROTTLE or Envoy's
//! rate limit service); and the record of every verdict they got.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_client::{inline_limits, Cluster, Limits, Source};
use sluice_protocol::clock::{Clock, MonotonicClock};
use sluice_protocol::limit::Kind;
use sluice_protocol::Limit;
use tokio::task::JoinSet;

use super::resp::{self, CellArgs};
use super::EntryArg;

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

/// The limits with `--entry resp`: CL.THROTTLE says only a token bucket
/// (`CL.THROTTLE key 19 10 1 1`: redis-cell's bucket holds `max_burst +
/// 1`, and its interval, 1 s / 10, is whole nanoseconds, so its GCRA is
/// exactly this one; see [`CellArgs::of`]).
pub const RESP_POLICIES: [&str; 1] = ["token-bucket:10/s,burst=20"];

/// The limits with `--entry rls`: what a rule file's `rate_limit` says
/// (`requests_per_unit` per one unit; a token bucket's burst is its count;
/// no concurrency), each kind it has ([`super::rls::rate_limit`]).
pub const RLS_POLICIES: [&str; 4] = [
    "token-bucket:20/s,burst=20",
    "fixed-window:20/1s",
    "sliding-log:20/1s",
    "sliding-counter:20/1s",
];

/// The policies the load through `entry` uses.
pub fn policies(entry: EntryArg) -> &'static [&'static str] {
    match entry {
        EntryArg::Client | EntryArg::V1 => &POLICIES,
        EntryArg::Resp => &RESP_POLICIES,
        EntryArg::Rls => &RLS_POLICIES,
    }
}

/// The limit kinds of `entry`'s load: each kind's short name (in key
/// names and, with `--entry rls`, the rule's descriptor key) and its
/// limit.
pub fn kinds(entry: EntryArg) -> Vec<(&'static str, Limit)> {
    policies(entry)
        .iter()
        .map(|p| {
            let limit: Limit = p.parse().expect("the drill's policies parse");
            let short = match limit.kind() {
                Kind::TokenBucket => "tb",
                Kind::FixedWindow => "fw",
                Kind::SlidingLog => "sl",
                Kind::SlidingCounter => "sc",
                Kind::Concurrency => "cc",
            };
            (short, limit)
        })
        .collect()
}

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
    /// How the calls reach the cluster: the cluster client (each key to
    /// its owner), or the entry points of `entry_nodes`.
    pub entry: EntryArg,
    /// Without [`EntryArg::Client`]: each node's address for `entry`'s
    /// protocol (its v1, RESP or rate limit port), by node index. Each
    /// call goes to one of them chosen at random (followers included),
    /// whose entry point forwards it to the key's owner (`sluiced
    /// --cluster`).
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
    /// The policies, by kind, as written ([`policies`]).
    pub policies: &'static [&'static str],
    /// The parsed policies, by kind: what the judge holds the verdicts to.
    pub limits: Vec<Limit>,
    /// Each kind's short name ([`kinds`]): in key names, and with
    /// `--entry rls` the descriptor's key.
    pub shorts: Vec<&'static str>,
    /// Each limit as the clients send it inline (cluster client, v1).
    sets: Vec<Limits<'static>>,
    /// Each limit as CL.THROTTLE's arguments, where it is one (RESP).
    cells: Vec<Option<CellArgs>>,
    hot: usize,
}

impl Plan {
    /// The keys of `options`.
    pub fn new(options: &LoadOptions) -> Plan {
        let kinds = kinds(options.entry);
        let limits: Vec<Limit> = kinds.iter().map(|k| k.1).collect();
        let sets = limits
            .iter()
            .map(|l| inline_limits(std::slice::from_ref(l)).expect("one limit"))
            .collect();
        let cells: Vec<Option<CellArgs>> = limits.iter().map(CellArgs::of).collect();
        assert!(
            options.entry != EntryArg::Resp || cells.iter().all(Option::is_some),
            "RESP_POLICIES are CL.THROTTLE's exactly"
        );
        let mut keys = Vec::new();
        for (hot, n) in [(true, options.hot_keys), (false, options.cold_keys)] {
            for (kind, (short, _)) in kinds.iter().enumerate() {
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
            policies: policies(options.entry),
            hot: options.hot_keys * limits.len(),
            shorts: kinds.iter().map(|k| k.0).collect(),
            limits,
            sets,
            cells,
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
    let entries = Arc::new(connect_entries(options.entry, &options.entry_nodes).await);
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
                        call_entry(&cluster, &plan, k, &entry, &groups, clock).await
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

/// An entry node: its index in the node list, and a client of the
/// entry's protocol (none cluster-aware: the node forwards what it does not
/// own).
#[derive(Debug)]
pub struct Entry {
    node: u16,
    door: Door,
}

/// A client of one node's entry point.
#[derive(Debug)]
enum Door {
    /// Protocol v1.
    V1(sluice_client::Client),
    /// RESP: CL.THROTTLE.
    Resp(resp::Pool),
    /// Envoy's rate limit service.
    #[cfg(feature = "rls")]
    Rls(super::rls::Client),
}

/// What a call through an entry point came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A verdict: allowed (`true`) or denied.
    Verdict(bool),
    /// No verdict. `maybe_applied`: sent and not answered (a deadline, a
    /// lost connection), or answered that its outcome is unknown.
    Failed { maybe_applied: bool },
}

/// A client to each entry node, for `entry`'s protocol (a v1 node down at
/// the start is left out; RESP and rate limit clients connect on their
/// first call). Empty for [`EntryArg::Client`].
async fn connect_entries(entry: EntryArg, addrs: &[String]) -> Vec<Arc<Entry>> {
    let config = sluice_client::ClientConfig {
        deadline: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        ..sluice_client::ClientConfig::default()
    };
    let mut out = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let door = match entry {
            EntryArg::Client => break,
            EntryArg::V1 => {
                match sluice_client::Client::connect_with(addr.as_str(), config.clone()).await {
                    Ok(c) => Ok(Door::V1(c)),
                    Err(e) => Err(e.to_string()),
                }
            }
            EntryArg::Resp => addr
                .parse()
                .map(|a| Door::Resp(resp::Pool::new(a)))
                .map_err(|e| format!("{e}")),
            #[cfg(feature = "rls")]
            EntryArg::Rls => super::rls::Client::new(addr).map(Door::Rls),
            #[cfg(not(feature = "rls"))]
            EntryArg::Rls => Err("this sluice was built without the `rls` feature".into()),
        };
        match door {
            Ok(door) => out.push(Arc::new(Entry {
                node: i as u16,
                door,
            })),
            Err(e) => eprintln!("drill: entry node {addr}: {e}"),
        }
    }
    out
}

impl Entry {
    /// Key `k`'s call through this entry.
    async fn ask(&self, plan: &Plan, k: usize) -> Answer {
        let key = &plan.keys[k];
        match &self.door {
            Door::V1(client) => {
                let got = client
                    .decide(
                        key.name.as_bytes(),
                        plan.sets[key.kind],
                        sluice_client::Mode::Spend,
                        1,
                    )
                    .await;
                match got {
                    Ok(d) => Answer::Verdict(d.allowed),
                    // Sent and not answered, here or between the entry and
                    // the owner: it may have been applied.
                    Err(e) => Answer::Failed {
                        maybe_applied: matches!(
                            e,
                            sluice_client::Error::Timeout(_) | sluice_client::Error::Disconnected
                        ) || e.status()
                            == Some(sluice_protocol::Status::OutcomeUnknown),
                    },
                }
            }
            Door::Resp(pool) => {
                let cell = plan.cells[key.kind].as_ref().expect("a RESP plan's limits");
                pool.throttle(key.name.as_bytes(), cell).await
            }
            #[cfg(feature = "rls")]
            Door::Rls(client) => client.ask(plan.shorts[key.kind], &key.name).await,
        }
    }

    /// The key the cluster routes key `k`'s call by: the key itself, or
    /// for the rate limit service the key its descriptor is kept under.
    fn routed(&self, plan: &Plan, k: usize) -> String {
        let key = &plan.keys[k];
        match &self.door {
            #[cfg(feature = "rls")]
            Door::Rls(_) => super::rls::stored_key(plan.shorts[key.kind], &key.name),
            _ => key.name.clone(),
        }
    }
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
    entry: &Entry,
    groups: &HashMap<String, u16>,
    clock: MonotonicClock,
) -> Record {
    let send_ns = clock.now_ns();
    let answer = entry.ask(plan, k).await;
    let recv_ns = clock.now_ns();
    let group = groups
        .get(&cluster.route(entry.routed(plan, k).as_bytes()).0)
        .copied()
        .unwrap_or(u16::MAX);
    let mut r = Record {
        send_ns,
        recv_ns,
        key: k as u32,
        node: entry.node,
        group,
        epoch: u64::MAX,
        origin: Origin::Store,
        allowed: false,
        unknown: false,
    };
    match answer {
        Answer::Verdict(allowed) => r.allowed = allowed,
        Answer::Failed { maybe_applied } => {
            r.origin = Origin::Error;
            r.epoch = 0;
            r.unknown = maybe_applied;
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
