//! A shard's thread: [`spawn`] starts it (its own single-threaded tokio
//! runtime and `LocalSet`, and its [`ShardCore`]), and its loop takes
//! every message from the shard's inbox ([`ShardMsg`], the one thing other
//! threads may ask of a shard) and acts on it: a connection becomes a
//! task (protocol v1's [`connection::run`], RESP's
//! [`resp::connection::run`]), a forwarded [`Batch`] is decided and
//! answered, replication messages start flows or apply records, Drain and
//! Stop shut it down. Beside them run the periodic heap sweep and, on
//! shard 0, a follower's [`follow`](follower::follow) and the
//! [`watch_peer`](follower::watch_peer) task.
//!
//! This module is the top of a shard: the one place that starts the
//! connection and replication tasks, which import nothing of it (they
//! reach another shard through [`mailbox`](crate::mailbox), a connection's
//! move, a forwarded batch, a follower's records; docs/ARCHITECTURE.md,
//! "Layering").

use std::rc::Rc;

use sluice_protocol::limit::Kind;
use sluice_protocol::{Clock, MonotonicClock, Status};

use crate::connection;
use crate::inbox::{Receiver, Sender};
use crate::mailbox::ShardMsg;
use crate::node::{Node, ShardCore};
use crate::replication::follower;
use crate::replication::primary::{handed_over, replication_wait, replies_wait};
use crate::resp;
use crate::shard::{table, Batch, BatchReply, DecideOp, Mode, Outcome};
use crate::sync::Arc;

/// Starts shard `id`'s thread, pinned to `cpu` when given (`--cpu-list`):
/// it returns once the thread runs there, or with the error that kept it
/// from pinning (the thread then ends). Messages reach it through `rx`; it
/// reports drained on `drained_tx`.
pub fn spawn(
    id: u16,
    cpu: Option<u16>,
    rx: Receiver<ShardMsg>,
    node_rx: crate::sync::mpsc::Receiver<Arc<Node>>,
    drained_tx: crate::inbox::Sender<u16>,
    clock: MonotonicClock,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let (pinned_tx, pinned_rx) = crate::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(format!("sluice-shard-{id}"))
        .spawn(move || {
            let pinned = cpu.map_or(Ok(()), crate::affinity::pin_current_thread);
            let stop = pinned.is_err();
            let _ = pinned_tx.send(pinned);
            if stop {
                return;
            }
            // The node (with every shard's inbox) exists only once all shards
            // have been created, so it arrives after the thread starts.
            let Ok(node) = node_rx.recv() else { return };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a shard's runtime builds");
            let local = tokio::task::LocalSet::new();
            let core = Rc::new(ShardCore::new(id, node, clock, drained_tx));
            local.block_on(&rt, run(core, rx));
        })?;
    let pinned = pinned_rx.recv().unwrap_or_else(|_| {
        Err(std::io::Error::other(
            "the shard thread ended before it started",
        ))
    });
    pinned.map_err(|e| match cpu {
        Some(cpu) => {
            std::io::Error::new(e.kind(), format!("cannot pin shard {id} to CPU {cpu}: {e}"))
        }
        None => e,
    })?;
    Ok(thread)
}

/// The shard's loop: take every queued message, act on each, repeat.
/// After Stop the inbox is closed, and whatever it had already accepted is
/// still handled: batches are decided and answered (every accepted send is
/// received, as the inbox promises), connections arriving that late are
/// closed.
async fn run(core: Rc<ShardCore>, mut rx: Receiver<ShardMsg>) {
    HERE.with(|here| *here.borrow_mut() = Some(core.clone()));
    spawn_side_tasks(&core);
    let mut msgs = Vec::new();
    let mut stopped = false;
    while rx.recv_many(&mut msgs).await {
        for msg in msgs.drain(..) {
            match msg {
                ShardMsg::Batch(b) => decide_batch(&core, b),
                ShardMsg::Adopt(_) | ShardMsg::AdoptResp(_) if stopped => {}
                ShardMsg::Adopt(a) => {
                    core.connections.set(core.connections.get() + 1);
                    tokio::task::spawn_local(connection::run(core.clone(), a));
                }
                ShardMsg::AdoptResp(a) => {
                    core.connections.set(core.connections.get() + 1);
                    tokio::task::spawn_local(resp::connection::run(core.clone(), a));
                }
                ShardMsg::Run(job) if !stopped => (job.0)(),
                ShardMsg::Run(_) => {}
                ShardMsg::Tiers(tiers) => {
                    *core.tiers.borrow_mut() = tiers;
                }
                ShardMsg::Reset(r) => {
                    core.table.borrow_mut().clear();
                    core.follow_gen.set(r.generation);
                    let _ = r.done.send(());
                }
                ShardMsg::Flow(f) if !stopped => {
                    tokio::task::spawn_local(follower::run_flow(core.clone(), f));
                }
                ShardMsg::Flow(_) => {}
                ShardMsg::Handover(done) => {
                    let core = core.clone();
                    tokio::task::spawn_local(async move {
                        let ok = handed_over(core).await;
                        let _ = done.send(ok);
                    });
                }
                ShardMsg::Takeover(epoch) => {
                    let mut flow = core.flow.borrow_mut();
                    flow.takeover = Some(epoch);
                    flow.wake.notify_one();
                }
                ShardMsg::Reserve(generation, more) => {
                    if generation == core.follow_gen.get() {
                        core.table.borrow_mut().reserve(more);
                    }
                }
                ShardMsg::Apply(a) => apply(&core, a),
                ShardMsg::Snapshot(done) => {
                    let core = core.clone();
                    tokio::task::spawn_local(async move {
                        let _ = done.send(crate::snapshot::collect(&core.table).await);
                    });
                }
                ShardMsg::Load(records, done) => {
                    load(&core, records);
                    let _ = done.send(());
                }
                ShardMsg::Drain => {
                    core.draining.send_replace(true);
                    core.report_if_drained();
                }
                ShardMsg::Stop => {
                    rx.close();
                    stopped = true;
                }
            }
        }
    }
    tracing::debug!(
        shard = core.id,
        buckets = core.table.borrow().len(),
        "shard stopped"
    );
}

/// The tasks that run beside the shard's loop: the heap sweep, and on
/// shard 0 the follower's, the peer watch and the etcd loop, as configured.
fn spawn_side_tasks(core: &Rc<ShardCore>) {
    tokio::task::spawn_local(sweep_heap_periodically(core.clone()));
    if let (0, Some(primary)) = (core.id, core.node.config.replica_of.clone()) {
        tokio::task::spawn_local(follower::follow(core.clone(), primary));
    }
    if let (0, Some(peer)) = (core.id, core.node.config.peer.clone()) {
        tokio::task::spawn_local(follower::watch_peer(core.clone(), peer));
    }
    #[cfg(feature = "etcd")]
    if core.id == 0 && core.node.config.coordinator.is_some() {
        tokio::task::spawn_local(crate::replication::etcd::run(core.clone()));
    }
}

/// A follower's records and buckets, imported unless they belong to an
/// earlier sync (an older generation); answered either way.
fn apply(core: &ShardCore, a: crate::mailbox::Apply) {
    if a.generation == core.follow_gen.get() {
        let now_ns = core.clock.now_ns();
        let (mut records, mut buckets) = (a.records, a.buckets);
        core.table.borrow_mut().apply_records(
            &mut records,
            &mut buckets,
            now_ns,
            |_| None,
            &mut [],
        );
    }
    let _ = a.done.send(());
}

/// A snapshot's records, restored into the table, and its stats published.
fn load(core: &ShardCore, records: Vec<sluice_protocol::replication::Record>) {
    let now_ns = core.clock.now_ns();
    let mut table = core.table.borrow_mut();
    // Room for all of them first: records come in slot order, and
    // inserting them in that order into a table that grows as it goes
    // piles them into one long run (100k buckets took 11 s to load, now
    // milliseconds).
    let mut more = [0u64; 5];
    for r in &records {
        if let Some(i) = Kind::ALL.iter().position(|k| *k == r.kind) {
            more[i] += 1;
        }
    }
    table.reserve(more);
    for r in records {
        table.restore(r.key, r.kind, r.state, now_ns);
    }
    drop(table);
    core.publish_stats();
}

/// Every HEAP_SWEEP_MS: drop the full sliding logs and lease lists, and the
/// full buckets among a bounded number of slots (`Table::sweep_some`). Ends
/// with the shard's runtime.
async fn sweep_heap_periodically(core: Rc<ShardCore>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(table::HEAP_SWEEP_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        core.table.borrow_mut().sweep_some(core.clock.now_ns());
        core.publish_stats();
    }
}

/// Decides a forwarded batch and sends the outcomes back (in sync
/// mode, once the follower has what they changed).
/// Debug builds only: with `SLUICE_FAILPOINT=shard-panic-forwarded`, a
/// shard panics as it decides a forwarded batch (for the test that a panic
/// ends the process rather than leaving connections waiting on it).
#[cfg(debug_assertions)]
fn failpoint_forwarded_panic(core: &ShardCore) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| {
        std::env::var("SLUICE_FAILPOINT").is_ok_and(|v| v == "shard-panic-forwarded")
    });
    assert!(
        !on,
        "failpoint shard-panic-forwarded: shard {} panics deciding a forwarded batch",
        core.id
    );
}

thread_local! {
    /// The shard whose thread this is (none on other threads).
    static HERE: std::cell::RefCell<Option<Rc<ShardCore>>> = const { std::cell::RefCell::new(None) };
}

/// Decides `ops` (`(seq, DECIDE)`) for shard `shard` at once when called
/// on that shard's own thread (a task of its runtime: the rate limit
/// service on the shard threads), as its inbox would have but with no
/// message, no wake, no task switch and no copy of the DECIDEs. `None`
/// (nothing done: send them through the shard's inbox) on another thread,
/// or where the replies would wait for the follower (sync mode: that wait
/// is a task of the shard's own, which a task of the runtime's cannot
/// start).
pub fn decide_here<'a>(
    shard: usize,
    ops: impl ExactSizeIterator<Item = (u64, &'a DecideOp)>,
) -> Option<BatchReply> {
    HERE.with(|here| match here.borrow().as_ref() {
        Some(core) if usize::from(core.id) == shard && !replies_wait(core) => {
            let reply = decide_now(core, ops, |table, (seq, op), admits, now_ns| {
                match admits || op.mode == Mode::Probe {
                    true => (seq, table.decide_op(op, now_ns)),
                    false => (seq, Outcome::Refused(Status::NotPrimary)),
                }
            });
            // Wakes the flow to ship the changes (async mode); never a
            // wait here.
            let wait = replication_wait(core);
            debug_assert!(wait.is_none(), "checked by replies_wait");
            Some(reply)
        }
        _ => None,
    })
}

fn decide_batch(core: &Rc<ShardCore>, batch: Batch) {
    let reply = decide_now(
        core,
        batch.items.iter(),
        |table, it, admits, now_ns| match admits || !it.op.changes() {
            true => (it.seq, table.decide(it.key, &it.op, now_ns)),
            false => (it.seq, Outcome::Refused(Status::NotPrimary)),
        },
    );
    match replication_wait(core) {
        // A connection that has gone away no longer needs its answers.
        None => drop(batch.reply_to.send(reply)),
        Some(wait) => answer_when_acked(core, wait, reply, batch.reply_to),
    }
}

/// Decides every item by `one` (given whether this shard may admit:
/// changes are refused if not), counted as one batch.
fn decide_now<T>(
    core: &Rc<ShardCore>,
    items: impl ExactSizeIterator<Item = T>,
    mut one: impl FnMut(&mut table::Table, T, bool, u64) -> (u64, Outcome),
) -> BatchReply {
    #[cfg(debug_assertions)]
    failpoint_forwarded_panic(core);
    core.sync_epoch();
    let now_ns = core.clock.now_ns();
    // Checked here, where the change would be made, not only where the
    // request came in: a batch from another thread (the rate limit
    // service, another shard's connection) may reach a shard of a primary
    // that has since been fenced, or whose flow to its follower is gone.
    let admits = core.admits(now_ns);
    let mut table = core.table.borrow_mut();
    let n = items.len();
    let outcomes = items
        .map(|it| one(&mut table, it, admits, now_ns))
        .collect();
    drop(table);
    let ns = core.clock.now_ns().saturating_sub(now_ns);
    core.count_batch(n, ns);
    core.publish_stats();
    BatchReply::new(outcomes)
}

/// Sync mode: `reply` reflects changes the follower must have first; it
/// goes to `reply_to` once they are acked (refused if the follower may be
/// promoted without them).
fn answer_when_acked(
    core: &Rc<ShardCore>,
    wait: crate::replication::primary::AckWait,
    reply: BatchReply,
    reply_to: Sender<BatchReply>,
) {
    let core = core.clone();
    tokio::task::spawn_local(async move {
        let reply = if !wait.await && core.node.repl.fencing() {
            // Not known to the follower, which may be promoted:
            // the clients must not be told these admitted.
            let refused = reply.into_outcomes().into_iter();
            BatchReply::new(
                refused
                    .map(|(seq, _)| (seq, Outcome::Refused(Status::NotPrimary)))
                    .collect(),
            )
        } else {
            reply
        };
        let _ = reply_to.send(reply);
    });
}
