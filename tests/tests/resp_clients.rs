//! Redis client libraries no one here wrote, against the RESP listener of a
//! real `sluiced`, configured as gateways configure them: redis-py from
//! PyPI (`scripts/deps.sh` puts it in `target/redis-py`) with its default
//! settings (it opens with `HELLO 3`), a client name, `db=0`, `protocol=2`
//! and `protocol=3`; and `redis-cli -3`.

use std::path::PathBuf;
use std::process::Command;

use sluice_tests::support::Sluiced;

/// The venv `scripts/deps.sh` makes.
fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = root.join("target/redis-py/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash scripts/deps.sh` (it installs redis-py from PyPI)",
        py.display()
    );
    py
}

#[test]
fn redis_py_with_default_settings_and_every_usual_option_throttles() {
    let server = Sluiced::start(&["--resp-port", "0", "--shards", "2"]);
    let port = server.resp_addr.expect("resp listener").port().to_string();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("resp/redis_py_check.py");
    let out = Command::new(python())
        .arg(script)
        .arg(&port)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for case in ["default", "client_name", "db0", "protocol2", "protocol3"] {
        assert!(stdout.contains(&format!("{case}: ok")), "{stdout}");
    }
}

#[test]
fn redis_cli_in_resp3_throttles_and_says_hello() {
    let server = Sluiced::start(&["--resp-port", "0"]);
    let port = server.resp_addr.expect("resp listener").port().to_string();
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-3", "-h", "127.0.0.1", "-p", &port])
            .args(args)
            .output()
            .expect("redis-cli runs (scripts/deps.sh installs redis-tools)");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let throttled = cli(&["CL.THROTTLE", "cli3", "15", "30", "60"]);
    let lines: Vec<&str> = throttled.lines().collect();
    assert_eq!(lines.len(), 5, "{throttled}");
    assert!(
        lines[0].ends_with('0') && lines[1].ends_with("16"),
        "{throttled}"
    );
    let hello = cli(&["HELLO", "3"]);
    assert!(hello.contains("proto") && hello.contains('3'), "{hello}");
    assert!(
        cli(&["CLIENT", "GETNAME"]).contains("(nil)")
            || cli(&["CLIENT", "GETNAME"]).trim().is_empty()
    );
}
