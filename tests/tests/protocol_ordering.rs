//! Batching and pipelining against a real `sluiced`: replies come back in
//! request order, whichever shard decided each request.

use sluice_protocol::cell::CellPolicy;
use sluice_protocol::message::{Cell, Hello, Reply, Request, Throttle};
use sluice_protocol::routing::{key_hash, shard_of};
use sluice_protocol::{Policy, Status};
use sluice_tests::raw::{frame, Raw};
use sluice_tests::support::Sluiced;

fn policy() -> Policy {
    Policy::new(10, 1_000_000_000, 5).unwrap()
}

/// Sends `requests` as one frame and reads their replies, asserting they
/// come in request order.
async fn in_order(
    addr: std::net::SocketAddr,
    requests: &[(u32, Request<'_>)],
) -> Vec<(u32, Reply)> {
    let mut raw = Raw::connect(addr).await;
    raw.send_frame(requests).await;
    let replies = raw.replies(requests.len()).await;
    let ids: Vec<u32> = replies.iter().map(|(id, _)| *id).collect();
    let expected: Vec<u32> = requests.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, expected);
    replies
}

#[tokio::test]
async fn a_batch_is_answered_in_order_across_shards() {
    let server = Sluiced::start(&["--shards", "4"]);
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let shards: std::collections::HashSet<u16> = keys
        .iter()
        .map(|k| shard_of(key_hash(k.as_bytes()), server.shards))
        .collect();
    assert_eq!(shards.len(), 4, "the batch spans every shard");
    let mut requests = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        requests.push((
            1_000 + i as u32,
            Request::Throttle(Throttle {
                key: k.as_bytes(),
                policy: policy(),
                cost: 1,
            }),
        ));
    }
    // A ping and a request that can never succeed, in the middle.
    requests.insert(10, (7, Request::Ping));
    requests.insert(
        20,
        (
            8,
            Request::Throttle(Throttle {
                key: b"k0",
                policy: policy(),
                cost: 6,
            }),
        ),
    );
    let replies = in_order(server.addr, &requests).await;
    assert_eq!(replies[10].1, Reply::Pong);
    assert_eq!(replies[20].1.status(), Some(Status::CostExceedsBurst));
    for (id, r) in &replies {
        if *id >= 1_000 {
            let Reply::Throttle(v) = r else {
                panic!("{r:?}")
            };
            assert!(v.allowed);
            assert_eq!(v.remaining, 4);
        }
    }
}

/// CELLs (CL.THROTTLE's request, what entry points forward) across
/// shards: a shard's own keys are answered at once when their turn has
/// come and queued behind another shard's answer when not; either way in
/// request order, each with its own bucket's verdict.
#[tokio::test]
async fn a_batch_of_cells_is_answered_in_order_across_shards() {
    let server = Sluiced::start(&["--shards", "4"]);
    let keys: Vec<String> = (0..40).map(|i| format!("cell{i}")).collect();
    let policy = CellPolicy::new(4, 1, 60).unwrap();
    let mut requests: Vec<(u32, Request<'_>)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        // Every fourth key asks twice its burst: limited.
        let quantity = if i % 4 == 3 { 10 } else { 1 + (i % 3) as u64 };
        let cell = Cell {
            key: k.as_bytes(),
            policy,
            quantity,
            hash: None,
        };
        requests.push((1_000 + i as u32, Request::Cell(cell)));
    }
    requests.insert(10, (7, Request::Ping));
    let replies = in_order(server.addr, &requests).await;
    assert_eq!(replies[10].1, Reply::Pong);
    for ((_, request), (id, reply)) in requests.iter().zip(&replies) {
        let Request::Cell(c) = request else { continue };
        let Reply::Cell(v) = reply else {
            panic!("{id}: {reply:?}")
        };
        assert_eq!(v.limit, 5, "{id}");
        if c.quantity > 5 {
            assert!(v.limited, "{id}");
            assert_eq!(v.remaining, 5, "{id}");
        } else {
            assert!(!v.limited, "{id}");
            assert_eq!(v.remaining, 5 - c.quantity as i64, "{id}");
        }
    }
}

#[tokio::test]
async fn pipelined_frames_are_answered_in_order() {
    let server = Sluiced::start(&["--shards", "3"]);
    let mut raw = Raw::connect(server.addr).await;
    // 50 frames of 8 requests, all written before any reply is read; the
    // same key repeats so the verdicts' remaining counts show the order in
    // which the shard applied them.
    let mut bytes = Vec::new();
    let mut id = 0u32;
    for f in 0..50 {
        let mut reqs = Vec::new();
        for r in 0..8 {
            id += 1;
            let key = if r % 2 == 0 {
                "pipelined-a"
            } else {
                "pipelined-b"
            };
            let p = Policy::new(1, 3_600_000_000_000, 1_000).unwrap();
            let t = Throttle {
                key: key.as_bytes(),
                policy: p,
                cost: 1,
            };
            reqs.push((
                id,
                if f % 5 == 4 && r == 0 {
                    Request::Peek(t)
                } else {
                    Request::Throttle(t)
                },
            ));
        }
        bytes.extend(frame(&reqs));
    }
    raw.send_bytes(&bytes).await;
    let replies = raw.replies(400).await;
    let mut remaining_a = 1_000u64;
    for (i, (rid, reply)) in replies.iter().enumerate() {
        assert_eq!(*rid, i as u32 + 1, "reply {i} out of order");
        let is_a = i % 8 % 2 == 0;
        match reply {
            Reply::Throttle(v) if is_a => {
                remaining_a -= 1;
                assert_eq!(v.remaining, remaining_a, "reply {i}");
            }
            Reply::Peek(v) => assert_eq!(
                v.remaining,
                remaining_a - 1,
                "peek {i} sees the state so far"
            ),
            Reply::Throttle(_) => {}
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn hello_binds_a_connection_to_a_shard() {
    let server = Sluiced::start(&["--shards", "4"]);
    for shard in 0..4u16 {
        let mut raw = Raw::connect(server.addr).await;
        let hello = Hello {
            version_min: 1,
            version_max: 1,
            shard: Some(shard),
            token: b"",
            epoch: 0,
            layout: 0,
        };
        raw.send_frame(&[(1, Request::Hello(hello))]).await;
        let (id, reply) = raw.next_reply().await.unwrap();
        assert_eq!(id, 1);
        let Reply::HelloOk(ok) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!((ok.shard, ok.shard_count, ok.version), (Some(shard), 4, 1));
        // The moved connection serves keys of every shard.
        let t = Throttle {
            key: b"any",
            policy: policy(),
            cost: 1,
        };
        raw.send_frame(&[(2, Request::Throttle(t)), (3, Request::Ping)])
            .await;
        let replies = raw.replies(2).await;
        assert!(matches!(replies[0], (2, Reply::Throttle(_))));
        assert_eq!(replies[1], (3, Reply::Pong));
    }
    let mut raw = Raw::connect(server.addr).await;
    let bad = Hello {
        version_min: 1,
        version_max: 1,
        shard: Some(4),
        token: b"",
        epoch: 0,
        layout: 0,
    };
    let old = Hello {
        version_min: 2,
        version_max: 9,
        shard: None,
        token: b"",
        epoch: 0,
        layout: 0,
    };
    raw.send_frame(&[(1, Request::Hello(bad)), (2, Request::Hello(old))])
        .await;
    let replies = raw.replies(2).await;
    assert_eq!(replies[0].1.status(), Some(Status::BadRequest));
    assert_eq!(replies[1].1.status(), Some(Status::UnsupportedVersion));
}
