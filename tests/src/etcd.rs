//! A single-member etcd of the test's own on loopback (Debian's
//! `etcd-server`; `scripts/deps.sh` installs it), and sluiced nodes that
//! take their group's leadership from it.

use std::net::SocketAddr;
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
    SocketAddr::from(([127, 0, 0, 1], crate::support::port()))
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

    /// How many keys start with `prefix` (etcd's JSON gateway).
    pub fn count(&self, prefix: &str) -> u64 {
        let body = format!(
            r#"{{"key":"{}","range_end":"{}","count_only":true}}"#,
            base64(prefix.as_bytes()),
            base64(&prefix_end(prefix))
        );
        let reply = self.post("/v3/kv/range", &body);
        let count = reply["count"].as_str().unwrap_or("0");
        count.parse().expect("a count")
    }

    /// Deletes `key` (what an operator does with `etcdctl del KEY`).
    pub fn delete(&self, key: &str) {
        let body = format!(r#"{{"key":"{}"}}"#, base64(key.as_bytes()));
        self.post("/v3/kv/deleterange", &body);
    }

    /// POSTs `body` to etcd's JSON gateway at `path`.
    fn post(&self, path: &str, body: &str) -> serde_json::Value {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.addr).expect("etcd answers");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let request = format!(
            "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let json = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
        serde_json::from_str(json).unwrap_or_else(|e| panic!("etcd said {reply:?}: {e}"))
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
    node_advertising(etcd, group, port, &format!("127.0.0.1:{port}"), args)
}

/// [`node`], advertising `advertise` (a proxy in front of it, say: its
/// follower then connects through the proxy).
pub fn node_advertising(
    etcd: &Etcd,
    group: &str,
    port: u16,
    advertise: &str,
    args: &[&str],
) -> Sluiced {
    let ttl = TTL_S.to_string();
    let url = etcd.url();
    let mut all = vec![
        "--coordinator",
        url.as_str(),
        "--group",
        group,
        "--advertise",
        advertise,
        "--leader-ttl-s",
        ttl.as_str(),
    ];
    all.extend_from_slice(args);
    Sluiced::start_on(port, &all)
}

/// The end of the range of keys that start with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    let last = end.last_mut().expect("a non-empty prefix");
    *last += 1;
    end
}

/// Standard base64 with padding (the gateway's encoding of bytes).
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, &b| n << 8 | u32::from(b)) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard_encoding() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"/sluice/"), "L3NsdWljZS8=");
    }
}
