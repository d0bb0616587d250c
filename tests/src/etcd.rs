//! A single-member etcd of the test's own on loopback (Debian's
//! `etcd-server`; `scripts/deps.sh` installs it), and sluiced nodes that
//! take their group's leadership from it.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::Sluiced;

/// The leader lease the tests' nodes use, in seconds (etcd's smallest
/// practical one).
pub const TTL_S: u64 = 2;

/// A running etcd, killed when dropped.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    /// Its client address.
    pub addr: SocketAddr,
    peer: SocketAddr,
    dir: PathBuf,
}

fn free() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

impl Etcd {
    /// Starts etcd on free loopback ports, with a fresh data directory,
    /// and waits until it answers /health.
    pub fn start() -> Etcd {
        let dir = std::env::temp_dir().join(format!(
            "sluice-etcd-{}-{}",
            std::process::id(),
            free().port()
        ));
        let mut etcd = Etcd {
            child: None,
            addr: free(),
            peer: free(),
            dir,
        };
        etcd.run();
        etcd
    }

    fn run(&mut self) {
        let client = format!("http://{}", self.addr);
        let peer = format!("http://{}", self.peer);
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts (scripts/deps.sh installs etcd-server)");
        self.child = Some(child);
        self.wait_healthy();
    }

    /// Waits until etcd answers /health (panics after 30 s).
    pub fn wait_healthy(&self) {
        let start = Instant::now();
        while !sluice_cli::drill::local::etcd_healthy(self.addr) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcd did not become healthy"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `--coordinator etcd://ADDR`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.addr)
    }

    /// Sends a signal (`STOP`, `CONT`).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A node of `group` coordinated by `etcd`, on a fixed free port (so that
/// it can come back at the same address), with `args` added.
pub fn node(etcd: &Etcd, group: &str, port: u16, args: &[&str]) -> Sluiced {
    let advertise = format!("127.0.0.1:{port}");
    let ttl = TTL_S.to_string();
    let url = etcd.url();
    let mut all = vec![
        "--coordinator",
        url.as_str(),
        "--group",
        group,
        "--advertise",
        advertise.as_str(),
        "--leader-ttl-s",
        ttl.as_str(),
    ];
    all.extend_from_slice(args);
    Sluiced::start_on(port, &all)
}

/// A free loopback port.
pub fn port() -> u16 {
    free().port()
}
