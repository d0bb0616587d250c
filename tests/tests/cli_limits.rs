//! The `sluice` command line's limits against a real `sluiced`: `--limit`
//! and `--tier` on throttle and peek (DECIDE), every kind end to end,
//! refund, reset, acquire, release, renew, reload and stats; human and
//! `--json` output and exit codes.

use std::process::Output;

use serde_json::Value;
use sluice_tests::support::{json_object, sluice_cli, tiers_toml, ConfigFile, Sluiced};

const KINDS: [(&str, &str); 5] = [
    ("token-bucket", "token-bucket:10/s,burst=20"),
    ("fixed-window", "fixed-window:100/1h"),
    ("sliding-log", "sliding-log:100/1h"),
    ("sliding-counter", "sliding-counter:100/1h"),
    ("concurrency", "concurrency:10,lease=30s"),
];

/// `args` with `--limit SPEC` added for each spec.
fn with_limits<'a>(args: &[&'a str], specs: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    for spec in specs {
        all.extend(["--limit", spec]);
    }
    all
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn sorted_keys(v: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// The `remaining` of every verdict.
fn remaining(v: &serde_json::Map<String, Value>) -> Vec<u64> {
    v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["remaining"].as_u64().unwrap())
        .collect()
}

#[test]
fn every_kind_works_end_to_end_with_json() {
    let server = Sluiced::start(&["--shards", "2"]);
    let specs: Vec<&str> = KINDS.iter().map(|(_, s)| *s).collect();
    let out = sluice_cli(
        &server,
        &with_limits(&["throttle", "all", "--json"], &specs),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_object(&out);
    assert_eq!(
        sorted_keys(&Value::Object(v.clone())),
        [
            "allowed",
            "denied_index",
            "limit",
            "priority",
            "remaining",
            "reset_after_ms",
            "retry_after_ms",
            "verdicts"
        ]
    );
    assert_eq!(v["priority"], "normal", "no --priority is normal");
    assert_eq!(
        (v["allowed"].as_bool(), &v["denied_index"]),
        (Some(true), &Value::Null)
    );
    // The summary is the limit with the least remaining: 9 of 10 slots.
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(10), Some(9))
    );
    let verdicts = v["verdicts"].as_array().unwrap();
    let kinds: Vec<&str> = verdicts
        .iter()
        .map(|v| v["kind"].as_str().unwrap())
        .collect();
    let names: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, names);
    for v in verdicts {
        assert_eq!(
            sorted_keys(v),
            [
                "allowed",
                "kind",
                "lease_id",
                "limit",
                "remaining",
                "reset_after_ms",
                "retry_after_ms"
            ]
        );
        assert_eq!(v["allowed"], true);
        assert_eq!(v["lease_id"].is_u64(), v["kind"] == "concurrency", "{v}");
    }
    assert_eq!(remaining(&v), [19, 99, 99, 99, 9]);
    // PROBE spends nothing and takes no lease: what is left after the
    // throttle's unit and this probe's (twice, to show nothing was spent).
    for _ in 0..2 {
        let out = sluice_cli(&server, &with_limits(&["peek", "all", "--json"], &specs));
        assert_eq!(out.status.code(), Some(0));
        let v = json_object(&out);
        assert_eq!(remaining(&v)[1..], [98, 98, 98, 8]);
        assert!(v["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["lease_id"].is_null()));
    }
    // Each kind alone.
    for (name, spec) in KINDS {
        let key = format!("alone-{name}");
        let out = sluice_cli(&server, &["throttle", &key, "--limit", spec, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{spec}: {}", stderr(&out));
        let v = json_object(&out);
        assert_eq!(v["verdicts"][0]["kind"], name);
        assert_eq!(v["verdicts"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn human_output_has_a_summary_and_a_line_per_limit() {
    let server = Sluiced::start(&[]);
    let args = with_limits(
        &["throttle", "h"],
        &["token-bucket:5/s,burst=5", "concurrency:2,lease=30s"],
    );
    let out = sluice_cli(&server, &args);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("allowed limit=2 remaining=1 retry_after=0ms reset_after="),
        "{text}"
    );
    assert!(
        lines[1].starts_with(
            "  [0] token-bucket allowed limit=5 remaining=4 retry_after=0ms reset_after="
        ),
        "{text}"
    );
    assert!(!lines[1].contains("lease="));
    assert!(
        lines[2].starts_with(
            "  [1] concurrency allowed limit=2 remaining=1 retry_after=0ms reset_after="
        ),
        "{text}"
    );
    assert!(lines[2].contains(" lease="), "{text}");
}

#[test]
fn a_denial_exits_1_and_names_the_denying_limit() {
    let server = Sluiced::start(&[]);
    let specs = [
        "token-bucket:1/h,burst=5",
        "sliding-log:1/h",
        "concurrency:3",
    ];
    let args = with_limits(&["throttle", "d", "--json"], &specs);
    assert_eq!(sluice_cli(&server, &args).status.code(), Some(0));
    let out = sluice_cli(&server, &args);
    assert_eq!(out.status.code(), Some(1), "denied exits 1");
    let v = json_object(&out);
    assert_eq!(
        (v["allowed"].as_bool(), v["denied_index"].as_u64()),
        (Some(false), Some(1))
    );
    let verdicts = v["verdicts"].as_array().unwrap();
    let longest = verdicts
        .iter()
        .map(|v| v["retry_after_ms"].as_u64().unwrap())
        .max();
    assert_eq!(v["retry_after_ms"].as_u64(), longest);
    assert!(longest.unwrap() > 3_500_000, "an hour's log: {v:?}");
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(1), Some(0)),
        "the summary is the denying limit"
    );
    assert_eq!(
        verdicts[2]["lease_id"],
        Value::Null,
        "a denial takes no lease"
    );
    let text = stdout(&sluice_cli(&server, &with_limits(&["peek", "d"], &specs)));
    assert!(
        text.starts_with("denied limit=1 remaining=0 retry_after="),
        "{text}"
    );
    assert!(text
        .lines()
        .nth(2)
        .unwrap()
        .starts_with("  [1] sliding-log denied "));
}

#[test]
fn refund_and_reset_give_units_back() {
    let server = Sluiced::start(&["--shards", "3"]);
    let specs = ["token-bucket:1/h,burst=3", "fixed-window:5/h"];
    let spend = |cost: &'static str| {
        let args = with_limits(&["throttle", "r", "--cost", cost, "--json"], &specs);
        sluice_cli(&server, &args)
    };
    let out = spend("3");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(remaining(&json_object(&out)), [0, 2]);
    let out = spend("1");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_object(&out)["denied_index"], 0);
    let out = sluice_cli(
        &server,
        &with_limits(&["refund", "r", "--cost", "2", "--json"], &specs),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(remaining(&json_object(&out)), [2, 4]);
    // Never above the limit.
    let out = sluice_cli(
        &server,
        &with_limits(&["refund", "r", "--cost", "100", "--json"], &specs),
    );
    assert_eq!(remaining(&json_object(&out)), [3, 5]);
    assert_eq!(spend("3").status.code(), Some(0));
    let out = sluice_cli(&server, &with_limits(&["reset", "r"], &specs));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("allowed limit=3 remaining=3 "), "{text}");
    assert_eq!(text.lines().count(), 3);
    // --rate (THROTTLE) and a first --limit token bucket share a bucket.
    let throttle = [
        "throttle", "s", "--rate", "1/h", "--burst", "3", "--cost", "2",
    ];
    assert_eq!(sluice_cli(&server, &throttle).status.code(), Some(0));
    let tb = "token-bucket:1/h,burst=3";
    let out = sluice_cli(
        &server,
        &["peek", "s", "--limit", tb, "--cost", "0", "--json"],
    );
    assert_eq!(json_object(&out)["remaining"], 1);
    assert_eq!(
        sluice_cli(&server, &["reset", "s", "--limit", tb])
            .status
            .code(),
        Some(0)
    );
    let out = sluice_cli(
        &server,
        &["peek", "s", "--rate", "1/h", "--burst", "3", "--json"],
    );
    assert_eq!(json_object(&out)["remaining"], 2);
    // Usage: refund needs a cost; a reset needs limits.
    let out = sluice_cli(&server, &with_limits(&["refund", "r"], &specs));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(sluice_cli(&server, &["reset", "r"]).status.code(), Some(2));
}

#[test]
fn acquire_release_and_renew_through_the_cli() {
    let server = Sluiced::start(&["--shards", "2"]);
    let c = "concurrency:1,lease=30s";
    let out = sluice_cli(&server, &["acquire", "w", "--limit", c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lease = json_object(&out)["verdicts"][0]["lease_id"]
        .as_u64()
        .unwrap();
    let id = lease.to_string();
    assert_eq!(
        sluice_cli(&server, &["acquire", "w", "--limit", c])
            .status
            .code(),
        Some(1)
    );
    let out = sluice_cli(
        &server,
        &["renew", "w", "--lease", &id, "--limit", c, "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_object(&out);
    assert_eq!(v["lease_id"].as_u64(), Some(lease));
    let expires = v["expires_after_ms"].as_u64().unwrap();
    assert!((29_000..=30_000).contains(&expires), "{expires}");
    let out = sluice_cli(&server, &["release", "w", "--lease", &id, "--limit", c]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with(&format!("released lease={lease} limit=1 remaining=1 ")));
    let out = sluice_cli(&server, &["release", "w", "--lease", &id, "--limit", c]);
    assert_eq!(out.status.code(), Some(2), "released twice");
    assert!(stderr(&out).contains("lease not found"), "{}", stderr(&out));
    // In a composite, the lease belongs to the concurrency limit's position.
    let specs = ["token-bucket:5/s", "concurrency:2,lease=30s"];
    let out = sluice_cli(&server, &with_limits(&["acquire", "x"], &specs));
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("  [1] concurrency allowed"))
        .unwrap();
    let id = line.rsplit_once(" lease=").unwrap().1.to_owned();
    let out = sluice_cli(
        &server,
        &with_limits(&["renew", "x", "--lease", &id], &specs),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the position is found: {}",
        stderr(&out)
    );
    let wrong = ["release", "x", "--lease", &id, "--limit", specs[1]];
    assert_eq!(
        sluice_cli(&server, &wrong).status.code(),
        Some(2),
        "position 0 holds nothing"
    );
    let right = [
        "release", "x", "--lease", &id, "--limit", specs[1], "--index", "1",
    ];
    assert_eq!(sluice_cli(&server, &right).status.code(), Some(0));
    // Acquire needs a concurrency limit.
    let out = sluice_cli(&server, &["acquire", "y", "--limit", "token-bucket:5/s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("concurrency"), "{}", stderr(&out));
}

#[test]
fn tiers_reload_and_usage_errors() {
    let free: &[&str] = &["token-bucket:2/h,burst=2", "concurrency:1,lease=30s"];
    let config = ConfigFile::new(&tiers_toml(&[("free", free)]));
    let server = Sluiced::start(&["--config", config.arg()]);
    let out = sluice_cli(&server, &["throttle", "t", "--tier", "free", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_object(&out);
    assert_eq!(v["verdicts"][0]["kind"], "token-bucket");
    let lease = v["verdicts"][1]["lease_id"].as_u64().unwrap().to_string();
    assert_eq!(
        sluice_cli(&server, &["acquire", "t", "--tier", "free"])
            .status
            .code(),
        Some(1)
    );
    let release = [
        "release", "t", "--lease", &lease, "--tier", "free", "--index", "1",
    ];
    assert_eq!(sluice_cli(&server, &release).status.code(), Some(0));
    let out = sluice_cli(&server, &["peek", "t", "--tier", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains(r#"unknown tier (15): "nope" is not one of this node's tiers (free)"#),
        "{}",
        stderr(&out)
    );
    config.write(&tiers_toml(&[
        ("free", free),
        ("paid", &["fixed-window:10/h"]),
    ]));
    let out = sluice_cli(&server, &["reload"]);
    assert_eq!(
        (out.status.code(), stdout(&out).as_str()),
        (Some(0), "reloaded: 2 tiers\n")
    );
    let out = sluice_cli(&server, &["reload", "--json"]);
    assert_eq!(json_object(&out)["tier_count"], 2);
    config.write("[tiers.paid]\nlimits = [\"fixed-window:0/h\"]\n");
    let out = sluice_cli(&server, &["reload"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("config invalid"), "{}", stderr(&out));
    assert_eq!(
        sluice_cli(&server, &["throttle", "t", "--tier", "paid"])
            .status
            .code(),
        Some(0)
    );
    // Exactly one of --rate, --limit, --tier.
    for args in [
        &["throttle", "u"][..],
        &["throttle", "u", "--rate", "1/s", "--tier", "free"],
        &["peek", "u", "--rate", "1/s", "--limit", "concurrency:1"],
        &[
            "throttle",
            "u",
            "--tier",
            "free",
            "--limit",
            "concurrency:1",
        ],
        &["throttle", "u", "--limit", "leaky-bucket:1/s"],
        &["throttle", "u", "--limit", "concurrency:1", "--burst", "2"],
        &["release", "u", "--lease", "1", "--tier", "free"],
    ] {
        let out = sluice_cli(&server, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stdout(&out).is_empty(), "{args:?}");
        assert!(!stderr(&out).is_empty(), "{args:?}");
    }
}

/// A node started without a config file has no tiers to reload: RELOAD is
/// an error that says so, the node logs it, and its log (stderr to a pipe
/// here, as to a file) is plain text, without colour codes.
#[test]
fn reload_without_a_config_file_is_an_error_logged_in_plain_text() {
    use std::process::Command;
    let (mut child, first) = logging_sluiced(&[]);
    let addr = first.split_whitespace().nth(3).unwrap().to_owned();
    let out = Command::new(sluice_tests::support::binary("sluice"))
        .args(["--addr", &addr, "reload"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no config file"), "{err}");
    let _ = child.kill();
    let _ = child.wait();
    let log = stderr_of(&mut child);
    assert!(log.contains("no config file to reload"), "{log}");
    assert!(
        log.contains("trigger=\"RELOAD\"") || log.contains("trigger=RELOAD"),
        "{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log to a pipe: {log:?}"
    );
}

/// Connection refused says what to do: start sluiced, or name another node.
#[test]
fn connection_refused_suggests_starting_sluiced() {
    // Reserved: no one listens on it.
    let port = sluice_tests::support::port();
    let addr = format!("127.0.0.1:{port}");
    let out = std::process::Command::new(sluice_tests::support::binary("sluice"))
        .args(["--addr", &addr, "ping"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("is sluiced running on {addr}?")),
        "{err}"
    );
    assert!(err.contains(&format!("sluiced --port {port}")), "{err}");
}

/// Both --help texts say what scripts and operators need: examples, exit
/// status, environment, signals and the stdout lines; no source constants.
#[test]
fn help_texts_name_examples_exit_codes_environment_and_signals() {
    let help = |bin: &str| {
        let out = std::process::Command::new(sluice_tests::support::binary(bin))
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let sluiced = help("sluiced");
    for needle in [
        "Examples:",
        "Exit status:",
        "SLUICE_LOG",
        "SIGHUP",
        "SIGTERM",
        "sluiced listening on ADDR shards=N",
    ] {
        assert!(sluiced.contains(needle), "sluiced --help lacks {needle:?}");
    }
    assert!(!sluiced.contains("_DEFAULT"), "a source constant in --help");
    let sluice = help("sluice");
    for needle in ["Examples:", "Exit status:", "SLUICE_AUTH_TOKEN"] {
        assert!(sluice.contains(needle), "sluice --help lacks {needle:?}");
    }
}

/// A port already in use says so and what to do, with exit status 2.
#[test]
fn a_port_in_use_says_what_to_do() {
    let first = Sluiced::start(&[]);
    let port = first.addr.port().to_string();
    let out = std::process::Command::new(sluice_tests::support::binary("sluiced"))
        .args(["--bind", "127.0.0.1", "--port", &port])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on"), "{err}");
    assert!(
        err.contains("another sluiced") && err.contains("--port"),
        "{err}"
    );
}

/// A refusal names what is wrong in the user's terms: a tier the node does
/// not have (and that it has none at all), and a cost above a concurrency
/// limit (its limit, not a "burst").
#[test]
fn refusals_name_the_missing_tier_and_the_concurrency_limit() {
    let server = Sluiced::start(&["--shards", "1"]);
    let out = sluice_cli(
        &server,
        &["peek", "user:42", "--tier", "free", "--cost", "3"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(
            r#"unknown tier (15): "free": this node has no tiers (define [tiers.NAME] in the file given to sluiced --config)"#
        ),
        "{}",
        stderr(&out)
    );
    let args = [
        "peek",
        "user:42",
        "--limit",
        "token-bucket:5/s,burst=10",
        "--limit",
        "concurrency:2,lease=30s",
        "--cost",
        "3",
    ];
    let out = sluice_cli(&server, &args);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("limit 1: cost 3 exceeds the concurrency limit of 2"),
        "{}",
        stderr(&out)
    );
}

/// The wrong port for the protocol is said at once, in the protocol the
/// caller speaks: `sluice` at the RESP port, a Redis client (array or
/// inline command) at the binary port.
#[test]
fn a_client_at_the_other_protocols_port_is_told_which_port_to_use() {
    use std::io::{Read, Write};
    let mut server = Sluiced::start(&["--shards", "1", "--resp-port", "0"]);
    let resp = server.resp_addr.expect("a RESP listener").to_string();
    let out = std::process::Command::new(sluice_tests::support::binary("sluice"))
        .args(["--addr", &resp, "--timeout-ms", "30000", "ping"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("the node answered in the Redis protocol (RESP): this is a RESP port"),
        "{}",
        stderr(&out)
    );
    for first in ["*1\r\n$4\r\nPING\r\n", "PING\r\n"] {
        let mut s = std::net::TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        s.write_all(first.as_bytes()).unwrap();
        let mut said = String::new();
        s.read_to_string(&mut said).unwrap();
        assert_eq!(
            said,
            "-ERR this is sluiced's binary port: Redis clients connect to its RESP listener (start sluiced with --resp-port PORT, then use that port)\r\n",
            "{first:?}"
        );
    }
    // Bytes that are neither: the binary protocol's own error, as before.
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    s.write_all(&[0xff, 0xff, 0xff, 0x7f]).unwrap();
    let mut said = Vec::new();
    s.read_to_end(&mut said).unwrap();
    assert_ne!(said.first(), Some(&b'-'), "{said:?}");
    assert!(server.is_running());
}

/// `--log-format json`: every log line is one JSON object, with its level
/// and message, the lifecycle events among them.
#[test]
fn json_logs_are_one_object_per_line() {
    use std::process::Command;
    let (mut child, first) = logging_sluiced(&["--log-format", "json"]);
    assert!(first.starts_with("sluiced listening on "), "{first}");
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    assert!(child.wait().unwrap().success());
    let log = stderr_of(&mut child);
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let messages: Vec<&str> = events
        .iter()
        .map(|e| {
            assert!(e["level"].is_string(), "{e}");
            e["fields"]["message"].as_str().unwrap_or_default()
        })
        .collect();
    assert!(messages.contains(&"serving"), "{messages:?}");
    assert!(messages.contains(&"stopped"), "{messages:?}");
}

/// `sluiced` on a free port, one shard, `SLUICE_LOG=info`, no NO_COLOR,
/// with `args`, its stdout and stderr piped; and its first stdout line.
fn logging_sluiced(args: &[&str]) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(sluice_tests::support::binary("sluiced"))
        .args(["--bind", "127.0.0.1", "--port", "0", "--shards", "1"])
        .args(args)
        .env("SLUICE_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluiced starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    (child, first)
}

/// What a finished child wrote to its piped standard error.
fn stderr_of(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let mut log = String::new();
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut log)
        .expect("readable");
    log
}

/// `--priority` and reserves in a `--limit` spec: with
/// `reserve=critical:20%,reserve=normal:50%` on 10 units, low spends 5,
/// normal 3 more, critical the last 2; each verdict names its class, and
/// a class that may never pass at its cost is told so, not given a wait.
#[test]
fn priority_classes_spend_only_what_their_reserves_leave() {
    let server = Sluiced::start(&["--shards", "2"]);
    let spec = "token-bucket:1/h,burst=10,reserve=critical:20%,reserve=normal:50%";
    let throttle = |class: &str, cost: &str| {
        let out = sluice_cli(
            &server,
            &[
                "throttle",
                "k",
                "--limit",
                spec,
                "--priority",
                class,
                "--cost",
                cost,
                "--json",
            ],
        );
        (out.status.code(), json_object(&out))
    };
    let admitted = |class: &str| {
        (0..12)
            .take_while(|_| {
                let (code, v) = throttle(class, "1");
                assert_eq!(v["priority"], class, "{v:?}");
                code == Some(0)
            })
            .count()
    };
    assert_eq!(admitted("low"), 5);
    let (code, low) = throttle("low", "1");
    assert_eq!((code, low["allowed"].as_bool()), (Some(1), Some(false)));
    // 5 units are left and low needs 6 (its 1 over the floor of 5): one
    // of the 1/h refills, not the zero a plain limit would say.
    let wait = low["retry_after_ms"].as_u64().unwrap();
    assert!((3_590_000..=3_600_000).contains(&wait), "{low:?}");
    assert_eq!(low["remaining"], 0, "nothing left for low");
    assert_eq!(admitted("normal"), 3);
    assert_eq!(admitted("critical"), 2);
    // Human output names a class that is not the default.
    let out = sluice_cli(
        &server,
        &["peek", "k", "--limit", spec, "--priority", "critical"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().next().unwrap().ends_with("priority=critical"),
        "{text}"
    );
    // Low at a cost of 6 needs 11 of 10 units: never, and not a wait.
    let (code, never) = throttle("low", "6");
    assert_eq!(code, Some(1));
    assert_eq!(
        never["retry_after_ms"].as_u64(),
        Some(u64::MAX.div_ceil(1_000_000))
    );
    // A bad reserve is a usage error that says what is wrong.
    let out = sluice_cli(
        &server,
        &[
            "throttle",
            "k",
            "--limit",
            "fixed-window:5/m,reserve=low:10%",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("a reserve for low keeps nothing"),
        "{}",
        stderr(&out)
    );
    let out = sluice_cli(
        &server,
        &[
            "throttle",
            "k",
            "--limit",
            "fixed-window:5/m",
            "--priority",
            "vip",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("critical, normal or low"),
        "{}",
        stderr(&out)
    );
}
