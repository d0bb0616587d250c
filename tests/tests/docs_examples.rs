//! The documentation's examples run as written and print what they show.
//!
//! Every ```` ```console ```` block of README.md, docs/*.md and
//! protocol/PROTOCOL.md is a session a reader types, from the repository's
//! root, with `sluiced` and `sluice` on PATH (as `cargo install` puts
//! them):
//!
//! - `$ COMMAND` runs `COMMAND` with `sh -c` (a line ending in `\` goes on
//!   on the next one). The lines after it, up to the next `$`, are what it
//!   prints on stdout: `...` inside a line stands for any text, and a line
//!   that is only `...` for any number of lines. `[exit N]` as the last of
//!   them: the command exits N (otherwise it must exit 0).
//! - `$ COMMAND &` starts a server in the background: the lines after it
//!   are the first lines it prints (which also says it is ready). It is
//!   stopped once the file's last block has run, so later blocks of the
//!   same file talk to it, as a reader's would.
//!
//! Blocks of other kinds (```` ```sh ````) are not run: builds, installs,
//! benchmarks, drills and clusters on etcd take minutes or machines of
//! their own, and have tests of their own.
//!
//! The examples use fixed ports (7700 to 7703, 6380 for RESP, 9770 for the
//! admin endpoints, 8080 and 8081 for the example gateway): nothing else
//! may listen there while this runs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// One `$` command and what it must print.
#[derive(Debug)]
struct Step {
    /// File and line, for messages.
    at: String,
    command: String,
    expected: Vec<String>,
    exit: i32,
    background: bool,
}

/// The `console` blocks of `text`, as steps.
fn steps(file: &str, text: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut lines = text.lines().enumerate().peekable();
    while let Some((n, line)) = lines.next() {
        if !in_block {
            in_block = line.trim_end() == "```console";
            continue;
        }
        if line.starts_with("```") {
            in_block = false;
            continue;
        }
        if let Some(cmd) = line.strip_prefix("$ ") {
            let mut command = cmd.to_owned();
            while command.ends_with('\\') {
                command.pop();
                let (_, next) = lines.next().expect("a continued command goes on");
                command.push_str(next);
            }
            let command = command.trim().to_owned();
            let (command, background) = match command.strip_suffix('&') {
                Some(c) => (c.trim().to_owned(), true),
                None => (command, false),
            };
            out.push(Step {
                at: format!("{file}:{}", n + 1),
                command,
                expected: Vec::new(),
                exit: 0,
                background,
            });
        } else if let Some(step) = out.last_mut() {
            match line
                .strip_prefix("[exit ")
                .and_then(|r| r.strip_suffix(']'))
            {
                Some(code) => step.exit = code.parse().expect("[exit N]"),
                None => step.expected.push(line.to_owned()),
            }
        } else {
            panic!("{file}:{}: a console block starts with `$ `", n + 1);
        }
    }
    out
}

/// Whether `line` matches `pattern`, where `...` stands for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split("...").collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `lines` match `patterns`, where a `...` line stands for any
/// number of lines.
fn lines_match(patterns: &[String], lines: &[&str]) -> bool {
    match patterns.split_first() {
        None => lines.is_empty(),
        Some((p, rest)) if p == "..." => {
            (0..=lines.len()).any(|skip| lines_match(rest, &lines[skip..]))
        }
        Some((p, rest)) => {
            lines.first().is_some_and(|l| line_matches(p, l)) && lines_match(rest, &lines[1..])
        }
    }
}

/// The workspace root (examples run from there).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_owned()
}

/// PATH with the binaries the tests start first.
fn path() -> String {
    let bin = sluice_tests::support::binary("sluice");
    let dir = bin.parent().expect("a directory").display().to_string();
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

/// Runs `file`'s console blocks; returns how many commands ran.
fn run_file(file: &str) -> usize {
    let text = std::fs::read_to_string(root().join(file)).expect("the file");
    let steps = steps(file, &text);
    let mut servers: Vec<Child> = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for step in &steps {
            run_step(step, &mut servers);
        }
    }));
    for mut s in servers {
        // Its children first: `cargo run` does not pass a kill on to the
        // program it runs.
        let _ = Command::new("pkill")
            .args(["-KILL", "-P", &s.id().to_string()])
            .status();
        let _ = s.kill();
        let _ = s.wait();
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    steps.len()
}

/// `sh -c SCRIPT` as a reader's shell: from the root, with the binaries on
/// PATH, no token in the environment.
fn shell(script: &str) -> Command {
    let mut command = Command::new("sh");
    command
        .args(["-c", script])
        .current_dir(root())
        .env("PATH", path())
        .env_remove("SLUICE_AUTH_TOKEN")
        .env("SLUICE_LOG", "warn")
        .stdin(Stdio::null());
    command
}

fn run_step(step: &Step, servers: &mut Vec<Child>) {
    if step.background {
        // `exec`: stopping the child stops the server itself.
        let mut child = shell(&format!("exec {}", step.command))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("sh runs");
        let stdout = child.stdout.take().expect("piped");
        servers.push(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut got = Vec::new();
        for _ in &step.expected {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => got.push(line),
                Err(_) => break,
            }
        }
        let got: Vec<&str> = got.iter().map(String::as_str).collect();
        assert!(
            lines_match(&step.expected, &got),
            "{}: `{}` printed {got:#?}, the docs show {:#?}",
            step.at,
            step.command,
            step.expected
        );
        return;
    }
    let out = shell(&step.command).output().expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // HTTP's CRLF (curl -i) as a terminal shows it.
    let got: Vec<&str> = stdout.lines().map(|l| l.trim_end_matches('\r')).collect();
    assert_eq!(
        out.status.code(),
        Some(step.exit),
        "{}: `{}` exited {:?}; stderr: {}",
        step.at,
        step.command,
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        lines_match(&step.expected, &got),
        "{}: `{}` printed {got:#?}, the docs show {:#?}; stderr: {}",
        step.at,
        step.command,
        step.expected,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_runner_matches_lines_and_wildcards() {
    assert!(line_matches("a ... b", "a x y b"));
    assert!(line_matches("reset_after=...ms", "reset_after=590ms"));
    assert!(!line_matches("a ... b", "a x y c"));
    assert!(!line_matches("exact", "exact!"));
    let p = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert!(lines_match(
        &p(&["one", "...", "four"]),
        &["one", "two", "three", "four"]
    ));
    assert!(lines_match(&p(&["one", "..."]), &["one"]));
    assert!(!lines_match(&p(&["one", "two"]), &["one"]));
    let s = steps(
        "x.md",
        "```console\n$ a \\\n  b &\nline\n$ c\n[exit 1]\n```\n```sh\n$ not run\n```\n",
    );
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].command.as_str(), s[0].background), ("a   b", true));
    assert_eq!(s[0].expected, ["line"]);
    assert_eq!((s[1].command.as_str(), s[1].exit), ("c", 1));
}

/// README.md's examples.
#[test]
fn the_readme_examples_run_as_written() {
    let ran = run_file("README.md");
    assert!(
        ran >= 10,
        "only {ran} commands in README.md's console blocks"
    );
}

/// PROTOCOL.md's minimal client, and docs/*.md (none has a console block
/// yet; one added there runs from then on).
#[test]
fn the_protocol_and_docs_examples_run_as_written() {
    let ran = run_file("protocol/PROTOCOL.md");
    assert!(
        ran >= 2,
        "only {ran} commands in PROTOCOL.md's console blocks"
    );
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/*.md");
    for file in docs {
        run_file(&file);
    }
}
