//! `sluice bench`: a closed-loop load generator. Each connection sends
//! `pipeline` requests (one frame for Sluice, one write for Redis), waits
//! for all their replies, records the round trip of each in an HDR
//! histogram, and repeats, until the request budget or the time bound runs
//! out. The same generator drives Sluice (protocol v1, shard-aware by
//! default) and Redis running the usual token-bucket Lua script, so both
//! sides of a comparison are measured the same way.
//!
//! Layout: [`keys`] picks keys, [`sluice`] and [`redis`] drive one
//! connection each, [`resp`] reads Redis replies.

pub mod keys;
pub mod redis;
pub mod resp;
pub mod sluice;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use sluice_protocol::limit::Limit;
use sluice_protocol::{Policy, Priority, Reserves};

use sluice_client::Error;

/// Highest latency the histogram records: 60 s, in nanoseconds.
const LATENCY_NS_MAX: u64 = 60_000_000_000;
/// Most connections one run may open.
pub const CONNECTIONS_MAX: usize = 4_096;
/// Deepest pipeline one connection may use.
pub const PIPELINE_MAX: usize = 4_096;

/// What to drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// A `sluiced`, over protocol v1.
    Sluice,
    /// A Redis server running the token-bucket Lua script via EVALSHA.
    RedisLua,
}

/// One benchmark run's settings.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// What to drive.
    pub target: Target,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Concurrent connections.
    pub connections: usize,
    /// Requests per write on each connection.
    pub pipeline: usize,
    /// Keys are `key:0` .. `key:{keys-1}`, picked uniformly at random.
    pub keys: u64,
    /// Stop after this many requests in all...
    pub requests: u64,
    /// ... or after this long, whichever comes first.
    pub duration: Duration,
    /// The token-bucket limit every request spends one unit of (THROTTLE,
    /// and the Redis script), when `limit` is a token bucket.
    pub policy: Policy,
    /// The limit every request spends one unit of: a token bucket goes as
    /// THROTTLE, every other kind as a one-limit DECIDE.
    pub limit: Limit,
    /// Sluice only: send each key on a connection bound to its shard.
    pub shard_aware: bool,
    /// Keys in order `0, 1, 2, ...` instead of at random (each key exactly
    /// once when `requests == keys`); not shard-aware.
    pub sequential: bool,
    /// Sluice only: the auth token, if the node needs one.
    pub auth_token: Option<String>,
    /// Sluice only: drive a cluster instead of `addr`: each group's primary
    /// and the key numbers that route to it. Connections are spread over
    /// the groups round robin; each draws only its group's keys.
    pub groups: Option<Vec<(SocketAddr, Arc<Vec<u32>>)>>,
    /// Sluice only: the limit's reserved shares (sent as a DECIDE).
    pub reserves: Reserves,
    /// Sluice only: each request's class drawn by these weights (low,
    /// normal, critical), counted by class over time; `None`: all normal.
    pub mix: Option<[u32; 3]>,
    /// With `mix`: the length of each step of the report's timeline.
    pub interval: Duration,
}

/// What one connection counted.
#[derive(Debug)]
pub struct Tally {
    /// Round trip of every request, in nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// Requests admitted.
    pub allowed: u64,
    /// Requests denied.
    pub denied: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// By class rank (low, normal, critical): requests sent, admitted.
    pub sent: [u64; 3],
    pub admitted: [u64; 3],
    /// Admitted by class in each interval since the start.
    pub timeline: Vec<[u64; 3]>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency_ns: Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3)
                .expect("valid histogram bounds"),
            allowed: 0,
            denied: 0,
            errors: 0,
            sent: [0; 3],
            admitted: [0; 3],
            timeline: Vec::new(),
        }
    }

    /// Counts a reply to a request of `class`, in timeline step `step`.
    pub(crate) fn count_class(&mut self, class: Priority, admitted: bool, step: usize) {
        let rank = usize::from(class.rank());
        self.sent[rank] += 1;
        if admitted {
            self.admitted[rank] += 1;
            if self.timeline.len() <= step {
                self.timeline.resize(step + 1, [0; 3]);
            }
            self.timeline[step][rank] += 1;
        }
    }

    /// Records `n` requests that took `rtt` each.
    fn record(&mut self, rtt: Duration, n: usize) {
        let ns = u64::try_from(rtt.as_nanos())
            .unwrap_or(u64::MAX)
            .clamp(1, LATENCY_NS_MAX);
        self.latency_ns
            .record_n(ns, n as u64)
            .expect("clamped into bounds");
    }

    fn merge(&mut self, other: Tally) {
        self.latency_ns.add(other.latency_ns).expect("same bounds");
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.errors += other.errors;
        for rank in 0..3 {
            self.sent[rank] += other.sent[rank];
            self.admitted[rank] += other.admitted[rank];
        }
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize(other.timeline.len(), [0; 3]);
        }
        for (mine, theirs) in self.timeline.iter_mut().zip(&other.timeline) {
            for rank in 0..3 {
                mine[rank] += theirs[rank];
            }
        }
    }
}

/// Latency percentiles (and the mean), in microseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    /// The mean: comparable with a mean measured elsewhere (the
    /// replication link's round trip, from a primary's histogram sum).
    pub mean: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// A run's result; `--json` prints it as one object.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: Target,
    pub addr: String,
    pub connections: usize,
    pub pipeline: usize,
    pub keys: u64,
    pub kind: &'static str,
    pub requests: u64,
    pub seconds: f64,
    pub ops_per_s: f64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    pub latency_us: Latency,
    /// With a class mix only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes: Option<Classes>,
}

/// A run with a class mix: what each class sent and was admitted, and
/// its admissions over time.
#[derive(Clone, Debug, Serialize)]
pub struct Classes {
    /// `low`, `normal`, `critical`: sent, admitted, and the class's share
    /// of everything admitted.
    pub by_class: Vec<ClassCount>,
    /// The timeline's step, in ms.
    pub interval_ms: u64,
    /// Admitted per step: `[low, normal, critical]`.
    pub timeline: Vec<[u64; 3]>,
}

/// One class's counts.
#[derive(Clone, Debug, Serialize)]
pub struct ClassCount {
    pub class: &'static str,
    pub sent: u64,
    pub admitted: u64,
    pub share: f64,
}

/// Requests not yet claimed by any connection, and the time bound.
#[derive(Debug)]
pub struct Budget {
    /// Requests left to hand out.
    left: AtomicU64,
    /// No request is handed out after this.
    stop_at: Instant,
    /// When the run started, and the timeline's step.
    start: Instant,
    interval: Duration,
}

impl Budget {
    /// The timeline step of now.
    pub(crate) fn step(&self) -> usize {
        let since = self.start.elapsed().as_nanos();
        (since / self.interval.as_nanos().max(1)) as usize
    }

    /// Claims up to `n` requests; 0 when the budget or the time is spent.
    pub fn claim(&self, n: usize) -> usize {
        if Instant::now() >= self.stop_at {
            return 0;
        }
        let mut left = self.left.load(Ordering::Relaxed);
        loop {
            let take = left.min(n as u64);
            if take == 0 {
                return 0;
            }
            match self.left.compare_exchange_weak(
                left,
                left - take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take as usize,
                Err(seen) => left = seen,
            }
        }
    }
}

impl BenchConfig {
    /// Checks the settings against their limits.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Invalid(m));
        if !(1..=CONNECTIONS_MAX).contains(&self.connections) {
            return bad(format!("connections must be 1..={CONNECTIONS_MAX}"));
        }
        if !(1..=PIPELINE_MAX).contains(&self.pipeline) {
            return bad(format!("pipeline must be 1..={PIPELINE_MAX}"));
        }
        if !(1..=u64::from(u32::MAX)).contains(&self.keys) {
            return bad(format!("keys must be 1..={}", u32::MAX));
        }
        if self.requests == 0 || self.duration.is_zero() {
            return bad("requests and duration must be positive".into());
        }
        if self.target != Target::Sluice && (self.mix.is_some() || !self.reserves.is_none()) {
            return bad("classes and reserves are Sluice's (--target sluice)".into());
        }
        if self.mix.is_some_and(|m| m.iter().all(|&w| w == 0)) {
            return bad("a class mix needs a weight above 0".into());
        }
        if self.interval.is_zero() {
            return bad("the timeline interval must be positive".into());
        }
        Ok(())
    }
}

/// Runs one benchmark and reports it.
pub async fn run(config: BenchConfig) -> Result<Report, Error> {
    config.validate()?;
    let drivers = match config.target {
        Target::Sluice => sluice::prepare(&config).await?,
        Target::RedisLua => redis::prepare(&config).await?,
    };
    let start = Instant::now();
    let budget = Arc::new(Budget {
        left: AtomicU64::new(config.requests),
        stop_at: start + config.duration,
        start,
        interval: config.interval,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for driver in drivers {
        let budget = budget.clone();
        tasks.spawn(async move { driver.run(&budget).await });
    }
    let mut total = Tally::new();
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        match done.expect("a driver task does not panic") {
            Ok(t) => total.merge(t),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if let Some(e) = first_error {
        return Err(e);
    }
    let requests = total.allowed + total.denied + total.errors;
    let classes = config.mix.map(|_| {
        let all: u64 = total.admitted.iter().sum();
        let by_class = Priority::ALL
            .iter()
            .map(|p| {
                let rank = usize::from(p.rank());
                ClassCount {
                    class: p.name(),
                    sent: total.sent[rank],
                    admitted: total.admitted[rank],
                    share: total.admitted[rank] as f64 / all.max(1) as f64,
                }
            })
            .collect();
        Classes {
            by_class,
            interval_ms: config.interval.as_millis() as u64,
            timeline: total.timeline.clone(),
        }
    });
    let h = &total.latency_ns;
    let us = |ns: u64| ns as f64 / 1e3;
    Ok(Report {
        target: config.target,
        addr: config.addr.to_string(),
        connections: config.connections,
        pipeline: config.pipeline,
        keys: config.keys,
        kind: config.limit.kind().name(),
        requests,
        seconds,
        ops_per_s: requests as f64 / seconds,
        allowed: total.allowed,
        denied: total.denied,
        errors: total.errors,
        latency_us: Latency {
            p50: us(h.value_at_quantile(0.5)),
            mean: h.mean() / 1e3,
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        },
        classes,
    })
}

/// One connection's load loop, for either target.
#[derive(Debug)]
pub(crate) enum Driver {
    Sluice(Box<sluice::Driver>),
    Redis(redis::Driver),
}

impl Driver {
    async fn run(self, budget: &Budget) -> Result<Tally, Error> {
        match self {
            Driver::Sluice(d) => d.run(budget).await,
            Driver::Redis(d) => d.run(budget).await,
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:?} at {}: {} connections x pipeline {}, {} keys, {}",
            self.target, self.addr, self.connections, self.pipeline, self.keys, self.kind
        )?;
        writeln!(
            f,
            "  {} requests in {:.2} s = {:.0} ops/s  (allowed {}, denied {}, errors {})",
            self.requests, self.seconds, self.ops_per_s, self.allowed, self.denied, self.errors
        )?;
        write!(
            f,
            "  latency us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            self.latency_us.p50, self.latency_us.p99, self.latency_us.p999, self.latency_us.max
        )?;
        if let Some(c) = &self.classes {
            for class in &c.by_class {
                write!(
                    f,
                    "\n  {:<8} sent {:>9}  admitted {:>9}  share of admitted {:>5.1} %",
                    class.class,
                    class.sent,
                    class.admitted,
                    class.share * 100.0
                )?;
            }
            write!(
                f,
                "\n  admitted per {} ms (low normal critical):",
                c.interval_ms
            )?;
            for (i, [low, normal, critical]) in c.timeline.iter().enumerate() {
                write!(
                    f,
                    "\n    {:>6} ms  {low:>8} {normal:>8} {critical:>8}",
                    i as u64 * c.interval_ms
                )?;
            }
        }
        Ok(())
    }
}
