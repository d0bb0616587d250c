//! The replies: their types and parsing.

use super::consts::{
    CELL_OK_BYTES, DECIDE_OK_FIXED_BYTES, DENIED_NONE, HELLO_OK_BYTES, LEASE_OK_BYTES, LIMITS_MAX,
    RELOAD_OK_BYTES, SHARD_ANY, STATS_OK_FIXED_BYTES, STATS_RECORD_BYTES, VERDICT_BYTES,
    VERDICT_RECORD_BYTES,
};
use super::op;
use super::read::{u16_at, u32_at, u64_at};
use crate::codec::MessageHeader;
use crate::gcra::Verdict;
use crate::limit::Kind;
use crate::priority::Priority;
use crate::status::Status;

/// HELLO_OK: what a client learns at handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloOk {
    /// The negotiated protocol version.
    pub version: u16,
    /// How many shards the node has.
    pub shard_count: u16,
    /// The shard serving this connection, when HELLO asked for one.
    pub shard: Option<u16>,
    /// How keys map to shards (`routing::ROUTING_XXH3_128_MULSHIFT`).
    pub routing: u8,
    /// The node's identity, stable for the life of the process.
    pub node_id: u64,
    /// The node's replication epoch.
    pub epoch: u64,
    /// What this connection may use beyond version 1's base (byte 7, 0
    /// from a server that knows no features): bits
    /// [`FEATURE_CELL_KEY_HASH`](crate::message::FEATURE_CELL_KEY_HASH).
    pub features: u8,
}

/// One limit's verdict in a DECIDE_OK, RELEASE_OK or RENEW_OK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LimitVerdict {
    /// The limit's kind, so a client can tell its verdicts apart.
    pub kind: Kind,
    /// The limit's own verdict (PROTOCOL.md, "DECIDE_OK").
    pub verdict: Verdict,
    /// The lease an admitted concurrency acquire holds (SPEND only), the
    /// lease a RELEASE/RENEW named; 0 otherwise.
    pub lease_id: u64,
}

/// DECIDE_OK: the composite answer and every limit's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecideOk {
    /// Whether every limit admitted (SPEND: and so everything was applied).
    pub allowed: bool,
    /// The first limit that denied, if any.
    pub denied_index: Option<u8>,
    /// When every limit would admit the same request (the largest
    /// per-limit `retry_after_ns`); 0 when allowed.
    pub retry_after_ns: u64,
    /// One verdict per limit, in the request's (or tier's) order.
    pub verdicts: Vec<LimitVerdict>,
    /// The class the verdicts were computed for (the request's): their
    /// `remaining` and `retry_after` are that class's.
    pub priority: Priority,
}
/// The composite fields of a DECIDE_OK, from its verdicts: allowed iff every
/// verdict is, the first denial's index, and the largest retry time.
pub(super) fn summarize(verdicts: &[LimitVerdict]) -> (bool, Option<u8>, u64) {
    let denied_index = verdicts
        .iter()
        .position(|v| !v.verdict.allowed)
        .map(|i| i as u8);
    let retry_after_ns = match denied_index {
        None => 0,
        Some(_) => verdicts
            .iter()
            .map(|v| v.verdict.retry_after_ns)
            .max()
            .unwrap_or(0),
    };
    (denied_index.is_none(), denied_index, retry_after_ns)
}

impl DecideOk {
    /// The position of the verdict that sums the decision up: the first
    /// denial, else the least `remaining` (the first of equal minima).
    pub fn summary_index(&self) -> usize {
        match self.denied_index {
            Some(i) => usize::from(i),
            // `min_by_key` keeps the first of equal minima.
            None => self
                .verdicts
                .iter()
                .enumerate()
                .min_by_key(|(_, v)| v.verdict.remaining)
                .map_or(0, |(i, _)| i),
        }
    }

    /// The reply for these verdicts, with the composite fields computed as
    /// the server computes them.
    pub fn from_verdicts(verdicts: Vec<LimitVerdict>) -> DecideOk {
        let (allowed, denied_index, retry_after_ns) = summarize(&verdicts);
        DecideOk {
            allowed,
            denied_index,
            retry_after_ns,
            verdicts,
            priority: Priority::Normal,
        }
    }

    /// The same reply, computed for `priority`.
    pub fn for_class(self, priority: Priority) -> DecideOk {
        DecideOk { priority, ..self }
    }
}

/// RELEASE_OK and RENEW_OK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseOk {
    /// The concurrency limit as a cost-0 probe sees it afterwards, with
    /// `lease_id` the lease the request named.
    pub verdict: LimitVerdict,
    /// RENEW: time until the renewed lease expires. RELEASE: 0.
    pub expires_after_ns: u64,
}

/// One shard's counters in a STATS_OK.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShardStats {
    /// Buckets the shard holds now (every kind).
    pub buckets: u64,
    /// Bytes of memory the shard's bucket tables hold.
    pub bucket_bytes: u64,
    /// Spend decisions admitted since the process started.
    pub allowed_total: u64,
    /// Spend decisions denied since the process started.
    pub denied_total: u64,
    /// Full buckets dropped to stay under the key cap.
    pub evicted_total: u64,
    /// Requests refused with KEYS_FULL.
    pub refused_total: u64,
    /// The shard's bucket cap; 0 for none.
    pub keys_max: u64,
}

/// STATS_OK: the node's shard count and a run of shard records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsOk {
    /// How many shards the node runs.
    pub shard_count: u16,
    /// The shard of `shards[0]`.
    pub shard_first: u16,
    /// Shards `shard_first..shard_first + shards.len()`.
    pub shards: Vec<ShardStats>,
}

/// A reply, as parsed by a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    HelloOk(HelloOk),
    Pong,
    Throttle(Verdict),
    Peek(Verdict),
    Decide(DecideOk),
    Release(LeaseOk),
    Renew(LeaseOk),
    /// The reload succeeded; the new configuration has this many tiers.
    Reload {
        tier_count: u32,
    },
    Stats(StatsOk),
    /// ROLE_OK (boxed: the largest reply by far, and every reply is as
    /// large as the largest; a forwarding node keeps one per forwarded
    /// request).
    Role(Box<crate::replication::RoleOk>),
    /// PROMOTE_OK: the node is primary at this epoch.
    Promote {
        epoch: u64,
    },
    /// FAILOVER_OK.
    Failover(crate::replication::FailoverOk),
    /// CELL_OK: a forwarded CL.THROTTLE's verdict.
    Cell(crate::cell::CellVerdict),
    /// CLUSTER_OK.
    Cluster(super::cluster::ClusterOk),
    /// CHALLENGE_OK: the node's nonce and its proof ([`crate::auth`]).
    Challenge {
        nonce: [u8; crate::auth::NONCE_BYTES],
        proof: [u8; crate::auth::PROOF_BYTES],
    },
    /// An error: the code (which a newer server may send unknown to us) and
    /// the human text.
    Error {
        code: u16,
        text: String,
    },
}

impl Reply {
    /// The status of an error reply, if this is one and its code is known.
    pub fn status(&self) -> Option<Status> {
        match self {
            Reply::Error { code, .. } => Status::from_code(*code),
            _ => None,
        }
    }

    /// Parses one reply message; `None` if it is not a valid reply.
    pub fn parse(header: MessageHeader, p: &[u8]) -> Option<Reply> {
        match header.op {
            op::HELLO_OK if p.len() == HELLO_OK_BYTES => {
                let shard = u16_at(p, 4);
                Some(Reply::HelloOk(HelloOk {
                    version: u16_at(p, 0),
                    shard_count: u16_at(p, 2),
                    shard: (shard != SHARD_ANY).then_some(shard),
                    routing: p[6],
                    features: p[7],
                    node_id: u64_at(p, 8),
                    epoch: u64_at(p, 16),
                }))
            }
            op::PONG if p.is_empty() => Some(Reply::Pong),
            op::THROTTLE_OK if p.len() == VERDICT_BYTES => Some(Reply::Throttle(parse_verdict(p))),
            op::PEEK_OK if p.len() == VERDICT_BYTES => Some(Reply::Peek(parse_verdict(p))),
            op::DECIDE_OK => parse_decide_ok(p).map(Reply::Decide),
            op::RELEASE_OK => parse_lease_ok(p).map(Reply::Release),
            op::RENEW_OK => parse_lease_ok(p).map(Reply::Renew),
            op::RELOAD_OK if p.len() == RELOAD_OK_BYTES => Some(Reply::Reload {
                tier_count: u32_at(p, 0),
            }),
            op::STATS_OK => parse_stats_ok(p).map(Reply::Stats),
            op::CLUSTER_OK => super::cluster::parse_cluster_ok(p).map(Reply::Cluster),
            op::CHALLENGE_OK if p.len() == crate::auth::NONCE_BYTES + crate::auth::PROOF_BYTES => {
                let (nonce, proof) = p.split_at(crate::auth::NONCE_BYTES);
                Some(Reply::Challenge {
                    nonce: nonce.try_into().ok()?,
                    proof: proof.try_into().ok()?,
                })
            }
            op::CELL_OK => parse_cell_ok(p).map(Reply::Cell),
            crate::replication::op::ROLE_OK => {
                crate::replication::RoleOk::parse(p).map(|r| Reply::Role(Box::new(r)))
            }
            crate::replication::op::FAILOVER_OK => {
                crate::replication::FailoverOk::parse(p).map(Reply::Failover)
            }
            crate::replication::op::PROMOTE_OK if p.len() == 8 => Some(Reply::Promote {
                epoch: u64_at(p, 0),
            }),
            op::ERROR if p.len() >= 4 && p.len() == 4 + usize::from(u16_at(p, 2)) => {
                Some(Reply::Error {
                    code: u16_at(p, 0),
                    text: String::from_utf8_lossy(&p[4..]).into_owned(),
                })
            }
            _ => None,
        }
    }
}

/// A CELL_OK payload's verdict; `None` if it is not a valid one. What
/// [`Reply::parse`] makes of a CELL_OK, for a reader that looks at the op
/// itself (a forwarding node reads one per forwarded CL.THROTTLE).
#[inline]
pub fn parse_cell_ok(p: &[u8]) -> Option<crate::cell::CellVerdict> {
    (p.len() == CELL_OK_BYTES && p[1..8] == [0; 7] && p[0] <= 1).then(|| crate::cell::CellVerdict {
        limited: p[0] == 1,
        limit: u64_at(p, 8) as i64,
        remaining: u64_at(p, 16) as i64,
        retry_after_ns: u64_at(p, 24) as i64,
        reset_after_ns: u64_at(p, 32) as i64,
    })
}

fn parse_verdict(p: &[u8]) -> Verdict {
    Verdict {
        allowed: u64_at(p, 0) != 0,
        limit: u64_at(p, 8),
        remaining: u64_at(p, 16),
        retry_after_ns: u64_at(p, 24),
        reset_after_ns: u64_at(p, 32),
    }
}

/// A 48-byte verdict record; `None` for an unknown kind.
fn parse_verdict_record(r: &[u8]) -> Option<LimitVerdict> {
    Some(LimitVerdict {
        kind: Kind::from_code(r[1])?,
        verdict: Verdict {
            allowed: r[0] != 0,
            limit: u64_at(r, 8),
            remaining: u64_at(r, 16),
            retry_after_ns: u64_at(r, 24),
            reset_after_ns: u64_at(r, 32),
        },
        lease_id: u64_at(r, 40),
    })
}

/// A DECIDE_OK whose composite fields agree with its verdicts.
fn parse_decide_ok(p: &[u8]) -> Option<DecideOk> {
    if p.len() < DECIDE_OK_FIXED_BYTES {
        return None;
    }
    let count = usize::from(p[2]);
    if !(1..=LIMITS_MAX).contains(&count)
        || p.len() != DECIDE_OK_FIXED_BYTES + count * VERDICT_RECORD_BYTES
    {
        return None;
    }
    let verdicts = p[DECIDE_OK_FIXED_BYTES..]
        .chunks_exact(VERDICT_RECORD_BYTES)
        .map(parse_verdict_record)
        .collect::<Option<Vec<_>>>()?;
    let ok = DecideOk::from_verdicts(verdicts).for_class(Priority::from_code(p[3])?);
    let denied = (p[1] != DENIED_NONE).then_some(p[1]);
    let agrees =
        ok.allowed == (p[0] != 0) && ok.denied_index == denied && ok.retry_after_ns == u64_at(p, 8);
    agrees.then_some(ok)
}

fn parse_lease_ok(p: &[u8]) -> Option<LeaseOk> {
    if p.len() != LEASE_OK_BYTES {
        return None;
    }
    let verdict = parse_verdict_record(p)?;
    if verdict.kind != Kind::Concurrency || verdict.lease_id == 0 {
        return None;
    }
    Some(LeaseOk {
        verdict,
        expires_after_ns: u64_at(p, VERDICT_RECORD_BYTES),
    })
}

/// A STATS_OK: `u16 shard_count, u16 record_bytes, u16 shard_first,
/// u16 record_count`, then the records; fields past the ones this version
/// knows are skipped.
fn parse_stats_ok(p: &[u8]) -> Option<StatsOk> {
    if p.len() < STATS_OK_FIXED_BYTES {
        return None;
    }
    let shard_count = u16_at(p, 0);
    let record_bytes = usize::from(u16_at(p, 2));
    let shard_first = u16_at(p, 4);
    let record_count = u16_at(p, 6);
    let past_end = u32::from(shard_first) + u32::from(record_count) > u32::from(shard_count);
    if record_bytes < STATS_RECORD_BYTES
        || p.len() != STATS_OK_FIXED_BYTES + usize::from(record_count) * record_bytes
        || (record_count > 0 && past_end)
    {
        return None;
    }
    let shards = p[STATS_OK_FIXED_BYTES..]
        .chunks_exact(record_bytes)
        .map(|r| ShardStats {
            buckets: u64_at(r, 0),
            bucket_bytes: u64_at(r, 8),
            allowed_total: u64_at(r, 16),
            denied_total: u64_at(r, 24),
            evicted_total: u64_at(r, 32),
            refused_total: u64_at(r, 40),
            keys_max: u64_at(r, 48),
        })
        .collect();
    Some(StatsOk {
        shard_count,
        shard_first,
        shards,
    })
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};

    use super::*;
    use crate::codec::FrameWriter;
    use crate::message::encode::{put_decide_ok, put_lease_ok};
    use crate::message::test_util::{lv, one_message, parse_all};

    /// Builds one reply message with a hand-made payload.
    fn raw_reply(op: u8, p: &[u8]) -> Option<Reply> {
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        w.message(&mut buf, op, 1, |b| b.put_slice(p));
        w.finish(&mut buf);
        parse_all(&mut buf).remove(0)
    }

    fn reply_payload(put: impl FnOnce(&mut FrameWriter, &mut BytesMut)) -> Vec<u8> {
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        put(&mut w, &mut buf);
        w.finish(&mut buf);
        one_message(&mut buf).1
    }

    #[test]
    fn inconsistent_or_unknown_replies_are_refused() {
        let verdicts = [
            lv(Kind::TokenBucket, false, 5, 0),
            lv(Kind::Concurrency, true, 0, 0),
        ];
        let good = reply_payload(|w, b| put_decide_ok(w, b, 1, &verdicts, Priority::Normal));
        assert_eq!(good.len(), 16 + 2 * 48);
        assert!(raw_reply(op::DECIDE_OK, &good).is_some());
        let with = |at: usize, v: u8| {
            let mut p = good.clone();
            p[at] = v;
            raw_reply(op::DECIDE_OK, &p)
        };
        assert_eq!(with(0, 1), None, "allowed contradicts the verdicts");
        assert_eq!(with(1, 1), None, "denied_index contradicts the verdicts");
        assert_eq!(with(2, 3), None, "verdict_count contradicts the length");
        assert_eq!(with(8, 6), None, "retry_after_ns is not the largest");
        assert_eq!(with(16 + 1, 9), None, "unknown kind");
        assert!(
            with(3, 1).is_some(),
            "reserved bytes of replies are ignored"
        );
        assert_eq!(raw_reply(op::DECIDE_OK, &good[..16]), None);
        let lease = LeaseOk {
            verdict: lv(Kind::Concurrency, true, 0, 1),
            expires_after_ns: 0,
        };
        let good = reply_payload(|w, b| put_lease_ok(w, b, 1, false, &lease));
        assert_eq!(good.len(), 56);
        let mut other_kind = good.clone();
        other_kind[1] = Kind::FixedWindow.code();
        assert_eq!(raw_reply(op::RELEASE_OK, &other_kind), None);
        assert_eq!(raw_reply(op::RENEW_OK, &good[..48]), None);
        assert_eq!(raw_reply(op::RELOAD_OK, &[0; 4]), None);
    }

    #[test]
    fn stats_records_may_grow() {
        // A later server with 64-byte records: the extra counter is skipped.
        let mut p = vec![2, 0, 64, 0, 0, 0, 2, 0];
        for shard in 0..2u64 {
            for field in 0..8u64 {
                p.extend_from_slice(&(shard * 100 + field).to_le_bytes());
            }
        }
        let Some(Reply::Stats(s)) = raw_reply(op::STATS_OK, &p) else {
            panic!("a valid STATS_OK");
        };
        assert_eq!(s.shards.len(), 2);
        assert_eq!(s.shards[1].buckets, 100);
        assert_eq!(s.shards[1].keys_max, 106);
        assert_eq!(raw_reply(op::STATS_OK, &p[..p.len() - 1]), None);
        let mut short = p.clone();
        short[2] = 48;
        assert_eq!(
            raw_reply(op::STATS_OK, &short),
            None,
            "records below 56 bytes"
        );
        let mut past = p.clone();
        past[4] = 1;
        assert_eq!(
            raw_reply(op::STATS_OK, &past),
            None,
            "shards past the count"
        );
    }
}
