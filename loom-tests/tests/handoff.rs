//! Loom models of the cross-thread handoff through `server/src/inbox.rs`.
//!
//! Each model is one small scenario the server depends on; loom runs it under
//! every interleaving (up to `LOOM_MAX_PREEMPTIONS`). A lost wake-up shows up
//! as a loom deadlock: the consumer parks in `block_on` and nothing unparks
//! it. Loom also fails a model that leaks an `Arc` (say, a cycle through a
//! queued `Sender`).
#![cfg(sluice_loom)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use loom::future::block_on;
use loom::thread;
use sluice_loom_tests::inbox::{inbox, oneshot, Receiver, Sender};
use sluice_loom_tests::signal::Signal;

/// A request as a connection forwards it to a shard: the reply inbox's
/// sender travels with it, as in `ShardMsg::Batch`.
#[derive(Debug)]
struct Request {
    /// What the shard answers with `value + 1`.
    value: u32,
    /// Where the shard sends the reply.
    reply: Sender<u32>,
}

/// Which outcomes a model's interleavings reached, kept outside loom (std
/// types on purpose) and checked after `loom::model` returns, so that a
/// model which stops exercising its race fails instead of passing vacuously.
#[derive(Clone, Debug, Default)]
struct Reached<T>(Arc<Mutex<BTreeSet<T>>>);

impl<T: Ord + Clone> Reached<T> {
    fn insert(&self, outcome: T) {
        self.0.lock().unwrap().insert(outcome);
    }

    fn get(&self) -> BTreeSet<T> {
        self.0.lock().unwrap().clone()
    }
}

/// Receives everything until the end of the stream.
fn drain<T>(rx: &mut Receiver<T>) -> Vec<T> {
    let mut got = Vec::new();
    block_on(async { while rx.recv_many(&mut got).await {} });
    got
}

/// A connection sends a request to a shard thread, the shard replies through
/// the sender inside the request, and the connection receives exactly that
/// reply. Both consumers may park before the message arrives, so the send
/// must wake them; the connection keeps a sender of its own reply inbox (as
/// `connection.rs` does), so only the reply can end its wait.
#[test]
fn request_in_reply_out() {
    loom::model(|| {
        let (shard_tx, mut shard_rx) = inbox::<Request>();
        // The shard's loop (`shard::run`): reply to each batch as it comes.
        let shard = thread::spawn(move || {
            let mut served = 0;
            let mut msgs = Vec::new();
            block_on(async {
                while shard_rx.recv_many(&mut msgs).await {
                    for req in msgs.drain(..) {
                        let sent = req.reply.send(req.value + 1);
                        assert!(sent.is_ok(), "the connection waits");
                        served += 1;
                    }
                }
            });
            served
        });

        let (reply_tx, mut reply_rx) = inbox::<u32>();
        let req = Request {
            value: 7,
            reply: reply_tx.clone(),
        };
        assert!(shard_tx.send(req).is_ok(), "the shard is running");
        let mut replies = Vec::new();
        assert!(block_on(reply_rx.recv_many(&mut replies)));
        assert_eq!(replies, [8]);

        // The connection goes away; the shard sees the end of its stream.
        drop(shard_tx);
        assert_eq!(shard.join().unwrap(), 1);
        drop(reply_tx);
    });
}

/// Two producers, one consumer: every message arrives exactly once and each
/// producer's messages arrive in the order it sent them. The consumer ends
/// when both senders are gone.
#[test]
fn two_producers_one_consumer() {
    const SENT_PER_PRODUCER: u8 = 2;
    loom::model(|| {
        let (tx_a, mut rx) = inbox::<(u8, u8)>();
        let tx_b = tx_a.clone();
        let producers: Vec<_> = [(0, tx_a), (1, tx_b)]
            .into_iter()
            .map(|(producer, tx)| {
                thread::spawn(move || {
                    for seq in 0..SENT_PER_PRODUCER {
                        assert!(tx.send((producer, seq)).is_ok(), "never closed here");
                    }
                })
            })
            .collect();

        let got = drain(&mut rx);
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(got.len(), 2 * usize::from(SENT_PER_PRODUCER), "{got:?}");
        for producer in 0..2 {
            let seqs: Vec<u8> = got
                .iter()
                .filter(|(p, _)| *p == producer)
                .map(|&(_, seq)| seq)
                .collect();
            assert_eq!(seqs, [0, 1], "producer {producer}: {got:?}");
        }
    });
}

/// Shutdown: a producer sends while the consumer closes the inbox and then
/// drains it (a shard's `Stop`). Every send that returned `Ok` is received
/// exactly once and in order; every send that returned `Err` got its own
/// message back; once refused, always refused; after the drain the stream
/// has ended and stays ended.
#[test]
fn close_races_with_send() {
    const SENT: u32 = 2;
    let reached = Reached::default();
    let accepted_counts = reached.clone();
    loom::model(move || {
        let (tx, mut rx) = inbox::<u32>();
        let producer = thread::spawn(move || {
            let mut accepted = Vec::new();
            let mut refused = Vec::new();
            for msg in 0..SENT {
                match tx.send(msg) {
                    Ok(()) => accepted.push(msg),
                    Err(back) => refused.push(back),
                }
            }
            (accepted, refused)
        });

        rx.close();
        // The producer still holds a sender: only `close` can end this drain.
        let received = drain(&mut rx);
        let (accepted, refused) = producer.join().unwrap();

        assert_eq!(received, accepted);
        let accepted_count = u32::try_from(accepted.len()).unwrap();
        let expected_refused: Vec<u32> = (accepted_count..SENT).collect();
        assert_eq!(refused, expected_refused, "accepted {accepted:?}");
        let mut after = Vec::new();
        assert!(!block_on(rx.recv_many(&mut after)));
        assert!(after.is_empty());
        accepted_counts.insert(accepted_count);
    });
    // Close landed before, between and after the sends: the race was run.
    assert_eq!(reached.get(), (0..=SENT).collect(), "outcomes reached");
}

/// The last sender to go wakes a consumer parked on an empty inbox, which
/// then sees the end of the stream. Two clones drop on two threads, so the
/// count itself races too.
#[test]
fn last_sender_drop_wakes_consumer() {
    loom::model(|| {
        let (tx_a, mut rx) = inbox::<u32>();
        let tx_b = tx_a.clone();
        let a = thread::spawn(move || drop(tx_a));
        let b = thread::spawn(move || drop(tx_b));

        let mut got = Vec::new();
        assert!(!block_on(rx.recv_many(&mut got)));
        assert!(got.is_empty());
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// A message that owns a sender of its own inbox (a forwarded batch to a
/// shard's own inbox, say) is still queued when the receiver is dropped.
/// Dropping the receiver must not deadlock (the message's `Sender::drop`
/// takes the same lock) nor leak the inbox through that cycle, and a send
/// after the receiver is gone returns the message.
#[test]
fn receiver_drop_releases_queued_senders() {
    /// Carries a sender of the inbox it is queued in.
    #[derive(Debug)]
    struct Owning(Option<Sender<Owning>>);

    let reached = Reached::default();
    let outcomes = reached.clone();
    loom::model(move || {
        let (tx, rx) = inbox::<Owning>();
        let tx_thread = tx.clone();
        let producer = thread::spawn(move || {
            let own = tx_thread.clone();
            match tx_thread.send(Owning(Some(own))) {
                Ok(()) => true,
                Err(back) => {
                    assert!(back.0.is_some(), "the refused message comes back whole");
                    false
                }
            }
        });

        drop(rx);
        // `producer` may have been accepted or refused; either way nothing
        // is left holding the inbox once the model ends (loom checks).
        let accepted = producer.join().unwrap();
        assert!(tx.send(Owning(None)).is_err(), "the receiver is gone");
        outcomes.insert(accepted);
    });
    // Both cases ran: queued at the drop (the cycle), and refused after it.
    assert_eq!(reached.get(), [false, true].into(), "outcomes reached");
}

/// A shard's one answer (a reset, a handover, a snapshot part, an apply)
/// through `inbox::oneshot`, which replaced tokio's oneshot so that loom
/// sees it: the waiter on the main thread gets the answer, or `None` when
/// the shard's side is dropped without answering (a stopping shard), and
/// never hangs (a lost wake-up is a loom deadlock), whichever comes first.
#[test]
fn a_oneshot_answer_or_its_absence_always_reaches_the_waiter() {
    let reached = Reached::default();
    let outcomes = reached.clone();
    loom::model(move || {
        for answers in [true, false] {
            let (tx, rx) = oneshot::<u32>();
            let shard = thread::spawn(move || {
                if answers {
                    tx.send(7).expect("the waiter is there");
                } else {
                    drop(tx);
                }
            });
            let got = block_on(rx.recv());
            assert_eq!(got, answers.then_some(7));
            outcomes.insert(got);
            shard.join().unwrap();
        }
    });
    assert_eq!(reached.get(), [None, Some(7)].into(), "outcomes reached");
}

/// Shards reporting that they drained (each sends its id once, then drops
/// its sender) to the main thread, which counts them: it sees every id,
/// and its wait ends when the last sender is gone, in every interleaving.
#[test]
fn every_drained_report_is_counted() {
    loom::model(|| {
        let (tx, mut rx) = inbox::<u16>();
        let shards: Vec<_> = (0..2u16)
            .map(|id| {
                let tx = tx.clone();
                thread::spawn(move || {
                    tx.send(id).expect("the counter is there");
                })
            })
            .collect();
        drop(tx);
        let mut ids = drain(&mut rx);
        ids.sort_unstable();
        assert_eq!(ids, [0, 1]);
        for s in shards {
            s.join().unwrap();
        }
    });
}

/// The acceptor evicts an unauthenticated connection on a shard thread
/// (`Unauthed::evict_oldest`, through `signal::Signal`): the permit is
/// seen whether it comes before the connection waits, while it registers,
/// or after it parks; and it is taken once.
#[test]
fn an_eviction_is_never_lost() {
    loom::model(|| {
        let signal = std::sync::Arc::new(Signal::new());
        let acceptor = {
            let signal = signal.clone();
            thread::spawn(move || signal.notify())
        };
        block_on(signal.wait());
        acceptor.join().unwrap();
        // Taken: a second wait would park (checked without waiting).
        let waker = futures_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(
            signal.poll_wait(&mut cx).is_pending(),
            "the permit was taken once"
        );
    });
}

/// A waker that does nothing, for one poll outside `block_on`.
fn futures_waker() -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable};
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: every function of the vtable ignores the data pointer.
    #[allow(unsafe_code)]
    unsafe {
        std::task::Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE))
    }
}
