//! The admin HTTP listener (`--admin-port`) of a real `sluiced`: a scrape
//! of /metrics that `promtool check metrics` accepts and whose counters
//! follow the decisions made; /health; /ready of a primary, of a follower
//! in sync and of one that has lost its primary; /role as JSON.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_protocol::Policy;
use sluice_tests::support::{http_get as get, metric_sample as sample, port, ConfigFile, Sluiced};

#[tokio::test]
async fn metrics_pass_promtool_and_count_the_decisions() {
    let dir = std::env::temp_dir().join(format!("sluice-admin-{}", std::process::id()));
    // With the rate limit port and a cluster (of its own group alone), so
    // that promtool sees their families too: the cluster's forwarded
    // requests share a name with the shards' (one family, or promtool
    // refuses the second HELP).
    let rules = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rls/rules");
    let at = port();
    let cluster = ConfigFile::new(&format!(
        "[[groups]]\nname = \"a\"\nprimary = \"127.0.0.1:{at}\"\n"
    ));
    let server = Sluiced::start_on(
        at,
        &[
            "--shards",
            "1",
            "--admin-port",
            "0",
            "--snapshot-dir",
            dir.to_str().unwrap(),
            "--rls-port",
            "0",
            "--rls-config",
            rules.to_str().unwrap(),
            "--cluster",
            cluster.arg(),
            "--group",
            "a",
        ],
    );
    let admin = server.admin_addr.expect("the admin line was printed");
    // The shared test client's long deadline: the default (5 ms, a
    // gateway's) timed the first call out once on a loaded CI machine.
    let client = sluice_tests::support::client(&server, false).await;
    let policy = Policy::new(1, 3_600_000_000_000, 3).unwrap();
    for _ in 0..5 {
        client.throttle(b"scraped", policy, 1).await.unwrap();
    }
    // Refused before sending by the client, so sent raw: cost 4 > burst 3.
    let mut raw = sluice_tests::raw::Raw::connect(server.addr).await;
    let over = sluice_protocol::message::Request::Throttle(sluice_protocol::message::Throttle {
        key: b"scraped",
        policy,
        cost: 4,
    });
    raw.send_frame(&[(1, over)]).await;
    let (_, reply) = raw.next_reply().await.unwrap();
    assert_eq!(
        reply.status(),
        Some(sluice_protocol::Status::CostExceedsBurst)
    );
    drop(raw);
    let (code, scrape) = tokio::task::spawn_blocking(move || get(admin, "/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200, "{scrape}");
    // Three admitted, two denied, one bucket.
    assert_eq!(
        sample(
            &scrape,
            r#"sluice_decisions_total{shard="0",result="allowed"}"#
        ),
        3.0
    );
    assert_eq!(
        sample(
            &scrape,
            r#"sluice_decisions_total{shard="0",result="denied"}"#
        ),
        2.0
    );
    assert_eq!(sample(&scrape, r#"sluice_buckets{shard="0"}"#), 1.0);
    assert_eq!(
        sample(&scrape, r#"sluice_replication_role{role="primary"}"#),
        1.0
    );
    // The client's, and the raw one's if its close is not counted yet.
    let open = sample(&scrape, "sluice_connections_open");
    assert!((1.0..=2.0).contains(&open), "{open}");
    let tb = r#"sluice_limit_verdicts_total{shard="0",kind="token-bucket",result="#;
    assert_eq!(sample(&scrape, &format!(r#"{tb}"allowed"}}"#)), 3.0);
    assert_eq!(sample(&scrape, &format!(r#"{tb}"denied"}}"#)), 2.0);
    assert!(sample(&scrape, r#"sluice_received_bytes_total{shard="0"}"#) > 0.0);
    assert!(sample(&scrape, r#"sluice_sent_bytes_total{shard="0"}"#) > 0.0);
    // Every throttle was at least in one frame, and took some time.
    let frames = sample(&scrape, r#"sluice_frame_handling_seconds_count{shard="0"}"#);
    assert!(frames >= 1.0, "{frames}");
    assert!(sample(&scrape, r#"sluice_frame_handling_seconds_sum{shard="0"}"#) > 0.0);
    assert_eq!(sample(&scrape, "sluice_snapshot_failures_total"), 0.0);
    assert_eq!(sample(&scrape, r#"sluice_rls_calls_total{code="ok"}"#), 0.0);
    assert_eq!(
        sample(
            &scrape,
            r#"sluice_errors_total{code="10",text="cost exceeds burst"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &scrape,
            r#"sluice_errors_total{code="19",text="not primary"}"#
        ),
        0.0
    );
    let _ = std::fs::remove_dir_all(&dir);
    // Prometheus's own checker accepts it (names, types, units, syntax).
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (scripts/deps.sh installs Debian's prometheus package)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool has remarks: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Requests whose key another shard owns are counted there, with the time
/// that shard took to decide each batch of them.
#[tokio::test]
async fn forwarded_requests_are_counted_by_the_shard_that_decides_them() {
    let server = Sluiced::start(&["--shards", "2", "--admin-port", "0"]);
    let admin = server.admin_addr.unwrap();
    let (_, before) = tokio::task::spawn_blocking(move || get(admin, "/metrics"))
        .await
        .unwrap();
    for shard in ["0", "1"] {
        let series = format!(r#"sluice_forwarded_requests_total{{shard="{shard}"}}"#);
        assert_eq!(sample(&before, &series), 0.0);
    }
    // One connection (on one shard), twenty keys (on both).
    let mut raw = sluice_tests::raw::Raw::connect(server.addr).await;
    let keys: Vec<String> = (0..20).map(|i| format!("fwd:{i}")).collect();
    let policy = Policy::new(10, 1_000_000_000, 10).unwrap();
    let requests: Vec<(u32, sluice_protocol::message::Request<'_>)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let t = sluice_protocol::message::Throttle {
                key: k.as_bytes(),
                policy,
                cost: 1,
            };
            (i as u32 + 1, sluice_protocol::message::Request::Throttle(t))
        })
        .collect();
    raw.send_frame(&requests).await;
    assert_eq!(raw.replies(20).await.len(), 20);
    let (_, scrape) = tokio::task::spawn_blocking(move || get(admin, "/metrics"))
        .await
        .unwrap();
    let mut forwarded = 0.0;
    let mut batches = 0.0;
    for shard in ["0", "1"] {
        forwarded += sample(
            &scrape,
            &format!(r#"sluice_forwarded_requests_total{{shard="{shard}"}}"#),
        );
        batches += sample(
            &scrape,
            &format!(r#"sluice_forwarded_batch_seconds_count{{shard="{shard}"}}"#),
        );
    }
    // The other shard's keys: at least one of twenty, never all.
    assert!((1.0..20.0).contains(&forwarded), "{forwarded}");
    // One frame: one batch to the other shard.
    assert_eq!(batches, 1.0);
}

#[tokio::test]
async fn health_ready_and_role_follow_the_replication_state() {
    let mut primary = Sluiced::start(&["--shards", "1", "--admin-port", "0"]);
    let of = primary.addr.to_string();
    let follower = Sluiced::start(&["--shards", "1", "--admin-port", "0", "--replica-of", &of]);
    let (p, f) = (primary.admin_addr.unwrap(), follower.admin_addr.unwrap());
    let wait_for = move |addr, path: &'static str, want: u16| {
        let start = Instant::now();
        loop {
            let (code, body) = get(addr, path);
            if code == want {
                return body;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{path}: {code} {body}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    tokio::task::spawn_blocking(move || {
        assert_eq!(get(p, "/health"), (200, "ok\n".to_owned()));
        assert_eq!(get(p, "/ready").0, 200);
        // The follower is ready once it streams from its primary.
        wait_for(f, "/ready", 200);
        let (code, role) = get(f, "/role");
        assert_eq!(code, 200);
        let role: serde_json::Value = serde_json::from_str(&role).expect("JSON");
        assert_eq!(role["role"], "follower");
        assert_eq!(role["state"], "streaming");
        assert_eq!(role["primary"], of.as_str());
        // The primary counts the full sync it sent (one shard, one).
        let (_, scrape) = get(p, "/metrics");
        assert_eq!(
            sample(&scrape, r#"sluice_replication_full_syncs_total{shard="0"}"#),
            1.0
        );
    })
    .await
    .unwrap();
    // Its primary gone, the follower is alive but not ready.
    primary.kill9();
    tokio::task::spawn_blocking(move || {
        let body = wait_for(f, "/ready", 503);
        assert!(body.starts_with("not ready: follower"), "{body}");
        assert_eq!(get(f, "/health").0, 200);
        assert_eq!(get(f, "/nothing").0, 404);
    })
    .await
    .unwrap();
}

/// Reads from `s` until the server closes it (EOF or reset), up to
/// `limit`; how long that took, or `None` when it stayed open.
async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Idle admin connections cannot take the process's descriptors: past
/// --admin-connections-max a new one is closed at once (and counted), the
/// binary port still answers, and the idle ones are closed after
/// --admin-timeout-ms, after which the port serves again. Fails while the
/// admin port has no cap (the extra connections stay open).
#[tokio::test]
async fn admin_connections_past_the_cap_are_closed_at_once() {
    let server = Sluiced::start(&[
        "--shards",
        "1",
        "--admin-port",
        "0",
        "--admin-connections-max",
        "4",
        "--admin-timeout-ms",
        "4000",
    ]);
    let admin = server.admin_addr.unwrap();
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(tokio::net::TcpStream::connect(admin).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..6 {
        let mut extra = tokio::net::TcpStream::connect(admin).await.unwrap();
        let closed = closed_within(&mut extra, Duration::from_millis(1500)).await;
        assert!(closed.is_some(), "a connection past the cap stayed open");
    }
    let mut raw = sluice_tests::raw::Raw::connect(server.addr).await;
    raw.send_frame(&[(7, sluice_protocol::message::Request::Ping)])
        .await;
    let (id, reply) = raw.next_reply().await.unwrap();
    assert_eq!((id, reply), (7, sluice_protocol::message::Reply::Pong));
    for s in &mut idle {
        let closed = closed_within(s, Duration::from_secs(10)).await;
        assert!(closed.is_some(), "an idle admin connection stayed open");
    }
    let (code, scrape) = tokio::task::spawn_blocking(move || get(admin, "/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(sample(&scrape, "sluice_admin_connections_refused_total") >= 6.0);
}

/// A request left half-sent, or trickled in a byte at a time, is closed
/// after --admin-timeout-ms (bytes that arrive do not renew it), and a
/// polite request on a kept-alive connection is answered. Fails while the
/// admin port has no timeout of its own.
#[tokio::test]
async fn a_half_sent_admin_request_is_closed_after_the_timeout() {
    use tokio::io::AsyncWriteExt;
    let server = Sluiced::start(&["--admin-port", "0", "--admin-timeout-ms", "1000"]);
    let admin = server.admin_addr.unwrap();
    let mut half = tokio::net::TcpStream::connect(admin).await.unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: sluice\r\n")
        .await
        .unwrap();
    let took = closed_within(&mut half, Duration::from_secs(4)).await;
    let took = took.expect("a half-sent request stayed open");
    assert!(took >= Duration::from_millis(800), "closed after {took:?}");
    let mut slow = tokio::net::TcpStream::connect(admin).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: sluice\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let mut closed = false;
    while start.elapsed() < Duration::from_secs(4) {
        if slow.write_all(b"X").await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let closed = closed
        || closed_within(&mut slow, Duration::from_millis(100))
            .await
            .is_some();
    assert!(closed, "a trickled request stayed open");
    let (code, body) = tokio::task::spawn_blocking(move || get(admin, "/health"))
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (200, "ok\n"));
}
