//! A shard's buckets: a [`BucketMap`] from a key's 128-bit hash to its GCRA
//! bucket. Only the owning shard thread touches it.
//!
//! Protocol v1 and redis-cell's CL.THROTTLE share the table and the record:
//! both keep a bucket's theoretical arrival time, so a key is one bucket
//! whichever protocol spends from it (each with its own arithmetic).
//!
//! Memory stays bounded by the buckets that are *not* full: a bucket that
//! has refilled completely is the same as no bucket, so a decision that
//! leaves a bucket full removes it, every insert sweeps a few slots for
//! full buckets, and before the table grows it drops every full bucket (an
//! O(n) pass that costs no more than the rehash it may avoid).

use sluice_protocol::cell::{self, CellPolicy, CellVerdict};
use sluice_protocol::gcra::{self, Bucket, Verdict};
use sluice_protocol::Policy;

use super::bucket_map::{BucketMap, Record};
use super::{Op, Outcome};

impl Record for Bucket {
    #[inline]
    fn is_full(&self, now_ns: u64) -> bool {
        Bucket::is_full(self, now_ns)
    }
}

#[derive(Debug, Default)]
pub struct Table {
    /// Key hash to bucket. Absent means full.
    buckets: BucketMap<Bucket>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Table {
        Table::default()
    }

    /// Buckets held (all of them not full when last touched).
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Full buckets dropped by sweeps so far.
    pub fn swept_total(&self) -> u64 {
        self.buckets.swept_total()
    }

    /// Bytes the table's slots occupy.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.memory_bytes()
    }

    /// Starts loading `key`'s slot into cache; see `BucketMap::prefetch`.
    #[inline]
    pub fn prefetch(&self, key: u128) {
        self.buckets.prefetch(key);
    }

    /// Spends `cost` from `key`'s bucket (see `gcra::throttle`).
    #[inline]
    pub fn throttle(&mut self, key: u128, policy: &Policy, cost: u64, now_ns: u64) -> Verdict {
        match self.buckets.get_mut(key) {
            Some(b) => {
                let d = gcra::throttle(Some(*b), policy, cost, now_ns);
                match d.bucket {
                    Some(nb) => *b = nb,
                    None => {
                        self.buckets.remove(key);
                    }
                }
                d.verdict
            }
            None => {
                let d = gcra::throttle(None, policy, cost, now_ns);
                if let Some(nb) = d.bucket {
                    self.insert_new(key, nb, now_ns);
                }
                d.verdict
            }
        }
    }

    /// Inserts a bucket for a key that has none, first sweeping out full
    /// buckets if the table would otherwise grow.
    #[inline]
    fn insert_new(&mut self, key: u128, bucket: Bucket, now_ns: u64) {
        self.buckets.insert(key, bucket, now_ns);
    }

    /// redis-cell's CL.THROTTLE on `key`'s bucket (see `cell::throttle`).
    #[inline]
    pub fn cell_throttle(
        &mut self,
        key: u128,
        policy: &CellPolicy,
        quantity: u64,
        now_ns: u64,
    ) -> CellVerdict {
        let stored = self.buckets.get(key).map(Bucket::tat_ns);
        let d = cell::throttle(stored, policy, quantity, now_ns);
        if d.verdict.limited {
            // Limited changes nothing (not even a v1 bucket's fraction).
            return d.verdict;
        }
        match d.tat_ns.filter(|&tat_ns| tat_ns > now_ns) {
            Some(tat_ns) => match self.buckets.get_mut(key) {
                Some(b) => *b = Bucket::from_tat_ns(tat_ns),
                None => self.insert_new(key, Bucket::from_tat_ns(tat_ns), now_ns),
            },
            None => {
                self.buckets.remove(key);
            }
        }
        d.verdict
    }

    /// Carries out a forwarded [`Op`].
    #[inline]
    pub fn decide(&mut self, key: u128, op: &Op, now_ns: u64) -> Outcome {
        match *op {
            Op::Throttle { policy, cost } => {
                Outcome::Verdict(self.throttle(key, &policy, cost, now_ns))
            }
            Op::Peek { policy, cost } => Outcome::Verdict(self.peek(key, &policy, cost, now_ns)),
            Op::Cell { policy, quantity } => {
                Outcome::Cell(self.cell_throttle(key, &policy, quantity, now_ns))
            }
        }
    }

    /// Answers as `throttle` would; creates and changes nothing.
    #[inline]
    pub fn peek(&self, key: u128, policy: &Policy, cost: u64, now_ns: u64) -> Verdict {
        gcra::peek(self.buckets.get(key).copied(), policy, cost, now_ns)
    }

    /// Drops every bucket that is full at `now_ns`.
    pub fn sweep(&mut self, now_ns: u64) {
        self.buckets.sweep(now_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn full_buckets_do_not_accumulate() {
        let p = Policy::new(1000, S, 1).unwrap();
        let mut t = Table::new();
        // 100k distinct keys, each spent once, 1 ms apart: each refills in
        // 1 ms, so at most a handful are ever not full.
        for i in 0..100_000u128 {
            let now = 1_000 * S + (i as u64) * 1_000_000;
            assert!(
                t.throttle(
                    i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834),
                    &p,
                    1,
                    now
                )
                .allowed
            );
        }
        assert!(t.len() < 64, "table kept {} buckets", t.len());
        assert!(t.swept_total() > 99_000);
    }

    #[test]
    fn peek_creates_nothing_and_refill_removes() {
        let p = Policy::new(1, S, 2).unwrap();
        let mut t = Table::new();
        assert!(t.peek(7, &p, 1, S).allowed);
        assert!(t.is_empty());
        assert!(t.throttle(7, &p, 1, S).allowed);
        assert_eq!(t.len(), 1);
        assert_eq!(t.peek(7, &p, 1, S).remaining, 0);
        // Cost 0 two seconds later: the bucket is full again, so it goes.
        assert!(t.throttle(7, &p, 0, 3 * S).allowed);
        assert!(t.is_empty());
    }

    #[test]
    fn cell_buckets_live_in_the_same_table() {
        // redis-cell's README example, then the bucket refills and goes.
        let p = CellPolicy::new(15, 30, 60).unwrap();
        let mut t = Table::new();
        let v = t.cell_throttle(9, &p, 1, 100 * S);
        assert_eq!(v.reply(), [0, 16, 15, -1, 2]);
        assert_eq!(t.len(), 1);
        // Over the limit: limited, nothing stored or changed.
        assert!(t.cell_throttle(9, &p, 17, 100 * S).limited);
        assert_eq!(t.cell_throttle(9, &p, 0, 100 * S).remaining, 15);
        assert!(t.cell_throttle(9, &p, 0, 102 * S).remaining == 16);
        assert!(t.is_empty(), "a peek at a full bucket drops it");
        // A v1 bucket and a CL.THROTTLE on the same key see one TAT.
        let v1 = Policy::new(1, S, 2).unwrap();
        assert!(t.throttle(5, &v1, 2, 100 * S).allowed);
        let one_per_s = CellPolicy::new(1, 1, 1).unwrap();
        let v = t.cell_throttle(5, &one_per_s, 1, 100 * S);
        assert!(v.limited);
        assert_eq!(v.reset_after_s(), 2);
    }
}
