//! Key choice for the load generator: `key:N` with N uniform over the
//! keyspace, from a small per-connection PRNG, formatted without
//! allocating. A shard-aware connection draws only from its shard's keys.

/// xorshift64*: fast, and plenty random for spreading load.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next value.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Bytes of the longest key: `key:` and 20 digits.
pub const KEY_BYTES_MAX: usize = 24;

/// Writes `key:{n}` into `buf` and returns it.
#[inline]
pub fn format_key(buf: &mut [u8; KEY_BYTES_MAX], n: u64) -> &[u8] {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let len = 4 + digits.len() - i;
    buf[..4].copy_from_slice(b"key:");
    buf[4..len].copy_from_slice(&digits[i..]);
    &buf[..len]
}

/// Which keys a connection draws from.
#[derive(Clone, Debug)]
pub enum Keys {
    /// Every key in `0..n`.
    All(u64),
    /// Only these key numbers (one shard's share of the keyspace).
    Subset(std::sync::Arc<Vec<u32>>),
    /// `0, 1, 2, ...` (mod `n`) across every connection together: with as
    /// many requests as keys, each key exactly once (memory measurements).
    Sequential {
        /// The next key number, shared by every connection.
        next: std::sync::Arc<std::sync::atomic::AtomicU64>,
        /// The keyspace.
        n: u64,
    },
}

impl Keys {
    /// A key number.
    #[inline]
    pub fn pick(&self, rng: &mut Rng) -> u64 {
        match self {
            Keys::All(n) => rng.below(*n),
            Keys::Subset(v) => u64::from(v[rng.below(v.len() as u64) as usize]),
            Keys::Sequential { next, n } => {
                next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_format() {
        let mut b = [0u8; KEY_BYTES_MAX];
        assert_eq!(format_key(&mut b, 0), b"key:0");
        assert_eq!(format_key(&mut b, 1234567), b"key:1234567");
        assert_eq!(format_key(&mut b, u64::MAX), b"key:18446744073709551615");
    }

    #[test]
    fn below_stays_below_and_covers() {
        let mut r = Rng::new(7);
        let mut seen = [false; 10];
        for _ in 0..1_000 {
            let v = r.below(10);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
