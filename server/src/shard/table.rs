//! A shard's buckets, one table per limit kind, keyed by 128-bit bucket
//! keys (`protocol::identity`). Only the owning shard thread touches them.
//!
//! - Token buckets (protocol v1 THROTTLE, DECIDE's token-bucket limits and
//!   redis-cell's CL.THROTTLE share them: one TAT per key, each protocol
//!   with its own arithmetic), fixed windows and sliding counters are
//!   fixed-size records in [`BucketMap`]s.
//! - Sliding logs and concurrency leases own a bounded heap buffer each
//!   (at most `limit` entries) and live in hashbrown maps.
//!
//! Memory stays bounded by the buckets that are *not* full: a decision that
//! leaves a bucket full removes it, sweeps drop the ones that refill on
//! their own, and `keys_max` caps the buckets of one shard. At the cap a
//! new bucket first evicts every full one (counted in `evicted_total`); if
//! none is full the request is refused with KEYS_FULL (counted in
//! `refused_total`) rather than evicting a partly spent bucket, which would
//! hand that client a free burst.

use hashbrown::HashMap;
use sluice_protocol::cell::{self, CellPolicy, CellVerdict};
use sluice_protocol::gcra::{self, Bucket, Verdict};
use sluice_protocol::limit::concurrency::{self, ConcurrencyState};
use sluice_protocol::limit::fixed_window::FixedWindowState;
use sluice_protocol::limit::kinds::{self, LimitKind};
use sluice_protocol::limit::sliding_counter::SlidingCounterState;
use sluice_protocol::limit::sliding_log::SlidingLogState;
use sluice_protocol::limit::{Concurrency, Decision, Kind, Limit, Window};
pub use sluice_protocol::message::{LimitVerdict, Mode};
use sluice_protocol::priority::{self, Priority};
use sluice_protocol::replication::{State, SyncWriter};
use sluice_protocol::{Policy, Status};

pub use super::bucket_map::Walk;
use super::bucket_map::{BucketMap, Record, SWEEP_IDLE_NS, SWEEP_SLOTS_PER_TICK};
use super::changes::Changes;
use super::fold::FoldState;
use super::over_limit::{self, OverLimit};
use super::tat::{Found, TokenBuckets};
use super::{DecideOp, Op, Outcome};
use crate::sync::Arc;

pub use sluice_protocol::message::LIMITS_MAX;

/// How many records ahead of the one being imported
/// [`Table::apply_records`] loads a slot into cache.
const PREFETCH_AHEAD: usize = 16;

/// A follower's records for another shard of its layout, from
/// [`Table::apply_records`]: every kind's but token buckets', and token
/// buckets' (`None`: absent), each in stream order.
pub type ForeignRecords = (
    Vec<sluice_protocol::replication::Record>,
    Vec<(u128, Option<Bucket>)>,
);

/// The one match from a [`Limit`] to its kind's type: runs `body` with `K`
/// the kind's [`LimitKind`] (and [`Stored`]) type and `n` its numbers, so
/// each arm is `body` monomorphised for one kind (no `dyn`, and no match on
/// the kind inside it).
macro_rules! by_limit {
    ($limit:expr, |$k:ident, $n:ident| $body:expr) => {
        match $limit {
            Limit::TokenBucket($n) => {
                type $k = kinds::TokenBucket;
                $body
            }
            Limit::FixedWindow($n) => {
                type $k = kinds::FixedWindow;
                $body
            }
            Limit::SlidingLog($n) => {
                type $k = kinds::SlidingLog;
                $body
            }
            Limit::SlidingCounter($n) => {
                type $k = kinds::SlidingCounter;
                $body
            }
            Limit::Concurrency($n) => {
                type $k = kinds::Concurrency;
                $body
            }
        }
    };
}

/// [`by_limit!`] from a [`Kind`] alone (replication and snapshots name a
/// bucket's kind, not its numbers).
macro_rules! by_kind {
    ($kind:expr, |$k:ident| $body:expr) => {
        match $kind {
            Kind::TokenBucket => {
                type $k = kinds::TokenBucket;
                $body
            }
            Kind::FixedWindow => {
                type $k = kinds::FixedWindow;
                $body
            }
            Kind::SlidingLog => {
                type $k = kinds::SlidingLog;
                $body
            }
            Kind::SlidingCounter => {
                type $k = kinds::SlidingCounter;
                $body
            }
            Kind::Concurrency => {
                type $k = kinds::Concurrency;
                $body
            }
        }
    };
}

/// Slots each fixed-size table examines for full buckets when a new bucket
/// meets `keys_max`: the cap costs bounded work per request, never a pass
/// over the whole table.
pub const EVICT_SCAN_SLOTS: usize = 1024;

/// Where shard `shard`'s lease ids start in epoch `epoch`: ids are unique
/// per (epoch, shard), 2^32 of them each, so a follower promoted to a new
/// epoch never hands out an id its old primary gave (the ids of leases it
/// received still work: they are in the replicated state). Epochs wrap
/// after 2^16 promotions.
pub fn lease_id_base(epoch: u64, shard: u16) -> u64 {
    ((epoch & 0xffff) << 48) | (u64::from(shard) << 32)
}

/// How often a shard sweeps its sliding logs and lease lists.
pub const HEAP_SWEEP_MS: u64 = 1_000;

/// A window kind's state with the window length it was last used with, so
/// that a sweep can tell when it has aged out without its policy.
#[derive(Clone, Copy, Debug, Default, bytemuck::Zeroable)]
pub struct Windowed<S> {
    /// The kind's state.
    state: S,
    /// The window it was last decided under.
    window_ns: u64,
}

impl<S> Windowed<S> {
    fn window(&self) -> Window {
        Window {
            limit: u64::MAX,
            window_ns: self.window_ns.max(1),
        }
    }
}

/// All-zero is a valid (empty) window.
impl Record for Windowed<FixedWindowState> {
    fn is_full(&self, now_ns: u64) -> bool {
        self.state.is_full(&self.window(), now_ns)
    }
}

/// All-zero is a valid (empty) counter.
impl Record for Windowed<SlidingCounterState> {
    fn is_full(&self, now_ns: u64) -> bool {
        self.state.is_full(&self.window(), now_ns)
    }
}

/// One limit of a request as the owning shard applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitRef {
    /// Its bucket (`protocol::identity::bucket_key`).
    pub bucket: u128,
    /// Its numbers.
    pub limit: Limit,
    /// The units the request's class must leave untouched (its reserves'
    /// floor, `sluice_protocol::priority`); 0 without reserves.
    pub floor: u64,
}

/// A verdict slot not in use.
pub const NO_VERDICT: LimitVerdict = LimitVerdict {
    kind: Kind::TokenBucket,
    verdict: Verdict {
        allowed: false,
        limit: 0,
        remaining: 0,
        retry_after_ns: 0,
        reset_after_ns: 0,
    },
    lease_id: 0,
};

/// The answer to a DECIDE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiVerdict {
    /// Whether every limit admitted (for Spend: and was applied).
    pub allowed: bool,
    /// The first limit that denied.
    pub denied_index: Option<u8>,
    /// When every limit would admit: the largest retry_after; 0 if allowed.
    pub retry_after_ns: u64,
    /// Verdicts in use.
    pub count: u8,
    /// One verdict per limit, in request order.
    pub verdicts: [LimitVerdict; LIMITS_MAX],
    /// The class the verdicts are for.
    pub priority: Priority,
}

impl MultiVerdict {
    /// The verdicts in use.
    pub fn verdicts(&self) -> &[LimitVerdict] {
        &self.verdicts[..usize::from(self.count)]
    }
}

/// Counters a shard publishes for STATS and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests admitted.
    pub allowed_total: u64,
    /// Requests denied.
    pub denied_total: u64,
    /// Full buckets dropped because the shard was at `keys_max`.
    pub evicted_total: u64,
    /// New buckets refused (KEYS_FULL) because none could be evicted.
    pub refused_total: u64,
    /// Spend verdicts by limit kind (`Kind` code - 1) and result (0
    /// denied, 1 allowed): a composite counts one per limit.
    pub by_kind: [[u64; 2]; 5],
}

/// The buckets of one shard.
#[derive(Debug, Default)]
pub struct Table {
    /// Token buckets (GCRA TAT), shared by v1, DECIDE and CL.THROTTLE.
    buckets: TokenBuckets,
    /// Fixed windows.
    fixed: BucketMap<Windowed<FixedWindowState>>,
    /// Sliding window counters.
    counters: BucketMap<Windowed<SlidingCounterState>>,
    /// Sliding logs (each at most `limit` runs).
    logs: HashMap<u128, (SlidingLogState, u64), FoldState>,
    /// Concurrency leases (each at most `limit` leases).
    leases: HashMap<u128, ConcurrencyState, FoldState>,
    /// Most buckets in all; 0 = no cap.
    keys_max: usize,
    /// Most bytes the sliding logs and lease lists may hold together; 0 =
    /// no cap. `keys_max` bounds how many buckets there are; this bounds
    /// what the variable-size ones weigh (a sliding log of a large limit
    /// can hold up to a MiB).
    heap_bytes_max: usize,
    /// The next lease id this shard hands out (ids are unique per shard).
    next_lease_id: u64,
    /// Heap bytes owned by the logs and lease lists, kept up to date as
    /// they are stored and dropped (so reading it is O(1)).
    heap_bytes: usize,
    /// Decisions, evictions and refusals so far.
    pub counters_total: Counters,
    /// Buckets written since replication last took them: the one write
    /// hook (see [`Table::changed`]). `None` while no follower is attached,
    /// so a node without one tracks nothing. Keyed by the bucket key alone
    /// (kind in the value): bucket keys of different kinds differ
    /// (`protocol::identity` mixes the kind in).
    changes: Option<Changes>,
    /// Its fixed windows over their limit, published for other threads
    /// (`over_limit.rs`); `None`: nothing is published.
    over_limit: Option<Arc<OverLimit>>,
}

impl Table {
    /// An empty table with no cap.
    pub fn new() -> Table {
        Table::default()
    }

    /// An empty table holding at most `keys_max` buckets (0 = no cap);
    /// lease ids start above `lease_id_base`.
    pub fn with_cap(keys_max: usize, lease_id_base: u64) -> Table {
        Table {
            keys_max,
            next_lease_id: lease_id_base,
            ..Table::default()
        }
    }

    /// Caps the bytes of the sliding logs and lease lists (0: none): a spend
    /// that would add to them at the cap, once the expired entries are
    /// swept, is refused with KEYS_FULL and changes nothing.
    pub fn set_heap_bytes_max(&mut self, max: usize) {
        self.heap_bytes_max = max;
    }

    /// Lease ids from now on start above `base` (see [`lease_id_base`]):
    /// a promoted follower moves to its new epoch's range, so it never
    /// hands out an id its old primary may have given.
    pub fn set_lease_id_base(&mut self, base: u64) {
        self.next_lease_id = base;
    }

    /// Publishes this table's fixed windows that are over their limit in
    /// `over_limit` (the shard's own: this table is its only writer).
    pub fn publish_over_limit(&mut self, over_limit: Arc<OverLimit>) {
        over_limit.clear();
        self.over_limit = Some(over_limit);
    }

    /// Removes `bucket`'s published over-limit entry, before a write that
    /// could make room on it.
    #[inline]
    fn unpublish(&self, kind: Kind, bucket: u128) {
        if kind == Kind::FixedWindow {
            if let Some(o) = &self.over_limit {
                o.unpublish(bucket);
            }
        }
    }

    /// After a spend denied by `r`: publishes its window if it is a fixed
    /// one (of the default class) with nothing left.
    fn publish_denied(&self, r: &LimitRef, verdict: &Verdict, now_ns: u64) {
        let (Some(o), Limit::FixedWindow(w)) = (&self.over_limit, &r.limit) else {
            return;
        };
        if verdict.allowed || verdict.remaining > 0 || r.floor != 0 {
            return;
        }
        let Some(stored) = self.fixed.get(r.bucket) else {
            return;
        };
        let state = stored.state;
        if state.count >= w.limit && !state.is_full(w, now_ns) {
            let entry = over_limit::Entry {
                window_start_ns: state.window_start_ns,
                count: state.count,
            };
            o.publish(r.bucket, w.limit, w.window_ns, entry);
        }
    }

    /// Starts recording every written bucket (a follower attached).
    pub fn track_changes(&mut self) {
        self.changes.get_or_insert_with(Changes::default);
    }

    /// Stops recording (no follower any more) and forgets what was recorded.
    pub fn untrack_changes(&mut self) {
        self.changes = None;
    }

    /// Whether changes are recorded and some are waiting.
    #[inline]
    pub fn has_changes(&self) -> bool {
        self.changes.as_ref().is_some_and(|c| !c.is_empty())
    }

    /// Change entries waiting for the next drain (a key may have more
    /// than one).
    #[inline]
    pub fn changes_len(&self) -> usize {
        self.changes.as_ref().map_or(0, Changes::len)
    }

    /// The one write hook: every write to a bucket of any kind (decisions,
    /// refunds, resets, lease acquire/release/renew, imports excepted)
    /// records the bucket here, after the write, so replication ships its
    /// latest state. A fixed-size record's state is copied now, while its
    /// slot is in cache (reading it again at the drain would be a second
    /// cache miss per decision); a log's or lease list's is read at the
    /// drain. Sweeps and evictions do not call it: they only drop buckets
    /// that are full, and a full bucket is the same as an absent one on the
    /// follower too (same state, same clock basis), whose own sweeps drop it.
    #[inline]
    fn changed(&mut self, kind: Kind, bucket: u128) {
        let Some(c) = &mut self.changes else {
            return;
        };
        match kind {
            Kind::TokenBucket => c.bucket(bucket, self.buckets.get_latest(bucket)),
            Kind::FixedWindow => {
                let state = self.fixed.get(bucket).map(|w| State::FixedWindow {
                    window_ns: w.window_ns,
                    state: w.state,
                });
                c.fixed(kind, bucket, state.as_ref());
            }
            Kind::SlidingCounter => {
                let state = self.counters.get(bucket).map(|w| State::SlidingCounter {
                    window_ns: w.window_ns,
                    state: w.state,
                });
                c.fixed(kind, bucket, state.as_ref());
            }
            Kind::SlidingLog | Kind::Concurrency => c.read(bucket, kind),
        }
    }

    /// [`Table::changed`] for a token bucket whose new state the caller
    /// holds (`None`: removed): the hot path's write, without looking the
    /// slot up again.
    #[inline]
    fn changed_bucket(&mut self, bucket: u128, state: Option<Bucket>) {
        if let Some(c) = &mut self.changes {
            c.bucket(bucket, state);
        }
    }

    /// Whether changes are being recorded.
    pub fn tracking(&self) -> bool {
        self.changes.is_some()
    }

    /// Starts a walk over every bucket (a full sync: changes are recorded
    /// from now on too); each fixed-size table starts a walk over its
    /// slots.
    pub fn export_start(&mut self, walk: Walk, slots_per_step: usize) {
        if walk == Walk::Sync {
            self.track_changes();
        }
        self.buckets.export_start(walk, slots_per_step);
        self.fixed.export_start(walk, slots_per_step);
        self.counters.export_start(walk, slots_per_step);
    }

    /// Ends a walk (done or abandoned).
    pub fn export_stop(&mut self, walk: Walk) {
        self.buckets.export_stop(walk);
        self.fixed.export_stop(walk);
        self.counters.export_stop(walk);
    }

    /// The keys a walk would miss, moved by the table below its cursors
    /// since the last call (see `BucketMap`): the walker reads them again.
    /// A full sync's come through [`Table::drain_changes`] (with the writes).
    pub fn export_moved(&mut self, walk: Walk, out: &mut Vec<(u128, Kind)>) {
        let mut moved = Vec::new();
        for (map, kind) in [
            (&mut self.buckets as &mut dyn ExportMoved, Kind::TokenBucket),
            (&mut self.fixed, Kind::FixedWindow),
            (&mut self.counters, Kind::SlidingCounter),
        ] {
            moved.clear();
            map.moved(walk, &mut moved);
            out.extend(moved.iter().map(|&k| (k, kind)));
        }
    }

    /// The sliding logs' and lease lists' keys, for a walk (these
    /// tables are small next to the fixed-size ones, so they are listed
    /// at once; each key's state is read when it is sent).
    pub fn heap_keys(&self) -> Vec<(u128, Kind)> {
        let logs = self.logs.keys().map(|&k| (k, Kind::SlidingLog));
        let leases = self.leases.keys().map(|&k| (k, Kind::Concurrency));
        logs.chain(leases).collect()
    }

    /// One step of a walk: up to `slots` slots of the first map not done,
    /// or as many keys of `heap_keys`, with their states, into `out`.
    /// `true` once everything has been read.
    pub fn export_step(
        &mut self,
        walk: Walk,
        slots: usize,
        heap_keys: &mut Vec<(u128, Kind)>,
        out: &mut Vec<(u128, Kind, Option<State>)>,
    ) -> bool {
        let mut fixed = Vec::new();
        if !self.buckets.export_step(walk, &mut fixed) {
            out.extend(
                fixed
                    .iter()
                    .map(|&(k, b)| (k, Kind::TokenBucket, Some(State::TokenBucket(b)))),
            );
            return false;
        }
        out.extend(
            fixed
                .iter()
                .map(|&(k, b)| (k, Kind::TokenBucket, Some(State::TokenBucket(b)))),
        );
        let mut windows = Vec::new();
        let done = self.fixed.export_step(walk, &mut windows);
        out.extend(windows.iter().map(|&(k, w)| {
            let state = State::FixedWindow {
                window_ns: w.window_ns,
                state: w.state,
            };
            (k, Kind::FixedWindow, Some(state))
        }));
        if !done {
            return false;
        }
        let mut counters = Vec::new();
        let done = self.counters.export_step(walk, &mut counters);
        out.extend(counters.iter().map(|&(k, w)| {
            let state = State::SlidingCounter {
                window_ns: w.window_ns,
                state: w.state,
            };
            (k, Kind::SlidingCounter, Some(state))
        }));
        if !done {
            return false;
        }
        let take = heap_keys.len().min(slots / 8 + 1);
        for (k, kind) in heap_keys.drain(heap_keys.len() - take..) {
            if let Some(state) = self.export(kind, k) {
                out.push((k, kind, Some(state)));
            }
        }
        heap_keys.is_empty()
    }

    /// Takes the buckets written since the last call, each with its state
    /// now (`None`: gone), in write order: a bucket may come more than
    /// once, its latest state last (see `changes`). A hot key's many
    /// writes are one entry: this is where its decisions coalesce. Records
    /// a full sync's walk would miss (moved by the table, see `BucketMap`)
    /// are included. Decodes what [`Table::drain_changes`] encodes.
    #[cfg(test)]
    pub fn take_changes(&mut self, out: &mut Vec<(u128, Kind, Option<State>)>) {
        let mut sw = SyncWriter::new();
        self.drain_changes(&mut sw);
        let records = sw.into_records().expect("the drain's records decode");
        out.extend(records.into_iter().map(|r| (r.key, r.kind, r.state)));
    }

    /// Encodes the buckets written since the last drain into `sw`, after
    /// what it holds, each with its latest state last (see
    /// [`Table::take_changes`]): the fixed-size ones as they were encoded
    /// at the write, then those read now (logs, lease lists, and the
    /// records a full sync's walk would miss).
    #[inline]
    pub fn drain_changes(&mut self, sw: &mut SyncWriter) {
        if self.changes.is_none() {
            return;
        }
        let mut moved = Vec::new();
        self.export_moved(Walk::Sync, &mut moved);
        let Some(changes) = self.changes.as_mut() else {
            return;
        };
        for (key, kind) in moved {
            changes.read(key, kind);
        }
        sw.append(changes.take_encoded());
        // Taken out while it drains (reading the tables), then given back
        // for its allocation.
        let reads = changes.take_reads();
        for &(key, kind) in &reads {
            sw.push(kind, key, self.export(kind, key).as_ref());
        }
        if let Some(c) = self.changes.as_mut() {
            c.restore_reads(reads);
        }
    }

    /// A bucket's state, as replication and snapshots carry it.
    pub fn export(&self, kind: Kind, bucket: u128) -> Option<State> {
        by_kind!(kind, |K| K::export(self, bucket))
    }

    /// Every bucket key of every kind, for a full sync.
    pub fn keys(&self) -> Vec<(u128, Kind)> {
        let mut out = Vec::with_capacity(self.len());
        out.extend(self.buckets.keys().map(|k| (k, Kind::TokenBucket)));
        out.extend(self.fixed.iter().map(|(k, _)| (k, Kind::FixedWindow)));
        out.extend(self.counters.iter().map(|(k, _)| (k, Kind::SlidingCounter)));
        out.extend(self.logs.keys().map(|&k| (k, Kind::SlidingLog)));
        out.extend(self.leases.keys().map(|&k| (k, Kind::Concurrency)));
        out
    }

    /// Stores a bucket's state as its primary sent it (`None`: drops it).
    /// Not a decision: no counter moves, no cap applies (the primary
    /// already admitted it), nothing is recorded as changed.
    pub fn import(&mut self, bucket: u128, kind: Kind, state: Option<State>, now_ns: u64) {
        let Some(state) = state else {
            return self.drop_bucket(kind, bucket);
        };
        if let Err(state) = by_kind!(kind, |K| K::import(self, bucket, state, now_ns)) {
            debug_assert!(false, "a {kind:?} bucket with a {:?} state", state.kind());
        }
    }

    /// [`Table::import`] of a token bucket's record (`None`: absent), the
    /// follower's shorter path for the common kind.
    #[inline]
    pub fn import_bucket(&mut self, bucket: u128, state: Option<Bucket>, now_ns: u64) {
        match state {
            Some(b) => self.buckets.set(bucket, Some(b), now_ns),
            None => self.drop_bucket(Kind::TokenBucket, bucket),
        }
    }

    /// Applies a follower's records, as its flow parsed them from SYNCs:
    /// `records` (every kind but token buckets) then `buckets` (token
    /// buckets, `None`: absent), each in stream order (each kind has its
    /// own table, so the two lists' order between them does not matter).
    /// A record whose key `owner` names another shard of the follower's
    /// layout goes, in order, to that shard's lists in `others`; the rest
    /// are imported here, each slot loaded into cache
    /// [`PREFETCH_AHEAD`] records ahead so that a batch's cache misses
    /// overlap. Both lists are left empty, their room kept. The one place
    /// a follower's records are applied: by the flow on its own shard and
    /// by a shard given another flow's (`worker.rs`).
    pub fn apply_records(
        &mut self,
        records: &mut Vec<sluice_protocol::replication::Record>,
        buckets: &mut Vec<(u128, Option<Bucket>)>,
        now_ns: u64,
        owner: impl Fn(u128) -> Option<usize>,
        others: &mut [ForeignRecords],
    ) {
        let mut batch = records.drain(..);
        loop {
            if let Some(ahead) = batch.as_slice().get(PREFETCH_AHEAD) {
                if owner(ahead.key).is_none() {
                    self.prefetch_kind(ahead.kind, ahead.key);
                }
            }
            let Some(r) = batch.next() else { break };
            match owner(r.key) {
                None => self.import(r.key, r.kind, r.state, now_ns),
                Some(o) => others[o].0.push(r),
            }
        }
        drop(batch);
        let mut batch = buckets.drain(..);
        loop {
            if let Some(&(key, _)) = batch.as_slice().get(PREFETCH_AHEAD) {
                if owner(key).is_none() {
                    self.prefetch_kind(Kind::TokenBucket, key);
                }
            }
            let Some((key, b)) = batch.next() else { break };
            match owner(key) {
                None => self.import_bucket(key, b, now_ns),
                Some(o) => others[o].1.push((key, b)),
            }
        }
    }

    /// Stores a bucket from a snapshot: [`Table::import`], and lease ids
    /// from then on above every loaded id of this shard's current range
    /// (the restarted node counts its ids from the start of the range
    /// again; without this, it could hand out an id a loaded lease has).
    pub fn restore(&mut self, bucket: u128, kind: Kind, state: Option<State>, now_ns: u64) {
        if let Some(State::Concurrency(leases)) = &state {
            let range = self.next_lease_id >> 32;
            for l in leases.leases() {
                if l.id >> 32 == range {
                    self.next_lease_id = self.next_lease_id.max(l.id);
                }
            }
        }
        self.import(bucket, kind, state, now_ns);
    }

    /// Buckets of each kind, in `Kind` code order (what SIZES carries).
    pub fn kind_lens(&self) -> [u64; 5] {
        [
            self.buckets.len() as u64,
            self.fixed.len() as u64,
            self.logs.len() as u64,
            self.counters.len() as u64,
            self.leases.len() as u64,
        ]
    }

    /// Makes room for this many more buckets of each kind (`Kind` code
    /// order), at most `keys_max` in all: a follower about to import a full
    /// sync sizes its tables once instead of growing them under the import.
    pub fn reserve(&mut self, more: [u64; 5]) {
        let cap = |n: u64| {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if self.keys_max == 0 {
                n
            } else {
                n.min(self.keys_max)
            }
        };
        let [tokens, fixed, logs, counters, leases] = more.map(cap);
        self.buckets.reserve(tokens);
        self.fixed.reserve(fixed);
        self.counters.reserve(counters);
        self.logs.reserve(logs);
        self.leases.reserve(leases);
    }

    /// Drops every bucket (a follower starting a new full sync).
    pub fn clear(&mut self) {
        let (keys_max, lease, counters) = (self.keys_max, self.next_lease_id, self.counters_total);
        let (heap_max, tracking) = (self.heap_bytes_max, self.changes.is_some());
        let over_limit = self.over_limit.take();
        *self = Table::with_cap(keys_max, lease);
        if let Some(o) = over_limit {
            self.publish_over_limit(o);
        }
        self.heap_bytes_max = heap_max;
        self.counters_total = counters;
        if tracking {
            self.track_changes();
        }
    }

    fn drop_bucket(&mut self, kind: Kind, bucket: u128) {
        by_kind!(kind, |K| K::remove(self, bucket));
    }

    /// Buckets held, all kinds.
    pub fn len(&self) -> usize {
        self.buckets.len()
            + self.fixed.len()
            + self.counters.len()
            + self.logs.len()
            + self.leases.len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cap on buckets (0 = none).
    pub fn keys_max(&self) -> usize {
        self.keys_max
    }

    /// Full buckets dropped by sweeps so far (token buckets).
    pub fn swept_total(&self) -> u64 {
        self.buckets.swept_total()
    }

    /// Bytes the tables occupy (slot arrays, and the heap of logs and leases).
    pub fn memory_bytes(&self) -> usize {
        let entry = |n: usize, size: usize| n * (size + 1);
        self.buckets.memory_bytes()
            + self.fixed.memory_bytes()
            + self.counters.memory_bytes()
            + entry(
                self.logs.capacity(),
                std::mem::size_of::<(u128, (SlidingLogState, u64))>(),
            )
            + entry(
                self.leases.capacity(),
                std::mem::size_of::<(u128, ConcurrencyState)>(),
            )
            + self.heap_bytes
    }

    /// Starts loading `key`'s token-bucket slot into cache.
    #[inline]
    pub fn prefetch(&self, key: u128) {
        self.buckets.prefetch(key);
    }

    /// Starts loading the slot of a bucket of `kind` into cache (for a
    /// follower importing a batch of records).
    #[inline]
    pub fn prefetch_kind(&self, kind: Kind, key: u128) {
        by_kind!(kind, |K| K::prefetch(self, key));
    }

    /// Room in the logs and lease lists for a spend of `cost` on `refs`:
    /// at `heap_bytes_max`, sweeps what has expired, then refuses
    /// (KEYS_FULL) if nothing was freed below the cap.
    fn heap_room(&mut self, refs: &[LimitRef], cost: u64, now_ns: u64) -> Result<(), Status> {
        let grows = cost > 0
            && refs
                .iter()
                .any(|r| matches!(r.limit.kind(), Kind::SlidingLog | Kind::Concurrency));
        if !grows || self.heap_bytes_max == 0 || self.heap_bytes < self.heap_bytes_max {
            return Ok(());
        }
        self.sweep_heap(now_ns);
        if self.heap_bytes < self.heap_bytes_max {
            return Ok(());
        }
        self.counters_total.refused_total += 1;
        Err(Status::KeysFull)
    }

    /// Room for `new` more buckets: at the cap, evicts every full bucket
    /// first; `Err(KeysFull)` if that is not enough.
    fn make_room(&mut self, new: usize, now_ns: u64) -> Result<(), Status> {
        if self.keys_max == 0 || self.len() + new <= self.keys_max {
            return Ok(());
        }
        let before = self.len();
        // Bounded work per request: each fixed-size table examines the next
        // EVICT_SCAN_SLOTS slots at its sweep cursor (so repeated attempts
        // cover the whole table); the heap tables only while they are small
        // (a shard task sweeps them every second anyway).
        self.buckets.sweep_step(now_ns, EVICT_SCAN_SLOTS);
        self.fixed.sweep_step(now_ns, EVICT_SCAN_SLOTS);
        self.counters.sweep_step(now_ns, EVICT_SCAN_SLOTS);
        if self.logs.len() + self.leases.len() <= EVICT_SCAN_SLOTS {
            self.sweep_heap(now_ns);
        }
        self.counters_total.evicted_total += (before - self.len()) as u64;
        if self.len() + new <= self.keys_max {
            return Ok(());
        }
        self.counters_total.refused_total += 1;
        Err(Status::KeysFull)
    }

    fn count_kind(&mut self, kind: Kind, allowed: bool) {
        self.counters_total.by_kind[usize::from(kind.code() - 1)][usize::from(allowed)] += 1;
    }

    fn count(&mut self, allowed: bool) {
        if allowed {
            self.counters_total.allowed_total += 1;
        } else {
            self.counters_total.denied_total += 1;
        }
    }

    /// Spends `cost` from `key`'s token bucket (see `gcra::throttle`).
    /// `Err(KeysFull)` when a new bucket would pass the cap.
    #[inline]
    pub fn throttle(
        &mut self,
        key: u128,
        policy: &Policy,
        cost: u64,
        now_ns: u64,
    ) -> Result<Verdict, Status> {
        // One lookup: the decision reads and writes the slot it found.
        let found = self.buckets.find(key);
        if let Found::Slot(i) = found {
            if let Some((verdict, wrote)) = self.buckets.throttle_in_slot(i, policy, cost, now_ns) {
                if let (Some(tat), true) = (wrote, self.changes.is_some()) {
                    self.changed_bucket(key, tat.map(|t| t.decode(now_ns)));
                }
                self.count(verdict.allowed);
                self.count_kind(Kind::TokenBucket, verdict.allowed);
                return Ok(verdict);
            }
        }
        let old = self.buckets.read(found, key, now_ns);
        let d = gcra::throttle(old, policy, cost, now_ns);
        if d.bucket != old {
            if found == Found::Absent {
                self.make_room(1, now_ns)?;
            }
            self.buckets.write(found, key, d.bucket, now_ns);
            self.changed_bucket(key, d.bucket);
        }
        let verdict = d.verdict;
        self.count(verdict.allowed);
        self.count_kind(Kind::TokenBucket, verdict.allowed);
        Ok(verdict)
    }

    /// redis-cell's CL.THROTTLE on `key`'s bucket (see `cell::throttle`).
    #[inline]
    pub fn cell_throttle(
        &mut self,
        key: u128,
        policy: &CellPolicy,
        quantity: u64,
        now_ns: u64,
    ) -> Result<CellVerdict, Status> {
        let found = self.buckets.find(key);
        let stored = self.buckets.read(found, key, now_ns).map(|b| b.tat_ns());
        let d = cell::throttle(stored, policy, quantity, now_ns);
        if d.verdict.limited {
            // Limited changes nothing (not even a v1 bucket's fraction).
            self.count(false);
            self.count_kind(Kind::TokenBucket, false);
            return Ok(d.verdict);
        }
        let tat = d.tat_ns.filter(|&tat_ns| tat_ns > now_ns);
        if tat.is_some() && found == Found::Absent {
            self.make_room(1, now_ns)?;
        }
        self.buckets
            .write(found, key, tat.map(Bucket::from_tat_ns), now_ns);
        // Counted once admitted for sure (KEYS_FULL above is refused).
        self.count(true);
        self.count_kind(Kind::TokenBucket, true);
        self.changed(Kind::TokenBucket, key);
        Ok(d.verdict)
    }

    /// Carries out a forwarded [`Op`].
    #[inline]
    pub fn decide(&mut self, key: u128, op: &Op, now_ns: u64) -> Outcome {
        let result = match op {
            Op::Throttle { policy, cost } => self
                .throttle(key, policy, *cost, now_ns)
                .map(Outcome::Verdict),
            Op::Peek { policy, cost } => {
                Ok(Outcome::Verdict(self.peek(key, policy, *cost, now_ns)))
            }
            Op::Cell { policy, quantity } => self
                .cell_throttle(key, policy, *quantity, now_ns)
                .map(Outcome::Cell),
            Op::Decide(d) => return self.decide_op(d, now_ns),
            Op::Release {
                bucket,
                limit,
                lease_id,
            } => self
                .release(*bucket, limit, *lease_id, now_ns)
                .map(Outcome::Lease),
            Op::Renew {
                bucket,
                limit,
                lease_id,
            } => self
                .renew(*bucket, limit, *lease_id, now_ns)
                .map(Outcome::Lease),
        };
        result.unwrap_or_else(Outcome::Refused)
    }

    /// A DECIDE's limits, all or nothing ([`Table::decide_many`]).
    #[inline]
    pub fn decide_op(&mut self, d: &DecideOp, now_ns: u64) -> Outcome {
        match self.decide_many(&d.refs[..usize::from(d.count)], d.mode, d.cost, now_ns) {
            Ok(mut m) => {
                m.priority = d.priority;
                Outcome::Multi(m)
            }
            Err(status) => Outcome::Refused(status),
        }
    }

    /// Answers as `throttle` would; creates and changes nothing.
    #[inline]
    pub fn peek(&self, key: u128, policy: &Policy, cost: u64, now_ns: u64) -> Verdict {
        gcra::peek(self.buckets.get(key, now_ns), policy, cost, now_ns)
    }

    /// Drops every bucket that is full at `now_ns`.
    pub fn sweep(&mut self, now_ns: u64) {
        self.buckets.sweep(now_ns);
        self.fixed.sweep(now_ns);
        self.counters.sweep(now_ns);
        self.sweep_heap(now_ns);
    }

    /// Drops the full buckets among the next [`SWEEP_SLOTS_PER_TICK`] slots
    /// of each fixed-size map, and every full sliding log and lease list (a
    /// shard task calls this every [`HEAP_SWEEP_MS`]).
    pub fn sweep_some(&mut self, now_ns: u64) {
        // Full since SWEEP_IDLE_NS at least: not a key in use.
        let idle = now_ns.saturating_sub(SWEEP_IDLE_NS);
        self.buckets.tick(now_ns);
        self.buckets.sweep_step(idle, SWEEP_SLOTS_PER_TICK);
        self.buckets.sweep_far(idle);
        self.fixed.sweep_step(idle, SWEEP_SLOTS_PER_TICK);
        self.counters.sweep_step(idle, SWEEP_SLOTS_PER_TICK);
        self.sweep_heap(now_ns);
    }

    /// Drops every sliding log and lease list that is full at `now_ns`.
    pub fn sweep_heap(&mut self, now_ns: u64) {
        let heap = &mut self.heap_bytes;
        self.logs.retain(|_, (log, window_ns)| {
            let window = Window {
                limit: u64::MAX,
                window_ns: (*window_ns).max(1),
            };
            let keep = !log.is_full(&window, now_ns);
            if !keep {
                *heap -= log.heap_bytes();
            }
            keep
        });
        self.leases.retain(|_, l| {
            let keep = !l.is_full(now_ns);
            if !keep {
                *heap -= l.heap_bytes();
            }
            keep
        });
    }

    fn take_log(&mut self, bucket: u128) -> Option<SlidingLogState> {
        let (log, _) = self.logs.remove(&bucket)?;
        self.heap_bytes -= log.heap_bytes();
        Some(log)
    }

    fn put_log(&mut self, bucket: u128, log: Option<(SlidingLogState, u64)>) {
        if let Some((l, w)) = log {
            self.heap_bytes += l.heap_bytes();
            self.logs.insert(bucket, (l, w));
        }
    }

    fn take_leases(&mut self, bucket: u128) -> Option<ConcurrencyState> {
        let leases = self.leases.remove(&bucket)?;
        self.heap_bytes -= leases.heap_bytes();
        Some(leases)
    }

    fn put_leases(&mut self, bucket: u128, leases: Option<ConcurrencyState>) {
        if let Some(l) = leases {
            self.heap_bytes += l.heap_bytes();
            self.leases.insert(bucket, l);
        }
    }

    /// Whether `r` has a stored bucket.
    fn exists(&self, r: &LimitRef) -> bool {
        by_limit!(&r.limit, |K, _n| K::exists(self, r.bucket))
    }

    /// What `r` would answer to `cost`, changing nothing.
    fn probe_one(&self, r: &LimitRef, cost: u64, now_ns: u64) -> Verdict {
        by_limit!(&r.limit, |K, n| self
            .probe_kind::<K>(r.bucket, n, cost, now_ns))
    }

    /// Spends `cost` on `r` (an admitted concurrency acquire takes a lease).
    fn spend_one(&mut self, r: &LimitRef, cost: u64, now_ns: u64) -> LimitVerdict {
        by_limit!(&r.limit, |K, n| self
            .spend_kind::<K>(r.bucket, n, cost, now_ns))
    }

    /// Gives `units` back to `r`, never above its limit.
    fn refund_one(&mut self, r: &LimitRef, units: u64, now_ns: u64) -> Verdict {
        by_limit!(&r.limit, |K, n| self
            .refund_kind::<K>(r.bucket, n, units, now_ns))
    }

    /// [`Table::probe_one`] for a limit of kind `K`, its numbers `n`.
    #[inline]
    fn probe_kind<K: Stored>(
        &self,
        bucket: u128,
        n: &K::Numbers,
        cost: u64,
        now_ns: u64,
    ) -> Verdict {
        K::read(self, bucket, now_ns, |s| K::peek(s, n, cost, now_ns))
    }

    /// [`Table::spend_one`] for a limit of kind `K`: a lease id is made
    /// only for a kind that takes leases, and used only if admitted.
    #[inline]
    fn spend_kind<K: Stored>(
        &mut self,
        bucket: u128,
        n: &K::Numbers,
        cost: u64,
        now_ns: u64,
    ) -> LimitVerdict {
        let id = if K::LEASES {
            self.next_lease_id.wrapping_add(1).max(1)
        } else {
            0
        };
        let verdict = K::apply(self, bucket, n, now_ns, |s| {
            K::spend(s, n, cost, id, now_ns)
        });
        let mut lease_id = 0;
        if K::LEASES && verdict.allowed && cost > 0 {
            self.next_lease_id = id;
            lease_id = id;
        }
        self.changed(K::KIND, bucket);
        LimitVerdict {
            kind: K::KIND,
            verdict,
            lease_id,
        }
    }

    /// [`Table::refund_one`] for a limit of kind `K` (a concurrency limit
    /// gives nothing back: leases are freed by RELEASE).
    #[inline]
    fn refund_kind<K: Stored>(
        &mut self,
        bucket: u128,
        n: &K::Numbers,
        units: u64,
        now_ns: u64,
    ) -> Verdict {
        let verdict = K::apply(self, bucket, n, now_ns, |s| K::refund(s, n, units, now_ns));
        self.changed(K::KIND, bucket);
        verdict
    }

    fn reset_one(&mut self, r: &LimitRef) {
        self.drop_bucket(r.limit.kind(), r.bucket);
        self.changed(r.limit.kind(), r.bucket);
    }

    /// A DECIDE on the limits `refs` of one routing key, as one atomic
    /// step: in Spend mode, if any limit denies, nothing is consumed
    /// anywhere. The caller has validated every limit and `cost` against
    /// each (for Spend and Probe).
    pub fn decide_many(
        &mut self,
        refs: &[LimitRef],
        mode: Mode,
        cost: u64,
        now_ns: u64,
    ) -> Result<Box<MultiVerdict>, Status> {
        assert!(
            !refs.is_empty() && refs.len() <= LIMITS_MAX,
            "the edge checks the limit count"
        );
        // Boxed from the start: the reply carries it boxed, and the verdicts
        // are 450 bytes that would otherwise be copied on the way there.
        let mut out = Box::new(MultiVerdict {
            allowed: true,
            denied_index: None,
            retry_after_ns: 0,
            count: refs.len() as u8,
            verdicts: [NO_VERDICT; LIMITS_MAX],
            priority: Priority::Normal,
        });
        for (i, r) in refs.iter().enumerate() {
            // Each verdict is the class's: it must leave `r.floor` alone.
            let verdict = match mode {
                Mode::Refund => priority::for_class(r.floor, self.refund_one(r, cost, now_ns)),
                Mode::Reset => {
                    self.reset_one(r);
                    priority::for_class(r.floor, self.probe_one(r, 0, now_ns))
                }
                Mode::Spend | Mode::Probe => {
                    let limit = r.limit.limit();
                    priority::probe(r.floor, limit, cost, |c| self.probe_one(r, c, now_ns))
                }
            };
            out.verdicts[i] = LimitVerdict {
                kind: r.limit.kind(),
                verdict,
                lease_id: 0,
            };
            if mode == Mode::Spend || mode == Mode::Probe {
                if !verdict.allowed && out.allowed {
                    out.allowed = false;
                    out.denied_index = Some(i as u8);
                }
                if mode == Mode::Spend && !verdict.allowed {
                    self.publish_denied(r, &verdict, now_ns);
                }
                out.retry_after_ns = out.retry_after_ns.max(verdict.retry_after_ns);
            }
        }
        if mode == Mode::Spend {
            self.count(out.allowed);
            if out.allowed {
                // Every limit admits: apply them all. Peek and throttle agree
                // at the same instant, so each spend admits too.
                let new = refs.iter().filter(|r| !self.exists(r)).count();
                if let Err(e) = self
                    .make_room(new, now_ns)
                    .and_then(|()| self.heap_room(refs, cost, now_ns))
                {
                    self.counters_total.allowed_total -= 1;
                    return Err(e);
                }
                for (i, r) in refs.iter().enumerate() {
                    let mut v = self.spend_one(r, cost, now_ns);
                    debug_assert!(
                        v.verdict.allowed,
                        "a probe that admits means a spend that admits"
                    );
                    v.verdict = priority::for_class(r.floor, v.verdict);
                    out.verdicts[i] = v;
                }
            }
            for i in 0..out.verdicts.len() {
                let v = &out.verdicts[i];
                let (kind, allowed) = (v.kind, v.verdict.allowed);
                self.count_kind(kind, allowed);
            }
        }
        if out.allowed {
            out.retry_after_ns = 0;
        }
        Ok(out)
    }

    /// Frees lease `lease_id` of the concurrency bucket `bucket`.
    pub fn release(
        &mut self,
        bucket: u128,
        limit: &Concurrency,
        lease_id: u64,
        now_ns: u64,
    ) -> Result<LimitVerdict, Status> {
        let d = concurrency::release(self.take_leases(bucket), limit, lease_id, now_ns);
        self.lease_result(bucket, d, lease_id)
    }

    /// Extends lease `lease_id` to `now + lease_ns`.
    pub fn renew(
        &mut self,
        bucket: u128,
        limit: &Concurrency,
        lease_id: u64,
        now_ns: u64,
    ) -> Result<LimitVerdict, Status> {
        let d = concurrency::renew(self.take_leases(bucket), limit, lease_id, now_ns);
        self.lease_result(bucket, d, lease_id)
    }

    fn lease_result(
        &mut self,
        bucket: u128,
        d: concurrency::LeaseDecision,
        lease_id: u64,
    ) -> Result<LimitVerdict, Status> {
        let verdict = d.decision.verdict;
        self.put_leases(bucket, d.decision.state);
        if d.outcome.is_ok() {
            self.changed(Kind::Concurrency, bucket);
        }
        d.outcome.map_err(|_| Status::LeaseNotFound)?;
        Ok(LimitVerdict {
            kind: Kind::Concurrency,
            verdict,
            lease_id,
        })
    }
}

/// Where a kind's buckets live in a [`Table`], and how their states go to
/// and from replication's [`State`] (which `protocol::limit` cannot name:
/// `replication` imports it): the storage half of the table's one generic
/// path, whose decision half is [`LimitKind`].
trait Stored: LimitKind {
    /// Whether `bucket` has a state stored.
    fn exists(t: &Table, bucket: u128) -> bool;
    /// `f` of `bucket`'s state at `now_ns` (`None`: absent).
    fn read<R>(
        t: &Table,
        bucket: u128,
        now_ns: u64,
        f: impl FnOnce(Option<&Self::State>) -> R,
    ) -> R;
    /// Runs `decide` on `bucket`'s state and stores the state it returns
    /// (`None`: drops it), with what a sweep needs of `numbers`; the
    /// verdict.
    fn apply(
        t: &mut Table,
        bucket: u128,
        numbers: &Self::Numbers,
        now_ns: u64,
        decide: impl FnOnce(Option<Self::State>) -> Decision<Self::State>,
    ) -> Verdict;
    /// Drops `bucket`'s state.
    fn remove(t: &mut Table, bucket: u128);
    /// `bucket`'s state as replication and snapshots carry it.
    fn export(t: &Table, bucket: u128) -> Option<State>;
    /// Stores `state` as replication carried it; gives it back if it is
    /// another kind's.
    fn import(t: &mut Table, bucket: u128, state: State, now_ns: u64) -> Result<(), State>;
    /// Starts loading `bucket`'s slot into cache (the fixed-size kinds).
    #[inline]
    fn prefetch(_t: &Table, _bucket: u128) {}
}

impl Stored for kinds::TokenBucket {
    #[inline]
    fn exists(t: &Table, bucket: u128) -> bool {
        t.buckets.find(bucket) != Found::Absent
    }

    #[inline]
    fn read<R>(t: &Table, bucket: u128, now_ns: u64, f: impl FnOnce(Option<&Bucket>) -> R) -> R {
        f(t.buckets.get(bucket, now_ns).as_ref())
    }

    #[inline]
    fn apply(
        t: &mut Table,
        bucket: u128,
        _: &Policy,
        now_ns: u64,
        decide: impl FnOnce(Option<Bucket>) -> Decision<Bucket>,
    ) -> Verdict {
        t.buckets.apply(bucket, now_ns, decide)
    }

    fn remove(t: &mut Table, bucket: u128) {
        t.buckets.remove(bucket);
    }

    fn export(t: &Table, bucket: u128) -> Option<State> {
        t.buckets.get_latest(bucket).map(State::TokenBucket)
    }

    fn import(t: &mut Table, bucket: u128, state: State, now_ns: u64) -> Result<(), State> {
        let State::TokenBucket(b) = state else {
            return Err(state);
        };
        t.import_bucket(bucket, Some(b), now_ns);
        Ok(())
    }

    #[inline]
    fn prefetch(t: &Table, bucket: u128) {
        t.buckets.prefetch(bucket);
    }
}

/// [`Stored`] for a window kind kept in a [`BucketMap`] of [`Windowed`]
/// records (the table's field `$map`, replication's `State::$kind`).
macro_rules! stored_window {
    ($kind:ident, $map:ident) => {
        impl Stored for kinds::$kind {
            #[inline]
            fn exists(t: &Table, bucket: u128) -> bool {
                t.$map.get(bucket).is_some()
            }

            #[inline]
            fn read<R>(
                t: &Table,
                bucket: u128,
                _: u64,
                f: impl FnOnce(Option<&Self::State>) -> R,
            ) -> R {
                f(t.$map.get(bucket).map(|w| &w.state))
            }

            #[inline]
            fn apply(
                t: &mut Table,
                bucket: u128,
                w: &Window,
                now_ns: u64,
                decide: impl FnOnce(Option<Self::State>) -> Decision<Self::State>,
            ) -> Verdict {
                t.unpublish(Kind::$kind, bucket);
                apply_window(&mut t.$map, bucket, w, now_ns, decide)
            }

            fn remove(t: &mut Table, bucket: u128) {
                t.unpublish(Kind::$kind, bucket);
                t.$map.remove(bucket);
            }

            fn export(t: &Table, bucket: u128) -> Option<State> {
                t.$map.get(bucket).map(|w| State::$kind {
                    window_ns: w.window_ns,
                    state: w.state,
                })
            }

            fn import(t: &mut Table, bucket: u128, state: State, now_ns: u64) -> Result<(), State> {
                let State::$kind { window_ns, state } = state else {
                    return Err(state);
                };
                let w = Windowed { state, window_ns };
                t.unpublish(Kind::$kind, bucket);
                store_map(&mut t.$map, bucket, Some(w), now_ns);
                Ok(())
            }

            #[inline]
            fn prefetch(t: &Table, bucket: u128) {
                t.$map.prefetch(bucket);
            }
        }
    };
}

stored_window!(FixedWindow, fixed);
stored_window!(SlidingCounter, counters);

impl Stored for kinds::SlidingLog {
    fn exists(t: &Table, bucket: u128) -> bool {
        t.logs.contains_key(&bucket)
    }

    fn read<R>(
        t: &Table,
        bucket: u128,
        _: u64,
        f: impl FnOnce(Option<&SlidingLogState>) -> R,
    ) -> R {
        f(t.logs.get(&bucket).map(|(log, _)| log))
    }

    fn apply(
        t: &mut Table,
        bucket: u128,
        w: &Window,
        _: u64,
        decide: impl FnOnce(Option<SlidingLogState>) -> Decision<SlidingLogState>,
    ) -> Verdict {
        let d = decide(t.take_log(bucket));
        t.put_log(bucket, d.state.map(|log| (log, w.window_ns)));
        d.verdict
    }

    fn remove(t: &mut Table, bucket: u128) {
        t.take_log(bucket);
    }

    fn export(t: &Table, bucket: u128) -> Option<State> {
        let (log, window_ns) = t.logs.get(&bucket)?;
        Some(State::SlidingLog {
            window_ns: *window_ns,
            log: log.clone(),
        })
    }

    fn import(t: &mut Table, bucket: u128, state: State, _: u64) -> Result<(), State> {
        let State::SlidingLog { window_ns, log } = state else {
            return Err(state);
        };
        t.take_log(bucket);
        t.put_log(bucket, Some((log, window_ns)));
        Ok(())
    }
}

impl Stored for kinds::Concurrency {
    fn exists(t: &Table, bucket: u128) -> bool {
        t.leases.contains_key(&bucket)
    }

    fn read<R>(
        t: &Table,
        bucket: u128,
        _: u64,
        f: impl FnOnce(Option<&ConcurrencyState>) -> R,
    ) -> R {
        f(t.leases.get(&bucket))
    }

    fn apply(
        t: &mut Table,
        bucket: u128,
        _: &Concurrency,
        _: u64,
        decide: impl FnOnce(Option<ConcurrencyState>) -> Decision<ConcurrencyState>,
    ) -> Verdict {
        let d = decide(t.take_leases(bucket));
        t.put_leases(bucket, d.state);
        d.verdict
    }

    fn remove(t: &mut Table, bucket: u128) {
        t.take_leases(bucket);
    }

    fn export(t: &Table, bucket: u128) -> Option<State> {
        t.leases.get(&bucket).cloned().map(State::Concurrency)
    }

    fn import(t: &mut Table, bucket: u128, state: State, _: u64) -> Result<(), State> {
        let State::Concurrency(leases) = state else {
            return Err(state);
        };
        t.take_leases(bucket);
        t.put_leases(bucket, Some(leases));
        Ok(())
    }
}

/// A fixed-size table's keys moved below its full-sync walk.
trait ExportMoved {
    fn moved(&mut self, walk: Walk, out: &mut Vec<u128>);
}

impl<V: Record> ExportMoved for BucketMap<V> {
    fn moved(&mut self, walk: Walk, out: &mut Vec<u128>) {
        self.export_moved(walk, out);
    }
}

impl ExportMoved for TokenBuckets {
    fn moved(&mut self, walk: Walk, out: &mut Vec<u128>) {
        self.export_moved(walk, out);
    }
}

/// Runs a window kind's pure function on its stored state and stores what
/// it returns, with the window length the sweep needs.
#[inline]
fn apply_window<S: Copy>(
    map: &mut BucketMap<Windowed<S>>,
    bucket: u128,
    w: &Window,
    now_ns: u64,
    decide: impl FnOnce(Option<S>) -> Decision<S>,
) -> Verdict
where
    Windowed<S>: Record,
{
    let d = decide(map.get(bucket).map(|s| s.state));
    let state = d.state.map(|state| Windowed {
        state,
        window_ns: w.window_ns,
    });
    store_map(map, bucket, state, now_ns);
    d.verdict
}

/// Stores (or, for `None`, removes) a fixed-size record.
#[inline]
fn store_map<V: Record>(map: &mut BucketMap<V>, key: u128, value: Option<V>, now_ns: u64) {
    match value {
        Some(v) => match map.get_mut(key) {
            Some(slot) => *slot = v,
            None => map.insert(key, v, now_ns),
        },
        None => {
            map.remove(key);
        }
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
        // 1 ms, and is dropped once it has been full for SWEEP_IDLE_NS (1 s):
        // the table holds about the last second's thousand keys, never the
        // 100k.
        for i in 0..100_000u128 {
            let now = 1_000 * S + (i as u64) * 1_000_000;
            assert!(
                t.throttle(
                    i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834),
                    &p,
                    1,
                    now
                )
                .unwrap()
                .allowed
            );
        }
        assert!(t.len() < 2_500, "table kept {} buckets", t.len());
        assert!(t.swept_total() > 97_000);
    }

    #[test]
    fn peek_creates_nothing_and_refill_removes() {
        let p = Policy::new(1, S, 2).unwrap();
        let mut t = Table::new();
        assert!(t.peek(7, &p, 1, S).allowed);
        assert!(t.is_empty());
        assert!(t.throttle(7, &p, 1, S).unwrap().allowed);
        assert_eq!(t.len(), 1);
        assert_eq!(t.peek(7, &p, 1, S).remaining, 0);
        // Cost 0 two seconds later: the bucket is full again, so it goes.
        assert!(t.throttle(7, &p, 0, 3 * S).unwrap().allowed);
        assert!(t.is_empty());
    }

    #[test]
    fn cell_buckets_live_in_the_same_table() {
        // redis-cell's README example, then the bucket refills and goes.
        let p = CellPolicy::new(15, 30, 60).unwrap();
        let mut t = Table::new();
        let v = t.cell_throttle(9, &p, 1, 100 * S).unwrap();
        assert_eq!(v.reply(), [0, 16, 15, -1, 2]);
        assert_eq!(t.len(), 1);
        // Over the limit: limited, nothing stored or changed.
        assert!(t.cell_throttle(9, &p, 17, 100 * S).unwrap().limited);
        assert_eq!(t.cell_throttle(9, &p, 0, 100 * S).unwrap().remaining, 15);
        assert!(t.cell_throttle(9, &p, 0, 102 * S).unwrap().remaining == 16);
        assert!(t.is_empty(), "a peek at a full bucket drops it");
        // A v1 bucket and a CL.THROTTLE on the same key see one TAT.
        let v1 = Policy::new(1, S, 2).unwrap();
        assert!(t.throttle(5, &v1, 2, 100 * S).unwrap().allowed);
        let one_per_s = CellPolicy::new(1, 1, 1).unwrap();
        let v = t.cell_throttle(5, &one_per_s, 1, 100 * S).unwrap();
        assert!(v.limited);
        assert_eq!(v.reset_after_s(), 2);
    }

    #[test]
    fn a_cell_throttle_refused_at_the_cap_is_not_counted_as_allowed() {
        let p = CellPolicy::new(15, 30, 60).unwrap();
        let mut t = Table::with_cap(1, 0);
        assert!(!t.cell_throttle(1, &p, 1, S).unwrap().limited);
        assert_eq!(t.cell_throttle(2, &p, 1, S), Err(Status::KeysFull));
        assert_eq!(t.counters_total.allowed_total, 1);
        assert_eq!(t.counters_total.refused_total, 1);
    }

    fn refs(limits: &[Limit]) -> Vec<LimitRef> {
        limits
            .iter()
            .enumerate()
            .map(|(i, l)| LimitRef {
                bucket: 1_000 + i as u128,
                limit: *l,
                floor: 0,
            })
            .collect()
    }

    /// A table publishing its over-limit windows, and one fixed window of
    /// 3 a minute on bucket 1000 (plus a token bucket on 1001).
    fn publishing() -> (Table, Arc<OverLimit>, Vec<LimitRef>) {
        let mut t = Table::new();
        let published = Arc::new(OverLimit::new(64));
        t.publish_over_limit(published.clone());
        let limits: Vec<Limit> = ["fixed-window:3/m", "token-bucket:1/m,burst=1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        (t, published, refs(&limits))
    }

    fn looked_up(published: &OverLimit, r: &LimitRef, now: u64) -> Option<over_limit::Entry> {
        let Limit::FixedWindow(w) = r.limit else {
            panic!("a fixed window")
        };
        published.lookup(r.bucket, w.limit, w.window_ns, now)
    }

    #[test]
    fn a_fixed_window_denied_with_nothing_left_is_published_until_room_is_made() {
        let (mut t, published, r) = publishing();
        let now = 60_000 * S;
        // 2 of 3, then a spend of 2 is denied with 1 left: not published
        // (a spend of 1 would be admitted).
        t.decide_many(&r[..1], Mode::Spend, 2, now).unwrap();
        assert!(!t.decide_many(&r[..1], Mode::Spend, 2, now).unwrap().allowed);
        assert_eq!(looked_up(&published, &r[0], now), None);
        t.decide_many(&r[..1], Mode::Spend, 1, now).unwrap();
        assert_eq!(looked_up(&published, &r[0], now), None, "admitted");
        let denied = t.decide_many(&r[..1], Mode::Spend, 1, now).unwrap();
        assert!(!denied.allowed);
        let entry = looked_up(&published, &r[0], now).expect("published");
        assert_eq!(entry.count, 3);
        assert_eq!(entry.window_start_ns, now);
        // A probe says what the shard says, and the entry gives the same.
        let Limit::FixedWindow(w) = r[0].limit else {
            unreachable!()
        };
        let state = FixedWindowState {
            window_start_ns: entry.window_start_ns,
            count: entry.count,
        };
        let later = now + 30 * S;
        assert_eq!(
            sluice_protocol::limit::fixed_window::peek(Some(state), &w, 1, later),
            t.probe_one(&r[0], 1, later)
        );
        assert_eq!(looked_up(&published, &r[0], now + 60 * S), None, "ended");
        // A refund makes room: the entry goes first.
        t.decide_many(&r[..1], Mode::Refund, 1, now).unwrap();
        assert_eq!(looked_up(&published, &r[0], now), None);
        assert!(t.decide_many(&r[..1], Mode::Spend, 1, now).unwrap().allowed);
        // Denied again, then reset: gone again.
        t.decide_many(&r[..1], Mode::Spend, 1, now).unwrap();
        assert!(looked_up(&published, &r[0], now).is_some());
        t.decide_many(&r[..1], Mode::Reset, 0, now).unwrap();
        assert_eq!(looked_up(&published, &r[0], now), None);
    }

    #[test]
    fn replication_storing_or_emptying_the_table_withdraws_entries() {
        let (mut t, published, r) = publishing();
        let now = 60_000 * S;
        t.decide_many(&r[..1], Mode::Spend, 3, now).unwrap();
        t.decide_many(&r[..1], Mode::Spend, 1, now).unwrap();
        assert!(looked_up(&published, &r[0], now).is_some());
        let state = State::FixedWindow {
            window_ns: 60 * S,
            state: FixedWindowState {
                window_start_ns: now,
                count: 1,
            },
        };
        t.import(r[0].bucket, Kind::FixedWindow, Some(state), now);
        assert_eq!(looked_up(&published, &r[0], now), None, "imported");
        t.decide_many(&r[..1], Mode::Spend, 2, now).unwrap();
        t.decide_many(&r[..1], Mode::Spend, 1, now).unwrap();
        assert!(looked_up(&published, &r[0], now).is_some());
        t.clear();
        assert_eq!(looked_up(&published, &r[0], now), None, "cleared");
        // Still publishing after the clear.
        t.decide_many(&r[..1], Mode::Spend, 3, now).unwrap();
        t.decide_many(&r[..1], Mode::Spend, 1, now).unwrap();
        assert!(looked_up(&published, &r[0], now).is_some());
    }

    #[test]
    fn only_fixed_windows_of_the_default_class_are_published() {
        let (mut t, published, r) = publishing();
        let now = 60_000 * S;
        t.decide_many(&r[1..], Mode::Spend, 1, now).unwrap();
        assert!(!t.decide_many(&r[1..], Mode::Spend, 1, now).unwrap().allowed);
        let slots_written = (0..64u128).any(|b| {
            [3, 1]
                .iter()
                .any(|&l| published.lookup(b, l, 60 * S, now).is_some())
        });
        assert!(!slots_written, "a token bucket's denial publishes nothing");
        let mut reserved = r[0];
        reserved.floor = 1;
        t.decide_many(&[reserved], Mode::Spend, 2, now).unwrap();
        assert!(
            !t.decide_many(&[reserved], Mode::Spend, 1, now)
                .unwrap()
                .allowed
        );
        assert_eq!(looked_up(&published, &r[0], now), None, "a class's floor");
    }

    #[test]
    fn composite_is_all_or_nothing() {
        let mut t = Table::new();
        let limits: Vec<Limit> = [
            "token-bucket:5/s,burst=5",
            "fixed-window:3/m",
            "concurrency:10,lease=30s",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let r = refs(&limits);
        let now = 1_000 * S;
        for i in 0..3 {
            let m = t.decide_many(&r, Mode::Spend, 1, now).unwrap();
            assert!(m.allowed, "request {i}");
            assert!(
                m.verdicts()[2].lease_id != 0,
                "an admitted acquire takes a lease"
            );
        }
        // The fixed window (3/m) now denies: nothing else may be consumed.
        let before: Vec<_> = r.iter().map(|x| t.probe_one(x, 1, now)).collect();
        let m = t.decide_many(&r, Mode::Spend, 1, now).unwrap();
        assert!(!m.allowed);
        assert_eq!(m.denied_index, Some(1));
        assert_eq!(m.verdicts()[2].lease_id, 0);
        let after: Vec<_> = r.iter().map(|x| t.probe_one(x, 1, now)).collect();
        assert_eq!(
            before, after,
            "a denied composite consumes nothing anywhere"
        );
        // Combined retry_after: when ALL admit (the window's end).
        assert_eq!(m.retry_after_ns, m.verdicts()[1].verdict.retry_after_ns);
        assert_eq!(t.counters_total.denied_total, 1);
        // Probe changes nothing and creates nothing.
        let fresh = refs(&limits[..1])
            .into_iter()
            .map(|mut x| {
                x.bucket = 9;
                x
            })
            .collect::<Vec<_>>();
        assert!(t.decide_many(&fresh, Mode::Probe, 1, now).unwrap().allowed);
        assert!(!t.exists(&fresh[0]));
        // Reset clears; refund gives back.
        let m = t.decide_many(&r[1..2], Mode::Reset, 0, now).unwrap();
        assert_eq!(m.verdicts()[0].verdict.remaining, 3);
        t.decide_many(&r[..1], Mode::Refund, 5, now).unwrap();
        assert_eq!(
            t.probe_one(&r[0], 0, now).remaining,
            5,
            "refund never above the limit"
        );
    }

    #[test]
    fn leases_release_renew_and_expire() {
        let mut t = Table::new();
        let c: Limit = "concurrency:1,lease=1s".parse().unwrap();
        let Limit::Concurrency(conc) = c else {
            unreachable!()
        };
        let r = refs(&[c]);
        let m = t.decide_many(&r, Mode::Spend, 1, 10 * S).unwrap();
        let id = m.verdicts()[0].lease_id;
        assert!(
            !t.decide_many(&r, Mode::Spend, 1, 10 * S).unwrap().allowed,
            "one slot"
        );
        t.renew(r[0].bucket, &conc, id, 10 * S + S / 2).unwrap();
        assert!(
            !t.decide_many(&r, Mode::Spend, 1, 11 * S).unwrap().allowed,
            "renewed past 11 s"
        );
        assert!(
            t.decide_many(&r, Mode::Spend, 1, 11 * S + S / 2)
                .unwrap()
                .allowed,
            "expired by itself"
        );
        assert_eq!(
            t.release(r[0].bucket, &conc, id, 12 * S),
            Err(Status::LeaseNotFound)
        );
    }

    #[test]
    fn cap_evicts_full_buckets_then_refuses() {
        let p = Policy::new(1, S, 1).unwrap();
        let mut t = Table::with_cap(2, 0);
        t.throttle(1, &p, 1, S).unwrap();
        t.throttle(2, &p, 1, S).unwrap();
        // Both partly spent: a third key is refused, nothing is evicted.
        assert_eq!(t.throttle(3, &p, 1, S), Err(Status::KeysFull));
        assert_eq!(t.counters_total.refused_total, 1);
        assert_eq!(t.len(), 2);
        // A second later both are full again: they are evicted for it.
        assert!(t.throttle(3, &p, 1, 2 * S + 1).unwrap().allowed);
        assert_eq!(t.counters_total.evicted_total, 2);
        // A composite needing two new buckets at the cap is refused whole.
        let limits: Vec<Limit> = ["token-bucket:1/s,burst=1", "fixed-window:1/s"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let mut t = Table::with_cap(1, 0);
        assert_eq!(
            t.decide_many(&refs(&limits), Mode::Spend, 1, S),
            Err(Status::KeysFull)
        );
        assert!(t.is_empty());
    }

    #[test]
    fn the_heap_cap_refuses_growth_and_changes_nothing() {
        let log: Vec<Limit> = ["sliding-log:1000/h"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let mut t = Table::with_cap(0, 0);
        t.set_heap_bytes_max(1);
        // Empty: under the cap, the first spend is admitted (and grows it).
        assert!(
            t.decide_many(&refs(&log), Mode::Spend, 1, S)
                .unwrap()
                .allowed
        );
        let held = t.heap_bytes;
        assert!(held >= 1);
        // At the cap, nothing expired: refused, nothing counted as allowed.
        let allowed = t.counters_total.allowed_total;
        assert_eq!(
            t.decide_many(&refs(&log), Mode::Spend, 1, 2 * S),
            Err(Status::KeysFull)
        );
        assert_eq!(t.heap_bytes, held);
        assert_eq!(t.counters_total.allowed_total, allowed);
        assert_eq!(t.counters_total.refused_total, 1);
        // A probe, and a token bucket, are not growth.
        assert!(t.decide_many(&refs(&log), Mode::Probe, 1, 2 * S).is_ok());
        // An hour later the entries have expired: the sweep makes room.
        let later = 3_700 * S;
        assert!(
            t.decide_many(&refs(&log), Mode::Spend, 1, later)
                .unwrap()
                .allowed
        );
    }

    #[test]
    fn heap_bytes_are_kept_up_to_date() {
        let mut t = Table::new();
        let limits: Vec<Limit> = ["sliding-log:50/s", "concurrency:20,lease=1s"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let recount = |t: &Table| -> usize {
            t.logs.values().map(|(l, _)| l.heap_bytes()).sum::<usize>()
                + t.leases
                    .values()
                    .map(ConcurrencyState::heap_bytes)
                    .sum::<usize>()
        };
        for k in 0..40u128 {
            let r: Vec<LimitRef> = limits
                .iter()
                .enumerate()
                .map(|(i, l)| LimitRef {
                    bucket: k * 10 + i as u128,
                    limit: *l,
                    floor: 0,
                })
                .collect();
            for step in 0..(k % 7 + 1) {
                let now = S + step as u64 * 1_000_000;
                let _ = t.decide_many(&r, Mode::Spend, 1, now);
            }
            if k % 5 == 0 {
                t.decide_many(&r, Mode::Reset, 0, S).unwrap();
            }
            assert_eq!(t.heap_bytes, recount(&t));
        }
        assert!(t.heap_bytes > 0);
        t.sweep(100 * S);
        assert_eq!(t.heap_bytes, recount(&t));
        assert_eq!(
            (t.logs.len(), t.leases.len(), t.heap_bytes),
            (0, 0, 0),
            "everything expired and was swept"
        );
    }

    #[test]
    fn the_cap_costs_bounded_work_per_request() {
        let p = Policy::new(1, S, 1).unwrap();
        let mut t = Table::with_cap(10_000, 0);
        for k in 0..10_000u128 {
            t.throttle(
                k.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834) | 1,
                &p,
                1,
                S,
            )
            .unwrap();
        }
        assert_eq!(t.len(), 10_000);
        // Two seconds later every bucket is full, but a new key at the cap
        // evicts only what one bounded scan finds, not the whole table.
        assert!(t.throttle(7 << 64, &p, 1, 3 * S).unwrap().allowed);
        let evicted = t.counters_total.evicted_total;
        assert!(
            (1..=EVICT_SCAN_SLOTS as u64).contains(&evicted),
            "evicted {evicted}"
        );
        assert!(t.len() > 10_000 - EVICT_SCAN_SLOTS);
    }

    /// One small limit of every kind (concurrency last), for the property
    /// tests below.
    fn one_of_each_kind() -> Vec<Limit> {
        [
            "token-bucket:2/s,burst=3",
            "fixed-window:3/s",
            "sliding-log:3/s",
            "sliding-counter:3/s",
            "concurrency:3,lease=1s",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect()
    }

    /// Whether a replicated state is the same as no state at `now_ns`.
    fn full(state: &State, now_ns: u64) -> bool {
        let w = |window_ns: u64| Window {
            limit: u64::MAX,
            window_ns: window_ns.max(1),
        };
        match state {
            State::TokenBucket(b) => b.is_full(now_ns),
            State::FixedWindow { window_ns, state } => state.is_full(&w(*window_ns), now_ns),
            State::SlidingCounter { window_ns, state } => state.is_full(&w(*window_ns), now_ns),
            State::SlidingLog { window_ns, log } => log.is_full(&w(*window_ns), now_ns),
            State::Concurrency(c) => c.is_full(now_ns),
        }
    }

    /// A bucket's state as the follower would get it (not full, in the
    /// wire's representation: a log's runs are renumbered by the trip).
    fn effective(t: &Table, kind: Kind, bucket: u128, now_ns: u64) -> Option<State> {
        let state = t.export(kind, bucket).filter(|s| !full(s, now_ns))?;
        let mut sw = SyncWriter::new();
        sw.push(kind, bucket, Some(&state));
        sw.into_records().unwrap().pop().and_then(|r| r.state)
    }

    const KINDS: [Kind; 5] = [
        Kind::TokenBucket,
        Kind::FixedWindow,
        Kind::SlidingLog,
        Kind::SlidingCounter,
        Kind::Concurrency,
    ];

    proptest::proptest! {
        /// The one write hook misses nothing: after any operation, every
        /// bucket whose state changed (a full bucket and no bucket count as
        /// the same) is among the changes taken, with its state now.
        #[test]
        fn every_write_is_recorded(ops in proptest::collection::vec((0u8..8, 0u128..6, 0u64..4, 0u64..3_000), 1..120)) {
            let limits = one_of_each_kind();
            let policy = Policy::new(2, S, 3).unwrap();
            let cell = CellPolicy::new(2, 2, 1).unwrap();
            let mut t = Table::with_cap(0, 0);
            t.track_changes();
            let mut now = 100 * S;
            let mut leases: Vec<(u128, u64)> = Vec::new();
            for (op, key, cost, advance_ms) in ops {
                now += advance_ms * 1_000_000;
                // (Bucket key 0 is stored as 1: keep clear of it.)
                let key = key + 1;
                let refs: Vec<LimitRef> = limits
                    .iter()
                    .map(|l| LimitRef { bucket: (key << 8) | l.kind() as u128, limit: *l, floor: 0 })
                    .collect();
                let universe: Vec<(u128, Kind)> = (1..7u128)
                    .flat_map(|k| KINDS.iter().map(move |&kind| ((k << 8) | kind as u128, kind)))
                    .chain((1..7u128).map(|k| (k << 8, Kind::TokenBucket)))
                    .collect();
                let before: Vec<Option<State>> =
                    universe.iter().map(|&(b, k)| effective(&t, k, b, now)).collect();
                let Limit::Concurrency(conc) = limits[4] else { unreachable!() };
                match op {
                    0 => drop(t.throttle(key << 8, &policy, cost.min(3), now)),
                    1 => drop(t.cell_throttle(key << 8, &cell, cost, now)),
                    2 => {
                        if let Ok(m) = t.decide_many(&refs, Mode::Spend, cost.min(3), now) {
                            if m.verdicts()[4].lease_id != 0 {
                                leases.push((refs[4].bucket, m.verdicts()[4].lease_id));
                            }
                        }
                    }
                    3 => drop(t.decide_many(&refs, Mode::Refund, cost, now)),
                    4 => drop(t.decide_many(&refs[..(key as usize % 5) + 1], Mode::Reset, 0, now)),
                    5 => drop(t.decide_many(&refs, Mode::Probe, cost.min(3), now)),
                    6 => {
                        if let Some(&(b, id)) = leases.get(key as usize % leases.len().max(1)) {
                            let _ = t.release(b, &conc, id, now);
                        }
                    }
                    _ => {
                        if let Some(&(b, id)) = leases.get(key as usize % leases.len().max(1)) {
                            let _ = t.renew(b, &conc, id, now);
                        }
                    }
                }
                let mut taken = Vec::new();
                t.take_changes(&mut taken);
                for (i, &(bucket, kind)) in universe.iter().enumerate() {
                    let after = effective(&t, kind, bucket, now);
                    if after != before[i] {
                        // In write order, a bucket's latest state last.
                        let got = taken.iter().rev().find(|(b, k, _)| *b == bucket && *k == kind);
                        proptest::prop_assert!(got.is_some(), "op {op}: {kind:?} {bucket:#x} changed unrecorded");
                        let shipped = got.unwrap().2.clone().filter(|s| !full(s, now));
                        proptest::prop_assert_eq!(shipped, after);
                    }
                }
            }
        }
    }

    /// A plain store for `protocol::composite`, the same rule the client's
    /// local fallback runs.
    #[derive(Default)]
    struct Plain(std::collections::HashMap<(u128, u8), State>);

    impl sluice_protocol::composite::Store for Plain {
        fn get(&self, bucket: u128, kind: Kind) -> Option<&State> {
            self.0.get(&(bucket, kind as u8))
        }
        fn put(&mut self, bucket: u128, kind: Kind, state: Option<State>) {
            match state {
                Some(s) => drop(self.0.insert((bucket, kind as u8), s)),
                None => drop(self.0.remove(&(bucket, kind as u8))),
            }
        }
    }

    proptest::proptest! {
        /// The shard's composite decision and `protocol::composite` (the
        /// client's local fallback) are two implementations of one rule
        /// (the shard's is specialised to its per-kind tables): on any
        /// sequence of spends, probes and resets, by requests of every
        /// class against limits with reserves, they answer alike.
        #[test]
        fn shard_and_composite_decide_alike(
            ops in proptest::collection::vec((0u8..3, 1u128..4, 0u64..4, 0u64..400, 0u8..3), 1..150),
            reserves in (0u16..=10_000, 0u16..=10_000),
        ) {
            let reserves = sluice_protocol::Reserves { critical_bp: reserves.0, normal_bp: reserves.1 };
            let limits = one_of_each_kind();
            let mut table = Table::with_cap(0, 0);
            let mut plain = Plain::default();
            let mut lease = 0u64;
            let mut now = 100 * S;
            for (op, key, cost, advance_ms, class) in ops {
                now += advance_ms * 1_000_000;
                let class = Priority::ALL[usize::from(class)];
                let refs: Vec<LimitRef> = limits
                    .iter()
                    .map(|l| LimitRef {
                        bucket: (key << 8) | l.kind() as u128,
                        limit: *l,
                        floor: reserves.floor(l.limit(), class),
                    })
                    .collect();
                let at: Vec<sluice_protocol::composite::LimitAt> = refs
                    .iter()
                    .map(|r| sluice_protocol::composite::LimitAt { bucket: r.bucket, limit: r.limit, floor: r.floor })
                    .collect();
                let mode = [Mode::Spend, Mode::Probe, Mode::Reset][usize::from(op)];
                let cost = if mode == Mode::Reset { 0 } else { cost.min(3) };
                let a = table.decide_many(&refs, mode, cost, now).unwrap();
                let b = sluice_protocol::composite::decide(&mut plain, &at, mode, cost, now, &mut lease, class);
                proptest::prop_assert_eq!(a.allowed, b.allowed);
                proptest::prop_assert_eq!(a.denied_index, b.denied_index);
                proptest::prop_assert_eq!(a.retry_after_ns, b.retry_after_ns);
                for (x, y) in a.verdicts().iter().zip(&b.verdicts) {
                    // Lease ids are drawn from different counters.
                    proptest::prop_assert_eq!(x.verdict, y.verdict);
                    proptest::prop_assert_eq!(x.lease_id != 0, y.lease_id != 0);
                }
            }
        }
    }
}
