//! Which shard group of a cluster owns a routing key (PROTOCOL.md, "Cluster
//! routing: which group owns a key").
//!
//! A cluster is a set of shard groups (a primary and its followers), each
//! with a unique name. A client sends every request for a key to the group
//! that owns it; inside that group, [`routing::shard_of`] picks the shard.
//! The owner is chosen by rendezvous hashing (highest random weight): every
//! group scores the key, and the highest score wins:
//!
//! ```text
//! key_bits   = XXH3-64(hash as 16 bytes, little-endian, seed KEY_SEED)
//! name_hash  = XXH3-64(name bytes, seed GROUP_NAME_SEED)
//! score      = mix64(key_bits ^ name_hash)          (SplitMix64's finalizer)
//! owner      = the group of the highest score; on a tie, the smaller name
//! ```
//!
//! The result depends only on the *set* of names, never on their order, and
//! adding or removing a group moves only the keys that the change must move
//! (those of the new group, or of the removed one).
//!
//! **Independent of the shard and the table.** `shard_of` uses the top bits
//! of the hash's high 64 bits; a shard's table hashes a bucket key by
//! `low64 ^ high64` (the server's `FoldHasher`). The group choice uses
//! neither directly: `key_bits` is a full-avalanche hash of all 128 bits, so
//! the keys that one group owns still spread evenly over that group's shards
//! and its tables' slots (tested below).
//!
//! # Why this scheme
//!
//! Three schemes were measured over the same keys (`client:{i}`, hashed with
//! [`routing::key_hash`]) and the same `key_bits`:
//!
//! - **rendezvous**: this module; `O(groups)` per lookup, one multiply-mix
//!   per group.
//! - **vnode ring (100 or 1000 points per group)**: the classic consistent
//!   hash ring; each group puts points at `mix64(name_hash + j × φ)`, a key
//!   belongs to the first point at or after `key_bits`; `O(log points)`.
//! - **jump** (Lamping & Veach, 2014) over the *list* of groups;
//!   `O(log groups)`, no memory, but only bucket numbers `0..n`.
//!
//! | scheme        | ns/lookup, 3 groups | 10   | 100   | max/mean at 10 (mean; worst of 20 sets) | max/mean at 100 | moved on add 10→11 (ideal 9.09%) | moved on removing the 5th of 10 (ideal ≈10%) |
//! |---------------|-----:|-----:|------:|----------------|------:|------------------------:|-------:|
//! | **rendezvous**| 14.6 | 26.8 | 150   | 1.014; 1.021   | 1.080 | 9.09%, all to the new   | 10.01% |
//! | vnodes ×100   | 31.1 | 28.0 | 51.2  | 1.162; 1.286   | 1.308 | 9.17%, all to the new   | 9.70%  |
//! | vnodes ×1000  | 35.3 | 48.4 | 92.6  | 1.046; 1.071   | 1.115 | 9.20%, all to the new   | 10.03% |
//! | jump (list)   | 12.1 | 16.5 | 29.5  | 1.014; 1.014   | 1.090 | 9.00%, all to the new   | 59.02% |
//!
//! Balance and movement are over 100,000 keys, averaged over 20 sets of
//! group names (`set{s}-group-{i}`). Reproduce everything with
//! `cargo bench -p sluice-benches --bench ring -- --warm-up-time 1
//! --measurement-time 3` (the balance and movement table is printed before
//! criterion runs; `-- --quick` for a shorter run). The times are
//! criterion's point estimates on a 2-core x86-64 VM (AMD EPYC, 2.4 GHz) with
//! another benchmark running: they moved by up to 30% between runs, so
//! read them as relative.
//!
//! Rendezvous is kept:
//!
//! - its balance is that of independent uniform choices (max/mean 1.014 at
//!   10 groups: the expected maximum of 10 bins of 10,000), which no ring
//!   of practical size reaches: 100 points per group leave the busiest
//!   group up to 29% over the mean, and even 1000 points (100,000 points,
//!   1.2 MB, at 100 groups) up to 7%;
//! - adding a group moves exactly its share, all to it, and removing *any*
//!   group moves only that group's keys, whatever its place in the list.
//!   Jump hash balances as well and is the fastest, but it numbers buckets
//!   `0..n` of a list: removing the 5th of 10 groups moved 59% of the keys,
//!   and every client would have to agree on the order;
//! - it depends only on the set of names, keeps 8 bytes per group, and is
//!   the simplest to specify exactly (one hash per name, one mix per group,
//!   a tie rule).
//!
//! Its cost is linear in the groups: 15 ns at 3 groups, 27 ns at 10, but
//! 150 ns at 100, where a ring is 2 to 3 times faster. A lookup is made once
//! per request, next to a network round trip of tens of microseconds, and a
//! cluster of rate-limiter groups has a handful to a few dozen groups, so
//! the exact balance and movement are worth more. (`group_of` precomputes
//! the group's half of `mix64`'s first, linear step at [`Ring::new`]; that
//! saved about 10% at 100 groups in back-to-back runs.)
//!
//! [`routing::shard_of`]: crate::routing::shard_of
//! [`routing::key_hash`]: crate::routing::key_hash

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The seed of the XXH3-64 of a group's name: the ASCII bytes `sluicegn`
/// read as a little-endian `u64`. Part of the protocol: changing it moves
/// keys between groups.
pub const GROUP_NAME_SEED: u64 = u64::from_le_bytes(*b"sluicegn");

/// The seed of the XXH3-64 that turns a routing key's 128-bit hash into the
/// bits the groups score: the ASCII bytes `sluicegk` read as a
/// little-endian `u64`. Part of the protocol.
pub const KEY_SEED: u64 = u64::from_le_bytes(*b"sluicegk");

/// The hash of a group's name: XXH3-64 of its UTF-8 bytes with seed
/// [`GROUP_NAME_SEED`].
#[inline]
pub fn name_hash(name: &str) -> u64 {
    xxh3_64_with_seed(name.as_bytes(), GROUP_NAME_SEED)
}

/// The bits of a routing key's hash ([`crate::routing::key_hash`]) that the
/// groups score: XXH3-64 of the hash's 16 little-endian bytes (`low64`
/// first, then `high64`, each little-endian) with seed [`KEY_SEED`].
#[inline]
pub fn key_bits(hash: u128) -> u64 {
    xxh3_64_with_seed(&hash.to_le_bytes(), KEY_SEED)
}

/// SplitMix64's finalizer (Stafford's "Mix13"): a bijection of `u64` in
/// which every input bit affects every output bit.
#[inline]
pub fn mix64(x: u64) -> u64 {
    mix64_tail(x ^ (x >> 30))
}

/// [`mix64`] after its first step.
#[inline]
fn mix64_tail(y: u64) -> u64 {
    let z = y.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A group's score for a key: `mix64(key_bits ^ name_hash)`. The group of
/// the highest score owns the key.
#[inline]
pub fn score(key_bits: u64, name_hash: u64) -> u64 {
    mix64(key_bits ^ name_hash)
}

/// The seed of a cluster's layout hash: the ASCII bytes `sluicely` read as
/// a little-endian `u64`.
pub const LAYOUT_SEED: u64 = u64::from_le_bytes(*b"sluicely");

/// The hash of a cluster's layout, which nodes that forward to each other
/// exchange in HELLO (PROTOCOL.md, "Entry points"): XXH3-64 with seed
/// [`LAYOUT_SEED`] of one line per group, `name`, TAB, its members'
/// addresses sorted as byte strings and joined by TAB (a group of one
/// member: that one, then an empty one), LF; the lines sorted as byte
/// strings. It depends on the set of groups and of their members, never on
/// their order nor on which member is primary (a failover changes
/// nothing); two nodes with the same hash own every key alike and forward
/// to the same nodes. Never 0 (0 means "no layout" on the wire).
pub fn layout_hash<'a, I>(groups: I) -> u64
where
    I: IntoIterator<Item = (&'a str, &'a str, Option<&'a str>)>,
{
    let mut lines: Vec<String> = groups
        .into_iter()
        .map(|(name, primary, follower)| {
            let mut members = [primary, follower.unwrap_or("")];
            if !members[1].is_empty() {
                members.sort_unstable();
            }
            format!("{name}\t{}\t{}\n", members[0], members[1])
        })
        .collect();
    lines.sort_unstable();
    let h = xxh3_64_with_seed(lines.concat().as_bytes(), LAYOUT_SEED);
    h.max(1)
}

/// Why a set of group names makes no ring.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// A cluster needs at least one group.
    #[error("a cluster needs at least one group")]
    Empty,
    /// Two groups have the same name.
    #[error("group name `{0}` appears twice")]
    Duplicate(String),
}

/// The groups of a cluster, ready to say which owns a key.
///
/// Group indices are positions in the list given to [`Ring::new`]; the
/// owner's *name* depends only on the set of names.
#[derive(Clone, Debug)]
pub struct Ring {
    /// The names, in the caller's order.
    names: Vec<String>,
    /// Each group's [`name_hash`] `h`, as `h ^ (h >> 30)`, in ascending
    /// name order (so that the first of equal scores is the smaller name).
    hashes: Box<[u64]>,
    /// The caller's index of the group at each position of `hashes`.
    index: Box<[usize]>,
}

impl Ring {
    /// The ring of `names`.
    ///
    /// # Panics
    ///
    /// If `names` is empty or holds a name twice; [`Ring::try_new`]
    /// returns those as errors.
    pub fn new<I, S>(names: I) -> Ring
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ring::try_new(names).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The ring of `names`: at least one, each unique.
    pub fn try_new<I, S>(names: I) -> Result<Ring, RingError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let names: Vec<String> = names.into_iter().map(Into::into).collect();
        if names.is_empty() {
            return Err(RingError::Empty);
        }
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_unstable_by(|&a, &b| names[a].as_bytes().cmp(names[b].as_bytes()));
        if let Some(w) = order.windows(2).find(|w| names[w[0]] == names[w[1]]) {
            return Err(RingError::Duplicate(names[w[0]].clone()));
        }
        let hashes = order
            .iter()
            .map(|&i| {
                let h = name_hash(&names[i]);
                h ^ (h >> 30)
            })
            .collect();
        Ok(Ring {
            names,
            hashes,
            index: order.into_boxed_slice(),
        })
    }

    /// The index (in [`Ring::new`]'s list) of the group that owns the key
    /// whose [`crate::routing::key_hash`] is `hash`.
    #[inline]
    pub fn group_of(&self, hash: u128) -> usize {
        // `score(k, h)`, with its first step `z ^ (z >> 30)` split over the
        // xor (it is linear): the group's half is precomputed in `hashes`.
        let k = key_bits(hash);
        let k = k ^ (k >> 30);
        let mut best = 0;
        let mut best_score = mix64_tail(k ^ self.hashes[0]);
        for (i, &h) in self.hashes.iter().enumerate().skip(1) {
            let s = mix64_tail(k ^ h);
            // Strictly greater: on a tie the earlier, smaller name stays.
            if s > best_score {
                best_score = s;
                best = i;
            }
        }
        self.index[best]
    }

    /// The name of the group that owns the key whose hash is `hash`.
    #[inline]
    pub fn owner(&self, hash: u128) -> &str {
        self.name(self.group_of(hash))
    }

    /// The name of group `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.group_count()`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The index of the group named `name`, if it is one.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// How many groups there are (at least one).
    pub fn group_count(&self) -> usize {
        self.names.len()
    }

    /// The names, in [`Ring::new`]'s order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.names.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::layout_hash;

    #[test]
    fn the_layout_hash_is_of_the_sets_of_groups_and_members() {
        let one = [("a", "h1:1", Some("h1:2")), ("b", "h2:1", None)];
        let h = layout_hash(one);
        // Order of groups, and which member is primary: the same layout.
        assert_eq!(h, layout_hash([one[1], one[0]]));
        assert_eq!(h, layout_hash([("a", "h1:2", Some("h1:1")), one[1]]));
        // A member, a name or a group more: another layout.
        assert_ne!(h, layout_hash([("a", "h1:1", Some("h1:3")), one[1]]));
        assert_ne!(
            h,
            layout_hash([("a", "h1:1", Some("h1:2")), ("c", "h2:1", None)])
        );
        assert_ne!(h, layout_hash([one[0]]));
        assert_ne!(layout_hash([("a", "x", None)]), 0);
    }

    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;
    use crate::routing::{key_hash, shard_of};

    const KEYS: usize = 100_000;

    /// `key_hash("client:{i}")` for `i in 0..KEYS`.
    fn keys() -> &'static [u128] {
        static KEYS_CELL: OnceLock<Vec<u128>> = OnceLock::new();
        KEYS_CELL.get_or_init(|| {
            (0..KEYS)
                .map(|i| key_hash(format!("client:{i}").as_bytes()))
                .collect()
        })
    }

    fn owners(ring: &Ring) -> Vec<usize> {
        keys().iter().map(|&h| ring.group_of(h)).collect()
    }

    fn counts(ring: &Ring) -> Vec<usize> {
        let mut c = vec![0; ring.group_count()];
        for g in owners(ring) {
            c[g] += 1;
        }
        c
    }

    /// `count` distinct names in a random order.
    fn name_set(count: usize) -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set("[a-z0-9.-]{1,16}", count)
            .prop_map(|s| s.into_iter().collect::<Vec<_>>())
            .prop_shuffle()
    }

    #[test]
    fn constants_are_their_ascii() {
        assert_eq!(GROUP_NAME_SEED, 0x6e67_6563_6975_6c73);
        assert_eq!(KEY_SEED, 0x6b67_6563_6975_6c73);
    }

    #[test]
    fn mix64_is_splitmix64s_finalizer() {
        // SplitMix64 seeded with 0: its first output is mix64(0x9e37..7c15).
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(0), 0);
    }

    #[test]
    fn one_group_owns_everything() {
        let ring = Ring::new(["only"]);
        assert!(keys().iter().take(1000).all(|&h| ring.group_of(h) == 0));
        assert_eq!(ring.owner(key_hash(b"user:42")), "only");
    }

    #[test]
    fn bad_name_sets_are_refused() {
        assert_eq!(
            Ring::try_new(Vec::<String>::new()).unwrap_err(),
            RingError::Empty
        );
        assert_eq!(
            Ring::try_new(["a", "b", "a"]).unwrap_err(),
            RingError::Duplicate("a".to_owned())
        );
    }

    #[test]
    fn indices_are_the_callers() {
        let ring = Ring::new(["zeta", "alpha", "mid"]);
        assert_eq!(ring.group_count(), 3);
        assert_eq!(ring.names().collect::<Vec<_>>(), ["zeta", "alpha", "mid"]);
        assert_eq!(ring.index_of("alpha"), Some(1));
        assert_eq!(ring.index_of("beta"), None);
        for &h in &keys()[..1000] {
            let g = ring.group_of(h);
            assert_eq!(ring.name(g), ring.owner(h));
            // The owner is the highest score, whichever index it has.
            let k = key_bits(h);
            let best = ring.names().map(|n| score(k, name_hash(n))).max();
            assert_eq!(Some(score(k, name_hash(ring.name(g)))), best);
        }
    }

    #[test]
    fn ties_go_to_the_smaller_name() {
        // Two names with one hash cannot be found; a ring with a group's
        // hash duplicated under another name shows the rule instead.
        let mut ring = Ring::new(["b", "a"]);
        ring.hashes[1] = ring.hashes[0];
        for &k in &keys()[..100] {
            assert_eq!(ring.owner(k), "a");
        }
    }

    /// Keys of one group still spread evenly over that group's shards, and
    /// over its tables' slots (`low64 ^ high64`, low bits and top 7 bits,
    /// as hashbrown uses them); and a shard's keys spread over the groups.
    #[test]
    fn group_choice_does_not_skew_shards_or_tables() {
        let ring = Ring::new(["east", "west", "north"]);
        let owners = owners(&ring);
        for g in 0..ring.group_count() {
            let mine: Vec<u128> = keys()
                .iter()
                .zip(&owners)
                .filter(|(_, &o)| o == g)
                .map(|(&h, _)| h)
                .collect();
            let n = mine.len() as f64;
            for shards in [2u16, 4, 7, 16] {
                let mut c = vec![0usize; usize::from(shards)];
                for &h in &mine {
                    c[usize::from(shard_of(h, shards))] += 1;
                }
                assert_spread(&c, n, &format!("group {g}, {shards} shards"));
            }
            let fold = |h: u128| (h as u64) ^ ((h >> 64) as u64);
            let mut low = vec![0usize; 16];
            let mut top = vec![0usize; 16];
            for &h in &mine {
                low[(fold(h) & 15) as usize] += 1;
                top[(fold(h) >> 60) as usize] += 1;
            }
            assert_spread(&low, n, &format!("group {g}, table low bits"));
            assert_spread(&top, n, &format!("group {g}, table top bits"));
        }
        for shard in 0..4u16 {
            let mut c = vec![0usize; ring.group_count()];
            let mut n = 0.0;
            for (&h, &o) in keys().iter().zip(&owners) {
                if shard_of(h, 4) == shard {
                    c[o] += 1;
                    n += 1.0;
                }
            }
            assert_spread(&c, n, &format!("shard {shard} of 4 over groups"));
        }
    }

    /// Every cell within 5 standard deviations of an even spread of `n`, and
    /// the chi-square statistic below its 99.99th percentile.
    fn assert_spread(cells: &[usize], n: f64, what: &str) {
        if let Err(e) = spread(cells, n) {
            panic!("{what}: {e}");
        }
    }

    fn spread(cells: &[usize], n: f64) -> Result<(), String> {
        let k = cells.len() as f64;
        let expected = n / k;
        let sd = (expected * (1.0 - 1.0 / k)).sqrt();
        let mut chi2 = 0.0;
        for &c in cells {
            let d = c as f64 - expected;
            if d.abs() >= 5.0 * sd {
                return Err(format!("uneven {cells:?}"));
            }
            chi2 += d * d / expected;
        }
        // Wilson-Hilferty: the 99.99th percentile of chi-square with df
        // degrees of freedom is about df (1 - 2/(9 df) + 3.72 sqrt(2/(9 df)))^3.
        let df = k - 1.0;
        let t = 2.0 / (9.0 * df);
        let limit = df * (1.0 - t + 3.72 * t.sqrt()).powi(3);
        if chi2 >= limit {
            return Err(format!("chi-square {chi2:.1} >= {limit:.1}: {cells:?}"));
        }
        Ok(())
    }

    /// The check above has teeth: choosing the group from the shard's own
    /// bits (`shard_of(hash, 3)`) fails it.
    #[test]
    fn a_correlated_choice_fails_the_spread_check() {
        let mine: Vec<u128> = keys()
            .iter()
            .copied()
            .filter(|&h| shard_of(h, 3) == 0)
            .collect();
        let mut c = [0usize; 4];
        for &h in &mine {
            c[usize::from(shard_of(h, 4))] += 1;
        }
        assert!(spread(&c, mine.len() as f64).is_err(), "{c:?}");
    }

    proptest! {
        // Each case routes 100,000 keys many times; a few cases suffice.
        #![proptest_config(ProptestConfig::with_cases(8))]

        /// Adding a group to N (N in 1..=12) moves at most 1/(N+1) + 2% of
        /// the keys, and only to the new group.
        #[test]
        fn adding_a_group_moves_only_its_share_to_it(names in name_set(13)) {
            let mut before = owners(&Ring::new(names[..1].to_vec()));
            for n in 1..=12 {
                let ring = Ring::new(names[..=n].to_vec());
                let after = owners(&ring);
                let mut moved = 0;
                for (&b, &a) in before.iter().zip(&after) {
                    if a != b {
                        // Indices are list positions, and the first n agree.
                        prop_assert_eq!(a, n, "a key moved between old groups");
                        moved += 1;
                    }
                }
                let bound = 1.0 / (n as f64 + 1.0) + 0.02;
                let frac = moved as f64 / KEYS as f64;
                prop_assert!(frac <= bound, "{} -> {}: moved {:.4} > {:.4}", n, n + 1, frac, bound);
                before = after;
            }
        }

        /// Removing any group moves only that group's keys.
        #[test]
        fn removing_a_group_moves_only_its_keys(
            names in (2usize..=12).prop_flat_map(name_set),
            pick in any::<prop::sample::Index>(),
        ) {
            let full = Ring::new(names.clone());
            let gone = pick.index(names.len());
            let mut rest = names.clone();
            rest.remove(gone);
            let less = Ring::new(rest);
            for &h in keys() {
                let was = full.owner(h);
                let now = less.owner(h);
                if was != names[gone] {
                    prop_assert_eq!(was, now);
                } else {
                    prop_assert_ne!(now, names[gone].as_str());
                }
            }
        }

        /// With 10 groups the busiest holds at most 1.1 times the mean.
        #[test]
        fn ten_groups_are_balanced(names in name_set(10)) {
            let c = counts(&Ring::new(names));
            let max = *c.iter().max().expect("10 groups");
            let mean = KEYS as f64 / 10.0;
            prop_assert!(max as f64 <= 1.1 * mean, "busiest {} of mean {}: {:?}", max, mean, c);
        }

        /// The owner depends on the set of names, not their order.
        #[test]
        fn order_of_names_does_not_matter(
            (names, shuffled) in (1usize..=12)
                .prop_flat_map(name_set)
                .prop_flat_map(|n| (Just(n.clone()), Just(n).prop_shuffle())),
        ) {
            let a = Ring::new(names);
            let b = Ring::new(shuffled);
            for &h in keys() {
                prop_assert_eq!(a.owner(h), b.owner(h));
            }
        }
    }
}
