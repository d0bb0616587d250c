//! ROLE and `INFO replication` in the shapes Redis gives them, so that
//! Redis tooling that asks a node what it is gets an answer it can read.
//!
//! Redis counts replication in bytes of its stream (offsets); Sluice's
//! stream is of bucket states, so the offset reported is the count of
//! SYNC payload bytes sent (primary) or received (follower), which grows
//! the same way. Sluice's own facts (epoch, mode, state, lag) follow as
//! `sluice_*` fields.

use std::fmt::Write as _;

use sluice_protocol::replication::{ReplState, Role, RoleOk};

/// ROLE's reply, encoded: a primary is `master`, its offset and its
/// replicas (`[ip, port, offset]`); a follower is `slave`, its primary's
/// ip and port, its link state and offset.
pub fn role_reply(r: &RoleOk) -> Vec<u8> {
    let mut out = Vec::new();
    let bulk = |out: &mut Vec<u8>, s: &str| {
        let _ = write!(out_str(out), "${}\r\n{s}\r\n", s.len());
    };
    match r.role {
        Role::Primary => {
            out.extend_from_slice(b"*3\r\n");
            bulk(&mut out, "master");
            let _ = write!(out_str(&mut out), ":{}\r\n", r.stream_bytes);
            if r.follower.is_empty() {
                out.extend_from_slice(b"*0\r\n");
            } else {
                let (ip, port) = split(&r.follower);
                out.extend_from_slice(b"*1\r\n*3\r\n");
                bulk(&mut out, ip);
                bulk(&mut out, port);
                bulk(&mut out, &r.stream_bytes.to_string());
            }
        }
        Role::Follower => {
            let (ip, port) = split(&r.primary);
            out.extend_from_slice(b"*5\r\n");
            bulk(&mut out, "slave");
            bulk(&mut out, ip);
            let _ = write!(
                out_str(&mut out),
                ":{}\r\n",
                port.parse::<u16>().unwrap_or(0)
            );
            let link = match r.state {
                ReplState::Streaming => "connected",
                ReplState::Syncing => "sync",
                _ => "connecting",
            };
            bulk(&mut out, link);
            let _ = write!(out_str(&mut out), ":{}\r\n", r.stream_bytes);
        }
    }
    out
}

/// The `# Replication` section of INFO.
pub fn info_replication(r: &RoleOk) -> String {
    let mut s = String::from("# Replication\r\n");
    match r.role {
        Role::Primary => {
            let _ = write!(
                s,
                "role:master\r\nconnected_slaves:{}\r\n",
                usize::from(!r.follower.is_empty())
            );
            if !r.follower.is_empty() {
                let (ip, port) = split(&r.follower);
                let state = if r.state == ReplState::Streaming {
                    "online"
                } else {
                    "wait_bgsave"
                };
                let _ = write!(
                    s,
                    "slave0:ip={ip},port={port},state={state},offset={},lag=0\r\n",
                    r.stream_bytes
                );
            }
            let _ = write!(s, "master_repl_offset:{}\r\n", r.stream_bytes);
        }
        Role::Follower => {
            let (ip, port) = split(&r.primary);
            let up = r.state == ReplState::Streaming;
            let _ = write!(
                s,
                "role:slave\r\nmaster_host:{ip}\r\nmaster_port:{port}\r\nmaster_link_status:{}\r\n\
                 master_sync_in_progress:{}\r\nslave_repl_offset:{}\r\nslave_read_only:1\r\n",
                if up { "up" } else { "down" },
                u8::from(r.state == ReplState::Syncing),
                r.stream_bytes,
            );
        }
    }
    let _ = write!(
        s,
        "sluice_epoch:{}\r\nsluice_mode:{}\r\nsluice_state:{}\r\nsluice_lag_ms:{:.3}\r\nsluice_keys_synced:{}\r\n",
        r.epoch,
        r.mode.name(),
        r.state.name(),
        r.lag_us as f64 / 1000.0,
        r.keys_synced,
    );
    s
}

/// `host:port` as its two parts (the whole as host when there is no port).
fn split(addr: &str) -> (&str, &str) {
    addr.rsplit_once(':').unwrap_or((addr, "0"))
}

/// Lets `write!` append to a byte vector.
fn out_str(out: &mut Vec<u8>) -> impl std::fmt::Write + '_ {
    struct W<'a>(&'a mut Vec<u8>);
    impl std::fmt::Write for W<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.extend_from_slice(s.as_bytes());
            Ok(())
        }
    }
    W(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::replication::Mode;

    fn role(role: Role, follower: &str) -> RoleOk {
        RoleOk {
            role,
            state: ReplState::Streaming,
            mode: Mode::Sync,
            epoch: 2,
            lag_us: 1500,
            keys_synced: 10,
            stream_bytes: 4096,
            stream_records: 100,
            primary: "127.0.0.1:7700".into(),
            follower: follower.into(),
        }
    }

    #[test]
    fn role_replies_have_redis_shapes() {
        let p = role_reply(&role(Role::Primary, "127.0.0.1:7701"));
        assert_eq!(
            p,
            b"*3\r\n$6\r\nmaster\r\n:4096\r\n*1\r\n*3\r\n$9\r\n127.0.0.1\r\n$4\r\n7701\r\n$4\r\n4096\r\n"
        );
        let alone = role_reply(&role(Role::Primary, ""));
        assert_eq!(alone, b"*3\r\n$6\r\nmaster\r\n:4096\r\n*0\r\n");
        let f = role_reply(&role(Role::Follower, ""));
        assert_eq!(
            f,
            b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:7700\r\n$9\r\nconnected\r\n:4096\r\n"
        );
        let info = info_replication(&role(Role::Follower, ""));
        assert!(info.contains(
            "role:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7700\r\nmaster_link_status:up\r\n"
        ));
        assert!(info.contains("sluice_epoch:2\r\n"));
        let info = info_replication(&role(Role::Primary, "127.0.0.1:7701"));
        assert!(info.contains("connected_slaves:1\r\nslave0:ip=127.0.0.1,port=7701,state=online"));
    }
}
