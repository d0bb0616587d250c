//! One shard's fixed windows that are over their limit, published so that
//! any thread can deny a spend on them without a hop to the shard
//! (`--rls-over-limit-slots`; the rate limit service reads it).
//!
//! Why: a hot key over its limit (a client hammering past its quota, the
//! commonest hot key a rate limiter sees) is denied thousands of times a
//! second, and every denial asked from another thread cost a message and a
//! wake each way, while the answer cannot change until the window ends.
//! envoyproxy/ratelimit keeps a local cache of over-limit keys for the
//! same reason (`LOCAL_CACHE_SIZE_IN_BYTES`); this one is exact.
//!
//! What an entry says: bucket `b`, under a limit of `limit` units per
//! window of `window_ns`, holds `count >= limit` units in the window that
//! starts at `window_start_ns`. While that stays true, every spend of one
//! unit or more on `b` under that limit is denied until the window ends,
//! and the denial's numbers (nothing left; the window's end) follow from
//! the entry alone. The owning shard keeps it true:
//! - it publishes an entry only when it has just denied a spend there with
//!   nothing left (`count >= limit`);
//! - a denial changes nothing, and an admitted spend only raises the count
//!   (the remaining stays 0); the window's end is in the entry, and a
//!   reader compares it with the node's clock, the one the shard decides by;
//! - every other write to the bucket (a refund, a reset, a spend under
//!   another limit, replication or a snapshot storing it) removes the entry
//!   first, and so does emptying the table (`clear`), before anything could
//!   make room on it. Sweeps and eviction drop only buckets that are full
//!   (their window over, or nothing spent), never one with an entry.
//!
//! A denial read here is therefore the denial the shard would give at that
//! instant. The table is direct-mapped by the bucket's low bits: a key that
//! lands on a taken slot replaces its entry, and the key that was there is
//! simply asked of its shard again.
//!
//! Concurrency: one writer (the owning shard's thread), any number of
//! readers. Each slot is a seqlock: the writer makes its sequence odd,
//! writes the fields, and makes it even again; a reader that sees an odd
//! sequence, or a different one after reading, treats the slot as empty
//! (a miss only costs the hop). `loom-tests/tests/over_limit.rs` checks
//! that a reader never takes one entry's fields for another's.

use crate::sync::{fence, AtomicU64, Ordering};

/// Most slots a shard's table may have (`--rls-over-limit-slots`).
pub const SLOTS_MAX: usize = 1 << 20;

/// One entry, as a reader sees it: the window and its count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Start of the window the count belongs to (ns since the epoch).
    pub window_start_ns: u64,
    /// Units spent in it (at least the limit).
    pub count: u64,
}

/// One slot; `window_ns` 0 is an empty one.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot {
    seq: AtomicU64,
    bucket_lo: AtomicU64,
    bucket_hi: AtomicU64,
    limit: AtomicU64,
    window_ns: AtomicU64,
    window_start_ns: AtomicU64,
    count: AtomicU64,
}

/// A shard's published over-limit fixed windows.
#[derive(Debug)]
pub struct OverLimit {
    slots: Box<[Slot]>,
    /// `slots.len() - 1` (a power of two); unused when there are none.
    mask: usize,
}

impl OverLimit {
    /// A table of `slots` entries, rounded up to a power of two (at most
    /// [`SLOTS_MAX`]); 0 makes one that holds nothing (every lookup
    /// misses, every publish is dropped).
    pub fn new(slots: usize) -> OverLimit {
        let n = match slots {
            0 => 0,
            n => n.min(SLOTS_MAX).next_power_of_two(),
        };
        OverLimit {
            slots: (0..n).map(|_| Slot::default()).collect(),
            mask: n.saturating_sub(1),
        }
    }

    /// Slots (0: off).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether it holds nothing, ever (0 slots).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn slot(&self, bucket: u128) -> Option<&Slot> {
        // The bucket key is a hash already: its low bits spread.
        self.slots.get(bucket as usize & self.mask)
    }

    /// The owner's (relaxed) view of whether `bucket` is published with
    /// these numbers: the owner is the only writer, so it sees its own
    /// writes.
    fn holds(slot: &Slot, bucket: u128) -> bool {
        slot.window_ns.load(Ordering::Relaxed) != 0
            && slot.bucket_lo.load(Ordering::Relaxed) == bucket as u64
            && slot.bucket_hi.load(Ordering::Relaxed) == (bucket >> 64) as u64
    }

    /// Writes `slot`'s fields as one step readers see whole or not at all.
    /// Owner only.
    fn write(slot: &Slot, fields: [u64; 6]) {
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let [lo, hi, limit, window_ns, start, count] = fields;
        slot.bucket_lo.store(lo, Ordering::Relaxed);
        slot.bucket_hi.store(hi, Ordering::Relaxed);
        slot.limit.store(limit, Ordering::Relaxed);
        slot.window_ns.store(window_ns, Ordering::Relaxed);
        slot.window_start_ns.store(start, Ordering::Relaxed);
        slot.count.store(count, Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Publishes that `bucket` holds `count >= limit` units in the window
    /// of `window_ns` starting at `window_start_ns`. Owner only; the
    /// caller has just denied a spend there with nothing left. Writes
    /// nothing if the slot says so already.
    pub fn publish(&self, bucket: u128, limit: u64, window_ns: u64, entry: Entry) {
        debug_assert!(entry.count >= limit && window_ns > 0);
        let Some(slot) = self.slot(bucket) else {
            return;
        };
        if Self::holds(slot, bucket)
            && slot.limit.load(Ordering::Relaxed) == limit
            && slot.window_ns.load(Ordering::Relaxed) == window_ns
            && slot.window_start_ns.load(Ordering::Relaxed) == entry.window_start_ns
            && slot.count.load(Ordering::Relaxed) <= entry.count
        {
            // Still true as it stands (a larger count changes no answer).
            return;
        }
        let fields = [
            bucket as u64,
            (bucket >> 64) as u64,
            limit,
            window_ns,
            entry.window_start_ns,
            entry.count,
        ];
        Self::write(slot, fields);
    }

    /// Removes `bucket`'s entry, if it has one: before any write that could
    /// make room on it. Owner only.
    #[inline]
    pub fn unpublish(&self, bucket: u128) {
        let Some(slot) = self.slot(bucket) else {
            return;
        };
        if Self::holds(slot, bucket) {
            Self::write(slot, [0; 6]);
        }
    }

    /// Removes every entry (the table was emptied). Owner only.
    pub fn clear(&self) {
        for slot in self.slots.iter() {
            if slot.window_ns.load(Ordering::Relaxed) != 0 {
                Self::write(slot, [0; 6]);
            }
        }
    }

    /// `bucket`'s entry under `limit` units per `window_ns`, if it is
    /// published and its window has not ended at `now_ns` (by the clock
    /// the shard decides by). Any thread.
    pub fn lookup(&self, bucket: u128, limit: u64, window_ns: u64, now_ns: u64) -> Option<Entry> {
        let slot = self.slot(bucket)?;
        let seq = slot.seq.load(Ordering::Acquire);
        if seq % 2 == 1 {
            return None;
        }
        let lo = slot.bucket_lo.load(Ordering::Relaxed);
        let hi = slot.bucket_hi.load(Ordering::Relaxed);
        let slot_limit = slot.limit.load(Ordering::Relaxed);
        let slot_window_ns = slot.window_ns.load(Ordering::Relaxed);
        let window_start_ns = slot.window_start_ns.load(Ordering::Relaxed);
        let count = slot.count.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        let hit = slot_window_ns == window_ns
            && window_ns != 0
            && lo == bucket as u64
            && hi == (bucket >> 64) as u64
            && slot_limit == limit
            && count >= limit
            && now_ns < window_start_ns.saturating_add(window_ns);
        hit.then_some(Entry {
            window_start_ns,
            count,
        })
    }
}

#[cfg(all(test, not(sluice_loom)))]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn entry(count: u64) -> Entry {
        Entry {
            window_start_ns: 10 * S,
            count,
        }
    }

    #[test]
    fn a_published_window_is_found_until_it_ends() {
        let t = OverLimit::new(16);
        t.publish(7, 5, S, entry(5));
        assert_eq!(t.lookup(7, 5, S, 10 * S), Some(entry(5)));
        assert_eq!(t.lookup(7, 5, S, 11 * S - 1), Some(entry(5)));
        assert_eq!(t.lookup(7, 5, S, 11 * S), None, "the window has ended");
    }

    #[test]
    fn another_limit_window_or_bucket_misses() {
        let t = OverLimit::new(16);
        t.publish(7, 5, S, entry(5));
        assert_eq!(t.lookup(7, 6, S, 10 * S), None, "a larger limit");
        assert_eq!(t.lookup(7, 5, 2 * S, 10 * S), None, "another window");
        assert_eq!(t.lookup(7 + 16, 5, S, 10 * S), None, "same slot, other key");
        assert_eq!(
            t.lookup(7 | 1 << 64, 5, S, 10 * S),
            None,
            "high bits differ"
        );
    }

    #[test]
    fn unpublish_and_clear_remove_entries() {
        let t = OverLimit::new(16);
        t.publish(7, 5, S, entry(5));
        t.publish(8, 5, S, entry(6));
        t.unpublish(9);
        t.unpublish(7 + 16);
        assert!(t.lookup(7, 5, S, 10 * S).is_some(), "other keys' removal");
        t.unpublish(7);
        assert_eq!(t.lookup(7, 5, S, 10 * S), None);
        assert!(t.lookup(8, 5, S, 10 * S).is_some());
        t.clear();
        assert_eq!(t.lookup(8, 5, S, 10 * S), None);
    }

    #[test]
    fn a_key_on_a_taken_slot_replaces_it() {
        let t = OverLimit::new(16);
        t.publish(7, 5, S, entry(5));
        t.publish(7 + 16, 5, S, entry(5));
        assert_eq!(t.lookup(7, 5, S, 10 * S), None);
        assert!(t.lookup(7 + 16, 5, S, 10 * S).is_some());
    }

    #[test]
    fn republishing_the_same_window_writes_nothing() {
        let t = OverLimit::new(16);
        t.publish(7, 5, S, entry(5));
        let seq = t.slots[7].seq.load(Ordering::Relaxed);
        t.publish(7, 5, S, entry(6));
        assert_eq!(t.slots[7].seq.load(Ordering::Relaxed), seq);
        // A new window is written.
        t.publish(
            7,
            5,
            S,
            Entry {
                window_start_ns: 11 * S,
                count: 5,
            },
        );
        assert_eq!(t.slots[7].seq.load(Ordering::Relaxed), seq + 2);
    }

    #[test]
    fn sizes_round_up_and_zero_holds_nothing() {
        assert_eq!(OverLimit::new(1000).len(), 1024);
        assert_eq!(OverLimit::new(SLOTS_MAX * 4).len(), SLOTS_MAX);
        let off = OverLimit::new(0);
        assert!(off.is_empty());
        off.publish(7, 5, S, entry(5));
        off.unpublish(7);
        off.clear();
        assert_eq!(off.lookup(7, 5, S, 10 * S), None);
    }
}
