//! Drives Redis with the usual token-bucket Lua script, loaded once with
//! SCRIPT LOAD and called with EVALSHA: HMGET the tokens and the
//! timestamp, refill lazily, take the cost, HMSET, EXPIRE, and return
//! `{allowed, retry_after_us}`. Like Sluice, Redis is the time authority
//! here (the script reads TIME), so callers send no timestamps.

use std::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::keys::{format_key, Keys, Rng, KEY_BYTES_MAX};
use super::resp::{self, Value};
use super::{BenchConfig, Budget, Tally};
use sluice_client::Error;

/// The token-bucket script. KEYS[1] the bucket; ARGV: rate per second,
/// burst, cost.
pub const TOKEN_BUCKET_LUA: &str = r#"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or burst
local ts = tonumber(v[2]) or now
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate / 1000000)
else
  now = ts
end
local allowed = 0
local retry_after = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry_after = math.ceil((cost - tokens) * 1000000 / rate)
end
redis.call('HMSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {allowed, retry_after}
"#;

/// One connection's load loop.
#[derive(Debug)]
pub struct Driver {
    stream: TcpStream,
    keys: Keys,
    rng: Rng,
    pipeline: usize,
    /// The script's SHA1, from SCRIPT LOAD.
    sha: Vec<u8>,
    /// ARGV: rate per second, burst, cost, pre-formatted.
    rate: Vec<u8>,
    burst: Vec<u8>,
}

async fn connect(config: &BenchConfig) -> Result<TcpStream, Error> {
    let connect_err = |source| Error::Connect {
        addr: config.addr.to_string(),
        source,
    };
    let stream = TcpStream::connect(config.addr).await.map_err(connect_err)?;
    stream.set_nodelay(true).map_err(connect_err)?;
    Ok(stream)
}

/// Loads the script and opens every connection.
pub(crate) async fn prepare(config: &BenchConfig) -> Result<Vec<super::Driver>, Error> {
    let mut first = connect(config).await?;
    let mut cmd = Vec::new();
    resp::command(&mut cmd, &[b"SCRIPT", b"LOAD", TOKEN_BUCKET_LUA.as_bytes()]);
    first
        .write_all(&cmd)
        .await
        .map_err(|_| Error::Disconnected)?;
    let mut rbuf = BytesMut::new();
    let sha = match read_value(&mut first, &mut rbuf).await? {
        Value::Bulk(Some(sha)) => sha,
        other => return Err(Error::Protocol(format!("SCRIPT LOAD answered {other:?}"))),
    };
    let p = config.policy;
    let rate_per_s = p.count as f64 * 1e9 / p.period_ns as f64;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut drivers = Vec::with_capacity(config.connections);
    for i in 0..config.connections {
        let keys = if config.sequential {
            Keys::Sequential {
                next: next.clone(),
                n: config.keys,
            }
        } else {
            Keys::All(config.keys)
        };
        drivers.push(super::Driver::Redis(Driver {
            stream: connect(config).await?,
            keys,
            rng: Rng::new(i as u64 + 1),
            pipeline: config.pipeline,
            sha: sha.clone(),
            rate: rate_per_s.to_string().into_bytes(),
            burst: p.burst.to_string().into_bytes(),
        }));
    }
    Ok(drivers)
}

async fn read_value(stream: &mut TcpStream, rbuf: &mut BytesMut) -> Result<Value, Error> {
    loop {
        if let Some((v, used)) = resp::parse(rbuf).map_err(Error::Protocol)? {
            let _ = rbuf.split_to(used);
            return Ok(v);
        }
        if stream
            .read_buf(rbuf)
            .await
            .map_err(|_| Error::Disconnected)?
            == 0
        {
            return Err(Error::Disconnected);
        }
    }
}

impl Driver {
    /// Sends pipelines of EVALSHA until the budget is spent.
    pub async fn run(mut self, budget: &Budget) -> Result<Tally, Error> {
        let mut tally = Tally::new();
        let mut wbuf = Vec::with_capacity(self.pipeline * 128);
        let mut rbuf = BytesMut::with_capacity(64 << 10);
        let mut key = [0u8; KEY_BYTES_MAX];
        loop {
            let n = budget.claim(self.pipeline);
            if n == 0 {
                return Ok(tally);
            }
            for _ in 0..n {
                let k = self.keys.pick(&mut self.rng);
                let key = format_key(&mut key, k);
                resp::command(
                    &mut wbuf,
                    &[
                        b"EVALSHA",
                        &self.sha,
                        b"1",
                        key,
                        &self.rate,
                        &self.burst,
                        b"1",
                    ],
                );
            }
            let sent = Instant::now();
            self.stream
                .write_all(&wbuf)
                .await
                .map_err(|_| Error::Disconnected)?;
            wbuf.clear();
            for _ in 0..n {
                match read_value(&mut self.stream, &mut rbuf).await? {
                    Value::Array(Some(items)) if matches!(items.first(), Some(Value::Int(1))) => {
                        tally.allowed += 1
                    }
                    Value::Array(Some(_)) => tally.denied += 1,
                    _ => tally.errors += 1,
                }
            }
            tally.record(sent.elapsed(), n);
        }
    }
}
