//! `sluice drill`: break a cluster on purpose, under load, and report what
//! it cost.
//!
//! A drill runs load through the cluster client (keys of every limit kind,
//! hot ones far over their limits, cold ones under them) and, round after
//! round, injects a fault on a random group's primary: kill -9, SIGSTOP for
//! a while then SIGCONT, a cut link, or a planned handover. It lets the
//! group recover (promotion, the old primary's return as follower) and
//! records every verdict the clients got. At the end, [`audit`] judges each
//! key's verdicts against what a correct limiter could have admitted, with
//! no help from the servers' counters, and [`report`] prints the result.
//!
//! `--local` runs a cluster of the drill's own ([`local`]); `--cluster
//! FILE --fault-cmd CMD` drives someone else's, calling their command to
//! inject each fault.
//!
//! Layout:
//! - [`audit`]: the judge (pure: recorded times in, over- and
//!   under-admitted units out).
//! - [`load`]: the keys, the callers and the verdict records.
//! - [`local`]: the drill's own processes and the faults it injects.
//! - [`ports`]: loopback ports for servers started on a known address.
//! - [`proxy`]: the TCP proxy that a cut link severs.
//! - [`report`]: rounds and totals, the summary, JSON, report.md and the
//!   picture.
//! - [`resp`]: `--entry resp`, the load as CL.THROTTLE over RESP.
//! - [`rls`]: `--entry rls`, the load as Envoy's ShouldRateLimit, and the
//!   rule file it needs.

pub mod audit;
pub mod load;
pub mod local;
pub mod ports;
pub mod proxy;
pub mod report;
pub mod resp;
pub mod rls;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_client::{
    Client, ClientConfig, Cluster, ClusterConfig, FailurePolicy, ReplState, Role, RoleOk, Topology,
};
use sluice_protocol::clock::{Clock, MonotonicClock};

use load::{LoadOptions, Plan};
use local::{LocalCluster, LocalOptions};
use report::{Outcome, RoundLog};

/// Exit status: the run kept the mode's promise.
pub const EXIT_KEPT: u8 = 0;
/// Exit status: the run broke the mode's promise.
pub const EXIT_BROKEN: u8 = 1;
/// Exit status: the drill itself failed (it could not start, inject or
/// measure).
pub const EXIT_FAILED: u8 = 2;

/// After a fault, the least time of load before the next round, so that
/// what the recovered group admits is measured too.
const SETTLE: Duration = Duration::from_millis(300);
/// How often the drill asks the nodes' roles while a group recovers.
const POLL: Duration = Duration::from_millis(20);

/// Why the drill itself failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrillError(pub String);

impl std::fmt::Display for DrillError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DrillError {}

/// The faults a drill can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum FaultArg {
    /// kill -9 of the primary; the drill starts it again as follower.
    Kill,
    /// SIGSTOP of the primary for --pause-ms, then SIGCONT.
    Pause,
    /// The primary cut off from clients and its follower for --cut-ms.
    Partition,
    /// A planned handover (FAILOVER) to the follower (not with --etcd:
    /// etcd decides who leads).
    Handover,
    /// With --etcd: etcd itself stopped (SIGSTOP) for --cut-ms.
    EtcdDown,
    /// With --etcd: the primary's link to etcd cut for --cut-ms.
    EtcdPartition,
    /// Each fault in turn, in a shuffled order: kill, pause, partition,
    /// handover; with --etcd, kill, pause, partition, etcd-down,
    /// etcd-partition.
    Mixed,
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// kill -9.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Pause,
    /// A cut link.
    Partition,
    /// A planned handover.
    Handover,
    /// etcd stopped.
    EtcdDown,
    /// The primary cut off from etcd.
    EtcdPartition,
}

impl Fault {
    /// The faults of a mixed drill, in a fixed order.
    pub const ALL: [Fault; 4] = [Fault::Kill, Fault::Pause, Fault::Partition, Fault::Handover];
    /// The faults of a mixed drill on etcd.
    pub const ALL_ETCD: [Fault; 5] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Partition,
        Fault::EtcdDown,
        Fault::EtcdPartition,
    ];

    /// `kill`, `pause`, `partition` or `handover` (also what `{fault}`
    /// becomes in --fault-cmd).
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Handover => "handover",
            Fault::EtcdDown => "etcd-down",
            Fault::EtcdPartition => "etcd-partition",
        }
    }
}

/// Replication mode of the drill's own cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplArg {
    /// Replies wait for the follower: the promise is 0 over-admission.
    Sync,
    /// Replies do not wait: a failover may re-grant the last few ms.
    Async,
}

/// What the clients do when a group cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureArg {
    /// Decide in-process with the whole limit (the client's default).
    Local,
    /// Allow.
    Open,
    /// Deny.
    Closed,
}

/// A setup broken on purpose, to show that the drill catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sabotage {
    /// The second node of each group is a primary of its own with no
    /// replication: every failover starts from empty buckets.
    NoReplication,
}

/// `sluice drill`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DrillArgs {
    /// Start a cluster of the drill's own on loopback (a primary and a
    /// follower per group), and stop it when done or interrupted.
    #[arg(long, conflicts_with = "fault_cmd")]
    pub local: bool,
    /// With --cluster: the command that injects a fault, run with `sh -c`
    /// after replacing {addr} (the primary's address as the cluster file
    /// names it), {fault} (kill, pause, partition or handover) and {group}.
    /// It returns once the fault is over (after SIGCONT, once the link is
    /// mended); the operator's supervisor restarts a killed node.
    #[arg(long, value_name = "CMD")]
    pub fault_cmd: Option<String>,
    /// Groups of the local cluster.
    #[arg(long, default_value_t = 2)]
    pub groups: usize,
    /// Replication mode of the local cluster.
    #[arg(long, value_enum, default_value = "sync")]
    pub replication: ReplArg,
    /// Faults to inject, one per round.
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    /// Which faults.
    #[arg(long, value_enum, default_value = "mixed")]
    pub fault: FaultArg,
    /// Length of the whole run, in seconds, shared evenly by the rounds
    /// (a round lasts at least until its group has recovered); default: 3
    /// per round.
    #[arg(long, value_name = "N")]
    pub duration_s: Option<f64>,
    /// Decisions per second, over all callers.
    #[arg(long, default_value_t = 2_000.0)]
    pub rate: f64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    /// Hot keys per limit kind (pushed far over their limits).
    #[arg(long, default_value_t = 2)]
    pub hot_keys: usize,
    /// Cold keys per limit kind (well under their limits).
    #[arg(long, default_value_t = 200)]
    pub cold_keys: usize,
    /// Share of the calls that go to hot keys.
    #[arg(long, default_value_t = 0.5)]
    pub hot_share: f64,
    /// What clients do while a group cannot answer.
    #[arg(long, value_enum, default_value = "local")]
    pub failure: FailureArg,
    /// Shards per local node.
    #[arg(long, default_value_t = 2)]
    pub shards: u16,
    /// The local followers' --promote-after-ms.
    #[arg(long, default_value_t = 300)]
    pub promote_after_ms: u64,
    /// The clients' stall threshold (`ClusterConfig::stall_after`): a call
    /// to a primary that waits this long makes its group look for a newer
    /// primary; 0 turns stall detection off.
    #[arg(long, default_value_t = sluice_client::STALL_AFTER_MS_DEFAULT)]
    pub stall_after_ms: u64,
    /// How long a pause lasts (SIGSTOP to SIGCONT).
    #[arg(long, default_value_t = 1_000)]
    pub pause_ms: u64,
    /// How long a link stays cut.
    #[arg(long, default_value_t = 1_000)]
    pub cut_ms: u64,
    /// How long a group may take to recover before the round counts as
    /// failed.
    #[arg(long, default_value_t = 30)]
    pub recover_timeout_s: u64,
    /// Seeds the choice of groups, fault order and keys.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The sluiced binary for --local; default: next to this one, else on
    /// PATH.
    #[arg(long, value_name = "PATH")]
    pub sluiced: Option<PathBuf>,
    /// Write report.md, drill.svg and the nodes' logs into DIR.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// With --local: coordinate the cluster through an etcd of the drill's
    /// own (`etcd` on PATH; sluiced built with `--features etcd`), each
    /// node's link to it through a proxy the drill can cut.
    #[arg(long, requires = "local")]
    pub etcd: bool,
    /// With --etcd: the nodes' --leader-ttl-s.
    #[arg(long, default_value_t = 2)]
    pub leader_ttl_s: u64,
    /// Break the local setup on purpose (to see the drill catch it).
    #[arg(long, value_enum)]
    pub sabotage: Option<Sabotage>,
    /// Print exactly one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// How the load reaches the cluster: `client`, the cluster client
    /// (each key to its owner); or through a node chosen at random for
    /// each call, followers included (every node an entry point, `sluiced
    /// --cluster`): `v1`, protocol v1 DECIDE; `resp`, redis-cell's
    /// CL.THROTTLE over RESP (token-bucket keys only); `rls`, Envoy's
    /// ShouldRateLimit with a rule file the drill writes (no concurrency
    /// keys; needs a sluice and sluiced built with the `rls` feature).
    /// Not `client`: with --local only, and with kill or pause faults.
    #[arg(long, value_enum, default_value = "client")]
    pub entry: EntryArg,
}

/// `--entry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EntryArg {
    /// The cluster client: each key straight to its group's primary.
    Client,
    /// Protocol v1 through random nodes' entry points.
    V1,
    /// CL.THROTTLE over RESP through random nodes' RESP listeners.
    Resp,
    /// ShouldRateLimit through random nodes' rate limit services.
    Rls,
}

impl EntryArg {
    /// `client`, `v1`, `resp` or `rls`, as the report names it.
    pub fn name(self) -> &'static str {
        match self {
            EntryArg::Client => "client",
            EntryArg::V1 => "v1",
            EntryArg::Resp => "resp",
            EntryArg::Rls => "rls",
        }
    }
}

/// The global flags a drill uses.
#[derive(Debug, Clone)]
pub struct Global {
    /// --cluster.
    pub cluster: Option<PathBuf>,
    /// --timeout-ms: the clients' deadline per call.
    pub timeout_ms: u64,
    /// --auth-token.
    pub auth_token: Option<String>,
}

/// Runs a drill; returns the exit status (0 kept, 1 broken, 2 failed).
pub async fn run(args: DrillArgs, global: Global) -> u8 {
    let interrupted = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    tokio::select! {
        got = drill(&args, &global) => match got {
            Ok(outcome) => {
                if args.json {
                    println!("{}", serde_json::to_string(&outcome.json()).expect("serializes"));
                } else {
                    print!("{}", outcome.summary());
                }
                if let Some(dir) = &args.report {
                    if let Err(e) = outcome.write_report(dir) {
                        eprintln!("sluice drill: report: {e}");
                        return EXIT_FAILED;
                    }
                }
                if outcome.promise_kept() { EXIT_KEPT } else { EXIT_BROKEN }
            }
            Err(e) => {
                eprintln!("sluice drill: {e}");
                EXIT_FAILED
            }
        },
        () = interrupted => {
            // Dropping the drill's future drops its cluster: every process
            // it started is killed.
            eprintln!("sluice drill: interrupted; stopped everything it started");
            EXIT_FAILED
        }
    }
}

/// Where the faults go.
#[derive(Debug)]
enum Harness {
    Local(LocalCluster),
    External {
        topology: Topology,
        fault_cmd: String,
    },
}

impl Harness {
    /// The control addresses of group `g`'s members.
    fn members(&self, g: usize) -> Vec<String> {
        match self {
            Harness::Local(c) => (0..2).map(|i| c.control_addr(g, i).to_string()).collect(),
            Harness::External { topology, .. } => {
                let spec = &topology.groups[g];
                std::iter::once(spec.primary.clone())
                    .chain(spec.follower.clone())
                    .collect()
            }
        }
    }

    /// Member `i`'s address as the cluster file names it.
    fn public(&self, g: usize, i: usize) -> String {
        match self {
            Harness::Local(c) => c.public_addr(g, i).to_string(),
            Harness::External { .. } => self.members(g)[i].clone(),
        }
    }
}

/// The whole drill: set up, load, rounds, judge.
async fn drill(args: &DrillArgs, global: &Global) -> Result<Outcome, DrillError> {
    let faults = check(args)?;
    let mut harness = Harness::start(args, global).await?;
    let sabotaged = args.sabotage.is_some();
    if sabotaged && !matches!(harness, Harness::Local(_)) {
        return Err(DrillError("--sabotage needs --local".into()));
    }
    let topology = harness.topology();
    let control = ClientConfig {
        deadline: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        shard_aware: false,
        auth_token: global.auth_token.clone(),
        known_epoch: 0,
        layout_hash: 0,
    };
    let recover_timeout = Duration::from_secs(args.recover_timeout_s.max(1));
    for g in 0..topology.groups.len() {
        if !wait_recovered(&mut harness, g, &control, recover_timeout, sabotaged, None)
            .await
            .recovered
        {
            return Err(DrillError(format!(
                "group {} never had a primary and a follower in sync",
                topology.groups[g].name
            )));
        }
    }
    let load = RunningLoad::start(args, global, &harness, &topology).await?;
    let rounds = Rounds {
        args,
        topology: &topology,
        control: &control,
        recover_timeout,
        sabotaged,
        clock: &load.clock,
    }
    .run(&mut harness, &faults)
    .await?;
    load.stop.store(true, Ordering::Relaxed);
    let end_ns = load.clock.now_ns();
    let records = load
        .task
        .await
        .map_err(|e| DrillError(format!("the load failed: {e}")))?;
    let setup = setup(
        args,
        &harness,
        topology.groups.len(),
        &load.plan,
        &load.cluster,
    );
    // Judging takes a while on a long run: the cluster can go now.
    drop(harness);
    Ok(report::judge(
        setup,
        &load.plan,
        &records,
        rounds,
        load.start_ns,
        end_ns,
    ))
}

/// Checks the flags that need no cluster; returns each round's fault.
fn check(args: &DrillArgs) -> Result<Vec<Fault>, DrillError> {
    if args.rounds == 0 {
        return Err(DrillError("--rounds must be at least 1".into()));
    }
    if !args.rate.is_finite() || args.rate <= 0.0 || args.callers == 0 {
        return Err(DrillError("--rate and --callers must be positive".into()));
    }
    let kinds: &[Fault] = if args.etcd {
        &Fault::ALL_ETCD
    } else {
        &Fault::ALL
    };
    let faults = schedule(args.fault, args.rounds, args.seed, kinds);
    if args.etcd && faults.contains(&Fault::Handover) {
        return Err(DrillError(
            "--etcd: etcd decides who leads; no handover fault".into(),
        ));
    }
    if !args.etcd
        && faults
            .iter()
            .any(|f| matches!(f, Fault::EtcdDown | Fault::EtcdPartition))
    {
        return Err(DrillError(
            "the etcd faults need --etcd (or --fault-cmd)".into(),
        ));
    }
    let entry = args.entry.name();
    if args.entry != EntryArg::Client && !args.local {
        return Err(DrillError(format!("--entry {entry} needs --local")));
    }
    if args.entry == EntryArg::Rls && !cfg!(feature = "rls") {
        return Err(DrillError(
            "--entry rls: this sluice was built without its gRPC client (cargo build -p sluice-cli --features rls)".into(),
        ));
    }
    Ok(faults)
}

impl ReplArg {
    /// `sync` or `async`, as the local nodes' flag and the report name it.
    fn name(self) -> &'static str {
        match self {
            ReplArg::Sync => "sync",
            ReplArg::Async => "async",
        }
    }
}

impl Harness {
    /// Starts the drill's own cluster (`--local`), or reads the layout of
    /// someone else's (`--cluster FILE --fault-cmd CMD`).
    async fn start(args: &DrillArgs, global: &Global) -> Result<Harness, DrillError> {
        match (&global.cluster, &args.fault_cmd, args.local) {
            (None, None, true) => {
                let options = local_options(args)?;
                Ok(Harness::Local(tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(LocalCluster::start(options))
                })?))
            }
            (Some(path), Some(cmd), false) => Ok(Harness::External {
                // A file, or etcd's layout as it is at the start.
                topology: crate::open_cluster(path, ClusterConfig::default())
                    .await
                    .map_err(|e| DrillError(e.to_string()))?
                    .0,
                fault_cmd: cmd.clone(),
            }),
            _ => Err(DrillError(
                "name either --local, or --cluster FILE with --fault-cmd CMD".into(),
            )),
        }
    }

    /// The cluster's layout.
    fn topology(&self) -> Topology {
        match self {
            Harness::Local(c) => c.topology(),
            Harness::External { topology, .. } => topology.clone(),
        }
    }
}

/// The drill's own cluster as the flags ask for it.
fn local_options(args: &DrillArgs) -> Result<LocalOptions, DrillError> {
    let entry = args.entry.name();
    let links = matches!(args.fault, FaultArg::Partition | FaultArg::Mixed);
    if links && args.entry != EntryArg::Client {
        return Err(DrillError(format!(
            "--entry {entry} drills kill and pause faults (a cut link's proxies hide the nodes' own addresses from the cluster file)"
        )));
    }
    if args.etcd && args.sabotage.is_some() {
        return Err(DrillError(
            "--sabotage and --etcd do not go together".into(),
        ));
    }
    let log_dir = match &args.report {
        Some(dir) => dir.join("nodes"),
        None => std::env::temp_dir().join(format!("sluice-drill-{}", std::process::id())),
    };
    Ok(LocalOptions {
        sluiced: args.sluiced.clone().unwrap_or_else(sluiced_path),
        groups: args.groups.max(1),
        shards: args.shards.max(1),
        replication: args.replication.name().to_owned(),
        promote_after_ms: args.promote_after_ms,
        links,
        no_replication: args.sabotage == Some(Sabotage::NoReplication),
        etcd_ttl_s: args.etcd.then_some(args.leader_ttl_s.max(1)),
        log_dir,
        // With etcd every node is an entry point already.
        entry_points: args.entry != EntryArg::Client && !args.etcd,
        resp: args.entry == EntryArg::Resp,
        rls_rules: match args.entry {
            EntryArg::Rls => Some(rls::rules(&load::kinds(EntryArg::Rls)).map_err(DrillError)?),
            _ => None,
        },
    })
}

/// The load, running while the rounds inject faults.
struct RunningLoad {
    /// The callers' cluster client (its failover and stall counts go in
    /// the report).
    cluster: Arc<Cluster>,
    /// The keys and their policies, which the judge needs too.
    plan: Arc<Plan>,
    /// Set once the rounds are over: the callers stop.
    stop: Arc<AtomicBool>,
    /// The callers; every verdict they got once they stop.
    task: tokio::task::JoinHandle<Vec<load::Record>>,
    /// The drill's clock: the load's start and end and every round's
    /// times are read from this one.
    clock: MonotonicClock,
    /// When the load began.
    start_ns: u64,
}

impl RunningLoad {
    /// Connects the callers' cluster client, plans the keys and starts the
    /// callers.
    async fn start(
        args: &DrillArgs,
        global: &Global,
        harness: &Harness,
        topology: &Topology,
    ) -> Result<RunningLoad, DrillError> {
        let cluster = Arc::new(load_cluster(args, global, harness, topology).await?);
        let run_id = MonotonicClock::new().now_ns() / 1_000_000 % 1_000_000_000;
        let mut load_options = LoadOptions {
            rate: args.rate,
            callers: args.callers,
            hot_keys: args.hot_keys,
            cold_keys: args.cold_keys,
            hot_share: args.hot_share.clamp(0.0, 1.0),
            prefix: format!("drill{run_id}"),
            seed: args.seed,
            entry: args.entry,
            entry_nodes: Vec::new(),
        };
        let plan = Arc::new(Plan::new(&load_options));
        if plan.keys.is_empty() {
            return Err(DrillError(
                "no keys: raise --hot-keys or --cold-keys".into(),
            ));
        }
        let groups = topology.groups.len();
        let mut node_names = Vec::new();
        for g in 0..groups {
            for i in 0..harness.members(g).len() {
                node_names.push(harness.public(g, i));
            }
        }
        load_options.entry_nodes = entry_nodes(harness, args.entry, &node_names, groups);
        let node_index: HashMap<String, u16> = node_names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u16))
            .collect();
        let group_index: HashMap<String, u16> = topology
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.clone(), i as u16))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let clock = MonotonicClock::new();
        let start_ns = clock.now_ns();
        let task = tokio::spawn(load::run(
            cluster.clone(),
            plan.clone(),
            load_options.clone(),
            Arc::new(node_index),
            Arc::new(group_index),
            stop.clone(),
        ));
        Ok(RunningLoad {
            cluster,
            plan,
            stop,
            task,
            clock,
            start_ns,
        })
    }
}

/// The callers' cluster client, with --failure, --timeout-ms and
/// --stall-after-ms.
async fn load_cluster(
    args: &DrillArgs,
    global: &Global,
    harness: &Harness,
    topology: &Topology,
) -> Result<Cluster, DrillError> {
    let failure = match args.failure {
        FailureArg::Local => FailurePolicy::Local,
        FailureArg::Open => FailurePolicy::Open,
        FailureArg::Closed => FailurePolicy::Closed,
    };
    let cluster_config = ClusterConfig {
        client: ClientConfig {
            deadline: Duration::from_millis(global.timeout_ms),
            connect_timeout: Duration::from_millis(global.timeout_ms),
            auth_token: global.auth_token.clone(),
            ..ClientConfig::default()
        },
        failure,
        stall_after: (args.stall_after_ms > 0).then(|| Duration::from_millis(args.stall_after_ms)),
        ..ClusterConfig::default()
    };
    let cluster = match (harness, &global.cluster) {
        // From etcd: the clients follow the layout as it changes.
        (Harness::External { .. }, Some(spec)) => crate::open_cluster(spec, cluster_config)
            .await
            .map(|(_, c)| c),
        _ => Cluster::new(topology, cluster_config),
    };
    cluster.map_err(|e| DrillError(e.to_string()))
}

/// The addresses an `--entry` other than `client` sends its calls to:
/// every node's, on the entry's own port.
fn entry_nodes(
    harness: &Harness,
    entry: EntryArg,
    node_names: &[String],
    groups: usize,
) -> Vec<String> {
    match (harness, entry) {
        (_, EntryArg::Client) => Vec::new(),
        (_, EntryArg::V1) => node_names.to_vec(),
        (Harness::Local(c), EntryArg::Resp | EntryArg::Rls) => {
            let mut addrs = Vec::new();
            for g in 0..groups {
                for i in 0..harness.members(g).len() {
                    let addr = match entry {
                        EntryArg::Resp => c.resp_addr(g, i),
                        _ => c.rls_addr(g, i),
                    };
                    addrs.push(addr.expect("started with the entry's port").to_string());
                }
            }
            addrs
        }
        (Harness::External { .. }, _) => unreachable!("--entry needs --local, checked above"),
    }
}

/// What every round reads: the flags, the layout, how to ask a group's
/// roles and how long it may take to recover.
struct Rounds<'a> {
    /// The drill's flags.
    args: &'a DrillArgs,
    /// The cluster's layout (group names).
    topology: &'a Topology,
    /// How the drill asks the nodes' roles.
    control: &'a ClientConfig,
    /// --recover-timeout-s.
    recover_timeout: Duration,
    /// --sabotage: a group recovers without a streaming follower.
    sabotaged: bool,
    /// The load's clock, so the rounds' times compare with its records.
    clock: &'a MonotonicClock,
}

/// One round as it was planned before its fault.
#[derive(Debug, Clone, Copy)]
struct RoundPlan {
    /// Its number, from 0.
    index: usize,
    /// Its fault.
    fault: Fault,
    /// The group the fault hits.
    group: usize,
    /// When the round began.
    start_ns: u64,
    /// When the next round may begin (it waits for [`SETTLE`] past the
    /// recovery too).
    end: Instant,
}

impl Rounds<'_> {
    /// Runs a round per fault, each on a random group, until one leaves
    /// its group unrecovered.
    async fn run(
        &self,
        harness: &mut Harness,
        faults: &[Fault],
    ) -> Result<Vec<RoundLog>, DrillError> {
        let args = self.args;
        let groups = self.topology.groups.len();
        let duration =
            Duration::from_secs_f64(args.duration_s.unwrap_or(3.0 * args.rounds as f64).max(0.5));
        let round_len = duration / args.rounds as u32;
        let mut rng = args.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
        // A second of load before the first fault: every key has history.
        tokio::time::sleep(Duration::from_secs(1).min(round_len)).await;
        let mut rounds = Vec::new();
        for (r, &fault) in faults.iter().enumerate() {
            let round_start = Instant::now();
            let start_ns = self.clock.now_ns();
            let g = (load::xorshift(&mut rng) % groups as u64) as usize;
            let lead = round_len.mul_f64(0.2 + 0.2 * unit(load::xorshift(&mut rng)));
            tokio::time::sleep(lead).await;
            let plan = RoundPlan {
                index: r,
                fault,
                group: g,
                start_ns,
                end: round_start + round_len,
            };
            let (log, recovered) = self.round(harness, plan).await?;
            if !args.json {
                print_round(r, faults.len(), &log);
            }
            rounds.push(log);
            if !recovered {
                // The group is broken: the next rounds would measure nothing.
                break;
            }
        }
        Ok(rounds)
    }

    /// Injects the round's fault on its group's primary, waits for the
    /// group to recover and then to the round's end; returns what it saw
    /// and whether the group recovered.
    async fn round(
        &self,
        harness: &mut Harness,
        plan: RoundPlan,
    ) -> Result<(RoundLog, bool), DrillError> {
        let RoundPlan {
            index: r,
            fault,
            group: g,
            ..
        } = plan;
        let roles = roles(&harness.members(g), self.control).await;
        let Some(p) = primary_of(&roles) else {
            return Err(DrillError(format!(
                "round {r}: group {} has no primary",
                self.topology.groups[g].name
            )));
        };
        let before = roles[p].clone().expect("a primary answered");
        // The fault's time is when it took effect (a signal sent by `kill`
        // lands a few ms after the call to send it); `inject` moves it.
        let fault_at = std::cell::Cell::new(self.clock.now_ns());
        let injected = inject(harness, g, p, fault, self.args, &fault_at).await;
        let fault_ns = fault_at.get();
        let (fault_error, server_unavailable_ms) = match injected {
            Ok(ms) => (None, ms),
            Err(e) => (Some(e.0), None),
        };
        let killed = (fault == Fault::Kill && matches!(harness, Harness::Local(_))).then_some(p);
        let rec = wait_recovered(
            harness,
            g,
            self.control,
            self.recover_timeout,
            self.sabotaged,
            killed,
        )
        .await;
        let recovered_ns = self.clock.now_ns();
        let settle_until = Instant::now() + SETTLE;
        tokio::time::sleep_until(plan.end.max(settle_until).into()).await;
        let log = RoundLog {
            fault,
            group: g,
            group_name: self.topology.groups[g].name.clone(),
            node: harness.public(g, p),
            start_ns: plan.start_ns,
            fault_ns,
            lag_ms: before.lag_us as f64 / 1e3,
            epoch_before: before.epoch,
            epoch_after: rec.epoch,
            primary_after: rec.primary.map(|i| harness.public(g, i)),
            recovered_ms: rec
                .recovered
                .then(|| (recovered_ns.saturating_sub(fault_ns)) as f64 / 1e6),
            fault_error,
            server_unavailable_ms,
        };
        Ok((log, rec.recovered))
    }
}

/// The line a round prints on stderr (without --json).
fn print_round(r: usize, rounds: usize, l: &RoundLog) {
    eprintln!(
        "round {r}/{rounds}: {} on {} ({}): {}, epoch {}>{}",
        l.fault.name(),
        l.group_name,
        l.node,
        l.recovered_ms
            .map_or("not recovered".to_owned(), |ms| format!(
                "recovered in {ms:.0} ms"
            )),
        l.epoch_before,
        l.epoch_after
    );
}

/// How the drill was set up, for the report.
fn setup(
    args: &DrillArgs,
    harness: &Harness,
    groups: usize,
    plan: &Plan,
    cluster: &Cluster,
) -> report::Setup {
    let stats = cluster.stats();
    report::Setup {
        target: match harness {
            Harness::Local(_) => "local".into(),
            Harness::External { .. } => "cluster".into(),
        },
        mode: args.replication.name().into(),
        fault: format!("{:?}", args.fault).to_lowercase(),
        groups,
        rounds_asked: args.rounds,
        rate: args.rate,
        callers: args.callers,
        keys: plan.keys.len(),
        hot_keys: plan.keys.iter().filter(|k| k.hot).count(),
        policies: plan.policies.iter().map(|p| p.to_string()).collect(),
        failure: format!("{:?}", args.failure).to_lowercase(),
        sabotage: args.sabotage.map(|_| "no-replication".to_owned()),
        failovers_seen: stats.failovers_total.load(Ordering::Relaxed),
        entry: args.entry.name().to_owned(),
        node_logs: match harness {
            Harness::Local(c) => Some(c.log_dir().display().to_string()),
            Harness::External { .. } => None,
        },
        promote_after_ms: (matches!(harness, Harness::Local(_)) && !args.etcd)
            .then_some(args.promote_after_ms),
        stalls_seen: (
            stats.stalls_total.load(Ordering::Relaxed),
            stats.stall_moves_total.load(Ordering::Relaxed),
        ),
    }
}

/// The faults of each round: the one asked for, or (mixed) each of
/// `kinds` in turn, shuffled within every `kinds.len()` rounds.
fn schedule(fault: FaultArg, rounds: usize, seed: u64, kinds: &[Fault]) -> Vec<Fault> {
    let one = match fault {
        FaultArg::Kill => Some(Fault::Kill),
        FaultArg::Pause => Some(Fault::Pause),
        FaultArg::Partition => Some(Fault::Partition),
        FaultArg::Handover => Some(Fault::Handover),
        FaultArg::EtcdDown => Some(Fault::EtcdDown),
        FaultArg::EtcdPartition => Some(Fault::EtcdPartition),
        FaultArg::Mixed => None,
    };
    if let Some(f) = one {
        return vec![f; rounds];
    }
    let mut rng = seed.wrapping_add(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(rounds);
    while out.len() < rounds {
        let mut block = kinds.to_vec();
        for i in (1..block.len()).rev() {
            block.swap(i, (load::xorshift(&mut rng) % (i as u64 + 1)) as usize);
        }
        out.extend(block.into_iter().take(rounds - out.len()));
    }
    out
}

/// A random `r` as a number in [0, 1).
fn unit(r: u64) -> f64 {
    (r >> 11) as f64 / (1u64 << 53) as f64
}

/// Injects `fault` on member `p` of group `g`; returns the server's own
/// unavailable window of a handover, when it reports one.
async fn inject(
    harness: &mut Harness,
    g: usize,
    p: usize,
    fault: Fault,
    args: &DrillArgs,
    fault_at: &std::cell::Cell<u64>,
) -> Result<Option<f64>, DrillError> {
    let clock = MonotonicClock::new();
    let took_effect = || fault_at.set(clock.now_ns());
    match harness {
        Harness::Local(cluster) => match fault {
            Fault::Kill => {
                tokio::task::block_in_place(|| cluster.kill(g, p));
                Ok(None)
            }
            Fault::Pause => {
                tokio::task::block_in_place(|| cluster.pause(g, p, true))?;
                took_effect();
                tokio::time::sleep(Duration::from_millis(args.pause_ms)).await;
                tokio::task::block_in_place(|| cluster.pause(g, p, false))?;
                Ok(None)
            }
            Fault::Partition => {
                cluster.cut(g, p, true)?;
                tokio::time::sleep(Duration::from_millis(args.cut_ms)).await;
                cluster.cut(g, p, false)?;
                Ok(None)
            }
            Fault::Handover => {
                let addr = cluster.control_addr(g, p);
                handover(&addr.to_string()).await
            }
            Fault::EtcdDown => {
                tokio::task::block_in_place(|| cluster.etcd_pause(true))?;
                took_effect();
                tokio::time::sleep(Duration::from_millis(args.cut_ms)).await;
                tokio::task::block_in_place(|| cluster.etcd_pause(false))?;
                Ok(None)
            }
            Fault::EtcdPartition => {
                cluster.cut_etcd(g, p, true)?;
                tokio::time::sleep(Duration::from_millis(args.cut_ms)).await;
                cluster.cut_etcd(g, p, false)?;
                Ok(None)
            }
        },
        Harness::External {
            topology,
            fault_cmd,
        } => {
            let addr = if p == 0 {
                topology.groups[g].primary.clone()
            } else {
                topology.groups[g].follower.clone().unwrap_or_default()
            };
            let cmd = fault_cmd
                .replace("{addr}", &addr)
                .replace("{fault}", fault.name())
                .replace("{group}", &topology.groups[g].name);
            let out = tokio::process::Command::new("sh")
                .args(["-c", &cmd])
                .stdin(std::process::Stdio::null())
                .output();
            let out = tokio::time::timeout(Duration::from_secs(120), out)
                .await
                .map_err(|_| DrillError(format!("`{cmd}` ran over 120 s")))?
                .map_err(|e| DrillError(format!("`{cmd}`: {e}")))?;
            if out.status.success() {
                Ok(None)
            } else {
                Err(DrillError(format!(
                    "`{cmd}` exited with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )))
            }
        }
    }
}

/// FAILOVER sent to the primary at `addr`.
async fn handover(addr: &str) -> Result<Option<f64>, DrillError> {
    let config = ClientConfig {
        deadline: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        shard_aware: false,
        ..ClientConfig::default()
    };
    let client = Client::connect_with(addr, config)
        .await
        .map_err(|e| DrillError(format!("handover: {e}")))?;
    let ok = client
        .failover()
        .await
        .map_err(|e| DrillError(format!("handover refused: {e}")))?;
    Ok(Some(ok.unavailable_us as f64 / 1e3))
}

/// Each member's ROLE, or `None` where it did not answer.
async fn roles(members: &[String], control: &ClientConfig) -> Vec<Option<RoleOk>> {
    let mut out = Vec::new();
    for addr in members {
        let asked = async {
            let c = Client::connect_with(addr.as_str(), control.clone())
                .await
                .ok()?;
            c.role().await.ok()
        };
        out.push(
            tokio::time::timeout(control.deadline * 2, asked)
                .await
                .ok()
                .flatten(),
        );
    }
    out
}

/// The member that admits: a primary, not fenced, of the highest epoch.
fn primary_of(roles: &[Option<RoleOk>]) -> Option<usize> {
    roles
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
        .filter(|(_, r)| r.role == Role::Primary && r.state != ReplState::Fenced)
        .max_by_key(|(i, r)| (r.epoch, std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
}

/// How a group's recovery ended.
#[derive(Debug, Clone, Copy)]
struct Recovery {
    recovered: bool,
    /// The admitting member at the end.
    primary: Option<usize>,
    /// Its epoch.
    epoch: u64,
}

/// Waits until group `g` has an admitting primary and (with replication)
/// a follower that streams from it; starts a killed member again (as
/// follower) once the other has taken over.
async fn wait_recovered(
    harness: &mut Harness,
    g: usize,
    control: &ClientConfig,
    timeout: Duration,
    sabotaged: bool,
    killed: Option<usize>,
) -> Recovery {
    let deadline = Instant::now() + timeout;
    let mut restarted = false;
    loop {
        let members = harness.members(g);
        let roles = roles(&members, control).await;
        let primary = primary_of(&roles);
        if let (Some(k), false, Harness::Local(cluster)) = (killed, restarted, &mut *harness) {
            // A supervisor's job: start the dead node again once the group
            // has a primary (without one, it would come back a primary
            // itself and the group would have two histories).
            if sabotaged || primary.is_some_and(|p| p != k) {
                let spawned = tokio::task::block_in_place(|| cluster.spawn(g, k, !sabotaged));
                if let Err(e) = spawned {
                    eprintln!("sluice drill: {e}");
                }
                restarted = true;
            }
        }
        let waiting_for_restart = killed.is_some() && !restarted;
        let done = match primary {
            Some(p) if !waiting_for_restart => {
                let all_answer = roles.iter().all(Option::is_some);
                if sabotaged {
                    all_answer
                } else {
                    let pr = roles[p].as_ref().expect("answered");
                    let followers_stream = roles.iter().enumerate().all(|(i, r)| {
                        i == p
                            || r.as_ref().is_some_and(|r| {
                                r.role == Role::Follower && r.state == ReplState::Streaming
                            })
                    });
                    followers_stream && (members.len() == 1 || pr.state == ReplState::Streaming)
                }
            }
            _ => false,
        };
        if done || Instant::now() >= deadline {
            return Recovery {
                recovered: done,
                primary,
                epoch: primary
                    .and_then(|p| roles[p].as_ref())
                    .map_or(0, |r| r.epoch),
            };
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The `sluiced` next to this executable, else the one on PATH.
fn sluiced_path() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("sluiced")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("sluiced"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_runs_every_fault_once_in_every_four_rounds() {
        let s = schedule(FaultArg::Mixed, 12, 7, &Fault::ALL);
        for four in s.chunks(4) {
            for f in Fault::ALL {
                assert_eq!(four.iter().filter(|&&x| x == f).count(), 1, "{s:?}");
            }
        }
        let e = schedule(FaultArg::Mixed, 10, 7, &Fault::ALL_ETCD);
        for five in e.chunks(5) {
            for f in Fault::ALL_ETCD {
                assert_eq!(five.iter().filter(|&&x| x == f).count(), 1, "{e:?}");
            }
        }
        assert_eq!(
            schedule(FaultArg::Kill, 3, 1, &Fault::ALL),
            vec![Fault::Kill; 3]
        );
        assert_eq!(schedule(FaultArg::Mixed, 2, 1, &Fault::ALL).len(), 2);
    }
}
