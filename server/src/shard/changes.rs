//! A primary shard's change log: the buckets written since replication
//! last drained, in write order, each with what its drain ships.
//!
//! It replaced a hash map keyed by bucket (one entry per bucket, about 75
//! instructions an insert under callgrind, and a probe into a table of
//! 80-byte entries spread over memory, per decision). A write is now an
//! append, and a hot key's writes still coalesce: `recent` remembers, for
//! each of its slots (picked by the key's low bits: keys are uniform
//! hashes), where the last write whose key maps there was appended; a
//! write that finds its own key there overwrites that entry instead. Two
//! hot keys that share a slot are appended in turn, and a key's older
//! entries may stay in the log. That is harmless: the drain hands the
//! entries over in write order, so the follower applies a key's latest
//! state last, and each entry is a whole state, not a delta.
//!
//! Bound: the log never holds one entry per decision. When it reaches
//! `compact_at` entries it is compacted to one entry per key (the latest),
//! and the next compaction comes at twice that, or [`COMPACT_MIN`] at
//! least: at most 2 x (keys written since the drain) + `COMPACT_MIN`
//! entries, and compaction's cost is amortised over the appends between.

use hashbrown::HashSet;

use super::table::FoldState;

/// Slots of the coalescing index (a power of two): 16 KiB, kept in cache
/// by the writes that use it.
const RECENT: usize = 4096;

/// Entries below which the log is never compacted.
pub const COMPACT_MIN: usize = 16_384;

/// The change log (see the module documentation).
#[derive(Debug)]
pub struct ChangeLog<V> {
    /// Written buckets in write order, each with its drain's value.
    entries: Vec<(u128, V)>,
    /// For each slot, 1 + the index in `entries` of the last append whose
    /// key maps to it (0: none). May point past the end or at another key
    /// after a drain: a key is compared before it is trusted.
    recent: Box<[u32]>,
    /// Entries at which the next append compacts first.
    compact_at: usize,
    /// Entries below which it never compacts ([`COMPACT_MIN`]; tests
    /// lower it).
    compact_min: usize,
}

impl<V> Default for ChangeLog<V> {
    fn default() -> Self {
        ChangeLog {
            entries: Vec::new(),
            recent: vec![0; RECENT].into_boxed_slice(),
            compact_at: COMPACT_MIN,
            compact_min: COMPACT_MIN,
        }
    }
}

impl<V> ChangeLog<V> {
    #[inline]
    fn slot(key: u128) -> usize {
        key as usize & (RECENT - 1)
    }

    /// Records that `key` was written; `value` is what its drain ships.
    #[inline]
    pub fn record(&mut self, key: u128, value: V) {
        let slot = Self::slot(key);
        let at = self.recent[slot] as usize;
        if at != 0 {
            if let Some(e) = self.entries.get_mut(at - 1) {
                if e.0 == key {
                    e.1 = value;
                    return;
                }
            }
        }
        if self.entries.len() >= self.compact_at {
            self.compact();
        }
        self.entries.push((key, value));
        // At most `compact_at` entries, far below u32::MAX (a shard's keys
        // are bounded by memory long before 2^31).
        self.recent[slot] = self.entries.len() as u32;
    }

    /// Keeps each key's latest entry only, in write order.
    fn compact(&mut self) {
        let mut seen: HashSet<u128, FoldState> =
            HashSet::with_capacity_and_hasher(self.entries.len(), FoldState);
        let mut keep = vec![false; self.entries.len()];
        for (i, (key, _)) in self.entries.iter().enumerate().rev() {
            keep[i] = seen.insert(*key);
        }
        let mut i = 0;
        self.entries.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        self.recent.fill(0);
        self.compact_at = (2 * self.entries.len()).max(self.compact_min);
    }

    /// Whether nothing is waiting.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries waiting (a key may have more than one).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Takes every entry out, in write order, leaving the log empty (its
    /// allocation stays with the caller's `Vec` until [`ChangeLog::restore`]).
    pub fn take(&mut self) -> Vec<(u128, V)> {
        self.compact_at = self.compact_min;
        std::mem::take(&mut self.entries)
    }

    /// Gives back the vector [`ChangeLog::take`] returned, emptied, so the
    /// next drain's appends reuse its allocation. Entries recorded since
    /// the take are kept, after it.
    pub fn restore(&mut self, mut taken: Vec<(u128, V)>) {
        taken.clear();
        if self.entries.is_empty() && taken.capacity() > self.entries.capacity() {
            self.entries = taken;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The latest value of each key, applying the log in order, as a
    /// follower does.
    fn applied(log: &mut ChangeLog<u64>) -> std::collections::HashMap<u128, u64> {
        let taken = log.take();
        let map = taken.iter().copied().collect();
        log.restore(taken);
        map
    }

    #[test]
    fn a_hot_key_is_one_entry() {
        let mut log = ChangeLog::default();
        for v in 0..1000 {
            log.record(7, v);
        }
        assert_eq!(log.len(), 1);
        assert_eq!(applied(&mut log)[&7], 999);
        assert!(log.is_empty());
    }

    #[test]
    fn keys_sharing_a_slot_keep_their_latest_state_last() {
        let mut log = ChangeLog::default();
        let (a, b) = (5u128, 5u128 + RECENT as u128);
        for v in 0..10 {
            log.record(a, v);
            log.record(b, 100 + v);
        }
        let got = applied(&mut log);
        assert_eq!((got[&a], got[&b]), (9, 109));
    }

    #[test]
    fn a_stale_index_after_a_drain_is_not_trusted() {
        let mut log = ChangeLog::default();
        log.record(1, 1);
        log.record(2, 2);
        applied(&mut log);
        // Slot of key 2 points at index 1; now index 1 holds key 3.
        log.record(9, 9);
        log.record(3, 3);
        log.record(2, 20);
        let got = applied(&mut log);
        assert_eq!((got[&9], got[&3], got[&2]), (9, 3, 20));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Whatever the writes, applying the log in order gives every
        /// written key its latest value, and the log stays within its
        /// bound (never one entry per write).
        #[test]
        fn the_log_applies_to_the_latest_and_stays_bounded(
            writes in proptest::collection::vec((0u128..1 << 20, proptest::num::u64::ANY), 1..40_000),
            drain_every in 1usize..50_000,
            keys in 1u128..12_000,
            compact_min in 1usize..2_000,
        ) {
            let mut log = ChangeLog { compact_at: compact_min, compact_min, ..ChangeLog::default() };
            let mut want = std::collections::HashMap::new();
            for (i, &(key, v)) in writes.iter().enumerate() {
                // Keys spread over many slots, some sharing them.
                let key = (key % keys) * 977;
                log.record(key, v);
                want.insert(key, v);
                proptest::prop_assert!(log.len() <= 2 * want.len() + compact_min);
                if (i + 1) % drain_every == 0 {
                    proptest::prop_assert_eq!(applied(&mut log), std::mem::take(&mut want));
                }
            }
            proptest::prop_assert_eq!(applied(&mut log), want);
        }
    }
}
