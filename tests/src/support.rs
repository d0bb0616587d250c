//! Real processes: build (once) and locate the workspace's binaries, start
//! `sluiced` on port 0 and learn its port from its first stdout line (and,
//! with `--resp-port`, its RESP address from the second); write the
//! temporary config files `sluiced --config` reads; run the `sluice` CLI.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a server may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A loopback port for a server a test starts on an address it must know
/// first (a restart on the same port, a peer named before it starts),
/// reserved for this test process by [`sluice_cli::drill::ports::reserve`]:
/// a port bound and released can be taken by any outgoing connection on the
/// machine before the server binds it.
pub fn port() -> u16 {
    sluice_cli::drill::ports::reserve().expect("a free loopback port")
}

/// The path of the workspace binary `name` (`sluiced`, `sluice` or
/// `sluice-floor`). The
/// binaries are built first, once per test process, with the test's own
/// profile, so a test never runs a stale server; `SLUICE_BIN_DIR` skips the
/// build and names a directory that holds them (CI builds once).
pub fn binary(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Ok(dir) = std::env::var("SLUICE_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let dir = DIR.get_or_init(|| {
        cargo_build(&[
            "-p",
            "sluice-server",
            "-p",
            "sluice-cli",
            "-p",
            "sluice-benches",
            "--bins",
            "--features",
            "sluice-server/etcd,sluice-server/rls,sluice-cli/rls",
        ]);
        profile_dir()
    });
    dir.join(name)
}

/// The path of the example `name` of `package`, built with `features`, once
/// per test process, like [`binary`]. With `SLUICE_BIN_DIR`, the prebuilt
/// `$SLUICE_BIN_DIR/examples/NAME` when it exists (scripts/test.sh builds
/// it), else it is built here too.
pub fn example(package: &str, name: &str, features: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    if let Ok(dir) = std::env::var("SLUICE_BIN_DIR") {
        let path = PathBuf::from(dir).join("examples").join(name);
        if path.exists() {
            return path;
        }
    }
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|b| b == name) {
        cargo_build(&["-p", package, "--example", name, "--features", features]);
        built.push(name.to_owned());
    }
    profile_dir().join("examples").join(name)
}

/// target/<profile>: where this test's own build puts binaries.
fn profile_dir() -> PathBuf {
    // target/<profile>/deps/<test> -> target/<profile>
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf()
}

/// `cargo build --quiet` with this test's profile and `args`.
fn cargo_build(args: &[&str]) {
    let profile = profile_dir()
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
        .args(["build", "--quiet", "--profile", &cargo_profile])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build {args:?} failed");
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
    /// Where its admin HTTP listener is, when started with `--admin-port`.
    pub admin_addr: Option<SocketAddr>,
    /// Where its Envoy rate limit service is, when started with
    /// `--rls-port`.
    pub rls_addr: Option<SocketAddr>,
    /// Where protocol v1 over TLS is, when started with `--tls-port`.
    pub tls_addr: Option<SocketAddr>,
    /// How many shards it runs.
    pub shards: u16,
}

impl Sluiced {
    /// Starts `sluiced --port 0` on 127.0.0.1 with `args` added. With
    /// `--resp-port` among them, also learns the RESP address from the
    /// second line.
    pub fn start(args: &[&str]) -> Sluiced {
        Sluiced::start_on(0, args)
    }

    /// [`Sluiced::start`] on a given port (0 picks a free one).
    pub fn start_on(port: u16, args: &[&str]) -> Sluiced {
        Sluiced::start_with(port, &[], args)
    }

    /// [`Sluiced::start_on`] with environment variables set.
    pub fn start_with(port: u16, env: &[(&str, &str)], args: &[&str]) -> Sluiced {
        Sluiced::start_full(port, env, args, Stdio::inherit())
    }

    /// [`Sluiced::start`] with its log (stderr, at `info`) written to
    /// `log`, for tests that check what it says.
    pub fn start_logged(log: &Path, args: &[&str]) -> Sluiced {
        let file = std::fs::File::create(log).expect("the log file opens");
        Sluiced::start_full(0, &[("SLUICE_LOG", "info")], args, file.into())
    }

    /// [`Sluiced::start_with`] with stderr going to `stderr`.
    pub fn start_full(port: u16, env: &[(&str, &str)], args: &[&str], stderr: Stdio) -> Sluiced {
        let port = port.to_string();
        let mut child = Command::new(binary("sluiced"))
            .args(["--bind", "127.0.0.1", "--port", &port])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .env("SLUICE_LOG", "warn")
            .envs(env.iter().copied())
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
        // One line per listener asked for, in the order sluiced prints
        // them: "sluiced NAME listening on 127.0.0.1:PORT".
        let next = |flag: &str, name: &str| {
            args.contains(&flag).then(|| {
                let line = rx
                    .recv_timeout(START_TIMEOUT)
                    .unwrap_or_else(|_| panic!("sluiced printed its {name} listening line"));
                line.strip_prefix(&format!("sluiced {name} listening on "))
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("bad line {line:?}"))
            })
        };
        let resp_addr = next("--resp-port", "resp");
        let admin_addr = next("--admin-port", "admin");
        let tls_addr = next("--tls-port", "tls");
        let rls_addr = next("--rls-port", "rls");
        Sluiced {
            child,
            rls_addr,
            tls_addr,
            admin_addr,
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

    /// Waits for the process to exit, up to `limit`; its status.
    pub fn wait_for_exit(mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(start.elapsed() < limit, "sluiced did not exit in {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGHUP: the server re-reads its config file's tiers. Returns
    /// at once; the reload happens soon after (poll for its effect).
    pub fn hangup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
    }

    /// kill -9, and reap it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) and returns at once.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
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

/// A TOML config file for `sluiced --config` in a fresh directory of its
/// own, removed when dropped.
#[derive(Debug)]
pub struct ConfigFile {
    /// The directory, private to this file.
    dir: PathBuf,
    /// The file.
    path: PathBuf,
}

impl ConfigFile {
    /// Writes `toml` to a new file.
    pub fn new(toml: &str) -> ConfigFile {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the config directory");
        let file = ConfigFile {
            path: dir.join("sluiced.toml"),
            dir,
        };
        file.write(toml);
        file
    }

    /// Replaces the file's contents in one step (write, then rename), so
    /// that a reload never reads half a file.
    pub fn write(&self, toml: &str) {
        let tmp = self.dir.join("sluiced.toml.tmp");
        std::fs::write(&tmp, toml).expect("write the config");
        std::fs::rename(&tmp, &self.path).expect("replace the config");
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's path as `sluiced --config` takes it.
    pub fn arg(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The TOML of `tiers`: `[tiers.NAME] limits = ["SPEC", ...]` for each.
pub fn tiers_toml(tiers: &[(&str, &[&str])]) -> String {
    let mut toml = String::new();
    for (name, specs) in tiers {
        let quoted: Vec<String> = specs.iter().map(|s| format!("{s:?}")).collect();
        toml.push_str(&format!(
            "[tiers.{name}]\nlimits = [{}]\n",
            quoted.join(", ")
        ));
    }
    toml
}

/// Runs `sluice --addr ADDR ARGS...` and waits for it.
pub fn sluice_cli(server: &Sluiced, args: &[&str]) -> Output {
    Command::new(binary("sluice"))
        .arg("--addr")
        .arg(server.addr.to_string())
        .args(args)
        .output()
        .expect("sluice runs")
}

/// The one JSON object `--json` printed on one line of `out`'s stdout.
pub fn json_object(out: &Output) -> serde_json::Map<String, serde_json::Value> {
    let text = String::from_utf8(out.stdout.clone()).expect("UTF-8 output");
    assert_eq!(
        text.lines().count(),
        1,
        "exactly one line: {text:?}, stderr {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => panic!("not one JSON object: {text}"),
    }
}

/// A client of `server` with deadlines generous enough for shared machines
/// and debug builds; `shard_aware: false` makes the server forward.
pub async fn client(server: &Sluiced, shard_aware: bool) -> sluice_client::Client {
    let config = sluice_client::ClientConfig {
        deadline: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(20),
        shard_aware,
        ..sluice_client::ClientConfig::default()
    };
    sluice_client::Client::connect_with(server.addr, config)
        .await
        .expect("connect")
}

/// Limits in the CLI's spec syntax (`token-bucket:5/s,burst=5`, ...).
pub fn specs(specs: &[&str]) -> Vec<sluice_protocol::Limit> {
    specs
        .iter()
        .map(|s| s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
        .collect()
}

/// `GET path` over HTTP/1.0 (the admin port): (status code, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("the admin port answers");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::io::Write::write_fmt(
        &mut s,
        format_args!("GET {path} HTTP/1.0\r\nHost: sluice\r\n\r\n"),
    )
    .unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut s, &mut reply).unwrap();
    let code = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {reply:?}"));
    let body = reply
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (code, body)
}

/// The value of the sample `name{labels}` (or `name` alone) in a scrape.
pub fn metric_sample(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{scrape}"))
}
