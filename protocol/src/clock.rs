//! Where `now` comes from. Decisions take `now` as an argument; the server
//! reads a [`MonotonicClock`], tests move a [`ManualClock`] by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of nanosecond timestamps.
pub trait Clock {
    /// Nanoseconds since the Unix epoch, as this clock sees them.
    fn now_ns(&self) -> u64;
}

/// Wall-clock time read once at start, advanced by the monotonic clock, so
/// that it never steps backward within a process while staying comparable
/// across processes (snapshots, replication).
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    /// The monotonic instant that `anchor_ns` corresponds to.
    start: Instant,
    /// Nanoseconds since the Unix epoch at `start`.
    anchor_ns: u64,
}

impl MonotonicClock {
    /// Anchors a new clock at the current wall-clock time.
    pub fn new() -> MonotonicClock {
        let anchor_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        MonotonicClock {
            start: Instant::now(),
            anchor_ns,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        let elapsed_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.anchor_ns.saturating_add(elapsed_ns)
    }
}

/// A clock that only moves when told to: for tests, never sleeps.
#[derive(Debug, Default)]
pub struct ManualClock {
    /// The current time; any value, and it may be set backward on purpose.
    now_ns: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `now_ns`.
    pub fn new(now_ns: u64) -> ManualClock {
        ManualClock {
            now_ns: AtomicU64::new(now_ns),
        }
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.now_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Sets the clock to `now_ns`, forward or backward.
    pub fn set(&self, now_ns: u64) {
        self.now_ns.store(now_ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }
}
