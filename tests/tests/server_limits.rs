//! Every limit at its edge, bad input, and shutdown, against real `sluiced`
//! processes: a bad connection is answered and closed and nobody else
//! notices; the server never crashes.

use std::time::Duration;

use sluice_client::{Action, Client, ClientConfig, Error};
use sluice_protocol::message::{Hello, Reply, Request, Throttle};
use sluice_protocol::{Policy, Status};
use sluice_tests::raw::{frame, hello, Raw};
use sluice_tests::support::Sluiced;

fn policy() -> Policy {
    Policy::new(100, 1_000_000_000, 100).unwrap()
}

fn throttle(key: &str) -> Request<'_> {
    Request::Throttle(Throttle {
        key: key.as_bytes(),
        policy: policy(),
        cost: 1,
    })
}

async fn assert_serves(raw: &mut Raw, id: u32) {
    raw.send_frame(&[(id, throttle("healthy"))]).await;
    let (rid, reply) = raw.next_reply().await.expect("still connected");
    assert_eq!(rid, id);
    assert!(
        matches!(reply, Reply::Throttle(v) if v.allowed),
        "{reply:?}"
    );
}

#[tokio::test]
async fn malformed_frame_closes_only_that_connection() {
    let server = Sluiced::start(&["--shards", "2"]);
    let mut good = Raw::connect(server.addr).await;
    let mut bad = Raw::connect(server.addr).await;
    assert_serves(&mut good, 1).await;
    // A well-formed request, then a frame whose message overruns its body.
    bad.send_frame(&[(5, Request::Ping)]).await;
    bad.send_bytes(&[8, 0, 0, 0, 0x02, 0, 9, 0, 6, 0, 0, 0])
        .await;
    assert_eq!(
        bad.next_reply().await,
        Some((5, Reply::Pong)),
        "replies before the bad frame still arrive"
    );
    let (id, reply) = bad.next_reply().await.expect("an error before the close");
    assert_eq!((id, reply.status()), (0, Some(Status::Malformed)));
    assert!(bad.closed_by_server().await);
    assert_serves(&mut good, 2).await;
}

#[tokio::test]
async fn bad_requests_are_answered_and_the_connection_continues() {
    let server = Sluiced::start(&[]);
    let mut raw = Raw::connect(server.addr).await;
    // Unknown op 0x42 with a 3-byte payload, then a THROTTLE with a zero
    // rate, then an empty key, then a good request.
    let mut bytes = vec![11 + 8, 0, 0, 0, 0x42, 0, 3, 0, 1, 0, 0, 0, 1, 2, 3];
    bytes.extend_from_slice(&[0x02, 0, 0, 0, 2, 0, 0, 0]);
    bytes[0] = (bytes.len() - 4) as u8;
    raw.send_bytes(&bytes).await;
    let zero = Policy {
        count: 0,
        ..policy()
    };
    raw.send_frame(&[
        (
            3,
            Request::Throttle(Throttle {
                key: b"k",
                policy: zero,
                cost: 1,
            }),
        ),
        (
            4,
            Request::Throttle(Throttle {
                key: b"",
                policy: policy(),
                cost: 1,
            }),
        ),
    ])
    .await;
    let replies = raw.replies(4).await;
    assert_eq!(
        (replies[0].0, replies[0].1.status()),
        (1, Some(Status::UnknownOp))
    );
    assert_eq!(replies[1], (2, Reply::Pong));
    assert_eq!(
        (replies[2].0, replies[2].1.status()),
        (3, Some(Status::InvalidPolicy))
    );
    assert_eq!(
        (replies[3].0, replies[3].1.status()),
        (4, Some(Status::BadKey))
    );
    assert_serves(&mut raw, 5).await;
}

#[tokio::test]
async fn frame_size_limit_at_its_edge() {
    let server = Sluiced::start(&["--frame-bytes-max", "1024"]);
    // A frame of exactly 1024 body bytes: two THROTTLEs (8-byte header and
    // 34 fixed payload bytes each) with keys sized to fill it.
    let (k1, k2) = ("k".repeat(500), "j".repeat(1024 - 2 * (8 + 34) - 500));
    let exact = frame(&[(1, throttle(&k1)), (3, throttle(&k2))]);
    assert_eq!(exact.len(), 4 + 1024);
    let mut raw = Raw::connect(server.addr).await;
    raw.send_bytes(&exact).await;
    assert!(matches!(
        raw.next_reply().await,
        Some((1, Reply::Throttle(_)))
    ));
    assert!(matches!(
        raw.next_reply().await,
        Some((3, Reply::Throttle(_)))
    ));
    // One byte more is refused before it is read, and the connection ends.
    let mut over = Raw::connect(server.addr).await;
    over.send_bytes(&1025u32.to_le_bytes()).await;
    let (id, reply) = over.next_reply().await.expect("an error before the close");
    assert_eq!((id, reply.status()), (0, Some(Status::FrameTooLarge)));
    assert!(over.closed_by_server().await);
    assert_serves(&mut raw, 2).await;
}

#[tokio::test]
async fn batch_limit_at_its_edge() {
    let server = Sluiced::start(&["--batch-max", "4", "--inflight-max", "4"]);
    let mut raw = Raw::connect(server.addr).await;
    let four: Vec<_> = (1..=4).map(|i| (i, Request::Ping)).collect();
    raw.send_frame(&four).await;
    assert!(raw.replies(4).await.iter().all(|(_, r)| *r == Reply::Pong));
    let five: Vec<_> = (11..=15).map(|i| (i, Request::Ping)).collect();
    raw.send_frame(&five).await;
    let replies = raw.replies(5).await;
    for (i, (id, r)) in replies.iter().enumerate() {
        assert_eq!(
            (*id, r.status()),
            (11 + i as u32, Some(Status::BatchTooLarge))
        );
    }
    // In-flight 4: 200 pipelined frames of 4 are all answered (back-pressure,
    // not errors).
    let mut bytes = Vec::new();
    for f in 0..200u32 {
        let reqs: Vec<_> = (0..4)
            .map(|r| (100 + f * 4 + r, throttle("inflight")))
            .collect();
        bytes.extend(frame(&reqs));
    }
    raw.send_bytes(&bytes).await;
    let replies = raw.replies(800).await;
    for (i, (id, r)) in replies.iter().enumerate() {
        assert_eq!(*id, 100 + i as u32);
        assert!(matches!(r, Reply::Throttle(_)), "{r:?}");
    }
}

#[tokio::test]
async fn connection_limit_at_its_edge() {
    let server = Sluiced::start(&["--connections-max", "2"]);
    let mut first = Raw::connect(server.addr).await;
    let mut second = Raw::connect(server.addr).await;
    assert_serves(&mut first, 1).await;
    assert_serves(&mut second, 1).await;
    let mut third = Raw::connect(server.addr).await;
    let (id, reply) = third.next_reply().await.expect("told why");
    assert_eq!((id, reply.status()), (0, Some(Status::TooManyConnections)));
    assert!(third.closed_by_server().await);
    drop(first);
    // The slot frees once the server sees the close; retry briefly.
    let mut served = false;
    for attempt in 0..100 {
        let mut again = Raw::connect(server.addr).await;
        again.send_frame(&[(9, Request::Ping)]).await;
        match again.next_reply().await {
            Some((9, Reply::Pong)) => {
                served = true;
                break;
            }
            Some((0, r)) if r.status() == Some(Status::TooManyConnections) => {
                tokio::time::sleep(Duration::from_millis(10 * attempt)).await;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(served, "a freed slot is reused");
    assert_serves(&mut second, 2).await;
}

#[tokio::test]
async fn clients_that_vanish_mid_frame_do_not_hurt_the_server() {
    let mut server = Sluiced::start(&["--shards", "2"]);
    let mut good = Raw::connect(server.addr).await;
    let whole = frame(&[(1, throttle("half")), (2, throttle("half"))]);
    for cut in [1, 3, 4, 9, whole.len() / 2, whole.len() - 1] {
        let mut quitter = Raw::connect(server.addr).await;
        quitter.send_bytes(&whole[..cut]).await;
        drop(quitter);
    }
    // A client that disconnects with requests in flight.
    let mut rude = Raw::connect(server.addr).await;
    let many: Vec<_> = (0..1_000).map(|i| (i, throttle("rude"))).collect();
    rude.send_frame(&many).await;
    drop(rude);
    assert_serves(&mut good, 7).await;
    assert!(server.is_running());
}

#[tokio::test]
async fn auth_token_is_required_and_checked() {
    let server = Sluiced::start(&["--shards", "2", "--auth-token", "s3cret"]);
    // Before HELLO, anything else is told AUTH_REQUIRED and the connection
    // is over: nothing after it in the frame is answered.
    let mut raw = Raw::connect(server.addr).await;
    raw.send_frame(&[(1, Request::Ping), (2, throttle("k"))])
        .await;
    assert_eq!(
        raw.next_reply().await.unwrap().1.status(),
        Some(Status::AuthRequired)
    );
    assert!(raw.closed_by_server().await);
    let mut raw = Raw::connect(server.addr).await;
    raw.send_frame(&[(3, hello(b"s3cret")), (4, Request::Ping)])
        .await;
    let replies = raw.replies(2).await;
    assert!(matches!(replies[0], (3, Reply::HelloOk(_))));
    assert_eq!(replies[1], (4, Reply::Pong));

    // A HELLO with the right token whose shard binding is refused does not
    // authenticate: a shard that does not exist, or a binding to another
    // shard that is not alone in its frame (tried until a connection lands
    // on a shard other than 1).
    let bind = |shard| {
        Request::Hello(Hello {
            version_min: 1,
            version_max: 1,
            shard: Some(shard),
            token: b"s3cret",
            epoch: 0,
            layout: 0,
        })
    };
    let mut refused = 0;
    for (attempt, shard) in [99, 1, 1, 1, 1, 1, 1, 1, 1].into_iter().enumerate() {
        let mut raw = Raw::connect(server.addr).await;
        raw.send_frame(&[(1, bind(shard)), (2, Request::Ping)])
            .await;
        let first = raw.next_reply().await.unwrap();
        if matches!(first.1, Reply::HelloOk(_)) {
            assert!(attempt > 0, "shard 99 bound");
            continue;
        }
        assert_eq!(first.1.status(), Some(Status::BadRequest), "{shard}");
        let second = raw.next_reply().await.unwrap();
        assert_eq!(second.1.status(), Some(Status::AuthRequired), "{shard}");
        assert!(raw.closed_by_server().await);
        refused += 1;
        if refused == 2 {
            break;
        }
    }
    assert_eq!(refused, 2, "no connection landed on shard 0");

    // A wrong token: nothing after it in the frame is served, and it closes.
    let mut wrong = Raw::connect(server.addr).await;
    wrong
        .send_frame(&[(1, hello(b"guess")), (2, Request::Ping)])
        .await;
    assert_eq!(
        wrong.next_reply().await.unwrap().1.status(),
        Some(Status::AuthFailed)
    );
    assert!(wrong.closed_by_server().await);

    let err = Client::connect(server.addr).await.expect_err("no token");
    assert!(
        matches!(err, Error::Timeout(_) | Error::Server { .. }),
        "{err:?}"
    );
    if let Error::Server { .. } = err {
        assert!(err.to_string().contains("requires a token"), "{err}");
    }
    let config = ClientConfig {
        auth_token: Some("s3cret".into()),
        deadline: Duration::from_secs(10),
        ..Default::default()
    };
    let client = Client::connect_with(server.addr, config)
        .await
        .expect("token accepted");
    assert!(client.throttle(b"k", policy(), 1).await.unwrap().allowed);
    let config = ClientConfig {
        auth_token: Some("nope".into()),
        ..Default::default()
    };
    let err = Client::connect_with(server.addr, config)
        .await
        .expect_err("wrong token");
    assert_eq!(err.status(), Some(Status::AuthFailed));
    assert!(err.to_string().contains("the token is wrong"), "{err}");
    assert_eq!(
        err.to_string().matches("authentication failed").count(),
        1,
        "{err}"
    );
    assert_eq!(err.action(), Action::GiveUp);
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let server = Sluiced::start(&["--shards", "2"]);
    let config = ClientConfig {
        deadline: Duration::from_secs(10),
        ..Default::default()
    };
    let client = Client::connect_with(server.addr, config).await.unwrap();
    assert!(client.throttle(b"k", policy(), 1).await.unwrap().allowed);
    let addr = server.addr;
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    let err = client
        .throttle(b"k", policy(), 1)
        .await
        .expect_err("the server is gone");
    assert_eq!(err.action(), Action::Reconnect, "{err:?}");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "nothing listens any more"
    );
}

/// SIGTERM closes idle connections at once (each notices the drain begin),
/// not at the end of `--drain-ms`: with a drain of a minute, an idle
/// binary connection and an idle RESP one both see the server close them,
/// and the process exits, within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_idle_connections_without_waiting_out_the_drain() {
    let server = Sluiced::start(&["--shards", "2", "--resp-port", "0", "--drain-ms", "60000"]);
    let resp_addr = server.resp_addr.expect("the RESP line was printed");
    let mut binary = Raw::connect(server.addr).await;
    binary.send_frame(&[(1, hello(b""))]).await;
    assert!(matches!(
        binary.next_reply().await,
        Some((1, Reply::HelloOk(_)))
    ));
    let mut resp = tokio::net::TcpStream::connect(resp_addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut resp, b"PING\r\n")
        .await
        .unwrap();
    let mut pong = [0u8; 7];
    tokio::io::AsyncReadExt::read_exact(&mut resp, &mut pong)
        .await
        .unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    let started = std::time::Instant::now();
    server.signal("TERM");
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        assert!(
            binary.closed_by_server().await,
            "the binary connection was closed"
        );
        let mut rest = Vec::new();
        let n = tokio::io::AsyncReadExt::read_to_end(&mut resp, &mut rest)
            .await
            .unwrap_or(0);
        assert_eq!(n, 0, "nothing more on the RESP connection: {rest:?}");
    })
    .await;
    assert!(
        closed.is_ok(),
        "idle connections were still open {:?} after SIGTERM (the drain is 60 s)",
        started.elapsed()
    );
    let status = tokio::task::spawn_blocking(move || server.wait_for_exit(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// A script may signal `sluiced` the moment it reads the listening line:
/// SIGHUP then reloads (here: the error of no config file) and SIGTERM
/// drains, each with its handler already in place, never the default
/// action that ends the process. Sent with kill(2) from this thread, so
/// no `kill` process forks in between and the window right after the
/// line is what gets hit; 30 starts, every one must exit 0.
#[test]
#[allow(unsafe_code)] // kill(2): std has no way to send SIGTERM or SIGHUP
fn signals_right_after_the_listening_line_are_handled() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    for round in 0..30 {
        let mut child = Command::new(sluice_tests::support::binary("sluiced"))
            .args(["--bind", "127.0.0.1", "--port", "0", "--shards", "1"])
            .env("SLUICE_LOG", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sluiced starts");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("sluiced listening on "), "{line:?}");
        let pid = child.id() as libc::pid_t;
        let signal = if round % 2 == 0 {
            libc::SIGTERM
        } else {
            libc::SIGHUP
        };
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        if signal == libc::SIGHUP {
            // Still serving after the reload: it answers a connection.
            let addr: std::net::SocketAddr =
                line.split_whitespace().nth(3).unwrap().parse().unwrap();
            let mut s = std::net::TcpStream::connect(addr).expect("still listening after SIGHUP");
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let hello = frame(&[(1, hello(b""))]);
            std::io::Write::write_all(&mut s, &hello).unwrap();
            let mut some = [0u8; 1];
            let n = std::io::Read::read(&mut s, &mut some).unwrap();
            assert_eq!(n, 1, "round {round}: answered after SIGHUP");
            assert!(
                child.try_wait().unwrap().is_none(),
                "round {round}: SIGHUP ended it"
            );
            // SAFETY: as above.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        }
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "round {round}, signal {signal}: {status:?}"
        );
    }
}

/// `Cpus_allowed_list` of a process or thread, from its `status` file.
fn cpus_allowed(status_path: &str) -> String {
    let status = std::fs::read_to_string(status_path).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_else(|| panic!("no Cpus_allowed_list in {status_path}"))
        .trim()
        .to_owned()
}

/// The CPUs of a `Cpus_allowed_list` like `0-3,6`.
fn cpus_of(list: &str) -> Vec<u16> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((lo, hi)) => cpus.extend(lo.parse::<u16>().unwrap()..=hi.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// `--cpu-list` pins shard thread i to the i-th CPU of the list, wrapping
/// around, and leaves every other thread where it was; a CPU this process
/// may not run on stops the start with exit status 2 naming the flag.
#[test]
fn cpu_list_pins_each_shard_thread_and_refuses_a_cpu_it_may_not_use() {
    let ours = cpus_allowed("/proc/self/status");
    let cpus = cpus_of(&ours);
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    // Backwards, so the pinning follows the list, not the CPU numbers.
    let list = if a == b {
        a.to_string()
    } else {
        format!("{b},{a}")
    };
    let server = Sluiced::start(&["--shards", "3", "--cpu-list", &list]);
    let want = |shard: u16| if a == b || shard % 2 == 1 { a } else { b };
    let mut shards_seen = 0;
    for task in std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap();
        let allowed = cpus_allowed(task.join("status").to_str().unwrap());
        match name.trim().strip_prefix("sluice-shard-") {
            Some(id) => {
                let id: u16 = id.parse().unwrap();
                assert_eq!(allowed, want(id).to_string(), "shard {id}");
                shards_seen += 1;
            }
            None => assert_eq!(allowed, ours, "thread {name:?} is not a shard"),
        }
    }
    assert_eq!(shards_seen, 3);

    let out = std::process::Command::new(sluice_tests::support::binary("sluiced"))
        .args(["--bind", "127.0.0.1", "--port", "0", "--cpu-list", "1023"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cpu-list must be CPUs this process may run on")
            && err.contains("CPU 1023 is not"),
        "{err}"
    );
    let out = std::process::Command::new(sluice_tests::support::binary("sluiced"))
        .args(["--cpu-list", "2-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cpu-list") && err.contains("\"2-1\""),
        "{err}"
    );
}
