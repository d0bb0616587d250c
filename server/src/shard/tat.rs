//! A shard's token buckets in 8 bytes each: the TAT (see
//! `sluice_protocol::gcra`) in units of 2^-8 ns, modulo 2^64, read around
//! the time of the call. With the 16-byte key that makes a 24-byte slot,
//! where the protocol's 16-byte TAT made it 32.
//!
//! Why this loses nothing: `gcra` rounds the emission interval up to a
//! whole multiple of 2^-8 ns, so every TAT it produces has its low 24 bits
//! (of 32 fractional ones) zero, and a TAT within 2^63 units (1.14 years)
//! of the time it is read at is found again exactly from its low 64 bits.
//! Two cases do not fit and are kept apart, exactly, in a small map of
//! whole [`Bucket`]s (`far`):
//!
//! - a TAT more than 1.14 years ahead of now (a policy whose burst takes
//!   that long to refill: say a thousand units, one a day);
//! - nothing else: a TAT at or before now is a full bucket, stored as 52
//!   days old when it is older (a full bucket is the same as no bucket
//!   whatever its TAT), and a TAT with low bits set (a record from
//!   a node before this format) is rounded up to the next 2^-8 ns (a
//!   fraction of a nanosecond more spent, never less).
//!
//! A stored TAT is read around the caller's `now`: the bucket must not sit
//! in the table for more than 1.14 years of the clock since it was written.
//! The periodic sweep (`Table::sweep_some`) drops every bucket that has been
//! full for a second within one pass over the table (minutes at ten million
//! buckets), and a bucket that is not full has its TAT ahead of now by at
//! most its burst's refill time, which is what `far` bounds. Reads with no
//! `now` of their own (replication, snapshots) use the latest time the
//! table was called with.

use std::collections::HashMap;

use sluice_protocol::gcra::{self, Bucket, Verdict, TAT_ZERO_BITS};
use sluice_protocol::limit::Decision;
use sluice_protocol::Policy;

use super::bucket_map::{BucketMap, Record, Walk};
use super::fold::FoldState;

/// A TAT in 2^-8 ns, modulo 2^64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Tat(u64);

/// `now_ns` in the units of a [`Tat`], modulo 2^64.
#[inline]
fn units(now_ns: u64) -> u64 {
    now_ns << (32 - TAT_ZERO_BITS)
}

/// `now_ns` in the units of a [`Tat`], whole.
#[inline]
fn units_wide(now_ns: u64) -> u128 {
    u128::from(now_ns) << (32 - TAT_ZERO_BITS)
}

impl Tat {
    /// `bucket` as stored at `now_ns`, or `None` when its TAT is 2^63
    /// units (1.14 years) or more ahead of now. Rounded up to 2^-8 ns when
    /// it has finer bits (see the module).
    #[inline(always)]
    fn encode(bucket: Bucket, now_ns: u64) -> Option<Tat> {
        let tat = (bucket.tat_fp + ((1 << TAT_ZERO_BITS) - 1)) >> TAT_ZERO_BITS;
        let now = units_wide(now_ns);
        if tat >= now {
            if tat - now >= 1 << 63 {
                return None;
            }
        } else if now - tat > 1 << 60 {
            // A full bucket more than 2^60 units (52 days) old is stored
            // as one 52 days old: the same bucket (full is full), and it
            // leaves more than a year for the sweep to drop it before it
            // could be read as ahead of now.
            return Some(Tat((now - (1 << 60)) as u64));
        }
        // The low 64 bits; `decode` finds the rest from now.
        Some(Tat(tat as u64))
    }

    /// The bucket, read around `now_ns`.
    #[inline(always)]
    pub fn decode(self, now_ns: u64) -> Bucket {
        let ahead = self.0.wrapping_sub(units(now_ns)) as i64;
        let now = units_wide(now_ns);
        // Never below 0: what was stored was not, and is read within its
        // range (see the module).
        let tat = now.wrapping_add(ahead as i128 as u128);
        Bucket {
            tat_fp: tat << TAT_ZERO_BITS,
        }
    }
}

/// A bucket is full once its TAT is not after now (`Bucket::is_full`).
impl Record for Tat {
    #[inline]
    fn is_full(&self, now_ns: u64) -> bool {
        self.0.wrapping_sub(units(now_ns)) as i64 <= 0
    }
}

/// Where a key's bucket is: what [`TokenBuckets::find`] returns, for one
/// [`TokenBuckets::write`] after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// In the slot with this index.
    Slot(usize),
    /// In the far map.
    Far,
    /// Nowhere: full.
    Absent,
}

/// The token buckets of one shard (see the module).
#[derive(Debug, Default)]
pub struct TokenBuckets {
    map: BucketMap<Tat>,
    /// Buckets whose TAT is too far ahead for a [`Tat`]: almost always
    /// empty, and then never looked at.
    far: HashMap<u128, Bucket, FoldState>,
    /// The latest time the table was called with: what a read with no
    /// time of its own decodes around.
    clock_ns: u64,
    /// Per walk, whether its step has handed over `far`.
    far_sent: [bool; 2],
    /// The last policy's interval and reciprocal: a decision on a slot
    /// divides only when the policy changes (`gcra::throttle_q8_memo`).
    interval: gcra::IntervalMemo,
}

impl TokenBuckets {
    /// Where `key`'s bucket is.
    #[inline(always)]
    pub fn find(&self, key: u128) -> Found {
        match self.map.find(key) {
            Some(i) => Found::Slot(i),
            None if !self.far.is_empty() && self.far.contains_key(&key) => Found::Far,
            None => Found::Absent,
        }
    }

    /// The bucket at `found` (from [`TokenBuckets::find`] for `key`), read
    /// at `now_ns`.
    #[inline(always)]
    pub fn read(&self, found: Found, key: u128, now_ns: u64) -> Option<Bucket> {
        match found {
            Found::Slot(i) => Some(self.map.value_at(i).decode(now_ns)),
            Found::Far => self.far.get(&key).copied(),
            Found::Absent => None,
        }
    }

    /// THROTTLE on the bucket in slot `index` (from
    /// [`TokenBuckets::find`]), decided in the slot's own units
    /// (`gcra::throttle_q8_memo`: the same decision as `gcra::throttle`, in
    /// 64-bit arithmetic, with no conversion to and from a [`Bucket`]).
    /// The verdict, and what was written: `None` nothing, `Some(None)` the
    /// bucket dropped (full), `Some(Some(tat))` stored. `None` when the
    /// policy does not fit 64 bits: decide with [`TokenBuckets::read`] and
    /// [`TokenBuckets::write`].
    #[inline(always)]
    pub fn throttle_in_slot(
        &mut self,
        index: usize,
        policy: &Policy,
        cost: u64,
        now_ns: u64,
    ) -> Option<(Verdict, Option<Option<Tat>>)> {
        let now = units(now_ns);
        // The slot borrowed once, read and written through one reference:
        // indexing it twice cost a bounds check and a reload a decision.
        let slot = self.map.value_at_mut(index);
        let ahead = slot.0.wrapping_sub(now) as i64;
        let spent = ahead.max(0) as u64;
        let (verdict, new) = gcra::throttle_q8_memo(spent, policy, cost, &mut self.interval)?;
        // A denial (never of a full bucket), or a cost of 0 on one not full.
        if new == spent && ahead > 0 {
            return Some((verdict, None));
        }
        if new != 0 {
            // `new` is at most the depth: below 2^63, as `decode` needs.
            let tat = Tat(now.wrapping_add(new));
            *slot = tat;
            self.clock_ns = now_ns;
            return Some((verdict, Some(Some(tat))));
        }
        self.clock_ns = now_ns;
        self.map.remove_index(index);
        Some((verdict, Some(None)))
    }

    /// `key`'s bucket at `now_ns`.
    #[inline]
    pub fn get(&self, key: u128, now_ns: u64) -> Option<Bucket> {
        self.read(self.find(key), key, now_ns)
    }

    /// `key`'s bucket, read around the latest time the table was called
    /// with (replication and snapshots).
    pub fn get_latest(&self, key: u128) -> Option<Bucket> {
        self.get(key, self.clock_ns)
    }

    /// Stores `bucket` for `key` (`None`: drops it), where
    /// [`TokenBuckets::find`] found it with nothing changed since.
    #[inline(always)]
    pub fn write(&mut self, found: Found, key: u128, bucket: Option<Bucket>, now_ns: u64) {
        self.clock_ns = now_ns;
        // The hot path: a bucket in a slot stays there.
        if let (Found::Slot(i), Some(b)) = (found, bucket) {
            if let Some(t) = Tat::encode(b, now_ns) {
                *self.map.value_at_mut(i) = t;
                return;
            }
        }
        self.write_cold(found, key, bucket, now_ns);
    }

    /// [`TokenBuckets::write`] for everything but a bucket staying in its
    /// slot.
    #[inline(never)]
    fn write_cold(&mut self, found: Found, key: u128, bucket: Option<Bucket>, now_ns: u64) {
        let tat = bucket.map(|b| (b, Tat::encode(b, now_ns)));
        match (found, tat) {
            (Found::Slot(i), Some((_, Some(t)))) => *self.map.value_at_mut(i) = t,
            (Found::Slot(i), None) => self.map.remove_index(i),
            (Found::Slot(i), Some((b, None))) => {
                self.map.remove_index(i);
                self.far.insert(key, b);
            }
            (Found::Far, Some((_, Some(t)))) => {
                self.far.remove(&key);
                self.map.insert(key, t, now_ns);
            }
            (Found::Far, Some((b, None))) => drop(self.far.insert(key, b)),
            (Found::Far, None) => drop(self.far.remove(&key)),
            (Found::Absent, Some((_, Some(t)))) => self.map.insert(key, t, now_ns),
            (Found::Absent, Some((b, None))) => drop(self.far.insert(key, b)),
            (Found::Absent, None) => {}
        }
    }

    /// Runs a pure decision on `key`'s bucket at `now_ns` and stores the
    /// bucket it returns, with one lookup; its verdict.
    #[inline]
    pub fn apply(
        &mut self,
        key: u128,
        now_ns: u64,
        decide: impl FnOnce(Option<Bucket>) -> Decision<Bucket>,
    ) -> Verdict {
        let found = self.find(key);
        let d = decide(self.read(found, key, now_ns));
        self.write(found, key, d.state, now_ns);
        d.verdict
    }

    /// Stores `bucket` for `key` (`None`: drops it).
    pub fn set(&mut self, key: u128, bucket: Option<Bucket>, now_ns: u64) {
        self.write(self.find(key), key, bucket, now_ns);
    }

    /// Drops `key`'s bucket; whether it had one.
    pub fn remove(&mut self, key: u128) -> bool {
        match self.find(key) {
            Found::Slot(i) => self.map.remove_index(i),
            Found::Far => drop(self.far.remove(&key)),
            Found::Absent => return false,
        }
        true
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.map.len() + self.far.len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Full buckets dropped by sweeps so far (the slots').
    pub fn swept_total(&self) -> u64 {
        self.map.swept_total()
    }

    /// Bytes the slots and the far map occupy.
    pub fn memory_bytes(&self) -> usize {
        self.map.memory_bytes() + self.far.capacity() * (std::mem::size_of::<(u128, Bucket)>() + 1)
    }

    /// Makes room for `additional` more buckets in one step.
    pub fn reserve(&mut self, additional: usize) {
        self.map.reserve(additional);
    }

    /// Starts loading `key`'s slot into cache.
    #[inline]
    pub fn prefetch(&self, key: u128) {
        self.map.prefetch(key);
    }

    /// Examines `n` slots at the sweep cursor, dropping the buckets full
    /// at `now_ns` (the far map is swept by [`TokenBuckets::sweep`]).
    pub fn sweep_step(&mut self, now_ns: u64, n: usize) {
        self.map.sweep_step(now_ns, n);
    }

    /// Drops every bucket full at `now_ns`.
    pub fn sweep(&mut self, now_ns: u64) {
        self.map.sweep(now_ns);
        self.sweep_far(now_ns);
    }

    /// Drops the far map's full buckets (its size is bounded by what it
    /// holds, so a caller sweeps it at its own pace: the periodic tick).
    pub fn sweep_far(&mut self, now_ns: u64) {
        if !self.far.is_empty() {
            self.far.retain(|_, b| !b.is_full(now_ns));
        }
    }

    /// Notes the time without writing (the periodic tick), so reads with
    /// no time of their own stay near the clock.
    pub fn tick(&mut self, now_ns: u64) {
        self.clock_ns = now_ns;
    }

    /// Every key held.
    pub fn keys(&self) -> impl Iterator<Item = u128> + '_ {
        self.map
            .iter()
            .map(|(k, _)| k)
            .chain(self.far.keys().copied())
    }

    /// Starts (or restarts) a walk (see `BucketMap::export_start`).
    pub fn export_start(&mut self, walk: Walk, slots_per_step: usize) {
        self.map.export_start(walk, slots_per_step);
        self.far_sent[walk as usize] = false;
    }

    /// Ends a walk.
    pub fn export_stop(&mut self, walk: Walk) {
        self.map.export_stop(walk);
    }

    /// The next step of a walk (see `BucketMap::export_step`): the slots'
    /// buckets, and with the last step every far bucket.
    pub fn export_step(&mut self, walk: Walk, out: &mut Vec<(u128, Bucket)>) -> bool {
        let mut tats = Vec::new();
        let done = self.map.export_step(walk, &mut tats);
        let now_ns = self.clock_ns;
        out.extend(tats.into_iter().map(|(k, t)| (k, t.decode(now_ns))));
        if done && !self.far_sent[walk as usize] {
            self.far_sent[walk as usize] = true;
            out.extend(self.far.iter().map(|(&k, &b)| (k, b)));
        }
        done
    }

    /// Keys a walk would otherwise miss (see `BucketMap::export_moved`).
    pub fn export_moved(&mut self, walk: Walk, out: &mut Vec<u128>) {
        self.map.export_moved(walk, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sluice_protocol::gcra;
    use sluice_protocol::Policy;

    const S: u64 = 1_000_000_000;
    const YEAR: u64 = 365 * 86_400 * S;

    proptest! {
        /// Any TAT gcra can produce, within 1.14 years ahead of now and
        /// read anywhere in the year after, comes back exactly; one before
        /// now comes back before now (full), whatever its age, and exactly
        /// when it is under 52 days old.
        #[test]
        fn what_gcra_writes_comes_back_exactly(
            now in any::<u64>(),
            ns in any::<u64>(),
            frac in 0u128..256,
            read_later in 0u64..YEAR,
        ) {
            let tat_fp = (u128::from(ns) << 32) | (frac << TAT_ZERO_BITS);
            let b = Bucket { tat_fp };
            match Tat::encode(b, now) {
                Some(t) if tat_fp > u128::from(now) << 32 => {
                    prop_assert_eq!(t.decode(now), b);
                    let later = now.saturating_add(read_later);
                    prop_assert_eq!(t.decode(later), b);
                    prop_assert_eq!(t.is_full(later), b.is_full(later));
                }
                Some(t) => {
                    prop_assert!(t.is_full(now));
                    prop_assert!(t.decode(now).is_full(now));
                    if now - ns < 1 << 52 {
                        prop_assert_eq!(t.decode(now), b);
                    }
                }
                None => prop_assert!(ns - now > YEAR, "{} ns ahead does not fit", ns - now),
            }
        }

        /// A bucket decided through the table decides as the pure
        /// function does (the table keeps every bit gcra writes).
        #[test]
        fn the_table_decides_as_gcra(
            count in 1u64..=10_000_000,
            period_s in 1u64..=86_400,
            burst in 1u64..=1_000,
            gaps in prop::collection::vec((0u64..2 * S, 1u64..=4), 1..200),
        ) {
            let p = Policy { count, period_ns: period_s * S, burst };
            let mut t = TokenBuckets::default();
            let mut model = None;
            let mut now = 1_700_000_000 * S;
            for (gap, cost) in gaps {
                now += gap;
                let cost = cost.min(burst);
                let found = t.find(7);
                let stored = t.read(found, 7, now);
                prop_assert_eq!(stored, model);
                let d = gcra::throttle(stored, &p, cost, now);
                t.write(found, 7, d.bucket, now);
                model = d.bucket;
            }
        }
    }

    proptest! {
        /// THROTTLE in the slot's own units decides and stores as
        /// `gcra::throttle` on the decoded bucket, whatever the bucket's
        /// state (full for long, nearly spent, spent), and leaves the slot
        /// alone where it declines.
        #[test]
        fn throttle_in_slot_is_gcra(
            count in 1u64..=10_000_000,
            period_ns in prop_oneof![Just(S), Just(7 * S / 3), Just(86_400 * S)],
            burst in 1u64..=1_000,
            arrivals in prop::collection::vec((0u64..3 * S, 0u64..=4), 1..100),
        ) {
            let p = Policy { count, period_ns, burst };
            let mut t = TokenBuckets::default();
            let mut model: Option<Bucket> = None;
            let mut now = 1_700_000_000 * S;
            // The key is in a slot from the start (a full bucket).
            t.set(9, Some(Bucket::from_tat_ns(now)), now);
            for (gap, cost) in arrivals {
                now += gap;
                let cost = cost.min(burst);
                let want = gcra::throttle(model.or(Some(Bucket::from_tat_ns(now - gap))).filter(|b| !b.is_full(now)), &p, cost, now);
                match t.find(9) {
                    Found::Slot(i) => {
                        let (v, _) = t.throttle_in_slot(i, &p, cost, now).expect("fits");
                        prop_assert_eq!(v, want.verdict);
                    }
                    _ => {
                        let d = gcra::throttle(t.get(9, now), &p, cost, now);
                        prop_assert_eq!(d.verdict, want.verdict);
                        t.set(9, d.bucket, now);
                    }
                }
                let stored = t.get(9, now).filter(|b| !b.is_full(now));
                prop_assert_eq!(stored, want.bucket);
                model = want.bucket;
                if model.is_none() {
                    // Keep a full bucket in a slot, as a refilled one is.
                    t.set(9, Some(Bucket::from_tat_ns(now)), now);
                }
            }
        }
    }

    #[test]
    fn a_tat_years_ahead_is_kept_whole() {
        // One a day, a burst of a thousand: a spent bucket refills in 2.7
        // years, past what 64 bits of 2^-8 ns hold around now.
        let p = Policy {
            count: 1,
            period_ns: 86_400 * S,
            burst: 1_000,
        };
        let now = 1_700_000_000 * S;
        let mut t = TokenBuckets::default();
        let mut model = None;
        for _ in 0..1_000 {
            let d = gcra::throttle(t.get(1, now), &p, 1, now);
            assert!(d.verdict.allowed);
            t.set(1, d.bucket, now);
            model = d.bucket;
        }
        assert_eq!(t.far.len(), 1, "the bucket moved to the far map");
        assert_eq!(t.get(1, now), model);
        assert!(!gcra::throttle(t.get(1, now), &p, 1, now).verdict.allowed);
        // A refund brings it back within range: into a slot again.
        let d = gcra::refund(t.get(1, now), &p, 900, now);
        t.set(1, d.bucket, now);
        assert!(t.far.is_empty());
        assert_eq!(t.get(1, now), d.bucket);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn walks_carry_far_buckets_once() {
        let now = 1_700_000_000 * S;
        let mut t = TokenBuckets::default();
        let near = Bucket::from_tat_ns(now + S);
        let far = Bucket::from_tat_ns(now + 2 * YEAR);
        t.set(1, Some(near), now);
        t.set(2, Some(far), now);
        t.export_start(Walk::Snapshot, 4);
        let mut out = Vec::new();
        while !t.export_step(Walk::Snapshot, &mut out) {}
        assert!(t.export_step(Walk::Snapshot, &mut out));
        out.sort_unstable_by_key(|&(k, _)| k);
        assert_eq!(out, vec![(1, near), (2, far)]);
    }

    #[test]
    fn a_record_with_finer_bits_is_rounded_up() {
        let now = 1_700_000_000 * S;
        let b = Bucket {
            tat_fp: (u128::from(now + S) << 32) + 1,
        };
        let mut t = TokenBuckets::default();
        t.set(1, Some(b), now);
        let back = t.get(1, now).unwrap();
        assert!(back.tat_fp > b.tat_fp);
        assert!(back.tat_fp - b.tat_fp < 1 << TAT_ZERO_BITS);
    }
}
