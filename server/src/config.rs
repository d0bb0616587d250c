//! The daemon's configuration: every limit it enforces, with its default as
//! a named constant, validated once at start-up with messages that name the
//! flag and its allowed range.

use std::net::IpAddr;

use clap::Parser;
use sluice_protocol::codec::{FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MAX_LIMIT, HEADER_BYTES};
use sluice_protocol::message::TOKEN_BYTES_MAX;

/// Default listening port.
pub const PORT_DEFAULT: u16 = 7700;
/// Most shards a node may run (the protocol carries the count in a u16 and
/// reserves 0xFFFF).
pub const SHARDS_MAX: u16 = 1024;
/// Default cap on open client connections.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Default requests a connection may have read and not yet answered before
/// the server stops reading from it.
pub const INFLIGHT_MAX_DEFAULT: usize = 8_192;
/// Default most requests in one frame.
pub const BATCH_MAX_DEFAULT: usize = 4_096;
/// Default time SIGTERM waits for connections to finish their in-flight
/// requests before the shards stop.
pub const DRAIN_MS_DEFAULT: u64 = 5_000;

// A batch must fit in flight, or a frame at the batch limit could never be read.
const _: () = assert!(BATCH_MAX_DEFAULT <= INFLIGHT_MAX_DEFAULT);

/// `sluiced`: the Sluice rate-limiting store.
#[derive(Clone, Debug, Parser)]
#[command(name = "sluiced", version, about)]
pub struct Config {
    /// Address to listen on. Loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,

    /// Port to listen on; 0 picks a free one (printed at start-up).
    #[arg(long, default_value_t = PORT_DEFAULT)]
    pub port: u16,

    /// Also serve RESP2 (redis-cli, redis-benchmark, redis-cell's
    /// CL.THROTTLE) on this port of --bind; 0 picks a free one (printed on
    /// the second line of stdout). Off unless given.
    #[arg(long, value_name = "PORT")]
    pub resp_port: Option<u16>,

    /// Shard threads; default one per core.
    #[arg(long)]
    pub shards: Option<u16>,

    /// Most open client connections, both listeners together; past it a new
    /// connection is told TOO_MANY_CONNECTIONS (RESP: `-ERR max number of
    /// clients reached`) and closed.
    #[arg(long, default_value_t = CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,

    /// Largest frame body accepted, in bytes; a larger one closes the
    /// connection with FRAME_TOO_LARGE. Also the largest RESP command (a
    /// whole array, or an inline line) accepted; a larger one is a protocol
    /// error that closes the connection.
    #[arg(long, default_value_t = FRAME_BYTES_MAX_DEFAULT)]
    pub frame_bytes_max: u32,

    /// Most requests in one frame; each request of a larger frame is
    /// answered BATCH_TOO_LARGE.
    #[arg(long, default_value_t = BATCH_MAX_DEFAULT)]
    pub batch_max: usize,

    /// Requests a connection may have unanswered before the server stops
    /// reading from it (back-pressure, not an error).
    #[arg(long, default_value_t = INFLIGHT_MAX_DEFAULT)]
    pub inflight_max: usize,

    /// Milliseconds a graceful shutdown waits for in-flight requests.
    #[arg(long, default_value_t = DRAIN_MS_DEFAULT)]
    pub drain_ms: u64,

    /// When set, every connection must send it in HELLO before anything else
    /// (RESP connections: AUTH).
    #[arg(long, env = "SLUICE_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
}

/// A configuration value out of its range.
#[derive(Debug, thiserror::Error)]
#[error("--{field} must be {range}, got {got}")]
pub struct ConfigError {
    /// The flag's name.
    pub field: &'static str,
    /// The allowed range, in words.
    pub range: String,
    /// The value given.
    pub got: String,
}

fn check<T: PartialOrd + std::fmt::Display>(
    field: &'static str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError {
            field,
            range: format!("{lo}..={hi}"),
            got: v.to_string(),
        });
    }
    Ok(())
}

impl Config {
    /// The defaults, exactly as `sluiced` with no arguments runs.
    pub fn defaults() -> Config {
        Config::parse_from(["sluiced"])
    }

    /// The shard count in force.
    pub fn shard_count(&self) -> u16 {
        self.shards.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            u16::try_from(cores).unwrap_or(SHARDS_MAX).min(SHARDS_MAX)
        })
    }

    /// Checks every field against its range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check("shards", self.shard_count(), 1, SHARDS_MAX)?;
        check("connections-max", self.connections_max, 1, 1_000_000)?;
        check(
            "frame-bytes-max",
            self.frame_bytes_max,
            HEADER_BYTES as u32,
            FRAME_BYTES_MAX_LIMIT,
        )?;
        check("batch-max", self.batch_max, 1, self.inflight_max.max(1))?;
        check("inflight-max", self.inflight_max, 1, 1 << 20)?;
        check("drain-ms", self.drain_ms, 0, 600_000)?;
        if let Some(resp_port) = self.resp_port {
            if resp_port != 0 && resp_port == self.port {
                return Err(ConfigError {
                    field: "resp-port",
                    range: "0 or a port other than --port".to_owned(),
                    got: resp_port.to_string(),
                });
            }
        }
        if let Some(t) = &self.auth_token {
            check("auth-token length", t.len(), 1, TOKEN_BYTES_MAX)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_on_loopback() {
        let c = Config::defaults();
        c.validate().unwrap();
        assert!(c.bind.is_loopback());
        assert_eq!(c.port, PORT_DEFAULT);
    }

    #[test]
    fn out_of_range_names_the_flag() {
        let c = Config::parse_from(["sluiced", "--batch-max", "10", "--inflight-max", "5"]);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "batch-max");
        assert!(e.to_string().contains("--batch-max must be 1..=5"), "{e}");
        let c = Config::parse_from(["sluiced", "--shards", "0"]);
        assert_eq!(c.validate().unwrap_err().field, "shards");
        let c = Config::parse_from(["sluiced", "--frame-bytes-max", "7"]);
        assert_eq!(c.validate().unwrap_err().field, "frame-bytes-max");
    }

    #[test]
    fn resp_is_off_by_default_and_needs_its_own_port() {
        assert_eq!(Config::defaults().resp_port, None);
        let c = Config::parse_from(["sluiced", "--resp-port", "0"]);
        assert_eq!(c.resp_port, Some(0));
        c.validate().unwrap();
        let c = Config::parse_from(["sluiced", "--port", "7000", "--resp-port", "7000"]);
        assert_eq!(c.validate().unwrap_err().field, "resp-port");
    }
}
