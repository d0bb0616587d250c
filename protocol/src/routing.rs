//! How a routing key (the client id) maps to its 128-bit hash and its shard.
//!
//! The hash is XXH3-128 with seed 0 over the key bytes; the shard is the
//! high 64 bits of that hash scaled onto `0..shard_count` by a multiply and a
//! shift (Lemire's reduction). Both are part of the protocol: a client in any
//! language computes the same shard from HELLO's shard count (PROTOCOL.md,
//! "Routing").

/// The routing scheme number HELLO_OK announces for the mapping above.
pub const ROUTING_XXH3_128_MULSHIFT: u8 = 1;

/// The 128-bit hash of a routing key. A shard stores this, never the key.
#[inline]
pub fn key_hash(key: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(key)
}

/// The shard that owns `hash` among `shard_count` shards.
#[inline]
pub fn shard_of(hash: u128, shard_count: u16) -> u16 {
    assert!(shard_count > 0, "shard_count must be positive");
    let high = (hash >> 64) as u64;
    ((u128::from(high) * u128::from(shard_count)) >> 64) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_hashes() {
        // Reference values from the XXH3 specification's implementation;
        // PROTOCOL.md lists the same ones for implementers.
        assert_eq!(key_hash(b""), 0x99aa06d3014798d86001c324468d497f);
        assert_eq!(shard_of(key_hash(b"user:42"), 1), 0);
    }

    #[test]
    fn shards_are_in_range_and_spread() {
        let mut counts = [0u32; 7];
        for i in 0..70_000u32 {
            let s = shard_of(key_hash(format!("client-{i}").as_bytes()), 7);
            counts[usize::from(s)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven spread: {counts:?}");
        }
    }
}
