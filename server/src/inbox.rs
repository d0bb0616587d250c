//! A multi-producer, single-consumer queue whose consumer is an async task:
//! how threads hand work to a shard (connections, forwarded batches,
//! shutdown) and how a shard hands replies back to a connection.
//!
//! It is deliberately simple: one mutex around a `VecDeque`, the consumer's
//! waker and two flags. Producers lock once per message (a forwarded
//! *batch*, not a request); the consumer takes everything queued in one
//! lock. The properties that matter are checked by loom (`loom-tests/`):
//!
//! - no lost wake-up: a message sent while the consumer parks wakes it;
//! - nothing accepted is lost: every `send` that returned `Ok` is received,
//!   even when it races with `close`; a `send` after `close` returns the
//!   message to the sender, who answers its requester with an error;
//! - the consumer learns when every sender is gone.
//!
//! The decision path never touches this: a shard's table is reached only
//! from its own thread.
//!
//! Every channel between threads is one of these, so loom sees them all:
//! [`oneshot`] (one answer: a shard's reply to a reset, a handover, a
//! snapshot, an apply) is an inbox whose one sender is consumed by its one
//! send, and the many-to-one channels (shards reporting they drained,
//! flows reporting they ended) are inboxes as they are.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::{Context, Poll, Waker};

use crate::sync::{Arc, Mutex};

/// What the mutex guards.
#[derive(Debug)]
struct State<T> {
    /// Messages sent and not yet taken.
    queue: VecDeque<T>,
    /// The consumer's waker while it waits on an empty queue.
    waker: Option<Waker>,
    /// Set by the consumer: no further message will be accepted.
    closed: bool,
    /// Live `Sender`s; at 0 the consumer sees the end of the stream.
    senders: usize,
}

#[derive(Debug)]
struct Shared<T> {
    state: Mutex<State<T>>,
}

/// The sending side; clone it freely.
#[derive(Debug)]
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving side; one per inbox.
#[derive(Debug)]
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A new, open inbox.
pub fn inbox<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            waker: None,
            closed: false,
            senders: 1,
        }),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

impl<T> Sender<T> {
    /// Queues `msg`. `Err(msg)` if the receiver closed the inbox or is gone:
    /// the message was not accepted and will never be seen.
    pub fn send(&self, msg: T) -> Result<(), T> {
        let waker = {
            let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            if s.closed {
                return Err(msg);
            }
            s.queue.push_back(msg);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        s.senders += 1;
        drop(s);
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            s.senders -= 1;
            if s.senders == 0 {
                s.waker.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Moves every queued message into `out`. `Ready(true)` when it moved
    /// at least one; `Ready(false)` when the inbox is empty and will stay
    /// so (closed, or every sender gone); `Pending` otherwise, with the
    /// waker registered under the same lock that a sender takes, so a
    /// message cannot slip in unnoticed.
    pub fn poll_recv_many(&mut self, cx: &mut Context<'_>, out: &mut Vec<T>) -> Poll<bool> {
        let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if !s.queue.is_empty() {
            out.extend(s.queue.drain(..));
            return Poll::Ready(true);
        }
        if s.closed || s.senders == 0 {
            return Poll::Ready(false);
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Waits for messages and moves them all into `out`; `false` at the end
    /// of the stream.
    pub async fn recv_many(&mut self, out: &mut Vec<T>) -> bool {
        poll_fn(|cx| self.poll_recv_many(cx, out)).await
    }

    /// Refuses every later `send`. Messages already accepted are still
    /// delivered by `recv_many`.
    pub fn close(&self) {
        let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        s.closed = true;
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let dropped = {
            let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            s.closed = true;
            std::mem::take(&mut s.queue)
        };
        // Dropped outside the lock: a message may own a sender of this inbox.
        drop(dropped);
    }
}

/// The sending side of a [`oneshot`]: one message, then it is gone.
#[derive(Debug)]
pub struct OnceSender<T>(Sender<T>);

/// The receiving side of a [`oneshot`].
#[derive(Debug)]
pub struct OnceReceiver<T>(Receiver<T>);

/// A channel for one answer across threads, on an inbox (so that loom can
/// check it): the receiver gets the message, or `None` once the sender is
/// gone without sending (the other thread stopped).
pub fn oneshot<T>() -> (OnceSender<T>, OnceReceiver<T>) {
    let (tx, rx) = inbox();
    (OnceSender(tx), OnceReceiver(rx))
}

impl<T> OnceSender<T> {
    /// Sends the answer; `Err(msg)` if the receiver is gone.
    pub fn send(self, msg: T) -> Result<(), T> {
        self.0.send(msg)
    }
}

impl<T> OnceReceiver<T> {
    /// The answer, or `None` if the sender went away without one.
    pub async fn recv(mut self) -> Option<T> {
        let mut out = Vec::with_capacity(1);
        if self.0.recv_many(&mut out).await {
            out.into_iter().next()
        } else {
            None
        }
    }
}
