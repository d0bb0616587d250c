//! The `sluice` command line against a real `sluiced`: ping, throttle and
//! peek, human and `--json` output, exit codes.

use std::process::{Command, Output};

use sluice_tests::support::{binary, Sluiced};

fn sluice(server: &Sluiced, args: &[&str]) -> Output {
    Command::new(binary("sluice"))
        .arg("--addr")
        .arg(server.addr.to_string())
        .args(args)
        .output()
        .expect("sluice runs")
}

fn json(out: &Output) -> serde_json::Map<String, serde_json::Value> {
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(text.lines().count(), 1, "exactly one line: {text:?}");
    let serde_json::Value::Object(map) = serde_json::from_str(&text).expect("one JSON object")
    else {
        panic!("not an object: {text}");
    };
    map
}

#[test]
fn ping_answers() {
    let server = Sluiced::start(&["--shards", "3"]);
    let out = sluice(&server, &["ping"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("PONG from ") && text.contains("3 shards"),
        "{text}"
    );
}

#[test]
fn throttle_json_has_exactly_the_promised_keys() {
    let server = Sluiced::start(&[]);
    let args = [
        "throttle", "cli-user", "--rate", "10/s", "--burst", "2", "--json",
    ];
    let first = sluice(&server, &args);
    assert_eq!(first.status.code(), Some(0));
    let v = json(&first);
    let mut keys: Vec<&str> = v.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "allowed",
            "limit",
            "remaining",
            "reset_after_ms",
            "retry_after_ms"
        ]
    );
    assert_eq!(v["allowed"], true);
    assert_eq!(v["limit"], 2);
    assert_eq!(v["remaining"], 1);
    assert_eq!(v["retry_after_ms"], 0);
    assert_eq!(sluice(&server, &args).status.code(), Some(0));
    let denied = sluice(&server, &args);
    assert_eq!(denied.status.code(), Some(1), "denied exits 1");
    let v = json(&denied);
    assert_eq!(v["allowed"], false);
    let retry = v["retry_after_ms"].as_u64().unwrap();
    assert!(
        (1..=100).contains(&retry),
        "one unit per 100 ms, got {retry}"
    );
    assert!(v["reset_after_ms"].as_u64().unwrap() <= 200);
}

#[test]
fn throttle_human_output_peek_and_errors() {
    let server = Sluiced::start(&[]);
    let out = sluice(&server, &["throttle", "h", "--rate", "5/m", "--cost", "2"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("allowed limit=5 remaining=3 "), "{text}");
    let out = sluice(
        &server,
        &["peek", "h", "--rate", "5/m", "--cost", "3", "--json"],
    );
    let v = json(&out);
    assert_eq!(
        (v["allowed"].as_bool(), v["remaining"].as_u64()),
        (Some(true), Some(0))
    );
    // Peek spent nothing.
    let out = sluice(&server, &["peek", "h", "--rate", "5/m", "--json"]);
    assert_eq!(json(&out)["remaining"], 2);
    // A cost above the burst, and a bad rate: exit 2 with a message.
    let out = sluice(&server, &["throttle", "h", "--rate", "5/m", "--cost", "6"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("exceeds burst"));
    let out = sluice(&server, &["throttle", "h", "--rate", "5/fortnight"]);
    assert_eq!(out.status.code(), Some(2));
    for rate in ["10/250ms", "1/d", "3/10s", "100/h"] {
        let key = format!("periods-{rate}");
        let out = sluice(&server, &["throttle", &key, "--rate", rate]);
        assert!(out.status.success(), "{rate}");
    }
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let server = Sluiced::start(&[]);
    let addr = server.addr.to_string();
    drop(server);
    let out = Command::new(binary("sluice"))
        .args(["--addr", &addr, "ping"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("cannot connect"));
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // `sluice stats | head -1`: the reader is gone before sluice writes.
    // Rust ignores SIGPIPE, so println! used to panic (status 101 and a
    // backtrace); the output now ends quietly, with status 0.
    let server = Sluiced::start(&["--shards", "4"]);
    let mut child = Command::new(binary("sluice"))
        .args(["--addr", &server.addr.to_string(), "stats"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sluice runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("sluice ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn role_every_ms_prints_one_object_a_sample() {
    let server = Sluiced::start(&["--shards", "1"]);
    let out = sluice(
        &server,
        &["role", "--json", "--every-ms", "5", "--count", "4"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "four samples: {text:?}");
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object a line");
        assert_eq!(v["role"], "primary", "{line}");
        assert_eq!(v["state"], "alone", "{line}");
    }
}
