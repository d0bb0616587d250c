//! `sluice drill --local`: a cluster of `sluiced` processes of the drill's
//! own on loopback, a primary and a follower per group, and the faults it
//! injects into them.
//!
//! Every node runs with `--peer` (the other node of its group) and
//! `--promote-after-ms`, so the group recovers by itself: a follower whose
//! primary went silent promotes itself once the primary's lease has run
//! out, and a primary that comes back to find a newer primary steps down
//! and follows it. The one thing the drill does for the group is to start
//! a killed node again (as its group's follower), as a supervisor would.
//!
//! With links (`--fault partition` or `mixed`), nothing talks to a node
//! directly: clients go through one proxy per node, and each node reaches
//! the other through one proxy per direction (it advertises the proxy
//! into itself, so a planned handover also goes through it). Cutting a
//! node off severs the three proxies that lead into and out of it. The
//! drill's own control calls (ROLE, FAILOVER) go straight to the nodes: a
//! cut link never blinds the drill.
//!
//! Through entry points (`--entry`), every node also has `--cluster` and
//! `--group`, and for RESP or Envoy's rate limit service a port of that
//! protocol too, each reserved like the main one so that a restarted node
//! comes back where the load looks for it; a node has started once it has
//! printed the listening line of each.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_client::Topology;

use super::proxy::Proxy;
use super::DrillError;

/// How long a node may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How the drill's nodes run.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// The `sluiced` binary.
    pub sluiced: PathBuf,
    /// Groups (a primary and a follower each).
    pub groups: usize,
    /// Shards per node.
    pub shards: u16,
    /// `sync` or `async`.
    pub replication: String,
    /// The followers' `--promote-after-ms`.
    pub promote_after_ms: u64,
    /// Put proxies on every link (needed to cut links).
    pub links: bool,
    /// Broken on purpose: the second node of each group is a primary of
    /// its own, with no replication, so every failover starts from empty
    /// buckets (the drill must catch it).
    pub no_replication: bool,
    /// Coordinate through an etcd of the drill's own, with this leader
    /// lease (seconds).
    pub etcd_ttl_s: Option<u64>,
    /// Where the nodes' logs go.
    pub log_dir: PathBuf,
    /// Every node an entry point: started with `--cluster` (the file the
    /// drill writes, `LOG_DIR/cluster.toml`) and `--group`.
    pub entry_points: bool,
    /// Every node also serves RESP (`--resp-port`), for `--entry resp`.
    pub resp: bool,
    /// Every node also serves Envoy's rate limit service (`--rls-port`)
    /// with these rules (envoyproxy/ratelimit YAML, written to
    /// `LOG_DIR/rls.yaml` and named by `--rls-config`), for `--entry rls`.
    pub rls_rules: Option<String>,
}

/// One node of a local group.
#[derive(Debug)]
struct LocalNode {
    /// `g0-a`, `g0-b`, ...
    name: String,
    /// Where it listens (fixed, so that it comes back at the same place).
    listen: SocketAddr,
    /// Its RESP listener, with [`LocalOptions::resp`] (fixed too: a
    /// killed node comes back where the load's connections look for it).
    resp: Option<SocketAddr>,
    /// Its rate limit service, with [`LocalOptions::rls_rules`] (fixed).
    rls: Option<SocketAddr>,
    /// Its process, while running.
    child: Option<Child>,
    /// Stopped with SIGSTOP.
    paused: bool,
    /// With etcd: this node's link to it.
    etcd_link: Option<Proxy>,
}

/// The proxies of a group with links: `client[i]` carries the clients'
/// traffic to node `i`, `peer[i]` the other node's traffic to node `i`.
#[derive(Debug)]
struct Links {
    client: [Proxy; 2],
    peer: [Proxy; 2],
}

/// A local group.
#[derive(Debug)]
struct LocalGroup {
    name: String,
    nodes: [LocalNode; 2],
    links: Option<Links>,
}

/// The drill's own cluster; every process it started is killed when it is
/// dropped (done, failed or interrupted).
#[derive(Debug)]
pub struct LocalCluster {
    options: LocalOptions,
    groups: Vec<LocalGroup>,
    /// The etcd of the drill's own, with --etcd.
    etcd: Option<EtcdProcess>,
}

/// A single-member etcd on loopback.
#[derive(Debug)]
struct EtcdProcess {
    child: Child,
    addr: SocketAddr,
}

impl LocalCluster {
    /// Starts every group: its primary, then its follower, and waits until
    /// the follower streams.
    pub async fn start(options: LocalOptions) -> Result<LocalCluster, DrillError> {
        std::fs::create_dir_all(&options.log_dir)
            .map_err(|e| DrillError(format!("{}: {e}", options.log_dir.display())))?;
        let etcd = match options.etcd_ttl_s {
            Some(_) => Some(start_etcd(&options.log_dir)?),
            None => None,
        };
        let mut cluster = LocalCluster {
            options,
            groups: Vec::new(),
            etcd,
        };
        for g in 0..cluster.options.groups {
            let links = if cluster.options.links {
                let p = || async {
                    Proxy::unbound()
                        .await
                        .map_err(|e| DrillError(e.to_string()))
                };
                Some(Links {
                    client: [p().await?, p().await?],
                    peer: [p().await?, p().await?],
                })
            } else {
                None
            };
            let mut nodes = Vec::new();
            for side in ["a", "b"] {
                let listen = free_port()?;
                let resp = if cluster.options.resp {
                    Some(free_port()?)
                } else {
                    None
                };
                let rls = if cluster.options.rls_rules.is_some() {
                    Some(free_port()?)
                } else {
                    None
                };
                let etcd_link = match &cluster.etcd {
                    Some(e) => Some(
                        Proxy::start(e.addr)
                            .await
                            .map_err(|e| DrillError(e.to_string()))?,
                    ),
                    None => None,
                };
                nodes.push(LocalNode {
                    name: format!("g{g}-{side}"),
                    listen,
                    resp,
                    rls,
                    child: None,
                    paused: false,
                    etcd_link,
                });
            }
            let nodes: [LocalNode; 2] = nodes.try_into().expect("two nodes");
            if let Some(l) = &links {
                for (i, node) in nodes.iter().enumerate() {
                    l.client[i].set_target(node.listen);
                    l.peer[i].set_target(node.listen);
                }
            }
            cluster.groups.push(LocalGroup {
                name: format!("g{g}"),
                nodes,
                links,
            });
        }
        if cluster.options.entry_points {
            // Every node must find itself in the file when it starts.
            let mut toml = String::new();
            for g in cluster.topology().groups {
                let follower = g.follower.unwrap_or_default();
                toml.push_str(&format!(
                    "[[groups]]\nname = \"{}\"\nprimary = \"{}\"\nfollower = \"{follower}\"\n\n",
                    g.name, g.primary
                ));
            }
            let path = cluster.cluster_file();
            std::fs::write(&path, toml)
                .map_err(|e| DrillError(format!("{}: {e}", path.display())))?;
        }
        if let Some(rules) = &cluster.options.rls_rules {
            let path = cluster.rls_file();
            std::fs::write(&path, rules)
                .map_err(|e| DrillError(format!("{}: {e}", path.display())))?;
        }
        for g in 0..cluster.groups.len() {
            cluster.spawn(g, 0, false)?;
            cluster.spawn(g, 1, !cluster.options.no_replication)?;
        }
        Ok(cluster)
    }

    /// The cluster file the nodes read with `entry_points`.
    fn cluster_file(&self) -> PathBuf {
        self.options.log_dir.join("cluster.toml")
    }

    /// The rules file the nodes read with `rls_rules`.
    fn rls_file(&self) -> PathBuf {
        self.options.log_dir.join("rls.yaml")
    }

    /// The cluster file the drill's clients use.
    pub fn topology(&self) -> Topology {
        self.groups.iter().fold(Topology::new(), |t, g| {
            let [a, b] = [0, 1].map(|i| self.public(g, i).to_string());
            t.group(&g.name, &a, Some(&b))
        })
    }

    /// Where the drill's control calls reach node `i` of group `g`
    /// (directly, never through a proxy).
    pub fn control_addr(&self, g: usize, i: usize) -> SocketAddr {
        self.groups[g].nodes[i].listen
    }

    /// The node's address as the topology names it.
    pub fn public_addr(&self, g: usize, i: usize) -> SocketAddr {
        self.public(&self.groups[g], i)
    }

    fn public(&self, g: &LocalGroup, i: usize) -> SocketAddr {
        g.links
            .as_ref()
            .map_or(g.nodes[i].listen, |l| l.client[i].addr)
    }

    /// Where node `i` of group `g` serves RESP, with `resp`.
    pub fn resp_addr(&self, g: usize, i: usize) -> Option<SocketAddr> {
        self.groups[g].nodes[i].resp
    }

    /// Where node `i` of group `g` serves the rate limit service, with
    /// `rls_rules`.
    pub fn rls_addr(&self, g: usize, i: usize) -> Option<SocketAddr> {
        self.groups[g].nodes[i].rls
    }

    /// Whether node `i` of group `g` runs (it was not killed, or was
    /// started again).
    pub fn running(&self, g: usize, i: usize) -> bool {
        self.groups[g].nodes[i].child.is_some()
    }

    /// Starts node `i` of group `g`, as its group's follower if `follow`.
    pub fn spawn(&mut self, g: usize, i: usize, follow: bool) -> Result<(), DrillError> {
        let args = self.args(g, i, follow);
        let group = &mut self.groups[g];
        let node = &mut group.nodes[i];
        let log_path = self.options.log_dir.join(format!("{}.log", node.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| DrillError(format!("{}: {e}", log_path.display())))?;
        let mut child = Command::new(&self.options.sluiced)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .env("SLUICE_LOG", "warn")
            .env("NO_COLOR", "1")
            .spawn()
            .map_err(|e| {
                DrillError(format!(
                    "cannot start {}: {e} (name it with --sluiced PATH)",
                    self.options.sluiced.display()
                ))
            })?;
        let stdout = child.stdout.take().expect("piped stdout");
        // The lines it prints as it starts: where each listener is.
        let expected: Vec<(&str, SocketAddr)> = [
            ("sluiced listening on", Some(node.listen)),
            ("sluiced resp listening on", node.resp),
            ("sluiced rls listening on", node.rls),
        ]
        .into_iter()
        .filter_map(|(prefix, addr)| Some((prefix, addr?)))
        .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let name = node.name.clone();
        let log_copy = log_path.clone();
        let announced = expected.len();
        std::thread::spawn(move || {
            // Hand over the listening lines, and keep draining (into the
            // log) so that the node never blocks on a full pipe.
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            for line in lines.by_ref().take(announced) {
                let _ = tx.send(line);
            }
            let mut log = std::fs::OpenOptions::new().append(true).open(log_copy).ok();
            for line in lines {
                if let Some(f) = log.as_mut() {
                    let _ = writeln!(f, "{name} stdout: {line}");
                }
            }
        });
        if let Err(got) = announcements(&rx, &expected) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DrillError(format!(
                "{} did not start ({got}); see {}",
                node.name,
                log_path.display()
            )));
        }
        node.child = Some(child);
        node.paused = false;
        Ok(())
    }

    /// The command line of node `i` of group `g`.
    fn args(&self, g: usize, i: usize, follow: bool) -> Vec<String> {
        let o = &self.options;
        let group = &self.groups[g];
        let node = &group.nodes[i];
        let other = 1 - i;
        // How this node reaches the other, and the other reaches it.
        let (to_other, to_me) = match &group.links {
            Some(l) => (l.peer[other].addr, Some(l.peer[i].addr)),
            None => (group.nodes[other].listen, None),
        };
        let mut args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--port",
            &node.listen.port().to_string(),
            "--shards",
            &o.shards.to_string(),
            "--replication",
            &o.replication,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // The other entries, on ports of their own that a restarted node
        // gets back.
        if let Some(resp) = node.resp {
            args.extend(["--resp-port".to_owned(), resp.port().to_string()]);
        }
        if let Some(rls) = node.rls {
            args.extend([
                "--rls-port".to_owned(),
                rls.port().to_string(),
                "--rls-config".to_owned(),
                self.rls_file().display().to_string(),
            ]);
        }
        if o.no_replication {
            return args;
        }
        if let (Some(ttl), Some(link)) = (o.etcd_ttl_s, &node.etcd_link) {
            let advertise = to_me.unwrap_or(node.listen);
            args.extend([
                "--coordinator".to_owned(),
                format!("etcd://{}", link.addr),
                "--group".to_owned(),
                group.name.clone(),
                "--advertise".to_owned(),
                advertise.to_string(),
                "--leader-ttl-s".to_owned(),
                ttl.to_string(),
            ]);
            return args;
        }
        if o.entry_points {
            args.extend([
                "--cluster".to_owned(),
                self.cluster_file().display().to_string(),
                "--group".to_owned(),
                group.name.clone(),
            ]);
        }
        args.extend([
            "--promote-after-ms".to_owned(),
            o.promote_after_ms.to_string(),
            "--peer".to_owned(),
            to_other.to_string(),
        ]);
        if let Some(me) = to_me {
            args.extend(["--advertise".to_owned(), me.to_string()]);
        }
        if follow {
            args.extend(["--replica-of".to_owned(), to_other.to_string()]);
        }
        args
    }

    /// kill -9 of node `i` of group `g`.
    pub fn kill(&mut self, g: usize, i: usize) {
        if let Some(mut child) = self.groups[g].nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`stop`) or SIGCONT of node `i` of group `g`.
    pub fn pause(&mut self, g: usize, i: usize, stop: bool) -> Result<(), DrillError> {
        let node = &mut self.groups[g].nodes[i];
        let Some(child) = &node.child else {
            return Err(DrillError(format!("{} is not running", node.name)));
        };
        signal(child.id(), if stop { "STOP" } else { "CONT" })?;
        node.paused = stop;
        Ok(())
    }

    /// Cuts node `i` of group `g` off from the clients and from the other
    /// node (`cut`), or mends its links.
    pub fn cut(&self, g: usize, i: usize, cut: bool) -> Result<(), DrillError> {
        let group = &self.groups[g];
        let Some(l) = &group.links else {
            return Err(DrillError(
                "this cluster has no links to cut (start it for partition)".into(),
            ));
        };
        // With etcd, its link to etcd too: the node is cut off entirely.
        let etcd = group.nodes[i].etcd_link.as_ref();
        for p in [&l.client[i], &l.peer[i], &l.peer[1 - i]]
            .into_iter()
            .chain(etcd)
        {
            if cut {
                p.sever();
            } else {
                p.mend();
            }
        }
        Ok(())
    }

    /// SIGSTOP (`stop`) or SIGCONT of the drill's etcd.
    pub fn etcd_pause(&self, stop: bool) -> Result<(), DrillError> {
        let e = self
            .etcd
            .as_ref()
            .ok_or_else(|| DrillError("this cluster has no etcd (--etcd)".into()))?;
        signal(e.child.id(), if stop { "STOP" } else { "CONT" })
    }

    /// Cuts (or mends) the link between node `i` of group `g` and etcd.
    pub fn cut_etcd(&self, g: usize, i: usize, cut: bool) -> Result<(), DrillError> {
        let link = self.groups[g].nodes[i]
            .etcd_link
            .as_ref()
            .ok_or_else(|| DrillError("this cluster has no etcd (--etcd)".into()))?;
        if cut {
            link.sever();
        } else {
            link.mend();
        }
        Ok(())
    }

    /// Where the nodes' logs are.
    pub fn log_dir(&self) -> &Path {
        &self.options.log_dir
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if let Some(e) = self.etcd.as_mut() {
            let _ = signal(e.child.id(), "CONT");
            let _ = e.child.kill();
            let _ = e.child.wait();
        }
        for g in &mut self.groups {
            for node in &mut g.nodes {
                if let Some(mut child) = node.child.take() {
                    // SIGKILL ends a stopped process too.
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }
}

/// Waits for a starting node's listening lines, in `expected`'s order,
/// each naming the address it was given (the main line also says the
/// shards after the address); `Err` says what came instead.
fn announcements(
    lines: &std::sync::mpsc::Receiver<String>,
    expected: &[(&str, SocketAddr)],
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    for &(prefix, addr) in expected {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines
            .recv_timeout(left)
            .map_err(|e| format!("waiting for `{prefix} ...`: {e}"))?;
        let named = line
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse::<SocketAddr>().ok());
        if named != Some(addr) {
            return Err(format!("{line:?}, not `{prefix} {addr}`"));
        }
    }
    Ok(())
}

/// Starts etcd (on PATH) on free loopback ports, its data in `dir/etcd`,
/// and waits until it answers /health.
fn start_etcd(dir: &Path) -> Result<EtcdProcess, DrillError> {
    let data = dir.join("etcd");
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(dir).map_err(|e| DrillError(e.to_string()))?;
    let (addr, peer) = (free_port()?, free_port()?);
    let (client, peer) = (format!("http://{addr}"), format!("http://{peer}"));
    let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| DrillError(e.to_string()))?;
    let mut child = Command::new("etcd")
        .args(["--name", "drill", "--data-dir"])
        .arg(&data)
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args([
            "--initial-cluster",
            &format!("drill={peer}"),
            "--log-level",
            "error",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| {
            DrillError(format!(
                "cannot start etcd: {e} (Debian: apt-get install etcd-server)"
            ))
        })?;
    let start = std::time::Instant::now();
    while !etcd_healthy(addr) {
        if start.elapsed() > START_TIMEOUT {
            let _ = child.kill();
            return Err(DrillError("etcd did not become healthy".into()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(EtcdProcess { child, addr })
}

/// Whether the etcd at `addr` says it is healthy (GET /health).
pub fn etcd_healthy(addr: SocketAddr) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// A loopback address for a node or etcd to listen on, reserved for this
/// drill ([`super::ports::reserve`]): a node killed and restarted gets it
/// back.
fn free_port() -> Result<SocketAddr, DrillError> {
    let port = super::ports::reserve().map_err(|e| DrillError(e.to_string()))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// `kill -SIG pid`.
fn signal(pid: u32, sig: &str) -> Result<(), DrillError> {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .map_err(|e| DrillError(format!("kill -{sig}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(DrillError(format!("kill -{sig} {pid} failed")))
    }
}
