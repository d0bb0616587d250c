//! Failovers against real processes: kill -9 of a primary under load, then
//! promotion of its follower, for every limit kind, in sync mode (nothing a
//! client was told is lost: 0 over-admission) and async mode (over-admission
//! within the stated bound); a planned handover under load (0 lost); and
//! an old primary restarted after a takeover, which rejoins as a follower.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_client::{inline_limits, Limits, ReplState, Role};
use sluice_tests::repl::{self, spend, start_pair, wait_role, Tally, Until};
use sluice_tests::support::{specs, Sluiced};

/// The limit every kind is tested with: 500 units, refilling (where the
/// kind refills) at 1 an hour, so the test sees no refill.
const BURST: u64 = 500;
/// Concurrent callers.
const CALLERS: usize = 64;

fn limits(spec: &str) -> Limits<'static> {
    inline_limits(&specs(&[spec])).expect("one limit")
}

/// Spends through `primary` until about half the limit is admitted, kills
/// it (-9), promotes the follower, spends through it until denied, and
/// returns what the callers were told.
async fn kill_and_promote(
    mut primary: Sluiced,
    follower: &Sluiced,
    spec: &str,
    burst: u64,
) -> (Arc<Tally>, Duration) {
    let tally = Arc::new(Tally::default());
    let target = Arc::new(Mutex::new(primary.addr));
    let key: &'static [u8] = b"failover:key";
    let lim = limits(spec);
    let load = tokio::spawn(spend(
        target.clone(),
        key,
        lim,
        tally.clone(),
        CALLERS,
        Until::Error,
        Duration::from_secs(60),
    ));
    let start = Instant::now();
    while tally.admitted() < burst / 2 {
        assert!(start.elapsed() < Duration::from_secs(60), "load too slow");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let lag = repl::role(primary.addr)
        .await
        .map(|r| r.lag_us)
        .unwrap_or(0);
    let killed_at = Instant::now();
    primary.kill9();
    load.await.expect("load task");
    let epoch = repl::control(follower.addr)
        .await
        .expect("connect to follower")
        .promote()
        .await
        .expect("promote");
    assert_eq!(epoch, 1, "promotion raises the epoch");
    *target.lock().unwrap() = follower.addr;
    spend(
        target,
        key,
        lim,
        tally.clone(),
        CALLERS,
        Until::Denied,
        Duration::from_secs(60),
    )
    .await;
    eprintln!(
        "{spec}: admitted {} (limit {burst}), unknown outcome {}, lag before kill {lag} us",
        tally.admitted(),
        tally.unknown()
    );
    (tally, killed_at.elapsed())
}

async fn sync_kill(spec: &str) {
    let (primary, follower) = start_pair(&["--shards", "2"], &["--shards", "2"]).await;
    let (tally, _) = kill_and_promote(primary, &follower, spec, BURST).await;
    let admitted = tally.admitted();
    assert!(
        admitted <= BURST,
        "{spec}: sync mode admitted {admitted} > {BURST}: over-admission after failover"
    );
    assert!(
        admitted + tally.unknown() >= BURST,
        "{spec}: admitted {admitted} + unknown {} < {BURST}: units lost",
        tally.unknown()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_kill9_token_bucket_admits_nothing_beyond_the_limit() {
    sync_kill("token-bucket:1/h,burst=500").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_kill9_fixed_window_admits_nothing_beyond_the_limit() {
    sync_kill("fixed-window:500/1d").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_kill9_sliding_log_admits_nothing_beyond_the_limit() {
    sync_kill("sliding-log:500/1h").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_kill9_sliding_counter_admits_nothing_beyond_the_limit() {
    sync_kill("sliding-counter:500/1h").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_kill9_concurrency_leases_survive_the_failover() {
    sync_kill("concurrency:500,lease=1h").await;
}

/// The async bound, stated: a crash can re-grant at most what the old
/// primary admitted in its last interval not yet acknowledged. From
/// outside, that interval is bounded by the lag; the test allows every
/// admission seen in the last `ASYNC_WINDOW_MS` before the kill (several
/// times the single-digit-millisecond lag this mode keeps).
const ASYNC_WINDOW_MS: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_kill9_over_admits_at_most_the_unacknowledged_interval() {
    let args = ["--shards", "2", "--replication", "async"];
    let (primary, follower) = start_pair(&args, &["--shards", "2"]).await;
    // A larger limit, so that the load runs long enough before the kill
    // for the bound to be a small part of it: 20,000 was not enough on a
    // fast day, when its first 10,000 admissions took 70 ms (7,723 of them
    // in the last 50 ms) and the test refused its own measurement.
    let burst = 200_000;
    // 10/h: the longest refill a burst this deep may have (one unit in
    // 6 minutes, none during the test).
    let spec = format!("token-bucket:10/h,burst={burst}");
    let (tally, killed_after) = kill_and_promote(primary, &follower, &spec, burst).await;
    let admitted = tally.admitted();
    let times = tally.admitted_at.lock().unwrap().clone();
    // Phase 1's admissions are those seen before the kill.
    let killed_at = Instant::now() - killed_after;
    let phase1: Vec<Instant> = times.into_iter().filter(|&t| t <= killed_at).collect();
    let last = phase1.iter().copied().max().expect("admissions");
    let window = Duration::from_millis(ASYNC_WINDOW_MS);
    let recent = phase1
        .iter()
        .filter(|&&t| t + window >= last && t <= last)
        .count() as u64;
    let over = admitted.saturating_sub(burst);
    eprintln!(
        "async: over-admitted {over}, bound (admissions in the last {ASYNC_WINDOW_MS} ms) {recent} of {} before the kill",
        phase1.len()
    );
    assert!(
        recent < phase1.len() as u64 / 2,
        "the load was too short for the bound to mean anything"
    );
    assert!(
        over <= recent,
        "async over-admission {over} beyond the stated bound {recent}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_failover_under_load_loses_nothing() {
    let (primary, follower) = start_pair(&["--shards", "2"], &["--shards", "2"]).await;
    let tally = Arc::new(Tally::default());
    let target = Arc::new(Mutex::new(primary.addr));
    let key: &'static [u8] = b"handover:key";
    let lim = limits("token-bucket:1/h,burst=500");
    // Callers keep going through NOT_PRIMARY; a watcher moves them to the
    // new primary once the handover is done.
    let load = tokio::spawn(spend(
        target.clone(),
        key,
        lim,
        tally.clone(),
        CALLERS,
        Until::Denied,
        Duration::from_secs(60),
    ));
    while tally.admitted() < BURST / 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ok = repl::control(primary.addr)
        .await
        .unwrap()
        .failover()
        .await
        .expect("failover");
    *target.lock().unwrap() = follower.addr;
    eprintln!(
        "planned failover: epoch {}, unavailable {:.3} ms",
        ok.epoch,
        ok.unavailable_us as f64 / 1000.0
    );
    load.await.unwrap();
    assert_eq!(tally.unknown(), 0, "no call lost its answer");
    assert_eq!(tally.admitted(), BURST, "exactly the limit, across both");
    let old = repl::role(primary.addr).await.unwrap();
    assert_eq!(
        old.role,
        Role::Follower,
        "the old primary follows the new one"
    );
    assert_eq!(old.epoch, ok.epoch);
    let new = repl::role(follower.addr).await.unwrap();
    assert_eq!((new.role, new.epoch), (Role::Primary, ok.epoch));
    // The old primary catches up from the new one and refuses to spend.
    wait_role(primary.addr, Duration::from_secs(20), repl::streaming).await;
    let err = repl::control(primary.addr)
        .await
        .unwrap()
        .spend(key, lim, 1)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not primary"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_primary_restarted_after_a_takeover_rejoins_as_a_follower() {
    let (mut primary, follower) = start_pair(&["--shards", "2"], &["--shards", "3"]).await;
    let lim = limits("token-bucket:1/h,burst=10");
    let c = repl::control(primary.addr).await.unwrap();
    for _ in 0..4 {
        assert!(c.spend(b"rejoin", lim, 1).await.unwrap().allowed);
    }
    primary.kill9();
    repl::control(follower.addr)
        .await
        .unwrap()
        .promote()
        .await
        .unwrap();
    // Restarted with its peer named (as its unit file would): it asks the
    // peer's role before admitting anything, finds a newer primary, follows.
    let peer = follower.addr.to_string();
    let restarted = Sluiced::start(&["--shards", "2", "--peer", &peer]);
    let r = wait_role(restarted.addr, Duration::from_secs(20), |r| {
        r.role == Role::Follower && r.state == ReplState::Streaming
    })
    .await;
    assert_eq!(r.epoch, 1);
    assert_eq!(r.primary, peer);
    let rc = repl::control(restarted.addr).await.unwrap();
    let err = rc.spend(b"rejoin", lim, 1).await.unwrap_err();
    assert!(err.to_string().contains("not primary"), "{err}");
    // It caught up: its copy of the bucket shows the 4 spent units.
    let peeked = rc
        .decide(b"rejoin", lim, sluice_client::Mode::Probe, 0)
        .await
        .unwrap();
    assert_eq!(peeked.verdicts[0].verdict.remaining, 6);
    let _: SocketAddr = restarted.addr;
}

/// A follower with `--advertise` is known by that address: its primary
/// shows it as the follower and hands over to it, and once promoted it
/// names it as the primary. (Here the advertised address is a proxy to
/// the follower, as the drill's cut links are.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advertised_follower_is_reached_at_its_advertised_address() {
    let primary = Sluiced::start(&["--shards", "1"]);
    let front = repl::Proxy::unbound().await.expect("proxy");
    let of = primary.addr.to_string();
    let advertised = front.addr.to_string();
    let follower = Sluiced::start(&["--replica-of", &of, "--advertise", &advertised]);
    front.set_target(follower.addr);
    wait_role(follower.addr, Duration::from_secs(20), repl::streaming).await;
    let r = wait_role(primary.addr, Duration::from_secs(20), repl::streaming).await;
    assert_eq!(r.follower, advertised);
    // A handover goes to the advertised address (the primary waits there
    // for the follower to say it took over).
    let ok = repl::control(primary.addr)
        .await
        .unwrap()
        .failover()
        .await
        .expect("handover through the advertised address");
    assert!(ok.epoch >= 1);
    let r = wait_role(follower.addr, Duration::from_secs(20), |r| {
        r.role == Role::Primary
    })
    .await;
    assert_eq!(r.primary, advertised);
    // The old primary follows the advertised address.
    let r = wait_role(primary.addr, Duration::from_secs(20), repl::streaming).await;
    assert_eq!(
        (r.role, r.primary.as_str()),
        (Role::Follower, advertised.as_str())
    );
}
