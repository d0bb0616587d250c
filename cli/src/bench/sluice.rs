//! Drives a `sluiced` over protocol v1: each connection writes one frame
//! of `pipeline` THROTTLEs and reads their verdicts. Shard-aware (the
//! default) binds connection `i` to shard `i mod shards` and draws keys
//! only from that shard's share, as a gateway using the client would.

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::limit::Limit;
use sluice_protocol::message::{Decide, LimitSet, Limits, Mode, Reply, Request, Throttle};
use sluice_protocol::routing::{key_hash, shard_of};
use sluice_protocol::{Policy, Priority, Reserved};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

use super::keys::{format_key, Keys, Rng, KEY_BYTES_MAX};
use super::{BenchConfig, Budget, Tally};
use sluice_client::connection::handshake;
use sluice_client::Error;

/// One connection's load loop.
#[derive(Debug)]
pub struct Driver {
    stream: TcpStream,
    rbuf: BytesMut,
    keys: Keys,
    rng: Rng,
    pipeline: usize,
    policy: Policy,
    /// Set for every kind but the token bucket, and for any limit with
    /// reserves or a class mix: sent as a one-limit DECIDE.
    limits: Option<LimitSet>,
    /// Each request's class, drawn by these weights (low, normal,
    /// critical); all normal without.
    mix: Option<[u32; 3]>,
    /// The class of each request of the batch in flight.
    classes: Vec<Priority>,
}

impl Driver {
    /// A driver on an open connection, drawing `keys`, seeded by `seed`.
    fn new(
        config: &BenchConfig,
        (stream, rbuf): (TcpStream, BytesMut),
        keys: Keys,
        seed: u64,
    ) -> Driver {
        let reserved = Reserved {
            limit: config.limit,
            reserves: config.reserves,
        };
        let limits = match config.limit {
            Limit::TokenBucket(_) if config.reserves.is_none() && config.mix.is_none() => None,
            _ => LimitSet::with_reserves(&[reserved]),
        };
        Driver {
            stream,
            rbuf,
            keys,
            rng: Rng::new(seed),
            pipeline: config.pipeline,
            policy: config.policy,
            limits,
            mix: config.mix,
            classes: Vec::with_capacity(config.pipeline),
        }
    }

    /// The next request's class.
    fn class(&mut self) -> Priority {
        let Some([low, normal, critical]) = self.mix else {
            return Priority::Normal;
        };
        let total = u64::from(low) + u64::from(normal) + u64::from(critical);
        let draw = self.rng.below(total);
        if draw < u64::from(low) {
            Priority::Low
        } else if draw < u64::from(low) + u64::from(normal) {
            Priority::Normal
        } else {
            Priority::Critical
        }
    }
}

/// Opens every connection (so that connecting is not timed) and splits the
/// keyspace by shard when shard-aware.
pub(crate) async fn prepare(config: &BenchConfig) -> Result<Vec<super::Driver>, Error> {
    let token = config.auth_token.clone().unwrap_or_default();
    if let Some(groups) = &config.groups {
        return prepare_groups(config, groups, token.as_bytes()).await;
    }
    let (_, first) = connect(config, config.addr, None, token.as_bytes()).await?;
    let shards = first.shard_count;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let per_shard: Option<Vec<Arc<Vec<u32>>>> =
        (config.shard_aware && shards > 1 && !config.sequential).then(|| {
            let mut split = vec![Vec::new(); usize::from(shards)];
            let mut buf = [0u8; KEY_BYTES_MAX];
            for n in 0..config.keys {
                let s = shard_of(key_hash(format_key(&mut buf, n)), shards);
                split[usize::from(s)].push(n as u32);
            }
            split.into_iter().map(Arc::new).collect()
        });
    let mut drivers = Vec::with_capacity(config.connections);
    for i in 0..config.connections {
        let (shard, keys) = match &per_shard {
            Some(split) => {
                // Only shards that own some of the keys (with fewer keys
                // than shards, some own none).
                let owning: Vec<usize> =
                    (0..split.len()).filter(|&s| !split[s].is_empty()).collect();
                let s = owning[i % owning.len()];
                (Some(s as u16), Keys::Subset(split[s].clone()))
            }
            None if config.sequential => (
                None,
                Keys::Sequential {
                    next: next.clone(),
                    n: config.keys,
                },
            ),
            None => (None, Keys::All(config.keys)),
        };
        let (conn, _) = connect(config, config.addr, shard, token.as_bytes()).await?;
        let driver = Driver::new(config, conn, keys, i as u64 + 1);
        drivers.push(super::Driver::Sluice(Box::new(driver)));
    }
    Ok(drivers)
}

/// A cluster: connection `i` goes to group `i mod G`'s primary and draws
/// that group's keys (not bound to a shard: the node forwards, as for a
/// client that is not shard-aware).
async fn prepare_groups(
    config: &BenchConfig,
    groups: &[(std::net::SocketAddr, Arc<Vec<u32>>)],
    token: &[u8],
) -> Result<Vec<super::Driver>, Error> {
    let mut drivers = Vec::with_capacity(config.connections);
    for i in 0..config.connections {
        let (addr, keys) = &groups[i % groups.len()];
        let (conn, _) = connect(config, *addr, None, token).await?;
        let driver = Driver::new(config, conn, Keys::Subset(keys.clone()), i as u64 + 1);
        drivers.push(super::Driver::Sluice(Box::new(driver)));
    }
    Ok(drivers)
}

async fn connect(
    config: &BenchConfig,
    addr: std::net::SocketAddr,
    shard: Option<u16>,
    token: &[u8],
) -> Result<((TcpStream, BytesMut), sluice_protocol::message::HelloOk), Error> {
    let _ = config;
    let connect_err = |source| Error::Connect {
        addr: addr.to_string(),
        source,
    };
    let mut stream = TcpStream::connect(addr).await.map_err(connect_err)?;
    stream.set_nodelay(true).map_err(connect_err)?;
    let (hello, rbuf) = handshake(&mut stream, shard, token).await?;
    Ok(((stream, rbuf), hello))
}

impl Driver {
    /// Sends batches until the budget is spent.
    pub async fn run(mut self, budget: &Budget) -> Result<Tally, Error> {
        let mut tally = Tally::new();
        let mut wbuf = BytesMut::with_capacity(self.pipeline * 64);
        let mut decoder = FrameDecoder::default();
        let mut key = [0u8; KEY_BYTES_MAX];
        loop {
            let n = budget.claim(self.pipeline);
            if n == 0 {
                return Ok(tally);
            }
            let mut w = FrameWriter::new();
            self.classes.clear();
            let mixed = self.mix.is_some();
            for i in 0..n {
                let priority = self.class();
                if mixed {
                    self.classes.push(priority);
                }
                let k = self.keys.pick(&mut self.rng);
                let key = format_key(&mut key, k);
                let request = match self.limits {
                    None => Request::Throttle(Throttle {
                        key,
                        policy: self.policy,
                        cost: 1,
                    }),
                    Some(set) => Request::Decide(Decide {
                        mode: Mode::Spend,
                        key,
                        limits: Limits::Inline(set),
                        cost: 1,
                        priority,
                    }),
                };
                request.encode(&mut w, &mut wbuf, i as u32 + 1);
            }
            w.finish(&mut wbuf);
            let sent = Instant::now();
            self.stream
                .write_all(&wbuf)
                .await
                .map_err(|_| Error::Disconnected)?;
            wbuf.clear();
            let mut got = 0;
            // The timeline step of this batch's replies (one clock read).
            let step = if mixed { budget.step() } else { 0 };
            while got < n {
                while let Some(frame) = decoder
                    .decode(&mut self.rbuf)
                    .map_err(|e| Error::Protocol(e.to_string()))?
                {
                    for (h, p) in frame.messages() {
                        let allowed = match Reply::parse(h, p) {
                            Some(Reply::Throttle(v)) => Some(v.allowed),
                            Some(Reply::Decide(d)) => Some(d.allowed),
                            _ => None,
                        };
                        match allowed {
                            Some(true) => tally.allowed += 1,
                            Some(false) => tally.denied += 1,
                            None => tally.errors += 1,
                        }
                        // Replies come in request order. Counted by class
                        // only with a mix: the plain run pays nothing.
                        if mixed {
                            let class = self.classes.get(got).copied().unwrap_or_default();
                            tally.count_class(class, allowed == Some(true), step);
                        }
                        got += 1;
                    }
                }
                if got < n
                    && self
                        .stream
                        .read_buf(&mut self.rbuf)
                        .await
                        .map_err(|_| Error::Disconnected)?
                        == 0
                {
                    return Err(Error::Disconnected);
                }
            }
            tally.record(sent.elapsed(), n);
        }
    }
}
