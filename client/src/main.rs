//! `sluice`, the command-line tool: ping a node, spend or peek at a bucket.
//!
//! Exit codes: 0 allowed (or ping answered), 1 denied, 2 error.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
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
    }
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
