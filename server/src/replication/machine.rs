//! Replication's decisions as sans-IO state machines: what a primary
//! shard's flow sends and what an ACK releases, what a follower's flow
//! acknowledges and when it is in sync, with no socket, task or timer in
//! them. Time comes in as the node's clock (`now_ns`), bytes as parsed
//! SYNC headers and drained records; out come SYNC headers and their
//! records to write, drains acknowledged, the lease's renewal, acks to
//! send, "give the follower up", "take over now".
//!
//! Two drivers run them: the tokio tasks of [`primary`](super::primary)
//! and [`follower`](super::follower) in production (they read and write
//! the sockets, sleep and wake), and `server/tests/simulation.rs`, which
//! delivers their messages over a simulated network with faults, so the
//! code it checks is the code that runs.
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

use std::collections::VecDeque;

use bytes::BytesMut;
use sluice_protocol::limit::Kind;
use sluice_protocol::replication::{
    ReplState, State, SyncHeader, SyncWriter, SYNC_FULL_DONE, SYNC_TAKEOVER,
};

use super::primary::FlowShard;
use super::{ReplNode, FULL_SYNC_SLOTS_PER_STEP, LEASE_MS_MAX};
use crate::shard::table::{Table, Walk};
use crate::sync::Ordering;

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
