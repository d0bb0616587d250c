//! Replication's decisions as sans-IO state machines: what a primary
//! shard's flow sends and what an ACK releases, what a follower's flow
//! acknowledges and when it is in sync, with no socket, task or timer in
//! them. Time comes in as the node's clock (`now_ns`), bytes as parsed
//! SYNC headers and drained records; out come SYNC headers and their
//! records to write, drains acknowledged, the lease's renewal, acks to
//! send, "give the follower up", "take over now".
//!
//! Two drivers run them: the tokio tasks of `replication::primary` and
//! `replication::follower` in production (they read and write
//! the sockets, sleep and wake), and `server/tests/simulation.rs`, which
//! delivers their messages over a simulated network with faults, so the
//! code it checks is the code that runs. It sits below them (it imports
//! the shard's table and `ReplNode`, no task, node or thread type), with
//! the state a primary shard's connections share with its flow
//! ([`FlowShard`], and the [`AckWait`] a sync-mode reply awaits).
//!
//! - [`PrimaryFlow`]: one flow of a primary shard: the full sync's
//!   progress, the SYNCs' numbers, the drains sent and not yet
//!   acknowledged (with when they were sent: the lease runs from that),
//!   and the replica timeout.
//! - [`attach`], [`detach`]: a flow begins and ends on a shard's table and
//!   its [`FlowShard`] (the drain numbers and the replies waiting on them).
//! - [`FollowerFlow`]: one flow of a follower: the SYNCs taken in, when
//!   its full sync is complete (and the node in sync), what to ack once
//!   applied, a planned handover.
//! - [`start_attempt`]: a follower starts following anew.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use sluice_protocol::limit::Kind;
use sluice_protocol::replication::{
    ReplState, State, SyncHeader, SyncWriter, SYNC_FULL_DONE, SYNC_TAKEOVER,
};

use super::{ReplNode, FULL_SYNC_SLOTS_PER_STEP, LEASE_MS_MAX};
use crate::shard::table::{Table, Walk};
use crate::sync::Ordering;
use tokio::sync::Notify;

/// A drain sent and not yet acknowledged.
#[derive(Debug, Clone, Copy)]
struct Unacked {
    drain: u64,
    /// The number of its last SYNC.
    last_seq: u64,
    /// When it was sent, by the node's clock.
    sent_ns: u64,
}

/// One flow of a primary shard to its follower, without IO: built when the
/// follower subscribes ([`attach`]), dropped with the flow.
#[derive(Debug, Default)]
pub struct PrimaryFlow {
    /// The last SYNC's number (the first is 1).
    seq: u64,
    /// Since when (the node's clock) the full sync's last step is written:
    /// the flow streams.
    streaming_since_ns: Option<u64>,
    /// The full sync's sliding logs' and lease lists' keys, listed at its
    /// first step.
    heap_keys: Option<Vec<(u128, Kind)>>,
    /// One full-sync step's records (kept for its room).
    full: Vec<(u128, Kind, Option<State>)>,
    /// Drains sent and not yet acknowledged, oldest first.
    unacked: VecDeque<Unacked>,
}

/// One drain of a [`PrimaryFlow`], to write: the records of each SYNC
/// (whose heads [`PrimaryFlow::drain`] gave), in order.
#[derive(Debug)]
pub struct Drained {
    /// Each SYNC's record count and records (at least one SYNC: a drain
    /// with nothing in it is a heartbeat).
    pub parts: Vec<(u32, BytesMut)>,
    /// The drain's number (its ack releases the replies waiting on it).
    pub drain: u64,
    /// It holds the full sync's last step: once it is written, call
    /// [`PrimaryFlow::full_sync_written`].
    pub finishing: bool,
    /// Buckets of the full sync's walk in it.
    pub synced: usize,
}

/// What an ACK released: the newest drain it completed, and when that
/// drain was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub drain: u64,
    pub sent_ns: u64,
}

/// [`PrimaryFlow::overdue`]'s verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overdue {
    /// Nothing is overdue: look again at this time (the node's clock).
    LookAt(u64),
    /// A reply waits on a drain not acknowledged in time: give the
    /// follower up (the shard serves alone until it resyncs).
    GiveUp,
}

impl PrimaryFlow {
    /// A flow whose full sync has not begun.
    pub fn new() -> PrimaryFlow {
        PrimaryFlow::default()
    }

    /// Whether the full sync is written: the flow streams.
    pub fn streaming(&self) -> bool {
        self.streaming_since_ns.is_some()
    }

    /// Whether a drain sent is still unacknowledged.
    pub fn has_unacked(&self) -> bool {
        !self.unacked.is_empty()
    }

    /// The next drain, at `now_ns`: the changes since the last one, and
    /// while the full sync runs its next step (after those changes);
    /// numbered by `shard`, which also gives a planned handover's epoch
    /// (else the SYNCs carry `epoch`). Its SYNCs' heads go into `heads`
    /// (cleared first), numbered on from the last, the full sync's last
    /// step flagged [`SYNC_FULL_DONE`] and a handover [`SYNC_TAKEOVER`] on
    /// the drain's last SYNC. From now the drain waits for its ack.
    pub fn drain(
        &mut self,
        table: &mut Table,
        shard: &mut FlowShard,
        epoch: u64,
        now_ns: u64,
        heads: &mut Vec<SyncHeader>,
    ) -> Drained {
        let mut sw = SyncWriter::new();
        let streaming = self.streaming();
        let (finishing, synced) = if streaming {
            table.drain_changes(&mut sw);
            (false, 0)
        } else {
            self.full_sync_step(table, &mut sw)
        };
        let (drain, takeover) = shard.next_drain(streaming);
        let epoch = takeover.unwrap_or(epoch);
        let mut parts = sw.take();
        if parts.is_empty() {
            parts.push((0, BytesMut::new()));
        }
        let last = parts.len();
        heads.clear();
        for (i, (count, _)) in parts.iter().enumerate() {
            self.seq += 1;
            let mut flags = 0;
            if finishing && i + 1 == last {
                flags |= SYNC_FULL_DONE;
            }
            if takeover.is_some() && i + 1 == last {
                flags |= SYNC_TAKEOVER;
            }
            heads.push(SyncHeader {
                seq: self.seq,
                epoch,
                now_ns,
                flags,
                count: *count,
            });
        }
        self.unacked.push_back(Unacked {
            drain,
            last_seq: self.seq,
            sent_ns: now_ns,
        });
        Drained {
            parts,
            drain,
            finishing,
            synced,
        }
    }

    /// One step of the full sync, after the changes since the last drain:
    /// the next [`FULL_SYNC_SLOTS_PER_STEP`] slots' buckets (the heap
    /// kinds' keys listed once, at the first step). Returns whether it was
    /// the last, and how many buckets it read.
    fn full_sync_step(&mut self, table: &mut Table, sw: &mut SyncWriter) -> (bool, usize) {
        table.drain_changes(sw);
        let keys = self.heap_keys.get_or_insert_with(|| table.heap_keys());
        self.full.clear();
        let finishing =
            table.export_step(Walk::Sync, FULL_SYNC_SLOTS_PER_STEP, keys, &mut self.full);
        for (key, kind, state) in &self.full {
            sw.push(*kind, *key, state.as_ref());
        }
        (finishing, self.full.len())
    }

    /// The drain holding the full sync's last step is written, at
    /// `now_ns`: the walk ends, and the flow streams. `true` when it is
    /// still the shard's flow (`generation`): the shard streams too (its
    /// sync-mode replies wait for acks from now on).
    pub fn full_sync_written(
        &mut self,
        table: &mut Table,
        shard: &mut FlowShard,
        generation: u64,
        now_ns: u64,
    ) -> bool {
        self.streaming_since_ns = Some(now_ns);
        table.export_stop(Walk::Sync);
        let current = shard.generation == generation;
        if current {
            shard.streaming = true;
        }
        current
    }

    /// An ACK of every SYNC up to `seq`, at `now_ns`: the drains it
    /// completes are acknowledged (`lag` is told each one's round trip).
    /// Returns the newest of them, if any.
    pub fn ack(&mut self, seq: u64, now_ns: u64, mut lag: impl FnMut(u64)) -> Option<Released> {
        let mut released = None;
        while let Some(&u) = self.unacked.front() {
            if u.last_seq > seq {
                break;
            }
            self.unacked.pop_front();
            lag(now_ns.saturating_sub(u.sent_ns));
            released = Some(Released {
                drain: u.drain,
                sent_ns: u.sent_ns,
            });
        }
        released
    }

    /// Sync mode's group commit: whether the next drain waits for the
    /// last one's ack, with `changes` change entries waiting for it: while
    /// that drain is unacknowledged and fewer than
    /// [`SYNC_GROUP_ENTRIES`](super::SYNC_GROUP_ENTRIES) wait, so that the
    /// changes made during its round trip ship together.
    pub fn groups(&self, changes: usize) -> bool {
        self.has_unacked() && changes < super::SYNC_GROUP_ENTRIES
    }

    /// Sync mode, at `now_ns`: give the follower up when a reply waits
    /// (`replies_wait`) and the oldest drain it has not acknowledged was
    /// sent (or streaming began, if later) more than `timeout_ns` ago;
    /// else when to look again (at most `poll_ns` on, while nothing is
    /// due: no drain sent later can be overdue before then).
    pub fn overdue(
        &self,
        now_ns: u64,
        timeout_ns: u64,
        poll_ns: u64,
        replies_wait: bool,
    ) -> Overdue {
        let oldest = self.unacked.front().map(|u| u.sent_ns);
        match (self.streaming_since_ns, oldest) {
            (Some(since), Some(sent)) if now_ns < sent.max(since) + timeout_ns => {
                Overdue::LookAt(sent.max(since) + timeout_ns)
            }
            (Some(_), Some(_)) if replies_wait => Overdue::GiveUp,
            // Overdue with nobody waiting (an idle link), not streaming
            // yet, or nothing unacknowledged.
            _ => Overdue::LookAt(now_ns + poll_ns),
        }
    }
}

/// What the primary does with an ACK's [`Released`] drain on the flow of
/// `generation`: the lease runs from when that drain was *sent* (the
/// follower received it later, and promotes itself only
/// `promote_after_ms` after its last receipt, so the lease is over first
/// whatever the delays), and the replies waiting on it or an earlier
/// drain go, if this is still the shard's flow.
pub fn acknowledged(repl: &ReplNode, shard: &FlowShard, generation: u64, released: Released) {
    repl.last_ack_ns
        .fetch_max(released.sent_ns, Ordering::Relaxed);
    if shard.generation == generation {
        shard.acked.advance(released.drain);
    }
}

/// A follower subscribed to this shard at `now_ns`: a new flow (replacing
/// any other: [`detach`] first), its full sync about to begin (changes
/// are tracked from now), its drains numbered on from the shard's last.
/// A follower that may promote itself (`promote_after_ms` > 0) gives
/// this primary a lease of half that (the other half is the margin for
/// delays and clock rates), at most [`LEASE_MS_MAX`], held from now.
/// Returns the flow's generation.
pub fn attach(
    repl: &ReplNode,
    table: &mut Table,
    shard: &mut FlowShard,
    promote_after_ms: u32,
    now_ns: u64,
) -> u64 {
    shard.generation += 1;
    let acked = shard.drain_next - 1;
    shard.acked.set(acked, false);
    if promote_after_ms > 0 {
        repl.last_ack_ns.store(now_ns, Ordering::Relaxed);
        let lease_ms = (u64::from(promote_after_ms) / 2).min(LEASE_MS_MAX);
        repl.lease_ns.store(lease_ms * 1_000_000, Ordering::Relaxed);
    }
    table.export_start(Walk::Sync, FULL_SYNC_SLOTS_PER_STEP);
    shard.generation
}

/// Ends the shard's flow, if one is attached (changes are tracked): the
/// replies waiting on it stop waiting, unreplicated; changes are no
/// longer tracked. `None` when none was attached, else whether it was
/// streaming.
pub fn detach(table: &mut Table, shard: &mut FlowShard) -> Option<bool> {
    if !table.tracking() {
        return None;
    }
    shard.generation += 1;
    let streamed = std::mem::take(&mut shard.streaming);
    let released = shard.drain_next;
    shard.acked.set(released, true);
    table.untrack_changes();
    table.export_stop(Walk::Sync);
    Some(streamed)
}

/// A follower starts following anew, from a primary at `epoch`: from
/// here its tables are rebuilt (a full sync follows), so it is not in
/// sync, and may not promote itself, until every flow's full sync is
/// complete.
pub fn start_attempt(repl: &ReplNode, epoch: u64) {
    repl.observe_epoch(epoch);
    repl.flows_synced.store(0, Ordering::Relaxed);
    repl.watch.set_in_sync(false);
    repl.set_state(ReplState::Syncing);
}

/// Why a follower's flow refuses a SYNC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Its epoch is beyond this node's by more than
    /// [`EPOCH_JUMP_MAX`](super::EPOCH_JUMP_MAX): not trusted.
    Incredible(u64),
}

/// What a follower's flow does once the records of the SYNCs it took in
/// are applied: ack the last of them, then (a planned handover) take
/// over at an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    pub ack: Option<u64>,
    pub take_over: Option<u64>,
}

/// One flow of a follower from one primary shard, without IO: SYNCs in
/// (their headers, once parsed), acks and a handover out.
#[derive(Debug, Clone, Default)]
pub struct FollowerFlow {
    /// Shards of the primary (flows of the attempt).
    primary_shards: u64,
    /// This flow's full sync is complete.
    full_done: bool,
    /// The last SYNC taken in and not yet acknowledged.
    ack: Option<u64>,
    /// A planned handover's epoch, from a SYNC taken in.
    take_over: Option<u64>,
}

impl FollowerFlow {
    /// A flow of an attempt that follows a primary of `primary_shards`
    /// shards.
    pub fn new(primary_shards: u64) -> FollowerFlow {
        FollowerFlow {
            primary_shards,
            ..FollowerFlow::default()
        }
    }

    /// Takes in a SYNC's header (`bytes` long with its records) at
    /// `now_ns`, before its records are applied: refuses an epoch too far
    /// ahead to trust, then counts the stream, the lag and the keys
    /// synced, and (`SYNC_FULL_DONE`) this flow's full sync as complete:
    /// once every primary shard's is, the node streams in sync.
    pub fn on_sync(
        &mut self,
        repl: &ReplNode,
        sh: &SyncHeader,
        bytes: usize,
        now_ns: u64,
    ) -> Result<(), Refused> {
        if !repl.epoch_credible(sh.epoch) {
            repl.log_incredible_epoch(sh.epoch);
            return Err(Refused::Incredible(sh.epoch));
        }
        if sh.flags & SYNC_TAKEOVER == 0 {
            // (A handover's epoch is the one this node takes.)
            repl.observe_epoch(sh.epoch);
        } else {
            self.take_over = Some(sh.epoch);
        }
        let lag_ns = now_ns.saturating_sub(sh.now_ns);
        repl.lag_us.store(lag_ns / 1_000, Ordering::Relaxed);
        repl.stream_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        repl.stream_records
            .fetch_add(u64::from(sh.count), Ordering::Relaxed);
        repl.stream_syncs.fetch_add(1, Ordering::Relaxed);
        if !self.full_done {
            repl.keys_synced
                .fetch_add(u64::from(sh.count), Ordering::Relaxed);
        }
        if sh.flags & SYNC_FULL_DONE != 0 {
            self.full_done = true;
            let synced = repl.flows_synced.fetch_add(1, Ordering::AcqRel) + 1;
            if synced >= self.primary_shards {
                repl.watch.set_in_sync(true);
                repl.set_state(ReplState::Streaming);
            }
        }
        self.ack = Some(sh.seq);
        Ok(())
    }

    /// The records of every SYNC taken in are applied, at `now_ns`: what
    /// to send. The receipt is recorded and the ack decided under the
    /// promotion lock ([`Watch::receipt`](super::lease::Watch::receipt)):
    /// either the watchdog sees this receipt (and does not promote now), or
    /// it has promoted and we do not ack (an ack would renew the old
    /// primary's lease). `None`: stop following (`following()` no longer
    /// holds).
    pub fn applied(
        &mut self,
        repl: &ReplNode,
        now_ns: u64,
        following: impl FnOnce() -> bool,
    ) -> Option<Applied> {
        let Some(seq) = self.ack.take() else {
            return Some(Applied::default());
        };
        if !repl.watch.receipt(now_ns, following) {
            return None;
        }
        Some(Applied {
            ack: Some(seq),
            take_over: self.take_over.take(),
        })
    }
}

/// A primary shard's side of its flow, on the shard's thread.
#[derive(Debug)]
pub struct FlowShard {
    /// Bumped when a flow attaches or is dropped; a flow task that finds
    /// its generation out of date ends.
    pub generation: u64,
    /// A flow is attached with its full sync done (sync-mode replies wait
    /// for its acks while this is set).
    pub streaming: bool,
    /// The drain the changes made from now on ship in.
    pub drain_next: u64,
    /// Told when a connection wants changes shipped.
    pub wake: Rc<Notify>,
    /// Sync mode: the flow waits for its last drain's ack before the next
    /// (group commit; see [`SYNC_GROUP_ENTRIES`](super::SYNC_GROUP_ENTRIES)): connections wake it
    /// only once that many changes wait.
    pub grouping: bool,
    /// A planned failover asked this shard's flow to hand over at this
    /// epoch (see `SYNC_TAKEOVER`).
    pub takeover: Option<u64>,
    /// The highest drain the follower has acknowledged, and whether the
    /// flow was given up on (then every waiter stops waiting, unreplicated).
    pub acked: Rc<Acked>,
}

/// [`FlowShard::acked`] and the replies waiting on it. On the shard's
/// thread only, so a wait is a push and a release a pass over the waiters,
/// with no atomics or locks: a `watch` channel (subscribe, `wait_for`,
/// `notify_waiters`) cost about 1,200 instructions a sync wait and its
/// release under callgrind (benches/notes.md, "Replication").
#[derive(Debug, Default)]
pub struct Acked {
    /// (highest drain acknowledged, given up).
    state: Cell<(u64, bool)>,
    /// How many times a flow was given up on: a wait begun before the last
    /// time ends unreplicated even when a new flow has started since
    /// (which clears "given up" and acknowledges drains it never had).
    round: Cell<u64>,
    /// Tasks waiting, with the drain each needs. An entry whose future was
    /// dropped stays until its drain is acknowledged or the flow given up
    /// on, then is woken once, spuriously, and gone.
    waiters: RefCell<Vec<(u64, Waker)>>,
    /// The same, woken before `waiters`: the flow's group commit, so that
    /// on an ack the next drain leaves before the replies the ack released
    /// are written (the follower applies it meanwhile).
    first: RefCell<Vec<(u64, Waker)>>,
}

impl Acked {
    /// Sets the state and wakes every waiter it ends: all of them when the
    /// flow is given up on, else those whose drain is acknowledged.
    pub fn set(&self, drain: u64, gave_up: bool) {
        if gave_up {
            self.round.set(self.round.get() + 1);
        }
        self.state.set((drain, gave_up));
        for list in [&self.first, &self.waiters] {
            list.borrow_mut().retain(|(need, waker)| {
                let done = gave_up || *need <= drain;
                if done {
                    waker.wake_by_ref();
                }
                !done
            });
        }
    }

    /// An ack of `drain`: raises the state to it, if it is newer, and
    /// wakes the waiters it ends.
    pub fn advance(&self, drain: u64) {
        let (was, gave_up) = self.state.get();
        if drain > was {
            self.set(drain, gave_up);
        }
    }

    /// Until drain `need` is acknowledged (`true`) or the flow is given up
    /// on (`false`, also when both).
    pub fn wait(self: &Rc<Self>, need: u64) -> AckWait {
        AckWait {
            acked: self.clone(),
            need,
            round: self.round.get(),
            registered: false,
            first: false,
        }
    }

    /// [`Acked::wait`], woken before every plain wait that the same ack
    /// ends.
    pub fn wait_first(self: &Rc<Self>, need: u64) -> AckWait {
        AckWait {
            first: true,
            ..self.wait(need)
        }
    }

    /// A reply is (or was, its future dropped since) waiting for an ack.
    pub fn has_waiters(&self) -> bool {
        !self.waiters.borrow().is_empty()
    }
}

/// [`Acked::wait`]: ends when the drain it needs is acknowledged, or its
/// flow is given up on: at most about `replica_timeout_ms`, since then
/// `primary.rs`'s `watch_acks` drops the follower (the shard serves alone until it
/// resyncs). `true` when the follower has the changes; `false` when it may
/// not (the caller then may not tell a client what they decided if the
/// follower may be promoted: see
/// [`ReplNode::fencing`](super::ReplNode::fencing)).
#[derive(Debug)]
#[must_use = "a wait does nothing unless awaited"]
pub struct AckWait {
    acked: Rc<Acked>,
    need: u64,
    /// [`Acked::round`] when the wait began.
    round: u64,
    registered: bool,
    /// Registered in [`Acked::first`].
    first: bool,
}

impl Future for AckWait {
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let (drain, gave_up) = self.acked.state.get();
        if gave_up || self.acked.round.get() != self.round {
            return Poll::Ready(false);
        }
        if drain >= self.need {
            return Poll::Ready(true);
        }
        if !self.registered {
            // Once: a task's waker stays the same, and the task is woken
            // by its other registrations too (its socket), so polls can
            // repeat while it waits.
            self.registered = true;
            let need = self.need;
            let list = if self.first {
                &self.acked.first
            } else {
                &self.acked.waiters
            };
            list.borrow_mut().push((need, cx.waker().clone()));
        }
        Poll::Pending
    }
}

impl FlowShard {
    /// See [`FlowShard::streaming`].
    pub fn is_streaming(&self) -> bool {
        self.streaming
    }

    /// The number of the drain about to be sent, and (once the full sync
    /// is done) a planned handover's epoch, if one was asked for.
    pub fn next_drain(&mut self, full_done: bool) -> (u64, Option<u64>) {
        let drain = self.drain_next;
        self.drain_next += 1;
        let takeover = if full_done {
            self.takeover.take()
        } else {
            None
        };
        (drain, takeover)
    }
}

impl Default for FlowShard {
    fn default() -> Self {
        FlowShard {
            generation: 0,
            streaming: false,
            drain_next: 1,
            takeover: None,
            wake: Rc::new(Notify::new()),
            grouping: false,
            acked: Rc::default(),
        }
    }
}

#[cfg(all(test, not(sluice_loom)))]
mod tests {
    use super::*;

    /// Wakes nobody (`Waker::noop` is newer than the MSRV).
    struct Noop;

    impl std::task::Wake for Noop {
        fn wake(self: std::sync::Arc<Self>) {}
    }

    fn poll(wait: &mut AckWait) -> Poll<bool> {
        let waker = Waker::from(std::sync::Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        Pin::new(wait).poll(&mut cx)
    }

    /// A waker that records `id` in `log` when woken.
    struct Recorder {
        id: u32,
        log: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
    }

    impl std::task::Wake for Recorder {
        fn wake(self: std::sync::Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.log.lock().unwrap().push(self.id);
        }
    }

    /// On an ack, the flow's group commit is woken before the replies the
    /// same ack releases, whatever order they began waiting in (the
    /// executor runs woken tasks in order: the next drain leaves first).
    /// The flow's wait is not a reply waiting either.
    #[test]
    fn an_ack_wakes_the_flow_before_the_replies_it_releases() {
        let acked = Rc::new(Acked::default());
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let waker = |id| {
            Waker::from(std::sync::Arc::new(Recorder {
                id,
                log: log.clone(),
            }))
        };
        let (w1, w2, w3) = (waker(1), waker(2), waker(3));
        let mut reply = acked.wait(1);
        let mut flow = acked.wait_first(1);
        let mut later = acked.wait(2);
        assert!(Pin::new(&mut flow)
            .poll(&mut Context::from_waker(&w3))
            .is_pending());
        assert!(!acked.has_waiters(), "the flow's wait is no reply's");
        assert!(Pin::new(&mut reply)
            .poll(&mut Context::from_waker(&w1))
            .is_pending());
        assert!(Pin::new(&mut later)
            .poll(&mut Context::from_waker(&w2))
            .is_pending());
        acked.advance(1);
        assert_eq!(
            *log.lock().unwrap(),
            [3, 1],
            "the flow first; drain 2 still waits"
        );
        assert_eq!(poll(&mut flow), Poll::Ready(true));
        assert_eq!(poll(&mut reply), Poll::Ready(true));
        assert_eq!(poll(&mut later), Poll::Pending);
    }

    #[test]
    fn a_wait_ends_replicated_when_its_drain_is_acknowledged() {
        let acked = Rc::new(Acked::default());
        acked.set(3, false);
        let mut wait = acked.wait(5);
        assert_eq!(poll(&mut wait), Poll::Pending);
        assert!(acked.has_waiters());
        acked.advance(4);
        assert_eq!(poll(&mut wait), Poll::Pending);
        acked.advance(6);
        assert_eq!(poll(&mut wait), Poll::Ready(true));
        assert!(!acked.has_waiters(), "released waiters leave the list");
    }

    /// A flow given up on and replaced at once (a follower that
    /// reconnects) must not release a wait of the old flow as replicated:
    /// the new flow acknowledges drains the follower never had.
    #[test]
    fn a_wait_from_a_flow_given_up_on_ends_unreplicated() {
        let acked = Rc::new(Acked::default());
        acked.set(3, false);
        let mut early = acked.wait(4);
        let mut late = acked.wait(5);
        assert_eq!(poll(&mut early), Poll::Pending);
        assert_eq!(poll(&mut late), Poll::Pending);
        // detach, then the next flow's start (`serve_flow`), before the
        // woken waits are polled.
        acked.set(5, true);
        acked.set(4, false);
        assert_eq!(poll(&mut early), Poll::Ready(false));
        assert_eq!(poll(&mut late), Poll::Ready(false));
        // A wait begun under the new flow is its own.
        let mut next = acked.wait(4);
        assert_eq!(poll(&mut next), Poll::Ready(true));
    }

    const MS: u64 = 1_000_000;

    fn primary() -> (ReplNode, Table, FlowShard) {
        let repl = ReplNode::new(
            None,
            None,
            "p".into(),
            crate::config::Replication::Sync,
            false,
        );
        (repl, Table::new(), FlowShard::default())
    }

    fn spend(table: &mut Table, key: u128, now_ns: u64) {
        let policy = sluice_protocol::Policy::new(1, 3_600_000 * MS, 10).unwrap();
        assert!(table.throttle(key, &policy, 1, now_ns).unwrap().allowed);
    }

    /// A flow's life on the primary: the full sync flagged done on its
    /// last SYNC, then drains numbered on, a heartbeat when nothing
    /// changed; an ACK releases the drains it covers with their sending
    /// time, which the lease runs from, and the replies waiting on them.
    #[test]
    fn a_primary_flow_numbers_its_syncs_and_acks_release_drains_by_sending_time() {
        let (repl, mut table, mut shard) = primary();
        spend(&mut table, 7, 1_000);
        let generation = attach(&repl, &mut table, &mut shard, 400, 1_000);
        assert_eq!(repl.lease_ns.load(Ordering::Relaxed), 200 * MS);
        let mut flow = PrimaryFlow::new();
        let mut heads = Vec::new();
        let full = flow.drain(&mut table, &mut shard, 3, 2_000, &mut heads);
        assert!(full.finishing && full.synced == 1);
        let last = heads.last().unwrap();
        assert_eq!((last.seq, last.epoch, last.flags), (1, 3, SYNC_FULL_DONE));
        assert!(flow.full_sync_written(&mut table, &mut shard, generation, 2_000));
        assert!(flow.streaming() && shard.is_streaming());
        // A reply whose change ships in the next drain waits for its ack.
        spend(&mut table, 7, 3_000);
        let mut wait = shard.acked.wait(shard.drain_next);
        let changes = flow.drain(&mut table, &mut shard, 3, 3_000, &mut heads);
        assert_eq!((heads[0].seq, heads[0].count, heads[0].flags), (2, 1, 0));
        assert!(flow.groups(1), "group commit: the next drain waits");
        assert!(!flow.groups(64), "unless a group's worth of changes wait");
        let beat = flow.drain(&mut table, &mut shard, 3, 4_000, &mut heads);
        assert_eq!((heads.len(), heads[0].seq, heads[0].count), (1, 3, 0));
        assert_eq!(poll(&mut wait), Poll::Pending);
        let mut lags = Vec::new();
        let released = flow.ack(2, 9_000, |lag| lags.push(lag)).unwrap();
        assert_eq!(
            lags,
            [7_000, 6_000],
            "the full sync's drain and the change's"
        );
        assert_eq!(released.drain, changes.drain);
        assert_eq!(released.sent_ns, 3_000, "when it was sent, not when acked");
        acknowledged(&repl, &shard, generation, released);
        assert_eq!(repl.last_ack_ns.load(Ordering::Relaxed), 3_000);
        assert_eq!(poll(&mut wait), Poll::Ready(true));
        assert!(flow.has_unacked());
        let released = flow.ack(3, 9_500, |_| {}).unwrap();
        assert_eq!(released.drain, beat.drain);
        assert!(!flow.has_unacked() && !flow.groups(1));
        assert_eq!(flow.ack(3, 9_600, |_| {}), None, "an ack repeated");
    }

    /// The replica timeout gives the follower up only when a reply waits
    /// on a drain unacknowledged for longer than it, counted from the
    /// drain's sending or from when streaming began, if later.
    #[test]
    fn the_follower_is_given_up_only_when_a_reply_waits_past_the_timeout() {
        let (_, mut table, mut shard) = primary();
        let mut flow = PrimaryFlow::new();
        let mut heads = Vec::new();
        flow.drain(&mut table, &mut shard, 1, 0, &mut heads);
        assert_eq!(
            flow.overdue(0, 300, 50, true),
            Overdue::LookAt(50),
            "not streaming yet"
        );
        flow.full_sync_written(&mut table, &mut shard, 0, 100);
        assert_eq!(flow.overdue(150, 300, 50, true), Overdue::LookAt(400));
        assert_eq!(flow.overdue(401, 300, 50, false), Overdue::LookAt(451));
        assert_eq!(flow.overdue(401, 300, 50, true), Overdue::GiveUp);
        flow.ack(1, 402, |_| {});
        assert_eq!(flow.overdue(500, 300, 50, true), Overdue::LookAt(550));
    }

    /// A flow given up on ends its waits unreplicated, at once, and
    /// stops tracking changes; detaching twice does nothing more.
    #[test]
    fn detach_ends_the_waits_unreplicated() {
        let (repl, mut table, mut shard) = primary();
        let generation = attach(&repl, &mut table, &mut shard, 0, 0);
        assert_eq!(repl.lease_ns.load(Ordering::Relaxed), 0, "no fencing");
        let mut flow = PrimaryFlow::new();
        flow.drain(&mut table, &mut shard, 1, 0, &mut Vec::new());
        flow.full_sync_written(&mut table, &mut shard, generation, 0);
        let mut wait = shard.acked.wait(shard.drain_next);
        assert_eq!(detach(&mut table, &mut shard), Some(true));
        assert_eq!(poll(&mut wait), Poll::Ready(false));
        assert!(!table.tracking() && !shard.is_streaming());
        assert_eq!(detach(&mut table, &mut shard), None);
    }

    /// The follower: in sync once its full sync's last SYNC is taken in
    /// (every primary shard's), out of sync at a new attempt; an ack only
    /// while it still follows; a handover's epoch taken, not observed.
    #[test]
    fn a_follower_flow_acks_what_it_took_in_and_is_in_sync_after_its_full_sync() {
        let repl = ReplNode::new(
            Some("p"),
            None,
            "f".into(),
            crate::config::Replication::Sync,
            false,
        );
        start_attempt(&repl, 4);
        assert_eq!(repl.epoch(), 4);
        let mut flow = FollowerFlow::new(1);
        let sync = |seq, flags| SyncHeader {
            seq,
            epoch: 4,
            now_ns: 0,
            flags,
            count: 2,
        };
        flow.on_sync(&repl, &sync(1, 0), 100, 10).unwrap();
        assert!(!repl.watch.in_sync());
        flow.on_sync(&repl, &sync(2, SYNC_FULL_DONE), 100, 10)
            .unwrap();
        assert!(repl.watch.in_sync());
        assert_eq!(repl.keys_synced.load(Ordering::Relaxed), 4);
        let applied = flow.applied(&repl, 20, || true).unwrap();
        assert_eq!(
            applied,
            Applied {
                ack: Some(2),
                take_over: None
            }
        );
        assert_eq!(flow.applied(&repl, 21, || true), Some(Applied::default()));
        flow.on_sync(&repl, &sync(3, 0), 100, 30).unwrap();
        assert_eq!(
            flow.applied(&repl, 31, || false),
            None,
            "promoted meanwhile"
        );
        let handover = SyncHeader {
            epoch: 5,
            ..sync(4, SYNC_TAKEOVER)
        };
        flow.on_sync(&repl, &handover, 100, 40).unwrap();
        assert_eq!(repl.epoch(), 4);
        let applied = flow.applied(&repl, 41, || true).unwrap();
        assert_eq!(applied.take_over, Some(5));
        let far = SyncHeader {
            epoch: u64::MAX,
            ..sync(5, 0)
        };
        assert_eq!(
            flow.on_sync(&repl, &far, 100, 50),
            Err(Refused::Incredible(u64::MAX))
        );
        start_attempt(&repl, 4);
        assert!(!repl.watch.in_sync(), "a new attempt starts out of sync");
    }
}
