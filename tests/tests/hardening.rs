//! Clients that misbehave on purpose, against real `sluiced` processes:
//! request id 0, a large frame before authentication, connections that
//! never authenticate, frames left half-sent, idle connections, and a
//! second SIGTERM during a drain. Each limit is tested on both sides of its
//! edge: the well-behaved client next to the rude one keeps being served.

use std::time::{Duration, Instant};

use sluice_protocol::message::{Reply, Request};
use sluice_protocol::{Policy, Status};
use sluice_tests::raw::{frame, hello, Raw};
use sluice_tests::support::Sluiced;

fn throttle(key: &str) -> Request<'_> {
    Request::Throttle(sluice_protocol::message::Throttle {
        key: key.as_bytes(),
        policy: Policy::new(10, 1_000_000_000, 20).unwrap(),
        cost: 1,
    })
}

/// Waits (up to 20 s) until the server closes `raw`; panics if it answers.
async fn closed_within(raw: &mut Raw, limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if raw.closed_by_server().await {
            return;
        }
    }
    panic!("still open after {limit:?}");
}

#[tokio::test]
async fn request_id_0_is_refused_with_id_0_and_the_connection_ends() {
    let server = Sluiced::start(&["--shards", "1"]);
    let mut raw = Raw::connect(server.addr).await;
    raw.send_frame(&[(1, Request::Ping), (0, Request::Ping), (2, Request::Ping)])
        .await;
    assert_eq!(raw.next_reply().await, Some((1, Reply::Pong)));
    let (id, reply) = raw.next_reply().await.unwrap();
    assert_eq!((id, reply.status()), (0, Some(Status::BadRequest)));
    assert!(
        raw.closed_by_server().await,
        "the request after it was served"
    );
    let mut other = Raw::connect(server.addr).await;
    other.send_frame(&[(7, Request::Ping)]).await;
    assert_eq!(other.next_reply().await, Some((7, Reply::Pong)));
}

#[tokio::test]
async fn before_authentication_a_frame_is_at_most_1_kib() {
    let server = Sluiced::start(&["--shards", "1", "--auth-token", "s3cret"]);
    // 1,025 bytes declared: refused before any of it is read.
    let mut raw = Raw::connect(server.addr).await;
    raw.send_bytes(&1025u32.to_le_bytes()).await;
    let (id, reply) = raw.next_reply().await.unwrap();
    assert_eq!((id, reply.status()), (0, Some(Status::FrameTooLarge)));
    assert!(raw.closed_by_server().await);
    // A HELLO with the longest token fits; once authenticated, frames may
    // be as large as --frame-bytes-max (here 200 requests, about 10 KiB).
    let token = [b'a'; 256];
    let long = Sluiced::start(&[
        "--shards",
        "1",
        "--auth-token",
        std::str::from_utf8(&token).unwrap(),
    ]);
    let mut raw = Raw::connect(long.addr).await;
    raw.send_frame(&[(1, hello(&[b'a'; 256]))]).await;
    assert!(matches!(
        raw.next_reply().await,
        Some((1, Reply::HelloOk(_)))
    ));
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let batch: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (i as u32 + 2, throttle(k)))
        .collect();
    assert!(frame(&batch).len() > 8 * 1024);
    raw.send_frame(&batch).await;
    for (id, reply) in raw.replies(200).await {
        assert!(matches!(reply, Reply::Throttle(_)), "{id}: {reply:?}");
    }
}

#[tokio::test]
async fn a_connection_that_never_authenticates_is_closed_and_one_that_does_stays() {
    let server = Sluiced::start(&[
        "--shards",
        "1",
        "--auth-token",
        "s3cret",
        "--auth-timeout-ms",
        "300",
    ]);
    let mut silent = Raw::connect(server.addr).await;
    let mut authed = Raw::connect(server.addr).await;
    authed.send_frame(&[(1, hello(b"s3cret"))]).await;
    assert!(matches!(
        authed.next_reply().await,
        Some((1, Reply::HelloOk(_)))
    ));
    closed_within(&mut silent, Duration::from_secs(20)).await;
    // Long past the timeout, the authenticated one is still served.
    authed.send_frame(&[(2, Request::Ping)]).await;
    assert_eq!(authed.next_reply().await, Some((2, Reply::Pong)));
}

#[tokio::test]
async fn a_frame_left_half_sent_closes_the_connection() {
    let server = Sluiced::start(&["--shards", "1", "--frame-timeout-ms", "300"]);
    let mut half = Raw::connect(server.addr).await;
    let whole = frame(&[(1, Request::Ping)]);
    half.send_bytes(&whole[..5]).await;
    let mut idle = Raw::connect(server.addr).await;
    idle.send_frame(&[(1, Request::Ping)]).await;
    assert_eq!(idle.next_reply().await, Some((1, Reply::Pong)));
    closed_within(&mut half, Duration::from_secs(20)).await;
    // A connection with nothing half-sent is not closed (no idle timeout
    // by default).
    idle.send_frame(&[(2, Request::Ping)]).await;
    assert_eq!(idle.next_reply().await, Some((2, Reply::Pong)));
    // The rest of a frame sent in time is served: split in two writes.
    let mut slow = Raw::connect(server.addr).await;
    slow.send_bytes(&whole[..5]).await;
    slow.send_bytes(&whole[5..]).await;
    assert_eq!(slow.next_reply().await, Some((1, Reply::Pong)));
}

#[tokio::test]
async fn with_an_idle_timeout_a_silent_connection_is_closed() {
    let server = Sluiced::start(&["--shards", "1", "--idle-timeout-ms", "300"]);
    let mut raw = Raw::connect(server.addr).await;
    raw.send_frame(&[(1, Request::Ping)]).await;
    assert_eq!(raw.next_reply().await, Some((1, Reply::Pong)));
    closed_within(&mut raw, Duration::from_secs(20)).await;
}

/// A second SIGTERM does not wait for the drain: exit status 1. The first
/// alone would have waited up to --drain-ms (here a minute) for a client
/// that sends and never reads: one frame of 2,000 STATS to a node of 64
/// shards is owed 7 MiB of replies, more than a socket's largest send
/// buffer (4 MiB here) and the client's 1 KiB receive buffer hold.
#[tokio::test]
async fn a_second_sigterm_cuts_the_drain_short() {
    let mut server =
        Sluiced::start(&["--shards", "64", "--drain-ms", "60000", "--admin-port", "0"]);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(1024).unwrap();
    let stream = socket.connect(server.addr).await.unwrap();
    let stats: Vec<_> = (1..=2_000u32)
        .map(|i| {
            (
                i,
                Request::Stats(sluice_protocol::message::Stats { shard_first: 0 }),
            )
        })
        .collect();
    let bytes = frame(&stats);
    let rude = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (_never_read, mut w) = stream.into_split();
        for _ in 0..100 {
            if w.write_all(&bytes).await.is_err() {
                break;
            }
        }
        // Blocked long before this: the server stopped reading.
        std::future::pending::<()>().await;
    });
    // Once the node has read one frame, it owes more than the buffers hold.
    let admin = server.admin_addr.unwrap();
    let start = Instant::now();
    loop {
        let scrape = tokio::task::spawn_blocking(move || http_get(admin, "/metrics"))
            .await
            .unwrap();
        let read: f64 = scrape
            .lines()
            .filter_map(|l| l.strip_prefix("sluice_received_bytes_total{"))
            .filter_map(|l| l.split_once("} ").and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum::<f64>();
        if read >= 16_000.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the requests never came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.signal("TERM");
    // The first was taken once the port refuses: the node is draining.
    let start = Instant::now();
    while tokio::net::TcpStream::connect(server.addr).await.is_ok() {
        assert!(start.elapsed() < Duration::from_secs(20), "still accepting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(server.is_running(), "the drain did not wait for the client");
    server.signal("TERM");
    let status = tokio::task::spawn_blocking(move || server.wait_for_exit(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
    rude.abort();
}

/// At the connection limit, clients without the token crowd out only each
/// other: a client with it takes the place of the oldest unauthenticated
/// connection, and authenticated connections are never replaced.
#[tokio::test]
async fn connections_that_never_authenticate_cannot_lock_out_a_client_with_the_token() {
    let server = Sluiced::start(&[
        "--shards",
        "1",
        "--auth-token",
        "s3cret",
        "--connections-max",
        "4",
        "--auth-timeout-ms",
        "600000",
    ]);
    let mut squatters = Vec::new();
    for _ in 0..4 {
        squatters.push(Raw::connect(server.addr).await);
    }
    let config = sluice_client::ClientConfig {
        auth_token: Some("s3cret".into()),
        deadline: Duration::from_secs(10),
        ..Default::default()
    };
    let mut clients = Vec::new();
    for (i, squatter) in squatters.iter_mut().enumerate() {
        let client = sluice_client::Client::connect_with(server.addr, config.clone())
            .await
            .unwrap_or_else(|e| panic!("client {i} with the token locked out: {e}"));
        client.ping().await.expect("served");
        clients.push(client);
        // The oldest squatter made room.
        closed_within(squatter, Duration::from_secs(20)).await;
    }
    // Four authenticated connections: the limit holds for the next one.
    let err = sluice_client::Client::connect_with(server.addr, config)
        .await
        .expect_err("a fifth connection");
    assert_eq!(err.status(), Some(Status::TooManyConnections), "{err}");
    for c in &clients {
        c.ping().await.expect("still served");
    }
}

/// The body of `GET path` over HTTP/1.0.
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("the admin port answers");
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

/// The process's resident memory, in bytes (Linux).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("procfs");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// A connection that sent one large frame does not keep a buffer of that
/// size once it is idle: 64 connections, each after a 1 MiB frame, hold
/// much less than 64 MiB between them. (Without giving buffers back, they
/// held at least that: each read buffer had grown to the frame.)
#[tokio::test]
async fn idle_connections_give_back_the_buffer_a_large_frame_needed() {
    let server = Sluiced::start(&["--shards", "2"]);
    // 15 messages of an unknown op with 64 KiB payloads: one frame just
    // under the 1 MiB limit, 15 small UNKNOWN_OP replies.
    let mut frame = Vec::new();
    let body_len = 15 * (8 + 65_535);
    frame.extend_from_slice(&(body_len as u32).to_le_bytes());
    for i in 0..15u32 {
        frame.push(0x7e);
        frame.push(0);
        frame.extend_from_slice(&65_535u16.to_le_bytes());
        frame.extend_from_slice(&(i + 1).to_le_bytes());
        frame.extend(std::iter::repeat_n(0u8, 65_535));
    }
    let mut warm = Raw::connect(server.addr).await;
    warm.send_bytes(&frame).await;
    assert_eq!(warm.replies(15).await.len(), 15);
    let before = rss_bytes(server.pid());
    let mut idle = Vec::new();
    for _ in 0..64 {
        let mut raw = Raw::connect(server.addr).await;
        raw.send_bytes(&frame).await;
        let replies = raw.replies(15).await;
        assert!(replies
            .iter()
            .all(|(_, r)| r.status() == Some(Status::UnknownOp)));
        idle.push(raw);
    }
    let grown = rss_bytes(server.pid()).saturating_sub(before);
    eprintln!(
        "attack: 64 idle connections after a 1 MiB frame each: server +{} KiB",
        grown >> 10
    );
    assert!(
        grown < 24 << 20,
        "64 idle connections grew the server by {} MiB",
        grown >> 20
    );
    // And they are still served.
    for (i, raw) in idle.iter_mut().enumerate() {
        raw.send_frame(&[(1, Request::Ping)]).await;
        assert_eq!(raw.next_reply().await, Some((1, Reply::Pong)), "{i}");
    }
}

/// docs/SECURITY.md's worst case for one authenticated connection, in
/// bytes, at the default limits (frame 1 MiB, replies 1 MiB, batch 4,096,
/// in flight 8,192): the read buffer (a frame and a read chunk), the
/// replies owed (the bound, one reply past it, a REPLY_BUFFER_FULL for
/// each request of the frame), the pipeline's slots and a frame's
/// forwards and key hashes.
fn worst_case_connection_bytes() -> u64 {
    let (frame, replies, batch, inflight) = (1u64 << 20, 1u64 << 20, 4_096u64, 8_192u64);
    let read = frame + (16 << 10);
    let owed = replies + (64 << 10) + batch * 128;
    let pipeline = (inflight + batch) * 88 + batch * (80 + 16);
    read + owed + pipeline
}

/// The most `server` grows past `before` (RSS) over 0.8 s while it works
/// through what `connections` rude clients sent stays under the worst case
/// for that many connections; prints it as an `attack:` figure.
async fn assert_peak_within_worst_case(
    server: &Sluiced,
    before: u64,
    connections: u64,
    what: &str,
) {
    let mut peak = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(800) {
        peak = peak.max(rss_bytes(server.pid()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let grown = peak.saturating_sub(before);
    let bound = connections * worst_case_connection_bytes();
    eprintln!(
        "attack: {what}: server +{} KiB (worst case {} KiB)",
        grown >> 10,
        bound >> 10
    );
    assert!(
        grown < bound,
        "{what}: the server grew by {} MiB, over the worst case of {} MiB",
        grown >> 20,
        bound >> 20
    );
}

/// `n` STATS requests with ids `first..`, one frame.
fn stats_frame(first: u32, n: u32) -> Vec<u8> {
    let requests: Vec<(u32, Request<'_>)> = (first..first + n)
        .map(|id| {
            (
                id,
                Request::Stats(sluice_protocol::message::Stats { shard_first: 0 }),
            )
        })
        .collect();
    frame(&requests)
}

/// A frame whose replies outgrow `--reply-bytes-max` (STATS at 64 shards:
/// about 3.6 KiB each) gets its replies up to the bound and
/// REPLY_BUFFER_FULL for the rest, in order; the connection stays usable.
#[tokio::test]
async fn replies_past_the_reply_bound_in_one_frame_are_refused_in_order() {
    let server = Sluiced::start(&["--shards", "64", "--reply-bytes-max", "65536"]);
    let mut raw = Raw::connect(server.addr).await;
    raw.send_bytes(&stats_frame(1, 100)).await;
    let replies = raw.replies(100).await;
    let ids: Vec<u32> = replies.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (1..=100).collect::<Vec<_>>(), "every id, in order");
    let ok = replies
        .iter()
        .take_while(|(_, r)| matches!(r, Reply::Stats(_)))
        .count();
    let reply_bytes = 8 + 8 + 64 * sluice_protocol::message::STATS_RECORD_BYTES;
    // Replies are decided until the bound is reached: the last one may
    // cross it.
    assert_eq!(
        ok,
        65_536usize.div_ceil(reply_bytes),
        "STATS_OK before the bound"
    );
    for (id, r) in &replies[ok..] {
        assert_eq!(
            r.status(),
            Some(Status::ReplyBufferFull),
            "request {id}: {r:?}"
        );
    }
    // Once those are read, the connection is served as before.
    raw.send_bytes(&stats_frame(101, 5)).await;
    let again = raw.replies(5).await;
    assert!(
        again.iter().all(|(_, r)| matches!(r, Reply::Stats(_))),
        "{again:?}"
    );
    // The edge of the setting: 1 KiB is the least accepted.
    assert_setting_edges("--reply-bytes-max", &["1023"], "1024").await;
}

/// `flag` set to any of `refused` stops sluiced at start with an error
/// naming it; set to `least` it serves.
async fn assert_setting_edges(flag: &str, refused: &[&str], least: &str) {
    for bad in refused {
        let out = std::process::Command::new(sluice_tests::support::binary("sluiced"))
            .args([flag, bad, "--port", "0"])
            .output()
            .expect("sluiced runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(flag.trim_start_matches('-')),
            "{flag} {bad}: {out:?}"
        );
    }
    let server = Sluiced::start(&["--shards", "1", flag, least]);
    let mut raw = Raw::connect(server.addr).await;
    raw.send_frame(&[(1, Request::Ping)]).await;
    assert_eq!(raw.next_reply().await, Some((1, Reply::Pong)));
}

/// Clients that send and never read cannot grow the server past the
/// reply bound: ten connections each send frames of 4,000 STATS at 64
/// shards (14 MiB of replies a frame; without the bound the server
/// buffered all of a frame's, 140 MiB for the ten) and read nothing. The server owes each at
/// most `--reply-bytes-max` (1 MiB), stops decoding their requests, and
/// closes them once a write stays blocked for `--reply-timeout-ms`; a
/// client that reads is served throughout.
#[tokio::test]
async fn clients_that_never_read_are_held_to_the_reply_bound_and_closed() {
    let server = Sluiced::start(&["--shards", "64", "--reply-timeout-ms", "1000"]);
    let mut reader = Raw::connect(server.addr).await;
    reader.send_frame(&[(1, throttle("warm"))]).await;
    assert!(reader.next_reply().await.is_some());
    let before = rss_bytes(server.pid());
    let mut rude = Vec::new();
    for _ in 0..10 {
        rude.push(Raw::connect(server.addr).await);
    }
    let frames: Vec<Vec<u8>> = (0..10u32)
        .map(|f| stats_frame(1 + f * 4_000, 4_000))
        .collect();
    let sent = send_until_blocked(&mut rude, &frames).await;
    let what = format!("10 clients that never read, {sent} frames of 4,000 STATS sent");
    assert_peak_within_worst_case(&server, before, 10, &what).await;
    // The reader is still served.
    reader.send_frame(&[(2, Request::Ping)]).await;
    assert_eq!(reader.next_reply().await, Some((2, Reply::Pong)));
    // Each rude connection was closed: reading now gets what the kernel
    // buffered, far fewer replies than requests, then the end.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for (i, raw) in rude.iter_mut().enumerate() {
        let mut got = 0;
        let start = Instant::now();
        while let Some((_, reply)) = raw.next_reply().await {
            assert!(
                matches!(reply, Reply::Stats(_)) || reply.status() == Some(Status::ReplyBufferFull),
                "{reply:?}"
            );
            got += 1;
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "connection {i} still open"
            );
        }
        assert!(
            got < 40_000,
            "connection {i} was answered in full ({got} replies)"
        );
    }
}

/// Sends `frames` on each connection in turn, as far as it goes: a write
/// that stays blocked for 300 ms (the server stopped reading) moves on to
/// the next connection. Returns how many frames went out in all.
async fn send_until_blocked(conns: &mut [Raw], frames: &[Vec<u8>]) -> usize {
    use tokio::io::AsyncWriteExt;
    let mut sent = 0;
    for raw in conns.iter_mut() {
        for f in frames {
            match tokio::time::timeout(Duration::from_millis(300), raw.stream.write_all(f)).await {
                Ok(Ok(())) => sent += 1,
                _ => break,
            }
        }
    }
    sent
}

/// The same over RESP, where INFO's reply is about 50 times its request:
/// ten connections pipeline INFO behind a large command (which grows the
/// read buffer, so one read brings many INFOs) and never read (with the
/// bound off, 10 of them grew the server by 84 MiB). Each is owed at most
/// `--reply-bytes-max`, and closed once a write stays blocked.
#[tokio::test]
async fn resp_clients_that_never_read_are_held_to_the_reply_bound() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Sluiced::start(&[
        "--shards",
        "2",
        "--resp-port",
        "0",
        "--reply-timeout-ms",
        "1000",
    ]);
    let resp = server.resp_addr.expect("a RESP listener");
    let before = rss_bytes(server.pid());
    // A large command first (an unknown one with a 900 kB argument), so
    // that the read buffer grows and one read can bring many INFOs.
    let mut large = b"*2\r\n$4\r\nECHX\r\n$900000\r\n".to_vec();
    large.extend(std::iter::repeat_n(b'x', 900_000));
    large.extend_from_slice(b"\r\n");
    let chunk = "INFO\r\n".repeat(10_000).into_bytes();
    let mut rude = Vec::new();
    let mut sent = 0usize;
    for _ in 0..10 {
        let mut s = tokio::net::TcpStream::connect(resp).await.unwrap();
        s.write_all(&large).await.unwrap();
        // Up to 200,000 INFOs each, as far as the server reads them.
        for _ in 0..20 {
            match tokio::time::timeout(Duration::from_millis(300), s.write_all(&chunk)).await {
                Ok(Ok(())) => sent += 1,
                _ => break,
            }
        }
        rude.push(s);
    }
    let what = format!("10 RESP clients that never read, {sent} chunks of 10,000 INFO sent");
    assert_peak_within_worst_case(&server, before, 10, &what).await;
    // Each is closed once its write has stayed blocked for a second:
    // reading then gets what the kernel holds, and the end.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for (i, s) in rude.iter_mut().enumerate() {
        let mut buf = vec![0u8; 1 << 16];
        let end = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(end.is_ok(), "RESP connection {i} still open");
    }
}

/// No half-dead node: a shard that panics (here, deciding a batch another
/// shard forwarded, by a failpoint of debug builds) takes the process down
/// with it, so the connection that forwarded the batch sees its socket
/// close at once instead of waiting forever for the answer.
#[tokio::test]
async fn a_panicking_shard_ends_the_process_instead_of_leaving_requests_waiting() {
    use std::os::unix::process::ExitStatusExt;
    let server = Sluiced::start_with(
        0,
        &[("SLUICE_FAILPOINT", "shard-panic-forwarded")],
        &["--shards", "2"],
    );
    let mut raw = Raw::connect(server.addr).await;
    // Twenty keys: some are the other shard's, forwarded to it.
    let keys: Vec<String> = (0..20).map(|i| format!("panic:{i}")).collect();
    let requests: Vec<(u32, Request<'_>)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (i as u32 + 1, throttle(k)))
        .collect();
    raw.send_frame(&requests).await;
    let start = Instant::now();
    let mut answered = 0;
    while raw.next_reply().await.is_some() {
        answered += 1;
    }
    assert!(answered < 20, "every request was answered");
    assert!(start.elapsed() < Duration::from_secs(10));
    let status = server.wait_for_exit(Duration::from_secs(10));
    assert_eq!(status.signal(), Some(6), "aborted (SIGABRT): {status:?}");
}

/// `--reply-bytes-node-max` bounds what clients that never read make the
/// node hold together, where `--reply-bytes-max` bounds each: on one shard
/// with a 512 KiB node bound, three rude connections (a frame of 4,000
/// STATS each, 288 kB of replies that their full socket buffers leave
/// owed) fill the shard's part, never more than one connection's bound past it
/// (`sluice_reply_bytes_owed`), and a polite client's PING then waits, not
/// decoded, until the rude ones are gone; it is answered once they are.
/// Under the default bound (256 MiB) the same PING, sent when the rude ones
/// owe as much, is answered at once: the wait is the bound's doing.
#[tokio::test]
async fn clients_that_never_read_hold_at_most_the_node_reply_bound_together() {
    use sluice_tests::support::{http_get, metric_sample};
    const SHARE: f64 = 524_288.0;
    for node_max in [Some("524288"), None] {
        let mut args = vec![
            "--shards",
            "1",
            "--reply-timeout-ms",
            "60000",
            "--admin-port",
            "0",
        ];
        if let Some(max) = node_max {
            args.extend(["--reply-bytes-node-max", max]);
        }
        let server = Sluiced::start(&args);
        let admin = server.admin_addr.expect("an admin port");
        let mut polite = Raw::connect(server.addr).await;
        polite.send_frame(&[(1, Request::Ping)]).await;
        assert_eq!(polite.next_reply().await, Some((1, Reply::Pong)));
        let mut rude = Vec::new();
        for _ in 0..3 {
            rude.push(Raw::connect(server.addr).await);
        }
        // Far more replies than loopback's socket buffers take (here about
        // 36 MB a connection): 250 frames of 4,000 STATS, 72 MB of replies
        // each at one shard.
        let frames: Vec<Vec<u8>> = (0..250u32)
            .map(|f| stats_frame(1 + f * 4_000, 4_000))
            .collect();
        send_until_blocked(&mut rude, &frames).await;
        // Until the shard owes the rude ones the node bound (published at
        // least once a second), and never much more.
        let (mut owed, start) = (0.0, Instant::now());
        while owed < SHARE {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the rude clients never came to owe 512 KiB ({owed} bytes)"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            owed = metric_sample(
                &http_get(admin, "/metrics").1,
                "sluice_reply_bytes_owed{shard=\"0\"}",
            );
        }
        if node_max.is_some() {
            // One frame's replies past the share at most: one connection's
            // bound (1 MiB, a 64 KiB reply across it, and REPLY_BUFFER_FULL
            // for the rest of a 4,096-request frame).
            let most = SHARE + 1_048_576.0 + 65_536.0 + 4_096.0 * 128.0;
            assert!(owed <= most, "the shard owes {owed} bytes, over {most}");
            println!(
                "attack: 3 clients that never read, node bound 512 KiB on one shard: the shard owes {:.0} KiB, a polite PING waits until they are gone",
                owed / 1024.0
            );
        }
        polite.send_frame(&[(2, Request::Ping)]).await;
        let answered =
            tokio::time::timeout(Duration::from_millis(1_000), polite.next_reply()).await;
        match node_max {
            Some(max) => {
                assert!(
                    answered.is_err(),
                    "at the node bound ({max}) the PING was answered: {answered:?}"
                );
                drop(rude);
                let after = tokio::time::timeout(Duration::from_secs(10), polite.next_reply())
                    .await
                    .expect("the PING is answered once the rude clients are gone");
                assert_eq!(after, Some((2, Reply::Pong)));
            }
            None => assert_eq!(
                answered.expect("answered at once under the default bound"),
                Some((2, Reply::Pong))
            ),
        }
    }
    // The edges of the setting: 1 KiB is the least accepted, 1 TiB the most.
    assert_setting_edges("--reply-bytes-node-max", &["1023", "1099511627777"], "1024").await;
}
