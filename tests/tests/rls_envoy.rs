//! Envoy's rate limit service (`--rls-port`) of a real `sluiced`, asked by
//! a gRPC client no one here wrote: Python's grpcio with Envoy's message
//! types from PyPI's xds-protos (`scripts/deps.sh` puts both in
//! `target/redis-py`), with envoyproxy/ratelimit's documented example rule
//! files (tests/rls/rules/).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use sluice_tests::support::{binary, json_object, sluice_cli, Sluiced};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv `scripts/deps.sh` makes.
fn python() -> PathBuf {
    let py = root().join("../target/redis-py/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash scripts/deps.sh` (it installs grpcio and xds-protos from PyPI)",
        py.display()
    );
    py
}

/// Runs the checking script against `server` in `mode`; its stdout.
fn check(server: &Sluiced, args: &[&str]) -> String {
    let port = server.rls_addr.expect("rls listener").port().to_string();
    let out = Command::new(python())
        .arg(root().join("rls/envoy_rls_check.py"))
        .arg(&port)
        .args(args)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn rules_dir() -> String {
    root().join("rls/rules").display().to_string()
}

fn examples(shards: &str, threads: &str) {
    let dir = rules_dir();
    let server = Sluiced::start(&[
        "--shards",
        shards,
        "--rls-threads",
        threads,
        "--rls-port",
        "0",
        "--rls-config",
        &dir,
    ]);
    let out = check(&server, &["examples"]);
    for case in [
        "mongo_cps",
        "messaging",
        "edge_proxy_per_ip",
        "replaces",
        "shadow_mode",
        "wildcard",
        "unlimited",
        "all_or_nothing",
        "hits_addend",
        "override",
        "algorithms",
        "invalid",
    ] {
        assert!(
            out.contains(&format!("{case}: ok")),
            "{case} missing:\n{out}"
        );
    }
}

/// One shard: a request's limits are one DECIDE.
#[test]
fn documented_examples_give_documented_codes_on_one_shard() {
    examples("1", "1");
}

/// Four shards: a request's limits are spread over shards, spent and, when
/// one denies, refunded. Two service threads share the socket.
#[test]
fn documented_examples_give_documented_codes_across_shards() {
    examples("4", "2");
}

/// The same on the shard threads themselves (`--rls-threads 0`): a call
/// is decided in place for its own shard's keys and across shards for the
/// rest, all or nothing as with service threads.
#[test]
fn documented_examples_give_documented_codes_on_the_shard_threads() {
    examples("4", "0");
}

/// Many calls at once over one connection, on the shard threads of 4
/// shards: the calls of a turn share one message per other shard and one
/// reply, split back to each call (rls/outbox.rs). Each tenant admits
/// exactly its own limit, and every answer is its own call's (its
/// tenant's limit, each remainder once): an answer given to the wrong
/// call, or lost, fails it.
#[test]
fn concurrent_calls_across_shards_each_get_their_own_answer() {
    let dir = std::env::temp_dir().join(format!("sluice-rls-conc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut rules = String::from("domain: conc\ndescriptors:\n");
    for i in 0..6 {
        rules.push_str(&format!(
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{ unit: hour, requests_per_unit: {} }}\n",
            10 + i
        ));
    }
    write(&dir.join("conc.yaml"), &rules);
    let d = dir.display().to_string();
    for threads in ["0", "2"] {
        let server = Sluiced::start(&[
            "--shards",
            "4",
            "--rls-threads",
            threads,
            "--rls-port",
            "0",
            "--rls-config",
            &d,
        ]);
        let out = check(&server, &["concurrent", "40"]);
        assert!(out.contains("concurrent: ok"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rate_limit_headers_are_added_when_asked() {
    let dir = rules_dir();
    for (flag, prefix) in [("ratelimit", "RateLimit"), ("x-ratelimit", "X-RateLimit")] {
        let server = Sluiced::start(&[
            "--rls-port",
            "0",
            "--rls-config",
            &dir,
            "--rls-headers",
            flag,
        ]);
        assert!(check(&server, &["headers", prefix]).contains("headers: ok"));
    }
}

fn write(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write the rules");
}

#[test]
fn bad_rules_are_refused_at_start_and_on_reload() {
    let dir = std::env::temp_dir().join(format!("sluice-rls-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("d.yaml");
    let good = |n: u32| {
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: day, requests_per_unit: {n} }}\n")
    };
    let bad = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n";

    // At start: exit 2, naming the file and what is wrong.
    write(&file, bad);
    let out = Command::new(binary("sluiced"))
        .args(["--port", "0", "--rls-port", "0", "--rls-config"])
        .arg(&file)
        .output()
        .expect("sluiced runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("d.yaml") && stderr.contains("d.k: unit \"fortnight\""),
        "{stderr}"
    );
    // --rls-port without rules, and rules without a port's worth of sense.
    let out = Command::new(binary("sluiced"))
        .args(["--port", "0", "--rls-port", "0"])
        .output()
        .expect("sluiced runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--rls-config"),
        "{out:?}"
    );

    // On reload (SIGHUP): a bad file keeps the rules in force, a good one
    // replaces them.
    write(&file, &good(5));
    let server = Sluiced::start(&["--rls-port", "0", "--rls-config", dir.to_str().unwrap()]);
    let limit = || check(&server, &["limit", "d", "k", "v"]).trim().to_owned();
    assert_eq!(limit(), "5");
    write(&file, bad);
    server.hangup();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        assert_eq!(limit(), "5", "a bad file replaced the rules");
    }
    write(&file, &good(7));
    server.hangup();
    let until = Instant::now() + Duration::from_secs(10);
    while limit() != "7" {
        assert!(Instant::now() < until, "the good file was not loaded");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_follower_refuses_with_unavailable_and_names_its_primary() {
    let dir = rules_dir();
    let primary = Sluiced::start(&[]);
    let addr = primary.addr.to_string();
    let follower = Sluiced::start(&[
        "--replica-of",
        &addr,
        "--rls-port",
        "0",
        "--rls-config",
        &dir,
    ]);
    let out = check(&follower, &["unavailable"]);
    assert!(out.contains("unavailable:") && out.contains(&addr), "{out}");
}

/// `sluice_rls_over_limit_denied_total` on `server`'s admin port.
fn denied_in_place(server: &Sluiced) -> u64 {
    let (_, scrape) =
        sluice_tests::support::http_get(server.admin_addr.expect("admin"), "/metrics");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix("sluice_rls_over_limit_denied_total "))
        .expect("the counter is exported")
        .trim()
        .parse()
        .expect("a count")
}

/// A key over its limit is denied on the thread that read the call, from
/// the windows its shard publishes (`shard/over_limit.rs`), with the same
/// answer the shard gives: its numbers, all or nothing with the request's
/// other descriptors, a check (hits 0) still within it. A refund withdraws
/// the entry before it makes room, so the next calls are admitted at once.
/// With `--rls-over-limit-slots 0` every call asks the shard, and the
/// answers are the same. Two shards on the shard threads and on a service
/// thread, so that keys are asked of other threads' shards.
#[test]
fn a_key_over_its_limit_is_denied_in_place_exactly_as_its_shard_denies_it() {
    let dir = rules_dir();
    for (threads, slots) in [("0", "1024"), ("1", "1"), ("1", "0")] {
        let server = Sluiced::start(&[
            "--shards",
            "2",
            "--rls-threads",
            threads,
            "--rls-over-limit-slots",
            slots,
            "--rls-port",
            "0",
            "--rls-config",
            &dir,
            "--admin-port",
            "0",
        ]);
        for run in 0..4 {
            let out = check(&server, &["over_limit", &format!("ol{run}")]);
            assert!(out.contains("over_limit: ok"), "{out}");
        }
        let in_place = denied_in_place(&server);
        if slots == "0" {
            assert_eq!(in_place, 0, "nothing is published");
        } else {
            // Of each run's 23 denials, the first is the shard's; a table of
            // one slot holds one key at a time, and these are asked one by one.
            assert!(
                in_place >= 4 * 19,
                "{in_place} denied in place ({threads}, {slots})"
            );
        }
    }
}

/// Decisions and buckets as the node counts them (`sluice stats --json`).
fn counted(server: &Sluiced) -> (u64, u64) {
    let stats = json_object(&sluice_cli(server, &["stats", "--json"]));
    let total = &stats["total"];
    let n = |k: &str| total[k].as_u64().expect("a count");
    (n("allowed") + n("denied"), n("buckets"))
}

/// `unlimited: true` never counts: 200 calls that match only an unlimited
/// rule leave no decision and no bucket in the node's own counters, where
/// one call on a limited rule leaves one of each (so the counters do see
/// the service's decisions).
#[test]
fn unlimited_never_counts() {
    let dir = rules_dir();
    let server = Sluiced::start(&["--rls-port", "0", "--rls-config", &dir]);
    assert_eq!(counted(&server), (0, 0));
    assert!(check(&server, &["unlimited", "200"]).contains("unlimited: ok"));
    assert_eq!(counted(&server), (0, 0), "unlimited calls were counted");
    assert!(check(&server, &["limited"]).contains("limited: ok"));
    assert_eq!(counted(&server), (1, 1));
}

/// `share_threshold: true` on a wildcard: every value it matches spends
/// from one limit (envoyproxy/ratelimit's meaning), with every algorithm
/// and for rules below such a wildcard. Four shards, so that values counted
/// apart would most likely be counted on different shards.
#[test]
fn share_threshold_counts_every_matching_value_in_one_limit() {
    let dir = rules_dir();
    let server = Sluiced::start(&["--shards", "4", "--rls-port", "0", "--rls-config", &dir]);
    let out = check(&server, &["share_threshold"]);
    assert!(out.contains("share_threshold: ok"), "{out}");
}

/// A descriptor's `hits_addend` set to 0 (the wrapper present) checks the
/// limit without spending, as in envoyproxy/ratelimit; the request's
/// `hits_addend` of 0 still means 1.
#[test]
fn a_descriptor_hits_addend_of_zero_checks_without_spending() {
    let dir = rules_dir();
    let server = Sluiced::start(&["--rls-port", "0", "--rls-config", &dir]);
    let out = check(&server, &["hits_zero"]);
    assert!(out.contains("hits_zero: ok"), "{out}");
}

/// `duration_until_reset` is whole seconds, rounded up: for a fixed window
/// exactly envoyproxy/ratelimit's number, and the RateLimit-Reset header
/// Envoy makes of it is never a moment early.
#[test]
fn duration_until_reset_is_whole_seconds_rounded_up() {
    let dir = rules_dir();
    let server = Sluiced::start(&[
        "--rls-port",
        "0",
        "--rls-config",
        &dir,
        "--rls-headers",
        "ratelimit",
    ]);
    let out = check(&server, &["reset"]);
    assert!(out.contains("reset: ok"), "{out}");
}

/// Wildcard values match as envoyproxy/ratelimit matches them: a value's
/// last `*` by prefix, any other `*` as the character, a request value
/// that is a wildcard's own text on that wildcard, an empty value as no
/// value, and exact before wildcard (file order) before no value.
#[test]
fn wildcard_values_match_as_envoyproxy_ratelimit_matches_them() {
    let dir = rules_dir();
    let server = Sluiced::start(&["--rls-port", "0", "--rls-config", &dir]);
    let out = check(&server, &["wildcards"]);
    assert!(out.contains("wildcards: ok"), "{out}");
}

/// A rule file envoyproxy/ratelimit loads is loaded, where it has keys that
/// mean nothing there either: `shadow_mode` on a descriptor without a
/// `rate_limit`, `requests_per_unit` beside `unlimited: true`.
#[test]
fn what_envoyproxy_ratelimit_loads_and_ignores_is_loaded() {
    let dir = std::env::temp_dir().join(format!("sluice-rls-lenient-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    write(
        &dir.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: group\n    shadow_mode: true\n    descriptors:\n      - key: user\n        rate_limit: { unit: day, requests_per_unit: 4 }\n  - key: free\n    rate_limit: { unlimited: true, requests_per_unit: 9 }\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 3 }\n",
    );
    let server = Sluiced::start(&["--rls-port", "0", "--rls-config", dir.to_str().unwrap()]);
    assert_eq!(check(&server, &["limit", "d", "k", "v"]).trim(), "3");
    assert_eq!(check(&server, &["limit", "d", "free", "v"]).trim(), "none");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `replaces` beside `unlimited`, as envoyproxy/ratelimit answers: an
/// unlimited rule replaces the limits it names, and stays unlimited when a
/// rule names it.
#[test]
fn an_unlimited_rule_replaces_others_and_is_never_replaced() {
    let dir = rules_dir();
    let server = Sluiced::start(&["--rls-port", "0", "--rls-config", &dir]);
    let out = check(&server, &["replaces_unlimited"]);
    assert!(out.contains("replaces_unlimited: ok"), "{out}");
}
