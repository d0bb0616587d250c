//! Which requests share a bucket (PROTOCOL.md, "Bucket identity").
//!
//! A bucket is named by `(routing key, kind, slot)`: the slot is a limit's
//! position among a DECIDE's inline limits, or `(tier name, index in the
//! tier)` for a tier's limits. The limit's *numbers* are not part of the
//! name, so a client that changes a limit's rate keeps its bucket.
//!
//! A shard stores a 128-bit [`bucket_key`] per bucket. Its high 64 bits are
//! those of the routing key's hash, unchanged, so a bucket lives on the
//! shard of its routing key and all limits of one client stay on one shard
//! (composite decisions are single-threaded). Its low 64 bits mix the key
//! hash's low 64 bits with the kind and the slot, so two limits of one
//! client never share a bucket. The one exception is the token bucket at
//! inline position 0, whose key is the routing key's hash itself: that is
//! the bucket THROTTLE, PEEK and `CL.THROTTLE` use, so a one-limit inline
//! DECIDE of a token bucket and a THROTTLE of the same key spend from the
//! same bucket.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::limit::Kind;
use crate::message::TIER_BYTES_MAX;

/// The seed of the XXH3-64 that mixes a slot into a bucket key: the ASCII
/// bytes `sluicebk` read as a little-endian `u64`. Part of the protocol:
/// changing it moves every composite bucket.
pub const BUCKET_SEED: u64 = u64::from_le_bytes(*b"sluicebk");

/// Bytes hashed before a tier name: the key hash's low 64 bits, the kind,
/// the slot's tag and its index.
const MIX_FIXED_BYTES: usize = 11;

/// Where a limit sits in the request that names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot<'a> {
    /// Position among a DECIDE's inline limits (`0..LIMITS_MAX`).
    Inline(u8),
    /// Position `index` among the limits of the tier `name` (1..=
    /// [`TIER_BYTES_MAX`] bytes, validated at the edge).
    Tier {
        /// The tier's name, as sent on the wire.
        name: &'a [u8],
        /// The limit's position in the tier.
        index: u8,
    },
}

/// The 128-bit key a shard stores the bucket of `(routing key, kind, slot)`
/// under, from the routing key's hash ([`crate::routing::key_hash`]).
///
/// - The high 64 bits are `key_hash`'s, so
///   `shard_of(bucket_key(h, ..)) == shard_of(h)`.
/// - `(Kind::TokenBucket, Slot::Inline(0))` gives `key_hash` unchanged: the
///   THROTTLE bucket.
/// - Otherwise the low 64 bits are `XXH3-64(buffer, seed = BUCKET_SEED)`
///   over `buffer = low64 (u64 LE) ++ kind code (u8) ++ tag (u8: 0 inline,
///   1 tier) ++ index (u8) ++ tier name bytes (tier only)`.
///
/// Panics if a tier name is longer than [`TIER_BYTES_MAX`] (the parser
/// refuses such names first).
#[inline]
pub fn bucket_key(key_hash: u128, kind: Kind, slot: Slot<'_>) -> u128 {
    if kind == Kind::TokenBucket && slot == Slot::Inline(0) {
        return key_hash;
    }
    let high = key_hash >> 64 << 64;
    let low = key_hash as u64;
    let mut buf = [0u8; MIX_FIXED_BYTES + TIER_BYTES_MAX];
    buf[..8].copy_from_slice(&low.to_le_bytes());
    buf[8] = kind.code();
    let len = match slot {
        Slot::Inline(index) => {
            buf[9] = 0;
            buf[10] = index;
            MIX_FIXED_BYTES
        }
        Slot::Tier { name, index } => {
            assert!(
                name.len() <= TIER_BYTES_MAX,
                "tier names are checked at the edge"
            );
            buf[9] = 1;
            buf[10] = index;
            buf[MIX_FIXED_BYTES..MIX_FIXED_BYTES + name.len()].copy_from_slice(name);
            MIX_FIXED_BYTES + name.len()
        }
    };
    high | u128::from(xxh3_64_with_seed(&buf[..len], BUCKET_SEED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::LIMITS_MAX;
    use crate::routing::{key_hash, shard_of};
    use std::collections::HashSet;

    /// Every slot a request can name for one key, in a few tiers.
    fn slots() -> Vec<Slot<'static>> {
        let names: [&'static [u8]; 4] = [b"free", b"paid", b"fre", b"freee"];
        let mut slots: Vec<Slot<'static>> = (0..LIMITS_MAX as u8).map(Slot::Inline).collect();
        for name in names {
            for index in 0..LIMITS_MAX as u8 {
                slots.push(Slot::Tier { name, index });
            }
        }
        slots.push(Slot::Tier {
            name: &[b'x'; TIER_BYTES_MAX],
            index: 7,
        });
        slots
    }

    #[test]
    fn throttle_bucket_is_the_key_hash() {
        for key in [&b"user:42"[..], b"user:7", b"k"] {
            let h = key_hash(key);
            assert_eq!(bucket_key(h, Kind::TokenBucket, Slot::Inline(0)), h);
        }
    }

    #[test]
    fn every_limit_of_a_client_has_its_own_bucket_on_its_shard() {
        let mut seen = HashSet::new();
        let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("user:{i}").into_bytes()).collect();
        for key in &keys {
            let h = key_hash(key);
            // The key hashes themselves are THROTTLE buckets: nothing else
            // may land on one.
            assert!(seen.insert(h));
        }
        for key in &keys {
            let h = key_hash(key);
            for kind in Kind::ALL {
                for slot in slots() {
                    let b = bucket_key(h, kind, slot);
                    assert_eq!(b >> 64, h >> 64, "routing bits are kept");
                    assert_eq!(shard_of(b, 1024), shard_of(h, 1024));
                    if kind == Kind::TokenBucket && slot == Slot::Inline(0) {
                        continue;
                    }
                    assert!(seen.insert(b), "{kind} {slot:?} of {key:?} collides");
                }
            }
        }
    }

    #[test]
    fn tier_name_and_index_do_not_run_together() {
        // `fre` + index 1 and `free` + index 0 must differ, and so must a
        // tier slot and an inline slot with the same index.
        let h = key_hash(b"user:42");
        let k = Kind::FixedWindow;
        let a = bucket_key(
            h,
            k,
            Slot::Tier {
                name: b"fre",
                index: 1,
            },
        );
        let b = bucket_key(
            h,
            k,
            Slot::Tier {
                name: b"free",
                index: 0,
            },
        );
        let c = bucket_key(h, k, Slot::Inline(1));
        assert!(a != b && a != c && b != c);
    }

    #[test]
    #[should_panic(expected = "checked at the edge")]
    fn overlong_tier_names_are_a_programmer_error() {
        let name = [b'x'; TIER_BYTES_MAX + 1];
        bucket_key(
            1,
            Kind::Concurrency,
            Slot::Tier {
                name: &name,
                index: 0,
            },
        );
    }
}
