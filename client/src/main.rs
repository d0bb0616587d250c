//! `sluice`, the command-line tool: ping a node, spend or peek at a bucket.
//!
//! Exit codes: 0 allowed (or ping answered), 1 denied, 2 error.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sluice_client::bench::{BenchConfig, Target};
use sluice_client::{Client, ClientConfig, Error};
use sluice_protocol::policy::Rate;
use sluice_protocol::{Policy, Verdict};

/// Talk to a Sluice node.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
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

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Round trip to the node.
    Ping,
    /// Spend units from a key's bucket and print the verdict.
    Throttle(Decide),
    /// Ask what a throttle would answer, spending and creating nothing.
    Peek(Decide),
    /// Load generator: drive a Sluice node (or Redis + Lua) and print
    /// ops/s and latency percentiles.
    Bench(BenchArgs),
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BenchTarget {
    /// The node at --addr, over protocol v1.
    Sluice,
    /// Redis at --redis-addr, with the token-bucket Lua script (EVALSHA).
    RedisLua,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KeyOrder {
    Random,
    Sequential,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LimitKind {
    /// Token bucket (GCRA).
    TokenBucket,
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
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct Decide {
    /// The routing key (client id).
    key: String,
    /// Rate as COUNT/PERIOD: 10/s, 100/250ms, 5/10s, 1000/m, 1/h, 1/d.
    #[arg(long)]
    rate: Rate,
    /// Most units at once; default: the rate's count.
    #[arg(long)]
    burst: Option<u64>,
    /// Units to spend.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Print exactly one JSON object.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime builds");
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    if let Command::Bench(b) = cli.command {
        return bench(&cli.addr, cli.auth_token, b).await;
    }
    let config = ClientConfig {
        deadline: Duration::from_millis(cli.timeout_ms),
        connect_timeout: Duration::from_millis(cli.timeout_ms),
        // One call: no point opening a connection per shard.
        shard_aware: false,
        auth_token: cli.auth_token,
    };
    let client = Client::connect_with(cli.addr.as_str(), config).await?;
    match cli.command {
        Command::Ping => {
            let rtt = client.ping().await?;
            let h = client.hello();
            println!(
                "PONG from {} in {:.3} ms (node {:016x}, {} shards, epoch {})",
                cli.addr,
                rtt.as_secs_f64() * 1e3,
                h.node_id,
                h.shard_count,
                h.epoch
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Throttle(d) => decide(&client, d, false).await,
        Command::Peek(d) => decide(&client, d, true).await,
        Command::Bench(_) => unreachable!("handled above"),
    }
}

async fn bench(addr: &str, auth_token: Option<String>, b: BenchArgs) -> Result<ExitCode, Error> {
    let (target, addr) = match b.target {
        BenchTarget::Sluice => (Target::Sluice, addr),
        BenchTarget::RedisLua => (Target::RedisLua, b.redis_addr.as_str()),
    };
    let LimitKind::TokenBucket = b.kind;
    let addr = tokio::net::lookup_host(addr)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Invalid(format!("cannot resolve {addr}")))?;
    let burst = b.burst.unwrap_or(b.rate.count);
    let policy = Policy::new(b.rate.count, b.rate.period_ns, burst)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    if !(b.duration_s > 0.0 && b.duration_s <= 3_600.0) {
        return Err(Error::Invalid("--duration-s must be in (0, 3600]".into()));
    }
    let config = BenchConfig {
        target,
        addr,
        connections: b.connections,
        pipeline: b.pipeline,
        keys: b.keys,
        requests: b.requests,
        duration: Duration::from_secs_f64(b.duration_s),
        policy,
        shard_aware: !b.no_shard_aware,
        sequential: b.key_order == KeyOrder::Sequential,
        auth_token,
    };
    let report = sluice_client::bench::run(config).await?;
    if b.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("a report serializes")
        );
    } else {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn decide(client: &Client, d: Decide, peek: bool) -> Result<ExitCode, Error> {
    let burst = d.burst.unwrap_or(d.rate.count);
    let policy = Policy::new(d.rate.count, d.rate.period_ns, burst)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let v = if peek {
        client.peek(d.key.as_bytes(), policy, d.cost).await?
    } else {
        client.throttle(d.key.as_bytes(), policy, d.cost).await?
    };
    if d.json {
        println!("{}", verdict_json(&v));
    } else {
        println!(
            "{} limit={} remaining={} retry_after={}ms reset_after={}ms",
            if v.allowed { "allowed" } else { "denied" },
            v.limit,
            v.remaining,
            ceil_ms(v.retry_after_ns),
            ceil_ms(v.reset_after_ns)
        );
    }
    Ok(if v.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The verdict as the one JSON object `--json` promises.
fn verdict_json(v: &Verdict) -> serde_json::Value {
    serde_json::json!({
        "allowed": v.allowed,
        "limit": v.limit,
        "remaining": v.remaining,
        "retry_after_ms": ceil_ms(v.retry_after_ns),
        "reset_after_ms": ceil_ms(v.reset_after_ns),
    })
}

/// Milliseconds, rounded up so that waiting that long is always enough.
fn ceil_ms(ns: u64) -> u64 {
    ns.div_ceil(1_000_000)
}
