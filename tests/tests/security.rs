//! Secrets and the way in, against real `sluiced` processes: a config file
//! whose `auth_token` line does not parse never has its token printed;
//! `--auth-token-file` (config `auth_token_file`) reads the token from a
//! file, and refuses to start, with a clear message, when the token is
//! also given another way or the file is unreadable or empty.

use std::process::Command;

use sluice_protocol::message::Reply;
use sluice_tests::raw::{hello, Raw};
use sluice_tests::support::{binary, ConfigFile, Sluiced};

/// The token of these tests: long and unlike anything else in a message.
const TOKEN: &str = "s3cr3t-Tok3n-do-not-print-9f8e7d";

/// Runs `sluiced` with `args` until it exits (a start that fails);
/// returns its exit code and stderr.
fn run_failing(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(binary("sluiced"))
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .args(args)
        .env_remove("SLUICE_AUTH_TOKEN")
        .output()
        .expect("sluiced runs");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), said)
}

/// Every way of writing a bad `auth_token` line stops the start with the
/// line number and never the token. Fails while toml's error (which
/// quotes the source line, and a type error's value) is printed as is.
#[test]
fn a_config_error_on_the_auth_token_line_never_prints_the_token() {
    let broken = [
        format!("auth_token = \"{TOKEN}\n"),
        format!("auth_token = {TOKEN}\n"),
        format!("auth_token = \"{TOKEN}\" trailing\n"),
        format!("auth_token = '{TOKEN}\n"),
        "auth_token = 987654321987\n".to_owned(),
    ];
    for toml in broken {
        let file = ConfigFile::new(&format!("port = 0\n{toml}"));
        let (code, said) = run_failing(&["--config", file.arg()]);
        assert_eq!(code, Some(2), "{said}");
        assert!(said.contains("line 2"), "{said}");
        assert!(!said.contains(TOKEN), "the token is printed: {said}");
        assert!(
            !said.contains("987654321987"),
            "the token is printed: {said}"
        );
    }
    // An error elsewhere still shows its line.
    let file = ConfigFile::new("port = 0\nbatch_max = \"many\"\n");
    let (code, said) = run_failing(&["--config", file.arg()]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("batch_max = \"many\""), "{said}");
}

/// Whether a HELLO with `token` authenticates on `server`.
async fn authenticates(server: &Sluiced, token: &str) -> bool {
    let mut raw = Raw::connect(server.addr).await;
    raw.send_frame(&[(1, hello(token.as_bytes()))]).await;
    matches!(raw.next_reply().await, Some((1, Reply::HelloOk(_))))
}

/// The token read from a file (its trailing newline dropped), by flag and
/// by config key. Fails while there is no --auth-token-file.
#[tokio::test]
async fn the_token_can_come_from_a_file() {
    let file = ConfigFile::new(&format!("{TOKEN}\n"));
    let server = Sluiced::start(&["--auth-token-file", file.arg()]);
    assert!(authenticates(&server, TOKEN).await);
    assert!(!authenticates(&server, "wrong").await);
    drop(server);
    let config = ConfigFile::new(&format!("auth_token_file = {:?}\n", file.arg()));
    let server = Sluiced::start(&["--config", config.arg()]);
    assert!(authenticates(&server, TOKEN).await);
    assert!(!authenticates(&server, &format!("{TOKEN}\n")).await);
}

/// Both ways at once, a missing file and an empty one each stop the start
/// with a message that names the problem (and never the token).
#[test]
fn a_token_file_that_cannot_be_used_stops_the_start() {
    let file = ConfigFile::new(&format!("{TOKEN}\n"));
    let (code, said) = run_failing(&["--auth-token", "other", "--auth-token-file", file.arg()]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("keep one"), "{said}");
    let (code, said) = run_failing(&["--auth-token-file", "/nonexistent/sluice-token"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("/nonexistent/sluice-token: cannot read it"),
        "{said}"
    );
    let empty = ConfigFile::new("\n");
    let (code, said) = run_failing(&["--auth-token-file", empty.arg()]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("empty"), "{said}");
    assert!(!said.contains(TOKEN), "{said}");
}
