//! The hasher of the shard's side maps (sliding logs, leases, far TATs, a
//! drain's seen set): their keys are bucket keys, already uniform 128-bit
//! hashes, so folding one to 64 bits is all the hashing they need. It sits
//! below `table`, `changes` and `tat`, which all use it.

/// The hasher for maps keyed by bucket keys, which are already uniform.
/// Its methods are `#[inline]`, for the maps of `table` and `tat` to
/// inline them from this module: without it, moving them here from
/// `table.rs` changed `Table::throttle`'s code (they were no longer in its
/// codegen unit) and cost THROTTLE 3 to 4 instructions a decision under
/// callgrind (557 -> 561); with it, `Table::throttle` is the same code as
/// before the move.
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldState;

/// Folds a 128-bit key to 64 bits.
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldHasher(u64);

impl std::hash::Hasher for FoldHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut a = [0u8; 8];
            a[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(a)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    #[inline]
    fn write_u128(&mut self, k: u128) {
        self.0 = (k as u64) ^ ((k >> 64) as u64);
    }
}

impl std::hash::BuildHasher for FoldState {
    type Hasher = FoldHasher;

    #[inline]
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(0)
    }
}
