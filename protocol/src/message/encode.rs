//! The reply encoders, `put_*`: each appends one reply message.

use bytes::{BufMut, BytesMut};

use super::consts::{
    DENIED_NONE, ERROR_TEXT_BYTES_MAX, LIMITS_MAX, SHARD_ANY, STATS_RECORDS_MAX, STATS_RECORD_BYTES,
};
use super::op;
use super::reply::{summarize, HelloOk, LeaseOk, LimitVerdict, ShardStats};
use crate::codec::{message_header, FrameWriter, HEADER_BYTES};
use crate::gcra::Verdict;
use crate::priority::Priority;
use crate::status::Status;

/// Appends a HELLO_OK.
pub fn put_hello_ok(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, h: &HelloOk) {
    w.message(buf, op::HELLO_OK, request_id, |b| {
        b.put_u16_le(h.version);
        b.put_u16_le(h.shard_count);
        b.put_u16_le(h.shard.unwrap_or(SHARD_ANY));
        b.put_u8(h.routing);
        b.put_u8(h.features);
        b.put_u64_le(h.node_id);
        b.put_u64_le(h.epoch);
    });
}

/// Appends a CHALLENGE_OK: the node's nonce and proof.
pub fn put_challenge_ok(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    nonce: &[u8; crate::auth::NONCE_BYTES],
    proof: &[u8; crate::auth::PROOF_BYTES],
) {
    w.message(buf, op::CHALLENGE_OK, request_id, |b| {
        b.put_slice(nonce);
        b.put_slice(proof);
    });
}

/// Appends a PONG.
pub fn put_pong(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
    w.message(buf, op::PONG, request_id, |_| {});
}

/// Appends a verdict as the reply to THROTTLE (`peek == false`) or PEEK.
#[inline]
pub fn put_verdict(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    peek: bool,
    v: &Verdict,
) {
    let op = if peek { op::PEEK_OK } else { op::THROTTLE_OK };
    // The reply to every decision: assembled whole, copied once.
    const PAYLOAD: usize = 40;
    let mut m = [0u8; HEADER_BYTES + PAYLOAD];
    m[..HEADER_BYTES].copy_from_slice(&message_header(op, request_id, PAYLOAD as u16));
    let fields = [
        u64::from(v.allowed),
        v.limit,
        v.remaining,
        v.retry_after_ns,
        v.reset_after_ns,
    ];
    for (at, field) in m[HEADER_BYTES..].chunks_exact_mut(8).zip(fields) {
        at.copy_from_slice(&field.to_le_bytes());
    }
    w.message_whole(buf, &m);
}

/// Appends a CELL_OK: `limited` (u8, then 7 reserved zero bytes), then
/// `limit`, `remaining`, `retry_after_ns` and `reset_after_ns` as i64, in
/// nanoseconds (the RESP side rounds them as redis-cell does).
pub fn put_cell_ok(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    v: &crate::cell::CellVerdict,
) {
    // Header and payload assembled on the stack and copied once, not a
    // capacity check per field: a forwarded CL.THROTTLE's owner writes one
    // per op.
    const PAYLOAD: usize = 40;
    let mut m = [0u8; HEADER_BYTES + PAYLOAD];
    m[..HEADER_BYTES].copy_from_slice(&message_header(op::CELL_OK, request_id, PAYLOAD as u16));
    let p = &mut m[HEADER_BYTES..];
    p[..8].copy_from_slice(&u64::from(v.limited).to_le_bytes());
    p[8..16].copy_from_slice(&v.limit.to_le_bytes());
    p[16..24].copy_from_slice(&v.remaining.to_le_bytes());
    p[24..32].copy_from_slice(&v.retry_after_ns.to_le_bytes());
    p[32..].copy_from_slice(&v.reset_after_ns.to_le_bytes());
    w.message_whole(buf, &m);
}

/// Appends a DECIDE_OK for `verdicts` (one per limit, in order,
/// 1..=[`LIMITS_MAX`] of them: asserted). The composite fields (allowed,
/// denied_index, retry_after_ns) are computed from the verdicts, so they
/// always agree with them.
#[inline]
pub fn put_decide_ok(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    verdicts: &[LimitVerdict],
    priority: Priority,
) {
    assert!(
        (1..=LIMITS_MAX).contains(&verdicts.len()),
        "a DECIDE has 1..=LIMITS_MAX limits"
    );
    let (allowed, denied_index, retry_after_ns) = summarize(verdicts);
    // Assembled whole on the stack, copied once.
    let mut m = [0u8; HEADER_BYTES + DECIDE_FIXED_BYTES + LIMITS_MAX * VERDICT_RECORD_BYTES];
    let len = DECIDE_FIXED_BYTES + verdicts.len() * VERDICT_RECORD_BYTES;
    m[..HEADER_BYTES].copy_from_slice(&message_header(op::DECIDE_OK, request_id, len as u16));
    let p = &mut m[HEADER_BYTES..];
    p[0] = u8::from(allowed);
    p[1] = denied_index.unwrap_or(DENIED_NONE);
    p[2] = verdicts.len() as u8;
    p[3] = priority.code();
    p[8..16].copy_from_slice(&retry_after_ns.to_le_bytes());
    for (at, v) in p[DECIDE_FIXED_BYTES..]
        .chunks_exact_mut(VERDICT_RECORD_BYTES)
        .zip(verdicts)
    {
        at.copy_from_slice(&verdict_record(v));
    }
    w.message_whole(buf, &m[..HEADER_BYTES + len]);
}

/// Bytes of a DECIDE_OK before its verdict records.
const DECIDE_FIXED_BYTES: usize = 16;
/// Bytes of one verdict record (DECIDE_OK, RENEW_OK, RELEASE_OK).
const VERDICT_RECORD_BYTES: usize = 48;

/// Appends the reply to a RENEW (`renew == true`) or a RELEASE.
pub fn put_lease_ok(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    renew: bool,
    ok: &LeaseOk,
) {
    let op = if renew { op::RENEW_OK } else { op::RELEASE_OK };
    const PAYLOAD: usize = VERDICT_RECORD_BYTES + 8;
    let mut m = [0u8; HEADER_BYTES + PAYLOAD];
    m[..HEADER_BYTES].copy_from_slice(&message_header(op, request_id, PAYLOAD as u16));
    m[HEADER_BYTES..HEADER_BYTES + VERDICT_RECORD_BYTES]
        .copy_from_slice(&verdict_record(&ok.verdict));
    m[HEADER_BYTES + VERDICT_RECORD_BYTES..].copy_from_slice(&ok.expires_after_ns.to_le_bytes());
    w.message_whole(buf, &m);
}

/// Appends a RELOAD_OK: the reloaded configuration has `tier_count` tiers.
pub fn put_reload_ok(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, tier_count: u32) {
    w.message(buf, op::RELOAD_OK, request_id, |b| {
        b.put_u32_le(tier_count);
        b.put_u32_le(0);
    });
}

/// Appends a STATS_OK: the node runs `shard_count` shards, and `shards` are
/// the records of shards `shard_first..` (at most [`STATS_RECORDS_MAX`], and
/// not past `shard_count`: asserted). `shard_first` is the request's, even
/// past the last shard (then `shards` is empty).
pub fn put_stats(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    shard_count: u16,
    shard_first: u16,
    shards: &[ShardStats],
) {
    assert!(
        shards.len() <= STATS_RECORDS_MAX,
        "a STATS_OK holds at most STATS_RECORDS_MAX records"
    );
    assert!(
        shards.is_empty() || usize::from(shard_first) + shards.len() <= usize::from(shard_count),
        "stats records past the node's shards"
    );
    w.message(buf, op::STATS_OK, request_id, |b| {
        b.put_u16_le(shard_count);
        b.put_u16_le(STATS_RECORD_BYTES as u16);
        b.put_u16_le(shard_first);
        b.put_u16_le(shards.len() as u16);
        for s in shards {
            b.put_u64_le(s.buckets);
            b.put_u64_le(s.bucket_bytes);
            b.put_u64_le(s.allowed_total);
            b.put_u64_le(s.denied_total);
            b.put_u64_le(s.evicted_total);
            b.put_u64_le(s.refused_total);
            b.put_u64_le(s.keys_max);
        }
    });
}

/// Appends an ERROR with `text` cut to [`ERROR_TEXT_BYTES_MAX`] bytes (at a
/// character boundary).
pub fn put_error(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    status: Status,
    text: &str,
) {
    let mut end = text.len().min(ERROR_TEXT_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text.as_bytes()[..end];
    w.message(buf, op::ERROR, request_id, |b| {
        b.put_u16_le(status.code());
        b.put_u16_le(text.len() as u16);
        b.put_slice(text);
    });
}

/// One verdict record: allowed, kind, 6 reserved bytes, then limit,
/// remaining, retry_after_ns, reset_after_ns and lease_id (u64 each).
#[inline]
fn verdict_record(v: &LimitVerdict) -> [u8; VERDICT_RECORD_BYTES] {
    let mut r = [0u8; VERDICT_RECORD_BYTES];
    r[0] = u8::from(v.verdict.allowed);
    r[1] = v.kind.code();
    let fields = [
        v.verdict.limit,
        v.verdict.remaining,
        v.verdict.retry_after_ns,
        v.verdict.reset_after_ns,
        v.lease_id,
    ];
    for (at, field) in r[8..].chunks_exact_mut(8).zip(fields) {
        at.copy_from_slice(&field.to_le_bytes());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::FrameDecoder;
    use crate::limit::Kind;
    use crate::message::reply::{DecideOk, Reply, StatsOk};
    use crate::message::test_util::{lv, parse_all, S};
    use tokio_util::codec::Decoder;

    #[test]
    fn replies_round_trip() {
        let v = Verdict {
            allowed: true,
            limit: 20,
            remaining: 19,
            retry_after_ns: 0,
            reset_after_ns: 100,
        };
        let hello = HelloOk {
            version: 1,
            shard_count: 4,
            shard: None,
            routing: 1,
            node_id: 7,
            epoch: 3,
            features: 0,
        };
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        put_verdict(&mut w, &mut buf, 1, false, &v);
        put_verdict(&mut w, &mut buf, 2, true, &v);
        put_hello_ok(&mut w, &mut buf, 3, &hello);
        put_pong(&mut w, &mut buf, 4);
        put_error(&mut w, &mut buf, 5, Status::BadKey, &"é".repeat(200));
        w.finish(&mut buf);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        let replies: Vec<Reply> = frame
            .messages()
            .map(|(h, p)| Reply::parse(h, p).unwrap())
            .collect();
        assert_eq!(replies[0], Reply::Throttle(v));
        assert_eq!(replies[1], Reply::Peek(v));
        assert_eq!(replies[2], Reply::HelloOk(hello));
        assert_eq!(replies[3], Reply::Pong);
        match &replies[4] {
            Reply::Error { code, text } => {
                assert_eq!(*code, Status::BadKey.code());
                assert_eq!(text.len(), 256, "cut to the limit at a char boundary");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn new_replies_round_trip() {
        let verdicts = vec![
            lv(Kind::TokenBucket, true, 0, 0),
            lv(Kind::SlidingLog, false, 30, 0),
            lv(Kind::FixedWindow, false, 70, 0),
            lv(Kind::Concurrency, true, 0, 0),
        ];
        let denied = DecideOk::from_verdicts(verdicts.clone());
        assert_eq!(
            (denied.allowed, denied.denied_index, denied.retry_after_ns),
            (false, Some(1), 70)
        );
        let admitted = DecideOk::from_verdicts(vec![lv(Kind::Concurrency, true, 0, 12)]);
        assert_eq!(
            (
                admitted.allowed,
                admitted.denied_index,
                admitted.retry_after_ns
            ),
            (true, None, 0)
        );
        let lease = LeaseOk {
            verdict: lv(Kind::Concurrency, true, 0, 12),
            expires_after_ns: 30 * S,
        };
        let stats = StatsOk {
            shard_count: 3,
            shard_first: 1,
            shards: vec![
                ShardStats {
                    buckets: 1,
                    bucket_bytes: 2,
                    allowed_total: 3,
                    denied_total: 4,
                    evicted_total: 5,
                    refused_total: 6,
                    keys_max: 7,
                },
                ShardStats::default(),
            ],
        };
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        put_decide_ok(&mut w, &mut buf, 1, &denied.verdicts, denied.priority);
        put_decide_ok(&mut w, &mut buf, 2, &admitted.verdicts, admitted.priority);
        put_lease_ok(&mut w, &mut buf, 3, false, &lease);
        put_lease_ok(&mut w, &mut buf, 4, true, &lease);
        put_reload_ok(&mut w, &mut buf, 5, 3);
        put_stats(&mut w, &mut buf, 6, 3, 1, &stats.shards);
        put_stats(&mut w, &mut buf, 7, 3, 5, &[]);
        w.finish(&mut buf);
        let replies = parse_all(&mut buf);
        assert_eq!(replies[0], Some(Reply::Decide(denied)));
        assert_eq!(replies[1], Some(Reply::Decide(admitted)));
        assert_eq!(replies[2], Some(Reply::Release(lease)));
        assert_eq!(replies[3], Some(Reply::Renew(lease)));
        assert_eq!(replies[4], Some(Reply::Reload { tier_count: 3 }));
        assert_eq!(replies[5], Some(Reply::Stats(stats)));
        let empty = StatsOk {
            shard_count: 3,
            shard_first: 5,
            shards: vec![],
        };
        assert_eq!(replies[6], Some(Reply::Stats(empty)));
    }
}
