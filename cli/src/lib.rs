//! The `sluice` command-line tool's library half: what it prints for each
//! reply, and the load generator behind `sluice bench`. Kept out of
//! `sluice-client` so that a gateway linking the client library compiles
//! neither clap, serde_json nor hdrhistogram.
//!
//! Layout:
//! - [`report`]: what the `sluice` command line prints for each reply.
//! - [`bench`]: `sluice bench`, the closed-loop load generator (Sluice or
//!   Redis + Lua).
//! - [`drill`]: `sluice drill`, failover drills and their report.

pub mod bench;
pub mod drill;

use sluice_client::{Cluster, ClusterConfig, Error, Topology};

/// The cluster `--cluster` names: a cluster file, or (feature `etcd`)
/// `etcd://HOST:PORT[,...][/CLUSTER]`, whose layout the client then
/// follows as it changes. Returns the layout as it is now, too.
pub async fn open_cluster(
    spec: &std::path::Path,
    config: ClusterConfig,
) -> Result<(Topology, Cluster), Error> {
    let text = spec.to_string_lossy();
    if text.starts_with("etcd://") {
        #[cfg(feature = "etcd")]
        {
            let topology = Topology::from_etcd(&text).await?;
            let cluster = Cluster::from_etcd(&text, config).await?;
            return Ok((topology, cluster));
        }
        #[cfg(not(feature = "etcd"))]
        return Err(Error::Invalid(format!(
            "{text}: this sluice was built without etcd (cargo build -p sluice-cli --features etcd; it needs protoc)"
        )));
    }
    let topology = Topology::load(spec)?;
    let cluster = Cluster::new(&topology, config)?;
    Ok((topology, cluster))
}
pub mod report;
