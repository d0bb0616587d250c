//! The follower's half of fencing, in one small structure that loom can
//! check (`loom-tests/tests/promotion.rs`): a flow records each receipt of
//! a SYNC and decides whether to ack it; the watchdog decides whether the
//! primary has been silent long enough to promote. Both decisions are made
//! under one lock, so either the watchdog sees the receipt (and the silence
//! it measures includes it: no promotion now) or it has promoted and the
//! flow does not ack (an ack would renew the old primary's lease after the
//! promotion was decided, and two primaries could admit at once).

use crate::sync::{AtomicU64, Mutex, Ordering};

/// Receipts and the promotion decision of a follower.
#[derive(Debug, Default)]
pub struct Watch {
    /// Held while a receipt is recorded and the ack decided, and while the
    /// watchdog decides.
    lock: Mutex<()>,
    /// Clock time of the last SYNC received.
    last_sync_ns: AtomicU64,
    /// 1 once the current attempt's full sync is complete: promoting
    /// earlier would serve a partial copy.
    in_sync: AtomicU64,
}

impl Watch {
    /// Records a SYNC received at `now_ns`; `true` when it may be acked,
    /// which is when `following()` still holds (no promotion decided).
    pub fn receipt(&self, now_ns: u64, following: impl FnOnce() -> bool) -> bool {
        let _one_at_a_time = self.lock.lock().expect("not poisoned");
        self.last_sync_ns.fetch_max(now_ns, Ordering::AcqRel);
        following()
    }

    /// At `now_ns`: when in sync and silent for more than `silence_max_ns`,
    /// calls `promote` (which changes the role, so that `following` in
    /// [`Watch::receipt`] turns false) and returns what it returned.
    pub fn promote_if_silent(
        &self,
        now_ns: u64,
        silence_max_ns: u64,
        promote: impl FnOnce() -> bool,
    ) -> bool {
        let _one_at_a_time = self.lock.lock().expect("not poisoned");
        let silent_ns = now_ns.saturating_sub(self.last_sync_ns.load(Ordering::Acquire));
        self.in_sync.load(Ordering::Acquire) == 1 && silent_ns > silence_max_ns && promote()
    }

    /// Whether the current attempt's full sync is complete.
    pub fn in_sync(&self) -> bool {
        self.in_sync.load(Ordering::Acquire) == 1
    }

    /// The full sync is complete (`true`) or starts again (`false`).
    pub fn set_in_sync(&self, in_sync: bool) {
        self.in_sync.store(u64::from(in_sync), Ordering::Release);
    }
}
