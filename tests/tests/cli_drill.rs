//! `sluice drill` end to end: real `sluiced` processes, real faults.
//!
//! - A short sync-mode drill with every fault kind keeps the promise: 0
//!   units over the limits, every group recovers, exit 0.
//! - The same drill against a setup broken on purpose (no replication:
//!   every failover starts from empty buckets) reports over-admission and
//!   exits 1: the drill can fail.
//! - `--cluster FILE --fault-cmd CMD` drives a pair someone else started,
//!   injecting each fault with the operator's command.
//! - Through the nodes' entry points (`--entry v1`, `resp`, `rls`),
//!   followers included, kill rounds keep the sync promise too.

use std::process::{Command, Output};

use sluice_tests::repl;
use sluice_tests::support::binary;

/// Runs `sluice [global] drill ARGS --json` and returns its exit code and
/// the JSON object it printed.
fn drill(global: &[&str], args: &[&str]) -> (i32, serde_json::Value, Output) {
    let sluiced = binary("sluiced");
    let out = Command::new(binary("sluice"))
        .args(global)
        .arg("drill")
        .args(args)
        .args(["--json", "--sluiced"])
        .arg(&sluiced)
        .output()
        .expect("sluice runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let json = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {text:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json, out)
}

fn units(json: &serde_json::Value, field: &str) -> u64 {
    json[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {json}"))
}

#[test]
fn a_sync_drill_with_every_fault_over_admits_nothing() {
    let (code, json, out) = drill(
        &[],
        &[
            "--local",
            "--groups",
            "2",
            "--replication",
            "sync",
            "--rounds",
            "4",
            "--fault",
            "mixed",
            "--duration-s",
            "12",
            "--rate",
            "1000",
        ],
    );
    let rounds = json["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 4, "{json}");
    let mut faults: Vec<&str> = rounds
        .iter()
        .map(|r| r["fault"].as_str().unwrap())
        .collect();
    faults.sort();
    assert_eq!(faults, ["handover", "kill", "partition", "pause"]);
    for r in rounds {
        assert_eq!(r["over_admitted_units"], 0, "{r}");
        assert_eq!(r["recovered"], true, "{r}");
        assert!(r["unavailable_ms"].as_f64().unwrap() >= 0.0, "{r}");
        // Every fault here outlasts --promote-after-ms or hands over: the
        // group moves to a new epoch.
        assert!(
            r["epoch_after"].as_u64() > r["epoch_before"].as_u64(),
            "{r}"
        );
        // A stopped primary costs the promotion delay (the client's stall
        // watch finds the promoted follower), not the 1 s pause.
        if r["fault"] == "pause" {
            let promote_ms = json["setup"]["promote_after_ms"].as_f64().expect("local");
            assert!(
                r["unavailable_ms"].as_f64().unwrap() <= promote_ms + 150.0,
                "{r}"
            );
        }
    }
    assert_eq!(units(&json, "over_admitted_units"), 0);
    assert_eq!(json["promise_kept"], true, "{json}");
    assert!(units(&json, "store_decisions") > 1_000, "{json}");
    assert_eq!(code, 0, "stderr: {}", String::from_utf8_lossy(&out.stderr));
}

/// `--entry v1`: the load through random nodes' entry points (followers
/// included, every node started with --cluster): kill -9 rounds keep the
/// sync promise and deny nothing a correct limiter would admit, and the
/// report says which entry was used.
#[test]
fn a_drill_through_entry_points_keeps_the_sync_promise_under_kill() {
    entry_drill(
        "v1",
        &[
            "concurrency",
            "fixed-window",
            "sliding-counter",
            "sliding-log",
            "token-bucket",
        ],
    );
}

/// `--entry resp`: the load as redis-cell's CL.THROTTLE through random
/// nodes' RESP listeners (token-bucket keys only), under kill -9: the
/// sync promise kept, no denial a correct limiter would admit.
#[test]
fn a_drill_through_resp_entry_points_keeps_the_sync_promise_under_kill() {
    entry_drill("resp", &["token-bucket"]);
}

/// `--entry rls`: the load as Envoy's ShouldRateLimit through random
/// nodes' rate limit services, with the rule file the drill writes (every
/// kind a rule can say), under kill -9: the sync promise kept, no denial a
/// correct limiter would admit.
#[test]
fn a_drill_through_rls_entry_points_keeps_the_sync_promise_under_kill() {
    entry_drill(
        "rls",
        &[
            "fixed-window",
            "sliding-counter",
            "sliding-log",
            "token-bucket",
        ],
    );
}

/// A 2-group sync drill of 3 kill rounds through `entry`, whose keys are
/// of the limit `kinds` (each of which admitted something): 0 units over,
/// 0 under, more than 1,000 store verdicts, exit 0.
fn entry_drill(entry: &str, kinds: &[&str]) {
    let (code, json, out) = drill(
        &[],
        &[
            "--local",
            "--groups",
            "2",
            "--rounds",
            "3",
            "--fault",
            "kill",
            "--duration-s",
            "6",
            "--rate",
            "1000",
            "--entry",
            entry,
        ],
    );
    assert_eq!(json["setup"]["entry"], entry, "{json}");
    let by_kind = json["by_kind"].as_object().expect("by_kind");
    let mut seen: Vec<&str> = by_kind.keys().map(String::as_str).collect();
    seen.sort_unstable();
    assert_eq!(seen, kinds, "{json}");
    for (kind, t) in by_kind {
        assert!(units(t, "admitted_units") > 0, "{kind}: {t}");
    }
    assert_eq!(json["rounds"].as_array().map(Vec::len), Some(3), "{json}");
    assert_eq!(units(&json, "over_admitted_units"), 0, "{json}");
    assert_eq!(units(&json, "under_admitted_units"), 0, "{json}");
    assert!(units(&json, "store_decisions") > 1_000, "{json}");
    assert_eq!(json["promise_kept"], true, "{json}");
    assert_eq!(code, 0, "stderr: {}", String::from_utf8_lossy(&out.stderr));
}

/// The entry points are the local cluster's, and a cut link's proxies hide
/// the nodes' own addresses from the cluster file: `--entry` other than
/// `client` without --local, or with link faults, is refused (exit 2)
/// before anything starts, naming the entry.
#[test]
fn entry_points_are_refused_where_the_drill_cannot_run_them() {
    for entry in ["v1", "resp", "rls"] {
        for (args, says) in [
            (
                &["--fault-cmd", "true", "--entry", entry][..],
                "needs --local",
            ),
            (
                &["--local", "--fault", "mixed", "--entry", entry][..],
                "drills kill and pause faults",
            ),
        ] {
            let out = Command::new(binary("sluice"))
                .arg("drill")
                .args(args)
                .output()
                .expect("sluice runs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("--entry {entry} {says}")),
                "{args:?}: {stderr}"
            );
        }
    }
}

#[test]
fn a_drill_catches_a_follower_that_starts_empty() {
    let (code, json, _) = drill(
        &[],
        &[
            "--local",
            "--groups",
            "1",
            "--rounds",
            "2",
            "--fault",
            "kill",
            "--duration-s",
            "5",
            "--rate",
            "1000",
            "--sabotage",
            "no-replication",
        ],
    );
    assert!(units(&json, "over_admitted_units") > 0, "{json}");
    assert_eq!(json["promise_kept"], false, "{json}");
    assert_eq!(code, 1, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_drives_someone_elses_cluster_through_their_command() {
    let (primary, follower) = repl::start_pair(&["--shards", "2"], &["--shards", "2"]).await;
    let dir = std::env::temp_dir().join(format!("sluice-drill-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster.toml");
    std::fs::write(
        &file,
        format!(
            "[[groups]]\nname = \"g0\"\nprimary = \"{}\"\nfollower = \"{}\"\n",
            primary.addr, follower.addr
        ),
    )
    .unwrap();
    // The operator's command: a planned handover with the CLI, logged so
    // that the test sees what it was called with.
    let log = dir.join("calls.log");
    let cmd = format!(
        "echo '{{fault}} {{addr}} {{group}}' >> {log} && {sluice} --addr {{addr}} failover",
        log = log.display(),
        sluice = binary("sluice").display()
    );
    let file_arg = file.display().to_string();
    let (code, json, out) = tokio::task::spawn_blocking(move || {
        drill(
            &["--cluster", &file_arg],
            &[
                "--fault-cmd",
                &cmd,
                "--fault",
                "handover",
                "--rounds",
                "2",
                "--duration-s",
                "4",
                "--rate",
                "500",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        code,
        0,
        "{json} stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(lines.len(), 2, "{calls}");
    // First the original primary, then (it handed over) the other node.
    assert_eq!(lines[0], format!("handover {} g0", primary.addr));
    assert_eq!(lines[1], format!("handover {} g0", follower.addr));
    for r in json["rounds"].as_array().unwrap() {
        assert_eq!(r["over_admitted_units"], 0, "{r}");
        assert!(
            r["epoch_after"].as_u64() > r["epoch_before"].as_u64(),
            "{r}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_drill_on_etcd_with_every_fault_over_admits_nothing() {
    let (code, json, out) = drill(
        &[],
        &[
            "--local",
            "--etcd",
            "--rounds",
            "5",
            "--fault",
            "mixed",
            "--duration-s",
            "25",
            "--rate",
            "1000",
        ],
    );
    let rounds = json["rounds"].as_array().expect("rounds");
    let mut faults: Vec<&str> = rounds
        .iter()
        .map(|r| r["fault"].as_str().unwrap())
        .collect();
    faults.sort();
    assert_eq!(
        faults,
        ["etcd-down", "etcd-partition", "kill", "partition", "pause"],
        "{json}"
    );
    for r in rounds {
        assert_eq!(r["over_admitted_units"], 0, "{r}");
        assert_eq!(r["recovered"], true, "{r}");
    }
    assert_eq!(json["promise_kept"], true, "{json}");
    assert_eq!(code, 0, "stderr: {}", String::from_utf8_lossy(&out.stderr));
}
