//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`,
//! gRPC) on `--rls-port`, with envoyproxy/ratelimit's rule files
//! ([`rules`]): an Envoy, Istio, Contour or Envoy Gateway pointed at it
//! needs no code and keeps the configuration it has.
//!
//! # What a `ShouldRateLimit` does
//!
//! Each request descriptor finds its rule ([`rules::Rules::find`]), or its
//! own `limit` override (in a known domain, as envoyproxy/ratelimit does).
//! A matched descriptor is a Sluice limit on its own key,
//! `rls/DOMAIN/KEY=VALUE/...` (each part with `%`, `/` and `=`
//! percent-escaped), decided by the shard that owns that key like any other
//! request. The cost is the descriptor's `hits_addend`, else the request's,
//! else 1 (a descriptor's explicit 0 only checks, a PROBE; the request's 0
//! is unset); `is_negative_hits` gives the units back (a REFUND).
//!
//! **All or nothing, where envoyproxy/ratelimit is not.** Its service adds
//! the hits to every counter, even those of a request another limit
//! denies. Here a request over any of its limits consumes none:
//! - limits of one request whose keys live on one shard are one DECIDE
//!   there, atomic as any DECIDE;
//! - across shards, each shard spends its part; if any part is denied, the
//!   parts that were spent are refunded before the reply goes, so the next
//!   request finds them as if the denied one never came. Between the two a
//!   concurrent request can see those units taken: it may be denied when it
//!   would have been admitted a few microseconds later, never admitted
//!   beyond a limit.
//!
//! Shadow-mode limits are decided each on its own, are never part of the
//! all-or-nothing, and never deny: their status is OK (with 0 remaining
//! when over). They count the requests the enforced limits admit (a denied
//! request's shadow spends are given back too). `unlimited` never counts.
//!
//! A node that may not admit (a follower, a fenced or handing-over
//! primary) answers UNAVAILABLE with the reason; Envoy's
//! `failure_mode_deny` says what its clients get then. Sync replication
//! holds the reply until the follower has the state, as for any client.

pub mod guard;
mod http2;
mod outbox;
mod request;
pub mod rules;

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice_protocol::gcra::Verdict;
use sluice_protocol::identity::{bucket_key, Slot};
use sluice_protocol::limit::fixed_window::{self, FixedWindowState};
use sluice_protocol::limit::{Kind, Limit};
use sluice_protocol::message::LimitSet;
use sluice_protocol::routing::{key_hash, shard_of};
use sluice_protocol::{Clock, MonotonicClock, Priority};

use crate::config::RlsHeaders;
use crate::forward::{OwnedLimits, RemoteOp};
use crate::inbox;
use crate::node::Node;
use crate::shard::{BatchReply, DecideOp, FwdItem, LimitRef, Mode, MultiVerdict, Op, Outcome};
use request::{Descriptor, Request};
use rules::{Rule, Rules};

/// Most descriptors in one request (more is INVALID_ARGUMENT): Envoy sends
/// one per `rate_limits` action list of the route, a handful at most.
pub const DESCRIPTORS_MAX: usize = 64;
/// Most entries in one descriptor (more is INVALID_ARGUMENT).
pub const ENTRIES_MAX: usize = 32;
/// Largest request message accepted (gRPC's RESOURCE_EXHAUSTED past it).
pub const MESSAGE_BYTES_MAX: usize = 64 << 10;
/// Most concurrent streams per HTTP/2 connection.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 1_024;

/// What the service shares across its requests.
#[derive(Debug)]
pub struct Rls {
    node: Arc<Node>,
    clock: MonotonicClock,
    rules: RwLock<Arc<Rules>>,
    headers: RlsHeaders,
    /// The port's TLS (`--rls-tls-cert`), checked at start.
    tls: Option<crate::stream::Acceptor>,
    /// The port's counters (`/metrics`).
    stats: Arc<guard::RlsStats>,
}

impl Rls {
    /// The service of `node`, with the rules `--rls-config` named (loaded
    /// by the caller, before the node started).
    pub fn new(
        node: Arc<Node>,
        clock: MonotonicClock,
        rules: Rules,
        tls: Option<crate::stream::Acceptor>,
        stats: Arc<guard::RlsStats>,
    ) -> Rls {
        tracing::info!(
            domains = rules.domains(),
            files = rules.files(),
            "rate limit service rules loaded"
        );
        let headers = node.config.rls_headers;
        Rls {
            node,
            clock,
            rules: RwLock::new(Arc::new(rules)),
            headers,
            tls,
            stats,
        }
    }

    /// Reads the rules again (SIGHUP); a file with an error keeps the rules
    /// in force.
    pub fn reload(&self, trigger: &str) -> Result<(), String> {
        let path = self
            .node
            .config
            .rls_config
            .as_deref()
            .expect("set with --rls-port");
        match Rules::load(path) {
            Ok(rules) => {
                tracing::info!(
                    trigger,
                    domains = rules.domains(),
                    files = rules.files(),
                    "rate limit service rules reloaded"
                );
                *self.rules.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
                Ok(())
            }
            Err(e) => {
                let text = e.to_string();
                tracing::warn!(trigger, error = %text, "rate limit rules refused; the old ones stay");
                Err(text)
            }
        }
    }

    fn rules(&self) -> Arc<Rules> {
        self.rules.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The TLS of `--rls-tls-cert` and `--rls-tls-key`, read and checked (a
/// certificate and key rustls accepts); HTTP/2 offered by ALPN, as gRPC
/// clients ask.
pub fn load_tls(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<crate::stream::Acceptor, String> {
    let mut config = crate::stream::server_config(["rls-tls-cert", "rls-tls-key"], cert, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(crate::stream::Acceptor::new(config))
}

/// Serves the rate limit service on `listener` from `threads` threads of
/// its own, or with 0 from every shard's thread, until the process ends.
///
/// One task of the calling runtime accepts, and hands each connection to
/// the serving thread that holds the fewest (in turn among equals), which
/// serves it from then on, as the shards serve protocol v1's. Threads that
/// each accepted from the one socket took turns as the kernel woke them:
/// the first awake took every connection queued, so the four connections
/// of a burst all went to one thread (one service thread of two served a
/// whole benchmark), and an Envoy fleet's few long-lived connections could
/// leave all but one thread idle.
pub fn start(
    listener: std::net::TcpListener,
    rls: Arc<Rls>,
    stats: Arc<guard::RlsStats>,
    threads: u16,
) -> std::io::Result<()> {
    let gate = guard::Gate::new(rls.node.clone(), stats.clone());
    let mut servers = Vec::new();
    if threads == 0 {
        // On the shard threads: a call whose descriptors a shard owns is
        // decided on the thread that decoded it (its batch goes to its own
        // inbox: no other thread wakes, no context switch).
        for shard in 0..rls.node.shards.len() {
            servers.push((format!("sluice-shard-{shard}"), Server::Shard(shard)));
        }
    }
    for i in 0..threads {
        let name = format!("sluice-rls-{i}");
        // An entry point's first thread is the forwarder's: the calls it
        // serves go to other groups with no hop to another thread (and
        // their replies come back on it).
        if let (0, Some(forward)) = (i, &rls.node.forward) {
            servers.push((
                "sluice-forward".to_owned(),
                Server::Forwarder(forward.clone()),
            ));
            continue;
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        servers.push((name.clone(), Server::Runtime(runtime.handle().clone())));
        std::thread::Builder::new()
            .name(name)
            .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    }
    let held = servers
        .iter()
        .map(|(name, _)| (name.clone(), std::sync::atomic::AtomicUsize::new(0)))
        .collect();
    let held: &Arc<[(String, std::sync::atomic::AtomicUsize)]> = stats.serving.get_or_init(|| held);
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let servers: Vec<Server> = servers.into_iter().map(|(_, s)| s).collect();
    tokio::spawn(accept(listener, rls, gate, servers, held.clone()));
    Ok(())
}

/// A thread that serves the port's connections.
#[derive(Debug)]
enum Server {
    /// A shard's (`--rls-threads 0`).
    Shard(usize),
    /// A service thread's runtime.
    Runtime(tokio::runtime::Handle),
    /// The forwarder's thread (`--cluster`).
    Forwarder(Arc<crate::forward::Forwarder>),
}

/// Accepts the port's connections and hands each to the server holding
/// the fewest (`held`, by server).
async fn accept(
    listener: tokio::net::TcpListener,
    rls: Arc<Rls>,
    gate: Arc<guard::Gate>,
    servers: Vec<Server>,
    held: Arc<[(String, std::sync::atomic::AtomicUsize)]>,
) {
    let mut incoming = guard::Incoming::new(listener, gate.clone());
    let mut turn = 0;
    loop {
        let accepted = incoming.accept().await;
        let fewest = (0..servers.len())
            .map(|i| (turn + i) % servers.len())
            .min_by_key(|&i| held[i].1.load(Ordering::Relaxed))
            .expect("at least one server");
        turn = (fewest + 1) % servers.len();
        held[fewest].1.fetch_add(1, Ordering::Relaxed);
        let held = Held(held.clone(), fewest);
        let served = {
            let (rls, gate) = (rls.clone(), gate.clone());
            async move {
                http2::serve(accepted, rls, gate).await;
                drop(held);
            }
        };
        match &servers[fewest] {
            Server::Shard(shard) => {
                let job = crate::mailbox::Job(Box::new(move || {
                    tokio::spawn(served);
                }));
                // Refused only while shutting down: the connection closes.
                let _ = rls.node.shards[*shard].send(crate::mailbox::ShardMsg::Run(job));
            }
            Server::Runtime(runtime) => drop(runtime.spawn(served)),
            Server::Forwarder(forward) => forward.spawn(served),
        }
    }
}

/// A server's count of the connections it holds, while one is held.
struct Held(Arc<[(String, std::sync::atomic::AtomicUsize)]>, usize);

impl Drop for Held {
    fn drop(&mut self) {
        self.0[self.1].1.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What one descriptor asks.
#[derive(Debug)]
struct Plan<'r> {
    /// Its rule, borrowed from the rules in force (or its own `limit`
    /// override); `None`: no limit applies.
    rule: Option<Cow<'r, Rule>>,
    /// Units.
    cost: u64,
    /// `is_negative_hits`: give `cost` back.
    refund: bool,
    /// Where its verdict is once decided: shard, item, limit index.
    at: Option<(usize, usize, usize)>,
    /// Its key's hash, when [`Rls::denied_here`] worked it out.
    hash: Option<u128>,
    /// Its verdict, when its shard's published over-limit windows gave it
    /// without asking the shard ([`Rls::denied_here`]).
    cached: Option<Verdict>,
}

impl Plan<'_> {
    fn limit(&self) -> Option<Limit> {
        self.rule.as_ref()?.quota?.limit()
    }

    fn shadow(&self) -> bool {
        self.rule.as_ref().is_some_and(|r| r.shadow_mode)
    }

    /// Spends units of a limit that can deny the request.
    fn enforced(&self) -> bool {
        !self.refund && !self.shadow() && self.rule.as_ref().is_some_and(|r| r.quota.is_some())
    }

    /// A spend no verdict can admit: 0 requests per unit, or more units
    /// than the limit holds (a check, cost 0, is never hopeless).
    fn hopeless(&self) -> bool {
        !self.refund
            && self.cost > 0
            && self.rule.as_ref().is_some_and(|r| r.quota.is_some())
            && self.limit().map_or(true, |l| self.cost > l.limit())
    }
}

impl Rls {
    /// `ShouldRateLimit`: the answer to `request`, or the status that
    /// refuses it ([`http2`] serves it).
    async fn decide_request(
        &self,
        request: &Request<'_>,
    ) -> Result<RateLimitResponse, tonic::Status> {
        if request.domain.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if request.descriptors.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        if request.descriptors.len() > DESCRIPTORS_MAX {
            return Err(tonic::Status::invalid_argument(format!(
                "{} descriptors; at most {DESCRIPTORS_MAX} in one request",
                request.descriptors.len()
            )));
        }
        if let Some(d) = request
            .descriptors
            .iter()
            .find(|d| request.entries(d).len() > ENTRIES_MAX)
        {
            return Err(tonic::Status::invalid_argument(format!(
                "a descriptor has {} entries; at most {ENTRIES_MAX}",
                request.entries(d).len()
            )));
        }
        let rules = self.rules();
        let mut plans = plan(&rules, request);
        let now_ns = self.clock.now_ns();
        // An entry point (--cluster) forwards what it does not decide; its
        // shards refuse what they cannot admit.
        if self.node.forward.is_none() && !self.node.repl.admits(now_ns) {
            return Err(tonic::Status::unavailable(
                self.node.repl.not_primary_text(),
            ));
        }
        let (decided, denied) = self.decide(request, &mut plans, now_ns).await?;
        Ok(self.respond(&plans, &decided, denied, now_ns))
    }
}

/// Each descriptor's rule, cost and direction; replaced rules removed.
fn plan<'r>(rules: &'r Rules, request: &Request<'_>) -> Vec<Plan<'r>> {
    let request_cost = match request.hits_addend {
        0 => 1,
        n => u64::from(n),
    };
    let mut plans: Vec<Plan> = request
        .descriptors
        .iter()
        .map(|d| Plan {
            rule: rule_for(rules, request, d),
            // A descriptor's wrapper may hold 0 (check, spend nothing);
            // the request's plain 0 is "unset", as in envoyproxy/ratelimit.
            cost: d.hits_addend.unwrap_or(request_cost),
            refund: d.is_negative_hits,
            at: None,
            hash: None,
            cached: None,
        })
        .collect();
    let replaced: Vec<String> = plans
        .iter()
        .filter_map(|p| p.rule.as_ref())
        .flat_map(|r| r.replaces.iter().cloned())
        .collect();
    if !replaced.is_empty() {
        for p in &mut plans {
            // An unlimited rule stays unlimited, as in envoyproxy/ratelimit
            // (it sets those aside before it looks at replaces).
            if p.rule.as_ref().is_some_and(|r| {
                r.quota.is_some() && !r.name.is_empty() && replaced.contains(&r.name)
            }) {
                p.rule = None;
            }
        }
    }
    plans
}

fn rule_for<'r>(rules: &'r Rules, request: &Request<'_>, d: &Descriptor) -> Option<Cow<'r, Rule>> {
    let domain = request.domain;
    if let Some(o) = &d.limit {
        if let (true, Some(unit)) = (rules.has_domain(domain), rules::Unit::from_proto(o.unit)) {
            return Some(Cow::Owned(Rule::override_of(o.requests_per_unit, unit)));
        }
    }
    rules
        .find(domain, request.entries(d).iter().copied())
        .map(Cow::Borrowed)
}

/// The key a descriptor's limit is kept under: `rls/DOMAIN/KEY=VALUE/...`,
/// each part with `%`, `/` and `=` percent-escaped (so that no two
/// descriptors share a key).
pub fn descriptor_key<'e>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
) -> Vec<u8> {
    let mut out = Vec::new();
    descriptor_key_into(&mut out, domain, entries);
    out
}

/// [`descriptor_key`] into `out` (cleared first): a buffer reused for a
/// request's descriptors, not one grown byte by byte for each.
pub fn descriptor_key_into<'e>(
    out: &mut Vec<u8>,
    domain: &str,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
) {
    // The runs between escapes are copied whole (a byte at a time, the
    // push's capacity checks were most of a key's cost).
    fn push(out: &mut Vec<u8>, part: &str) {
        let bytes = part.as_bytes();
        let mut from = 0;
        for (i, b) in bytes.iter().enumerate() {
            let escaped: &[u8] = match b {
                b'%' => b"%25",
                b'/' => b"%2F",
                b'=' => b"%3D",
                _ => continue,
            };
            out.extend_from_slice(&bytes[from..i]);
            out.extend_from_slice(escaped);
            from = i + 1;
        }
        out.extend_from_slice(&bytes[from..]);
    }
    out.clear();
    out.extend_from_slice(b"rls/");
    push(out, domain);
    for (k, v) in entries {
        out.push(b'/');
        push(out, k);
        out.push(b'=');
        push(out, v);
    }
}

/// `plan`'s key (descriptor `d` of `domain`, by its rule) into `key`;
/// its hash.
fn plan_key(key: &mut Vec<u8>, request: &Request<'_>, plan: &Plan<'_>, d: &Descriptor) -> u128 {
    let rule = plan
        .rule
        .as_deref()
        .expect("a plan with a limit has a rule");
    let entries = request.entries(d).iter().copied();
    descriptor_key_into(key, request.domain, rule.key_entries(entries));
    key_hash(key)
}

/// Puts limit `r` of `plan` into one of a shard's DECIDEs: one of the
/// same cost it can join (enforced spends only, up to 8 limits, no bucket
/// twice), else a new one; where it went, `(item, index)`.
fn join(groups: &mut Vec<Pending>, plan: &Plan<'_>, r: LimitRef, mode: Mode) -> (usize, usize) {
    let joinable = plan.enforced();
    let found = groups.iter().position(|p| {
        let used = usize::from(p.op.count);
        p.joinable
            && joinable
            && p.op.cost == plan.cost
            && used < p.op.refs.len()
            && !p.op.refs[..used].iter().any(|x| x.bucket == r.bucket)
    });
    let item = found.unwrap_or_else(|| {
        let mut op = DecideOp::EMPTY;
        op.mode = mode;
        op.cost = plan.cost;
        groups.push(Pending {
            op,
            joinable,
            remote: None,
        });
        groups.len() - 1
    });
    let op = &mut groups[item].op;
    let index = usize::from(op.count);
    op.refs[index] = r;
    op.count += 1;
    (item, index)
}

/// The remote list's DECIDEs as the forwarder's ops: `(item, op, view,
/// group)`.
fn remote_ops(
    remote: &[Pending],
) -> impl Iterator<Item = (u64, RemoteOp, &Arc<crate::forward::View>, usize)> + '_ {
    remote.iter().enumerate().map(|(item, p)| {
        let to = p.remote.as_ref().expect("a remote item has its key");
        let set = LimitSet::new(&[p.op.refs[0].limit]).expect("one limit fits");
        let op = RemoteOp::Decide {
            mode: p.op.mode,
            key: to.key.clone(),
            limits: OwnedLimits::Inline(Box::new(set)),
            cost: p.op.cost,
            priority: Priority::Normal,
        };
        (item as u64, op, &to.view, to.group)
    })
}

/// A REFUND of every spend of `pending` that went through, list by list.
fn refunds(pending: &[Vec<Pending>], decided: &Decided) -> Vec<Vec<Pending>> {
    pending
        .iter()
        .zip(decided)
        .map(|(groups, outs)| {
            groups
                .iter()
                .zip(outs)
                .filter(|(g, o)| g.op.mode == Mode::Spend && allowed(o))
                .map(|(g, _)| Pending {
                    op: DecideOp {
                        mode: Mode::Refund,
                        ..g.op
                    },
                    joinable: false,
                    remote: g.remote.clone(),
                })
                .collect()
        })
        .collect()
}

/// The shards' answers, by shard and item (`None`: not sent).
type Decided = Vec<Vec<Option<Box<MultiVerdict>>>>;

/// One DECIDE being put together for a shard.
#[derive(Debug)]
struct Pending {
    op: DecideOp,
    /// Other enforced spends of the same cost may join it.
    joinable: bool,
    /// For another node (`--cluster`; in the last list of a request's
    /// pending, one limit each): the descriptor's key and group.
    remote: Option<Remote>,
}

/// Where a descriptor for another node goes.
#[derive(Clone, Debug)]
struct Remote {
    /// Shared with the op it is sent as (and its refund's).
    key: bytes::Bytes,
    /// Its key's group: a ring index of `view`.
    group: usize,
    view: Arc<crate::forward::View>,
}

impl Rls {
    /// Decides every plan with a limit: one round of batches (one per
    /// shard), and a second of refunds when an enforced limit denied.
    /// `true` with the answers when the request is over a limit.
    async fn decide(
        &self,
        request: &Request<'_>,
        plans: &mut [Plan<'_>],
        now_ns: u64,
    ) -> Result<(Decided, bool), tonic::Status> {
        let hopeless = plans.iter().any(|p| p.enforced() && p.hopeless());
        // A request one of whose limits is denied in place cannot be
        // admitted either: its other limits are only asked about.
        // One key buffer for the request's descriptors, both passes.
        let mut key = Vec::with_capacity(128);
        let hopeless = hopeless || self.denied_here(&mut key, request, plans, now_ns);
        let pending = self.pending(&mut key, request, plans, hopeless);
        let decided = self.send(&pending).await?;
        let denied = hopeless
            || pending.iter().zip(&decided).any(|(groups, outs)| {
                groups
                    .iter()
                    .zip(outs)
                    .any(|(g, o)| g.joinable && !allowed(o))
            });
        if denied && !hopeless {
            // All or nothing: every spend that went through is given back.
            self.send(&refunds(&pending, &decided)).await?;
        }
        Ok((decided, denied))
    }

    /// Each plan with a limit placed: in its shard's list (joining a
    /// DECIDE of the same cost there when it can), or with `--cluster` in
    /// the last list, for its key's group; `plan.at` says where.
    fn pending(
        &self,
        key: &mut Vec<u8>,
        request: &Request<'_>,
        plans: &mut [Plan<'_>],
        hopeless: bool,
    ) -> Vec<Vec<Pending>> {
        // One list per shard, and one for other nodes (--cluster).
        let remote_at = self.node.shards.len();
        let mut pending: Vec<Vec<Pending>> = (0..=remote_at).map(|_| Vec::new()).collect();
        let route = self.node.forward.as_ref().map(|f| {
            let decides_own = self.node.repl.is_primary();
            (f.view(), decides_own)
        });
        let n = plans.len();
        for (plan, d) in plans.iter_mut().zip(&request.descriptors) {
            let Some(limit) = plan.limit() else { continue };
            if plan.hopeless() || plan.cached.is_some() {
                continue;
            }
            let hash = match (plan.hash, &route) {
                // Worked out already, and no other node needs the key.
                (Some(hash), None) => hash,
                _ => plan_key(key, request, plan, d),
            };
            let remote = route.as_ref().and_then(|(view, decides_own)| {
                let group = view.group_of(hash);
                (!(*decides_own && view.is_own(group))).then_some((view, group))
            });
            // A request that cannot be admitted spends nothing: its limits
            // are only asked about. So is a descriptor's explicit
            // hits_addend of 0.
            let mode = match (plan.refund, hopeless || plan.cost == 0) {
                (true, _) => Mode::Refund,
                (false, true) => Mode::Probe,
                (false, false) => Mode::Spend,
            };
            let r = LimitRef {
                bucket: bucket_key(hash, limit.kind(), Slot::Inline(0)),
                limit,
                floor: 0,
            };
            if let Some((view, group)) = remote {
                let mut op = DecideOp::EMPTY;
                op.mode = mode;
                op.cost = plan.cost;
                op.count = 1;
                op.refs[0] = r;
                if pending[remote_at].capacity() == 0 {
                    // As a shard's list: a first growth of 4 DECIDEs is
                    // an allocation past malloc's fast path.
                    pending[remote_at].reserve_exact(n);
                }
                // (The remote list is never joined: `joinable` only says
                // whether its denial denies the request.)
                pending[remote_at].push(Pending {
                    op,
                    joinable: plan.enforced(),
                    remote: Some(Remote {
                        key: bytes::Bytes::copy_from_slice(key),
                        group,
                        view: view.clone(),
                    }),
                });
                plan.at = Some((remote_at, pending[remote_at].len() - 1, 0));
                continue;
            }
            let shard = usize::from(shard_of(hash, self.node.shard_count));
            if pending[shard].capacity() == 0 {
                // Room for every descriptor at once: a DECIDE is 560
                // bytes, and Vec's first growth (4 of them) is an
                // allocation too large for malloc's fast path.
                pending[shard].reserve_exact(n);
            }
            let (item, index) = join(&mut pending[shard], plan, r, mode);
            plan.at = Some((shard, item, index));
        }
        pending
    }

    /// Gives each enforced fixed-window spend that its shard has published
    /// as over its limit (`shard/over_limit.rs`) the shard's verdict, with
    /// no hop to the shard: the denial the shard would give now. `true`
    /// if any was, and then the request cannot be admitted. With
    /// `--cluster`, only the keys this node decides; never when the
    /// request is hopeless already (nothing will be spent).
    fn denied_here(
        &self,
        key: &mut Vec<u8>,
        request: &Request<'_>,
        plans: &mut [Plan<'_>],
        now_ns: u64,
    ) -> bool {
        let published = &self.node.over_limit;
        if !published.first().is_some_and(|o| !o.is_empty()) {
            return false;
        }
        // An entry point checks whether it may admit only in its shards:
        // one that may not (fenced, handing over) answers as they would.
        if self.node.forward.is_some() && !self.node.repl.admits(now_ns) {
            return false;
        }
        let route = self.node.forward.as_ref().map(|f| f.view());
        let decides_own = self.node.repl.is_primary();
        let mut denied = false;
        for (plan, d) in plans.iter_mut().zip(&request.descriptors) {
            let Some(Limit::FixedWindow(w)) = plan.limit() else {
                continue;
            };
            if !plan.enforced() || plan.cost == 0 || plan.hopeless() {
                continue;
            }
            let hash = plan_key(key, request, plan, d);
            plan.hash = Some(hash);
            if route
                .as_ref()
                .is_some_and(|view| !(decides_own && view.is_own(view.group_of(hash))))
            {
                continue;
            }
            let shard = usize::from(shard_of(hash, self.node.shard_count));
            let bucket = bucket_key(hash, Kind::FixedWindow, Slot::Inline(0));
            let Some(entry) = published[shard].lookup(bucket, w.limit, w.window_ns, now_ns) else {
                continue;
            };
            let state = FixedWindowState {
                window_start_ns: entry.window_start_ns,
                count: entry.count,
            };
            let verdict = fixed_window::peek(Some(state), &w, plan.cost, now_ns);
            if !verdict.allowed {
                plan.cached = Some(verdict);
                denied = true;
            }
        }
        if denied {
            self.stats.over_limit_denied.fetch_add(1, Ordering::Relaxed);
        }
        denied
    }

    /// Sends each shard its DECIDEs as one batch and waits for every
    /// answer.
    async fn send(&self, pending: &[Vec<Pending>]) -> Result<Decided, tonic::Status> {
        let mut decided: Decided = pending.iter().map(|g| vec![None; g.len()]).collect();
        // Made only when a DECIDE goes to another shard: a call decided
        // in place allocates none.
        let mut inbox = None;
        let mut waiting = 0;
        let remote_at = self.node.shards.len();
        for (shard, groups) in pending.iter().enumerate() {
            if groups.is_empty() {
                continue;
            }
            if shard == remote_at {
                // Other nodes': queued with the turn's other calls too,
                // one batch through the forwarder (outbox.rs).
                let (reply_tx, _) = inbox.get_or_insert_with(inbox::inbox::<BatchReply>);
                outbox::queue_remote(&self.node, remote_at, remote_ops(groups), reply_tx);
                waiting += 1;
                continue;
            }
            // Which shard and item: the reply does not say.
            let seq = |item: usize| (shard as u64) << 32 | item as u64;
            // On the shard threads, the DECIDEs of this thread's own
            // shard are decided here and now.
            let here = groups.iter().enumerate().map(|(i, g)| (seq(i), &g.op));
            if let Some(reply) = crate::worker::decide_here(shard, here) {
                Self::fill(&mut decided, reply, &self.node)?;
                continue;
            }
            // Other shards': queued with the turn's other calls, one
            // message per shard (outbox.rs).
            let items = groups.iter().enumerate().map(|(item, g)| FwdItem {
                seq: seq(item),
                key: g.op.refs[0].bucket,
                op: Op::Decide(Box::new(g.op)),
            });
            let (reply_tx, _) = inbox.get_or_insert_with(inbox::inbox::<BatchReply>);
            outbox::queue(&self.node, shard, items, reply_tx);
            waiting += 1;
        }
        let Some((reply_tx, mut replies)) = inbox else {
            // Decided here: answered with this thread's hops in flight
            // (outbox.rs says why).
            outbox::hold().await;
            return Ok(decided);
        };
        // The outbox holds the senders now: the inbox ends if it drops
        // them unanswered (shutting down).
        drop(reply_tx);
        let mut got = Vec::new();
        while waiting > 0 {
            if !replies.recv_many(&mut got).await {
                return Err(tonic::Status::unavailable("sluiced is shutting down"));
            }
            for reply in got.drain(..) {
                waiting -= 1;
                Self::fill(&mut decided, reply, &self.node)?;
            }
        }
        Ok(decided)
    }

    /// A shard's answers, into their places in `decided`.
    fn fill(decided: &mut Decided, reply: BatchReply, node: &Node) -> Result<(), tonic::Status> {
        for (seq, outcome) in reply.into_outcomes() {
            let (shard, item) = ((seq >> 32) as usize, seq as u32 as usize);
            match outcome {
                Outcome::Multi(m) => decided[shard][item] = Some(m),
                Outcome::Refused(status) => return Err(refused(status, node)),
                // A descriptor another node was to decide: its group could
                // not (Envoy's failure_mode_deny decides), or refused it.
                Outcome::Failed(_, text) => return Err(tonic::Status::unavailable(text)),
                _ => return Err(tonic::Status::internal("a shard answered out of shape")),
            }
        }
        Ok(())
    }

    /// The reply: a status per descriptor, the overall code, the headers.
    fn respond(
        &self,
        plans: &[Plan<'_>],
        decided: &Decided,
        denied: bool,
        now_ns: u64,
    ) -> RateLimitResponse {
        let statuses: Vec<DescriptorStatus> = plans
            .iter()
            .map(|p| status(p, decided, denied, now_ns))
            .collect();
        let overall = if denied { Code::OverLimit } else { Code::Ok };
        let mut response = RateLimitResponse {
            overall_code: overall as i32,
            ..Default::default()
        };
        let prefix = match self.headers {
            RlsHeaders::Off => None,
            RlsHeaders::Ratelimit => Some("RateLimit"),
            RlsHeaders::XRatelimit => Some("X-RateLimit"),
        };
        // As envoyproxy/ratelimit picks it: the (last) limit that denied,
        // else the one with the least left.
        let limited = || statuses.iter().filter(|s| s.current_limit.is_some());
        let closest = limited()
            .rev()
            .find(|s| s.code == Code::OverLimit as i32)
            .or_else(|| limited().min_by_key(|s| s.limit_remaining));
        if let (Some(prefix), Some(s)) = (prefix, closest) {
            let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
            let reset = s
                .duration_until_reset
                .as_ref()
                .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
            response.response_headers_to_add = vec![
                header(format!("{prefix}-Limit"), limit.to_string()),
                header(format!("{prefix}-Remaining"), s.limit_remaining.to_string()),
                header(format!("{prefix}-Reset"), reset.to_string()),
            ];
        }
        response.statuses = statuses;
        response
    }
}

fn allowed(outcome: &Option<Box<MultiVerdict>>) -> bool {
    outcome.as_ref().is_some_and(|m| m.allowed)
}

/// A shard's refusal as gRPC's status.
fn refused(status: sluice_protocol::Status, node: &Node) -> tonic::Status {
    match status {
        sluice_protocol::Status::NotPrimary => {
            tonic::Status::unavailable(node.repl.not_primary_text())
        }
        sluice_protocol::Status::KeysFull => tonic::Status::resource_exhausted(
            "the node holds --keys-max buckets and none can be dropped",
        ),
        other => tonic::Status::unavailable(format!("refused: {other:?}")),
    }
}

fn header(key: String, value: String) -> HeaderValue {
    HeaderValue {
        key,
        value,
        ..Default::default()
    }
}

/// A descriptor's status: its own verdict (OVER_LIMIT only for an enforced
/// limit that denies), what it has left as the request leaves it (a request
/// denied elsewhere took nothing), the time to its reset.
fn status(p: &Plan<'_>, decided: &Decided, denied: bool, now_ns: u64) -> DescriptorStatus {
    let Some(rule) = &p.rule else {
        return DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
    };
    let Some(quota) = rule.quota else {
        return DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        };
    };
    let verdict = p.cached.or_else(|| {
        p.at.and_then(|(shard, item, index)| {
            decided[shard][item]
                .as_ref()
                .map(|m| m.verdicts[index].verdict)
        })
    });
    let (own_allowed, remaining, reset_ns) = match verdict {
        Some(v) => {
            let remaining = if v.allowed && denied && !p.refund {
                // Asked about, or spent and given back: what it has now.
                (v.remaining + p.cost).min(v.limit)
            } else {
                v.remaining
            };
            (v.allowed || p.refund, remaining, v.reset_after_ns)
        }
        // Not asked (0 requests per unit): a check (cost 0) is within it.
        None => (p.refund || p.cost == 0, 0, 0),
    };
    let code = if own_allowed || rule.shadow_mode {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let reset_s = quota.duration_until_reset_s(now_ns, reset_ns);
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: rule.name.clone(),
            requests_per_unit: quota.requests_per_unit,
            unit: quota.unit.proto(),
        }),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(ProtoDuration {
            seconds: i64::try_from(reset_s).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_keys_are_distinct_for_distinct_descriptors() {
        let a = descriptor_key("d", [("a", "b/c=d")]);
        let b = descriptor_key("d", [("a", "b"), ("c", "d")]);
        assert_ne!(a, b);
        assert_eq!(b, b"rls/d/a=b/c=d");
        assert_eq!(a, b"rls/d/a=b%2Fc%3Dd");
        assert_ne!(
            descriptor_key("d/a=b", []),
            descriptor_key("d", [("a", "b")])
        );
        assert_eq!(descriptor_key("%", [("k", "")]), b"rls/%25/k=");
        assert_eq!(
            descriptor_key("a%b", [("/k/", "=v=w"), ("x", "y%")]),
            b"rls/a%25b/%2Fk%2F=%3Dv%3Dw/x=y%25"
        );
    }
}
