//! A primary shard's change log: the buckets written since replication
//! last drained, in write order, for the drain to ship.
//!
//! [`Changes`] keeps two logs:
//!
//! - Fixed-size records (token buckets, fixed windows, sliding counters,
//!   absent buckets) are encoded as SYNC records when they are written,
//!   while the state is in cache; the drain hands the encoded payloads
//!   over whole, with no work per record.
//! - Sliding logs, lease lists and the keys a full sync's walk would miss
//!   are read at the drain ([`ChangeLog`] of keys).
//!
//! Both replaced a hash map keyed by bucket (about 75 instructions an
//! insert under callgrind, and a probe into a table of 80-byte entries
//! spread over memory, per decision). A hot key's writes still coalesce:
//! `recent` remembers, for each of its slots (picked by the key's low
//! bits: keys are uniform hashes), where the last write whose key maps
//! there went; a write that finds its own key there overwrites that entry
//! instead. Two hot keys that share a slot are appended in turn, and a
//! key's older entries may stay in the log. That is harmless: the drain
//! hands the entries over in write order (the read log after the encoded
//! one, and it reads the state as it is then), so the follower applies a
//! key's latest state last, and each entry is a whole state, not a delta.
//!
//! Bound: neither log ever holds one entry per decision. At
//! [`ENCODED_RECORDS_MAX`] encoded records, their keys move to the read
//! log. The read log compacts to one entry per key (the latest) when it
//! reaches `compact_at` entries, and the next compaction comes at twice
//! that, or [`COMPACT_MIN`] at least: at most 2 x (keys written since the
//! drain) + `COMPACT_MIN` entries, and compaction's cost is amortised over
//! the appends between.

use hashbrown::HashSet;

use sluice_protocol::gcra::Bucket;
use sluice_protocol::limit::Kind;
use sluice_protocol::replication::{FixedRecord, State, SyncWriter};

use super::fold::FoldState;

/// Slots of the coalescing indexes (a power of two): 32 KiB of places for
/// the encoded log, 16 KiB for the read log, kept in cache
/// by the writes that use it.
const RECENT: usize = 4096;

/// Entries below which the log is never compacted.
pub const COMPACT_MIN: usize = 16_384;

/// Encoded records at which their keys move to the read log.
pub const ENCODED_RECORDS_MAX: usize = 16_384;

// They fit 255 payloads (a place's payload is 8 bits in `recent`).
const _: () = assert!(ENCODED_RECORDS_MAX * 49 < 255 * 60_000);

/// The 32 bits of `key` that `Changes::recent` keeps beside a record's
/// place: bits the slot (the low ones) does not already tell.
#[inline]
fn key_check(key: u128) -> u32 {
    (key >> 64) as u32
}

/// What the drain ships: the two logs (see the module documentation).
#[derive(Debug)]
pub struct Changes {
    /// Fixed-size records, encoded as they were written, in write order.
    encoded: SyncWriter,
    /// Records in `encoded`.
    encoded_records: usize,
    /// For each slot, where ([`SyncWriter::push_fixed`]: payload in bits
    /// 16-23, offset below) the last encoded record whose key maps to it
    /// is, with 32 bits of that key above ([`key_check`]) and tagged with
    /// `generation` in the top byte: a tag other than the current one (0
    /// included) means none. Each take or spill starts a new generation,
    /// so the index is cleared once every 255 of them, not at each drain
    /// (sync mode drains every batch).
    recent: Box<[u64]>,
    /// The encoded log's generation, 1..=255.
    generation: u32,
    /// Buckets whose state the drain reads.
    reads: ChangeLog<Kind>,
    /// [`ENCODED_RECORDS_MAX`] (tests lower it).
    encoded_max: usize,
}

impl Default for Changes {
    fn default() -> Self {
        Changes {
            encoded: SyncWriter::new(),
            encoded_records: 0,
            recent: vec![0; RECENT].into_boxed_slice(),
            generation: 1,
            reads: ChangeLog::default(),
            encoded_max: ENCODED_RECORDS_MAX,
        }
    }
}

impl Changes {
    /// Records a fixed-size bucket's new state (`None`: gone). A sliding
    /// log's or lease list's state goes to the read log.
    #[inline]
    pub fn fixed(&mut self, kind: Kind, key: u128, state: Option<&State>) {
        let Some(r) = FixedRecord::new(kind, key, state) else {
            self.read(key, kind);
            return;
        };
        self.encode(key, |w, at| w.overwrite_fixed(at, &r), |w| w.push_fixed(&r));
    }

    /// [`Changes::fixed`] of a token bucket (`None`: gone), its record
    /// written in place (the write every decision of a client under its
    /// limit makes).
    #[inline]
    pub fn bucket(&mut self, key: u128, state: Option<Bucket>) {
        let tat_fp = state.map(|b| b.tat_fp);
        self.encode(
            key,
            |w, at| w.overwrite_bucket(at, key, tat_fp),
            |w| w.push_bucket(key, tat_fp),
        );
    }

    /// Writes `key`'s record over its last one, if `recent` knows where
    /// that is and `overwrite` finds it there, else appends it with `push`.
    #[inline(always)]
    fn encode(
        &mut self,
        key: u128,
        overwrite: impl FnOnce(&mut SyncWriter, u32) -> bool,
        push: impl FnOnce(&mut SyncWriter) -> Option<u32>,
    ) {
        let slot = key as usize & (RECENT - 1);
        let at = self.recent[slot];
        let check = key_check(key);
        // Another key's record (most writes, when many keys are written)
        // is told by the check bits, without reading that record: a miss
        // into a payload up to 1 ms old, half of this function's time at
        // 100k keys before the check was kept here.
        if at >> 56 == u64::from(self.generation)
            && (at >> 24) as u32 == check
            && overwrite(&mut self.encoded, at as u32 & 0xff_ffff)
        {
            return;
        }
        if self.encoded_records >= self.encoded_max {
            self.spill();
        }
        let at = push(&mut self.encoded);
        self.encoded_records += 1;
        // ENCODED_RECORDS_MAX records fill far fewer than 256 payloads.
        self.recent[slot] = match at {
            Some(at) if at >> 24 == 0 => {
                u64::from(self.generation) << 56 | u64::from(check) << 24 | u64::from(at)
            }
            _ => 0,
        };
    }

    /// Records a bucket whose state the drain reads.
    #[inline]
    pub fn read(&mut self, key: u128, kind: Kind) {
        self.reads.record(key, kind);
    }

    /// Moves the encoded records' keys to the read log (which compacts
    /// itself): the drain reads their states then, which are as new.
    fn spill(&mut self) {
        let encoded = std::mem::take(&mut self.encoded);
        // Only fixed-size records are encoded here, so every key is found.
        for (kind, key) in encoded.fixed_keys().unwrap_or_default() {
            self.reads.record(key, kind);
        }
        self.next_generation();
    }

    /// Forgets every place in `recent` (the encoded log is new).
    fn next_generation(&mut self) {
        self.encoded_records = 0;
        self.generation += 1;
        if self.generation > 0xff {
            self.recent.fill(0);
            self.generation = 1;
        }
    }

    /// Whether nothing is waiting.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.encoded_records == 0 && self.reads.is_empty()
    }

    /// Entries waiting (a key may have more than one).
    #[inline]
    pub fn len(&self) -> usize {
        self.encoded_records + self.reads.len()
    }

    /// Takes the encoded records (to be shipped before the reads).
    pub fn take_encoded(&mut self) -> SyncWriter {
        self.next_generation();
        std::mem::take(&mut self.encoded)
    }

    /// Takes the read log (see [`ChangeLog::take`]).
    pub fn take_reads(&mut self) -> Vec<(u128, Kind)> {
        self.reads.take()
    }

    /// Gives back what [`Changes::take_reads`] returned.
    pub fn restore_reads(&mut self, taken: Vec<(u128, Kind)>) {
        self.reads.restore(taken);
    }
}

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
    #[inline]
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

    use sluice_protocol::gcra::Bucket;

    fn bucket(tat: u128) -> State {
        State::TokenBucket(Bucket { tat_fp: tat })
    }

    /// Drains `c` as the primary does (encoded, then reads with `read`'s
    /// states) and decodes it as the follower does: the records in order.
    fn drained(
        c: &mut Changes,
        read: impl Fn(u128) -> Option<State>,
    ) -> Vec<(u128, Option<State>)> {
        let mut sw = SyncWriter::new();
        sw.append(c.take_encoded());
        let reads = c.take_reads();
        for &(key, kind) in &reads {
            sw.push(kind, key, read(key).as_ref());
        }
        c.restore_reads(reads);
        let records = sw.into_records().unwrap();
        records.into_iter().map(|r| (r.key, r.state)).collect()
    }

    #[test]
    fn a_hot_bucket_is_one_encoded_record_with_its_latest_state() {
        let mut c = Changes::default();
        for tat in 1..=1000 {
            c.fixed(Kind::TokenBucket, 42, Some(&bucket(tat)));
        }
        assert_eq!(c.len(), 1);
        assert_eq!(
            drained(&mut c, |k| Some(bucket(k))),
            vec![(42, Some(bucket(1000)))]
        );
        assert!(c.is_empty());
    }

    #[test]
    fn a_bucket_gone_and_back_ends_with_its_last_state() {
        let mut c = Changes::default();
        c.fixed(Kind::TokenBucket, 42, Some(&bucket(1)));
        c.fixed(Kind::TokenBucket, 42, None);
        c.fixed(Kind::TokenBucket, 42, None);
        let got = drained(&mut c, |k| Some(bucket(k)));
        assert_eq!(got.last(), Some(&(42, None)));
        c.fixed(Kind::TokenBucket, 42, None);
        c.fixed(Kind::TokenBucket, 42, Some(&bucket(2)));
        assert_eq!(
            drained(&mut c, |k| Some(bucket(k))).last(),
            Some(&(42, Some(bucket(2))))
        );
    }

    #[test]
    fn a_place_from_an_earlier_drain_is_not_trusted() {
        let mut c = Changes::default();
        // Key 7's place is the first record of the first payload.
        c.fixed(Kind::TokenBucket, 7, Some(&bucket(1)));
        drained(&mut c, |k| Some(bucket(k)));
        // Now key 9 is there; key 7 must not overwrite it.
        c.fixed(Kind::TokenBucket, 9, Some(&bucket(9)));
        c.fixed(Kind::TokenBucket, 7, Some(&bucket(2)));
        let got = drained(&mut c, |k| Some(bucket(k)));
        assert_eq!(got, vec![(9, Some(bucket(9))), (7, Some(bucket(2)))]);
    }

    #[test]
    fn a_place_from_an_earlier_drain_inside_a_record_is_not_trusted() {
        // Bytes that read as key k's record head where k's place was in
        // the last drain, offset 33, now in the middle of two records:
        // a fixed window's count and the next record's head (real keys are
        // hashes, and cannot be picked like this; the generation tag is
        // what rules it out.)
        let k_bytes: [u8; 16] = [0x11, 0x02, 3, 4, 5, 6, 7, 1, 9, 10, 11, 12, 13, 14, 15, 16];
        let k = u128::from_le_bytes(k_bytes);
        let mut b_bytes = [0x55u8; 16];
        b_bytes[..8].copy_from_slice(&k_bytes[8..]);
        let b = u128::from_le_bytes(b_bytes);
        let mut count = [0u8; 8];
        count[0] = Kind::TokenBucket as u8;
        count[1..].copy_from_slice(&k_bytes[..7]);
        let window = State::FixedWindow {
            window_ns: 1,
            state: sluice_protocol::limit::fixed_window::FixedWindowState {
                window_start_ns: 2,
                count: u64::from_le_bytes(count),
            },
        };
        let mut c = Changes::default();
        c.fixed(Kind::TokenBucket, 0x123, Some(&bucket(1)));
        c.fixed(Kind::TokenBucket, k, Some(&bucket(2)));
        drained(&mut c, |_| None);
        c.fixed(Kind::FixedWindow, 0x456, Some(&window));
        c.fixed(Kind::TokenBucket, b, Some(&bucket(3)));
        c.fixed(Kind::TokenBucket, k, Some(&bucket(4)));
        assert_eq!(
            drained(&mut c, |_| None),
            vec![
                (0x456, Some(window)),
                (b, Some(bucket(3))),
                (k, Some(bucket(4)))
            ]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Whatever the writes (token buckets present and gone, and keys
        /// whose state is read at the drain), the decoded drain gives every
        /// written key its latest state last, across spills of the encoded
        /// log; and neither log grows with the writes, only with the keys.
        #[test]
        fn changes_apply_to_the_latest_state(
            writes in proptest::collection::vec((0u128..1 << 20, 0u8..4), 1..40_000),
            drain_every in 1usize..50_000,
            keys in 1u128..12_000,
            encoded_max in 1usize..3_000,
        ) {
            let mut c = Changes { encoded_max, ..Changes::default() };
            type States = std::collections::HashMap<u128, Option<State>>;
            // Every key's state now (what the drain reads: the table), and
            // the keys written since the last drain with their state.
            let mut current = States::new();
            let mut want = States::new();
            let check = |c: &mut Changes, current: &States, want: &mut States| {
                let mut got = States::new();
                for (k, s) in drained(c, |k| current[&k].clone()) {
                    got.insert(k, s);
                }
                (got, std::mem::take(want))
            };
            for (i, &(key, op)) in writes.iter().enumerate() {
                let key = (key % keys) * 977 + 1;
                match op {
                    0 => {
                        c.fixed(Kind::TokenBucket, key, None);
                        current.insert(key, None);
                        want.insert(key, None);
                    }
                    1 | 2 => {
                        let s = bucket(i as u128);
                        c.fixed(Kind::TokenBucket, key, Some(&s));
                        current.insert(key, Some(s.clone()));
                        want.insert(key, Some(s));
                    }
                    _ => {
                        // A different kind: its own keys.
                        let key = key | 1 << 100;
                        let s = State::FixedWindow {
                            window_ns: 1,
                            state: sluice_protocol::limit::fixed_window::FixedWindowState {
                                window_start_ns: i as u64,
                                count: 1,
                            },
                        };
                        current.insert(key, Some(s.clone()));
                        c.read(key, Kind::FixedWindow);
                        want.insert(key, Some(s));
                    }
                }
                proptest::prop_assert!(c.len() <= 2 * want.len() + COMPACT_MIN + encoded_max);
                if (i + 1) % drain_every == 0 {
                    let (got, want) = check(&mut c, &current, &mut want);
                    proptest::prop_assert_eq!(got, want);
                }
            }
            let (got, want) = check(&mut c, &current, &mut want);
            proptest::prop_assert_eq!(got, want);
        }
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
