//! Every node an entry point (`sluiced --cluster FILE --group NAME`): two
//! shard groups of a primary and a follower each, real processes on
//! loopback, and clients that spread their calls round robin over all
//! four nodes as Envoy and Redis client pools do. Each key must be granted
//! exactly its limit, whichever nodes were asked; the same load against
//! the same four nodes started without `--cluster` grants more (the
//! control that shows each test can fail). A stopped owner (SIGSTOP) whose
//! follower is promoted costs forwarded calls the forwarder's stall
//! threshold, not its forward deadline.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sluice_client::{Client, ClientConfig, Mode};
use sluice_protocol::ring::Ring;
use sluice_protocol::routing::key_hash;
use sluice_protocol::Policy;
use sluice_tests::repl::{streaming, wait_role};
use sluice_tests::support::{
    http_get, json_object, metric_sample, port, sluice_cli, ConfigFile, Sluiced,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv `scripts/deps.sh` makes (redis-py, grpcio, xds-protos).
fn python() -> PathBuf {
    let py = root().join("../target/redis-py/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash scripts/deps.sh`",
        py.display()
    );
    py
}

/// Two groups, `a` and `b`, each a primary and its follower.
struct TwoGroups {
    /// a's primary, a's follower, b's primary, b's follower.
    nodes: Vec<Sluiced>,
    /// The cluster file they share (kept alive with them).
    file: ConfigFile,
    /// The ring over `a` and `b`, to pick keys of each group.
    ring: Ring,
}

impl TwoGroups {
    /// Starts the four nodes; with `entry`, each with `--cluster`.
    async fn start(entry: bool) -> TwoGroups {
        TwoGroups::start_with(entry, &[]).await
    }

    /// [`TwoGroups::start`], every node with `extra` flags too.
    async fn start_with(entry: bool, extra: &[&str]) -> TwoGroups {
        TwoGroups::start_full(entry, extra, &[]).await
    }

    /// [`TwoGroups::start_with`], the followers with `follower_extra` too.
    async fn start_full(entry: bool, extra: &[&str], follower_extra: &[&str]) -> TwoGroups {
        let ports: Vec<u16> = (0..4).map(|_| port()).collect();
        let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
        let toml = format!(
            "[[groups]]\nname = \"a\"\nprimary = \"{}\"\nfollower = \"{}\"\n\n\
             [[groups]]\nname = \"b\"\nprimary = \"{}\"\nfollower = \"{}\"\n",
            addr(0),
            addr(1),
            addr(2),
            addr(3)
        );
        let file = ConfigFile::new(&toml);
        let rules = root().join("cluster").display().to_string();
        let mut nodes = Vec::new();
        for (i, group) in ["a", "a", "b", "b"].into_iter().enumerate() {
            let primary = addr(i & !1);
            let mut args = vec![
                "--shards",
                "2",
                "--resp-port",
                "0",
                "--rls-port",
                "0",
                "--rls-config",
                &rules,
                "--admin-port",
                "0",
            ];
            if entry {
                args.extend(["--cluster", file.arg(), "--group", group]);
            }
            if i % 2 == 1 {
                args.extend(["--replica-of", &primary]);
                args.extend(follower_extra);
            }
            args.extend(extra);
            nodes.push(Sluiced::start_on(ports[i], &args));
        }
        for n in &nodes {
            wait_role(n.addr, Duration::from_secs(20), streaming).await;
        }
        TwoGroups {
            nodes,
            file,
            ring: Ring::new(["a", "b"]),
        }
    }

    /// `count` keys `PREFIX-i` that group `group` owns.
    fn keys_of(&self, group: &str, prefix: &str, count: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|k| self.ring.owner(key_hash(k.as_bytes())) == group)
            .take(count)
            .collect()
    }

    /// `count` values `PREFIX-i` whose rate limit service key for
    /// descriptor (`key`, value) in domain `entry` group `group` owns.
    fn values_of(&self, group: &str, key: &str, prefix: &str, count: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|v| {
                let k = format!("rls/entry/{key}={v}");
                self.ring.owner(key_hash(k.as_bytes())) == group
            })
            .take(count)
            .collect()
    }

    fn resp_ports(&self) -> Vec<String> {
        let ports = self.nodes.iter().map(|n| n.resp_addr.expect("resp").port());
        ports.map(|p| p.to_string()).collect()
    }

    fn rls_ports(&self) -> Vec<String> {
        let ports = self.nodes.iter().map(|n| n.rls_addr.expect("rls").port());
        ports.map(|p| p.to_string()).collect()
    }
}

/// Runs tests/cluster/entry_check.py; its JSON.
fn check(args: &[&str], ports: &[String]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(root().join("cluster/entry_check.py"))
        .args(args)
        .arg("--")
        .args(ports)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Each key's grants, from the script's `granted` object, and how many
/// calls failed (an error, not a verdict).
fn granted(v: &serde_json::Value) -> (Vec<(String, u64)>, u64) {
    let map = v["granted"].as_object().expect("granted");
    let grants = map
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().expect("a count")))
        .collect();
    (grants, v["error_count"].as_u64().expect("error_count"))
}

/// redis-py's CL.THROTTLE, 12 tries a key over all four nodes in turn:
/// max_burst 4 grants exactly 5 a key, of either group.
fn resp_round_robin(c: &TwoGroups, tag: &str) -> (Vec<(String, u64)>, u64) {
    let mut keys = c.keys_of("a", tag, 4);
    keys.extend(c.keys_of("b", tag, 4));
    let mut args = vec!["resp", "4", "12"];
    args.extend(keys.iter().map(String::as_str));
    granted(&check(&args, &c.resp_ports()))
}

/// grpcio's ShouldRateLimit, 12 tries a descriptor value over all four
/// nodes in turn: 5 an hour grants exactly 5 a value.
fn rls_round_robin(c: &TwoGroups, tag: &str) -> (Vec<(String, u64)>, u64) {
    let mut values = c.values_of("a", "user", tag, 4);
    values.extend(c.values_of("b", "user", tag, 4));
    let mut args = vec!["rls", "12"];
    args.extend(values.iter().map(String::as_str));
    granted(&check(&args, &c.rls_ports()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_envoy_clients_spread_over_every_node_get_exactly_the_limit() {
    let cluster = TwoGroups::start(true).await;
    assert_round_robin_is_exact(&cluster, "default flags");
}

/// Redis and Envoy clients spread over every node of `cluster`: every key
/// granted exactly its limit of 5, and every node answers every key.
fn assert_round_robin_is_exact(cluster: &TwoGroups, setup: &str) {
    let (grants, errors) = resp_round_robin(cluster, "resp");
    assert_eq!(errors, 0, "{setup}: every node answers every key");
    for (key, n) in grants {
        assert_eq!(
            n, 5,
            "{setup}: CL.THROTTLE {key}: granted {n}, the limit is 5"
        );
    }
    let (grants, errors) = rls_round_robin(cluster, "rls");
    assert_eq!(errors, 0, "{setup}: every node answers every descriptor");
    for (value, n) in grants {
        assert_eq!(
            n, 5,
            "{setup}: descriptor user={value}: granted {n}, the limit is 5"
        );
    }
}

/// The same exactness whichever threads forward (the default: the rate
/// limit service on the shard threads, each over its own connections):
/// the service on the forwarder's thread (`--rls-threads 1`); and one
/// shared set of connections on the forwarder thread, which a second rate
/// limit thread and the shards hand their forwards to
/// (`--forward-connections shared --rls-threads 2`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forwarding_thread_layout_is_exact() {
    for extra in [
        &["--rls-threads", "1"][..],
        &["--forward-connections", "shared", "--rls-threads", "2"][..],
    ] {
        let cluster = TwoGroups::start_with(true, extra).await;
        assert_round_robin_is_exact(&cluster, &format!("{extra:?}"));
    }
}

/// The control: the same nodes and load without `--cluster` grant every
/// key more than its limit (each primary counts it alone: 3 tries reach
/// each, 6 in all; the followers refuse), so the exactness above is the
/// entry points' doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cluster_the_same_load_grants_keys_twice() {
    let cluster = TwoGroups::start(false).await;
    let (over, _) = resp_round_robin(&cluster, "resp");
    assert!(over.iter().all(|(_, n)| *n == 6), "{over:?}");
    let (over, _) = rls_round_robin(&cluster, "rls");
    assert!(over.iter().all(|(_, n)| *n == 6), "{over:?}");
}

/// A request whose two descriptors live in different groups is all or
/// nothing: once `pair` (2 an hour) is spent, `user` (5 an hour) is not
/// charged by the requests `pair` denies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_in_two_groups_are_all_or_nothing() {
    let cluster = TwoGroups::start(true).await;
    for (user_group, pair_group) in [("a", "b"), ("b", "a")] {
        let tag = format!("span-{user_group}");
        let user = &cluster.values_of(user_group, "user", &tag, 1)[0];
        let pair = &cluster.values_of(pair_group, "pair", &tag, 1)[0];
        let v = check(&["pair", "6", user, pair], &cluster.rls_ports());
        assert_eq!(v["ok"], 2, "{v}");
        // 2 spent with pair, 1 by the last call alone: 5 - 3.
        assert_eq!(v["user_remaining"], 2, "user {user} pair {pair}: {v}");
    }
}

/// Protocol v1 through any node, followers included: a client that is not
/// cluster-aware connected to each node in turn spends each key exactly
/// its burst (THROTTLE and DECIDE), and PEEK answers from the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_v1_through_any_node_is_exact() {
    let cluster = TwoGroups::start(true).await;
    let config = ClientConfig {
        deadline: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    let mut clients = Vec::new();
    for n in &cluster.nodes {
        clients.push(Client::connect_with(n.addr, config.clone()).await.unwrap());
    }
    let policy = Policy::new(1, 3_600_000_000_000, 4).unwrap();
    let limits =
        sluice_client::inline_limits(&[sluice_protocol::Limit::TokenBucket(policy)]).unwrap();
    let mut keys = cluster.keys_of("a", "v1", 3);
    keys.extend(cluster.keys_of("b", "v1", 3));
    for key in &keys {
        let mut throttled = 0;
        let mut decided = 0;
        for i in 0..10 {
            let c = &clients[i % clients.len()];
            throttled += u64::from(c.throttle(key.as_bytes(), policy, 1).await.unwrap().allowed);
            let other = format!("{key}/decide");
            let d = c.decide(other.as_bytes(), limits, Mode::Spend, 1).await;
            decided += u64::from(d.unwrap().allowed);
        }
        assert_eq!((throttled, decided), (4, 4), "key {key}");
        for c in &clients {
            let peek = c.peek(key.as_bytes(), policy, 1).await.unwrap();
            assert_eq!((peek.allowed, peek.remaining), (false, 0), "key {key}");
        }
    }
}

/// A node whose cluster file differs (an old version of it) never splits
/// counts: the owner refuses its forwards (LAYOUT_MISMATCH), and its
/// clients hear that the group is unavailable, with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_cluster_file_is_refused() {
    let cluster = TwoGroups::start(true).await;
    let stray_port = port();
    let b = cluster.nodes[2].addr;
    let stale = ConfigFile::new(&format!(
        "[[groups]]\nname = \"a\"\nprimary = \"127.0.0.1:{stray_port}\"\n\n\
         [[groups]]\nname = \"b\"\nprimary = \"{b}\"\n"
    ));
    let stray = Sluiced::start_on(
        stray_port,
        &["--resp-port", "0", "--cluster", stale.arg(), "--group", "a"],
    );
    let key = &cluster.keys_of("b", "stale", 1)[0];
    let said = redis_throttle(stray.resp_addr.expect("resp").port(), key);
    assert!(said.contains("TRYAGAIN"), "{said}");
    assert!(said.contains("layout mismatch"), "{said}");
    // The owner counted what it refused.
    let (_, scrape) = http_get(cluster.nodes[2].admin_addr.expect("admin"), "/metrics");
    let refused = "sluice_forward_errors_total{kind=\"layout_mismatch\"}";
    assert!(metric_sample(&scrape, refused) >= 1.0, "{scrape}");
    drop(cluster.file);
}

/// redis-cli's CL.THROTTLE of `key` (burst 4, 1 an hour) on `port`: its
/// output.
fn redis_throttle(port: u16, key: &str) -> String {
    let out = Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "CL.THROTTLE",
            key,
            "4",
            "1",
            "3600",
        ])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A CELL may carry its key's hash in place of the key, which is what a
/// forwarding node sends so that the owner need not hash the key again
/// (PROTOCOL.md, "CELL"). It is taken only on a connection whose HELLO
/// named the node's layout (HELLO_OK announces it), where it spends the
/// key's own bucket, on whichever shard owns it; from a gateway it is
/// BAD_REQUEST. (Shown failing with the owner's first pass reading the
/// hash's halves swapped: the RESP call then found the key's bucket full.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_by_its_keys_hash_is_taken_only_from_a_forwarding_node() {
    use sluice_protocol::cell::CellPolicy;
    use sluice_protocol::message::{Cell, Hello, Reply, Request, FEATURE_CELL_KEY_HASH};
    use sluice_protocol::Status;
    use sluice_tests::raw::Raw;
    let p = port();
    let file = ConfigFile::new(&format!(
        "[[groups]]\nname = \"a\"\nprimary = \"127.0.0.1:{p}\"\n"
    ));
    let a = Sluiced::start_on(
        p,
        &[
            "--shards",
            "2",
            "--resp-port",
            "0",
            "--cluster",
            file.arg(),
            "--group",
            "a",
        ],
    );
    let hello = |layout| {
        Request::Hello(Hello {
            version_min: 1,
            version_max: 1,
            shard: None,
            token: b"",
            epoch: 0,
            layout,
        })
    };
    // Burst 4, one an hour: redis_throttle's limit.
    let policy = CellPolicy::new(4, 1, 3600).unwrap();
    let key = "hashed-key";
    let hashed = |quantity| {
        Request::Cell(Cell {
            key: &[],
            policy,
            quantity,
            hash: Some(key_hash(key.as_bytes())),
        })
    };
    let features = |r: &Reply| match r {
        Reply::HelloOk(ok) => ok.features,
        other => panic!("{other:?}"),
    };
    let mut gateway = Raw::connect(a.addr).await;
    gateway
        .send_frame(&[
            (1, hello(0)),
            (2, Request::Cluster { key: b"" }),
            (3, hashed(1)),
        ])
        .await;
    let said = gateway.replies(3).await;
    assert_eq!(features(&said[0].1), 0);
    let Reply::Cluster(cluster) = &said[1].1 else {
        panic!("{:?}", said[1])
    };
    assert_eq!(said[2].1.status(), Some(Status::BadRequest), "{said:?}");
    let mut forwarder = Raw::connect(a.addr).await;
    forwarder
        .send_frame(&[(1, hello(cluster.layout)), (2, hashed(2))])
        .await;
    let said = forwarder.replies(2).await;
    assert_eq!(features(&said[0].1), FEATURE_CELL_KEY_HASH);
    let Reply::Cell(v) = &said[1].1 else {
        panic!("{:?}", said[1])
    };
    assert_eq!((v.limited, v.limit, v.remaining), (false, 5, 3));
    // The key's own bucket: a CL.THROTTLE of the key finds 2 spent.
    let said = redis_throttle(a.resp_addr.expect("resp").port(), key);
    assert!(said.starts_with("0\n5\n2\n"), "{said}");
}

/// An owner decides a forwarding node's keys without looking each up in
/// the ring while the layout that node's HELLO named is its own. That is
/// sound only if a connection's keys are routed by the layout it named:
/// a node that reloads another layout must not go on sending over the
/// connections it opened before. Here B's file loses group `c` (whose
/// keys move to `a` or `b`) while A keeps it; a key of `c` in A's layout
/// that is `a`'s in B's new one goes through B and must be refused
/// (LAYOUT_MISMATCH), never decided by A. Fails with `Cluster::reload`
/// keeping B's connection to A across the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_reloads_another_layout_has_its_forwards_refused_not_decided() {
    let (pa, pb, pc) = (port(), port(), port());
    let group = |name: &str, p: u16| {
        format!("[[groups]]\nname = \"{name}\"\nprimary = \"127.0.0.1:{p}\"\n\n")
    };
    let both = format!("{}{}", group("a", pa), group("b", pb));
    let with_c = format!("{both}{}", group("c", pc));
    let (file_a, file_b) = (ConfigFile::new(&with_c), ConfigFile::new(&with_c));
    let a = Sluiced::start_on(
        pa,
        &["--shards", "1", "--cluster", file_a.arg(), "--group", "a"],
    );
    let b = Sluiced::start_on(
        pb,
        &[
            "--shards",
            "1",
            "--resp-port",
            "0",
            "--cluster",
            file_b.arg(),
            "--group",
            "b",
        ],
    );
    let (old, new) = (Ring::new(["a", "b", "c"]), Ring::new(["a", "b"]));
    let owners = |k: &String| {
        (
            old.owner(key_hash(k.as_bytes())),
            new.owner(key_hash(k.as_bytes())),
        )
    };
    let keys: Vec<String> = (0..).map(|i| format!("moved-{i}")).take(400).collect();
    let stays = keys
        .iter()
        .find(|k| owners(k) == ("a", "a"))
        .expect("a key of a");
    let moved = keys
        .iter()
        .find(|k| owners(k) == ("c", "a"))
        .expect("a key of c, then a");
    let resp = b.resp_addr.expect("resp").port();
    // B's connection to A opens under the shared layout and is used.
    let said = redis_throttle(resp, stays);
    assert!(said.starts_with("0\n"), "granted through B: {said}");
    file_b.write(&both);
    let out = sluice_cli(&b, &["reload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = redis_throttle(resp, moved);
    assert!(
        said.contains("TRYAGAIN"),
        "refused, not decided by A: {said}"
    );
    assert!(said.contains("layout mismatch"), "{said}");
    drop(a);
}

/// What an operator reads: `sluice role --json` names the cluster the node
/// knows, `sluice --addr ANY route KEY` answers through any node, and the
/// admin port counts forwards by group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_route_and_metrics_show_the_cluster() {
    let cluster = TwoGroups::start(true).await;
    let role = json_object(&sluice_cli(&cluster.nodes[3], &["role", "--json"]));
    let c = &role["cluster"];
    assert_eq!(c["group"], "b", "{role:?}");
    assert_eq!(c["layout"].as_str().map(str::len), Some(16), "{role:?}");
    let names: Vec<&str> = c["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["a", "b"], "{role:?}");
    let key = &cluster.keys_of("b", "route", 1)[0];
    let b = cluster.nodes[2].addr.to_string();
    for node in &cluster.nodes {
        let out = sluice_cli(node, &["route", key]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(said.trim(), format!("{key} group=b node={b}"), "{out:?}");
    }
    // A b key through a's primary is forwarded and counted there.
    let (grants, _) = resp_round_robin(&cluster, "metrics");
    assert!(grants.iter().all(|(_, n)| *n == 5), "{grants:?}");
    let (_, scrape) = http_get(cluster.nodes[0].admin_addr.expect("admin"), "/metrics");
    let to_b = metric_sample(&scrape, "sluice_forwarded_requests_total{group=\"b\"}");
    assert!(to_b >= 1.0, "{scrape}");
    assert!(metric_sample(&scrape, "sluice_forward_seconds_count") >= to_b);
    // a's primary decides a's keys itself: it never forwards to a.
    assert!(
        !scrape.contains("sluice_forwarded_requests_total{group=\"a\"}"),
        "{scrape}"
    );
}

/// kill -9 of group b's primary while a's nodes forward b's keys: the
/// sync promise holds through the entry point. Every admission a client
/// saw was acknowledged by b's follower, so after its promotion the keys
/// admit only what is left: never more than the burst in all; and no
/// more is lost than the spends whose outcome was unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_an_owner_under_forwarded_load_keeps_the_sync_promise() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let mut cluster = TwoGroups::start(true).await;
    const BURST: u64 = 1_000;
    let policy = Policy::new(1, 3_600_000_000_000, BURST).unwrap();
    let keys: Arc<Vec<String>> = Arc::new(cluster.keys_of("b", "kill", 8));
    let config = ClientConfig {
        deadline: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    // Load through a's primary and a's follower (both entry points).
    let admitted: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let unknown = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut load = tokio::task::JoinSet::new();
    for (w, entry) in [
        cluster.nodes[0].addr,
        cluster.nodes[1].addr,
        cluster.nodes[0].addr,
    ]
    .into_iter()
    .enumerate()
    {
        let client = Client::connect_with(entry, config.clone()).await.unwrap();
        let (keys, admitted, unknown) = (keys.clone(), admitted.clone(), unknown.clone());
        let errors = errors.clone();
        load.spawn(async move {
            let start = std::time::Instant::now();
            let mut i = w;
            while start.elapsed() < Duration::from_millis(1_500) {
                i += 1;
                let k = i % keys.len();
                match client.throttle(keys[k].as_bytes(), policy, 1).await {
                    Ok(v) if v.allowed => {
                        admitted[k].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let status = e.status();
                        if status == Some(sluice_protocol::Status::OutcomeUnknown) {
                            unknown.fetch_add(1, Ordering::Relaxed);
                        } else {
                            assert_eq!(
                                status,
                                Some(sluice_protocol::Status::GroupUnavailable),
                                "{e}"
                            );
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        });
    }
    let sum = |a: &[AtomicU64]| a.iter().map(|n| n.load(Ordering::Relaxed)).sum::<u64>();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.nodes[2].kill9();
    let at_kill = sum(&admitted);
    let out = sluice_cli(&cluster.nodes[3], &["promote"]);
    assert!(out.status.success(), "{out:?}");
    while let Some(r) = load.join_next().await {
        r.expect("a load task");
    }
    // The load ran on both sides of the kill: the forwarders found the
    // promoted follower by themselves.
    let after_load = sum(&admitted);
    assert!(
        at_kill > 0 && at_kill < BURST * keys.len() as u64,
        "{at_kill}"
    );
    assert!(
        after_load > at_kill,
        "nothing admitted after the kill: {at_kill}"
    );
    // Spend what is left of every key through a's primary.
    let client = Client::connect_with(cluster.nodes[0].addr, config)
        .await
        .unwrap();
    for (k, key) in keys.iter().enumerate() {
        for _ in 0..BURST + 5 {
            if client
                .throttle(key.as_bytes(), policy, 1)
                .await
                .unwrap()
                .allowed
            {
                admitted[k].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let total: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let unknown = unknown.load(Ordering::Relaxed);
    for (k, n) in total.iter().enumerate() {
        assert!(
            *n <= BURST,
            "key {}: admitted {n} of {BURST}: {total:?}",
            keys[k]
        );
    }
    let lost = BURST * keys.len() as u64 - total.iter().sum::<u64>();
    assert!(
        lost <= unknown,
        "lost {lost} units, unknown outcomes {unknown}"
    );
    // Every error the load heard was a forward's, counted by its kind on
    // the entry node that forwarded it.
    let counted: f64 = cluster.nodes[..2]
        .iter()
        .map(|n| {
            let (_, scrape) = http_get(n.admin_addr.expect("admin"), "/metrics");
            ["unavailable", "outcome_unknown"]
                .iter()
                .map(|kind| {
                    let series = format!("sluice_forward_errors_total{{kind=\"{kind}\"}}");
                    metric_sample(&scrape, &series)
                })
                .sum::<f64>()
        })
        .sum();
    let heard = errors.load(Ordering::Relaxed);
    assert!(counted >= heard as f64, "counted {counted}, heard {heard}");
}

/// The Python client (clients/python, written from PROTOCOL.md alone, no
/// cluster routing of its own), connected to every node in turn: exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_through_any_node_is_exact() {
    let cluster = TwoGroups::start(true).await;
    let mut keys = cluster.keys_of("a", "py", 3);
    keys.extend(cluster.keys_of("b", "py", 3));
    let ports: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.addr.port().to_string())
        .collect();
    let script = format!(
        "import json, sys\n\
         sys.path.insert(0, {dir:?})\n\
         from sluice import Client\n\
         clients = [Client(port=int(p)) for p in {ports:?}]\n\
         granted = {{}}\n\
         for i, k in enumerate({keys:?}):\n\
         \x20   granted[k] = sum(clients[(a + i) % len(clients)].throttle(k.encode(), 1, 3600 * 10**9, 4).allowed for a in range(10))\n\
         print(json.dumps(granted))\n",
        dir = root().join("../clients/python").display().to_string(),
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let granted: serde_json::Value = serde_json::from_str(&said).expect("JSON");
    for k in &keys {
        assert_eq!(granted[k], 4, "{k}: {said}");
    }
}

/// SIGSTOP of b's primary under calls forwarded by a's primary, b's
/// follower promoted at once: how long after the stop the first forwarded
/// call is answered by the new primary, with the entry point started with
/// `extra` (and a 3 s forward deadline), calls sent for `window`.
async fn first_forwarded_answer_after_a_stop(extra: &[&str], window: Duration) -> Duration {
    // A forward deadline far above the stall threshold (250 ms, the
    // cluster client's default), so that the two are told apart.
    let args = [&["--forward-deadline-ms", "3000"][..], extra].concat();
    let cluster = TwoGroups::start_with(true, &args).await;
    let policy = Policy::new(1, 3_600_000_000_000, 50_000).unwrap();
    let key = cluster.keys_of("b", "stall", 1).remove(0);
    let config = ClientConfig {
        deadline: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    // Through a's primary: every call of b's key is forwarded.
    let client = Client::connect_with(cluster.nodes[0].addr, config.clone())
        .await
        .unwrap();
    assert!(
        client
            .throttle(key.as_bytes(), policy, 1)
            .await
            .unwrap()
            .allowed
    );
    let mut set = tokio::task::JoinSet::new();
    let start = std::time::Instant::now();
    let mut stopped = None;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    while start.elapsed() < window {
        tick.tick().await;
        if stopped.is_none() && start.elapsed() >= Duration::from_millis(300) {
            cluster.nodes[2].signal("STOP");
            stopped = Some(std::time::Instant::now());
            let out = sluice_cli(&cluster.nodes[3], &["promote"]);
            assert!(out.status.success(), "{out:?}");
        }
        // A connection per call: replies keep their order on a
        // connection, so a call queued behind one stuck on the stopped
        // node waits for it whatever the forwarder does.
        let (config, key, entry) = (config.clone(), key.clone(), cluster.nodes[0].addr);
        set.spawn(async move {
            let sent = std::time::Instant::now();
            let config = ClientConfig {
                shard_aware: false,
                ..config
            };
            let ok = match Client::connect_with(entry, config).await {
                Ok(c) => c.throttle(key.as_bytes(), policy, 1).await.is_ok(),
                Err(_) => false,
            };
            (sent, sent.elapsed(), ok)
        });
    }
    let stopped = stopped.unwrap();
    let mut first = None::<std::time::Instant>;
    while let Some(r) = set.join_next().await {
        let (sent, took, ok) = r.unwrap();
        if ok && sent >= stopped {
            let at = sent + took;
            first = Some(first.map_or(at, |f| f.min(at)));
        }
    }
    let first = first.expect("the promoted follower answered forwarded calls") - stopped;
    eprintln!(
        "first forwarded answer from b's new primary {} ms after SIGSTOP ({extra:?})",
        first.as_millis()
    );
    cluster.nodes[2].signal("CONT");
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_owner_costs_forwarded_calls_the_stall_threshold_not_the_deadline() {
    let first = first_forwarded_answer_after_a_stop(&[], Duration::from_millis(2_000)).await;
    // The stall threshold, the promote command, a search: well under
    // the 3 s forward deadline that would bound it without the watch.
    assert!(
        first <= Duration::from_millis(250 + 400),
        "{} ms",
        first.as_millis()
    );
}

/// The same with the entry point's stall watch off
/// (`--forward-stall-after-ms 0`): the calls queued on the stopped node
/// wait out the forward deadline before the new primary is looked for.
/// The test above fails this way without the watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_stall_watch_a_stopped_owner_costs_forwarded_calls_the_deadline() {
    let first = first_forwarded_answer_after_a_stop(
        &["--forward-stall-after-ms", "0"],
        Duration::from_millis(4_500),
    )
    .await;
    assert!(
        first >= Duration::from_millis(2_000),
        "{} ms: answered before the deadline without the watch",
        first.as_millis()
    );
}

/// A primary stopped past its lease while its follower took over: the
/// ShouldRateLimit calls its rate limit port took in while stopped are
/// refused when it resumes, not admitted from its stale buckets behind the
/// new primary's back. (The port skips the node's own admission check on
/// an entry point, so that it can forward; the shard that would apply a
/// change checks, whatever thread the change came from.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_primary_admits_nothing_its_rate_limit_port_took_in_while_stopped() {
    let cluster = TwoGroups::start_full(true, &[], &["--promote-after-ms", "300"]).await;
    let value = cluster.values_of("a", "user", "stale", 1).remove(0);
    let (old, new) = (&cluster.nodes[0], &cluster.nodes[1]);
    old.signal("STOP");
    wait_role(new.addr, Duration::from_secs(10), |r| {
        r.role == sluice_client::Role::Primary
    })
    .await;
    // Five calls wait in the stopped primary's socket.
    let mut queued = Command::new(python())
        .arg(root().join("cluster/entry_check.py"))
        .args(["queue", "5", &value, "--"])
        .arg(old.rls_addr.expect("rls").port().to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut out = std::io::BufReader::new(queued.stdout.take().expect("piped"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "sent");
    // The new primary grants the value its five.
    let new_port = new.rls_addr.expect("rls").port().to_string();
    let (grants, errors) = granted(&check(&["rls", "5", &value], &[new_port]));
    assert_eq!((grants, errors), (vec![(value.clone(), 5)], 0));
    old.signal("CONT");
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(queued.wait().unwrap().success());
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let (grants, errors) = granted(&v);
    assert_eq!(
        grants,
        vec![(value, 0)],
        "the stale primary admitted from its own buckets: {v}"
    );
    assert_eq!(errors, 5, "{v}");
}

/// Sends `CL.THROTTLE key 4 5 3600 quantity` (a burst of 5 an hour) on a
/// raw RESP connection.
fn send_throttle(c: &mut std::net::TcpStream, key: &str, quantity: u64) {
    use std::io::Write;
    let quantity = quantity.to_string();
    let args = ["CL.THROTTLE", key, "4", "5", "3600", &quantity];
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    c.write_all(cmd.as_bytes()).unwrap();
}

/// The next CL.THROTTLE reply on a raw RESP connection, whole: an array
/// of five integers, or an error line.
fn read_throttle(c: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n") || got.starts_with(b"*") && got.split(|&b| b == b'\n').count() < 7
    {
        let mut byte = [0u8; 1];
        assert_eq!(c.read(&mut byte).expect("a reply"), 1, "closed");
        got.push(byte[0]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The forwards a node's thread makes in one turn of its loop share one
/// batch, whichever connections they came from: 16 Redis clients that
/// do not pipeline, one CL.THROTTLE each for keys of group b, sent to a's
/// primary while it is stopped (SIGSTOP), so that every command is
/// waiting when it resumes. The 16 requests are forwarded in a few
/// batches (the node's two shard threads each forward their connections'
/// in one turn), where each connection's read was a batch of its own
/// before (the test fails with 16), and each connection gets its own
/// answer back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_of_forwards_is_one_batch_whatever_the_connections() {
    use std::net::TcpStream;
    let cluster = TwoGroups::start(true).await;
    let node = &cluster.nodes[0];
    let resp = node.resp_addr.expect("resp");
    let admin = node.admin_addr.expect("admin");
    // *5 and five integers: allowed (0), the limit (5), remaining (a
    // key's first spend: 5 - quantity), ...
    let granted = |c: &mut TcpStream, key: &str, quantity: u64| {
        let text = read_throttle(c);
        let head = format!("*5\r\n:0\r\n:5\r\n:{}\r\n", 5 - quantity);
        assert!(text.starts_with(&head), "{key}: {text:?}, not {head:?}");
    };
    let mut conns = Vec::new();
    for key in cluster.keys_of("b", "warm", 16) {
        let mut c = TcpStream::connect(resp).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Accepted and served before the stop, and every thread's
        // forwarding connections open: a forwarded call answered.
        send_throttle(&mut c, &key, 1);
        granted(&mut c, &key, 1);
        conns.push(c);
    }
    let counts = || {
        let (_, s) = http_get(admin, "/metrics");
        (
            metric_sample(&s, "sluice_forwarded_requests_total{group=\"b\"}"),
            metric_sample(&s, "sluice_forward_batches_total"),
        )
    };
    let before = counts();
    let keys = cluster.keys_of("b", "turn", 16);
    node.signal("STOP");
    // Each connection spends its own quantity, so that an answer given
    // to the wrong connection shows.
    let quantity = |i: usize| 1 + (i % 4) as u64;
    for (i, (c, key)) in conns.iter_mut().zip(&keys).enumerate() {
        send_throttle(c, key, quantity(i));
    }
    node.signal("CONT");
    for (i, (c, key)) in conns.iter_mut().zip(&keys).enumerate() {
        granted(c, key, quantity(i));
    }
    let after = counts();
    assert_eq!(after.0 - before.0, 16.0, "requests forwarded");
    let batches = after.1 - before.1;
    assert!(
        (1.0..=6.0).contains(&batches),
        "16 forwards made in one turn went in {batches} batches"
    );
}

/// A group slow to answer holds up only the connections that asked it,
/// even when other connections' forwards were made in the same turn: b's
/// primary stopped (SIGSTOP, no stall watch, a 3 s forward deadline), a's
/// follower (which forwards a's keys to a's primary and b's to b's) stopped
/// too while 8 connections send it one CL.THROTTLE of an a key and 8 one of
/// a b key. When it resumes, every a key is answered long before b's
/// deadline passes (with the turn's forwards sent as one batch whatever
/// their groups, every a key waited out b's 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_group_holds_up_only_the_connections_that_asked_it() {
    let flags = [
        "--forward-deadline-ms",
        "3000",
        "--forward-stall-after-ms",
        "0",
    ];
    let cluster = TwoGroups::start_with(true, &flags).await;
    let entry = &cluster.nodes[1];
    let resp = entry.resp_addr.expect("resp");
    // Two of each kind in turn, so that both shard threads get both.
    let keys_a = cluster.keys_of("a", "hol", 8);
    let keys_b = cluster.keys_of("b", "hol", 8);
    let mut conns = Vec::new();
    for i in 0..16 {
        let kind = (i / 2) % 2;
        let key = if kind == 0 {
            &keys_a[i / 4 * 2 + i % 2]
        } else {
            &keys_b[i / 4 * 2 + i % 2]
        };
        let mut c = std::net::TcpStream::connect(resp).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Accepted, and every thread's forwarding connections open.
        send_throttle(&mut c, &format!("{key}-warm"), 1);
        let first = read_throttle(&mut c);
        assert!(first.starts_with("*5"), "{first:?}");
        conns.push((c, kind, key.clone()));
    }
    cluster.nodes[2].signal("STOP");
    entry.signal("STOP");
    for (c, _, key) in &mut conns {
        send_throttle(c, key, 1);
    }
    let resumed = std::time::Instant::now();
    entry.signal("CONT");
    let mut slowest_a = Duration::ZERO;
    for (c, kind, key) in &mut conns {
        if *kind == 0 {
            let text = read_throttle(c);
            assert!(text.starts_with("*5\r\n:0\r\n"), "{key}: {text:?}");
            slowest_a = slowest_a.max(resumed.elapsed());
        }
    }
    for (c, kind, key) in &mut conns {
        if *kind == 1 {
            let text = read_throttle(c);
            assert!(
                text.starts_with('-'),
                "{key} answered by a stopped node: {text:?}"
            );
        }
    }
    cluster.nodes[2].signal("CONT");
    assert!(
        slowest_a < Duration::from_millis(1_500),
        "a's keys waited {} ms on b's stopped primary",
        slowest_a.as_millis()
    );
}

/// Every forwarded CL.THROTTLE gets its own answer under pipelined load,
/// whichever threads forward: each shard thread over its own connections
/// (the default: a read's forwards join its thread's turn as they are
/// read), and one shared set on the forwarder's thread
/// (`--forward-connections shared`), whose task takes a turn's forwards
/// while the shards are still reading. 8 Redis clients each pipeline
/// windows of 32 commands on keys of group b to a's primary, every key
/// spent once at its own quantity (1 to 4), so that an answer given to
/// another command, or lost, shows. (With shared connections a read's
/// forwards pushed straight onto a turn's batch that the other thread
/// took meanwhile were lost, and the shard panicked: this failed so until
/// such reads went back to a batch of their own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_forwards_each_get_their_own_answer_whichever_threads_forward() {
    for extra in [&[][..], &["--forward-connections", "shared"][..]] {
        let cluster = TwoGroups::start_with(true, extra).await;
        let wrong = pipelined_forwards(&cluster);
        assert!(
            wrong.is_empty(),
            "{extra:?}: {} answers wrong, first: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(3)]
        );
    }
}

/// The load of the test above; the answers that were not their
/// command's.
fn pipelined_forwards(cluster: &TwoGroups) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let resp = cluster.nodes[0].resp_addr.expect("resp");
    const CONNS: usize = 8;
    const WINDOWS: usize = 24;
    const WINDOW: usize = 32;
    let keys = cluster.keys_of("b", "shared", CONNS * WINDOWS * WINDOW);
    let quantity = |i: usize| 1 + (i % 4) as u64;
    let threads: Vec<_> = keys
        .chunks(WINDOWS * WINDOW)
        .enumerate()
        .map(|(c, keys)| {
            let keys = keys.to_vec();
            std::thread::spawn(move || {
                let mut out = std::net::TcpStream::connect(resp).expect("connect");
                out.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut input = BufReader::new(out.try_clone().unwrap());
                let mut wrong = Vec::new();
                for (w, window) in keys.chunks(WINDOW).enumerate() {
                    let mut cmds = String::new();
                    for (k, key) in window.iter().enumerate() {
                        let q = quantity(c + w + k).to_string();
                        let args = ["CL.THROTTLE", key, "4", "5", "3600", &q];
                        cmds.push_str(&format!("*{}\r\n", args.len()));
                        for a in args {
                            cmds.push_str(&format!("${}\r\n{a}\r\n", a.len()));
                        }
                    }
                    out.write_all(cmds.as_bytes()).unwrap();
                    for (k, key) in window.iter().enumerate() {
                        let mut reply = String::new();
                        input.read_line(&mut reply).expect("a reply");
                        if reply.starts_with('*') {
                            for _ in 0..5 {
                                input.read_line(&mut reply).expect("a reply");
                            }
                        }
                        let q = quantity(c + w + k);
                        let head = format!("*5\r\n:0\r\n:5\r\n:{}\r\n", 5 - q);
                        if !reply.starts_with(&head) {
                            wrong.push(format!("{key} (quantity {q}): {reply:?}"));
                        }
                    }
                }
                wrong
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}
