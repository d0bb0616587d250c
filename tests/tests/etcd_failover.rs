//! Leadership on etcd (`--coordinator`), against real processes: an etcd
//! of the test's own and sluiced pairs whose primary is whoever holds the
//! group's leader key.
//!
//! - kill -9 of a primary (three groups): the follower takes the key within
//!   the TTL plus a margin, 0 units over in sync mode, the other groups
//!   untouched, the dead node back as follower.
//! - SIGSTOP of a primary: the follower takes over; after SIGCONT the old
//!   primary admits nothing and steps down to follow. A gateway's cluster
//!   client (layout from etcd) under load sends new calls to the new
//!   primary as soon as it admits, not after its deadline, and stays there.
//! - etcd stopped: no second primary ever appears, the primary stops
//!   admitting once its lease could have run out, and leadership comes back
//!   with etcd.
//! - A follower cut off from its primary, which then serves alone and
//!   dies, never takes over (its copy lacks what the primary admitted
//!   alone), until an operator deletes the group's `last` key.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_client::{inline_limits, Limits, ReplState, Role, RoleOk};
use sluice_tests::etcd::{self, Etcd, TTL_S};
use sluice_tests::repl::{self, spend, Proxy, Tally, Until};
use sluice_tests::support::{self, specs, Sluiced};

/// The limit spent: no refill within the test.
const LIMIT: u64 = 300;

fn limits() -> Limits<'static> {
    inline_limits(&specs(&[&format!("token-bucket:1/h,burst={LIMIT}")])).unwrap()
}

/// Whether a node's ROLE says it admits.
fn admits(r: &RoleOk) -> bool {
    r.role == Role::Primary && r.state != ReplState::Fenced
}

/// Each node's ROLE (None where it did not answer).
async fn roles(addrs: &[SocketAddr]) -> Vec<Option<RoleOk>> {
    let mut out = Vec::new();
    for &a in addrs {
        let asked = tokio::time::timeout(Duration::from_millis(500), repl::role(a)).await;
        out.push(asked.ok().and_then(Result::ok));
    }
    out
}

/// Waits until one of `pair` admits and the other follows it streaming;
/// returns the primary's index.
async fn settled(pair: [SocketAddr; 2], timeout: Duration) -> usize {
    let start = Instant::now();
    loop {
        let r = roles(&pair).await;
        for p in 0..2 {
            let (Some(a), Some(b)) = (&r[p], &r[1 - p]) else {
                continue;
            };
            if admits(a) && b.role == Role::Follower && b.state == ReplState::Streaming {
                return p;
            }
        }
        assert!(start.elapsed() < timeout, "group never settled: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the primary of `group` has recorded in etcd that
/// `follower` has a complete copy: only then may it take over.
async fn in_sync_in_etcd(etcd: &Etcd, group: &str, follower: SocketAddr) {
    let record = format!("/sluice/default/groups/{group}/synced/{follower}");
    let until = Instant::now() + Duration::from_secs(10);
    while etcd.count(&record) == 0 {
        assert!(Instant::now() < until, "no synced record for {follower}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a pair of `group` on fixed ports.
fn pair(etcd: &Etcd, group: &str, args: &[&str]) -> ([Sluiced; 2], [u16; 2]) {
    let ports = [support::port(), support::port()];
    let nodes = ports.map(|p| etcd::node(etcd, group, p, args));
    (nodes, ports)
}

/// The longest a takeover may take: the TTL (the old key must expire), a
/// poll, and room for a loaded machine.
fn takeover_max() -> Duration {
    Duration::from_secs(TTL_S) + Duration::from_millis(2_500)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_a_primary_promotes_its_follower_within_the_ttl_and_loses_nothing() {
    let etcd = Etcd::start();
    let args = ["--shards", "2", "--replication", "sync"];
    let mut groups = Vec::new();
    for g in ["g0", "g1", "g2"] {
        groups.push(pair(&etcd, g, &args));
    }
    let mut primaries = Vec::new();
    for (g, (nodes, _)) in groups.iter().enumerate() {
        let p = settled([nodes[0].addr, nodes[1].addr], Duration::from_secs(30)).await;
        in_sync_in_etcd(&etcd, &format!("g{g}"), nodes[1 - p].addr).await;
        primaries.push(p);
    }
    // Epochs are etcd revisions: every group's differs, all are positive.
    let mut epochs = Vec::new();
    for (i, (nodes, _)) in groups.iter().enumerate() {
        epochs.push(repl::role(nodes[primaries[i]].addr).await.unwrap().epoch);
    }
    assert!(epochs.iter().all(|&e| e > 0), "{epochs:?}");
    epochs.sort_unstable();
    epochs.dedup();
    assert_eq!(epochs.len(), 3, "one revision per leader key");

    // Load on group g1's primary, then kill -9 in the middle of it.
    let (nodes, _) = &mut groups[1];
    let p = primaries[1];
    let f = 1 - p;
    let tally = Arc::new(Tally::default());
    let target = Arc::new(Mutex::new(nodes[p].addr));
    let load = tokio::spawn(spend(
        target.clone(),
        b"etcd:kill",
        limits(),
        tally.clone(),
        16,
        Until::Error,
        Duration::from_secs(30),
    ));
    let start = Instant::now();
    while tally.admitted() < LIMIT / 2 && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    nodes[p].kill9();
    let killed = Instant::now();
    load.await.unwrap();
    let follower = nodes[f].addr;
    loop {
        if let Ok(r) = repl::role(follower).await {
            if admits(&r) {
                break;
            }
        }
        assert!(
            killed.elapsed() < takeover_max(),
            "no takeover within {:?}",
            takeover_max()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = killed.elapsed();
    println!("takeover after kill -9: {took:?} (TTL {TTL_S} s)");
    assert!(
        took >= Duration::from_millis(TTL_S * 1_000 / 2),
        "took over in {took:?}: before the old lease could have expired"
    );
    // Spend the rest on the new primary: never more than the limit.
    *target.lock().unwrap() = follower;
    spend(
        target,
        b"etcd:kill",
        limits(),
        tally.clone(),
        16,
        Until::Denied,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        tally.admitted() <= LIMIT,
        "over-admitted: {}",
        tally.admitted()
    );
    // Not much lost either: at most the calls of unknown outcome.
    assert!(
        tally.admitted() + tally.unknown() >= LIMIT,
        "admitted {} + unknown {} < {LIMIT}",
        tally.admitted(),
        tally.unknown()
    );

    // The other groups kept their primaries.
    for g in [0, 2] {
        let (nodes, _) = &groups[g];
        let r = repl::role(nodes[primaries[g]].addr).await.unwrap();
        assert!(admits(&r), "group {g}: {r:?}");
    }
    // The dead node comes back with its usual command line: as follower.
    let (nodes, ports) = &mut groups[1];
    nodes[p] = etcd::node(&etcd, "g1", ports[p], &args);
    let back = settled([nodes[0].addr, nodes[1].addr], Duration::from_secs(30)).await;
    assert_eq!(back, f, "the new primary stays primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_admits_nothing_after_sigcont_and_steps_down() {
    let etcd = Etcd::start();
    let (nodes, _) = pair(&etcd, "g", &["--shards", "1"]);
    let addrs = [nodes[0].addr, nodes[1].addr];
    let p = settled(addrs, Duration::from_secs(30)).await;
    in_sync_in_etcd(&etcd, "g", addrs[1 - p]).await;
    let before = repl::role(addrs[p]).await.unwrap().epoch;
    nodes[p].signal("STOP");
    let stopped = Instant::now();
    loop {
        if let Ok(r) = repl::role(addrs[1 - p]).await {
            if admits(&r) {
                assert!(r.epoch > before, "{r:?}");
                break;
            }
        }
        assert!(stopped.elapsed() < takeover_max(), "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nodes[p].signal("CONT");
    // At once: its lease ran out while it was stopped, so it admits nothing.
    let client = repl::control(addrs[p]).await.unwrap();
    let got = client.spend(b"etcd:pause", limits(), 1).await;
    assert!(got.is_err(), "a resumed stale primary admitted: {got:?}");
    // And it steps down to follow the new primary.
    let back = settled(addrs, Duration::from_secs(20)).await;
    assert_eq!(back, 1 - p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_stopped_no_second_primary_ever_appears() {
    let etcd = Etcd::start();
    let (_nodes, _) = pair(&etcd, "g", &["--shards", "1"]);
    let addrs = [_nodes[0].addr, _nodes[1].addr];
    let p = settled(addrs, Duration::from_secs(30)).await;
    etcd.signal("STOP");
    let stopped = Instant::now();
    let mut primary_stopped_at = None;
    // For three TTLs: never two admitting at once; the primary stops
    // admitting once its lease could have run out.
    while stopped.elapsed() < Duration::from_secs(3 * TTL_S) {
        let r = roles(&addrs).await;
        let admitting = r.iter().flatten().filter(|r| admits(r)).count();
        assert!(admitting <= 1, "two primaries admit: {r:?}");
        if primary_stopped_at.is_none() && !r[p].as_ref().is_some_and(admits) {
            primary_stopped_at = Some(stopped.elapsed());
        }
        assert!(
            !r[1 - p].as_ref().is_some_and(admits),
            "the follower took over without etcd: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let at = primary_stopped_at.expect("the primary stopped admitting");
    assert!(
        at <= Duration::from_millis(TTL_S * 1_000 / 2 + 1_000),
        "the primary admitted for {at:?} without renewing"
    );
    // Leadership comes back with etcd.
    etcd.signal("CONT");
    etcd.wait_healthy();
    settled(addrs, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_a_primary_that_then_served_alone_never_takes_over() {
    let etcd = Etcd::start();
    let group = "/sluice/default/groups/g/";
    // The primary advertises a proxy in front of it: its follower connects
    // through the proxy, which the test severs; clients go straight to it.
    let front = Proxy::unbound().await.expect("proxy");
    let port = support::port();
    front.set_target(SocketAddr::from(([127, 0, 0, 1], port)));
    let advertised = front.addr.to_string();
    let args = ["--shards", "1", "--replication", "sync"];
    let primary = etcd::node_advertising(&etcd, "g", port, &advertised, &args);
    let until = Instant::now() + Duration::from_secs(30);
    while !repl::role(primary.addr).await.is_ok_and(|r| admits(&r)) {
        assert!(Instant::now() < until, "the first node never led");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let follower = etcd::node(&etcd, "g", support::port(), &args);
    let addrs = [primary.addr, follower.addr];
    assert_eq!(settled(addrs, Duration::from_secs(30)).await, 0);
    // The primary records in etcd that its follower has a complete copy.
    in_sync_in_etcd(&etcd, "g", follower.addr).await;
    let record = format!("{group}synced/{}", follower.addr);

    // Cut the link: the primary erases the record, then admits alone.
    front.sever();
    let until = Instant::now() + Duration::from_secs(10);
    while etcd.count(&record) != 0 {
        assert!(Instant::now() < until, "the record outlived the link");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tally = Arc::new(Tally::default());
    spend(
        Arc::new(Mutex::new(primary.addr)),
        b"etcd:alone",
        limits(),
        tally.clone(),
        4,
        Until::Denied,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(tally.admitted(), LIMIT, "the primary served alone");
    let mut primary = primary;
    primary.kill9();

    // Its follower lacks all of that: it must not take over, however long
    // the key has been gone.
    let killed = Instant::now();
    while killed.elapsed() < takeover_max() + Duration::from_secs(TTL_S) {
        let r = repl::role(follower.addr)
            .await
            .expect("the follower answers");
        assert!(
            !admits(&r),
            "a follower without the primary's last admissions took over: {r:?}"
        );
        assert_eq!(etcd.count(&record), 0, "the follower's record came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The operator's way out (README): deleting `last` says that nothing
    // admitted needs keeping; the follower then takes over.
    etcd.delete(&format!("{group}last"));
    let deleted = Instant::now();
    while !repl::role(follower.addr).await.is_ok_and(|r| admits(&r)) {
        assert!(
            deleted.elapsed() < Duration::from_secs(10),
            "no takeover after the operator's delete"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_client_picks_up_a_group_added_in_etcd() {
    let etcd = Etcd::start();
    let (g0, _) = pair(&etcd, "g0", &["--shards", "1"]);
    settled([g0[0].addr, g0[1].addr], Duration::from_secs(30)).await;
    let config = sluice_client::ClusterConfig {
        client: sluice_client::ClientConfig {
            deadline: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            ..Default::default()
        },
        ..Default::default()
    };
    let cluster = sluice_client::Cluster::from_etcd(&etcd.url(), config)
        .await
        .expect("the layout from etcd");
    let keys: Vec<String> = (0..64).map(|i| format!("user:{i}")).collect();
    for k in &keys {
        assert_eq!(cluster.route(k.as_bytes()).0, "g0");
    }
    // A second group registers in etcd; the running client routes to it.
    let (g1, _) = pair(&etcd, "g1", &["--shards", "1"]);
    let p1 = settled([g1[0].addr, g1[1].addr], Duration::from_secs(30)).await;
    let start = Instant::now();
    let moved = loop {
        if let Some(k) = keys.iter().find(|k| cluster.route(k.as_bytes()).0 == "g1") {
            break k.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the client never saw group g1"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let v = cluster
        .spend(moved.as_bytes(), limits(), 1)
        .await
        .expect("a verdict");
    assert_eq!(v.group, "g1");
    assert_eq!(v.source, sluice_client::Source::Store, "{v:?}");
    assert_eq!(v.node.as_deref(), Some(g1[p1].addr.to_string().as_str()));
}

/// Every etcd-coordinated node is an entry point (membership from etcd,
/// no file): a group that registers later is routed to by the running
/// nodes, and a Redis client asking g0's primary for a key of g1 spends
/// g1's bucket, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_entry_points_route_to_a_group_added_in_etcd() {
    let etcd = Etcd::start();
    let (g0, _) = pair(&etcd, "g0", &["--shards", "1", "--resp-port", "0"]);
    let p0 = settled([g0[0].addr, g0[1].addr], Duration::from_secs(30)).await;
    let (g1, _) = pair(&etcd, "g1", &["--shards", "1", "--resp-port", "0"]);
    let p1 = settled([g1[0].addr, g1[1].addr], Duration::from_secs(30)).await;
    // The key that g1 owns, as g0's primary routes it once it saw g1.
    let ring = sluice_protocol::ring::Ring::new(["g0", "g1"]);
    let key = (0..)
        .map(|i| format!("user:{i}"))
        .find(|k| ring.owner(sluice_protocol::routing::key_hash(k.as_bytes())) == "g1")
        .expect("a key of g1");
    let start = Instant::now();
    loop {
        let out = support::sluice_cli(&g0[p0], &["route", &key]);
        if String::from_utf8_lossy(&out.stdout).contains("group=g1") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{out:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cli = |node: &Sluiced| {
        let port = node.resp_addr.expect("resp").port().to_string();
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port, "CL.THROTTLE", &key, "2", "1", "3600"])
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .map(str::to_owned)
    };
    // Through g0's primary and follower in turn: 3 granted (max_burst 2).
    let granted = (0..6)
        .filter(|i| cli(&g0[(p0 + i) % 2]).as_deref() == Some("0"))
        .count();
    assert_eq!(granted, 3);
    // g1's primary holds the bucket: nothing left there either.
    assert_eq!(cli(&g1[p1]).as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_moves_off_a_stopped_primary_as_soon_as_the_follower_leads() {
    let etcd = Etcd::start();
    let (nodes, _) = pair(&etcd, "g", &["--shards", "1"]);
    let addrs = [nodes[0].addr, nodes[1].addr];
    let p = settled(addrs, Duration::from_secs(30)).await;
    in_sync_in_etcd(&etcd, "g", addrs[1 - p]).await;
    // A deadline longer than the takeover (the TTL): without stall
    // detection and a search that waits for no stopped member, every call
    // would wait it out, and the first search would too.
    let deadline = Duration::from_secs(5);
    let config = sluice_client::ClusterConfig {
        client: sluice_client::ClientConfig {
            deadline,
            connect_timeout: deadline,
            ..Default::default()
        },
        ..Default::default()
    };
    let cluster = sluice_client::Cluster::from_etcd(&etcd.url(), config)
        .await
        .expect("the layout from etcd");
    let new = addrs[1 - p].to_string();
    let mut set = tokio::task::JoinSet::new();
    let start = Instant::now();
    let mut stopped = None;
    let mut took_over = None;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while start.elapsed() < Duration::from_secs(1) + takeover_max() + Duration::from_secs(1) {
        tick.tick().await;
        if stopped.is_none() && start.elapsed() >= Duration::from_secs(1) {
            nodes[p].signal("STOP");
            stopped = Some(Instant::now());
        }
        if stopped.is_some() && took_over.is_none() {
            if let Ok(Ok(r)) =
                tokio::time::timeout(Duration::from_millis(5), repl::role(addrs[1 - p])).await
            {
                if admits(&r) {
                    took_over = Some(Instant::now());
                }
            }
        }
        let cluster = cluster.clone();
        set.spawn(async move {
            let sent = Instant::now();
            let v = cluster.spend(b"etcd:stall", limits(), 1).await.unwrap();
            (sent, sent.elapsed(), v)
        });
    }
    let stopped = stopped.unwrap();
    let took_over = took_over.expect("the follower took over");
    let mut calls = Vec::new();
    while let Some(c) = set.join_next().await {
        calls.push(c.unwrap());
    }
    let on_new = |v: &sluice_client::ClusterVerdict| {
        v.source == sluice_client::Source::Store && v.node.as_deref() == Some(new.as_str())
    };
    let first = calls
        .iter()
        .filter(|(sent, _, v)| *sent >= stopped && on_new(v))
        .map(|(sent, took, _)| *sent + *took)
        .min()
        .expect("the new primary answered");
    eprintln!(
        "took over {} ms after SIGSTOP, first answer from it {} ms after",
        (took_over - stopped).as_millis(),
        (first - stopped).as_millis()
    );
    // The takeover is seen by a poll every 10 ms; then the stall watch (or
    // etcd's watch) finds it within a search interval.
    assert!(
        first <= took_over + Duration::from_millis(500),
        "first answer from the new primary {} ms after it took over",
        first.saturating_duration_since(took_over).as_millis()
    );
    // And it stays there.
    for (sent, _, v) in &calls {
        if *sent > first {
            assert!(on_new(v), "{v:?}");
        }
    }
    nodes[p].signal("CONT");
}

/// An etcd-led group over TLS: each node serves --tls-port, and follows
/// the leader etcd names at its host and --replica-tls-port (the leader
/// key carries the plain address gateways use). The first follower's
/// link, recorded, carries TLS records only; after kill -9 of the leader
/// the follower takes over, and the old leader, back, follows it over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_led_group_replicates_over_tls() {
    let [ca, cert, key] = sluice_tests::tls::ca_signed("etcd");
    let etcd = Etcd::start();
    let ports = [support::port(), support::port()];
    let tls = [support::port(), support::port()].map(|p| p.to_string());
    let node = |i: usize, follow_at: &str| {
        let args = [
            "--shards",
            "1",
            "--tls-port",
            &tls[i],
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--replica-tls-ca",
            &ca,
            "--replica-tls-port",
            follow_at,
        ];
        etcd::node(&etcd, "g", ports[i], &args)
    };
    let mut a = node(0, &tls[1]);
    let until = Instant::now() + Duration::from_secs(20);
    while !matches!(repl::role(a.addr).await, Ok(r) if admits(&r)) {
        assert!(Instant::now() < until, "the first node never led");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tls_a: SocketAddr = format!("127.0.0.1:{}", tls[0]).parse().unwrap();
    let (via, seen) = sluice_tests::tls::recording_proxy(tls_a).await;
    let b = node(1, &via.port().to_string());
    let addrs = [a.addr, b.addr];
    assert_eq!(settled(addrs, Duration::from_secs(30)).await, 0);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() > 100, "{} bytes", seen.len());
    assert!(
        sluice_tests::tls::all_tls_records(&seen),
        "clear bytes on the link"
    );

    in_sync_in_etcd(&etcd, "g", b.addr).await;
    a.kill9();
    let until = Instant::now() + takeover_max();
    while !matches!(repl::role(b.addr).await, Ok(r) if admits(&r)) {
        assert!(Instant::now() < until, "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(a);
    let _a = node(0, &tls[1]);
    assert_eq!(settled(addrs, Duration::from_secs(30)).await, 1);
    let _ = std::fs::remove_dir_all(std::path::Path::new(&ca).parent().unwrap());
}
