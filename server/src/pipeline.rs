//! The ordering and forwarding machinery every connection coordinator
//! shares, whatever protocol it speaks (protocol v1 in
//! `connection.rs`, RESP in `resp/connection.rs`).
//!
//! Each request gets a sequence number. A reply decided on this thread
//! while nothing is outstanding is handed straight back to the caller to
//! encode ([`Pipeline::ready`] returns it): the common, shard-aware case
//! costs no queueing. Otherwise replies wait in `pending`, one slot per
//! request, oldest first. A request for a key another shard owns takes a
//! `Waiting` slot and joins that shard's batch ([`Pipeline::forward`]);
//! after a whole read has been handled, [`Pipeline::send_forwards`] sends
//! one [`Batch`] per shard. The owners' [`BatchReply`]s come back through
//! this pipeline's own reply inbox and fill their slots
//! ([`Pipeline::fill`]); every time, the ready prefix is drained to the
//! caller's encoder, in order.
//!
//! The protocol decides only what a slot remembers of a forwarded request
//! ([`Protocol::Tag`]), what a ready reply is ([`Protocol::Reply`]), and how
//! to turn an owner's [`Outcome`] (or its refusal) into a reply.

use std::collections::VecDeque;
use std::fmt::Debug;

use crate::forward::{Forwarder, IntoRemote, OpenRead, RemoteItems, View};
use crate::inbox::{self, Receiver, Sender};
use crate::mailbox::ShardMsg;
use crate::node::Node;
use crate::shard::{Batch, BatchReply, FwdItem, Op, Outcome};

/// What a connection's protocol tells the pipeline.
pub trait Protocol {
    /// What a `Waiting` slot keeps of its request (a request id, say).
    type Tag: Copy + Debug;
    /// A reply ready to be encoded.
    type Reply: Debug;
    /// The reply to a forwarded request, from its owner's outcome.
    fn answered(tag: Self::Tag, outcome: Outcome) -> Self::Reply;
    /// The reply to a forwarded request its owner no longer accepts
    /// (the node is shutting down).
    fn refused(tag: Self::Tag) -> Self::Reply;
    /// About how many bytes `reply` takes, held and encoded: what a reply
    /// waiting in order counts against the connection's reply bound.
    fn weight(reply: &Self::Reply) -> usize;
    /// Disposes of `reply` once it is encoded (a protocol whose verdict
    /// owns nothing forgets it, with no call to its drop).
    #[inline]
    fn encoded(reply: Self::Reply) {
        drop(reply);
    }
}

/// One request's place in the reply order.
#[derive(Debug)]
enum Slot<P: Protocol> {
    /// Forwarded; its owner has not answered.
    Waiting(P::Tag),
    /// Ready, behind an earlier reply that is not.
    Ready(P::Reply),
}

/// A connection's replies in request order, and its requests in flight to
/// other shards.
#[derive(Debug)]
pub struct Pipeline<P: Protocol> {
    /// Replies held for order; `pending[0]` has sequence `head_seq`.
    pending: VecDeque<Slot<P>>,
    /// Sequence number of `pending[0]` (or of the next request when empty).
    head_seq: u64,
    /// Requests forwarded per shard, gathered while handling one read.
    fwd: Vec<Vec<FwdItem>>,
    /// Where other shards send outcomes for this connection.
    replies_tx: Sender<BatchReply>,
    /// ... and where the connection reads them.
    replies_rx: Receiver<BatchReply>,
    /// Batches sent and not yet answered.
    batches_out: usize,
    /// [`Protocol::weight`] of the `Ready` slots in `pending`.
    held_bytes: usize,
    /// Requests for other nodes (`--cluster`) while a read is handled:
    /// the items of the thread's turn they join ([`Forwarder::open`]).
    remote: RemoteItems,
    /// The read's place in them, while it forwards.
    remote_open: Option<OpenRead>,
}

impl<P: Protocol> Pipeline<P> {
    /// An empty pipeline for a node of `shard_count` shards.
    pub fn new(shard_count: u16) -> Pipeline<P> {
        let (replies_tx, replies_rx) = inbox::inbox();
        Pipeline {
            pending: VecDeque::new(),
            head_seq: 0,
            fwd: (0..shard_count).map(|_| Vec::new()).collect(),
            replies_tx,
            replies_rx,
            batches_out: 0,
            held_bytes: 0,
            remote: RemoteItems::default(),
            remote_open: None,
        }
    }

    /// Requests read and not yet handed back for encoding.
    #[inline]
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether every request read so far has been handed back.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// About how many bytes of replies wait behind a forwarded request
    /// ([`Protocol::weight`]).
    #[inline]
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Whether requests gathered for other shards have not been sent yet.
    pub fn has_unsent(&self) -> bool {
        self.remote_open.is_some() || self.fwd.iter().any(|f| !f.is_empty())
    }

    /// Whether batches are out, so that [`Pipeline::recv`] will yield.
    #[inline]
    pub fn awaiting(&self) -> bool {
        self.batches_out > 0
    }

    /// Takes the next request's reply, decided here. `Some(reply)`: encode
    /// it now, nothing is ahead of it; `None`: it waits its turn.
    #[inline]
    pub fn ready(&mut self, reply: P::Reply) -> Option<P::Reply> {
        if self.take_turn() {
            Some(reply)
        } else {
            self.queue(reply);
            None
        }
    }

    /// The hot path of [`Pipeline::ready`], for a caller that encodes
    /// without building a `Reply` first: `true` when nothing is ahead of
    /// the next request's reply, which then counts as answered and must be
    /// encoded now; `false` when it must be [`Pipeline::queue`]d.
    #[inline]
    pub fn take_turn(&mut self) -> bool {
        if self.pending.is_empty() {
            self.head_seq += 1;
            true
        } else {
            false
        }
    }

    /// Queues the next request's reply behind earlier ones (after
    /// [`Pipeline::take_turn`] said `false`).
    #[inline]
    pub fn queue(&mut self, reply: P::Reply) {
        assert!(
            !self.pending.is_empty(),
            "a reply with its turn is encoded, not queued"
        );
        self.held_bytes += P::weight(&reply);
        self.pending.push_back(Slot::Ready(reply));
    }

    /// Takes the next request, for `shard` to decide: its reply waits for
    /// the owner, and the request joins that shard's next batch.
    #[inline]
    pub fn forward(&mut self, shard: u16, tag: P::Tag, key: u128, op: Op) {
        let seq = self.head_seq + self.pending.len() as u64;
        self.pending.push_back(Slot::Waiting(tag));
        self.fwd[usize::from(shard)].push(FwdItem { seq, key, op });
    }

    /// Takes the next request, for another node to decide (its key's
    /// group, through the node's forwarder): its reply waits in order, and
    /// the request joins its group's batch of this thread's turn (see
    /// [`Forwarder::open`]). `group`: the key's group, the ring index in
    /// the view the read routed by.
    #[inline]
    pub fn forward_remote(
        &mut self,
        tag: P::Tag,
        op: impl IntoRemote,
        route: (&std::sync::Arc<View>, usize),
        forwarder: &Forwarder,
    ) {
        let (view, group) = route;
        let seq = self.head_seq + self.pending.len() as u64;
        self.pending.push_back(Slot::Waiting(tag));
        match &mut self.remote_open {
            Some(open) => open.note(view, group),
            None => {
                let (items, open) = forwarder.open(view, group);
                self.remote = items;
                self.remote_open = Some(open);
            }
        }
        self.remote.push(seq, op, view, group);
    }

    /// Takes the next request, to be answered later by a task of this
    /// thread (a planned failover): its reply waits in order; the task
    /// sends `(seq, outcome)` as a [`BatchReply`] to the returned sender.
    pub fn defer(&mut self, tag: P::Tag) -> (u64, Sender<BatchReply>) {
        let seq = self.head_seq + self.pending.len() as u64;
        self.pending.push_back(Slot::Waiting(tag));
        self.batches_out += 1;
        (seq, self.replies_tx.clone())
    }

    /// Sends each shard its batch; requests a shard no longer accepts
    /// (shutting down) are answered [`Protocol::refused`]. Then hands the
    /// ready prefix to `emit`.
    pub fn send_forwards(&mut self, node: &Node, emit: impl FnMut(&P::Reply)) {
        if let Some(open) = self.remote_open.take() {
            let forwarder = node
                .forward
                .as_ref()
                .expect("remote requests need --cluster");
            let items = std::mem::take(&mut self.remote);
            forwarder.close(open, items, self.replies_tx.clone());
            self.batches_out += 1;
        }
        for shard in 0..self.fwd.len() {
            if self.fwd[shard].is_empty() {
                continue;
            }
            let items = std::mem::take(&mut self.fwd[shard]);
            let batch = Batch {
                reply_to: self.replies_tx.clone(),
                items,
            };
            match node.shards[shard].send(ShardMsg::Batch(batch)) {
                Ok(()) => self.batches_out += 1,
                Err(ShardMsg::Batch(b)) => {
                    for it in b.items {
                        self.set_slot(it.seq, |tag| P::refused(tag));
                    }
                }
                Err(_) => unreachable!("send returns the message it was given"),
            }
        }
        self.drain_ready(emit);
    }

    /// Waits for answered batches and moves them into `out`. Only call
    /// while [`Pipeline::awaiting`].
    pub async fn recv(&mut self, out: &mut Vec<BatchReply>) {
        let more = self.replies_rx.recv_many(out).await;
        assert!(more, "the pipeline holds a sender of its own reply inbox");
    }

    /// Files a batch's outcomes into their slots, then hands the ready
    /// prefix to `emit`.
    pub fn fill(&mut self, reply: BatchReply, mut emit: impl FnMut(&P::Reply)) {
        assert!(self.batches_out > 0, "a reply to a batch never sent");
        self.batches_out -= 1;
        reply.for_each(|seq, outcome| {
            if seq == self.head_seq {
                // Every earlier reply has gone (the common case: a read
                // forwarded whole): encoded at once, never held in its
                // slot; then the ready replies behind it.
                let Some(Slot::Waiting(tag)) = self.pending.pop_front() else {
                    panic!("reply for sequence {seq} arrived twice");
                };
                self.head_seq += 1;
                let reply = P::answered(tag, outcome);
                emit(&reply);
                P::encoded(reply);
                // The next slot is mostly this batch's next request, still
                // waiting: looked at here, with no call.
                if matches!(self.pending.front(), Some(Slot::Ready(_))) {
                    self.drain_ready(&mut emit);
                }
                return;
            }
            self.set_slot(seq, |tag| P::answered(tag, outcome));
        });
        self.drain_ready(emit);
    }

    fn set_slot(&mut self, seq: u64, make: impl FnOnce(P::Tag) -> P::Reply) {
        let index = usize::try_from(seq - self.head_seq).expect("pending index fits usize");
        let slot = &mut self.pending[index];
        let Slot::Waiting(tag) = *slot else {
            panic!("reply for sequence {seq} arrived twice");
        };
        let reply = make(tag);
        self.held_bytes += P::weight(&reply);
        *slot = Slot::Ready(reply);
    }

    /// Hands every ready reply at the head of `pending` to `emit`, in order.
    fn drain_ready(&mut self, mut emit: impl FnMut(&P::Reply)) {
        while let Some(Slot::Ready(reply)) = self.pending.front() {
            emit(reply);
            self.held_bytes -= P::weight(reply);
            self.pending.pop_front();
            self.head_seq += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::{Kept, SharedAnswers};

    /// Replies are strings; a tag is the request's number.
    #[derive(Debug)]
    struct Test;

    impl Protocol for Test {
        type Tag = u32;
        type Reply = String;
        fn answered(tag: u32, outcome: Outcome) -> String {
            match outcome {
                Outcome::Verdict(v) => format!("{tag}:{}", v.remaining),
                Outcome::Cell(v) => format!("{tag}:cell{}", v.remaining),
                other => format!("{tag}:{other:?}"),
            }
        }
        fn refused(tag: u32) -> String {
            format!("{tag}:refused")
        }
        fn weight(reply: &String) -> usize {
            reply.len()
        }
    }

    fn verdict(remaining: u64) -> Outcome {
        Outcome::Verdict(sluice_protocol::Verdict {
            remaining,
            ..Default::default()
        })
    }

    #[test]
    fn replies_leave_in_request_order() {
        let mut p = Pipeline::<Test>::new(2);
        let mut out = Vec::new();
        // Nothing outstanding: handed straight back.
        assert_eq!(p.ready("0:local".into()).as_deref(), Some("0:local"));
        // A forward, then a local reply that must wait behind it.
        let op = Op::Throttle {
            policy: sluice_protocol::Policy::new(1, 1_000_000_000, 1).unwrap(),
            cost: 1,
        };
        p.forward(1, 1, 42, op.clone());
        assert!(p.ready("2:local".into()).is_none());
        // Held behind the forward: it counts against the reply bound.
        assert_eq!(p.held_bytes(), "2:local".len());
        p.forward(1, 3, 43, op);
        assert_eq!(p.len(), 3);
        assert!(p.has_unsent());
        // Pretend the batch went out and came back in one reply.
        let items = std::mem::take(&mut p.fwd[1]);
        assert_eq!(items.iter().map(|it| it.seq).collect::<Vec<_>>(), [1, 3]);
        p.batches_out += 1;
        let reply = BatchReply::new(vec![(1, verdict(7)), (3, verdict(8))]);
        p.fill(reply, |r| out.push(r.clone()));
        assert_eq!(out, ["1:7", "2:local", "3:8"]);
        assert!(p.is_empty());
        assert_eq!(p.held_bytes(), 0, "every held reply went out");
        assert!(!p.awaiting());
        assert_eq!(p.ready("4:local".into()).as_deref(), Some("4:local"));
    }

    /// Answers that come out of order, or with a ready reply between two
    /// of them, still leave in request order; an answer at the head is
    /// encoded at once and never held.
    #[test]
    fn answers_out_of_order_leave_in_order() {
        let mut p = Pipeline::<Test>::new(2);
        let mut out = Vec::new();
        let op = Op::Throttle {
            policy: sluice_protocol::Policy::new(1, 1_000_000_000, 1).unwrap(),
            cost: 1,
        };
        for seq in 0..5u32 {
            if seq == 2 {
                assert!(p.ready("2:local".into()).is_none());
            } else {
                p.forward(1, seq, u128::from(seq), op.clone());
            }
        }
        p.batches_out += 3;
        // 3 before the head: held.
        p.fill(BatchReply::new(vec![(3, verdict(3))]), |r| {
            out.push(r.clone())
        });
        assert!(out.is_empty());
        assert_eq!(p.held_bytes(), "3:3".len() + "2:local".len());
        // The head, then 4 behind the ready 2 and 3, as a share of
        // answers made for two connections (another's sequence numbers
        // around this one's).
        let shared = SharedAnswers::new(
            vec![9, 0, 1, 9],
            [verdict(90), verdict(0), verdict(1), verdict(91)]
                .into_iter()
                .map(Kept::new)
                .collect(),
        );
        p.fill(BatchReply::shared(shared, 1..3), |r| out.push(r.clone()));
        assert_eq!(out, ["0:0", "1:1", "2:local", "3:3"]);
        p.fill(BatchReply::new(vec![(4, verdict(4))]), |r| {
            out.push(r.clone())
        });
        assert_eq!(out, ["0:0", "1:1", "2:local", "3:3", "4:4"]);
        assert!(p.is_empty());
        assert_eq!(p.held_bytes(), 0);
    }

    #[test]
    #[should_panic(expected = "arrived twice")]
    fn a_slot_is_filled_once() {
        let mut p = Pipeline::<Test>::new(1);
        let op = Op::Throttle {
            policy: sluice_protocol::Policy::new(1, 1_000_000_000, 1).unwrap(),
            cost: 1,
        };
        p.forward(0, 0, 1, op);
        p.set_slot(0, |t| t.to_string());
        p.set_slot(0, |t| t.to_string());
    }
}
