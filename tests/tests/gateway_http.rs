//! The example gateway (`client/examples/gateway.rs`, feature `tower`) in
//! front of a real `sluiced`, over real HTTP: the RateLimit headers count
//! down per API key, the request past the limit gets 429 with Retry-After,
//! other keys are untouched, no key is 401, and `--headers legacy` sends
//! X-RateLimit-*. With `--priority-header`, a class spends only what the
//! limit's reserves leave it; with `--shed`, the gateway's own shedder
//! answers low and then normal requests 503 while slow calls fill it, and
//! critical ones still go through.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_tests::support::{example, Sluiced};

/// How long the gateway may take to print its listening line, and an HTTP
/// exchange to finish.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A running example gateway, killed when dropped.
struct Gateway {
    /// The process.
    child: Child,
    /// Where it listens.
    addr: SocketAddr,
}

impl Gateway {
    /// Starts the gateway on a free port in front of `store`, 5 per minute
    /// per `x-api-key` unless `args` name a `--limit`, with `args` added.
    fn start(store: &Sluiced, args: &[&str]) -> Gateway {
        let store = store.addr.to_string();
        let mut child = Command::new(example("sluice-client", "gateway", "tower"))
            .args(["--listen", "127.0.0.1:0", "--store", &store])
            .args(["--deadline-ms", "2000"])
            .args(if args.contains(&"--limit") {
                &[][..]
            } else {
                &["--limit", "token-bucket:5/m"][..]
            })
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the gateway starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(TIMEOUT).expect("the gateway's first line");
        let addr = line
            .trim()
            .strip_prefix("gateway listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        Gateway { child, addr }
    }

    /// `GET /hello`, with `x-api-key: KEY` when given.
    fn get(&self, key: Option<&str>) -> Reply {
        self.get_as("/hello", key, None)
    }

    /// `GET PATH`, with `x-api-key: KEY` and `x-priority: CLASS` when
    /// given.
    fn get_as(&self, path: &str, key: Option<&str>, class: Option<&str>) -> Reply {
        get(self.addr, path, key, class)
    }
}

/// `GET PATH` from the gateway at `addr` (see [`Gateway::get_as`]).
fn get(addr: SocketAddr, path: &str, key: Option<&str>, class: Option<&str>) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect to the gateway");
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let mut header = key.map_or(String::new(), |k| format!("x-api-key: {k}\r\n"));
    if let Some(class) = class {
        header += &format!("x-priority: {class}\r\n");
    }
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: gateway\r\n{header}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read the reply");
    Reply::parse(&raw)
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 response's status and headers (names lowercased).
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Reply {
    fn parse(raw: &str) -> Reply {
        let head = raw.split("\r\n\r\n").next().unwrap_or_default();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad response {raw:?}"));
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Reply { status, headers }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The integer parameter `name` of the header `field`'s one Item
    /// (`"policy";r=4;t=12`).
    fn param(&self, field: &str, name: &str) -> Option<u64> {
        self.header(field)?
            .split(';')
            .skip(1)
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse().ok())
    }
}

#[test]
fn ietf_headers_count_down_per_key_and_the_sixth_request_is_429() {
    let store = Sluiced::start(&[]);
    let gateway = Gateway::start(&store, &[]);
    let policy = r#""token-bucket:5/m,burst=5";q=5;w=60"#;
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let reply = gateway.get(Some("alice"));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("ratelimit-policy"), Some(policy), "{reply:?}");
        let t = reply.param("ratelimit", "t").expect("t");
        assert!((1..=60).contains(&t), "{reply:?}");
        remaining.push(reply.param("ratelimit", "r").expect("r"));
        assert_eq!(reply.header("retry-after"), None, "{reply:?}");
    }
    assert_eq!(remaining, [4, 3, 2, 1, 0]);
    let denied = gateway.get(Some("alice"));
    assert_eq!(denied.status, 429, "{denied:?}");
    let retry_after: u64 = denied
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in whole seconds");
    // 5 per minute: one unit back every 12 s.
    assert!((1..=12).contains(&retry_after), "{denied:?}");
    assert_eq!(denied.header("ratelimit-policy"), Some(policy));
    assert_eq!(denied.param("ratelimit", "r"), Some(0), "{denied:?}");
    assert!(denied.param("ratelimit", "t").is_some(), "{denied:?}");
    // Another key has its own bucket; no key is not served at all.
    let bob = gateway.get(Some("bob"));
    assert_eq!(bob.status, 200, "{bob:?}");
    assert_eq!(bob.param("ratelimit", "r"), Some(4), "{bob:?}");
    let anonymous = gateway.get(None);
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert_eq!(anonymous.header("ratelimit"), None);
}

#[test]
fn legacy_headers_are_x_ratelimit() {
    let store = Sluiced::start(&[]);
    let gateway = Gateway::start(&store, &["--headers", "legacy"]);
    for expected in [4, 3, 2, 1, 0] {
        let reply = gateway.get(Some("carol"));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("x-ratelimit-limit"), Some("5"), "{reply:?}");
        let remaining = expected.to_string();
        assert_eq!(reply.header("x-ratelimit-remaining"), Some(&*remaining));
        let reset: u64 = reply
            .header("x-ratelimit-reset")
            .and_then(|v| v.parse().ok())
            .expect("X-RateLimit-Reset in seconds");
        assert!((1..=60).contains(&reset), "{reply:?}");
        assert_eq!(reply.header("ratelimit"), None, "{reply:?}");
        assert_eq!(reply.header("ratelimit-policy"), None, "{reply:?}");
    }
    let denied = gateway.get(Some("carol"));
    assert_eq!(denied.status, 429, "{denied:?}");
    assert!(denied.header("retry-after").is_some_and(|v| v != "0"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
}

/// Reserves through the gateway: 10 units, 20 % kept for critical and 50 %
/// for normal and critical; the class comes from `x-priority`. Low gets 5
/// and then 429 with a Retry-After for its own class, normal 3 more,
/// critical the last 2.
#[test]
fn the_class_header_spends_only_what_the_reserves_leave() {
    let store = Sluiced::start(&[]);
    let gateway = Gateway::start(
        &store,
        &[
            "--limit",
            "token-bucket:1/h,burst=10,reserve=critical:20%,reserve=normal:50%",
            "--priority-header",
            "x-priority",
        ],
    );
    let served = |class: &str| {
        (0..12)
            .map(|_| gateway.get_as("/hello", Some("dave"), Some(class)))
            .take_while(|r| r.status == 200)
            .count()
    };
    assert_eq!(served("low"), 5);
    let denied = gateway.get_as("/hello", Some("dave"), Some("low"));
    assert_eq!(denied.status, 429, "{denied:?}");
    // Low's 6th unit is one 1/h refill away.
    let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!((3_590..=3_600).contains(&retry), "{denied:?}");
    assert_eq!(served("normal"), 3);
    assert_eq!(served("critical"), 2);
}

/// The gateway's own shedder, over real HTTP: low shed from 2 requests in
/// flight, normal from 4, critical never. Four slow critical calls (2 s
/// each) fill it; then low and normal get 503 with Retry-After at once,
/// critical is served; once the slow calls are done, normal is served
/// again.
#[test]
fn slow_calls_fill_the_shedder_and_only_critical_gets_through() {
    let store = Sluiced::start(&[]);
    let gateway = Gateway::start(
        &store,
        &[
            "--limit",
            "token-bucket:1000/s",
            "--priority-header",
            "x-priority",
            "--shed",
            "2,4",
            "--slow-ms",
            "2000",
        ],
    );
    let addr = gateway.addr;
    let slow: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || get(addr, "/slow", Some("erin"), Some("critical"))))
        .collect();
    // Wait (bounded) until the four are in flight: normal is shed from 4.
    let mut shed = None;
    for _ in 0..400 {
        let r = gateway.get_as("/hello", Some("erin"), Some("normal"));
        if r.status == 503 {
            shed = Some(r);
            break;
        }
        assert_eq!(r.status, 200, "{r:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let shed = shed.expect("normal is shed while four slow calls are in flight");
    assert_eq!(shed.header("retry-after"), Some("1"), "{shed:?}");
    assert_eq!(
        shed.header("ratelimit"),
        None,
        "shed before the store is asked"
    );
    let low = gateway.get_as("/hello", Some("erin"), Some("low"));
    assert_eq!(low.status, 503, "{low:?}");
    let critical = gateway.get_as("/hello", Some("erin"), Some("critical"));
    assert_eq!(critical.status, 200, "{critical:?}");
    for call in slow {
        let r = call.join().unwrap();
        assert_eq!(r.status, 200, "{r:?}");
    }
    let normal = gateway.get_as("/hello", Some("erin"), Some("normal"));
    assert_eq!(normal.status, 200, "the slow calls are done: {normal:?}");
}
