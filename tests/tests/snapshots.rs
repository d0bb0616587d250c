//! Snapshots (`--snapshot-dir`) against real `sluiced` processes: spent
//! buckets of every kind, a held lease included, stay spent across a
//! graceful restart (into another shard count) and across a kill -9 after
//! a periodic snapshot; a corrupt snapshot stops the start, with the file
//! and the way out named, unless --snapshot-ignore-corrupt; a token bucket
//! years from refilled (kept apart from the 24-byte slots) survives too.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use sluice_client::{inline_limits, Client, LeaseTarget, Limit, Limits};
use sluice_tests::support::{binary, specs, Sluiced};

/// A fresh directory of the test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("sluice-snap-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }

    fn file(&self) -> PathBuf {
        self.0.join("sluiced.snapshot")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One limit of every kind, none refilling within the test.
const SPECS: [&str; 5] = [
    "token-bucket:10/h",
    "fixed-window:10/h",
    "sliding-log:10/h",
    "sliding-counter:10/h",
    "concurrency:10,lease=1h",
];

/// A client with room for a loaded machine (the default deadline is for
/// gateways: milliseconds).
async fn connect(server: &Sluiced) -> Client {
    let config = sluice_client::ClientConfig {
        deadline: Duration::from_secs(10),
        ..Default::default()
    };
    Client::connect_with(server.addr, config).await.unwrap()
}

fn limits(set: &[Limit]) -> Limits<'_> {
    inline_limits(set).unwrap()
}

/// Spends 3 units of every kind (the concurrency limit's as one lease);
/// returns the lease id.
async fn spend(server: &Sluiced, set: &[Limit]) -> u64 {
    let client = connect(server).await;
    let ok = client.spend(b"snapshot:key", limits(set), 3).await.unwrap();
    assert!(ok.allowed, "{ok:?}");
    ok.verdicts[4].lease_id
}

/// What every limit has left for the key (a probe of cost 0).
async fn remaining(server: &Sluiced, set: &[Limit]) -> Vec<u64> {
    let client = connect(server).await;
    let ok = client.probe(b"snapshot:key", limits(set), 0).await.unwrap();
    ok.verdicts.iter().map(|v| v.verdict.remaining).collect()
}

#[tokio::test]
async fn a_graceful_restart_keeps_every_kind_spent_even_with_another_shard_count() {
    let dir = Dir::new("graceful");
    let set = specs(&SPECS);
    let server = Sluiced::start(&["--shards", "2", "--snapshot-dir", dir.arg()]);
    let lease = spend(&server, &set).await;
    assert_eq!(remaining(&server, &set).await, [7, 7, 7, 7, 7]);
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(dir.file().exists(), "no snapshot at shutdown");
    // Back with three shards: every bucket on the shard that owns it now.
    let server = Sluiced::start(&["--shards", "3", "--snapshot-dir", dir.arg()]);
    assert_eq!(remaining(&server, &set).await, [7, 7, 7, 7, 7]);
    // The lease is still held, and is released by its old id.
    let client = connect(&server).await;
    let target = LeaseTarget::Inline {
        index: 4,
        limit: match set[4] {
            Limit::Concurrency(c) => c,
            _ => unreachable!(),
        },
    };
    let released = client
        .release(b"snapshot:key", target, lease)
        .await
        .unwrap();
    assert_eq!(released.verdict.verdict.remaining, 10);
    // A new lease never reuses an id that was in the snapshot.
    let again = spend(&server, &set).await;
    assert_ne!(again, lease);
}

#[tokio::test]
async fn a_kill_9_loses_only_what_changed_after_the_last_periodic_snapshot() {
    let dir = Dir::new("kill9");
    let set = specs(&SPECS);
    let args = [
        "--shards",
        "2",
        "--snapshot-dir",
        dir.arg(),
        "--snapshot-interval-s",
        "1",
    ];
    let mut server = Sluiced::start(&args);
    spend(&server, &set).await;
    let spent_at = SystemTime::now();
    // Wait for a periodic snapshot written after the spend.
    let start = Instant::now();
    loop {
        let written = std::fs::metadata(dir.file()).and_then(|m| m.modified());
        if written.is_ok_and(|t| t > spent_at + Duration::from_millis(10)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no periodic snapshot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.kill9();
    let server = Sluiced::start(&args);
    assert_eq!(remaining(&server, &set).await, [7, 7, 7, 7, 7]);
}

#[tokio::test]
async fn a_corrupt_snapshot_stops_the_start_unless_told_to_start_empty() {
    let dir = Dir::new("corrupt");
    let set = specs(&SPECS);
    let server = Sluiced::start(&["--shards", "1", "--snapshot-dir", dir.arg()]);
    spend(&server, &set).await;
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success());
    let mut bytes = std::fs::read(dir.file()).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(dir.file(), &bytes).unwrap();
    let out = Command::new(binary("sluiced"))
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--shards",
            "1",
            "--snapshot-dir",
            dir.arg(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(dir.file().to_str().unwrap()), "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains("--snapshot-ignore-corrupt"), "{err}");
    // Told to, it starts empty.
    let server = Sluiced::start(&[
        "--shards",
        "1",
        "--snapshot-dir",
        dir.arg(),
        "--snapshot-ignore-corrupt",
    ]);
    assert_eq!(remaining(&server, &set).await, [10, 10, 10, 10, 10]);
}

/// A token bucket that takes years to refill (1,000 units at one a day,
/// all spent: its TAT is 2.7 years ahead, past the 1.14 years a 24-byte
/// slot holds, so the shard keeps it whole in its side map) stays spent
/// across a restart from the snapshot, into another shard count. Fails
/// when a walk leaves that map out (the bucket comes back full).
#[tokio::test]
async fn a_bucket_years_from_refilled_survives_a_restart() {
    let dir = Dir::new("years");
    let set = specs(&["token-bucket:1/d,burst=1000"]);
    let server = Sluiced::start(&["--shards", "2", "--snapshot-dir", dir.arg()]);
    let client = connect(&server).await;
    let ok = client
        .spend(b"snapshot:years", limits(&set), 1000)
        .await
        .unwrap();
    assert!(ok.allowed, "{ok:?}");
    let denied = client
        .spend(b"snapshot:years", limits(&set), 1)
        .await
        .unwrap();
    assert!(!denied.allowed, "{denied:?}");
    let wait = denied.verdicts[0].verdict.retry_after_ns;
    assert!(
        wait > 86_400_000_000_000 - 60_000_000_000,
        "retry after {wait} ns"
    );
    drop(client);
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let server = Sluiced::start(&["--shards", "3", "--snapshot-dir", dir.arg()]);
    let client = connect(&server).await;
    let probe = client
        .probe(b"snapshot:years", limits(&set), 0)
        .await
        .unwrap();
    assert_eq!(probe.verdicts[0].verdict.remaining, 0, "{probe:?}");
    // Refilled in 1,000 days, less the seconds the test took.
    let reset = probe.verdicts[0].verdict.reset_after_ns;
    assert!(
        reset > 999 * 86_400_000_000_000,
        "reset after {reset} ns: the bucket came back refilled"
    );
}

/// Spends one unit of `n` token-bucket keys (33 bytes each in a snapshot).
async fn spend_keys(server: &Sluiced, n: usize) {
    let client = connect(server).await;
    let policy = sluice_protocol::Policy::new(1, 3_600_000_000_000, 10).unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let client = client.clone();
        calls.spawn(async move {
            client
                .throttle(format!("fill:{i}").as_bytes(), policy, 1)
                .await
        });
    }
    while let Some(done) = calls.join_next().await {
        assert!(done.unwrap().unwrap().allowed);
    }
}

/// A symlink planted at the temporary file's path, pointing at a file
/// outside the directory, is never written through: the snapshot is
/// written anyway and the file outside is untouched. Fails when the
/// temporary file is opened with `File::create` (which follows it).
#[tokio::test]
async fn a_symlink_at_the_temporary_path_is_never_followed() {
    let dir = Dir::new("symlink");
    let outside = Dir::new("symlink-outside");
    let victim = outside.0.join("precious");
    std::fs::write(&victim, b"not yours").unwrap();
    std::os::unix::fs::symlink(&victim, dir.0.join("sluiced.snapshot.tmp")).unwrap();
    let server = Sluiced::start(&["--shards", "1", "--snapshot-dir", dir.arg()]);
    spend(&server, &specs(&SPECS)).await;
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"not yours");
    let snapshot = std::fs::symlink_metadata(dir.file()).unwrap();
    assert!(
        snapshot.is_file(),
        "the snapshot is a symlink: {snapshot:?}"
    );
    assert!(std::fs::symlink_metadata(dir.0.join("sluiced.snapshot.tmp")).is_err());
}

/// A tmpfs of 32 KiB mounted on a fresh directory (root only), unmounted
/// when dropped.
struct Tmpfs(Dir);

impl Tmpfs {
    fn mount(name: &str) -> Option<Tmpfs> {
        let dir = Dir::new(name);
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=32k", "tmpfs", dir.arg()])
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.arg()).status();
    }
}

/// The final snapshot of a node whose disk is full: the exit status is 1,
/// the log says why, no partial temporary file is left, and the marker
/// `sluiced.snapshot.failed` is. The next start loads the older snapshot
/// and warns about it, naming the marker; its own snapshot removes the
/// marker. Fails while a failed snapshot at shutdown still exits 0.
#[tokio::test]
async fn a_failed_final_snapshot_fails_the_exit_and_the_next_start_says_so() {
    let Some(fs) = Tmpfs::mount("full") else {
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    };
    let dir = &fs.0;
    let log = std::env::temp_dir().join(format!("sluice-snap-full-{}.log", std::process::id()));
    let set = specs(&SPECS);
    // A first snapshot that fits.
    let server = Sluiced::start(&["--shards", "1", "--snapshot-dir", dir.arg()]);
    spend(&server, &set).await;
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    // Then more buckets than the disk holds (3,000 x 33 bytes).
    let server = Sluiced::start_logged(&log, &["--shards", "1", "--snapshot-dir", dir.arg()]);
    spend_keys(&server, 3_000).await;
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("snapshot not written"), "{said}");
    assert!(said.contains("No space left on device"), "{said}");
    assert!(
        said.contains("the final snapshot was not written"),
        "{said}"
    );
    assert!(
        !dir.0.join("sluiced.snapshot.tmp").exists(),
        "partial file left"
    );
    let marker = dir.0.join("sluiced.snapshot.failed");
    assert!(marker.exists(), "no failure marker");
    // The next start loads the first snapshot and says it is older.
    let server = Sluiced::start_logged(&log, &["--shards", "1", "--snapshot-dir", dir.arg()]);
    assert_eq!(remaining(&server, &set).await, [7, 7, 7, 7, 7]);
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(status.success(), "{status:?} {said}");
    assert!(said.contains("the last snapshot write failed"), "{said}");
    assert!(said.contains(marker.to_str().unwrap()), "{said}");
    assert!(!marker.exists(), "the marker outlived a snapshot written");
}

/// Something the daemon cannot replace at the temporary path (here a
/// directory) fails the final snapshot too: exit status 1, no snapshot,
/// and the failure marker written as a file of its own, never through a
/// symlink planted at its name.
#[tokio::test]
async fn a_final_snapshot_that_cannot_be_created_fails_the_exit() {
    let dir = Dir::new("tmpdir");
    let outside = Dir::new("tmpdir-outside");
    let victim = outside.0.join("precious");
    std::fs::write(&victim, b"not yours").unwrap();
    let marker = dir.0.join("sluiced.snapshot.failed");
    std::os::unix::fs::symlink(&victim, &marker).unwrap();
    let server = Sluiced::start(&["--shards", "1", "--snapshot-dir", dir.arg()]);
    spend(&server, &specs(&SPECS)).await;
    std::fs::create_dir(dir.0.join("sluiced.snapshot.tmp")).unwrap();
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(!dir.file().exists());
    assert_eq!(std::fs::read(&victim).unwrap(), b"not yours");
    let marker = std::fs::symlink_metadata(&marker).unwrap();
    assert!(marker.is_file(), "the marker is not a file: {marker:?}");
}
