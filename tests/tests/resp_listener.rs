//! The RESP2 listener (`--resp-port`) against a real `sluiced`, spoken over
//! a raw socket: redis-cell's documented CL.THROTTLE example, pipelined
//! commands across shards answered in order, malformed input closing only
//! its own connection, QUIT, INFO, ECHO, PING, AUTH, the connection limit
//! and graceful shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use sluice_protocol::routing::{key_hash, shard_of};
use sluice_tests::support::Sluiced;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a test waits for a reply before failing.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Array(Vec<Value>),
}

impl Value {
    fn ints(&self) -> Vec<i64> {
        let Value::Array(items) = self else {
            panic!("not an array: {self:?}")
        };
        items
            .iter()
            .map(|v| match v {
                Value::Int(n) => *n,
                other => panic!("not an integer: {other:?}"),
            })
            .collect()
    }
}

/// A raw RESP connection.
struct Resp {
    /// The socket.
    stream: TcpStream,
    /// Bytes read and not yet parsed.
    buf: Vec<u8>,
}

impl Resp {
    async fn connect(addr: SocketAddr) -> Resp {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Resp {
            stream,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Sends one command as an array of bulk strings.
    async fn command(&mut self, args: &[&str]) {
        self.send(&encode(args)).await;
    }

    /// The next reply; `None` at end of stream.
    async fn read(&mut self) -> Option<Value> {
        tokio::time::timeout(REPLY_TIMEOUT, async {
            loop {
                if let Some((v, used)) = parse(&self.buf) {
                    self.buf.drain(..used);
                    return Some(v);
                }
                let mut chunk = [0u8; 4096];
                match self.stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await
        .expect("a reply in time")
    }

    /// Sends `args` and reads the reply.
    async fn call(&mut self, args: &[&str]) -> Value {
        self.command(args).await;
        self.read().await.expect("connection open")
    }

    /// Whether the server closed the connection with nothing more to say.
    async fn closed(&mut self) -> bool {
        self.read().await.is_none() && self.buf.is_empty()
    }
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Parses one reply at the front of `buf`: the value and its length.
fn parse(buf: &[u8]) -> Option<(Value, usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[1..end]).expect("text header");
    let next = end + 2;
    match buf.first()? {
        b'+' => Some((Value::Simple(line.to_owned()), next)),
        b'-' => Some((Value::Error(line.to_owned()), next)),
        b':' => Some((Value::Int(line.parse().expect("integer")), next)),
        b'$' => {
            let len: usize = line.parse().expect("bulk length");
            let data = buf.get(next..next + len)?;
            buf.get(next + len..next + len + 2)?;
            Some((Value::Bulk(data.to_vec()), next + len + 2))
        }
        b'*' => {
            let n: usize = line.parse().expect("array length");
            let mut items = Vec::new();
            let mut at = next;
            for _ in 0..n {
                let (v, used) = parse(&buf[at..])?;
                items.push(v);
                at += used;
            }
            Some((Value::Array(items), at))
        }
        other => panic!("unexpected reply type {:?}", char::from(*other)),
    }
}

fn start(args: &[&str]) -> (Sluiced, SocketAddr) {
    let mut all = vec!["--resp-port", "0"];
    all.extend_from_slice(args);
    let server = Sluiced::start(&all);
    let resp = server.resp_addr.expect("the RESP line was printed");
    assert_ne!(resp, server.addr);
    (server, resp)
}

fn simple(s: &str) -> Value {
    Value::Simple(s.to_owned())
}

#[tokio::test]
async fn redis_cell_readme_example() {
    let (_server, addr) = start(&[]);
    let mut c = Resp::connect(addr).await;
    let v = c
        .call(&["CL.THROTTLE", "user123", "15", "30", "60", "1"])
        .await;
    assert_eq!(v.ints(), [0, 16, 15, -1, 2]);
    // Quantity defaults to 1; the name is case-insensitive.
    let v = c.call(&["cl.throttle", "user123", "15", "30", "60"]).await;
    assert_eq!(v.ints(), [0, 16, 14, -1, 4]);
    // More than the limit: limited, never retryable, nothing spent.
    let v = c
        .call(&["CL.THROTTLE", "user123", "15", "30", "60", "17"])
        .await;
    assert_eq!(v.ints(), [1, 16, 14, -1, 4]);
    // Quantity 0 peeks.
    let v = c
        .call(&["CL.THROTTLE", "user123", "15", "30", "60", "0"])
        .await;
    assert_eq!(v.ints(), [0, 16, 14, -1, 4]);
    let v = c.call(&["CL.THROTTLE", "user123", "15", "x", "60"]).await;
    assert_eq!(
        v,
        Value::Error("Cell error: Store error: Couldn't parse as integer: x".into())
    );
    let v = c.call(&["CL.THROTTLE", "user123", "15", "0", "60"]).await;
    assert_eq!(
        v,
        Value::Error("Cell error: Store error: Zero rates are not supported".into())
    );
    let v = c.call(&["CL.THROTTLE", "user123"]).await;
    assert!(
        matches!(&v, Value::Error(e) if e.starts_with("Cell error: Store error: Usage: cl.throttle <key>")),
        "{v:?}"
    );
    // Errors do not end the connection.
    assert_eq!(c.call(&["PING"]).await, simple("PONG"));
}

#[tokio::test]
async fn ping_echo_info_quit() {
    let (server, addr) = start(&["--shards", "3"]);
    let mut c = Resp::connect(addr).await;
    assert_eq!(c.call(&["PING"]).await, simple("PONG"));
    assert_eq!(
        c.call(&["ping", "hello"]).await,
        Value::Bulk(b"hello".to_vec())
    );
    assert_eq!(
        c.call(&["ECHO", "a\r\nb"]).await,
        Value::Bulk(b"a\r\nb".to_vec())
    );
    assert_eq!(
        c.call(&["ECHO"]).await,
        Value::Error("ERR wrong number of arguments for 'echo' command".into())
    );
    assert_eq!(
        c.call(&["FLUSHALL", "ASYNC"]).await,
        Value::Error("ERR unknown command 'FLUSHALL', with args beginning with: 'ASYNC' ".into())
    );
    // Inline commands, as telnet and redis-benchmark send them.
    c.send(b"PING\r\necho \"two words\"\n").await;
    assert_eq!(c.read().await, Some(simple("PONG")));
    assert_eq!(c.read().await, Some(Value::Bulk(b"two words".to_vec())));
    let Value::Bulk(info) = c.call(&["INFO"]).await else {
        panic!("INFO is a bulk string")
    };
    let info = String::from_utf8(info).unwrap();
    for field in [
        "# Server\r\n".to_owned(),
        format!("tcp_port:{}\r\n", server.addr.port()),
        format!("resp_port:{}\r\n", addr.port()),
        "shards:3\r\n".to_owned(),
        "connected_clients:1\r\n".to_owned(),
        "# Shard\r\n".to_owned(),
    ] {
        assert!(info.contains(&field), "{field:?} not in {info:?}");
    }
    let Value::Bulk(clients) = c.call(&["INFO", "clients"]).await else {
        panic!()
    };
    let clients = String::from_utf8(clients).unwrap();
    assert!(
        clients.starts_with("# Clients\r\n") && !clients.contains("# Server"),
        "{clients:?}"
    );
    // QUIT answers, then closes; what follows it is not read.
    c.send(b"QUIT\r\nPING\r\n").await;
    assert_eq!(c.read().await, Some(simple("OK")));
    assert!(c.closed().await);
}

#[tokio::test]
async fn pipelined_commands_across_shards_are_answered_in_order() {
    let (server, addr) = start(&["--shards", "4"]);
    let keys: Vec<String> = (0..16).map(|i| format!("pipelined-{i}")).collect();
    let shards: std::collections::HashSet<u16> = keys
        .iter()
        .map(|k| shard_of(key_hash(k.as_bytes()), server.shards))
        .collect();
    assert_eq!(shards.len(), 4, "the keys span every shard");
    // 2,000 commands in one write: CL.THROTTLEs whose limit names the key
    // (max_burst = 100 + key index), an ECHO of the position every tenth.
    let mut bytes = Vec::new();
    let mut expected = Vec::new();
    let mut spent = vec![0i64; keys.len()];
    for n in 0..2_000usize {
        if n % 10 == 0 {
            bytes.extend_from_slice(&encode(&["ECHO", &n.to_string()]));
            expected.push(Value::Bulk(n.to_string().into_bytes()));
            continue;
        }
        let k = n % keys.len();
        let burst = (100 + k).to_string();
        bytes.extend_from_slice(&encode(&["CL.THROTTLE", &keys[k], &burst, "1", "3600"]));
        let limit = 101 + k as i64;
        spent[k] += 1;
        let limited = spent[k] > limit;
        let remaining = if limited { 0 } else { limit - spent[k] };
        let retry = if limited { 3600 } else { -1 };
        let reset = 3600 * spent[k].min(limit);
        expected.push(Value::Array(
            [i64::from(limited), limit, remaining, retry, reset]
                .map(Value::Int)
                .to_vec(),
        ));
    }
    let mut c = Resp::connect(addr).await;
    c.send(&bytes).await;
    for (i, want) in expected.iter().enumerate() {
        let got = c.read().await.expect("connection open");
        match (&got, want) {
            // A retry time may be a second less if the clock moved on.
            (Value::Array(g), Value::Array(w)) if g[0] == Value::Int(1) => {
                assert_eq!(g[..3], w[..3], "reply {i}");
            }
            _ => assert_eq!(&got, want, "reply {i}"),
        }
    }
}

#[tokio::test]
async fn malformed_input_closes_only_that_connection() {
    let (_server, addr) = start(&["--shards", "2", "--frame-bytes-max", "4096"]);
    let mut other = Resp::connect(addr).await;
    assert_eq!(other.call(&["PING"]).await, simple("PONG"));
    let cases: &[(&[u8], &str)] = &[
        (b"*1\r\n:1\r\n", "ERR Protocol error: expected '$', got ':'"),
        (b"*x\r\n", "ERR Protocol error: invalid multibulk length"),
        (b"*1\r\n$-5\r\n", "ERR Protocol error: invalid bulk length"),
        (
            b"*1\r\n$4\r\nPINGxx",
            "ERR Protocol error: expected CRLF after a bulk string",
        ),
        (
            b"ECHO \"unterminated\r\n",
            "ERR Protocol error: unbalanced quotes in request",
        ),
        // Bigger than --frame-bytes-max, refused on the header alone.
        (
            b"*2\r\n$4\r\nECHO\r\n$1000000\r\n",
            "ERR Protocol error: invalid bulk length",
        ),
    ];
    for (input, error) in cases {
        let mut c = Resp::connect(addr).await;
        // A good command first: its reply still comes, then the error.
        let mut bytes = b"PING\r\n".to_vec();
        bytes.extend_from_slice(input);
        c.send(&bytes).await;
        assert_eq!(c.read().await, Some(simple("PONG")), "{input:?}");
        assert_eq!(
            c.read().await,
            Some(Value::Error((*error).to_owned())),
            "{input:?}"
        );
        assert!(c.closed().await, "{input:?} left the connection open");
        assert_eq!(
            other.call(&["ECHO", "still here"]).await,
            Value::Bulk(b"still here".to_vec())
        );
    }
    // An inline line longer than the bound, newline never sent.
    let mut c = Resp::connect(addr).await;
    c.send(&vec![b'a'; 5000]).await;
    assert_eq!(
        c.read().await,
        Some(Value::Error(
            "ERR Protocol error: too big inline request".into()
        ))
    );
    assert!(c.closed().await);
    let v = other.call(&["CL.THROTTLE", "k", "1", "1", "1"]).await;
    assert_eq!(v.ints(), [0, 2, 1, -1, 1]);
}

#[tokio::test]
async fn auth_is_required_when_a_token_is_set() {
    let (_server, addr) = start(&["--auth-token", "s3cret"]);
    let noauth = Value::Error("NOAUTH Authentication required.".into());
    let wrong =
        Value::Error("WRONGPASS invalid username-password pair or user is disabled.".into());
    // Before authentication, anything but AUTH, HELLO and QUIT is NOAUTH,
    // and the connection is over.
    for first in [&["PING"][..], &["CL.THROTTLE", "k", "1", "1", "1"]] {
        let mut c = Resp::connect(addr).await;
        assert_eq!(c.call(first).await, noauth);
        assert!(c.closed().await, "{first:?}");
    }
    // A wrong password closes too: no second guess on a connection.
    for auth in [
        &["AUTH", "wrong"][..],
        &["AUTH", "default", "nope"],
        &["HELLO", "3", "AUTH", "default", "nope"],
    ] {
        let mut c = Resp::connect(addr).await;
        assert_eq!(c.call(auth).await, wrong);
        assert!(c.closed().await, "{auth:?}");
    }
    // Before authentication a command is at most 1 KiB.
    let mut c = Resp::connect(addr).await;
    let long = "x".repeat(2_000);
    c.command(&["AUTH", "default", &long]).await;
    assert!(matches!(c.read().await, Some(Value::Error(_))));
    assert!(c.closed().await);
    let mut c = Resp::connect(addr).await;
    assert_eq!(c.call(&["AUTH", "default", "s3cret"]).await, simple("OK"));
    assert_eq!(c.call(&["PING"]).await, simple("PONG"));
    // Authenticated, a command may be as large as --frame-bytes-max.
    assert_eq!(
        c.call(&["ECHO", &long]).await,
        Value::Bulk(long.clone().into_bytes())
    );
}

/// CL.THROTTLE's keys are bounded as protocol v1's (1..=512 bytes), where
/// redis-cell takes any.
#[tokio::test]
async fn cl_throttle_keys_are_1_to_512_bytes() {
    let (_server, addr) = start(&[]);
    let mut c = Resp::connect(addr).await;
    let refused = Value::Error("Cell error: Store error: key must be 1..=512 bytes".into());
    assert_eq!(c.call(&["CL.THROTTLE", "", "1", "1", "1"]).await, refused);
    let long = "k".repeat(513);
    assert_eq!(
        c.call(&["CL.THROTTLE", &long, "1", "1", "1"]).await,
        refused
    );
    let longest = "k".repeat(512);
    let v = c.call(&["CL.THROTTLE", &longest, "1", "1", "1"]).await;
    assert_eq!(v.ints(), [0, 2, 1, -1, 1]);
}

#[tokio::test]
async fn resp_connections_count_against_the_limit() {
    let (_server, addr) = start(&["--connections-max", "1"]);
    let mut first = Resp::connect(addr).await;
    assert_eq!(first.call(&["PING"]).await, simple("PONG"));
    let mut second = Resp::connect(addr).await;
    assert_eq!(
        second.read().await,
        Some(Value::Error("ERR max number of clients reached".into()))
    );
    assert!(second.closed().await);
    assert_eq!(first.call(&["PING"]).await, simple("PONG"));
}

#[tokio::test]
async fn sigterm_drains_resp_connections() {
    let (server, addr) = start(&["--shards", "2"]);
    let mut c = Resp::connect(addr).await;
    assert_eq!(c.call(&["PING"]).await, simple("PONG"));
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        c.closed().await,
        "the RESP connection was closed at shutdown"
    );
}

/// CL.THROTTLEs are parsed up to 16 ahead of their decision (their slots
/// prefetched); the reply bound can stop the decisions part way through
/// such a run, and parsing resumes at the first one left undecided. With
/// `--reply-bytes-max 1024` (about 34 replies) that happens on nearly
/// every read: 30,000 commands over two shards' keys, a PING every 97th
/// and a malformed command at the end, written while the replies are read.
/// Every CL.THROTTLE must be decided exactly once and in order (each key's
/// `remaining` falls by one a reply), every PING answered in its place, and
/// the protocol error come after all of them.
#[tokio::test]
async fn cl_throttles_parsed_ahead_are_decided_once_each_in_order_under_the_reply_bound() {
    let (server, addr) = start(&["--shards", "2", "--reply-bytes-max", "1024"]);
    // Two keys of each shard: every read decides some and forwards some.
    let mut keys: Vec<String> = Vec::new();
    for shard in 0..2u16 {
        keys.extend(
            (0..)
                .map(|i| format!("ahead-{i}"))
                .filter(|k| shard_of(key_hash(k.as_bytes()), server.shards) == shard)
                .take(2),
        );
    }
    let burst = 100_000;
    let mut bytes = Vec::new();
    let mut expected = Vec::new();
    let mut spent = [0i64; 4];
    for n in 0..30_000usize {
        if n % 97 == 0 {
            bytes.extend_from_slice(b"PING\r\n");
            expected.push(None);
            continue;
        }
        let k = n % keys.len();
        bytes.extend_from_slice(&encode(&[
            "CL.THROTTLE",
            &keys[k],
            &burst.to_string(),
            "1",
            "3600",
        ]));
        spent[k] += 1;
        expected.push(Some((k, burst + 1 - spent[k])));
    }
    bytes.extend_from_slice(b"*1\r\n:1\r\n");
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(&bytes).await.unwrap();
        wr
    });
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while replies.len() <= expected.len() {
            let mut chunk = [0u8; 1 << 14];
            let n = rd.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed after {} replies", replies.len());
            buf.extend_from_slice(&chunk[..n]);
            while let Some((v, used)) = parse(&buf) {
                buf.drain(..used);
                replies.push(v);
            }
        }
    })
    .await
    .expect("every reply in time");
    let _wr = writer.await.unwrap();
    for (i, (got, want)) in replies.iter().zip(&expected).enumerate() {
        match want {
            None => assert_eq!(got, &simple("PONG"), "reply {i}"),
            Some((k, remaining)) => {
                let ints = got.ints();
                assert_eq!(
                    (ints[0], ints[2]),
                    (0, *remaining),
                    "reply {i}, key {}",
                    keys[*k]
                );
            }
        }
    }
    assert_eq!(
        replies.last(),
        Some(&Value::Error(
            "ERR Protocol error: expected '$', got ':'".to_owned()
        )),
        "the error after every earlier reply"
    );
}
