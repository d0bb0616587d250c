//! A permit that one thread gives and one task awaits: how the acceptor
//! tells an unauthenticated connection, on whichever shard it runs, that a
//! newer connection takes its place. Built on `crate::sync` (not tokio's
//! `Notify`, which loom cannot see into), so `loom-tests/` checks it: a
//! permit given before the wait begins, while it registers, or after it
//! parks is never lost.

use std::future::poll_fn;
use std::task::{Context, Poll, Waker};

use crate::sync::Mutex;

#[derive(Debug, Default)]
struct State {
    /// Given and not yet taken.
    permit: bool,
    /// The waiting task, while it waits.
    waker: Option<Waker>,
}

/// One permit, one waiter.
#[derive(Debug, Default)]
pub struct Signal {
    state: Mutex<State>,
}

impl Signal {
    /// No permit yet.
    pub fn new() -> Signal {
        Signal::default()
    }

    /// Gives the permit and wakes the waiter, if one waits (outside the
    /// lock).
    pub fn notify(&self) {
        let waker = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.permit = true;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// `Ready` once the permit is given (taking it); otherwise registers
    /// the waker under the lock `notify` takes.
    pub fn poll_wait(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.permit {
            s.permit = false;
            return Poll::Ready(());
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Waits for the permit.
    pub async fn wait(&self) {
        poll_fn(|cx| self.poll_wait(cx)).await
    }
}
