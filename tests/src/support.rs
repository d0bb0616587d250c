//! Real processes: build (once) and locate the workspace's binaries, start
//! `sluiced` on port 0 and learn its port from its first stdout line (and,
//! with `--resp-port`, its RESP address from the second).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a server may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// The path of the workspace binary `name` (`sluiced` or `sluice`). The
/// binaries are built first, once per test process, with the test's own
/// profile, so a test never runs a stale server; `SLUICE_BIN_DIR` skips the
/// build and names a directory that holds them (CI builds once).
pub fn binary(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Ok(dir) = std::env::var("SLUICE_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let dir = DIR.get_or_init(|| {
        // target/<profile>/deps/<test> -> target/<profile>
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .parent()
            .and_then(|d| d.parent())
            .expect("target/<profile>")
            .to_path_buf();
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("debug")
            .to_owned();
        let cargo_profile = if profile == "debug" {
            "dev".to_owned()
        } else {
            profile
        };
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "--profile",
                &cargo_profile,
                "-p",
                "sluice-server",
                "-p",
                "sluice-client",
                "--bins",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the binaries failed");
        profile_dir
    });
    dir.join(name)
}

/// A running `sluiced`, killed when dropped.
#[derive(Debug)]
pub struct Sluiced {
    /// The process.
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where its RESP listener is, when started with `--resp-port`.
    pub resp_addr: Option<SocketAddr>,
    /// How many shards it runs.
    pub shards: u16,
}

impl Sluiced {
    /// Starts `sluiced --port 0` on 127.0.0.1 with `args` added. With
    /// `--resp-port` among them, also learns the RESP address from the
    /// second line.
    pub fn start(args: &[&str]) -> Sluiced {
        let mut child = Command::new(binary("sluiced"))
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env("SLUICE_LOG", "warn")
            .spawn()
            .expect("sluiced starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Hand over the listening lines, and keep draining so the
            // server never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(START_TIMEOUT)
            .expect("sluiced printed its listening line");
        // "sluiced listening on 127.0.0.1:PORT shards=N"
        let mut words = line.split_whitespace().skip(3);
        let addr = words
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let shards = words
            .next()
            .and_then(|s| s.strip_prefix("shards="))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let resp_addr = args.contains(&"--resp-port").then(|| {
            let line = rx
                .recv_timeout(START_TIMEOUT)
                .expect("sluiced printed its RESP listening line");
            // "sluiced resp listening on 127.0.0.1:PORT"
            line.strip_prefix("sluiced resp listening on ")
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("bad line {line:?}"))
        });
        Sluiced {
            child,
            addr,
            resp_addr,
            shards,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                start.elapsed() < STOP_TIMEOUT,
                "sluiced did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }
}

impl Drop for Sluiced {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
