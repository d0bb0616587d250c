//! PROTOCOL.md checked against the code. Every fenced block tagged
//! `hex golden=NAME` is one complete frame: decoding it must give exactly the
//! typed messages listed here, and encoding those messages with the crate's
//! encoders must give exactly its bytes. The `text golden=routing`,
//! `text golden=identity`, `text golden=cluster_routing` and
//! `text golden=limits` blocks, the worked routing example and the
//! error-code table are checked the same way, so the spec cannot drift
//! from the code without a test failing.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::BytesMut;
use sluice_protocol::codec::{self, FrameDecoder, FrameWriter};
use sluice_protocol::gcra::{self, Bucket, Verdict};
use sluice_protocol::identity::{bucket_key, Slot};
use sluice_protocol::limit::concurrency::{ConcurrencyState, Lease};
use sluice_protocol::limit::fixed_window::FixedWindowState;
use sluice_protocol::limit::sliding_counter::SlidingCounterState;
use sluice_protocol::limit::sliding_log::SlidingLogState;
use sluice_protocol::limit::{self, concurrency, fixed_window, Concurrency, Kind, Limit, Window};
use sluice_protocol::message::{
    self, Cell, Decide, DecideOk, Hello, HelloOk, LeaseOk, LeaseOp, LeaseTarget, LimitSet,
    LimitVerdict, Limits, Mode, Reply, Request, ShardStats, Stats, StatsOk, Throttle,
};
use sluice_protocol::policy::{self, Policy};
use sluice_protocol::priority::{Priority, Reserved, Reserves};
use sluice_protocol::replication::{
    self as repl, FailoverOk, Record, ReplState, Role, RoleOk, State, Subscribe, SyncHeader,
    SyncReader, SyncWriter,
};
use sluice_protocol::ring::{self, Ring};
use sluice_protocol::routing::{self, key_hash, shard_of};
use sluice_protocol::status::{Action, Status};
use tokio_util::codec::Decoder;

const SECOND_NS: u64 = 1_000_000_000;
/// The instant the example conversation happens at; any value gives the
/// same verdicts, since the server sends no absolute times.
const T0_NS: u64 = 1_700_000_000 * SECOND_NS;

fn doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("PROTOCOL.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A fenced block tagged `golden=NAME`.
#[derive(Debug)]
struct Block {
    /// The info string's first word (`hex`, `text`).
    lang: String,
    /// The lines between the fences.
    body: String,
}

/// Every `golden=NAME` block in `doc`, by name; panics on a duplicate name
/// or an unterminated fence.
fn golden_blocks(doc: &str) -> BTreeMap<String, Block> {
    let mut blocks = BTreeMap::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut body = String::new();
        let mut closed = false;
        for inner in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                closed = true;
                break;
            }
            body.push_str(inner);
            body.push('\n');
        }
        assert!(closed, "unterminated code block `{line}`");
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or_default().to_owned();
        if let Some(name) = words.find_map(|w| w.strip_prefix("golden=")) {
            let old = blocks.insert(name.to_owned(), Block { lang, body });
            assert!(old.is_none(), "two blocks are named golden={name}");
        }
    }
    blocks
}

/// Hex pairs separated by white space; `#` starts a comment.
fn parse_hex(name: &str, body: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for line in body.lines() {
        let data = line.split('#').next().unwrap_or_default();
        for tok in data.split_whitespace() {
            assert!(tok.len() == 2, "golden={name}: `{tok}` is not a hex byte");
            let b = u8::from_str_radix(tok, 16)
                .unwrap_or_else(|_| panic!("golden={name}: `{tok}` is not a hex byte"));
            bytes.push(b);
        }
    }
    bytes
}

/// One message of a golden frame.
// A DECIDE holds its limits inline; a test table can afford the size.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Msg {
    Request(Request<'static>),
    Reply(Reply),
}

fn ten_per_second() -> Policy {
    Policy::new(10, SECOND_NS, 20).expect("a valid policy")
}

fn throttle(key: &'static [u8], cost: u64) -> Throttle<'static> {
    Throttle {
        key,
        policy: ten_per_second(),
        cost,
    }
}

fn verdict(allowed: bool, remaining: u64, retry_after_ns: u64, reset_after_ns: u64) -> Verdict {
    Verdict {
        allowed,
        limit: 20,
        remaining,
        retry_after_ns,
        reset_after_ns,
    }
}

const HELLO_OK: HelloOk = HelloOk {
    version: 1,
    shard_count: 4,
    shard: Some(2),
    routing: routing::ROUTING_XXH3_128_MULSHIFT,
    node_id: 0x0123_4567_89ab_cdef,
    epoch: 7,
    features: 0,
};

const COST_EXCEEDS_BURST_TEXT: &str =
    "cost exceeds burst: cost 21 exceeds burst 20: it could never be admitted";

/// The second conversation's instant: 20 s into a one-minute window.
const DECIDE_T0_NS: u64 = T0_NS;

/// The composite example's limits: 5/s burst 5, 100 per minute, and 10
/// concurrent with 30-second leases.
fn composite_limits() -> [Limit; 3] {
    [
        Limit::TokenBucket(Policy::new(5, SECOND_NS, 5).expect("a valid policy")),
        Limit::FixedWindow(Window::new(100, 60 * SECOND_NS).expect("a valid window")),
        Limit::Concurrency(concurrency_limit()),
    ]
}

fn concurrency_limit() -> Concurrency {
    Concurrency::new(10, 30 * SECOND_NS).expect("a valid concurrency limit")
}

fn decide(limits: Limits<'static>) -> Decide<'static> {
    Decide {
        mode: Mode::Spend,
        key: b"user:42",
        limits,
        cost: 1,
        priority: Priority::Normal,
    }
}

/// The backend limit of the reserves example, with its reserves.
fn backend_limit() -> Reserved {
    "concurrency:10,lease=30s,reserve=critical:20%,reserve=normal:50%"
        .parse()
        .expect("a valid limit spec")
}

fn decide_reserves() -> Decide<'static> {
    let set = LimitSet::with_reserves(&[backend_limit()]).expect("one limit");
    Decide {
        key: b"backend:search",
        limits: Limits::Inline(set),
        priority: Priority::Low,
        ..decide(Limits::Tier("unused"))
    }
}

fn decide_reserves_ok() -> DecideOk {
    let v = Verdict {
        allowed: false,
        limit: 10,
        remaining: 0,
        retry_after_ns: 30 * SECOND_NS,
        reset_after_ns: 30 * SECOND_NS,
    };
    DecideOk::from_verdicts(vec![limit_verdict(Kind::Concurrency, v, 0)]).for_class(Priority::Low)
}

fn lease_op(lease_id: u64) -> LeaseOp<'static> {
    LeaseOp {
        key: b"user:42",
        target: LeaseTarget::Inline {
            index: 2,
            limit: concurrency_limit(),
        },
        lease_id,
    }
}

fn limit_verdict(kind: Kind, verdict: Verdict, lease_id: u64) -> LimitVerdict {
    LimitVerdict {
        kind,
        verdict,
        lease_id,
    }
}

fn concurrency_verdict(remaining: u64, reset_after_ns: u64, lease_id: u64) -> LimitVerdict {
    let v = Verdict {
        allowed: true,
        limit: 10,
        remaining,
        retry_after_ns: 0,
        reset_after_ns,
    };
    limit_verdict(Kind::Concurrency, v, lease_id)
}

fn decide_ok() -> DecideOk {
    let tb = Verdict {
        allowed: false,
        limit: 5,
        remaining: 0,
        retry_after_ns: 200_000_000,
        reset_after_ns: SECOND_NS,
    };
    let fw = Verdict {
        allowed: true,
        limit: 100,
        remaining: 94,
        retry_after_ns: 0,
        reset_after_ns: 40 * SECOND_NS,
    };
    DecideOk::from_verdicts(vec![
        limit_verdict(Kind::TokenBucket, tb, 0),
        limit_verdict(Kind::FixedWindow, fw, 0),
        concurrency_verdict(4, 30 * SECOND_NS, 0),
    ])
}

fn release_ok() -> LeaseOk {
    LeaseOk {
        verdict: concurrency_verdict(6, 30 * SECOND_NS, 3),
        expires_after_ns: 0,
    }
}

fn renew_ok() -> LeaseOk {
    LeaseOk {
        verdict: concurrency_verdict(6, 30 * SECOND_NS, 4),
        expires_after_ns: 30 * SECOND_NS,
    }
}

fn stats_ok() -> StatsOk {
    StatsOk {
        shard_count: 2,
        shard_first: 0,
        shards: vec![
            ShardStats {
                buckets: 1_024,
                bucket_bytes: 65_536,
                allowed_total: 982_311,
                denied_total: 1_204,
                evicted_total: 0,
                refused_total: 0,
                keys_max: 1_200,
            },
            ShardStats {
                buckets: 1_200,
                bucket_bytes: 81_920,
                allowed_total: 979_002,
                denied_total: 988,
                evicted_total: 40,
                refused_total: 3,
                keys_max: 1_200,
            },
        ],
    }
}

/// What each golden frame holds: `(request id, message)` in order.
fn expected_frames() -> Vec<(&'static str, Vec<(u32, Msg)>)> {
    use Msg::{Reply as Rep, Request as Req};
    vec![
        ("ping_request", vec![(1, Req(Request::Ping))]),
        ("pong_reply", vec![(1, Rep(Reply::Pong))]),
        (
            "hello_request",
            vec![(
                1,
                Req(Request::Hello(Hello {
                    version_min: 1,
                    version_max: 1,
                    shard: Some(2),
                    token: b"secret",
                    epoch: 0,
                    layout: 0,
                })),
            )],
        ),
        ("hello_ok_reply", vec![(1, Rep(Reply::HelloOk(HELLO_OK)))]),
        (
            "hello_request_unbound",
            vec![(
                1,
                Req(Request::Hello(Hello {
                    version_min: 1,
                    version_max: 1,
                    shard: None,
                    token: b"",
                    epoch: 0,
                    layout: 0,
                })),
            )],
        ),
        (
            "hello_ok_reply_unbound",
            vec![(
                1,
                Rep(Reply::HelloOk(HelloOk {
                    shard: None,
                    ..HELLO_OK
                })),
            )],
        ),
        (
            "throttle_request",
            vec![(7, Req(Request::Throttle(throttle(b"user:42", 1))))],
        ),
        (
            "throttle_ok_reply",
            vec![(7, Rep(Reply::Throttle(verdict(true, 19, 0, 100_000_000))))],
        ),
        (
            "peek_request",
            vec![(8, Req(Request::Peek(throttle(b"user:42", 1))))],
        ),
        (
            "peek_ok_reply",
            vec![(8, Rep(Reply::Peek(verdict(true, 18, 0, 200_000_000))))],
        ),
        (
            "error_cost_exceeds_burst_reply",
            vec![(
                9,
                Rep(Reply::Error {
                    code: 10,
                    text: COST_EXCEEDS_BURST_TEXT.to_owned(),
                }),
            )],
        ),
        (
            "error_too_many_connections_reply",
            vec![(
                0,
                Rep(Reply::Error {
                    code: 12,
                    text: "too many connections".to_owned(),
                }),
            )],
        ),
        (
            "batch_request",
            vec![
                (10, Req(Request::Throttle(throttle(b"user:42", 1)))),
                (11, Req(Request::Throttle(throttle(b"user:7", 2)))),
            ],
        ),
        (
            "batch_reply",
            vec![
                (10, Rep(Reply::Throttle(verdict(true, 18, 0, 200_000_000)))),
                (11, Rep(Reply::Throttle(verdict(true, 18, 0, 200_000_000)))),
            ],
        ),
        (
            "throttle_denied_reply",
            vec![(
                12,
                Rep(Reply::Throttle(verdict(
                    false,
                    0,
                    100_000_000,
                    2_000_000_000,
                ))),
            )],
        ),
        (
            "decide_request",
            vec![(
                20,
                Req(Request::Decide(decide(Limits::Inline(
                    LimitSet::new(&composite_limits()).expect("3 limits"),
                )))),
            )],
        ),
        (
            "decide_ok_reply",
            vec![(20, Rep(Reply::Decide(decide_ok())))],
        ),
        (
            "decide_tier_request",
            vec![(21, Req(Request::Decide(decide(Limits::Tier("free")))))],
        ),
        (
            "decide_reserves_request",
            vec![(27, Req(Request::Decide(decide_reserves())))],
        ),
        (
            "decide_reserves_reply",
            vec![(27, Rep(Reply::Decide(decide_reserves_ok())))],
        ),
        (
            "release_request",
            vec![(22, Req(Request::Release(lease_op(3))))],
        ),
        (
            "release_ok_reply",
            vec![(22, Rep(Reply::Release(release_ok())))],
        ),
        (
            "renew_request",
            vec![(23, Req(Request::Renew(lease_op(4))))],
        ),
        ("renew_ok_reply", vec![(23, Rep(Reply::Renew(renew_ok())))]),
        ("reload_request", vec![(24, Req(Request::Reload))]),
        (
            "reload_ok_reply",
            vec![(24, Rep(Reply::Reload { tier_count: 3 }))],
        ),
        (
            "stats_request",
            vec![(25, Req(Request::Stats(Stats { shard_first: 0 })))],
        ),
        ("stats_ok_reply", vec![(25, Rep(Reply::Stats(stats_ok())))]),
        (
            "error_keys_full_reply",
            vec![(
                26,
                Rep(Reply::Error {
                    code: 16,
                    text: "keys full".to_owned(),
                }),
            )],
        ),
        (
            "cell_hashed_request",
            vec![(
                34,
                Req(Request::Cell(Cell {
                    key: b"",
                    policy: sluice_protocol::cell::CellPolicy::new(4, 1, 3600).unwrap(),
                    quantity: 1,
                    hash: Some(routing::key_hash(b"user:42")),
                })),
            )],
        ),
        ("role_request", vec![(30, Req(Request::Role))]),
        (
            "role_ok_reply",
            vec![(30, Rep(Reply::Role(Box::new(role_ok()))))],
        ),
        ("promote_request", vec![(31, Req(Request::Promote))]),
        (
            "promote_ok_reply",
            vec![(31, Rep(Reply::Promote { epoch: 8 }))],
        ),
        ("failover_request", vec![(32, Req(Request::Failover))]),
        (
            "failover_ok_reply",
            vec![(32, Rep(Reply::Failover(FAILOVER_OK)))],
        ),
        (
            "challenge_request",
            vec![(
                33,
                Req(Request::Challenge {
                    nonce: CLIENT_NONCE,
                }),
            )],
        ),
        (
            "challenge_ok_reply",
            vec![(
                33,
                Rep(Reply::Challenge {
                    nonce: NODE_NONCE,
                    proof: sluice_protocol::auth::node_proof(b"secret", &CLIENT_NONCE, &NODE_NONCE),
                }),
            )],
        ),
    ]
}

/// The golden CHALLENGE's nonces.
const CLIENT_NONCE: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
const NODE_NONCE: [u8; 16] = [
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
];

/// The follower's proof PROTOCOL.md quotes is the one `auth` makes.
#[test]
fn golden_challenge_proofs_are_auths() {
    let doc = doc();
    let quoted = "d6 8e a8 0d 2f a6 da 05 e7 84 b7 17 2c f6 11 85 4f 6e\n14 64 1e 31 e4 03 f3 7c f8 b5 09 d3 d7 63";
    assert!(
        doc.contains(quoted),
        "PROTOCOL.md no longer quotes the proof"
    );
    let want: String = sluice_protocol::auth::peer_proof(b"secret", &NODE_NONCE, &CLIENT_NONCE)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(quoted.replace('\n', " "), want);
}

fn encode_reply(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, reply: &Reply) {
    match reply {
        Reply::HelloOk(h) => message::put_hello_ok(w, buf, request_id, h),
        Reply::Pong => message::put_pong(w, buf, request_id),
        Reply::Throttle(v) => message::put_verdict(w, buf, request_id, false, v),
        Reply::Peek(v) => message::put_verdict(w, buf, request_id, true, v),
        Reply::Decide(ok) => message::put_decide_ok(w, buf, request_id, &ok.verdicts, ok.priority),
        Reply::Release(ok) => message::put_lease_ok(w, buf, request_id, false, ok),
        Reply::Renew(ok) => message::put_lease_ok(w, buf, request_id, true, ok),
        Reply::Reload { tier_count } => message::put_reload_ok(w, buf, request_id, *tier_count),
        Reply::Stats(s) => {
            message::put_stats(w, buf, request_id, s.shard_count, s.shard_first, &s.shards);
        }
        Reply::Role(r) => sluice_protocol::replication::put_role_ok(w, buf, request_id, r),
        Reply::Promote { epoch } => {
            sluice_protocol::replication::put_promote_ok(w, buf, request_id, *epoch);
        }
        Reply::Failover(ok) => {
            sluice_protocol::replication::put_failover_ok(w, buf, request_id, ok)
        }
        Reply::Cell(v) => message::put_cell_ok(w, buf, request_id, v),
        Reply::Cluster(c) => message::put_cluster_ok(w, buf, request_id, c),
        Reply::Challenge { nonce, proof } => {
            message::put_challenge_ok(w, buf, request_id, nonce, proof)
        }
        Reply::Error { code, text } => {
            let status = Status::from_code(*code).expect("golden errors use known codes");
            message::put_error(w, buf, request_id, status, text);
        }
    }
}

fn encode(messages: &[(u32, Msg)]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::new();
    for (request_id, m) in messages {
        match m {
            Msg::Request(r) => r.encode(&mut w, &mut buf, *request_id),
            Msg::Reply(r) => encode_reply(&mut w, &mut buf, *request_id, r),
        }
    }
    w.finish(&mut buf);
    buf.to_vec()
}

fn assert_decodes_to(name: &str, bytes: &[u8], expected: &[(u32, Msg)]) {
    let mut src = BytesMut::from(bytes);
    let frame = FrameDecoder::default()
        .decode(&mut src)
        .unwrap_or_else(|e| panic!("golden={name} does not decode: {e}"))
        .unwrap_or_else(|| panic!("golden={name} is not a whole frame"));
    assert!(src.is_empty(), "golden={name} has bytes after its frame");
    assert_eq!(frame.len(), expected.len(), "golden={name}: message count");
    for (i, ((h, p), (request_id, m))) in frame.messages().zip(expected).enumerate() {
        assert_eq!(h.request_id, *request_id, "golden={name} message {i}");
        // A request's flags carry its class (or, on a CELL, that it
        // carries its key's hash); a reply's are 0.
        let flags = match m {
            Msg::Request(Request::Decide(d)) => d.priority.code(),
            Msg::Request(Request::Cell(Cell { hash: Some(_), .. })) => message::CELL_KEY_HASH,
            _ => 0,
        };
        assert_eq!(h.flags, flags, "golden={name} message {i}");
        match m {
            Msg::Request(r) => {
                let got = Request::parse(h, p)
                    .unwrap_or_else(|e| panic!("golden={name} message {i}: {e}"));
                assert_eq!(got, *r, "golden={name} message {i}");
            }
            Msg::Reply(r) => {
                assert_eq!(
                    Reply::parse(h, p).as_ref(),
                    Some(r),
                    "golden={name} message {i}"
                );
            }
        }
    }
}

#[test]
fn golden_frames_decode_and_encode_exactly() {
    let doc = doc();
    let blocks = golden_blocks(&doc);
    let expected = expected_frames();
    let hex_names: Vec<&str> = blocks
        .iter()
        .filter(|(_, b)| b.lang == "hex")
        .map(|(n, _)| n.as_str())
        .collect();
    for name in &hex_names {
        assert!(
            expected.iter().any(|(n, _)| n == name) || REPLICATION_GOLDENS.contains(name),
            "PROTOCOL.md has golden={name}, which this test does not know"
        );
    }
    for (name, messages) in &expected {
        let block = blocks
            .get(*name)
            .unwrap_or_else(|| panic!("PROTOCOL.md lacks the block golden={name}"));
        assert_eq!(block.lang, "hex", "golden={name} must be a hex block");
        let bytes = parse_hex(name, &block.body);
        assert_decodes_to(name, &bytes, messages);
        assert_eq!(
            encode(messages),
            bytes,
            "golden={name}: the encoder's bytes differ from PROTOCOL.md"
        );
    }
}

/// Looks up the verdict of message `index` of golden frame `name`.
fn golden_verdict(name: &str, index: usize) -> Verdict {
    let frames = expected_frames();
    let (_, messages) = frames.iter().find(|(n, _)| *n == name).expect("a golden");
    match &messages[index].1 {
        Msg::Reply(Reply::Throttle(v) | Reply::Peek(v)) => *v,
        other => panic!("golden={name} message {index} is not a verdict: {other:?}"),
    }
}

/// The verdict goldens are the ones the decision gives for the example
/// conversation in PROTOCOL.md (every request at one instant, fresh buckets).
#[test]
fn golden_verdicts_are_the_decision() {
    let p = ten_per_second();
    let d7 = gcra::throttle(None, &p, 1, T0_NS);
    assert_eq!(d7.verdict, golden_verdict("throttle_ok_reply", 0));
    let user42 = d7.bucket;
    let v8 = gcra::peek(user42, &p, 1, T0_NS);
    assert_eq!(v8, golden_verdict("peek_ok_reply", 0));
    let d10 = gcra::throttle(user42, &p, 1, T0_NS);
    assert_eq!(d10.verdict, golden_verdict("batch_reply", 0));
    let d11 = gcra::throttle(None, &p, 2, T0_NS);
    assert_eq!(d11.verdict, golden_verdict("batch_reply", 1));
    // A bucket whose 20 units were all spent at this instant.
    let mut spent: Option<Bucket> = None;
    for _ in 0..20 {
        let d = gcra::throttle(spent, &p, 1, T0_NS);
        assert!(d.verdict.allowed);
        spent = d.bucket;
    }
    let d12 = gcra::throttle(spent, &p, 1, T0_NS);
    assert_eq!(d12.verdict, golden_verdict("throttle_denied_reply", 0));
    // Retrying exactly retry_after_ns later is admitted.
    let later = T0_NS + d12.verdict.retry_after_ns;
    assert!(gcra::throttle(spent, &p, 1, later).verdict.allowed);
}

/// The golden error texts are what the server sends for those errors.
#[test]
fn golden_error_texts_are_the_servers() {
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::new();
    Request::Throttle(throttle(b"user:42", 21)).encode(&mut w, &mut buf, 9);
    w.finish(&mut buf);
    let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
    let (h, p) = frame.messages().next().unwrap();
    let err = Request::parse(h, p).unwrap_err();
    assert_eq!(err.status, Status::CostExceedsBurst);
    assert_eq!(err.to_string(), COST_EXCEEDS_BURST_TEXT);
    assert_eq!(
        Status::TooManyConnections.text(),
        "too many connections",
        "server.rs refuses a connection with exactly this text"
    );
    assert_eq!(Status::KeysFull.text(), "keys full");
}

/// Looks up message `index` of golden frame `name`.
fn golden_reply(name: &str, index: usize) -> Reply {
    let frames = expected_frames();
    let (_, messages) = frames.iter().find(|(n, _)| *n == name).expect("a golden");
    match &messages[index].1 {
        Msg::Reply(r) => r.clone(),
        other => panic!("golden={name} message {index} is not a reply: {other:?}"),
    }
}

/// The second conversation (DECIDE, RELEASE, RENEW) replayed through the
/// decision functions, as a shard would apply it.
#[test]
fn golden_reserve_verdict_is_the_decision() {
    let Reserved {
        limit: Limit::Concurrency(cc),
        reserves,
    } = backend_limit()
    else {
        unreachable!("a concurrency limit")
    };
    assert_eq!(
        reserves,
        Reserves {
            critical_bp: 2_000,
            normal_bp: 5_000
        }
    );
    let mut leases = None;
    for lease_id in 1..=5 {
        let d = concurrency::acquire(leases, &cc, 1, lease_id, DECIDE_T0_NS);
        assert!(d.verdict.allowed);
        leases = d.state;
    }
    let class = |p: Priority| {
        let floor = reserves.floor(cc.limit, p);
        sluice_protocol::priority::probe(floor, cc.limit, 1, |c| {
            concurrency::peek(leases.as_ref(), &cc, c, DECIDE_T0_NS)
        })
    };
    let low = DecideOk::from_verdicts(vec![limit_verdict(
        Kind::Concurrency,
        class(Priority::Low),
        0,
    )])
    .for_class(Priority::Low);
    assert_eq!(Reply::Decide(low), golden_reply("decide_reserves_reply", 0));
    // What the prose says of the other classes.
    assert!(class(Priority::Normal).allowed && class(Priority::Critical).allowed);
    assert_eq!(reserves.floor(cc.limit, Priority::Low), 5);
    assert_eq!(reserves.floor(cc.limit, Priority::Normal), 2);
}

#[test]
fn golden_decide_verdicts_are_the_decision() {
    let [Limit::TokenBucket(tb), Limit::FixedWindow(fw), Limit::Concurrency(cc)] =
        composite_limits()
    else {
        unreachable!("the example's kinds")
    };
    assert_eq!(
        DECIDE_T0_NS % (60 * SECOND_NS),
        20 * SECOND_NS,
        "20 s into a window"
    );
    // Five admitted DECIDEs of cost 1 at T0, acquiring the leases 1..=5.
    let (mut bucket, mut window, mut leases) = (None, None, None);
    for lease_id in 1..=5 {
        let d = gcra::throttle(bucket, &tb, 1, DECIDE_T0_NS);
        assert!(d.verdict.allowed);
        bucket = d.bucket;
        let d = fixed_window::throttle(window, &fw, 1, DECIDE_T0_NS);
        assert!(d.verdict.allowed);
        window = d.state;
        let d = concurrency::acquire(leases, &cc, 1, lease_id, DECIDE_T0_NS);
        assert!(d.verdict.allowed);
        leases = d.state;
    }
    // The sixth: each limit's own verdict, as SPEND reports them.
    let verdicts = vec![
        limit_verdict(
            Kind::TokenBucket,
            gcra::peek(bucket, &tb, 1, DECIDE_T0_NS),
            0,
        ),
        limit_verdict(
            Kind::FixedWindow,
            fixed_window::peek(window, &fw, 1, DECIDE_T0_NS),
            0,
        ),
        limit_verdict(
            Kind::Concurrency,
            concurrency::peek(leases.as_ref(), &cc, 1, DECIDE_T0_NS),
            0,
        ),
    ];
    let ok = DecideOk::from_verdicts(verdicts);
    assert_eq!(
        Reply::Decide(ok.clone()),
        golden_reply("decide_ok_reply", 0)
    );
    // Retrying after the combined retry_after_ns, every limit admits.
    let later = DECIDE_T0_NS + ok.retry_after_ns;
    assert!(gcra::peek(bucket, &tb, 1, later).allowed);
    assert!(fixed_window::peek(window, &fw, 1, later).allowed);
    assert!(concurrency::peek(leases.as_ref(), &cc, 1, later).allowed);
    // RELEASE lease 3 at T0.
    let released = concurrency::release(leases, &cc, 3, DECIDE_T0_NS);
    assert_eq!(released.outcome, Ok(()));
    let release = LeaseOk {
        verdict: limit_verdict(Kind::Concurrency, released.decision.verdict, 3),
        expires_after_ns: 0,
    };
    assert_eq!(Reply::Release(release), golden_reply("release_ok_reply", 0));
    // RENEW lease 4 at T0 + 10 s.
    let now_ns = DECIDE_T0_NS + 10 * SECOND_NS;
    let renewed = concurrency::renew(released.decision.state, &cc, 4, now_ns);
    assert_eq!(renewed.outcome, Ok(()));
    let state = renewed.decision.state.expect("4 live leases");
    let lease = state.leases().iter().find(|l| l.id == 4).expect("lease 4");
    let renew = LeaseOk {
        verdict: limit_verdict(Kind::Concurrency, renewed.decision.verdict, 4),
        expires_after_ns: lease.expires_ns - now_ns,
    };
    assert_eq!(Reply::Renew(renew), golden_reply("renew_ok_reply", 0));
}

#[test]
fn golden_identity_block_is_the_code() {
    let blocks = golden_blocks(&doc());
    let block = blocks
        .get("identity")
        .expect("PROTOCOL.md lacks the block golden=identity");
    let mut lines = 0;
    let mut compatible = 0;
    for line in block.body.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            words.len(),
            4,
            "identity line `{line}`: KEY KIND SLOT BUCKET_KEY"
        );
        let key = words[0]
            .strip_prefix('"')
            .and_then(|k| k.strip_suffix('"'))
            .unwrap_or_else(|| panic!("identity line `{line}`: the key must be quoted"));
        let kind: Kind = words[1]
            .parse()
            .unwrap_or_else(|e| panic!("identity line `{line}`: {e}"));
        let slot = match words[2].split(':').collect::<Vec<_>>()[..] {
            ["inline", i] => Slot::Inline(i.parse().expect("a position")),
            ["tier", name, i] => Slot::Tier {
                name: name.as_bytes(),
                index: i.parse().expect("a position"),
            },
            _ => panic!("identity line `{line}`: slot inline:N or tier:NAME:N"),
        };
        let want = words[3]
            .strip_prefix("0x")
            .and_then(|h| u128::from_str_radix(h, 16).ok())
            .unwrap_or_else(|| panic!("identity line `{line}`: expected a 0x bucket key"));
        let hash = key_hash(key.as_bytes());
        assert_eq!(bucket_key(hash, kind, slot), want, "{line}");
        assert_eq!(want >> 64, hash >> 64, "{line}: routing bits kept");
        if want == hash {
            compatible += 1;
        }
        lines += 1;
    }
    assert!(lines >= 6, "the identity block must give several values");
    assert!(compatible >= 1, "the block must show the THROTTLE bucket");
}

#[test]
fn golden_routing_block_is_the_code() {
    let blocks = golden_blocks(&doc());
    let block = blocks
        .get("routing")
        .expect("PROTOCOL.md lacks the block golden=routing");
    let mut keys = 0;
    for line in block.body.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let key = words
            .next()
            .and_then(|k| k.strip_prefix('"'))
            .and_then(|k| k.strip_suffix('"'))
            .unwrap_or_else(|| panic!("routing line `{line}`: the key must be quoted"));
        let hash = words
            .next()
            .and_then(|h| h.strip_prefix("0x"))
            .and_then(|h| u128::from_str_radix(h, 16).ok())
            .unwrap_or_else(|| panic!("routing line `{line}`: expected a 0x hash"));
        assert_eq!(key_hash(key.as_bytes()), hash, "key_hash({key:?})");
        let mut counts = 0;
        for pair in words {
            let (n, s) = pair
                .split_once(':')
                .unwrap_or_else(|| panic!("routing line `{line}`: `{pair}` is not COUNT:SHARD"));
            let n: u16 = n.parse().expect("a shard count");
            let s: u16 = s.parse().expect("a shard");
            assert_eq!(shard_of(hash, n), s, "shard_of({key:?}, {n})");
            counts += 1;
        }
        assert!(
            counts >= 2,
            "routing line `{line}`: give several shard counts"
        );
        keys += 1;
    }
    assert!(keys >= 2, "the routing block must give several keys");
}

/// A `"quoted"` word of a golden line.
fn unquote<'a>(word: Option<&'a str>, what: &str, line: &str) -> &'a str {
    word.and_then(|w| w.strip_prefix('"'))
        .and_then(|w| w.strip_suffix('"'))
        .unwrap_or_else(|| panic!("cluster_routing line `{line}`: the {what} must be quoted"))
}

/// A `0x` hex word of a golden line.
fn hex_word(word: Option<&str>, what: &str, line: &str) -> u128 {
    word.and_then(|w| w.strip_prefix("0x"))
        .and_then(|w| u128::from_str_radix(w, 16).ok())
        .unwrap_or_else(|| panic!("cluster_routing line `{line}`: expected a 0x {what}"))
}

/// PROTOCOL.md, "Cluster routing": every group's name hash, every score
/// and every key's owner among each listed set of group names.
#[test]
fn golden_cluster_routing_block_is_the_code() {
    let blocks = golden_blocks(&doc());
    let block = blocks
        .get("cluster_routing")
        .expect("PROTOCOL.md lacks the block golden=cluster_routing");
    assert_eq!(block.lang, "text", "golden=cluster_routing is a text block");
    let (mut groups, mut scores, mut keys, mut moved) = (0, 0, 0, 0);
    let mut sets = std::collections::BTreeSet::new();
    for line in block.body.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace().peekable();
        match words.peek() {
            Some(&"group") => {
                words.next();
                let name = unquote(words.next(), "group name", line);
                let want = hex_word(words.next(), "name hash", line);
                assert_eq!(u128::from(ring::name_hash(name)), want, "{line}");
                assert!(words.next().is_none(), "{line}: group NAME HASH");
                groups += 1;
            }
            Some(&"score") => {
                words.next();
                let key = unquote(words.next(), "key", line);
                let name = unquote(words.next(), "group name", line);
                let want = hex_word(words.next(), "score", line);
                let bits = ring::key_bits(key_hash(key.as_bytes()));
                let got = ring::score(bits, ring::name_hash(name));
                assert_eq!(u128::from(got), want, "{line}");
                assert!(words.next().is_none(), "{line}: score KEY NAME SCORE");
                scores += 1;
            }
            _ => {
                let key = unquote(words.next(), "key", line);
                let hash = hex_word(words.next(), "hash", line);
                assert_eq!(key_hash(key.as_bytes()), hash, "key_hash({key:?})");
                let bits = hex_word(words.next(), "key_bits", line);
                assert_eq!(u128::from(ring::key_bits(hash)), bits, "key_bits({key:?})");
                let mut owners = Vec::new();
                for pair in words {
                    let (names, owner) = pair.split_once('=').unwrap_or_else(|| {
                        panic!("cluster_routing line `{line}`: `{pair}` is not NAMES=OWNER")
                    });
                    let names: Vec<&str> = names.split(',').collect();
                    let ring = Ring::new(names.iter().copied());
                    assert_eq!(ring.owner(hash), owner, "owner of {key:?} among {names:?}");
                    // The same owner whatever the order of the names.
                    let reversed = Ring::new(names.iter().rev().copied());
                    assert_eq!(reversed.owner(hash), owner, "{key:?} among {names:?}");
                    sets.insert(names.join(","));
                    owners.push(owner);
                }
                assert!(
                    owners.len() >= 2,
                    "cluster_routing line `{line}`: give several group sets"
                );
                if owners.windows(2).any(|w| w[0] != w[1]) {
                    moved += 1;
                }
                keys += 1;
            }
        }
    }
    assert!(groups >= 4, "the block must give every group's name hash");
    assert!(scores >= 4, "the block must give a key's scores");
    assert!(keys >= 12, "the block must give at least 12 keys");
    assert!(
        sets.contains("a,b,c") && sets.contains("a,b,c,d"),
        "{sets:?}"
    );
    assert!(moved >= 1, "the block must show a key that moves");
}

/// The worked example in PROTOCOL.md, "Routing", hard-coded here.
#[test]
fn routing_worked_example() {
    let hash = key_hash(b"user:42");
    assert_eq!(hash, 0x8763cfe7e8dd227b_54c6a0eba0ce373f);
    let high64 = (hash >> 64) as u64;
    assert_eq!(high64, 9_755_869_812_765_827_707);
    let product = u128::from(high64) * 4;
    assert_eq!(product, 39_023_479_251_063_310_828);
    assert_eq!(product >> 64, 2);
    assert_eq!(shard_of(hash, 4), 2);
}

#[test]
fn golden_limits_block_is_the_code() {
    let constants: &[(&str, u64)] = &[
        (
            "PROTOCOL_VERSION",
            u64::from(sluice_protocol::PROTOCOL_VERSION),
        ),
        ("FRAME_PREFIX_BYTES", codec::FRAME_PREFIX_BYTES as u64),
        ("HEADER_BYTES", codec::HEADER_BYTES as u64),
        (
            "FRAME_BYTES_MAX_DEFAULT",
            u64::from(codec::FRAME_BYTES_MAX_DEFAULT),
        ),
        (
            "FRAME_BYTES_MAX_LIMIT",
            u64::from(codec::FRAME_BYTES_MAX_LIMIT),
        ),
        (
            "WRITER_FRAME_BYTES_SOFT",
            codec::WRITER_FRAME_BYTES_SOFT as u64,
        ),
        ("KEY_BYTES_MAX", message::KEY_BYTES_MAX as u64),
        ("TOKEN_BYTES_MAX", message::TOKEN_BYTES_MAX as u64),
        ("ERROR_TEXT_BYTES_MAX", message::ERROR_TEXT_BYTES_MAX as u64),
        ("SHARD_ANY", u64::from(message::SHARD_ANY)),
        (
            "ROUTING_XXH3_128_MULSHIFT",
            u64::from(routing::ROUTING_XXH3_128_MULSHIFT),
        ),
        ("COUNT_MAX", policy::COUNT_MAX),
        ("PERIOD_NS_MIN", policy::PERIOD_NS_MIN),
        ("PERIOD_NS_MAX", policy::PERIOD_NS_MAX),
        ("BURST_MAX", policy::BURST_MAX),
        ("REFILL_NS_MAX", policy::REFILL_NS_MAX),
        ("LIMITS_MAX", message::LIMITS_MAX as u64),
        ("TIER_BYTES_MAX", message::TIER_BYTES_MAX as u64),
        ("LIMIT_RECORD_BYTES", message::LIMIT_RECORD_BYTES as u64),
        ("VERDICT_RECORD_BYTES", message::VERDICT_RECORD_BYTES as u64),
        ("STATS_RECORD_BYTES", message::STATS_RECORD_BYTES as u64),
        ("STATS_RECORDS_MAX", message::STATS_RECORDS_MAX as u64),
        ("WINDOW_NS_MIN", limit::WINDOW_NS_MIN),
        ("WINDOW_NS_MAX", limit::WINDOW_NS_MAX),
        ("WINDOW_LIMIT_MAX", limit::WINDOW_LIMIT_MAX),
        ("SLIDING_LOG_LIMIT_MAX", limit::SLIDING_LOG_LIMIT_MAX),
        ("CONCURRENCY_LIMIT_MAX", limit::CONCURRENCY_LIMIT_MAX),
        ("LEASE_NS_MIN", limit::LEASE_NS_MIN),
        ("LEASE_NS_MAX", limit::LEASE_NS_MAX),
        ("ROLE_OK_FIXED_BYTES", repl::ROLE_OK_FIXED_BYTES as u64),
        ("ADDR_BYTES_MAX", repl::ADDR_BYTES_MAX as u64),
        ("SUBSCRIBE_FIXED_BYTES", repl::SUBSCRIBE_FIXED_BYTES as u64),
        ("SYNC_FIXED_BYTES", repl::SYNC_FIXED_BYTES as u64),
        (
            "SYNC_PAYLOAD_BYTES_MAX",
            repl::SYNC_PAYLOAD_BYTES_MAX as u64,
        ),
        ("SYNC_FULL_DONE", u64::from(repl::SYNC_FULL_DONE)),
        ("SYNC_TAKEOVER", u64::from(repl::SYNC_TAKEOVER)),
        ("RECORD_HEAD_BYTES", repl::RECORD_HEAD_BYTES as u64),
        ("RECORD_ABSENT", u64::from(repl::RECORD_ABSENT)),
        ("RECORD_MORE", u64::from(repl::RECORD_MORE)),
        ("RECORD_PART_ITEMS_MAX", repl::RECORD_PART_ITEMS_MAX as u64),
    ];
    let blocks = golden_blocks(&doc());
    let block = blocks
        .get("limits")
        .expect("PROTOCOL.md lacks the block golden=limits");
    let mut seen = BTreeMap::new();
    for line in block.body.lines() {
        let data = line.split('#').next().unwrap_or_default().trim();
        if data.is_empty() {
            continue;
        }
        let (name, value) = data
            .split_once(char::is_whitespace)
            .unwrap_or_else(|| panic!("limits line `{line}`: expected NAME VALUE"));
        let value: u64 = value
            .trim()
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("limits line `{line}`: the value is not a number"));
        seen.insert(name.to_owned(), value);
    }
    for (name, value) in constants {
        assert_eq!(
            seen.remove(*name),
            Some(*value),
            "limit {name} in PROTOCOL.md"
        );
    }
    assert!(
        seen.is_empty(),
        "limits PROTOCOL.md lists but this test does not check: {seen:?}"
    );
}

/// `CostExceedsBurst` to `COST_EXCEEDS_BURST`.
fn wire_name(status: Status) -> String {
    let mut name = String::new();
    for (i, c) in format!("{status:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

fn action_word(action: Action) -> &'static str {
    match action {
        Action::Retry => "retry",
        Action::Reconnect => "reconnect",
        Action::GiveUp => "give up",
        Action::FailOver => "fail over",
        Action::OutcomeUnknown => "outcome unknown",
    }
}

/// The table in "Error codes": one row per status, with its code, name,
/// text and the action `Status::action` gives.
#[test]
fn error_code_table_is_the_code() {
    let doc = doc();
    let section = doc
        .split("\n## Error codes")
        .nth(1)
        .expect("PROTOCOL.md has a section `## Error codes`");
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut rows = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 6 {
            continue;
        }
        let Ok(code) = cells[1].parse::<u16>() else {
            continue;
        };
        let old = rows.insert(
            code,
            cells[2..6]
                .iter()
                .map(|c| c.replace('`', ""))
                .collect::<Vec<_>>(),
        );
        assert!(old.is_none(), "code {code} appears twice");
    }
    for &status in Status::ALL {
        let row = rows
            .remove(&status.code())
            .unwrap_or_else(|| panic!("the error table lacks code {}", status.code()));
        assert_eq!(row[0], wire_name(status), "name of code {}", status.code());
        assert_eq!(row[1], status.text(), "text of code {}", status.code());
        let action = action_word(status.action());
        assert!(
            row[3].to_lowercase().starts_with(action),
            "code {}: the action column must start with `{action}`, got `{}`",
            status.code(),
            row[3]
        );
    }
    assert!(
        rows.is_empty(),
        "the error table has codes the code does not: {rows:?}"
    );
}

// ---- Replication: ROLE, PROMOTE, FAILOVER (above), SUBSCRIBE, SYNC, ACK ----

/// The golden frames of a flow (PROTOCOL.md, "Replication"): not
/// `Request`/`Reply` messages, so `replication_golden_frames_are_the_code`
/// checks them.
const REPLICATION_GOLDENS: [&str; 3] = ["subscribe_request", "sync_message", "ack_message"];

/// The request id of the example flow's SUBSCRIBE, which its SYNCs carry.
const SUBSCRIBE_REQUEST_ID: u32 = 2;

/// A primary at epoch 7 in sync mode whose follower streams.
fn role_ok() -> RoleOk {
    RoleOk {
        role: Role::Primary,
        state: ReplState::Streaming,
        mode: repl::Mode::Sync,
        epoch: 7,
        lag_us: 250,
        keys_synced: 1_024,
        stream_bytes: 73_728,
        stream_records: 1_500,
        primary: "10.0.0.1:7700".to_owned(),
        follower: "10.0.0.2:7700".to_owned(),
    }
}

const FAILOVER_OK: FailoverOk = FailoverOk {
    epoch: 8,
    unavailable_us: 1_830,
};

/// The follower's SUBSCRIBE for primary shard 2.
fn subscribe() -> Subscribe {
    Subscribe {
        node_id: 0xfedc_ba98_7654_3210,
        epoch: 7,
        shard: 2,
        promote_after_ms: 1_000,
        addr: "10.0.0.2:7700".to_owned(),
    }
}

/// The SYNC's fixed part (its record count is the writer's).
fn sync_header(count: u32) -> SyncHeader {
    SyncHeader {
        seq: 42,
        epoch: 7,
        now_ns: T0_NS,
        flags: 0,
        count,
    }
}

/// A bucket key of `user:42` (PROTOCOL.md, "Bucket identity").
fn user42(kind: Kind, slot: Slot<'_>) -> u128 {
    bucket_key(key_hash(b"user:42"), kind, slot)
}

/// The golden SYNC's records: one of each kind, and one absent.
fn sync_records() -> Vec<Record> {
    let minute = 60 * SECOND_NS;
    let window_start_ns = T0_NS - T0_NS % minute;
    let log = SlidingLogState::from_runs([(T0_NS - 500_000_000, 2), (T0_NS - 100_000_000, 1)])
        .expect("a valid log");
    let leases = ConcurrencyState::from_leases([
        Lease {
            id: 1,
            expires_ns: T0_NS + 29 * SECOND_NS,
            units: 1,
        },
        Lease {
            id: 2,
            expires_ns: T0_NS + 30 * SECOND_NS,
            units: 2,
        },
    ])
    .expect("valid leases");
    let free = |index| Slot::Tier {
        name: b"free",
        index,
    };
    vec![
        Record {
            kind: Kind::TokenBucket,
            key: user42(Kind::TokenBucket, Slot::Inline(0)),
            state: Some(State::TokenBucket(Bucket {
                tat_fp: u128::from(T0_NS + 600_000_000) << 32,
            })),
        },
        Record {
            kind: Kind::FixedWindow,
            key: user42(Kind::FixedWindow, Slot::Inline(1)),
            state: Some(State::FixedWindow {
                window_ns: minute,
                state: FixedWindowState {
                    window_start_ns,
                    count: 3,
                },
            }),
        },
        Record {
            kind: Kind::SlidingCounter,
            key: user42(Kind::SlidingCounter, Slot::Inline(3)),
            state: Some(State::SlidingCounter {
                window_ns: minute,
                state: SlidingCounterState {
                    window_start_ns,
                    prev: 40,
                    cur: 7,
                },
            }),
        },
        Record {
            kind: Kind::SlidingLog,
            key: user42(Kind::SlidingLog, free(1)),
            state: Some(State::SlidingLog {
                window_ns: SECOND_NS,
                log,
            }),
        },
        Record {
            kind: Kind::Concurrency,
            key: user42(Kind::Concurrency, Slot::Inline(2)),
            state: Some(State::Concurrency(leases)),
        },
        Record {
            kind: Kind::TokenBucket,
            key: user42(Kind::TokenBucket, free(0)),
            state: None,
        },
    ]
}

/// The golden flow frames, encoded by the crate.
fn encode_subscribe() -> Vec<u8> {
    let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
    subscribe().encode(&mut w, &mut buf, SUBSCRIBE_REQUEST_ID);
    w.finish(&mut buf);
    buf.to_vec()
}

fn encode_sync() -> Vec<u8> {
    let mut sw = SyncWriter::new();
    for r in sync_records() {
        sw.push(r.kind, r.key, r.state.as_ref());
    }
    let parts = sw.take();
    assert_eq!(parts.len(), 1, "the golden SYNC is one message");
    let (count, records) = &parts[0];
    let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
    repl::put_sync(
        &mut w,
        &mut buf,
        SUBSCRIBE_REQUEST_ID,
        &sync_header(*count),
        records,
    );
    w.finish(&mut buf);
    buf.to_vec()
}

fn encode_ack() -> Vec<u8> {
    let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
    repl::put_ack(&mut w, &mut buf, 42);
    w.finish(&mut buf);
    buf.to_vec()
}

/// Decodes golden frame `name`: exactly one frame holding one message.
fn one_message(name: &str, bytes: &[u8]) -> (codec::MessageHeader, Vec<u8>) {
    let mut src = BytesMut::from(bytes);
    let frame = FrameDecoder::default()
        .decode(&mut src)
        .unwrap_or_else(|e| panic!("golden={name} does not decode: {e}"))
        .unwrap_or_else(|| panic!("golden={name} is not a whole frame"));
    assert!(src.is_empty(), "golden={name} has bytes after its frame");
    assert_eq!(frame.len(), 1, "golden={name}: one message");
    let (h, p) = frame.messages().next().expect("one message");
    assert_eq!(h.flags, 0, "golden={name}");
    (h, p.to_vec())
}

/// The flow's golden frames (SUBSCRIBE, SYNC, ACK): decoding each gives
/// exactly the typed values above, and the crate's encoders give exactly
/// its bytes.
#[test]
fn replication_golden_frames_are_the_code() {
    let blocks = golden_blocks(&doc());
    let golden = |name: &str| {
        let block = blocks
            .get(name)
            .unwrap_or_else(|| panic!("PROTOCOL.md lacks the block golden={name}"));
        assert_eq!(block.lang, "hex", "golden={name} must be a hex block");
        parse_hex(name, &block.body)
    };

    let bytes = golden("subscribe_request");
    let (h, p) = one_message("subscribe_request", &bytes);
    assert_eq!(h.op, repl::op::SUBSCRIBE);
    assert_eq!(h.request_id, SUBSCRIBE_REQUEST_ID);
    assert_eq!(Subscribe::parse(&p), Some(subscribe()));
    assert_eq!(encode_subscribe(), bytes, "golden=subscribe_request");

    let bytes = golden("sync_message");
    let (h, p) = one_message("sync_message", &bytes);
    assert_eq!(h.op, repl::op::SYNC);
    assert!(repl::is_sync(&h));
    assert_eq!(
        h.request_id, SUBSCRIBE_REQUEST_ID,
        "a SYNC carries the SUBSCRIBE's id"
    );
    let mut reader = SyncReader::new();
    let mut records = Vec::new();
    let header = reader
        .parse(&p, |r| records.push(r))
        .unwrap_or_else(|e| panic!("golden=sync_message: {e}"));
    assert!(!reader.in_part(), "golden=sync_message ends every record");
    let expected = sync_records();
    assert_eq!(header, sync_header(expected.len() as u32));
    assert_eq!(records, expected);
    let kinds: Vec<Kind> = records.iter().map(|r| r.kind).collect();
    for kind in [
        Kind::TokenBucket,
        Kind::FixedWindow,
        Kind::SlidingLog,
        Kind::SlidingCounter,
        Kind::Concurrency,
    ] {
        assert!(kinds.contains(&kind), "golden=sync_message lacks {kind:?}");
    }
    assert!(
        records.iter().any(|r| r.state.is_none()),
        "an absent record"
    );
    assert_eq!(encode_sync(), bytes, "golden=sync_message");

    let bytes = golden("ack_message");
    let (h, p) = one_message("ack_message", &bytes);
    assert_eq!(h.op, repl::op::ACK);
    assert_eq!(h.request_id, 0, "an ACK carries request id 0");
    assert_eq!(repl::parse_ack(&p), Some(42));
    assert_eq!(encode_ack(), bytes, "golden=ack_message");
}
