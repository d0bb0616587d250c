//! The open-addressing table a shard keeps its buckets in: 128-bit key
//! hashes to small fixed-size records, stored inline in one flat array.
//!
//! Why not a general-purpose map: a decision is one lookup of a key that is
//! already a uniform 128-bit hash, and at millions of keys that lookup is a
//! cache miss. This table is built around that:
//!
//! - One array of `(key, value)` slots, no separate control bytes, so a hit
//!   is usually one cache line; key 0 marks an empty slot.
//! - [`BucketMap::prefetch`] loads a key's home slot without deciding
//!   anything, so a connection can start the misses of a whole batch before
//!   it decides the first request (memory-level parallelism).
//! - Robin Hood linear probing (probe lengths stay short and even at high
//!   load) with backward-shift deletion (no tombstones).
//! - Any capacity, not just powers of two (the home slot is
//!   `hash * capacity >> 64`), so the table grows by [`GROWTH_NUM`] /
//!   [`GROWTH_DEN`] and the bytes per bucket stay within a narrow band
//!   instead of halving at every doubling.
//! - Buckets that have refilled (equivalent to absent) stay where they are
//!   until they have been full for [`SWEEP_IDLE_NS`]: before growing, one
//!   full sweep drops those (its cost is of the same order as the rehash it
//!   may avoid, and it runs only when the table has filled by a ninth of
//!   its capacity since the last), and the sweep cursor examines a few
//!   slots at every insert ([`SWEEP_SLOTS_PER_INSERT`]) and a bounded
//!   number at the shard's periodic tick, so memory follows the keys in
//!   use. A client that stays under its limit visits its bucket in
//!   place: no removal, no insertion. (An earlier version swept a few slots
//!   on every insert and dropped every refilled bucket, which removed
//!   exactly the buckets the next visits inserted again: a third of a
//!   shard's instructions under the limit went to that churn. Dropping a
//!   full bucket is always exact, whenever it happens: it equals no
//!   bucket.)

/// Most slots in use, per mille of capacity, before the table grows.
pub const LOAD_MAX_PERMILLE: usize = 875;
/// Growth factor numerator / denominator (x1.15). With the load at most
/// 0.875 and at least 0.875 / 1.15 = 0.76 once grown, a 24-byte
/// token-bucket slot costs 27 to 32 bytes a bucket (growing by 1.3, the
/// load ran from 0.67: up to 36 bytes at 24 bytes a slot). Growing more
/// often costs a fill from empty more rehashing (7.7 moves a key in all
/// against 4.3), and nothing once grown; a ceiling of 0.9 made visits and
/// inserts measurably longer (benches/notes.md, "Memory").
pub const GROWTH_NUM: usize = 23;
pub const GROWTH_DEN: usize = 20;
/// Slots the sweep cursor examines per insert (dropping buckets idle for
/// [`SWEEP_IDLE_NS`]).
pub const SWEEP_SLOTS_PER_INSERT: usize = 4;
/// Slots the sweep cursor examines per map at each periodic tick (see
/// `Table::sweep_some`).
pub const SWEEP_SLOTS_PER_TICK: usize = 16_384;
/// How long a bucket stays full before a sweep drops it: a key in use
/// comes back sooner, and keeps its slot.
pub const SWEEP_IDLE_NS: u64 = 1_000_000_000;
/// Smallest capacity.
const CAPACITY_MIN: usize = 16;
/// Cache lines [`BucketMap::prefetch`] loads, from the home slot's on
/// (the home slot itself straddles two a quarter of the time at 24 bytes).
const PREFETCH_LINES: usize = 3;
/// An insertion that steps over more slots than this sweeps the whole table
/// (see [`BucketMap::insert`]). Robin Hood insertion at the 0.875 ceiling,
/// with keys spread by their hashes, steps over about 30 on average and
/// rarely a few hundred.
pub const LONG_RUN_SLOTS: usize = 512;
/// At most one sweep a long run triggers per this many inserts for each
/// slot of the table (`capacity / 16` inserts: at most 16 slots examined
/// an insert, amortised).
const LONG_RUN_SWEEP_EVERY: usize = 16;

// After growth the load must stay above what growth would trigger at, or a
// table could grow again immediately.
const _: () = assert!(LOAD_MAX_PERMILLE * GROWTH_DEN / GROWTH_NUM < LOAD_MAX_PERMILLE);

/// A value the table can hold: small, copyable, and able to say when it is
/// equivalent to absent. The all-zero bit pattern must be a valid value
/// (`Zeroable`, derived, so the compiler checks it field by field): tables
/// are allocated zeroed, so that a growth does not write the whole new
/// array before using it.
pub trait Record: Copy + Default + bytemuck::Zeroable {
    /// Whether the record, at `now_ns`, is the same as no record at all.
    fn is_full(&self, now_ns: u64) -> bool;
}

/// One slot: the key hash (0 = empty) and its record. The key is two
/// `u64`s, not a `u128`, so that the slot is aligned to 8 bytes, not 16: a
/// token bucket's slot is 24 bytes (a 16-byte key and an 8-byte TAT, see
/// `shard::tat`), where a `u128` key would pad it to 32. A 24-byte slot
/// straddles two cache lines one time in four; [`BucketMap::prefetch`]
/// loads both, and the line after.
#[derive(Clone, Copy, Debug, Default, bytemuck::Zeroable)]
#[repr(C)]
struct Slot<V> {
    key: [u64; 2],
    value: V,
}

impl<V> Slot<V> {
    #[inline]
    fn new(key: u128, value: V) -> Slot<V> {
        Slot {
            key: [key as u64, (key >> 64) as u64],
            value,
        }
    }

    #[inline]
    fn key(&self) -> u128 {
        u128::from(self.key[0]) | (u128::from(self.key[1]) << 64)
    }

    /// Whether the slot is empty (key 0).
    #[inline]
    fn is_empty(&self) -> bool {
        self.key[0] | self.key[1] == 0
    }

    /// Whether the slot holds `key` (given as its two halves).
    #[inline(always)]
    fn holds(&self, lo: u64, hi: u64) -> bool {
        self.key[0] == lo && self.key[1] == hi
    }
}

/// A map from non-zero 128-bit key hashes to records.
#[derive(Debug)]
pub struct BucketMap<V> {
    /// The slots; `slots.len()` is the capacity.
    slots: Slots<V>,
    /// Slots in use.
    len: usize,
    /// Where the incremental sweep examines next.
    cursor: usize,
    /// Records dropped because they had refilled.
    swept_total: u64,
    /// Inserts since the last full sweep.
    inserts_since_sweep: usize,
    /// The walks in progress, by [`Walk`].
    export: [Option<Export>; 2],
    /// Slots insertion has stepped over (tests: the work a load does).
    #[cfg(test)]
    probes: u64,
}

/// Which walk over the slots: a follower's full sync, or a snapshot. Both
/// may run at once, each with its own cursor and its own moved keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// A full sync to a follower: interleaved passes (see [`Export`]).
    Sync = 0,
    /// A snapshot: the slots in order, the cheapest read there is.
    Snapshot = 1,
}

/// A walk over the slots (a full sync or a snapshot), while the table
/// keeps changing.
///
/// A full sync reads the slots in `steps` interleaved passes (pass `r`
/// reads the slots whose index is `r` modulo `steps`), so that every step's
/// records are spread over the whole hash range: a follower inserting them
/// into a table still small never sees a run of neighbouring hashes (which
/// would pile into one probe cluster and make each insert quadratic). A
/// snapshot reads them in order: sequential reads the prefetcher keeps
/// ahead of, several times cheaper than strided ones at millions of slots,
/// and its loader reserves room for every record before it inserts one.
///
/// Robin Hood moves records that did not change: backward-shift deletion
/// pulls a record one slot back, insertion pushes residents forward (and
/// round the end to slot 0). A record moved from a slot not yet read to one
/// already read would be missed, so every record written to a slot already
/// read is noted in `moved` for the walker to read again; growth starts the
/// walk again (the walker sees some records twice, the later read being
/// the later state).
#[derive(Debug, Default)]
struct Export {
    /// Passes in all: a power of two (1 for a walk in order).
    steps: usize,
    /// Passes done (interleaved walk).
    step: usize,
    /// The next slot to read (walk in order).
    next: usize,
    /// Whether the walk is in slot order.
    in_order: bool,
    /// Slots a step reads, about (sets `steps` at the start and after
    /// growth).
    slots_per_step: usize,
    /// Keys written to slots already read since the caller last took them.
    moved: Vec<u128>,
}

impl Export {
    fn new(len: usize, slots_per_step: usize, in_order: bool) -> Export {
        let steps = if in_order {
            1
        } else {
            len.div_ceil(slots_per_step.max(1))
                .max(1)
                .next_power_of_two()
        };
        Export {
            steps,
            step: 0,
            next: 0,
            in_order,
            slots_per_step: slots_per_step.max(1),
            moved: Vec::new(),
        }
    }

    /// Whether slot `index` has been read.
    #[inline]
    fn read(&self, index: usize) -> bool {
        if self.in_order {
            index < self.next
        } else {
            index & (self.steps - 1) < self.step
        }
    }
}

/// Key 0 marks an empty slot, so the one key hash that is 0 is stored as 1
/// (a 2^-128 chance of sharing a bucket with key 1).
#[inline]
fn tag(key: u128) -> u128 {
    key.max(1)
}

impl<V: Record> Default for BucketMap<V> {
    fn default() -> Self {
        BucketMap::with_capacity(0)
    }
}

impl<V: Record> BucketMap<V> {
    /// A map that holds `n` records before it first grows.
    pub fn with_capacity(n: usize) -> BucketMap<V> {
        let capacity = (n * 1000 / LOAD_MAX_PERMILLE + 1).max(CAPACITY_MIN);
        BucketMap {
            slots: Slots::zeroed(capacity),
            len: 0,
            cursor: 0,
            swept_total: 0,
            inserts_since_sweep: 0,
            export: [None, None],
            #[cfg(test)]
            probes: 0,
        }
    }

    /// Starts (or restarts) a walk from slot 0.
    pub fn export_start(&mut self, walk: Walk, slots_per_step: usize) {
        let in_order = walk == Walk::Snapshot;
        self.export[walk as usize] = Some(Export::new(self.slots.len(), slots_per_step, in_order));
    }

    /// Ends a walk.
    pub fn export_stop(&mut self, walk: Walk) {
        self.export[walk as usize] = None;
    }

    /// The next step of a walk: about `slots_per_step` slots into `out`.
    /// `true` when the walk has read every slot; what moves after that is
    /// still noted until [`BucketMap::export_stop`]. Call
    /// [`BucketMap::export_moved`] too, every time.
    pub fn export_step(&mut self, walk: Walk, out: &mut Vec<(u128, V)>) -> bool {
        let Some(e) = &mut self.export[walk as usize] else {
            return true;
        };
        if e.in_order {
            let end = (e.next + e.slots_per_step).min(self.slots.len());
            for slot in &self.slots[e.next..end] {
                if !slot.is_empty() {
                    out.push((slot.key(), slot.value));
                }
            }
            e.next = end;
            return e.next >= self.slots.len();
        }
        if e.step >= e.steps {
            return true;
        }
        for slot in self.slots.iter().skip(e.step).step_by(e.steps) {
            if !slot.is_empty() {
                out.push((slot.key(), slot.value));
            }
        }
        e.step += 1;
        e.step >= e.steps
    }

    /// Keys a walk would otherwise miss (moved below its cursor); the
    /// caller reads their current state.
    pub fn export_moved(&mut self, walk: Walk, out: &mut Vec<u128>) {
        if let Some(e) = &mut self.export[walk as usize] {
            out.append(&mut e.moved);
        }
    }

    /// Notes a record written at `index` for the walks (see [`Export`]).
    #[inline]
    fn note_write(&mut self, index: usize) {
        for e in self.export.iter_mut().flatten() {
            if e.read(index) {
                e.moved.push(self.slots[index].key());
            }
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Bytes the slot array occupies.
    pub fn memory_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot<V>>()
    }

    /// Records dropped by sweeps so far.
    pub fn swept_total(&self) -> u64 {
        self.swept_total
    }

    #[inline]
    fn home(&self, key: u128) -> usize {
        // The low 64 bits: the high ones chose the shard, so within a shard
        // they are not uniform.
        ((u128::from(key as u64) * self.slots.len() as u128) >> 64) as usize
    }

    /// How far the slot at `index` is from its key's home.
    #[inline]
    fn distance(&self, index: usize) -> usize {
        let home = self.home(self.slots[index].key());
        if index >= home {
            index - home
        } else {
            index + self.slots.len() - home
        }
    }

    #[inline]
    fn next(&self, index: usize) -> usize {
        if index + 1 == self.slots.len() {
            0
        } else {
            index + 1
        }
    }

    /// Starts loading `key`'s home slot, and the slots after it where the
    /// key most likely is, into the cache without waiting for them, so a
    /// caller can overlap the misses of a whole batch of lookups.
    #[inline]
    pub fn prefetch(&self, key: u128) {
        let home = (&self.slots[self.home(tag(key))] as *const Slot<V>).cast::<u8>();
        // At the load a grown table runs at (0.76 to 0.875), a key sits a
        // few slots past its home on average (Robin Hood keeps the spread
        // small, not the mean): with its home's line alone, most lookups
        // of a large table missed a second time on the line after
        // (benches/notes.md, "Prefetching past the home slot"). Addresses
        // past the array's end are never read (a prefetch cannot fault).
        for line in 0..PREFETCH_LINES {
            prefetch_read_ptr(home.wrapping_add(line * 64));
        }
    }

    /// The index of `key`'s slot, if present: valid until the map is
    /// next changed other than through [`BucketMap::value_at_mut`].
    #[inline(always)]
    pub fn find(&self, key: u128) -> Option<usize> {
        let key = tag(key);
        let (lo, hi) = (key as u64, (key >> 64) as u64);
        let mut index = self.home(key);
        let mut dist = 0;
        loop {
            let slot = &self.slots[index];
            if slot.holds(lo, hi) {
                return Some(index);
            }
            // Robin Hood: a resident closer to its home than we are to ours
            // means our key would have displaced it; it is not here.
            if slot.is_empty() || self.distance(index) < dist {
                return None;
            }
            index = self.next(index);
            dist += 1;
        }
    }

    /// The record for `key`.
    #[inline]
    pub fn get(&self, key: u128) -> Option<&V> {
        self.find(key).map(|i| &self.slots[i].value)
    }

    /// The record for `key`, to change in place.
    #[inline]
    pub fn get_mut(&mut self, key: u128) -> Option<&mut V> {
        self.find(key).map(|i| &mut self.slots[i].value)
    }

    /// The record in slot `index` (from [`BucketMap::find`]).
    #[inline]
    pub fn value_at(&self, index: usize) -> &V {
        &self.slots[index].value
    }

    /// The record in slot `index` (from [`BucketMap::find`]), to change
    /// in place.
    #[inline]
    pub fn value_at_mut(&mut self, index: usize) -> &mut V {
        &mut self.slots[index].value
    }

    /// Removes the record in slot `index` (from [`BucketMap::find`]).
    #[inline]
    pub fn remove_index(&mut self, index: usize) {
        debug_assert!(!self.slots[index].is_empty());
        self.remove_at(index);
    }

    /// Stores `value` for `key`, replacing any record it had. First sweeps a
    /// few slots, and before growing sweeps them all, at `now_ns`.
    pub fn insert(&mut self, key: u128, value: V, now_ns: u64) {
        if let Some(i) = self.find(key) {
            self.slots[i].value = value;
            return;
        }
        // A few slots per insert: buckets idle for SWEEP_IDLE_NS go as new
        // keys come, so a table that keys churn through stays well below
        // its growth threshold (Robin Hood insertion near it costs tens of
        // probes each), while a bucket in use keeps its slot.
        self.sweep_step(now_ns.saturating_sub(SWEEP_IDLE_NS), SWEEP_SLOTS_PER_INSERT);
        if (self.len + 1) * 1000 > self.slots.len() * LOAD_MAX_PERMILLE {
            self.sweep(now_ns.saturating_sub(SWEEP_IDLE_NS));
            if (self.len + 1) * 1000
                > self.slots.len() * LOAD_MAX_PERMILLE * GROWTH_DEN / GROWTH_NUM
            {
                self.grow();
            }
        }
        let run = self.place(Slot::new(tag(key), value));
        self.len += 1;
        self.inserts_since_sweep += 1;
        // The load is counted over the whole table, but the cursor drops
        // refilled buckets slot by slot: where it has not been for a while,
        // those still take their slots, and new keys arriving there can
        // fill a region completely while the table as a whole is far from
        // its ceiling. Every insertion homed there then walks the whole
        // region: a run of 42,000 slots in a 114,000-slot table at 0.63
        // load was seen (benches/notes.md), 0.2 ms an insert. A long run
        // is the sign: sweep everything now (a refilled bucket is equal
        // to none, so what is kept is exactly as before).
        if run > LONG_RUN_SLOTS
            && self.inserts_since_sweep * LONG_RUN_SWEEP_EVERY >= self.slots.len()
        {
            self.sweep(now_ns.saturating_sub(SWEEP_IDLE_NS));
        }
    }

    /// Robin Hood insertion of a key known to be absent, with room for it;
    /// returns how many occupied slots it stepped over.
    fn place(&mut self, mut moving: Slot<V>) -> usize {
        let mut index = self.home(moving.key());
        let mut dist = 0;
        let mut run = 0;
        loop {
            if self.slots[index].is_empty() {
                self.slots[index] = moving;
                self.note_write(index);
                return run;
            }
            run += 1;
            let resident = self.distance(index);
            if resident < dist {
                std::mem::swap(&mut self.slots[index], &mut moving);
                self.note_write(index);
                dist = resident;
            }
            index = self.next(index);
            dist += 1;
            #[cfg(test)]
            {
                self.probes += 1;
            }
        }
    }

    /// Removes `key`'s record.
    pub fn remove(&mut self, key: u128) -> Option<V> {
        let index = self.find(key)?;
        let value = self.slots[index].value;
        self.remove_at(index);
        Some(value)
    }

    /// Backward-shift deletion: pull each following displaced slot one
    /// step back, so no tombstone is left.
    fn remove_at(&mut self, mut index: usize) {
        loop {
            let next = self.next(index);
            if self.slots[next].is_empty() || self.distance(next) == 0 {
                self.slots[index] = Slot::default();
                break;
            }
            self.slots[index] = self.slots[next];
            self.note_write(index);
            index = next;
        }
        self.len -= 1;
    }

    /// Examines `n` slots at the cursor, dropping full records.
    pub fn sweep_step(&mut self, now_ns: u64, n: usize) {
        for _ in 0..n.min(self.slots.len()) {
            let i = self.cursor;
            let slot = self.slots[i];
            if !slot.is_empty() && slot.value.is_full(now_ns) {
                // The shift may pull an unexamined slot into `i`; look at
                // `i` again next time rather than skip it.
                self.remove_at(i);
                self.swept_total += 1;
            } else {
                self.cursor = self.next(i);
            }
        }
    }

    /// Drops every full record.
    pub fn sweep(&mut self, now_ns: u64) {
        self.inserts_since_sweep = 0;
        let mut i = 0;
        while i < self.slots.len() {
            let slot = self.slots[i];
            if !slot.is_empty() && slot.value.is_full(now_ns) {
                self.remove_at(i);
                self.swept_total += 1;
                // A slot shifted into `i`: examine it too.
            } else {
                i += 1;
            }
        }
    }

    /// Makes room for `additional` more records in one step (a follower
    /// about to import a full sync), so that inserting them never grows the
    /// table.
    pub fn reserve(&mut self, additional: usize) {
        let want = self.len.saturating_add(additional);
        if want * 1000 <= self.slots.len() * LOAD_MAX_PERMILLE {
            return;
        }
        self.resize(want * 1000 / LOAD_MAX_PERMILLE + 1);
    }

    fn grow(&mut self) {
        self.resize(self.slots.len() * GROWTH_NUM / GROWTH_DEN + 1);
    }

    fn resize(&mut self, capacity: usize) {
        let mut slots = Slots::zeroed(capacity);
        // Fault the new array's pages in, in order, before the rehash
        // writes them at random: the rehash touches every page anyway (the
        // records fill three quarters of the slots, uniformly), and in
        // order the kernel faults them far faster. Growing 8.7M buckets
        // to 10M took 230 ms without this (page faults inside the
        // rehash), 73 + 105 ms with it; the shard serves no one meanwhile.
        // (`black_box`: a zero stored into memory known to be zeroed is a
        // store the compiler may drop.)
        let per_page = (4096 / std::mem::size_of::<Slot<V>>()).max(1);
        for i in (0..slots.len()).step_by(per_page) {
            slots[i] = std::hint::black_box(Slot::default());
        }
        let old = std::mem::replace(&mut self.slots, slots);
        self.cursor = 0;
        for e in self.export.iter_mut().flatten() {
            // Every record moves: read them all again.
            *e = Export::new(capacity, e.slots_per_step, e.in_order);
        }
        for slot in old.iter() {
            if !slot.is_empty() {
                self.place(*slot);
            }
        }
        // `old`'s pages go back to the kernel here.
    }

    /// Every `(key, record)`, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u128, &V)> {
        self.slots
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| (s.key(), &s.value))
    }
}

/// A table's slots in anonymous pages mapped for it alone: zeroed by the
/// kernel, so a new table writes nothing before use, and unmapped when the
/// table grows past them or goes, whatever the process's allocator keeps
/// for itself. (jemalloc keeps a freed extent until its decay purges it,
/// and an idle process never does: a table grown to 1M buckets held 75
/// bytes a bucket of RSS from its freed predecessors, against 31 in pages
/// of its own. benches/notes.md.)
struct Slots<V> {
    /// At least one byte (a mapping cannot be empty), so that a slot's
    /// access is one pointer and no branch.
    map: memmap2::MmapMut,
    len: usize,
    _slot: std::marker::PhantomData<Slot<V>>,
}

impl<V: Record> Slots<V>
where
    // What makes a zeroed mapping `n` valid slots (see the SAFETY below).
    Slot<V>: bytemuck::Zeroable,
{
    /// `n` empty slots (an all-zero slot is empty: key 0). A mapping the kernel refuses is out of memory, as
    /// a refused allocation is: the process ends (no table can be half
    /// grown).
    fn zeroed(n: usize) -> Slots<V> {
        let bytes = n
            .checked_mul(std::mem::size_of::<Slot<V>>())
            .expect("a table's size fits the address space");
        let map = memmap2::MmapOptions::new()
            .len(bytes.max(1))
            .map_anon()
            .unwrap_or_else(|e| panic!("mapping {bytes} bytes for {n} table slots: {e}"));
        Slots {
            map,
            len: n,
            _slot: std::marker::PhantomData,
        }
    }
}

impl<V> std::fmt::Debug for Slots<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots").field("len", &self.len).finish()
    }
}

// SAFETY (both impls): the mapping is page-aligned, which is more than a
// slot's alignment, and at least `len * size_of::<Slot<V>>()` bytes long
// (`zeroed`);
// the kernel zeroed it and an all-zero `Slot<V>` is a valid (empty) slot
// (`Slot<V>: Zeroable`); it is written only through these slices, so it
// holds `len` valid slots; and the slices borrow `self`, which owns the
// mapping, so they cannot outlive it.
#[allow(unsafe_code)]
impl<V: Record> std::ops::Deref for Slots<V> {
    type Target = [Slot<V>];

    #[inline]
    fn deref(&self) -> &[Slot<V>] {
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<Slot<V>>(), self.len) }
    }
}

#[allow(unsafe_code)]
impl<V: Record> std::ops::DerefMut for Slots<V> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [Slot<V>] {
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<Slot<V>>(), self.len) }
    }
}

/// Asks the CPU to start loading the cache line of `p`, valid or not (it
/// is never read). A hint only: it never faults, blocks or changes anything
/// a program can observe. Public for benches/'s loopback floor, which
/// prefetches its own array the way the shard does.
#[inline(always)]
#[allow(unsafe_code)]
pub fn prefetch_read_ptr(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 has no architectural effect and cannot fault, for
    // any address; SSE, which it needs, is part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    /// A record that is full once `now` passes its deadline.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
    struct Until(u64);

    impl Record for Until {
        fn is_full(&self, now_ns: u64) -> bool {
            self.0 <= now_ns
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16, u64),
        Remove(u16),
        Sweep,
        Step(u8),
    }

    fn ops() -> impl Strategy<Value = Vec<(Op, u64)>> {
        let op = prop_oneof![
            6 => (any::<u16>(), 0u64..100).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => any::<u16>().prop_map(Op::Remove),
            1 => Just(Op::Sweep),
            1 => any::<u8>().prop_map(Op::Step),
        ];
        prop::collection::vec((op, 0u64..3), 1..2_000)
    }

    /// Keys that collide on purpose: few distinct low bits.
    fn key(k: u16) -> u128 {
        (u128::from(k) << 64) | u128::from(k % 97)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The table agrees with a HashMap model after any operations,
        /// where sweeps may drop exactly the records that are full.
        #[test]
        fn agrees_with_a_model(seq in ops()) {
            let mut map = BucketMap::<Until>::default();
            let mut model: HashMap<u128, Until> = HashMap::new();
            let mut now = 0u64;
            for (op, tick) in seq {
                now += tick;
                match op {
                    Op::Insert(k, v) => {
                        map.insert(key(k), Until(now + v), now);
                        model.insert(key(k), Until(now + v));
                    }
                    Op::Remove(k) => prop_assert_eq!(map.remove(key(k)), model.remove(&key(k))),
                    Op::Sweep => map.sweep(now),
                    Op::Step(n) => map.sweep_step(now, usize::from(n)),
                }
                // Sweeps may only have dropped full records.
                model.retain(|k, v| map.get(*k).is_some() || { assert!(v.is_full(now), "a live record vanished"); false });
                prop_assert_eq!(map.len(), model.len());
                for (k, v) in &model {
                    prop_assert_eq!(map.get(*k), Some(v));
                }
                prop_assert!(map.len() * 1000 <= map.capacity() * LOAD_MAX_PERMILLE);
            }
            prop_assert_eq!(map.iter().count(), model.len());
        }

        /// A walk of either kind, with the keys it is told moved, has seen
        /// every key the map holds when the walk ends, whatever the map did
        /// meanwhile (inserts that shift residents round the end, removals
        /// that pull them back, sweeps, growth); both walks at once. (After
        /// its end a walk owes nothing: a full sync sends later writes as
        /// changes, a snapshot is of the buckets up to its end.)
        #[test]
        fn walks_miss_no_key(seq in ops(), every in 1usize..8, per_step in 1usize..64) {
            let mut map = BucketMap::<Until>::default();
            let mut now = 0u64;
            // Something to walk over before the walks start.
            for k in 0..200u16 {
                map.insert(key(k), Until(u64::MAX), now);
            }
            let walks = [Walk::Sync, Walk::Snapshot];
            for w in walks {
                map.export_start(w, per_step);
            }
            let mut seen: [HashSet<u128>; 2] = Default::default();
            let mut done = [false; 2];
            let mut ops = seq.into_iter();
            let mut i = 0usize;
            while !done.iter().all(|d| *d) {
                // A few operations (none once they run out), then a step of
                // each walk not done.
                for (op, tick) in ops.by_ref().take(every) {
                    now += tick;
                    match op {
                        Op::Insert(k, v) => map.insert(key(k), Until(now + v), now),
                        Op::Remove(k) => {
                            map.remove(key(k));
                        }
                        Op::Sweep => map.sweep(now),
                        Op::Step(n) => map.sweep_step(now, usize::from(n)),
                    }
                }
                for (w, walk) in walks.into_iter().enumerate() {
                    if done[w] {
                        continue;
                    }
                    let mut out = Vec::new();
                    done[w] = map.export_step(walk, &mut out);
                    let mut moved = Vec::new();
                    map.export_moved(walk, &mut moved);
                    seen[w].extend(out.iter().map(|(k, _)| *k).chain(moved));
                    if done[w] {
                        for (k, _) in map.iter() {
                            prop_assert!(seen[w].contains(&k), "{:?} walk missed key {:#x}", walk, k);
                        }
                    }
                }
                i += 1;
                prop_assert!(i < 1_000_000, "the walks never end");
            }
        }
    }

    /// Refilled buckets where the sweep cursor has not been yet, and new
    /// keys arriving among them, must not fill a region of the table while
    /// the whole stays below its ceiling: no insertion walks a run much
    /// longer than [`LONG_RUN_SLOTS`]. (Without the sweep a long run
    /// triggers, one walked 62,501 slots here.)
    #[test]
    fn refilled_buckets_ahead_of_the_cursor_do_not_pile_new_keys_into_one_run() {
        const S: u64 = 1_000_000_000;
        let mut map: BucketMap<Until> = BucketMap::with_capacity(100_000);
        let cap = map.capacity();
        let mut x = 0x243f_6a88_85a3_08d3_1319_8a2e_0370_7344u128;
        let mut next_key = || {
            x = x.wrapping_mul(0x2d99_7879_26d4_6932_a4c1_f326_80f4_1a8d) ^ (x >> 61);
            x | 1
        };
        // Old buckets at 0.8 of capacity, all full from t = 1 ns on.
        for _ in 0..cap * 8 / 10 {
            map.insert(next_key(), Until(1), 0);
        }
        assert_eq!(map.capacity(), cap, "the fill did not grow the table");
        // Three seconds later they are refilled and idle; new keys come.
        let (mut longest, mut total) = (0u64, 0u64);
        for _ in 0..cap * 23 / 100 {
            let before = map.probes;
            map.insert(next_key(), Until(u64::MAX), 3 * S);
            longest = longest.max(map.probes - before);
            total += map.probes - before;
        }
        assert!(
            longest < 2 * LONG_RUN_SLOTS as u64,
            "an insertion walked {longest} slots (capacity {cap}, {} in use)",
            map.len()
        );
        assert!(
            total / (cap as u64 * 23 / 100) < 64,
            "{total} slots walked in all"
        );
    }

    #[test]
    fn grows_by_the_factor_and_keeps_everything() {
        let mut map = BucketMap::<Until>::default();
        for k in 1..=100_000u128 {
            map.insert(
                k.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834),
                Until(u64::MAX),
                0,
            );
        }
        assert_eq!(map.len(), 100_000);
        let load = map.len() as f64 / map.capacity() as f64;
        assert!((0.76..=0.875).contains(&load), "load {load}");
        for k in 1..=100_000u128 {
            assert!(map
                .get(k.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834))
                .is_some());
        }
        assert_eq!(
            std::mem::size_of::<Slot<u64>>(),
            24,
            "a token bucket's slot (a 64-bit TAT) is 24 bytes"
        );
    }

    #[test]
    fn full_records_are_swept_instead_of_growing() {
        let mut map = BucketMap::<Until>::default();
        // A new key every 10 ms, each full 10 ms after it is written: at
        // any time about a hundred have been full for less than
        // SWEEP_IDLE_NS (kept, as keys that may come back), the rest are
        // dropped instead of growing the table.
        let tick = 10_000_000u64;
        for t in 0..200_000u64 {
            let key = u128::from(t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834);
            map.insert(key, Until((t + 1) * tick), t * tick);
        }
        assert!(
            map.capacity() < 1_000,
            "capacity {} for a hundred or so recent records",
            map.capacity()
        );
        assert!(map.swept_total() > 199_000);
    }

    /// The longest distance of any record from its home slot.
    fn max_distance<V: Record>(map: &BucketMap<V>) -> usize {
        (0..map.slots.len())
            .filter(|&i| !map.slots[i].is_empty())
            .map(|i| map.distance(i))
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn records_copied_in_slot_order_stay_near_home_after_a_reserve() {
        // A snapshot or a full sync hands records over in the writer's slot
        // order, that is by home position. Inserted that way into a map
        // that grows as it goes, they pile up into one long run (a restart
        // with 100k buckets took 11 s to load). With room reserved first,
        // as the loaders do, every record stays near its home.
        let mut from = BucketMap::<Until>::default();
        for k in 1..=100_000u64 {
            let key = u128::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834);
            from.insert(key, Until(u64::MAX), 0);
        }
        let mut to = BucketMap::<Until>::default();
        to.reserve(from.len());
        for (key, value) in from.iter() {
            to.insert(key, *value, 0);
        }
        assert_eq!(to.len(), 100_000);
        let far = max_distance(&to);
        assert!(far < 64, "a record {far} slots from home");
        // And getting there was linear: a few probes per record, not a
        // walk along a run that grows with every insert.
        assert!(
            to.probes < 10 * 100_000,
            "{} probes to insert 100k records",
            to.probes
        );
    }

    #[test]
    fn a_refilled_record_in_use_keeps_its_slot() {
        // A thousand keys visited in turn, each full again before its next
        // visit (a client under its limit): once the table holds them all,
        // visits find them in place, nothing is swept or inserted again.
        let mut map = BucketMap::<Until>::default();
        let key =
            |k: u64| u128::from(k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834);
        let mut now = 0u64;
        for round in 0..50u64 {
            for k in 0..1_000u64 {
                now += 1_000;
                if round > 0 {
                    assert!(
                        map.get(key(k)).is_some(),
                        "round {round}: key {k} was dropped"
                    );
                }
                map.insert(key(k), Until(now + 1), now);
            }
        }
        assert_eq!(map.swept_total(), 0);
        assert_eq!(map.len(), 1_000);
    }

    #[test]
    fn key_zero_is_stored() {
        let mut map = BucketMap::<Until>::default();
        map.insert(0, Until(5), 0);
        assert_eq!(map.get(0), Some(&Until(5)));
        assert_eq!(map.remove(0), Some(Until(5)));
        assert!(map.is_empty());
    }
}
