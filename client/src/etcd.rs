//! The cluster's layout from etcd (feature `etcd`): the groups, their
//! members and their current leaders, as the nodes started with
//! `sluiced --coordinator` register them under `/sluice/CLUSTER/groups/`,
//! watched so that a running [`Cluster`] follows every change: a group
//! added or removed is routed to (or away from) at once, and a group whose
//! leader changed looks for its new primary on its next call rather than
//! waiting for an error from the old one.
//!
//! Named as `etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]` (`CLUSTER` defaults
//! to `default`, as `sluiced --cluster-name` does).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client as Etcd, GetOptions, WatchOptions};

use crate::cluster::{Cluster, ClusterConfig, Inner, Topology};
use crate::Error;

/// How long the watcher waits before reconnecting to etcd.
const RETRY_MS: u64 = 500;

/// Where a cluster's layout lives in etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSource {
    /// `http://HOST:PORT` of each etcd member.
    pub endpoints: Vec<String>,
    /// The cluster's name (the second part of every key).
    pub cluster: String,
}

impl EtcdSource {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]`.
    pub fn parse(url: &str) -> Result<EtcdSource, Error> {
        let bad = || {
            Error::Invalid(format!(
                "{url}: not etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]"
            ))
        };
        let rest = url.strip_prefix("etcd://").ok_or_else(bad)?;
        let (hosts, cluster) = rest.split_once('/').unwrap_or((rest, "default"));
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        if endpoints.is_empty() || cluster.is_empty() {
            return Err(bad());
        }
        Ok(EtcdSource {
            endpoints,
            cluster: cluster.to_owned(),
        })
    }

    /// `/sluice/CLUSTER/groups/`.
    pub fn prefix(&self) -> String {
        format!("/sluice/{}/groups/", self.cluster)
    }

    async fn connect(&self) -> Result<Etcd, Error> {
        let options =
            etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        tokio::time::timeout(
            Duration::from_secs(5),
            Etcd::connect(&self.endpoints, Some(options)),
        )
        .await
        .map_err(|_| etcd_error(self, "no answer within 5 s"))?
        .map_err(|e| etcd_error(self, e))
    }

    /// The layout as etcd has it now, and each group's leader.
    pub async fn topology(&self) -> Result<(Topology, HashMap<String, String>), Error> {
        let mut etcd = self.connect().await?;
        self.read(&mut etcd).await
    }

    async fn read(&self, etcd: &mut Etcd) -> Result<(Topology, HashMap<String, String>), Error> {
        let prefix = self.prefix();
        let resp = tokio::time::timeout(
            Duration::from_secs(5),
            etcd.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
        )
        .await
        .map_err(|_| etcd_error(self, "no answer within 5 s"))?
        .map_err(|e| etcd_error(self, e))?;
        // group -> (members, leader)
        let mut groups: BTreeMap<String, (Vec<String>, Option<String>)> = BTreeMap::new();
        for kv in resp.kvs() {
            let (Ok(key), Ok(value)) = (kv.key_str(), kv.value_str()) else {
                continue;
            };
            let Some((group, what)) = key
                .strip_prefix(prefix.as_str())
                .and_then(|k| k.split_once('/'))
            else {
                continue;
            };
            let entry = groups.entry(group.to_owned()).or_default();
            if what == "leader" {
                entry.1 = Some(value.to_owned());
            } else if what.starts_with("members/") {
                entry.0.push(value.to_owned());
            }
        }
        let mut topology = Topology::new();
        let mut leaders = HashMap::new();
        for (name, (mut members, leader)) in groups {
            if let Some(l) = &leader {
                leaders.insert(name.clone(), l.clone());
                if !members.contains(l) {
                    members.push(l.clone());
                }
            }
            members.sort();
            // The leader first, for whoever reads the layout; the client
            // asks both members' roles anyway.
            if let Some(l) = &leader {
                members.retain(|m| m != l);
                members.insert(0, l.clone());
            }
            if let Some(primary) = members.first() {
                topology = topology.group(&name, primary, members.get(1).map(String::as_str));
            }
        }
        Ok((topology, leaders))
    }
}

fn etcd_error(source: &EtcdSource, e: impl std::fmt::Display) -> Error {
    Error::Connect {
        addr: source.endpoints.join(","),
        source: std::io::Error::other(format!("etcd: {e}")),
    }
}

impl Topology {
    /// The layout etcd has now (see [`EtcdSource`]).
    pub async fn from_etcd(url: &str) -> Result<Topology, Error> {
        Ok(EtcdSource::parse(url)?.topology().await?.0)
    }
}

impl Cluster {
    /// A cluster client whose layout comes from etcd and follows it: it
    /// watches the cluster's keys as long as the `Cluster` lives (see the
    /// module's documentation).
    pub async fn from_etcd(url: &str, config: ClusterConfig) -> Result<Cluster, Error> {
        Cluster::from_etcd_or(url, config, None).await
    }

    /// [`Cluster::from_etcd`], starting from `first` while etcd holds no
    /// group yet (the first node of a new cluster: its own group, until it
    /// has registered).
    pub async fn from_etcd_or(
        url: &str,
        config: ClusterConfig,
        first: Option<&Topology>,
    ) -> Result<Cluster, Error> {
        let source = EtcdSource::parse(url)?;
        // With `first`, etcd need not answer yet (a node starting beside a
        // new etcd): the watch, which retries, brings the layout later.
        let (mut topology, leaders) = match (source.topology().await, first) {
            (Ok(found), _) => found,
            (Err(_), Some(first)) => (first.clone(), HashMap::new()),
            (Err(e), None) => return Err(e),
        };
        if let (true, Some(first)) = (topology.groups.is_empty(), first) {
            topology = first.clone();
        }
        let cluster = Cluster::new(&topology, config)?;
        tokio::spawn(watch(source, Arc::downgrade(&cluster.inner), leaders));
        Ok(cluster)
    }
}

/// Follows etcd until the cluster is dropped.
async fn watch(source: EtcdSource, cluster: Weak<Inner>, mut leaders: HashMap<String, String>) {
    loop {
        if cluster.strong_count() == 0 {
            return;
        }
        let ended = async {
            let mut etcd = source.connect().await?;
            let mut events = etcd
                .watch(source.prefix(), Some(WatchOptions::new().with_prefix()))
                .await
                .map_err(|e| etcd_error(&source, e))?;
            // What changed before the watch began.
            apply(&source, &mut etcd, &cluster, &mut leaders).await?;
            loop {
                // Wake now and then to notice a dropped cluster.
                let next = tokio::time::timeout(Duration::from_secs(1), events.message()).await;
                let Some(inner) = cluster.upgrade() else {
                    return Ok(());
                };
                drop(inner);
                match next {
                    Err(_) => continue,
                    Ok(Ok(Some(_))) => apply(&source, &mut etcd, &cluster, &mut leaders).await?,
                    Ok(Ok(None)) => return Err(etcd_error(&source, "the watch ended")),
                    Ok(Err(e)) => return Err(etcd_error(&source, e)),
                }
            }
        };
        if let Err::<(), Error>(e) = ended.await {
            let _ = e;
        }
        tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
    }
}

/// Reads the layout and hands it to the cluster; a group whose leader
/// changed forgets its primary (its next call looks for the new one).
async fn apply(
    source: &EtcdSource,
    etcd: &mut Etcd,
    cluster: &Weak<Inner>,
    leaders: &mut HashMap<String, String>,
) -> Result<(), Error> {
    let (topology, now) = source.read(etcd).await?;
    let Some(inner) = cluster.upgrade() else {
        return Ok(());
    };
    let cluster = Cluster { inner };
    if topology.groups.is_empty() {
        return Ok(());
    }
    cluster.reload(&topology)?;
    for (group, leader) in &now {
        if leaders.get(group) != Some(leader) {
            cluster.forget_group(group);
        }
    }
    *leaders = now;
    Ok(())
}
