//! A load generator for the RESP port's CL.THROTTLE, for the entry-point
//! benchmark (benches/entry.sh): `--connections` connections, each with
//! `--pipeline` commands in flight (sent together, their replies read
//! together, as redis-benchmark's `-P`), for `--seconds`, on keys
//! `key:N` drawn uniformly from `--keys` of them, or from the first
//! `--keys` that the group `--owned-by` owns in the ring of `--groups`
//! (so that a run can go only through a key's owner, or only through
//! another node). redis-benchmark draws `__rand_int__` keys with no way to
//! choose their owner; this is the same command and pipelining otherwise.
//! `--rate R` paces the windows so that all connections together send
//! about R calls a second (open loop while the server keeps up), so that
//! two routes can be compared at the same offered load. Prints one JSON
//! object: calls, seconds, calls per second, denied calls and errors.
//!
//! `sluice-resp-bench --addr 127.0.0.1:6390 --groups a,b --owned-by a`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_protocol::ring::Ring;
use sluice_protocol::routing::key_hash;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug)]
struct Args {
    addr: String,
    connections: usize,
    pipeline: usize,
    seconds: f64,
    keys: usize,
    groups: Vec<String>,
    owned_by: Option<String>,
    /// Calls a second over all connections (0: as fast as the server
    /// answers).
    rate: f64,
}

fn usage(why: &str) -> ! {
    eprintln!(
        "sluice-resp-bench: {why}\nusage: sluice-resp-bench [--addr HOST:PORT] [--connections N] [--pipeline N] [--seconds S] [--keys N] [--groups A,B,... --owned-by A] [--rate CALLS_PER_S]"
    );
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        addr: "127.0.0.1:6390".into(),
        connections: 50,
        pipeline: 64,
        seconds: 10.0,
        keys: 100_000,
        groups: Vec::new(),
        owned_by: None,
        rate: 0.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        let number = |v: String, what: &str| v.parse().unwrap_or_else(|_| usage(what));
        match flag.as_str() {
            "--addr" => a.addr = value(),
            "--connections" => a.connections = number(value(), "--connections N"),
            "--pipeline" => a.pipeline = number(value(), "--pipeline N"),
            "--keys" => a.keys = number(value(), "--keys N"),
            "--seconds" => a.seconds = value().parse().unwrap_or_else(|_| usage("--seconds S")),
            "--groups" => a.groups = value().split(',').map(str::to_owned).collect(),
            "--owned-by" => a.owned_by = Some(value()),
            "--rate" => {
                a.rate = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--rate CALLS_PER_S"))
            }
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    if a.connections == 0 || a.pipeline == 0 || a.keys == 0 {
        usage("--connections, --pipeline and --keys are at least 1");
    }
    if a.owned_by.is_some() == a.groups.is_empty() {
        usage("--owned-by and --groups go together");
    }
    a
}

/// The keys the load draws from: `key:N`, those `owned_by` owns if given.
pub fn keys(count: usize, groups: &[String], owned_by: Option<&str>) -> Vec<String> {
    let ring = owned_by.map(|_| Ring::new(groups.iter().map(String::as_str)));
    (0..)
        .map(|i| format!("key:{i}"))
        .filter(|k| match (&ring, owned_by) {
            (Some(r), Some(g)) => r.owner(key_hash(k.as_bytes())) == g,
            _ => true,
        })
        .take(count)
        .collect()
}

/// Every key's CL.THROTTLE as RESP, encoded once before the load starts
/// (99 burst, 10 per second, 1 unit: compare.sh's), so that a window is
/// copies of them: the generator shares this machine's two cores with the
/// servers it measures, and what it spends per call is taken from them.
struct Commands {
    bytes: Vec<u8>,
    /// Where key `i`'s command begins; its end is where `i + 1`'s does.
    at: Vec<usize>,
}

impl Commands {
    fn new(keys: &[String]) -> Commands {
        let mut bytes = Vec::with_capacity(keys.len() * 64);
        let mut at = Vec::with_capacity(keys.len() + 1);
        for key in keys {
            at.push(bytes.len());
            bytes.extend_from_slice(b"*6\r\n$11\r\nCL.THROTTLE\r\n");
            bytes.extend_from_slice(format!("${}\r\n{key}\r\n", key.len()).as_bytes());
            bytes.extend_from_slice(b"$2\r\n99\r\n$2\r\n10\r\n$1\r\n1\r\n$1\r\n1\r\n");
        }
        at.push(bytes.len());
        Commands { bytes, at }
    }

    fn len(&self) -> usize {
        self.at.len() - 1
    }

    /// Key `i`'s command.
    fn get(&self, i: usize) -> &[u8] {
        &self.bytes[self.at[i]..self.at[i + 1]]
    }
}

/// Counts whole replies at the start of `buf` (an array of five integers,
/// or an error line), at most `want`; returns (replies, bytes, denied,
/// errors). A reply cut short stays for the next read.
fn replies(buf: &[u8], want: usize) -> (usize, usize, u64, u64) {
    let (mut n, mut at, mut denied, mut errors) = (0, 0, 0, 0);
    // A line ends at its first `\n` (RESP's lines hold no bare one).
    let line = |from: usize| {
        buf.get(from..)?
            .iter()
            .position(|&b| b == b'\n')
            .map(|p| from + p + 1)
    };
    while n < want {
        let Some(end) = line(at) else { break };
        match buf.get(at) {
            Some(b'-') => {
                errors += 1;
                at = end;
            }
            Some(b'*') => {
                // Five integer lines follow: `:limited`, then four more.
                let mut p = end;
                let mut ok = true;
                let mut first = None;
                for _ in 0..5 {
                    match line(p) {
                        Some(e) => {
                            first.get_or_insert(buf[p + 1]);
                            p = e;
                        }
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok {
                    break;
                }
                if first == Some(b'1') {
                    denied += 1;
                }
                at = p;
            }
            _ => {
                eprintln!("sluice-resp-bench: a reply out of shape");
                std::process::exit(1)
            }
        }
        n += 1;
    }
    (n, at, denied, errors)
}

fn main() {
    let a = Arc::new(args());
    let commands = Arc::new(Commands::new(&keys(
        a.keys,
        &a.groups,
        a.owned_by.as_deref(),
    )));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..a.connections {
            let mut stream = tokio::net::TcpStream::connect(&a.addr)
                .await
                .unwrap_or_else(|e| {
                    eprintln!("sluice-resp-bench: cannot connect to {}: {e}", a.addr);
                    std::process::exit(1)
                });
            stream.set_nodelay(true).expect("nodelay");
            let (a, commands, stop) = (a.clone(), commands.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (c as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                let (mut calls, mut denied, mut errors) = (0u64, 0u64, 0u64);
                let mut out = Vec::with_capacity(a.pipeline * 64);
                // Replies are read straight into `buf`; what a read cut
                // short moves to its front.
                let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
                // With --rate: this connection's windows start `every`
                // apart (one behind its time starts at once), the
                // connections' spread over the interval.
                let every = (a.rate > 0.0).then(|| {
                    Duration::from_secs_f64((a.pipeline * a.connections) as f64 / a.rate)
                });
                let mut next = tokio::time::Instant::now();
                if let Some(every) = every {
                    next += every.mul_f64(c as f64 / a.connections as f64);
                }
                while !stop.load(Ordering::Relaxed) {
                    if let Some(every) = every {
                        tokio::time::sleep_until(next).await;
                        next += every;
                    }
                    out.clear();
                    for _ in 0..a.pipeline {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        out.extend_from_slice(
                            commands.get((x % commands.len() as u64) as usize),
                        );
                    }
                    stream.write_all(&out).await.expect("the server reads");
                    let mut left = a.pipeline;
                    while left > 0 {
                        if buf.capacity() == buf.len() {
                            buf.reserve(64 << 10);
                        }
                        let n = stream.read_buf(&mut buf).await.expect("the server answers");
                        if n == 0 {
                            eprintln!("sluice-resp-bench: the server closed the connection");
                            std::process::exit(1)
                        }
                        let (got, used, d, e) = replies(&buf, left);
                        buf.drain(..used);
                        left -= got;
                        denied += d;
                        errors += e;
                    }
                    calls += a.pipeline as u64;
                }
                (calls, denied, errors)
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(a.seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let (mut calls, mut denied, mut errors) = (0u64, 0u64, 0u64);
        for t in tasks {
            let (c, d, e) = t.await.expect("a connection task");
            calls += c;
            denied += d;
            errors += e;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{{\"calls\":{calls},\"seconds\":{secs:.3},\"calls_per_s\":{:.0},\"denied\":{denied},\"errors\":{errors},\"connections\":{},\"pipeline\":{}}}",
            calls as f64 / secs,
            a.connections,
            a.pipeline
        );
    });
}
