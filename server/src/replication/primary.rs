//! A primary shard's flow to its follower: the full sync of the shard's
//! table (a walk over its slots a few thousand at a time, interleaved with
//! everything else the shard does), then the stream: every time the shard
//! has changed buckets, one *drain* takes them (each bucket once, with its
//! state as it is now) into one or more SYNC messages.
//!
//! Sync mode: a connection whose read changed buckets notes the drain those
//! changes will ship in ([`FlowShard::drain_next`]) and holds its replies
//! until the follower has acknowledged that drain ([`AckWait`]).
//! Acks are cumulative, so one ack releases every connection waiting on
//! that drain or an earlier one: many batches are in flight per round trip.
//! While changes are few the flow keeps one drain in flight and the next
//! gathers what its round trip brings ([`group_commit`]).
//! A follower that does not ack within `replica_timeout_ms` is dropped and
//! the shard serves alone (and says so), until it resyncs. That limit is
//! watched once per flow ([`watch_acks`]), not by a timer per wait.
//!
//! What is decided (numbers, flags, what an ack releases, the lease, the
//! timeout) is [`PrimaryFlow`]'s, in [`machine`]; the tasks here read and
//! write the sockets and wait.

use std::cell::RefCell;
use std::io::IoSlice;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::replication::{
    self, sync_frame_head, FailoverOk, ReplState, Role, Subscribe, SYNC_FIXED_BYTES,
    SYNC_HEAD_BYTES,
};
use sluice_protocol::Clock;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::stream::Stream;
use tokio::sync::Notify;
use tokio_util::codec::Decoder;

use super::machine::{self, Overdue, PrimaryFlow};
use super::{ASYNC_DRAIN_MS, FLOW_WRITE_TIMEOUT_MS, HEARTBEAT_MS, SYNC_GROUP_ENTRIES};
use crate::node::ShardCore;
use crate::sync::Ordering;

pub use super::machine::{AckWait, Acked, FlowShard};

/// Whether replies that change the table wait for the follower's ack on
/// this shard (sync mode, a flow streaming): [`replication_wait`] can
/// then return a wait.
#[inline]
pub fn replies_wait(core: &ShardCore) -> bool {
    core.node.repl.mode == replication::Mode::Sync && core.flow.borrow().is_streaming()
}

/// Sync mode: the wait for the drain a connection must see acknowledged
/// before its replies go, if its work changed anything a follower must
/// have (await it: [`AckWait`]). Also wakes the flow, which ships the
/// changes as soon as the shard is free, unless it is holding them for its
/// last drain's ack and fewer than [`SYNC_GROUP_ENTRIES`] wait.
#[inline]
pub fn replication_wait(core: &ShardCore) -> Option<AckWait> {
    let waiting = core.table.borrow().changes_len();
    if waiting == 0 {
        return None;
    }
    let flow = core.flow.borrow();
    if !flow.grouping || waiting >= SYNC_GROUP_ENTRIES {
        flow.wake.notify_one();
    }
    (flow.is_streaming() && core.node.repl.mode == replication::Mode::Sync)
        .then(|| flow.acked.wait(flow.drain_next))
}

/// Ends the shard's flow (if any): replies stop waiting, changes are no
/// longer tracked.
fn detach(core: &ShardCore) {
    // Once only per flow: several waits may time out together, and a flow
    // that ends also detaches (a flow is attached while changes are
    // tracked).
    let detached = machine::detach(&mut core.table.borrow_mut(), &mut core.flow.borrow_mut());
    let Some(streamed) = detached else {
        return;
    };
    let repl = &core.node.repl;
    if streamed {
        repl.flows_streaming.fetch_sub(1, Ordering::AcqRel);
    }
    let attached = repl.flows_attached.fetch_sub(1, Ordering::AcqRel) - 1;
    if attached == 0 && repl.is_primary() {
        repl.set_state(ReplState::Alone);
        repl.set_follower(String::new());
    }
}

/// The flow's machine, shared by its sending, ack-reading and watching
/// tasks (on the shard's thread).
type Machine = Rc<RefCell<PrimaryFlow>>;

/// Serves a follower's SUBSCRIBE on this shard until the link fails, the
/// follower stops acking, or another flow replaces this one.
pub async fn serve_flow(
    core: Rc<ShardCore>,
    stream: Stream,
    rbuf: BytesMut,
    request_id: u32,
    sub: Subscribe,
) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    if core.flow.borrow().generation > 0 && core.table.borrow().tracking() {
        // A follower that reconnects replaces its old flow.
        detach(&core);
    }
    let repl = &core.node.repl;
    // The follower may promote itself: this primary holds a lease its
    // acks renew.
    let generation = machine::attach(
        repl,
        &mut core.table.borrow_mut(),
        &mut core.flow.borrow_mut(),
        sub.promote_after_ms,
        core.clock.now_ns(),
    );
    repl.flows_attached.fetch_add(1, Ordering::AcqRel);
    repl.set_follower(sub.addr.clone());
    repl.set_state(ReplState::Syncing);
    tracing::info!(shard = core.id, follower = %peer, follower_node = sub.node_id, "follower subscribed: full sync");
    match stream {
        // Plain TCP splits without a lock between the halves.
        Stream::Plain(tcp) => {
            let (rd, wr) = tcp.into_split();
            stream_halves(core, rd, wr, rbuf, request_id, generation, peer).await;
        }
        tls => {
            let (rd, wr) = tokio::io::split(tls);
            stream_halves(core, rd, wr, rbuf, request_id, generation, peer).await;
        }
    }
}

/// The flow once subscribed: the table's sizes, then the full sync and
/// the drains on `wr`, acks read from `rd` on a task of their own.
async fn stream_halves<R, W>(
    core: Rc<ShardCore>,
    rd: R,
    mut wr: W,
    rbuf: BytesMut,
    request_id: u32,
    generation: u64,
    peer: String,
) where
    R: AsyncRead + Unpin + 'static,
    W: AsyncWrite + Unpin,
{
    // First the table's sizes, so the follower makes room in one step.
    let sizes = core.table.borrow().kind_lens();
    let mut first = BytesMut::new();
    let mut w = FrameWriter::new();
    replication::put_sizes(&mut w, &mut first, request_id, &sizes);
    w.finish(&mut first);
    if wr.write_all(&first).await.is_err() || wr.flush().await.is_err() {
        detach(&core);
        return;
    }
    let machine: Machine = Rc::default();
    let acks = tokio::task::spawn_local(read_acks(
        core.clone(),
        rd,
        rbuf,
        machine.clone(),
        generation,
    ));
    let watch = (core.node.repl.mode == replication::Mode::Sync)
        .then(|| tokio::task::spawn_local(watch_acks(core.clone(), machine.clone(), generation)));
    let result = stream_flow(&core, &mut wr, request_id, &machine, generation).await;
    acks.abort();
    if let Some(watch) = watch {
        watch.abort();
    }
    if core.flow.borrow().generation == generation {
        if let Err(e) = &result {
            tracing::warn!(shard = core.id, follower = %peer, error = %e, "follower lost");
        }
        detach(&core);
    }
}

/// The flow's sending loop: full sync (interleaved with drains), then
/// drains and heartbeats, as the flow's machine makes them.
async fn stream_flow(
    core: &ShardCore,
    wr: &mut (impl AsyncWrite + Unpin),
    request_id: u32,
    machine: &Machine,
    generation: u64,
) -> std::io::Result<()> {
    let mut heads = Vec::new();
    let mut frame_heads = Vec::new();
    let wake = core.flow.borrow().wake.clone();
    loop {
        if core.flow.borrow().generation != generation {
            return Ok(());
        }
        let now_ns = core.clock.now_ns();
        let drained = machine.borrow_mut().drain(
            &mut core.table.borrow_mut(),
            &mut core.flow.borrow_mut(),
            core.node.repl.epoch(),
            now_ns,
            &mut heads,
        );
        let repl = &core.node.repl;
        repl.keys_synced
            .fetch_add(drained.synced as u64, Ordering::Relaxed);
        frame_heads.clear();
        for (h, (count, body)) in heads.iter().zip(&drained.parts) {
            repl.stream_bytes
                .fetch_add((SYNC_FIXED_BYTES + body.len()) as u64, Ordering::Relaxed);
            repl.stream_records
                .fetch_add(u64::from(*count), Ordering::Relaxed);
            repl.stream_syncs.fetch_add(1, Ordering::Relaxed);
            frame_heads.push(sync_frame_head(request_id, h, body.len()));
        }
        if drained.finishing {
            // Before the follower can see its copy complete (and tell etcd
            // it may take over): no more admitting alone.
            repl.solo.store(0, Ordering::Release);
        }
        write_syncs_within(wr, &frame_heads, &drained.parts).await?;
        if drained.finishing {
            full_sync_sent(core, machine, generation);
        }
        if !machine.borrow().streaming() {
            // Let the shard serve between two steps of a large full sync.
            tokio::task::yield_now().await;
            continue;
        }
        until_next_drain(core, machine, drained.drain, &wake).await;
    }
}

/// [`write_syncs`], failing once the follower has taken no bytes for
/// [`FLOW_WRITE_TIMEOUT_MS`].
async fn write_syncs_within(
    wr: &mut (impl AsyncWrite + Unpin),
    heads: &[[u8; SYNC_HEAD_BYTES]],
    parts: &[(u32, BytesMut)],
) -> std::io::Result<()> {
    let write = write_syncs(wr, heads, parts);
    match tokio::time::timeout(Duration::from_millis(FLOW_WRITE_TIMEOUT_MS), write).await {
        Ok(written) => written,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the follower took no bytes for {FLOW_WRITE_TIMEOUT_MS} ms"),
        )),
    }
}

/// The last step of the full sync is written: the walk ends, and (unless
/// another flow replaced this one) the flow streams; once every shard's
/// does, the node is streaming.
fn full_sync_sent(core: &ShardCore, machine: &Machine, generation: u64) {
    let current = machine.borrow_mut().full_sync_written(
        &mut core.table.borrow_mut(),
        &mut core.flow.borrow_mut(),
        generation,
        core.clock.now_ns(),
    );
    if current {
        let repl = &core.node.repl;
        let streaming = repl.flows_streaming.fetch_add(1, Ordering::AcqRel) + 1;
        if streaming >= u64::from(core.node.shard_count) {
            repl.set_state(ReplState::Streaming);
        }
        tracing::info!(shard = core.id, "full sync sent; streaming");
        core.count_full_sync();
        core.publish_stats();
    }
}

/// Streaming: waits before the next drain. Sync mode first waits for
/// `drain`'s ack ([`group_commit`]); with no changes waiting, until one
/// comes or a heartbeat is due; async mode then lets changes gather.
async fn until_next_drain(core: &ShardCore, machine: &Machine, drain: u64, wake: &Notify) {
    if core.node.repl.mode == replication::Mode::Sync {
        group_commit(core, machine, drain, wake).await;
    }
    if !core.table.borrow().has_changes() {
        let heartbeat = Duration::from_millis(HEARTBEAT_MS);
        let _ = tokio::time::timeout(heartbeat, wake.notified()).await;
    }
    if core.node.repl.mode == replication::Mode::Async {
        // Nobody waits for this drain: let changes gather for a
        // moment, so that one drain (one write, one ack) carries many
        // reads' worth of them. This is the lag async mode accepts.
        tokio::time::sleep(Duration::from_millis(ASYNC_DRAIN_MS)).await;
    }
}

/// Sync mode: until `drain` (the one just sent) is acknowledged or its
/// flow given up on, or the machine no longer holds the next drain for it
/// ([`PrimaryFlow::groups`]: [`SYNC_GROUP_ENTRIES`] changes wait),
/// whichever comes first: one drain in flight while changes are few, so
/// that the ones made during its round trip ship together.
async fn group_commit(core: &ShardCore, machine: &Machine, drain: u64, wake: &Notify) {
    let acked = core.flow.borrow().acked.wait_first(drain);
    let mut acked = std::pin::pin!(acked);
    core.flow.borrow_mut().grouping = true;
    loop {
        tokio::select! {
            biased;
            _ = &mut acked => break,
            () = wake.notified() => {
                if !machine.borrow().groups(core.table.borrow().changes_len()) {
                    break;
                }
            }
        }
    }
    core.flow.borrow_mut().grouping = false;
}

/// Slices one `writev` is given at most (std also caps them at IOV_MAX).
const WRITE_SLICES_MAX: usize = 512;

/// Writes each SYNC's frame head, then its records, in order: the
/// records straight from the drained payloads, not copied into a frame
/// buffer first (that copy was about 33 instructions a decision).
async fn write_syncs(
    wr: &mut (impl AsyncWrite + Unpin),
    heads: &[[u8; SYNC_HEAD_BYTES]],
    parts: &[(u32, BytesMut)],
) -> std::io::Result<()> {
    let mut bufs: Vec<&[u8]> = Vec::with_capacity(2 * heads.len());
    for (head, (_, body)) in heads.iter().zip(parts) {
        bufs.push(head);
        if !body.is_empty() {
            bufs.push(body);
        }
    }
    // Where the unwritten bytes begin: buffer `at`, from byte `skip`.
    let (mut at, mut skip) = (0, 0);
    let mut slices = Vec::with_capacity(bufs.len().min(WRITE_SLICES_MAX));
    while at < bufs.len() {
        slices.clear();
        slices.push(IoSlice::new(&bufs[at][skip..]));
        slices.extend(
            bufs[at + 1..]
                .iter()
                .take(WRITE_SLICES_MAX - 1)
                .map(|b| IoSlice::new(b)),
        );
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let left = bufs[at].len() - skip;
            if n < left {
                skip += n;
                break;
            }
            n -= left;
            at += 1;
            skip = 0;
        }
    }
    // A TLS stream may hold the last record until flushed.
    wr.flush().await
}

/// Reads the follower's ACKs: each releases every drain it covers.
async fn read_acks(
    core: Rc<ShardCore>,
    mut rd: impl AsyncRead + Unpin,
    mut rbuf: BytesMut,
    machine: Machine,
    generation: u64,
) {
    let mut decoder = FrameDecoder::new(core.node.config.frame_bytes_max);
    loop {
        loop {
            let frame = match decoder.decode(&mut rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(shard = core.id, error = %e, "bad frame from follower");
                    return end(&core, generation);
                }
            };
            for (h, p) in frame.messages() {
                let Some(acked) = (h.op == replication::op::ACK)
                    .then(|| replication::parse_ack(p))
                    .flatten()
                else {
                    tracing::warn!(
                        shard = core.id,
                        op = h.op,
                        "unexpected message from follower"
                    );
                    return end(&core, generation);
                };
                let now_ns = core.clock.now_ns();
                let released = machine.borrow_mut().ack(acked, now_ns, |lag_ns| {
                    core.node
                        .repl
                        .lag_us
                        .store(lag_ns / 1_000, Ordering::Relaxed);
                    core.count_ack(lag_ns);
                });
                if let Some(released) = released {
                    let flow = core.flow.borrow();
                    machine::acknowledged(&core.node.repl, &flow, generation, released);
                }
            }
        }
        rbuf.reserve(4096);
        match rd.read_buf(&mut rbuf).await {
            Ok(0) | Err(_) => return end(&core, generation),
            Ok(_) => {}
        }
    }
}

/// Sync mode: drops the follower once a reply waits on it and the oldest
/// drain it has not acknowledged was sent (or streaming began, if later)
/// `replica_timeout_ms` ago. One timer for the flow, woken about once per
/// timeout under load, where a timer per wait (inserted and cancelled with
/// every reply batch) cost about 460 instructions a wait under callgrind.
/// A wait lasts at most the timeout plus the time its drain took to be
/// sent (the shard's other work before the flow ships it).
async fn watch_acks(core: Rc<ShardCore>, machine: Machine, generation: u64) {
    let timeout_ns = core.node.config.replica_timeout_ms * 1_000_000;
    // While nothing is due: no drain sent later than this can be overdue
    // before the next look.
    let poll_ns = timeout_ns.min(HEARTBEAT_MS * 1_000_000);
    loop {
        let now_ns = core.clock.now_ns();
        let overdue = {
            let flow = core.flow.borrow();
            if flow.generation != generation {
                return;
            }
            let replies_wait = flow.acked.has_waiters();
            machine
                .borrow()
                .overdue(now_ns, timeout_ns, poll_ns, replies_wait)
        };
        match overdue {
            Overdue::LookAt(at_ns) => {
                let wait = Duration::from_nanos(at_ns.saturating_sub(now_ns));
                tokio::time::sleep(wait).await;
            }
            Overdue::GiveUp => {
                tracing::warn!(
                    shard = core.id,
                    timeout_ms = core.node.config.replica_timeout_ms,
                    "follower did not acknowledge in time; serving alone"
                );
                detach(&core);
                return;
            }
        }
    }
}

/// The follower's side of the link is gone: end the flow (the sender sees
/// the generation change at its next step; replies stop waiting now).
fn end(core: &ShardCore, generation: u64) {
    if core.flow.borrow().generation == generation {
        detach(core);
    }
}

/// This shard's part of a planned failover: `true` once the follower has
/// acknowledged everything this shard has changed (nothing changes any
/// more: the node admits nothing while it hands over).
pub async fn handed_over(core: Rc<ShardCore>) -> bool {
    let wait = {
        let flow = core.flow.borrow();
        if !flow.is_streaming() {
            return false;
        }
        let need = if core.table.borrow().has_changes() {
            flow.wake.notify_one();
            flow.drain_next
        } else {
            flow.drain_next - 1
        };
        flow.acked.wait(need)
    };
    wait.await
}

/// A planned failover, run by the connection that received FAILOVER: stop
/// admitting, wait until the follower has everything on every shard, hand
/// over at a new epoch, wait until the follower says it is primary, then
/// follow it. Nothing admitted is lost; the window in which the group
/// admits nothing is measured and returned.
pub async fn failover(core: Rc<ShardCore>) -> Result<FailoverOk, String> {
    let repl = &core.node.repl;
    if repl.coordinated {
        return Err(super::COORDINATED.to_owned());
    }
    if !repl.is_primary() {
        return Err(repl.not_primary_text());
    }
    if repl.state() != ReplState::Streaming {
        return Err(format!(
            "no follower in sync to hand over to (replication is {})",
            repl.state().name()
        ));
    }
    let target = repl.follower();
    if repl.handing_over.swap(1, Ordering::AcqRel) == 1 {
        return Err("a failover is already in progress".into());
    }
    let started = Instant::now();
    tracing::warn!(follower = %target, "planned failover: handing over");
    let mut waits = Vec::new();
    for tx in &core.node.shards {
        let (done, rx) = crate::inbox::oneshot();
        if tx.send(crate::mailbox::ShardMsg::Handover(done)).is_ok() {
            waits.push(rx);
        }
    }
    let mut all = waits.len() == core.node.shards.len();
    for rx in waits {
        all &= rx.recv().await.unwrap_or(false);
    }
    if !all {
        repl.handing_over.store(0, Ordering::Release);
        return Err("the follower did not acknowledge everything in time; still primary".into());
    }
    let Some(epoch) = repl.epoch().checked_add(1) else {
        repl.handing_over.store(0, Ordering::Release);
        return Err("the epoch is at its maximum: no handover can raise it".into());
    };
    let _ = core.node.shards[0].send(crate::mailbox::ShardMsg::Takeover(epoch));
    // The follower promotes itself as it applies the handover; wait until
    // it says so.
    let deadline = Instant::now() + Duration::from_millis(2_000);
    loop {
        match super::follower::query_role(&core, &target).await {
            Ok(r) if r.role == Role::Primary && r.epoch >= epoch => break,
            _ if Instant::now() > deadline => {
                // Still not admitting: a stale second primary is worse than
                // an unavailable group (the peer check sorts it out).
                return Err(format!("{target} did not take over within 2 s; this node admits nothing until it does (or `sluice promote` here)"));
            }
            _ => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    let unavailable_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    repl.step_down(&target, epoch);
    tokio::task::spawn_local(super::follower::follow(core.clone(), target));
    Ok(FailoverOk {
        epoch,
        unavailable_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::replication::SyncHeader;

    /// Heads and records reach the follower whole and in order when the
    /// socket takes them a piece at a time (a reader slower than the
    /// writer: partial writes, cut anywhere, also inside a head).
    #[test]
    fn write_syncs_sends_every_byte_in_order_through_partial_writes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let reader = tokio::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut got = Vec::new();
                let mut chunk = [0u8; 997];
                loop {
                    let n = s.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return got;
                    }
                    got.extend_from_slice(&chunk[..n]);
                    tokio::task::yield_now().await;
                }
            });
            let (_, mut wr) = tokio::net::TcpStream::connect(addr)
                .await
                .unwrap()
                .into_split();
            let mut heads = Vec::new();
            let mut parts = Vec::new();
            let mut want = Vec::new();
            // More slices than one call passes (WRITE_SLICES_MAX).
            for i in 0..800u32 {
                let h = SyncHeader {
                    seq: u64::from(i) + 1,
                    epoch: 1,
                    now_ns: 5,
                    flags: 0,
                    count: i,
                };
                // Every third SYNC carries no records (a heartbeat).
                let body: Vec<u8> = (0..if i % 3 == 0 { 0 } else { 10_000 + i as usize })
                    .map(|b| (b as u32 ^ i) as u8)
                    .collect();
                let head = sync_frame_head(9, &h, body.len());
                want.extend_from_slice(&head);
                want.extend_from_slice(&body);
                heads.push(head);
                parts.push((i, BytesMut::from(&body[..])));
            }
            write_syncs(&mut wr, &heads, &parts).await.unwrap();
            drop(wr);
            let got = reader.await.unwrap();
            assert_eq!(got.len(), want.len());
            assert!(got == want, "the bytes arrived out of order");
        });
    }
}
