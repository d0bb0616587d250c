//! The spec is enough to write a client from: clients/python/sluice.py,
//! written from protocol/PROTOCOL.md's "Minimal client" section with
//! Python's standard library only, passes its tests against a real
//! `sluiced` (auth, the golden conversation's verdicts, a bucket running
//! out, error codes).

use std::process::Command;

use sluice_tests::support::Sluiced;

#[test]
fn the_python_client_passes_its_tests_against_a_real_node() {
    let server = Sluiced::start(&["--shards", "2", "--auth-token", "s3cret"]);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("python3")
        .arg(root.join("clients/python/test_sluice.py"))
        .env("SLUICE_ADDR", server.addr.to_string())
        .env("SLUICE_TOKEN", "s3cret")
        .env("SLUICE_SHARDS", "2")
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("Ran 7 tests"), "{said}");
}
