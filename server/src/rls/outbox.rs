//! The rate limit service's DECIDEs for other shards, batched per
//! event-loop turn: every call a thread decodes in one turn queues its
//! DECIDEs here, and one task, which runs once the turn's calls have run,
//! sends each shard one message for all of them. The shard answers that
//! message with one reply, which a task of this thread splits back to
//! each call's inbox.
//!
//! Why: a call's hop to another shard was one message and one wake each
//! way (a write to the other thread's eventfd, and back), which cost more
//! than the decision; under load a turn holds several calls, and they now
//! share the message, the wakes and the reply.
//!
//! With `--cluster`, the descriptors for other nodes go the same way
//! (`queue_remote`): the turn's calls share one batch through the
//! forwarder ([`Forwarder::submit`](crate::forward::Forwarder::submit)),
//! so one frame and one deadline per owner, where each call's own batch
//! of one or two ops paid them alone.
//!
//! A call decided wholly on its own thread while that thread has shard
//! batches in flight is held until they are answered ([`hold`]), so its
//! answer goes out with theirs: h2 writes a connection's answers when its
//! task runs, and a turn whose calls were part local, part hopped wrote
//! twice (two `writev`s, two reads for the client). Held, the turn's
//! answers leave in one write: `writev`s a call 0.28 -> 0.12 with two
//! shards, and 11 % less CPU a call (benches/notes.md). Only shard
//! batches hold a call: they are answered within the process, in one turn
//! of the other shard's loop; a forward to another node (which may wait
//! out its deadline) never does. A call that has to wait anyway (one of
//! its DECIDEs hops) is not held.
//!
//! A call queues once per shard (`queue`) and waits for one
//! [`BatchReply`] per shard on its own inbox, as it did when it sent its
//! own batch: nothing else about a call changes. If the shard is gone
//! (shutting down), the call's sender is dropped unanswered and its inbox
//! reports the end.

use std::cell::RefCell;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Poll, Waker};

use crate::forward::{RemoteBatch, RemoteItems, RemoteOp, View};
use crate::inbox::{self, Receiver, Sender};
use crate::mailbox::ShardMsg;
use crate::node::Node;
use crate::shard::{Batch, BatchReply, FwdItem};

/// Bits of a queued item's sequence number that hold the item's index in
/// its call's list; the next 16 hold the shard, the top 32 the call.
const ITEM_BITS: u32 = 16;

/// Most items a call may queue for one shard (the service's descriptor
/// limit is far below).
const ITEMS_MAX: usize = 1 << ITEM_BITS;

/// One thread's queued DECIDEs and the calls waiting for their answers.
#[derive(Debug)]
struct Outbox {
    node: Arc<Node>,
    /// Per shard: the items queued this turn.
    queued: Vec<Vec<FwdItem>>,
    /// For other nodes (`--cluster`): the items queued this turn.
    remote: RemoteItems,
    /// Whether the task that sends them is spawned and has not run yet.
    flushing: bool,
    /// Waiting calls' inboxes, by call id (an index; `None`: free).
    calls: Vec<Option<Sender<BatchReply>>>,
    /// Free call ids.
    free: Vec<u32>,
    /// Every shard's reply comes here (this thread's splitting task
    /// reads it).
    replies: Sender<BatchReply>,
    /// The forwarder's replies come here (a splitting task of their own:
    /// they do not release held calls).
    remote_replies: Sender<BatchReply>,
    /// Shard batches sent, and answered (or refused by a shard that is
    /// shutting down): what a held call waits on.
    sent: u64,
    answered: u64,
    /// Held calls: the `answered` count each waits for, and its waker.
    held: Vec<(u64, Waker)>,
}

thread_local! {
    static OUTBOX: RefCell<Option<Outbox>> = const { RefCell::new(None) };
}

/// Queues `items` (each with its call's sequence number, `shard << 32 |
/// index`) for `shard`; the answer comes to `reply_to` as one
/// [`BatchReply`] once the turn's batch is decided. Must run inside a
/// tokio runtime (its tasks are spawned on it).
pub fn queue(
    node: &Arc<Node>,
    shard: usize,
    items: impl Iterator<Item = FwdItem>,
    reply_to: &Sender<BatchReply>,
) {
    OUTBOX.with(|cell| {
        let mut cell = cell.borrow_mut();
        let outbox = cell.get_or_insert_with(|| Outbox::start(node));
        let tag = outbox.enter(shard, reply_to);
        let list = &mut outbox.queued[shard];
        list.extend(items.map(|mut it| {
            debug_assert!((it.seq as u32 as usize) < ITEMS_MAX);
            it.seq = tag | (it.seq & ((1 << ITEM_BITS) - 1));
            it
        }));
    });
}

/// Queues `items` (each `(index, op, view, group)`: the op's index in its
/// call's remote list, and its key's group in `view`) for other nodes,
/// under list number `remote_at` (the shard count); the answer comes to
/// `reply_to` as one [`BatchReply`], as [`queue`]'s does.
pub fn queue_remote<'a>(
    node: &Arc<Node>,
    remote_at: usize,
    items: impl Iterator<Item = (u64, RemoteOp, &'a Arc<View>, usize)>,
    reply_to: &Sender<BatchReply>,
) {
    OUTBOX.with(|cell| {
        let mut cell = cell.borrow_mut();
        let outbox = cell.get_or_insert_with(|| Outbox::start(node));
        let tag = outbox.enter(remote_at, reply_to);
        for (index, op, view, group) in items {
            debug_assert!((index as usize) < ITEMS_MAX);
            outbox.remote.push(tag | index, op, view, group);
        }
    });
}

impl Outbox {
    /// This thread's outbox, and its task that splits the replies.
    fn start(node: &Arc<Node>) -> Outbox {
        let (replies, rx) = inbox::inbox();
        tokio::spawn(split(rx, true));
        let (remote_replies, rx) = inbox::inbox();
        tokio::spawn(split(rx, false));
        Outbox {
            node: node.clone(),
            queued: (0..node.shards.len()).map(|_| Vec::new()).collect(),
            remote: RemoteItems::default(),
            flushing: false,
            calls: Vec::new(),
            free: Vec::new(),
            replies,
            remote_replies,
            sent: 0,
            answered: 0,
            held: Vec::new(),
        }
    }

    /// Registers a call's queueing for list `list` (a shard, or the
    /// remote list): its items' sequence tag. The first of a turn spawns
    /// the task that sends the turn's batches.
    fn enter(&mut self, list: usize, reply_to: &Sender<BatchReply>) -> u64 {
        let call = match self.free.pop() {
            Some(id) => {
                self.calls[id as usize] = Some(reply_to.clone());
                id
            }
            None => {
                self.calls.push(Some(reply_to.clone()));
                (self.calls.len() - 1) as u32
            }
        };
        if !self.flushing {
            self.flushing = true;
            // Runs after the tasks already queued on this thread: the
            // turn's other calls queue first.
            tokio::spawn(async { OUTBOX.with(flush) });
        }
        u64::from(call) << 32 | (list as u64) << ITEM_BITS
    }

    /// Takes call `id`'s inbox, freeing the id.
    fn take(&mut self, id: u32) -> Option<Sender<BatchReply>> {
        let sender = self.calls.get_mut(id as usize)?.take()?;
        self.free.push(id);
        Some(sender)
    }

    /// Counts `n` shard batches answered, and wakes the held calls that
    /// waited for them.
    fn answered(&mut self, n: u64) {
        self.answered += n;
        let answered = self.answered;
        self.held.retain(|(upto, waker)| {
            let done = *upto <= answered;
            if done {
                waker.wake_by_ref();
            }
            !done
        });
    }
}

/// Holds a call decided on this thread until the shard batches this
/// thread has in flight, or queued in this turn, are answered, so that
/// its answer is written with theirs (the module's doc says why). Returns
/// at once when there are none: a thread whose calls are all its own
/// shard's never waits. Only shard batches count, and a shard answers
/// every batch it accepted within a turn of its loop, or drops it while
/// shutting down (and then the thread's runtime ends too).
pub async fn hold() {
    // The `answered` count to wait for, fixed at the first poll.
    let mut upto = None;
    poll_fn(|cx| {
        OUTBOX.with(|cell| {
            let mut cell = cell.borrow_mut();
            let Some(outbox) = cell.as_mut() else {
                return Poll::Ready(());
            };
            let first = upto.is_none();
            let wait_for = *upto.get_or_insert_with(|| {
                let queued = outbox.queued.iter().any(|q| !q.is_empty());
                outbox.sent + u64::from(queued)
            });
            if outbox.answered >= wait_for {
                return Poll::Ready(());
            }
            // Polled again only when woken, and the wake removed the
            // entry: registered once, at the first poll.
            if first {
                outbox.held.push((wait_for, cx.waker().clone()));
            }
            Poll::Pending
        })
    })
    .await
}

/// Sends each shard the turn's queued items as one batch.
fn flush(cell: &RefCell<Option<Outbox>>) {
    let mut cell = cell.borrow_mut();
    let Some(outbox) = cell.as_mut() else { return };
    outbox.flushing = false;
    for shard in 0..outbox.queued.len() {
        if outbox.queued[shard].is_empty() {
            continue;
        }
        let items = std::mem::take(&mut outbox.queued[shard]);
        let batch = Batch {
            reply_to: outbox.replies.clone(),
            items,
        };
        outbox.sent += 1;
        if let Err(ShardMsg::Batch(batch)) = outbox.node.shards[shard].send(ShardMsg::Batch(batch))
        {
            // Shutting down: the calls' inboxes end unanswered.
            let mut calls: Vec<u32> = batch.items.iter().map(|it| (it.seq >> 32) as u32).collect();
            calls.dedup();
            for call in calls {
                outbox.take(call);
            }
            outbox.answered(1);
        }
    }
    if !outbox.remote.ops.is_empty() {
        let forwarder = outbox
            .node
            .forward
            .clone()
            .expect("remote items need --cluster");
        // The next turn's room, sized as this one's.
        let room = RemoteItems::with_capacity(outbox.remote.ops.len());
        let items = std::mem::replace(&mut outbox.remote, room);
        forwarder.submit(RemoteBatch {
            reply_to: outbox.remote_replies.clone(),
            items,
        });
    }
}

/// Splits every shard's reply (or, `shards` false, the forwarder's) back
/// to the calls whose items it answers: each call's run of outcomes, with
/// its own sequence numbers, to its inbox. A shard's reply releases the
/// calls held for it. Ends with the thread's runtime.
async fn split(mut rx: Receiver<BatchReply>, shards: bool) {
    let mut got = Vec::new();
    while rx.recv_many(&mut got).await {
        OUTBOX.with(|cell| {
            let mut cell = cell.borrow_mut();
            let Some(outbox) = cell.as_mut() else { return };
            if shards {
                // Woken now, they run after the calls answered below, in
                // this turn: one write for all.
                outbox.answered(got.len() as u64);
            }
            for reply in got.drain(..) {
                let mut outcomes = reply.into_outcomes().into_iter().peekable();
                while let Some((seq, outcome)) = outcomes.next() {
                    let call = (seq >> 32) as u32;
                    let own = |seq: u64| {
                        let shard = (seq >> ITEM_BITS) & 0xFFFF;
                        shard << 32 | (seq & ((1 << ITEM_BITS) - 1))
                    };
                    let mut mine = vec![(own(seq), outcome)];
                    while let Some((s, _)) = outcomes.peek() {
                        if (s >> 32) as u32 != call {
                            break;
                        }
                        let (s, o) = outcomes.next().expect("peeked");
                        mine.push((own(s), o));
                    }
                    if let Some(to) = outbox.take(call) {
                        // A call that has gone away needs no answer.
                        let _ = to.send(BatchReply::new(mine));
                    }
                }
            }
        });
    }
}
