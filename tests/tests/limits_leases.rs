//! Concurrency leases against a real `sluiced`: a lease holds its slot
//! until it is released or expires, RENEW extends it, a lease that is gone
//! is LEASE_NOT_FOUND, and a lease lives in the bucket of its limit's
//! position.

use std::time::{Duration, Instant};

use sluice_client::{inline_limits, Client, Error, LeaseTarget, Limit, Limits, Status};
use sluice_protocol::Concurrency;
use sluice_tests::support::{client, specs, Sluiced};

/// Longest a test waits for a lease of 200 ms to expire: generous, for
/// shared machines.
const EXPIRY_WAIT: Duration = Duration::from_secs(5);

fn concurrency(spec: &str) -> Concurrency {
    match specs(&[spec])[0] {
        Limit::Concurrency(c) => c,
        other => panic!("{other:?}"),
    }
}

fn status(r: Result<impl std::fmt::Debug, Error>) -> Option<Status> {
    match r {
        Err(e) => e.status(),
        Ok(ok) => panic!("expected an error, got {ok:?}"),
    }
}

/// Acquires one slot: the lease id.
async fn acquire(client: &Client, key: &[u8], limits: Limits<'_>, index: usize) -> u64 {
    let ok = client.spend(key, limits, 1).await.unwrap();
    assert!(ok.allowed, "{ok:?}");
    let lease = ok.verdicts[index].lease_id;
    assert_ne!(lease, 0, "{ok:?}");
    lease
}

#[tokio::test]
async fn a_lease_is_held_released_renewed_and_expires() {
    let server = Sluiced::start(&["--shards", "2"]);
    let client = client(&server, true).await;
    let spec = "concurrency:1,lease=200ms";
    let limits = inline_limits(&specs(&[spec])).unwrap();
    let target = LeaseTarget::Inline {
        index: 0,
        limit: concurrency(spec),
    };
    let key = b"worker";
    let first = acquire(&client, key, limits, 0).await;
    let denied = client.spend(key, limits, 1).await.unwrap();
    assert!(!denied.allowed, "the one slot is held: {denied:?}");
    assert_eq!(denied.verdicts[0].lease_id, 0);
    let wait = denied.retry_after_ns;
    assert!(
        wait > 0 && wait <= 200_000_000,
        "until the lease expires: {wait}"
    );
    // RELEASE frees the slot at once.
    let released = client.release(key, target, first).await.unwrap();
    assert_eq!(released.verdict.lease_id, first);
    assert_eq!(released.verdict.verdict.remaining, 1);
    assert_eq!(released.expires_after_ns, 0);
    let second = acquire(&client, key, limits, 0).await;
    assert_ne!(second, first);
    // A released lease is gone for RELEASE and RENEW alike.
    let gone = client.renew(key, target, first).await;
    assert_eq!(status(gone), Some(Status::LeaseNotFound));
    let gone = client.release(key, target, first).await;
    assert_eq!(status(gone), Some(Status::LeaseNotFound));
    // RENEW gives the live lease its full time again.
    let renewed = client.renew(key, target, second).await.unwrap();
    assert_eq!(renewed.verdict.lease_id, second);
    assert_eq!(renewed.verdict.verdict.remaining, 0);
    let left = renewed.expires_after_ns;
    assert!(left > 0 && left <= 200_000_000, "{left}");
    // Not released, it frees its slot by itself.
    let start = Instant::now();
    let third = loop {
        let ok = client.spend(key, limits, 1).await.unwrap();
        if ok.allowed {
            break ok.verdicts[0].lease_id;
        }
        assert!(
            start.elapsed() < EXPIRY_WAIT,
            "a 200 ms lease still held after {EXPIRY_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(![0, first, second].contains(&third));
    let expired = client.renew(key, target, second).await;
    assert_eq!(status(expired), Some(Status::LeaseNotFound));
}

#[tokio::test]
async fn a_lease_lives_in_the_bucket_of_its_position_and_key() {
    let server = Sluiced::start(&["--shards", "2"]);
    let client = client(&server, false).await;
    let spec = "concurrency:2,lease=30s";
    let set = specs(&["token-bucket:100/s", spec]);
    let limits = inline_limits(&set).unwrap();
    let key = b"composite-worker";
    let lease = acquire(&client, key, limits, 1).await;
    let at = |index| LeaseTarget::Inline {
        index,
        limit: concurrency(spec),
    };
    // Position 0 of this key, and position 1 of another key, are other
    // buckets: the lease is not there, and nothing changes.
    let wrong = client.release(key, at(0), lease).await;
    assert_eq!(status(wrong), Some(Status::LeaseNotFound));
    let wrong = client.release(b"someone-else", at(1), lease).await;
    assert_eq!(status(wrong), Some(Status::LeaseNotFound));
    let probe = client.probe(key, limits, 0).await.unwrap();
    assert_eq!(probe.verdicts[1].verdict.remaining, 1, "still held");
    let ok = client.release(key, at(1), lease).await.unwrap();
    assert_eq!(ok.verdict.verdict.remaining, 2);
    // RESET drops every lease.
    let a = acquire(&client, key, limits, 1).await;
    let b = acquire(&client, key, limits, 1).await;
    let reset = client.reset(key, limits).await.unwrap();
    assert!(reset.allowed);
    assert_eq!(reset.verdicts[1].verdict.remaining, 2);
    for lease in [a, b] {
        let gone = client.renew(key, at(1), lease).await;
        assert_eq!(status(gone), Some(Status::LeaseNotFound));
    }
}

#[tokio::test]
async fn bad_lease_arguments_never_leave_the_client() {
    let server = Sluiced::start(&[]);
    let client = client(&server, true).await;
    let target = LeaseTarget::Inline {
        index: 0,
        limit: concurrency("concurrency:1"),
    };
    fn invalid<T>(r: Result<T, Error>) -> bool {
        matches!(r, Err(Error::Invalid(_)))
    }
    assert!(invalid(client.release(b"k", target, 0).await));
    assert!(invalid(client.release(b"", target, 1).await));
    let far = LeaseTarget::Inline {
        index: 8,
        limit: concurrency("concurrency:1"),
    };
    assert!(invalid(client.renew(b"k", far, 1).await));
    let limits = inline_limits(&specs(&["concurrency:2"])).unwrap();
    assert!(invalid(client.spend(b"k", limits, 3).await));
    assert!(invalid(
        client
            .decide(b"k", limits, sluice_client::Mode::Reset, 1)
            .await
    ));
    // The connection is fine: nothing reached the server.
    client.ping().await.unwrap();
}
