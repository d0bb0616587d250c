//! `sluice`, the command-line tool: ping a node; spend, peek at, refund or
//! reset a key's limits (one token bucket with `--rate`, any composite with
//! `--limit SPEC...`, or a server tier with `--tier NAME`); acquire, release
//! and renew concurrency leases; reload the node's tiers; show its stats;
//! show its replication role; promote a follower to primary.
//!
//! Exit codes: 0 allowed (or the command succeeded), 1 denied (throttle,
//! peek, acquire), 2 error (including usage errors).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use sluice_cli::bench::{BenchConfig, Target};
use sluice_cli::report::{self, verdict_json};
use sluice_client::{inline_reserved, Client, ClientConfig, ClusterConfig, Error};
use sluice_protocol::limit::{Concurrency, Window};
use sluice_protocol::message::{DecideOk, LeaseTarget, Limits, Mode, LIMITS_MAX};
use sluice_protocol::policy::Rate;
use sluice_protocol::{Kind, Limit, Policy, Priority, Reserved};

/// `println!` for the commands' output: when the reader has stopped
/// (`sluice stats | head`), the process ends quietly with status 0, where
/// `println!` panics (Rust ignores SIGPIPE, so the write fails instead).
macro_rules! outln {
    ($($t:tt)*) => {
        say(format_args!($($t)*))
    };
}

/// Writes one line of output (see [`outln!`]).
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(line).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("sluice: cannot write the output: {e}");
        std::process::exit(2);
    }
}

/// What `sluice --help` says after the commands.
const AFTER_HELP: &str = "\
Examples:
  sluice ping                                           is the node at 127.0.0.1:7700 up?
  sluice throttle user:42 --rate 10/s --burst 20        spend 1 unit of a token bucket
  sluice throttle user:42 --limit token-bucket:10/s,burst=20 --limit concurrency:5,lease=30s --json
  sluice peek user:42 --rate 10/s --cost 5              what spending 5 would answer (spends nothing)
  sluice --addr 127.0.0.1:7701 role                     a node's role, epoch and replication state
  sluice --cluster cluster.toml route user:1 user:2     which group and node each key goes to
  sluice drill --local --rounds 20                      a failover drill on a cluster of its own

Environment:
  SLUICE_AUTH_TOKEN   as --auth-token

Exit status: 0 allowed or done; 1 denied (throttle, peek, acquire; drill:
the replication mode's promise was broken); 2 an error (usage, connection,
server error; drill: the drill itself failed).";

/// Talk to a Sluice node.
#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Talk to a Sluice node (--addr) or cluster (--cluster): decide, inspect, operate, load-test",
    after_help = AFTER_HELP
)]
struct Cli {
    /// The node's address.
    #[arg(long, global = true, default_value = "127.0.0.1:7700")]
    addr: String,

    /// Deadline of each call, in milliseconds.
    #[arg(long, global = true, default_value_t = 1_000)]
    timeout_ms: u64,

    /// Auth token, if the node requires one.
    #[arg(long, global = true, env = "SLUICE_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,

    /// A cluster file (`[[groups]] name, primary, follower`) instead of
    /// --addr: a command on a key goes to the current primary of the key's
    /// group (found by asking the members' roles); ping, stats, role and
    /// reload go to every group's primary in turn.
    #[arg(long, global = true, value_name = "FILE")]
    cluster: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Round trip to the node.
    Ping,
    /// Spend units from a key's bucket (--rate) or limits (--limit, --tier)
    /// and print the verdict.
    Throttle(Decide),
    /// Ask what a throttle would answer, spending and creating nothing.
    Peek(Decide),
    /// Give units back to a key's limits (leases are released by id).
    Refund(Refund),
    /// Clear a key's buckets for these limits, dropping every lease.
    Reset(Reset),
    /// Spend with a concurrency limit among the limits and print the lease
    /// id(s) to release or renew later.
    Acquire(Acquire),
    /// Give a lease back before it expires.
    Release(LeaseArgs),
    /// Extend a lease by its limit's lease time, from now.
    Renew(LeaseArgs),
    /// Per-shard counters: buckets, bytes, allowed, denied, evicted,
    /// refused, keys_max; then the node's replication, as `role` prints it
    /// (JSON: under `replication`).
    Stats(JsonArg),
    /// Have the node re-read its configuration file's tiers (as SIGHUP
    /// does) and print how many it now has.
    Reload(JsonArg),
    /// The node's role (primary or follower), epoch and replication state:
    /// role, epoch, state, mode, lag_ms, keys_synced, primary, follower.
    /// With --every-ms, a line (or JSON object) per sample over one
    /// connection, until --count samples or the first error.
    Role(RoleArgs),
    /// Make this follower the primary (after its primary has died) and
    /// print its new epoch. On a fenced primary: lift the fence.
    Promote,
    /// Planned handover, sent to the primary: it stops admitting, waits
    /// until its follower has everything, hands over at a new epoch and
    /// follows it. Prints `failover: epoch=N unavailable_ms=M`.
    Failover(JsonArg),
    /// With --cluster: the group and node each key goes to, a line per key
    /// (with --json, one object per line: key, group, node).
    Route(Route),
    /// Load generator: drive a Sluice node (or Redis + Lua) and print
    /// ops/s and latency percentiles.
    Bench(BenchArgs),
    /// Failover drill: break a cluster on purpose under load (--local: one
    /// of its own; --cluster FILE --fault-cmd CMD: yours) and report how
    /// long each group could not answer and how many units were admitted
    /// beyond the limits or denied below them. Exit 0: the replication
    /// mode's promise was kept; 1: it was not; 2: the drill failed.
    Drill(sluice_cli::drill::DrillArgs),
}

#[derive(Debug, Args)]
struct Route {
    /// The routing keys (client ids).
    #[arg(required = true)]
    keys: Vec<String>,
    /// One JSON object per key and line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BenchTarget {
    /// The node at --addr, over protocol v1.
    Sluice,
    /// Redis at --redis-addr, with the token-bucket Lua script (EVALSHA).
    RedisLua,
    /// Both, one after the other with the same settings, and their ratio.
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KeyOrder {
    Random,
    Sequential,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LimitKind {
    /// Token bucket (GCRA): --rate COUNT/PERIOD, --burst (THROTTLE).
    TokenBucket,
    /// Fixed window: --rate LIMIT/WINDOW (DECIDE).
    FixedWindow,
    /// Sliding window log: --rate LIMIT/WINDOW (DECIDE).
    SlidingLog,
    /// Sliding window counter: --rate LIMIT/WINDOW (DECIDE).
    SlidingCounter,
    /// Concurrency: --rate SLOTS/LEASE, leases never released (DECIDE).
    Concurrency,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// What to drive.
    #[arg(long, value_enum, default_value = "sluice")]
    target: BenchTarget,
    /// Redis address, for --target redis-lua.
    #[arg(long, default_value = "127.0.0.1:6379")]
    redis_addr: String,
    /// Concurrent connections.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Requests per write on each connection (pipeline depth / batch size).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// Keyspace: keys key:0 .. key:N-1, picked uniformly at random.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Stop after this many requests...
    #[arg(long, default_value_t = 1_000_000)]
    requests: u64,
    /// ... or after this many seconds, whichever comes first.
    #[arg(long, default_value_t = 30.0)]
    duration_s: f64,
    /// The limit kind every request uses.
    #[arg(long, value_enum, default_value = "token-bucket")]
    kind: LimitKind,
    /// The limit's rate.
    #[arg(long, default_value = "1000/s")]
    rate: Rate,
    /// The limit's burst; default: the rate's count.
    #[arg(long)]
    burst: Option<u64>,
    /// Send every key on one connection's shard regardless of owner (the
    /// server forwards), instead of a connection per shard.
    #[arg(long)]
    no_shard_aware: bool,
    /// Key order: random (uniform over --keys) or sequential (0, 1, 2, ...;
    /// with --requests equal to --keys, every key exactly once).
    #[arg(long, value_enum, default_value = "random")]
    key_order: KeyOrder,
    /// Generator threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Sluice only: keep a share of the limit for a class, CLASS:P%
    /// (critical:20%, normal:50%); repeat it for both. Sent as a DECIDE.
    #[arg(long, value_name = "CLASS:P%", value_parser = parse_reserve_flag)]
    reserve: Vec<(Priority, u16)>,
    /// Sluice only: draw each request's class by these weights,
    /// LOW,NORMAL,CRITICAL (60,30,10), and report what each class sent and
    /// was admitted, and its admissions over time.
    #[arg(long, value_name = "LOW,NORMAL,CRITICAL", value_parser = parse_mix)]
    priority_mix: Option<[u32; 3]>,
    /// With --priority-mix: the step of the timeline, in ms.
    #[arg(long, default_value_t = 250)]
    interval_ms: u64,
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_reserve_flag(value: &str) -> Result<(Priority, u16), String> {
    sluice_protocol::priority::parse_reserve(value).map_err(|e| e.to_string())
}

fn parse_mix(value: &str) -> Result<[u32; 3], String> {
    let bad =
        || format!("expected three weights LOW,NORMAL,CRITICAL such as 60,30,10, not {value:?}");
    let weights: Vec<u32> = value
        .split(',')
        .map(|w| w.trim().parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let mix: [u32; 3] = weights.try_into().map_err(|_| bad())?;
    if mix.iter().all(|&w| w == 0) {
        return Err("a class mix needs a weight above 0".into());
    }
    Ok(mix)
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("limits").required(true).args(["rate", "limit", "tier"])))]
struct Decide {
    /// The routing key (client id).
    key: String,
    /// Rate as COUNT/PERIOD: 10/s, 100/250ms, 5/10s, 1000/m, 1/h, 1/d (one
    /// token bucket, with THROTTLE or PEEK).
    #[arg(long)]
    rate: Option<Rate>,
    /// Most units at once; default: the rate's count.
    #[arg(long, conflicts_with_all = ["limit", "tier"])]
    burst: Option<u64>,
    /// A limit; repeat it for a composite. SPEC is one of
    /// token-bucket:10/s,burst=20  fixed-window:100/1m  sliding-log:100/1m
    /// sliding-counter:100/1m  concurrency:10,lease=30s
    /// and may add reserves: ...,reserve=critical:20%,reserve=normal:50%
    #[arg(long, value_name = "SPEC")]
    limit: Vec<Reserved>,
    /// A tier of the node's configuration, by name.
    #[arg(long, value_name = "NAME")]
    tier: Option<String>,
    /// Units to spend.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// The request's class: critical may spend every reserve, normal
    /// (the default) what is not reserved for critical, low only what no
    /// reserve keeps. With --rate there are no reserves: it changes
    /// nothing.
    #[arg(long, value_name = "CLASS", default_value_t = Priority::Normal)]
    priority: Priority,
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

/// The limits of a DECIDE: inline (`--limit`, repeated) or a tier.
#[derive(Debug, Args)]
#[group(id = "limits", required = true, multiple = false)]
struct LimitsArgs {
    /// A limit; repeat it for a composite, in the same order every time
    /// (the position names the bucket). SPEC is one of
    /// token-bucket:10/s,burst=20  fixed-window:100/1m  sliding-log:100/1m
    /// sliding-counter:100/1m  concurrency:10,lease=30s
    /// and may add reserves: ...,reserve=critical:20%,reserve=normal:50%
    #[arg(long, value_name = "SPEC")]
    limit: Vec<Reserved>,
    /// A tier of the node's configuration, by name.
    #[arg(long, value_name = "NAME")]
    tier: Option<String>,
}

impl LimitsArgs {
    fn get(&self) -> Result<Limits<'_>, Error> {
        limits_of(&self.limit, &self.tier)
    }
}

#[derive(Debug, Args)]
struct Refund {
    /// The routing key (client id).
    key: String,
    #[command(flatten)]
    limits: LimitsArgs,
    /// Units to give back to every limit (never above its limit).
    #[arg(long)]
    cost: u64,
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct Reset {
    /// The routing key (client id).
    key: String,
    #[command(flatten)]
    limits: LimitsArgs,
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct Acquire {
    /// The routing key (client id).
    key: String,
    #[command(flatten)]
    limits: LimitsArgs,
    /// Slots to take (and units of every other limit to spend).
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// The request's class (see `sluice throttle --help`).
    #[arg(long, value_name = "CLASS", default_value_t = Priority::Normal)]
    priority: Priority,
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct LeaseArgs {
    /// The routing key the lease was acquired under.
    key: String,
    /// The lease id, as acquire printed it.
    #[arg(long, value_name = "ID")]
    lease: u64,
    /// The concurrency limit: either that one limit, or every limit of the
    /// acquire, in order; or the acquire's tier.
    #[command(flatten)]
    limits: LimitsArgs,
    /// The concurrency limit's position among the limits that acquired the
    /// lease. Default with --limit: the position of the one concurrency
    /// limit among the --limit flags (0 for a single one). Required with
    /// --tier.
    #[arg(long, required_unless_present = "limit")]
    index: Option<u8>,
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct JsonArg {
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RoleArgs {
    /// Print exactly one JSON object (with --every-ms: one per line).
    #[arg(long)]
    json: bool,
    /// Ask again every this many milliseconds over the same connection
    /// and print each answer (a lag sampler that costs one round trip a
    /// sample, not a process).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    every_ms: Option<u64>,
    /// With --every-ms: stop after this many samples (default: until
    /// killed or a request fails).
    #[arg(long, requires = "every_ms", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Drill(args) = cli.command {
        // Its own runtime: load, proxies and processes at once, and room
        // to block on a process without stalling the load.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime builds");
        let global = sluice_cli::drill::Global {
            cluster: cli.cluster,
            timeout_ms: cli.timeout_ms,
            auth_token: cli.auth_token,
        };
        return ExitCode::from(rt.block_on(sluice_cli::drill::run(args, global)));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime builds");
    // Boxed: the command futures are large (a debug build overflows the
    // main stack with them inline).
    match rt.block_on(Box::pin(run(cli))) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: {e}");
            if let Some(hint) = hint(&e) {
                eprintln!("sluice: {hint}");
            }
            ExitCode::from(2)
        }
    }
}

/// What to do about an error, when the error alone does not say.
fn hint(e: &Error) -> Option<String> {
    match e {
        Error::Connect { addr, source } if source.kind() == std::io::ErrorKind::ConnectionRefused => {
            let port = addr.rsplit(':').next().unwrap_or("7700");
            Some(format!(
                "is sluiced running on {addr}? Start it with `sluiced --port {port}`, or name another node with --addr"
            ))
        }
        Error::Timeout(_) => Some(
            "no answer in time: is --addr the node's protocol port (--port, default 7700), not its RESP port?"
                .to_owned(),
        ),
        _ => None,
    }
}

/// Shortest deadline `sluice failover` uses (acks, then the promotion).
const FAILOVER_TIMEOUT_MS: u64 = 5_000;

/// The key a command names, if it names one.
fn key_of(command: &Command) -> Option<&str> {
    match command {
        Command::Throttle(d) | Command::Peek(d) => Some(&d.key),
        Command::Refund(r) => Some(&r.key),
        Command::Reset(r) => Some(&r.key),
        Command::Acquire(a) => Some(&a.key),
        Command::Release(l) | Command::Renew(l) => Some(&l.key),
        _ => None,
    }
}

/// `sluice --cluster FILE ...`: `route`, or the command run against the
/// key's group's primary, or (keyless commands) against every group's.
async fn run_cluster(mut cli: Cli, path: std::path::PathBuf) -> Result<ExitCode, Error> {
    let config = ClusterConfig {
        client: ClientConfig {
            deadline: Duration::from_millis(cli.timeout_ms),
            connect_timeout: Duration::from_millis(cli.timeout_ms),
            shard_aware: false,
            auth_token: cli.auth_token.clone(),
            known_epoch: 0,
            layout_hash: 0,
        },
        ..ClusterConfig::default()
    };
    let (_, cluster) = sluice_cli::open_cluster(&path, config).await?;
    if let Command::Route(r) = &cli.command {
        for key in &r.keys {
            let (group, node) = cluster.locate(key.as_bytes()).await;
            let node = node.unwrap_or_default();
            if r.json {
                outln!(
                    "{}",
                    serde_json::json!({"key": key, "group": group, "node": node})
                );
            } else {
                outln!(
                    "{key} group={group} node={}",
                    if node.is_empty() { "-" } else { &node }
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Bench(b) = cli.command {
        let mut groups = Vec::new();
        for (name, node) in cluster.primaries().await {
            let node =
                node.ok_or_else(|| Error::Invalid(format!("group {name} has no primary")))?;
            groups.push((name, resolve(&node).await?));
        }
        return bench(&cli.addr, cli.auth_token, b, Some(groups)).await;
    }
    if let Some(key) = key_of(&cli.command) {
        let (group, node) = cluster.locate(key.as_bytes()).await;
        cli.addr = node
            .ok_or_else(|| Error::Invalid(format!("group {group} has no primary that answers")))?;
        cli.cluster = None;
        return Box::pin(run(cli)).await;
    }
    if !matches!(
        cli.command,
        Command::Ping | Command::Stats(_) | Command::Role(_) | Command::Reload(_)
    ) {
        return Err(Error::Invalid(
            "this command names a node: give --addr".into(),
        ));
    }
    let mut code = ExitCode::SUCCESS;
    for (group, node) in cluster.primaries().await {
        let Some(node) = node else {
            outln!("group {group}: no primary answers");
            code = ExitCode::from(2);
            continue;
        };
        outln!("group {group} at {node}:");
        let one = Cli {
            addr: node,
            timeout_ms: cli.timeout_ms,
            auth_token: cli.auth_token.clone(),
            cluster: None,
            command: match &cli.command {
                Command::Ping => Command::Ping,
                Command::Stats(a) => Command::Stats(JsonArg { json: a.json }),
                Command::Role(a) => Command::Role(RoleArgs {
                    json: a.json,
                    every_ms: a.every_ms,
                    count: a.count,
                }),
                Command::Reload(a) => Command::Reload(JsonArg { json: a.json }),
                _ => unreachable!("checked above"),
            },
        };
        Box::pin(run(one)).await?;
    }
    Ok(code)
}

/// `sluice --addr NODE route KEY...`: the node (started with `--cluster`)
/// says which group owns each key and where that group's primary is.
async fn route_through(cli: &Cli, r: &Route) -> Result<ExitCode, Error> {
    let config = ClientConfig {
        deadline: Duration::from_millis(cli.timeout_ms),
        connect_timeout: Duration::from_millis(cli.timeout_ms),
        shard_aware: false,
        auth_token: cli.auth_token.clone(),
        ..ClientConfig::default()
    };
    let client = Client::connect_with(cli.addr.as_str(), config).await?;
    for key in &r.keys {
        let c = client.cluster(key.as_bytes()).await?;
        let Some(group) = c.owner.and_then(|i| c.groups.get(usize::from(i))) else {
            return Err(Error::Invalid(format!(
                "{} knows no cluster (start it with --cluster FILE --group NAME), or give route --cluster FILE",
                cli.addr
            )));
        };
        if r.json {
            let v = serde_json::json!({"key": key, "group": group.name, "node": group.primary});
            outln!("{v}");
        } else {
            outln!("{key} group={} node={}", group.name, group.primary);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    if let Some(path) = cli.cluster.clone() {
        return run_cluster(cli, path).await;
    }
    if let Command::Route(r) = &cli.command {
        return route_through(&cli, r).await;
    }
    if let Command::Bench(b) = cli.command {
        return bench(&cli.addr, cli.auth_token, b, None).await;
    }
    // A handover waits for acks and for the follower's promotion.
    let timeout_ms = if matches!(cli.command, Command::Failover(_)) {
        cli.timeout_ms.max(FAILOVER_TIMEOUT_MS)
    } else {
        cli.timeout_ms
    };
    let config = ClientConfig {
        deadline: Duration::from_millis(timeout_ms),
        connect_timeout: Duration::from_millis(cli.timeout_ms),
        // One call: no point opening a connection per shard.
        shard_aware: false,
        auth_token: cli.auth_token,
        known_epoch: 0,
        layout_hash: 0,
    };
    let client = Client::connect_with(cli.addr.as_str(), config).await?;
    match cli.command {
        Command::Ping => ping(&client, &cli.addr).await,
        Command::Throttle(d) => decide(&client, d, false).await,
        Command::Peek(d) => decide(&client, d, true).await,
        Command::Refund(r) => {
            let ok = client
                .refund(r.key.as_bytes(), r.limits.get()?, r.cost)
                .await?;
            print_decide(&ok, r.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Reset(r) => {
            let ok = client.reset(r.key.as_bytes(), r.limits.get()?).await?;
            print_decide(&ok, r.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Acquire(a) => acquire(&client, a).await,
        Command::Release(a) => lease(&client, a, false).await,
        Command::Renew(a) => lease(&client, a, true).await,
        Command::Stats(a) => stats(&client, a).await,
        Command::Reload(a) => reload(&client, a).await,
        Command::Role(a) => role(&client, a).await,
        Command::Promote => {
            let epoch = client.promote().await?;
            outln!("{}", report::promote_text(epoch));
            Ok(ExitCode::SUCCESS)
        }
        Command::Failover(a) => failover(&client, a).await,
        Command::Bench(_) | Command::Route(_) | Command::Drill(_) => unreachable!("handled above"),
    }
}

/// `sluice ping`: one round trip, and what the node said in HELLO.
async fn ping(client: &Client, addr: &str) -> Result<ExitCode, Error> {
    let rtt = client.ping().await?;
    let h = client.hello();
    outln!(
        "PONG from {} in {:.3} ms (node {:016x}, {} shards, epoch {})",
        addr,
        rtt.as_secs_f64() * 1e3,
        h.node_id,
        h.shard_count,
        h.epoch
    );
    Ok(ExitCode::SUCCESS)
}

/// `sluice stats`: the node's counters, and its replication too (as
/// `sluice role` prints it).
async fn stats(client: &Client, a: JsonArg) -> Result<ExitCode, Error> {
    let stats = client.stats().await?;
    let role = client.role().await?;
    if a.json {
        let mut v = report::stats_json(&stats);
        v["replication"] = report::role_json(&role);
        outln!("{v}");
    } else {
        outln!("{}", report::stats_text(&stats));
        outln!("replication: {}", report::role_text(&role));
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice reload`: the node re-reads its tiers.
async fn reload(client: &Client, a: JsonArg) -> Result<ExitCode, Error> {
    let tier_count = client.reload().await?;
    if a.json {
        outln!("{}", serde_json::json!({ "tier_count": tier_count }));
    } else {
        outln!("reloaded: {tier_count} tiers");
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice role`: once, or every `--every-ms` (`--count` times).
async fn role(client: &Client, a: RoleArgs) -> Result<ExitCode, Error> {
    let every = a.every_ms.map(Duration::from_millis);
    let mut tick = every.map(|d| {
        let mut t = tokio::time::interval(d);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut left = a
        .count
        .unwrap_or(if every.is_some() { u64::MAX } else { 1 });
    while left > 0 {
        if let Some(t) = tick.as_mut() {
            t.tick().await;
        }
        let role = client.role().await?;
        if a.json {
            let mut v = report::role_json(&role);
            // The cluster the node knows (--cluster); null for a
            // lone node, or one too old to say.
            let cluster = match client.cluster(b"").await {
                Ok(c) if c.layout != 0 => report::cluster_json(&c),
                _ => serde_json::Value::Null,
            };
            v["cluster"] = cluster;
            outln!("{v}");
        } else {
            outln!("{}", report::role_text(&role));
        }
        left -= 1;
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice failover`: a planned handover to the follower.
async fn failover(client: &Client, a: JsonArg) -> Result<ExitCode, Error> {
    let ok = client.failover().await?;
    let unavailable_ms = ok.unavailable_us as f64 / 1_000.0;
    if a.json {
        let v = serde_json::json!({"epoch": ok.epoch, "unavailable_ms": unavailable_ms});
        outln!("{v}");
    } else {
        outln!(
            "failover: epoch={} unavailable_ms={unavailable_ms:.3}",
            ok.epoch
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice bench`; with `cluster` (each group's name and primary), the
/// connections are spread over the groups and each key goes to its group.
async fn bench(
    addr: &str,
    auth_token: Option<String>,
    b: BenchArgs,
    cluster: Option<Vec<(String, SocketAddr)>>,
) -> Result<ExitCode, Error> {
    if cluster.is_some() && b.target != BenchTarget::Sluice {
        return Err(Error::Invalid(
            "--cluster drives Sluice only (--target sluice)".into(),
        ));
    }
    let groups = cluster.map(|groups| keys_by_group(&groups, b.keys));
    let (policy, limit) = bench_limit(&b)?;
    if b.target != BenchTarget::Sluice && b.kind != LimitKind::TokenBucket {
        return Err(Error::Invalid(
            "Redis runs the token-bucket script only: use --kind token-bucket".into(),
        ));
    }
    if !(b.duration_s > 0.0 && b.duration_s <= 3_600.0) {
        return Err(Error::Invalid("--duration-s must be in (0, 3600]".into()));
    }
    let mut reserves = sluice_protocol::Reserves::NONE;
    for &(class, bp) in &b.reserve {
        reserves.set(class, bp);
    }
    let config = |target: Target, addr: SocketAddr| BenchConfig {
        target,
        addr,
        connections: b.connections,
        pipeline: b.pipeline,
        keys: b.keys,
        requests: b.requests,
        duration: Duration::from_secs_f64(b.duration_s),
        policy,
        limit,
        shard_aware: !b.no_shard_aware,
        sequential: b.key_order == KeyOrder::Sequential,
        auth_token: auth_token.clone(),
        groups: if target == Target::Sluice {
            groups.clone()
        } else {
            None
        },
        reserves,
        mix: b.priority_mix,
        interval: Duration::from_millis(b.interval_ms),
    };
    let sluice =
        |a| async move { sluice_cli::bench::run(config(Target::Sluice, resolve(a).await?)).await };
    let redis = || async {
        sluice_cli::bench::run(config(Target::RedisLua, resolve(&b.redis_addr).await?)).await
    };
    match b.target {
        BenchTarget::Sluice | BenchTarget::RedisLua => {
            let report = if b.target == BenchTarget::Sluice {
                sluice(addr).await?
            } else {
                redis().await?
            };
            if b.json {
                outln!(
                    "{}",
                    serde_json::to_string(&report).expect("a report serializes")
                );
            } else {
                outln!("{report}");
            }
        }
        BenchTarget::Both => {
            let s = sluice(addr).await?;
            let r = redis().await?;
            print_both(&s, &r, b.json);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Which key numbers of `0..keys` each group owns, as the cluster client
/// routes them, with the group's address (groups that own none left out).
fn keys_by_group(
    groups: &[(String, SocketAddr)],
    keys: u64,
) -> Vec<(SocketAddr, std::sync::Arc<Vec<u32>>)> {
    let ring = sluice_protocol::ring::Ring::new(groups.iter().map(|(n, _)| n.as_str()));
    let mut owned: Vec<Vec<u32>> = vec![Vec::new(); groups.len()];
    let mut buf = [0u8; sluice_cli::bench::keys::KEY_BYTES_MAX];
    for n in 0..keys {
        let key = sluice_cli::bench::keys::format_key(&mut buf, n);
        owned[ring.group_of(sluice_protocol::routing::key_hash(key))].push(n as u32);
    }
    groups
        .iter()
        .zip(owned)
        .filter(|(_, k)| !k.is_empty())
        .map(|((_, addr), k)| (*addr, std::sync::Arc::new(k)))
        .collect()
}

/// The bench's policy (`--rate`, `--burst`) and the limit of `--kind`
/// made of it, validated.
fn bench_limit(b: &BenchArgs) -> Result<(Policy, Limit), Error> {
    let burst = b.burst.unwrap_or(b.rate.count);
    let policy = Policy::new(b.rate.count, b.rate.period_ns, burst)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let (count, period_ns) = (b.rate.count, b.rate.period_ns);
    let window = Window {
        limit: count,
        window_ns: period_ns,
    };
    let limit = match b.kind {
        LimitKind::TokenBucket => Limit::TokenBucket(policy),
        LimitKind::FixedWindow => Limit::FixedWindow(window),
        LimitKind::SlidingLog => Limit::SlidingLog(window),
        LimitKind::SlidingCounter => Limit::SlidingCounter(window),
        LimitKind::Concurrency => Limit::Concurrency(Concurrency {
            limit: count,
            lease_ns: period_ns,
        }),
    };
    limit
        .validate()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    Ok((policy, limit))
}

/// `--target both`: each report, and Sluice's against Redis + Lua's.
fn print_both(s: &sluice_cli::bench::Report, r: &sluice_cli::bench::Report, json: bool) {
    let ratio = s.ops_per_s / r.ops_per_s;
    let p99_ratio = s.latency_us.p99 / r.latency_us.p99;
    if json {
        let both = serde_json::json!({"sluice": s, "redis_lua": r, "ops_ratio": ratio, "p99_ratio": p99_ratio});
        outln!("{both}");
    } else {
        outln!("{s}\n{r}\nSluice / Redis + Lua: {ratio:.1}x ops/s, p99 {p99_ratio:.2}x");
    }
}

async fn resolve(addr: &str) -> Result<SocketAddr, Error> {
    tokio::net::lookup_host(addr)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Invalid(format!("cannot resolve {addr}")))
}

/// THROTTLE or PEEK with `--rate`, exactly as before DECIDE existed;
/// otherwise DECIDE in SPEND or PROBE mode.
async fn decide(client: &Client, d: Decide, peek: bool) -> Result<ExitCode, Error> {
    let Some(rate) = d.rate else {
        let limits = limits_of(&d.limit, &d.tier)?;
        let mode = if peek { Mode::Probe } else { Mode::Spend };
        let ok = client
            .decide_as(d.key.as_bytes(), limits, mode, d.cost, d.priority)
            .await?;
        print_decide(&ok, d.json);
        return Ok(allowed_code(ok.allowed));
    };
    let burst = d.burst.unwrap_or(rate.count);
    let policy = Policy::new(rate.count, rate.period_ns, burst)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let v = if peek {
        client.peek(d.key.as_bytes(), policy, d.cost).await?
    } else {
        client.throttle(d.key.as_bytes(), policy, d.cost).await?
    };
    if d.json {
        outln!("{}", verdict_json(&v));
    } else {
        outln!("{}", report::verdict_line(&v));
    }
    Ok(allowed_code(v.allowed))
}

/// A SPEND that must take a lease: with inline limits, one of them is a
/// concurrency limit (a tier's limits are the node's to know).
async fn acquire(client: &Client, a: Acquire) -> Result<ExitCode, Error> {
    let limits = a.limits.get()?;
    if let Limits::Inline(set) = &limits {
        if !set.iter().any(|l| l.kind() == Kind::Concurrency) {
            return Err(Error::Invalid(
                "acquire takes a lease: add a --limit concurrency:N[,lease=PERIOD]".into(),
            ));
        }
    }
    if a.cost == 0 {
        return Err(Error::Invalid("a cost of 0 acquires no lease".into()));
    }
    let ok = client
        .decide_as(a.key.as_bytes(), limits, Mode::Spend, a.cost, a.priority)
        .await?;
    print_decide(&ok, a.json);
    Ok(allowed_code(ok.allowed))
}

/// RELEASE (`renew == false`) or RENEW.
async fn lease(client: &Client, a: LeaseArgs, renew: bool) -> Result<ExitCode, Error> {
    let target = lease_target(&a.limits, a.index)?;
    let key = a.key.as_bytes();
    let ok = if renew {
        client.renew(key, target, a.lease).await?
    } else {
        client.release(key, target, a.lease).await?
    };
    if a.json {
        outln!("{}", report::lease_json(&ok));
    } else {
        outln!("{}", report::lease_text(&ok, renew));
    }
    Ok(ExitCode::SUCCESS)
}

/// The limits named by `--limit` flags or `--tier` (clap lets exactly one
/// of them through).
fn limits_of<'a>(limit: &[Reserved], tier: &'a Option<String>) -> Result<Limits<'a>, Error> {
    match tier {
        Some(name) => Ok(Limits::Tier(name)),
        None => inline_reserved(limit),
    }
}

/// The concurrency limit a RELEASE or RENEW names. `--tier` takes
/// `--index` as is. A single `--limit` is that concurrency limit, at
/// position `--index` (default 0) of the acquire; several are the
/// acquire's limits, and `--index` (default: the one concurrency limit's
/// position) picks one of them.
fn lease_target(limits: &LimitsArgs, index: Option<u8>) -> Result<LeaseTarget<'_>, Error> {
    if let Some(name) = &limits.tier {
        let index = index.ok_or_else(|| Error::Invalid("--tier needs --index".into()))?;
        return Ok(LeaseTarget::Tier { name, index });
    }
    let (position, at) = match (limits.limit.as_slice(), index) {
        ([one], index) => (index.unwrap_or(0), one.limit),
        (_, _) if limits.limit.len() > LIMITS_MAX => {
            return Err(Error::Invalid(format!(
                "at most {LIMITS_MAX} --limit flags"
            )))
        }
        (all, Some(i)) => {
            let limit = all.get(usize::from(i)).ok_or_else(|| {
                Error::Invalid(format!(
                    "--index {i} names none of the {} limits",
                    all.len()
                ))
            })?;
            (i, limit.limit)
        }
        (all, None) => {
            let mut found = all
                .iter()
                .enumerate()
                .filter(|(_, l)| l.limit.kind() == Kind::Concurrency);
            match (found.next(), found.next()) {
                (Some((i, l)), None) => (i as u8, l.limit),
                _ => {
                    return Err(Error::Invalid(
                        "name the concurrency limit's position with --index".into(),
                    ))
                }
            }
        }
    };
    match at {
        Limit::Concurrency(limit) => Ok(LeaseTarget::Inline {
            index: position,
            limit,
        }),
        other => Err(Error::Invalid(format!(
            "leases belong to concurrency limits, not to {} (limit {position})",
            other.kind()
        ))),
    }
}

fn print_decide(ok: &DecideOk, json: bool) {
    if json {
        outln!("{}", report::decide_json(ok));
    } else {
        outln!("{}", report::decide_text(ok));
    }
}

fn allowed_code(allowed: bool) -> ExitCode {
    if allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("sluice").chain(args.iter().copied()))
    }

    fn usage_error(args: &[&str]) -> clap::error::ErrorKind {
        parse(args).expect_err("a usage error").kind()
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn throttle_takes_exactly_one_of_rate_limits_and_tier() {
        use clap::error::ErrorKind;
        assert!(parse(&["throttle", "k", "--rate", "5/s", "--burst", "2"]).is_ok());
        assert!(parse(&["peek", "k", "--limit", "fixed-window:3/m"]).is_ok());
        let composite = [
            "throttle",
            "k",
            "--limit",
            "token-bucket:5/s",
            "--limit",
            "concurrency:2",
        ];
        let Command::Throttle(d) = parse(&composite).unwrap().command else {
            panic!("throttle");
        };
        assert_eq!(d.limit.len(), 2);
        assert!(parse(&["throttle", "k", "--tier", "free", "--cost", "3"]).is_ok());
        assert_eq!(
            usage_error(&["throttle", "k"]),
            ErrorKind::MissingRequiredArgument
        );
        for both in [
            ["throttle", "k", "--rate", "5/s", "--tier", "free"],
            ["throttle", "k", "--rate", "5/s", "--limit", "concurrency:1"],
            ["peek", "k", "--tier", "free", "--limit", "concurrency:1"],
        ] {
            assert_eq!(usage_error(&both), ErrorKind::ArgumentConflict, "{both:?}");
        }
        // --burst belongs to --rate.
        let burst = ["throttle", "k", "--limit", "concurrency:1", "--burst", "2"];
        assert_eq!(usage_error(&burst), ErrorKind::ArgumentConflict);
        let burst = ["throttle", "k", "--burst", "2"];
        assert_eq!(usage_error(&burst), ErrorKind::MissingRequiredArgument);
        let bad = ["throttle", "k", "--limit", "leaky-bucket:1/s"];
        assert_eq!(usage_error(&bad), ErrorKind::ValueValidation);
    }

    #[test]
    fn new_subcommands_parse() {
        use clap::error::ErrorKind;
        assert!(parse(&["refund", "k", "--tier", "free", "--cost", "2"]).is_ok());
        assert_eq!(
            usage_error(&["refund", "k", "--tier", "free"]),
            ErrorKind::MissingRequiredArgument
        );
        assert!(parse(&["reset", "k", "--limit", "sliding-log:3/s"]).is_ok());
        assert_eq!(
            usage_error(&["reset", "k"]),
            ErrorKind::MissingRequiredArgument
        );
        assert!(parse(&["acquire", "k", "--limit", "concurrency:1,lease=200ms"]).is_ok());
        assert!(parse(&["release", "k", "--lease", "7", "--limit", "concurrency:1"]).is_ok());
        assert!(parse(&["renew", "k", "--lease", "7", "--tier", "t", "--index", "1"]).is_ok());
        assert_eq!(
            usage_error(&["renew", "k", "--lease", "7", "--tier", "t"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            usage_error(&["release", "k", "--limit", "concurrency:1"]),
            ErrorKind::MissingRequiredArgument
        );
        assert!(parse(&["stats", "--json"]).is_ok());
        assert!(parse(&["reload"]).is_ok());
        assert!(matches!(
            parse(&["role", "--json"]).unwrap().command,
            Command::Role(RoleArgs {
                json: true,
                every_ms: None,
                count: None
            })
        ));
        assert!(matches!(
            parse(&["role", "--json", "--every-ms", "20", "--count", "3"])
                .unwrap()
                .command,
            Command::Role(RoleArgs {
                json: true,
                every_ms: Some(20),
                count: Some(3)
            })
        ));
        assert_eq!(
            usage_error(&["role", "--count", "3"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            usage_error(&["role", "--every-ms", "0"]),
            ErrorKind::ValueValidation
        );
        assert!(parse(&["--addr", "127.0.0.1:7701", "role"]).is_ok());
        assert!(matches!(
            parse(&["promote"]).unwrap().command,
            Command::Promote
        ));
        assert_eq!(
            usage_error(&["promote", "--json"]),
            ErrorKind::UnknownArgument
        );
    }

    fn target(args: &[&str]) -> Result<(u8, u64), String> {
        let mut all = vec!["release", "k", "--lease", "1"];
        all.extend_from_slice(args);
        let Command::Release(a) = parse(&all).unwrap().command else {
            panic!("release");
        };
        match lease_target(&a.limits, a.index) {
            Ok(LeaseTarget::Inline { index, limit }) => Ok((index, limit.limit)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn a_lease_names_its_concurrency_limit_by_position() {
        let c = "concurrency:4,lease=1s";
        assert_eq!(target(&["--limit", c]), Ok((0, 4)));
        assert_eq!(target(&["--limit", c, "--index", "2"]), Ok((2, 4)));
        // The acquire's limits again: the concurrency limit is found.
        let tb = "token-bucket:5/s";
        assert_eq!(target(&["--limit", tb, "--limit", c]), Ok((1, 4)));
        assert_eq!(
            target(&["--limit", c, "--limit", tb, "--index", "0"]),
            Ok((0, 4))
        );
        let not = target(&["--limit", c, "--limit", tb, "--index", "1"]).unwrap_err();
        assert!(not.contains("token-bucket"), "{not}");
        assert!(target(&["--limit", tb]).is_err());
        let two = target(&["--limit", c, "--limit", c]).unwrap_err();
        assert!(two.contains("--index"), "{two}");
        assert!(target(&["--limit", c, "--limit", tb, "--index", "2"]).is_err());
        let Command::Renew(a) =
            parse(&["renew", "k", "--lease", "3", "--tier", "t", "--index", "1"])
                .unwrap()
                .command
        else {
            panic!("renew");
        };
        assert_eq!(
            lease_target(&a.limits, a.index).unwrap(),
            LeaseTarget::Tier {
                name: "t",
                index: 1
            }
        );
    }
}
