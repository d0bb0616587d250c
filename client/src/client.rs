//! [`Client`]: routing, deadlines and reconnection over [`Conn`]s.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_protocol::message::{HelloOk, Reply, KEY_BYTES_MAX};
use sluice_protocol::routing::{key_hash, shard_of, ROUTING_XXH3_128_MULSHIFT};
use sluice_protocol::{Policy, Verdict};

use crate::connection::{Call, Conn};
use crate::error::Error;

/// Default deadline of a call.
pub const DEADLINE_MS_DEFAULT: u64 = 5;
/// Default time allowed to connect and complete HELLO.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;

/// How a [`Client`] behaves.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How long a call may take, end to end.
    pub deadline: Duration,
    /// How long connecting (TCP and HELLO) may take.
    pub connect_timeout: Duration,
    /// One connection per shard, each key sent to its owner (no server
    /// forwarding); when false, one connection carries every key.
    pub shard_aware: bool,
    /// Sent in HELLO when the server requires it.
    pub auth_token: Option<String>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            deadline: Duration::from_millis(DEADLINE_MS_DEFAULT),
            connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS_DEFAULT),
            shard_aware: true,
            auth_token: None,
        }
    }
}

/// One connection slot: the connection in use, replaced when it dies.
#[derive(Debug)]
struct Slot {
    /// The shard the connection is bound to, if shard-aware.
    shard: Option<u16>,
    /// The live connection.
    conn: Mutex<Arc<Conn>>,
    /// Held while reconnecting, so that one caller reconnects and the rest
    /// wait for it.
    reconnecting: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    config: ClientConfig,
    hello: HelloOk,
    /// One per shard when shard-aware, else one.
    slots: Vec<Slot>,
}

/// A handle to one Sluice node, shared by every task of a gateway.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects with the default configuration.
    pub async fn connect(addr: impl tokio::net::ToSocketAddrs) -> Result<Client, Error> {
        Client::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects: HELLO on one connection to learn the shard layout, then,
    /// when shard-aware, one connection bound to each shard.
    pub async fn connect_with(
        addr: impl tokio::net::ToSocketAddrs,
        config: ClientConfig,
    ) -> Result<Client, Error> {
        let addr = resolve(addr).await?;
        let token = config.auth_token.clone().unwrap_or_default();
        let first = Conn::open(addr, None, token.as_bytes(), config.connect_timeout).await?;
        let hello = first.hello;
        if hello.routing != ROUTING_XXH3_128_MULSHIFT {
            return Err(Error::Protocol(format!(
                "unknown routing scheme {}",
                hello.routing
            )));
        }
        let slots = if config.shard_aware && hello.shard_count > 1 {
            let mut slots = Vec::with_capacity(usize::from(hello.shard_count));
            for shard in 0..hello.shard_count {
                let conn =
                    Conn::open(addr, Some(shard), token.as_bytes(), config.connect_timeout).await?;
                slots.push(Slot::new(Some(shard), conn));
            }
            slots
        } else {
            vec![Slot::new(None, first)]
        };
        Ok(Client {
            inner: Arc::new(Inner {
                addr,
                config,
                hello,
                slots,
            }),
        })
    }

    /// What the node said at HELLO: shard count, node id, epoch.
    pub fn hello(&self) -> HelloOk {
        self.inner.hello
    }

    /// Round trip to the node (on the first connection).
    pub async fn ping(&self) -> Result<Duration, Error> {
        let start = Instant::now();
        match self.call(0, Call::Ping).await? {
            Reply::Pong => Ok(start.elapsed()),
            other => Err(unexpected(&other)),
        }
    }

    /// Spends `cost` units of `key`'s bucket under `policy`.
    pub async fn throttle(&self, key: &[u8], policy: Policy, cost: u64) -> Result<Verdict, Error> {
        self.decide(key, policy, cost, false).await
    }

    /// Answers as `throttle` would, spending and creating nothing.
    pub async fn peek(&self, key: &[u8], policy: Policy, cost: u64) -> Result<Verdict, Error> {
        self.decide(key, policy, cost, true).await
    }

    async fn decide(
        &self,
        key: &[u8],
        policy: Policy,
        cost: u64,
        peek: bool,
    ) -> Result<Verdict, Error> {
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "a key must be 1..={KEY_BYTES_MAX} bytes"
            )));
        }
        policy
            .validate()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        policy
            .check_cost(cost)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let slot = if self.inner.slots.len() > 1 {
            usize::from(shard_of(key_hash(key), self.inner.hello.shard_count))
        } else {
            0
        };
        let call = Call::Throttle {
            key: key.into(),
            policy,
            cost,
            peek,
        };
        match self.call(slot, call).await? {
            Reply::Throttle(v) if !peek => Ok(v),
            Reply::Peek(v) if peek => Ok(v),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends `call` on slot `index`, reconnecting it first if it died.
    async fn call(&self, index: usize, call: Call) -> Result<Reply, Error> {
        let start = Instant::now();
        let deadline = self.inner.config.deadline;
        let slot = &self.inner.slots[index];
        let mut conn = slot.current();
        if conn.is_closed() {
            let reconnect = self.reconnect(slot, &conn);
            conn = tokio::time::timeout(deadline, reconnect)
                .await
                .map_err(|_| Error::Timeout(deadline))??;
        }
        conn.call(call, deadline.saturating_sub(start.elapsed()))
            .await
    }

    async fn reconnect(&self, slot: &Slot, dead: &Arc<Conn>) -> Result<Arc<Conn>, Error> {
        let _one_at_a_time = slot.reconnecting.lock().await;
        let current = slot.current();
        if !Arc::ptr_eq(&current, dead) && !current.is_closed() {
            return Ok(current);
        }
        let token = self.inner.config.auth_token.clone().unwrap_or_default();
        let conn = Conn::open(
            self.inner.addr,
            slot.shard,
            token.as_bytes(),
            self.inner.config.connect_timeout,
        )
        .await?;
        if conn.hello.shard_count != self.inner.hello.shard_count {
            return Err(Error::Protocol(format!(
                "the node now has {} shards, not {}: connect a new client",
                conn.hello.shard_count, self.inner.hello.shard_count
            )));
        }
        let conn = Arc::new(conn);
        *slot.conn.lock().unwrap_or_else(|e| e.into_inner()) = conn.clone();
        Ok(conn)
    }
}

impl Slot {
    fn new(shard: Option<u16>, conn: Conn) -> Slot {
        Slot {
            shard,
            conn: Mutex::new(Arc::new(conn)),
            reconnecting: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Arc<Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

async fn resolve(addr: impl tokio::net::ToSocketAddrs) -> Result<SocketAddr, Error> {
    let mut addrs = tokio::net::lookup_host(addr)
        .await
        .map_err(|source| Error::Connect {
            addr: "(unresolved)".into(),
            source,
        })?;
    addrs.next().ok_or_else(|| Error::Connect {
        addr: "(unresolved)".into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
    })
}

fn unexpected(reply: &Reply) -> Error {
    Error::Protocol(format!("unexpected reply {reply:?}"))
}
