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
//! - A ```` ```console long ```` block runs only with `SLUICE_DOCS_LONG=1`:
//!   builds, installs, benchmarks and drills, which take minutes each
//!   (`SLUICE_DOCS_LONG=1 cargo nextest run -p sluice-tests --test
//!   docs_examples`: about 30 minutes on 2 cores, mostly compare.sh,
//!   cargo bench and the 100-round drill). Its servers stop at the
//!   block's end; it installs under target/docs-long/ (CARGO_INSTALL_ROOT)
//!   and compare.sh writes its report there (OUT), so the run touches
//!   neither ~/.cargo/bin nor BENCHMARKS.md.
//!
//! Every other block is a template a reader fills in (a cluster of their
//! own) or the test command itself: `the_only_blocks_not_run_are_known`
//! lists them, so a new example cannot slip past the runner.
//!
//! The examples use fixed ports (7700 to 7706, 7710 to 7731, 7750 and
//! 7751 for the entry-point cluster, and etcd's 2379 and 2380, 6380,
//! 6390 and 6391 for RESP, 9770 for the admin endpoints, 8080 and
//! 8081 for the example gateway, 7740 and 8091 for the rate limit
//! service in docs/ENVOY.md, 6379 for Redis in the long blocks):
//! nothing else may listen there while this runs.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
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
    /// Its block's index in the file, and whether it is a `console long`
    /// block (run only with `SLUICE_DOCS_LONG=1`; its servers stop at the
    /// block's end).
    block: usize,
    long: bool,
}

/// The `console` blocks of `text`, as steps.
fn steps(file: &str, text: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut in_block = false;
    let (mut block, mut long) = (0, false);
    let mut lines = text.lines().enumerate().peekable();
    while let Some((n, line)) = lines.next() {
        if !in_block {
            let info = line.trim_end();
            in_block = info == "```console" || info == "```console long";
            if in_block {
                block += 1;
                long = info.ends_with(" long");
            }
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
                block,
                long,
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

/// Whether the `console long` blocks run too (`SLUICE_DOCS_LONG=1`).
fn long_blocks() -> bool {
    std::env::var("SLUICE_DOCS_LONG").is_ok_and(|v| v == "1")
}

/// Stops background servers: each one's whole process group (`cargo run`
/// does not pass a kill on to the program it runs, and a `for` loop's
/// servers outlive their shell). Every one has a group of its own
/// (`process_group(0)`), never the test's.
fn stop(servers: &mut Vec<Child>) {
    for mut s in servers.drain(..) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", s.id())])
            .stderr(Stdio::null())
            .status();
        let _ = s.kill();
        let _ = s.wait();
    }
}

/// Runs `file`'s console blocks (the `long` ones only with
/// `SLUICE_DOCS_LONG=1`); returns how many commands ran.
fn run_file(file: &str) -> usize {
    let text = std::fs::read_to_string(root().join(file)).expect("the file");
    let long = long_blocks();
    let steps: Vec<Step> = steps(file, &text)
        .into_iter()
        .filter(|s| long || !s.long)
        .collect();
    let mut servers: Vec<Child> = Vec::new();
    let mut block_servers: Vec<Child> = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for (i, step) in steps.iter().enumerate() {
            let started = std::time::Instant::now();
            if step.long {
                run_step(step, &mut block_servers);
                eprintln!("{}: {:.1?}: {}", step.at, started.elapsed(), step.command);
                if steps.get(i + 1).is_none_or(|next| next.block != step.block) {
                    stop(&mut block_servers);
                }
            } else {
                run_step(step, &mut servers);
            }
        }
    }));
    stop(&mut block_servers);
    stop(&mut servers);
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
    if long_blocks() {
        // What the long blocks install and write goes under target/, not
        // into ~/.cargo/bin or over the repository's BENCHMARKS.md.
        let scratch = root().join("target/docs-long");
        command
            .env("CARGO_INSTALL_ROOT", scratch.join("install"))
            .env("OUT", scratch.join("BENCHMARKS.md"));
    }
    command
}

fn run_step(step: &Step, servers: &mut Vec<Child>) {
    if step.background {
        let mut child = shell(&step.command)
            .process_group(0)
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
            // A server may be built first (`cargo run`: minutes on 2 cores
            // for a release build, or in a long run, which may come first).
            let wait = Duration::from_secs(if long_blocks() { 900 } else { 30 });
            match rx.recv_timeout(wait) {
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

/// The markdown files whose examples run.
fn documented_files() -> Vec<String> {
    let mut files = vec!["README.md".to_owned(), "protocol/PROTOCOL.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/*.md");
    files.extend(docs);
    files
}

/// Shell blocks that are not `console` blocks, by their first line: each
/// is a template or the test command, and none can be run as it stands.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "sluice --cluster cluster.toml drill --fault handover --fault-cmd 'sluice --addr {addr} failover'",
        "a template: a cluster someone else runs, and their fault command",
    ),
    (
        "bash scripts/test.sh",
        "the test command itself, which CI runs (.ci/run)",
    ),
];

/// Every fenced block that looks like a shell session (`sh`, `bash`,
/// `shell`, or a line starting `$ `) is either a `console` block the runner
/// runs or one of NOT_RUN.
#[test]
fn the_only_blocks_not_run_are_known() {
    let mut unknown = Vec::new();
    for file in documented_files() {
        let text = std::fs::read_to_string(root().join(&file)).expect("the file");
        let mut lines = text.lines().enumerate();
        while let Some((n, line)) = lines.next() {
            let Some(info) = line.trim_end().strip_prefix("```") else {
                continue;
            };
            let body: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| !l.starts_with("```"))
                .collect();
            let runs = info == "console" || info == "console long";
            let shell =
                matches!(info, "sh" | "bash" | "shell") || body.iter().any(|l| l.starts_with("$ "));
            if runs || !shell {
                continue;
            }
            let first = body.iter().find(|l| !l.trim().is_empty()).map(|l| l.trim());
            if !first.is_some_and(|f| NOT_RUN.iter().any(|(line, _)| *line == f)) {
                unknown.push(format!("{file}:{}: ```{info} {first:?}", n + 1));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "blocks the runner does not run (make them `console` blocks, or add them to NOT_RUN with the reason): {unknown:#?}"
    );
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
    for file in documented_files()
        .into_iter()
        .filter(|f| f.starts_with("docs/"))
    {
        run_file(&file);
    }
}
