//! Replication and roles: the messages a follower and its primary exchange
//! (SUBSCRIBE, SYNC, ACK), the state records SYNC carries for every limit
//! kind, and the node operations ROLE and PROMOTE (PROTOCOL.md,
//! "Replication").
//!
//! Replication is of bucket *state*, never of operations: a SYNC carries,
//! for each bucket that changed since the last SYNC of its flow, the
//! bucket's state as it is now (or that it is gone), so many decisions on a
//! hot key coalesce into one record. Records are keyed by the 128-bit
//! bucket key, so a follower places them by its own shard layout.
//!
//! Like the rest of the crate, this module does no I/O: it parses borrowed
//! payloads (validating every length before using it) and appends
//! encodings to a `BytesMut`.

use bytes::{BufMut, BytesMut};

use crate::codec::{FrameWriter, MessageHeader};
use crate::gcra::Bucket;
use crate::limit::concurrency::{ConcurrencyState, Lease};
use crate::limit::fixed_window::FixedWindowState;
use crate::limit::sliding_counter::SlidingCounterState;
use crate::limit::sliding_log::SlidingLogState;
use crate::limit::Kind;

/// Op codes of this module (PROTOCOL.md, "Ops"); a reply is its request's
/// op with the high bit set.
pub mod op {
    /// Who is this node, and how is its replication doing.
    pub const ROLE: u8 = 0x0a;
    /// Make this follower the primary (a takeover of a dead primary).
    pub const PROMOTE: u8 = 0x0b;
    /// Planned handover: the primary stops admitting, waits until its
    /// follower has everything, hands over, and follows it.
    pub const FAILOVER: u8 = 0x0c;
    /// A follower asks the shard its connection is bound to for a flow:
    /// a full sync, then the stream.
    pub const SUBSCRIBE: u8 = 0x20;
    /// A follower acknowledges every SYNC up to a sequence number.
    pub const ACK: u8 = 0x21;

    /// ROLE's reply.
    pub const ROLE_OK: u8 = ROLE | crate::message::op::REPLY;
    /// PROMOTE's reply.
    pub const PROMOTE_OK: u8 = PROMOTE | crate::message::op::REPLY;
    /// FAILOVER's reply.
    pub const FAILOVER_OK: u8 = FAILOVER | crate::message::op::REPLY;
    /// The primary's messages on a flow, in answer to SUBSCRIBE.
    pub const SYNC: u8 = SUBSCRIBE | crate::message::op::REPLY;
    /// Sent once, first, on a flow: how many buckets of each kind the
    /// primary shard holds, so the follower sizes its tables before the
    /// full sync instead of growing them step by step under it.
    pub const SIZES: u8 = 0xa1;
}

/// Largest payload of one SYNC: records never straddle two messages, and
/// a bucket whose state is larger (a long sliding log, many leases) is sent
/// as several records flagged [`RECORD_MORE`].
pub const SYNC_PAYLOAD_BYTES_MAX: usize = 60 << 10;
/// Bytes a [`SyncWriter`] reserves when it starts a payload: all a payload
/// may hold.
const OPEN_BYTES_FIRST: usize = SYNC_PAYLOAD_BYTES_MAX - SYNC_FIXED_BYTES;
/// Bytes of a SYNC's fixed part.
pub const SYNC_FIXED_BYTES: usize = 8 + 8 + 8 + 1 + 4;
/// Flag on a SYNC: the full sync of this flow is complete with it; what
/// follows is the stream.
pub const SYNC_FULL_DONE: u8 = 0x01;
/// Flag on a SYNC: planned handover. The follower applies this SYNC, acks
/// it, and becomes the primary at the SYNC's epoch; the old primary follows
/// it.
pub const SYNC_TAKEOVER: u8 = 0x02;
/// Kind-byte flag on a record: the bucket is gone (full, reset or evicted):
/// the follower drops what it has.
pub const RECORD_ABSENT: u8 = 0x80;
/// Kind-byte flag on a sliding-log or concurrency record: more runs or
/// leases of the same bucket follow in the next record.
pub const RECORD_MORE: u8 = 0x40;
/// Bytes every record starts with: kind and flags, then the bucket key.
pub const RECORD_HEAD_BYTES: usize = 1 + 16;
/// Runs or leases one record part holds at most (keeps a part well under
/// [`SYNC_PAYLOAD_BYTES_MAX`]).
pub const RECORD_PART_ITEMS_MAX: usize = 1024;

// A part of the largest kind fits one SYNC with its fixed part.
const _: () = assert!(
    SYNC_FIXED_BYTES + RECORD_HEAD_BYTES + 12 + RECORD_PART_ITEMS_MAX * 24
        <= SYNC_PAYLOAD_BYTES_MAX
);
const _: () = assert!(SYNC_PAYLOAD_BYTES_MAX < u16::MAX as usize);

crate::codes::wire_codes! {
    /// A node's role (ROLE_OK).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Role {
        /// Admits: spends, refunds, resets.
        Primary = 1 => "primary",
        /// Holds a copy of its primary's buckets; refuses to spend
        /// (NOT_PRIMARY) until promoted.
        Follower = 2 => "follower",
    }
}

crate::codes::wire_codes! {
    /// How a node's replication stands (ROLE_OK).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum ReplState {
        /// A primary with no follower configured or connected: it serves alone.
        Alone = 0 => "alone",
        /// A full sync is in progress (primary: sending; follower: receiving).
        Syncing = 1 => "syncing",
        /// The full sync is done and changes stream as they happen.
        Streaming = 2 => "streaming",
        /// A follower that has lost its primary (and keeps trying).
        Down = 3 => "down",
        /// A primary whose lease has run out (no ack from its follower in
        /// time: the follower may be promoting): it admits nothing.
        Fenced = 4 => "fenced",
    }
}

crate::codes::wire_codes! {
    /// A primary's replication mode (ROLE_OK).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Mode {
        /// Replies do not wait for the follower.
        Async = 0 => "async",
        /// A reply that reflects a change leaves only after the follower has
        /// acknowledged that change.
        Sync = 1 => "sync",
    }
}

/// ROLE_OK: who the node is and how its replication stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleOk {
    /// Primary or follower.
    pub role: Role,
    /// Replication state.
    pub state: ReplState,
    /// The node's own `--replication` setting (what it does when it is, or
    /// becomes, primary).
    pub mode: Mode,
    /// The node's epoch: raised by every promotion.
    pub epoch: u64,
    /// Follower: how far behind its primary's clock its newest SYNC is, in
    /// microseconds; primary: the same, as its follower last acknowledged.
    pub lag_us: u64,
    /// Buckets received (follower) or sent (primary) by full syncs.
    pub keys_synced: u64,
    /// Bytes of SYNC payload sent (primary) or received (follower) so far.
    pub stream_bytes: u64,
    /// Records sent (primary) or received (follower) so far, full syncs
    /// included.
    pub stream_records: u64,
    /// The primary's address (a follower's `replica_of`; a primary's own).
    pub primary: String,
    /// The follower's address as the primary sees it; empty if none.
    pub follower: String,
}

/// Bytes of ROLE_OK's fixed part.
pub const ROLE_OK_FIXED_BYTES: usize = 4 + 8 + 8 + 8 + 8 + 8;
/// Longest address in ROLE_OK.
pub const ADDR_BYTES_MAX: usize = 255;

impl RoleOk {
    /// Appends the payload.
    pub fn put(&self, buf: &mut BytesMut) {
        buf.put_u8(self.role.code());
        buf.put_u8(self.state.code());
        buf.put_u8(self.mode.code());
        buf.put_u8(0);
        buf.put_u64_le(self.epoch);
        buf.put_u64_le(self.lag_us);
        buf.put_u64_le(self.keys_synced);
        buf.put_u64_le(self.stream_bytes);
        buf.put_u64_le(self.stream_records);
        for addr in [&self.primary, &self.follower] {
            let bytes = &addr.as_bytes()[..addr.len().min(ADDR_BYTES_MAX)];
            buf.put_u8(bytes.len() as u8);
            buf.put_slice(bytes);
        }
    }

    /// Parses a payload; `None` if it does not have ROLE_OK's layout.
    pub fn parse(p: &[u8]) -> Option<RoleOk> {
        let mut r = Reader(p);
        let role = Role::from_code(r.u8()?)?;
        let state = ReplState::from_code(r.u8()?)?;
        let mode = Mode::from_code(r.u8()?)?;
        r.u8()?;
        let epoch = r.u64()?;
        let lag_us = r.u64()?;
        let keys_synced = r.u64()?;
        let stream_bytes = r.u64()?;
        let stream_records = r.u64()?;
        let mut addr = || {
            let n = usize::from(r.u8()?);
            String::from_utf8(r.bytes(n)?.to_vec()).ok()
        };
        let primary = addr()?;
        let follower = addr()?;
        r.0.is_empty().then_some(RoleOk {
            role,
            state,
            mode,
            epoch,
            lag_us,
            keys_synced,
            stream_bytes,
            stream_records,
            primary,
            follower,
        })
    }
}

/// Appends a ROLE_OK.
pub fn put_role_ok(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, r: &RoleOk) {
    w.message(buf, op::ROLE_OK, request_id, |b| r.put(b));
}

/// Appends a PROMOTE_OK carrying the node's new epoch.
pub fn put_promote_ok(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, epoch: u64) {
    w.message(buf, op::PROMOTE_OK, request_id, |b| b.put_u64_le(epoch));
}

/// FAILOVER_OK: the new epoch, and how long the group admitted nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverOk {
    /// The epoch the follower was promoted to.
    pub epoch: u64,
    /// From the moment the old primary stopped admitting to the moment the
    /// new one said it is primary, in microseconds.
    pub unavailable_us: u64,
}

impl FailoverOk {
    /// Parses a payload; `None` if it does not have FAILOVER_OK's layout.
    pub fn parse(p: &[u8]) -> Option<FailoverOk> {
        let mut r = Reader(p);
        let ok = FailoverOk {
            epoch: r.u64()?,
            unavailable_us: r.u64()?,
        };
        r.0.is_empty().then_some(ok)
    }
}

/// Appends a FAILOVER_OK.
pub fn put_failover_ok(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, ok: &FailoverOk) {
    w.message(buf, op::FAILOVER_OK, request_id, |b| {
        b.put_u64_le(ok.epoch);
        b.put_u64_le(ok.unavailable_us);
    });
}

/// SUBSCRIBE: a follower asks the primary shard its connection is bound to
/// for that shard's flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// The follower's node id (HELLO_OK's), for the primary's logs.
    pub node_id: u64,
    /// The highest epoch the follower knows.
    pub epoch: u64,
    /// The primary shard the follower expects to be bound to (checked).
    pub shard: u16,
    /// The follower's `--promote-after-ms` (0: it never promotes itself).
    /// When set, the primary fences itself: it stops admitting once its
    /// lease, min(half of this, 200 ms) from the sending of the last
    /// acknowledged SYNC, has run out.
    pub promote_after_ms: u32,
    /// Where the follower serves clients (a planned failover hands over to
    /// it, and the old primary then follows it there).
    pub addr: String,
}

/// Bytes of SUBSCRIBE's fixed part (the address follows).
pub const SUBSCRIBE_FIXED_BYTES: usize = 8 + 8 + 2 + 4 + 1;

impl Subscribe {
    /// Parses a payload; `None` if it does not have SUBSCRIBE's layout.
    pub fn parse(p: &[u8]) -> Option<Subscribe> {
        let mut r = Reader(p);
        let node_id = r.u64()?;
        let epoch = r.u64()?;
        let shard = r.u16()?;
        let promote_after_ms = r.u32()?;
        let n = usize::from(r.u8()?);
        let addr = String::from_utf8(r.bytes(n)?.to_vec()).ok()?;
        r.0.is_empty().then_some(Subscribe {
            node_id,
            epoch,
            shard,
            promote_after_ms,
            addr,
        })
    }

    /// Appends a SUBSCRIBE message.
    pub fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
        w.message(buf, op::SUBSCRIBE, request_id, |b| {
            b.put_u64_le(self.node_id);
            b.put_u64_le(self.epoch);
            b.put_u16_le(self.shard);
            b.put_u32_le(self.promote_after_ms);
            let addr = &self.addr.as_bytes()[..self.addr.len().min(ADDR_BYTES_MAX)];
            b.put_u8(addr.len() as u8);
            b.put_slice(addr);
        });
    }
}

/// SIZES: buckets of each kind a primary shard holds as its full sync
/// starts, in [`Kind`] code order (token bucket, fixed window, sliding log,
/// sliding counter, concurrency).
pub type Sizes = [u64; 5];

/// Bytes of SIZES's payload.
pub const SIZES_BYTES: usize = 5 * 8;

/// Appends a SIZES message.
pub fn put_sizes(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, sizes: &Sizes) {
    w.message(buf, op::SIZES, request_id, |b| {
        for n in sizes {
            b.put_u64_le(*n);
        }
    });
}

/// Parses a SIZES payload.
pub fn parse_sizes(p: &[u8]) -> Option<Sizes> {
    let mut r = Reader(p);
    let mut sizes = [0u64; 5];
    for n in &mut sizes {
        *n = r.u64()?;
    }
    r.0.is_empty().then_some(sizes)
}

/// Appends an ACK of every SYNC up to `seq`.
pub fn put_ack(w: &mut FrameWriter, buf: &mut BytesMut, seq: u64) {
    w.message(buf, op::ACK, 0, |b| b.put_u64_le(seq));
}

/// Parses an ACK's payload: the sequence number acknowledged.
pub fn parse_ack(p: &[u8]) -> Option<u64> {
    let mut r = Reader(p);
    let seq = r.u64()?;
    r.0.is_empty().then_some(seq)
}

/// One bucket's state, as a SYNC carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// A GCRA bucket.
    TokenBucket(Bucket),
    /// A fixed window, with the window length it was last decided under.
    FixedWindow {
        /// The window's length (the follower's sweep needs it).
        window_ns: u64,
        /// The count and where the window started.
        state: FixedWindowState,
    },
    /// A sliding window counter, with its window length.
    SlidingCounter {
        /// The window's length.
        window_ns: u64,
        /// The two windows' counts.
        state: SlidingCounterState,
    },
    /// A sliding log, with its window length.
    SlidingLog {
        /// The window's length.
        window_ns: u64,
        /// The admissions still in the window.
        log: SlidingLogState,
    },
    /// A concurrency limit's leases.
    Concurrency(ConcurrencyState),
}

impl State {
    /// The limit kind this state belongs to.
    pub fn kind(&self) -> Kind {
        match self {
            State::TokenBucket(_) => Kind::TokenBucket,
            State::FixedWindow { .. } => Kind::FixedWindow,
            State::SlidingCounter { .. } => Kind::SlidingCounter,
            State::SlidingLog { .. } => Kind::SlidingLog,
            State::Concurrency(_) => Kind::Concurrency,
        }
    }
}

/// One bucket's change: its state now, or that it is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The bucket's kind (which table it lives in).
    pub kind: Kind,
    /// The bucket key.
    pub key: u128,
    /// Its state; `None`: the bucket is gone (equivalent to full).
    pub state: Option<State>,
}

fn kind_from_code(code: u8) -> Option<Kind> {
    match code {
        1 => Some(Kind::TokenBucket),
        2 => Some(Kind::FixedWindow),
        3 => Some(Kind::SlidingLog),
        4 => Some(Kind::SlidingCounter),
        5 => Some(Kind::Concurrency),
        _ => None,
    }
}

/// Bytes of a fixed-size kind's record with its state, head included
/// (`None`: the kind's records vary in size).
const fn fixed_record_len(kind: Kind) -> Option<usize> {
    match kind {
        Kind::TokenBucket => Some(RECORD_HEAD_BYTES + 16),
        Kind::FixedWindow => Some(RECORD_HEAD_BYTES + 24),
        Kind::SlidingCounter => Some(RECORD_HEAD_BYTES + 32),
        Kind::SlidingLog | Kind::Concurrency => None,
    }
}

/// The largest fixed-size record.
const FIXED_RECORD_BYTES_MAX: usize = RECORD_HEAD_BYTES + 32;

/// A token bucket's record length: with its state, or absent.
#[inline]
fn bucket_record_len(tat_fp: Option<u128>) -> usize {
    match tat_fp {
        Some(_) => RECORD_HEAD_BYTES + 16,
        None => RECORD_HEAD_BYTES,
    }
}

/// A token bucket's record's first byte: its kind, flagged when absent.
#[inline]
fn bucket_code(tat_fp: Option<u128>) -> u8 {
    match tat_fp {
        Some(_) => Kind::TokenBucket as u8,
        None => Kind::TokenBucket as u8 | RECORD_ABSENT,
    }
}

/// A fixed-size record (a token bucket, fixed window or sliding counter,
/// or an absent bucket of any kind), encoded: what
/// [`SyncWriter::push_fixed`] appends and
/// [`SyncWriter::overwrite_fixed`] writes over an older one.
#[derive(Clone, Copy, Debug)]
pub struct FixedRecord {
    bytes: [u8; FIXED_RECORD_BYTES_MAX],
    len: usize,
}

impl FixedRecord {
    /// `key`'s record with `state` (`None`: absent); `None` for a sliding
    /// log's or lease list's state, whose records vary in size.
    #[inline]
    pub fn new(kind: Kind, key: u128, state: Option<&State>) -> Option<FixedRecord> {
        let mut r = [0u8; FIXED_RECORD_BYTES_MAX];
        r[1..17].copy_from_slice(&key.to_le_bytes());
        let len = match state {
            None => {
                r[0] = kind as u8 | RECORD_ABSENT;
                return Some(FixedRecord {
                    bytes: r,
                    len: RECORD_HEAD_BYTES,
                });
            }
            Some(State::TokenBucket(b)) => {
                r[17..33].copy_from_slice(&b.tat_fp.to_le_bytes());
                RECORD_HEAD_BYTES + 16
            }
            Some(State::FixedWindow { window_ns, state }) => {
                r[17..25].copy_from_slice(&window_ns.to_le_bytes());
                r[25..33].copy_from_slice(&state.window_start_ns.to_le_bytes());
                r[33..41].copy_from_slice(&state.count.to_le_bytes());
                RECORD_HEAD_BYTES + 24
            }
            Some(State::SlidingCounter { window_ns, state }) => {
                r[17..25].copy_from_slice(&window_ns.to_le_bytes());
                r[25..33].copy_from_slice(&state.window_start_ns.to_le_bytes());
                r[33..41].copy_from_slice(&state.prev.to_le_bytes());
                r[41..49].copy_from_slice(&state.cur.to_le_bytes());
                RECORD_HEAD_BYTES + 32
            }
            Some(State::SlidingLog { .. }) | Some(State::Concurrency(_)) => return None,
        };
        r[0] = kind as u8;
        Some(FixedRecord { bytes: r, len })
    }

    /// Its bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        // One length per kind, each a constant copy once inlined.
        match self.len {
            33 => &self.bytes[..33],
            17 => &self.bytes[..17],
            41 => &self.bytes[..41],
            _ => &self.bytes[..self.len],
        }
    }
}

/// Encodes records into SYNC payloads of at most
/// [`SYNC_PAYLOAD_BYTES_MAX`] bytes each.
#[derive(Debug, Default)]
pub struct SyncWriter {
    /// Finished payloads' record bytes, each with its record count.
    done: Vec<(u32, BytesMut)>,
    /// The payload being filled.
    open: BytesMut,
    /// Records in `open`.
    open_count: u32,
}

impl SyncWriter {
    /// An empty writer.
    pub fn new() -> SyncWriter {
        SyncWriter::default()
    }

    /// Whether no record has been added.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty() && self.open_count == 0
    }

    /// Bytes of records added so far.
    pub fn bytes(&self) -> usize {
        self.done.iter().map(|(_, b)| b.len()).sum::<usize>() + self.open.len()
    }

    #[inline]
    fn room(&mut self, need: usize) -> &mut BytesMut {
        if SYNC_FIXED_BYTES + self.open.len() + need > SYNC_PAYLOAD_BYTES_MAX {
            let full = std::mem::take(&mut self.open);
            self.done.push((self.open_count, full));
            self.open_count = 0;
        }
        if self.open.capacity() == 0 {
            // The whole payload at once: growing by doublings copied each
            // payload about twice over (only what is written is touched).
            self.open.reserve(OPEN_BYTES_FIRST);
        }
        self.open_count += 1;
        &mut self.open
    }

    /// Adds one bucket's change.
    pub fn push(&mut self, kind: Kind, key: u128, state: Option<&State>) {
        debug_assert!(state.map_or(true, |s| s.kind() == kind));
        // Fixed-size (every decision of a client under its limit writes
        // one): assembled whole, copied once.
        if let Some(r) = FixedRecord::new(kind, key, state) {
            self.push_fixed(&r);
            return;
        }
        match state {
            Some(State::SlidingLog { window_ns, log }) => {
                let runs: Vec<(u64, u64)> = log.runs().collect();
                self.push_parts(kind, key, *window_ns, &runs, 16, |b, &(at, units)| {
                    b.put_u64_le(at);
                    b.put_u64_le(units);
                });
            }
            Some(State::Concurrency(c)) => {
                self.push_parts(kind, key, 0, c.leases(), 24, |b, l| {
                    b.put_u64_le(l.id);
                    b.put_u64_le(l.expires_ns);
                    b.put_u64_le(l.units);
                });
            }
            _ => {}
        }
    }

    /// Decodes the records added so far, as a follower reads them, in
    /// order (consumes the writer; for tests and tools).
    pub fn into_records(mut self) -> Result<Vec<Record>, SyncError> {
        let mut out = Vec::new();
        let mut reader = SyncReader::new();
        for (count, records) in self.take() {
            let mut p = BytesMut::with_capacity(SYNC_FIXED_BYTES + records.len());
            let h = SyncHeader {
                seq: 1,
                epoch: 1,
                now_ns: 0,
                flags: 0,
                count,
            };
            put_sync_fixed(&mut p, &h);
            p.put_slice(&records);
            reader.parse(&p, |r| out.push(r))?;
        }
        Ok(out)
    }

    /// Adds `other`'s records after this writer's (its payloads after
    /// this one's; a payload of each is not merged).
    pub fn append(&mut self, mut other: SyncWriter) {
        if other.is_empty() {
            return;
        }
        if self.is_empty() {
            *self = other;
            return;
        }
        let mut done = self.take();
        done.extend(other.take());
        self.done = done;
    }

    /// Appends a fixed-size record, returning where it is for
    /// [`SyncWriter::overwrite_fixed`] (`None`: past the 65,536th payload,
    /// where a place no longer fits a `u32`).
    #[inline]
    pub fn push_fixed(&mut self, r: &FixedRecord) -> Option<u32> {
        let bytes = r.as_bytes();
        let b = self.room(bytes.len());
        let offset = b.len();
        b.extend_from_slice(bytes);
        self.place(offset)
    }

    /// The place of a record at `offset` in the open payload (`None` past
    /// the 65,536th payload). Offsets stay below SYNC_PAYLOAD_BYTES_MAX <
    /// 2^16.
    #[inline]
    fn place(&self, offset: usize) -> Option<u32> {
        let payload = self.done.len();
        (payload < 1 << 16).then_some(((payload as u32) << 16) | offset as u32)
    }

    /// The `len` bytes at place `at`, if they were written.
    #[inline]
    fn record_mut(&mut self, at: u32, len: usize) -> Option<&mut [u8]> {
        let (payload, offset) = ((at >> 16) as usize, (at & 0xffff) as usize);
        let buf = match payload.cmp(&self.done.len()) {
            std::cmp::Ordering::Less => &mut self.done[payload].1,
            std::cmp::Ordering::Equal => &mut self.open,
            std::cmp::Ordering::Greater => return None,
        };
        buf.get_mut(offset..offset + len)
    }

    /// [`SyncWriter::push_fixed`] of a token bucket's record (`None`:
    /// absent), assembled in place at its constant size: the same bytes as
    /// through [`FixedRecord::new`], without the 49-byte record between.
    #[inline]
    pub fn push_bucket(&mut self, key: u128, tat_fp: Option<u128>) -> Option<u32> {
        let b = self.room(bucket_record_len(tat_fp));
        let offset = b.len();
        // Each arm one copy of a constant size.
        match tat_fp {
            Some(tat_fp) => {
                let mut r = [0u8; RECORD_HEAD_BYTES + 16];
                r[0] = bucket_code(Some(tat_fp));
                r[1..17].copy_from_slice(&key.to_le_bytes());
                r[17..].copy_from_slice(&tat_fp.to_le_bytes());
                b.extend_from_slice(&r);
            }
            None => {
                let mut r = [0u8; RECORD_HEAD_BYTES];
                r[0] = bucket_code(None);
                r[1..].copy_from_slice(&key.to_le_bytes());
                b.extend_from_slice(&r);
            }
        }
        self.place(offset)
    }

    /// [`SyncWriter::overwrite_fixed`] of a token bucket's record, as
    /// [`SyncWriter::push_bucket`] writes it.
    #[inline]
    pub fn overwrite_bucket(&mut self, at: u32, key: u128, tat_fp: Option<u128>) -> bool {
        let Some(old) = self.record_mut(at, bucket_record_len(tat_fp)) else {
            return false;
        };
        let (code, rest) = old.split_at_mut(1);
        let (old_key, body) = rest.split_at_mut(16);
        if code[0] != bucket_code(tat_fp) || old_key != key.to_le_bytes() {
            return false;
        }
        if let Some(tat_fp) = tat_fp {
            body.copy_from_slice(&tat_fp.to_le_bytes());
        }
        true
    }

    /// Writes `r` over the record [`SyncWriter::push_fixed`] placed at
    /// `at`, if that record is of the same kind and key, and as long (a
    /// bucket gone, or come back, is pushed anew instead). Whether it did.
    #[inline]
    pub fn overwrite_fixed(&mut self, at: u32, r: &FixedRecord) -> bool {
        let bytes = r.as_bytes();
        let Some(old) = self.record_mut(at, bytes.len()) else {
            return false;
        };
        // Same kind byte and key (both at least a head long).
        if old[..RECORD_HEAD_BYTES] != bytes[..RECORD_HEAD_BYTES] {
            return false;
        }
        old.copy_from_slice(bytes);
        true
    }

    /// The kind and key of every record added, in order, when all are
    /// fixed-size (as [`SyncWriter::push_fixed`] adds them): `None` at the
    /// first that is not.
    pub fn fixed_keys(&self) -> Option<Vec<(Kind, u128)>> {
        let mut out = Vec::new();
        for p in self
            .done
            .iter()
            .map(|(_, b)| b)
            .chain(std::iter::once(&self.open))
        {
            let mut r = Reader(p);
            while let Some(code) = r.u8() {
                let kind = kind_from_code(code & !RECORD_ABSENT)?;
                let key = r.u128()?;
                let body = if code & RECORD_ABSENT != 0 {
                    0
                } else {
                    fixed_record_len(kind)? - RECORD_HEAD_BYTES
                };
                r.bytes(body)?;
                out.push((kind, key));
            }
        }
        Some(out)
    }

    /// A variable-length state as one or more parts: kind (with
    /// [`RECORD_MORE`] on all but the last), key, window_ns (u64, 0 for
    /// concurrency), item count (u32), items.
    fn push_parts<T>(
        &mut self,
        kind: Kind,
        key: u128,
        window_ns: u64,
        items: &[T],
        item_bytes: usize,
        put: impl Fn(&mut BytesMut, &T),
    ) {
        let mut chunks = items.chunks(RECORD_PART_ITEMS_MAX).peekable();
        if chunks.peek().is_none() {
            // An empty state still says what it is (the follower stores it).
            let b = self.room(RECORD_HEAD_BYTES + 12);
            b.put_u8(kind as u8);
            b.put_u128_le(key);
            b.put_u64_le(window_ns);
            b.put_u32_le(0);
            return;
        }
        while let Some(part) = chunks.next() {
            let more = chunks.peek().is_some();
            let b = self.room(RECORD_HEAD_BYTES + 12 + part.len() * item_bytes);
            b.put_u8(kind as u8 | if more { RECORD_MORE } else { 0 });
            b.put_u128_le(key);
            b.put_u64_le(window_ns);
            b.put_u32_le(part.len() as u32);
            for item in part {
                put(b, item);
            }
        }
    }

    /// The SYNC payloads' record parts, each with its record count, in
    /// order (consumes what was added).
    pub fn take(&mut self) -> Vec<(u32, BytesMut)> {
        if self.open_count > 0 {
            let open = std::mem::take(&mut self.open);
            self.done.push((self.open_count, open));
            self.open_count = 0;
        }
        std::mem::take(&mut self.done)
    }
}

/// A SYNC's fixed part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncHeader {
    /// This SYNC's number on its flow: 1, 2, 3, ... An ACK of `n` covers
    /// every SYNC up to `n`.
    pub seq: u64,
    /// The primary's epoch.
    pub epoch: u64,
    /// The primary's clock when it encoded this SYNC (lag is measured
    /// against it).
    pub now_ns: u64,
    /// [`SYNC_FULL_DONE`], [`SYNC_TAKEOVER`], both or neither.
    pub flags: u8,
    /// Records that follow.
    pub count: u32,
}

/// Appends a SYNC message: the fixed part, then `records` (as produced by
/// [`SyncWriter::take`]).
pub fn put_sync(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    h: &SyncHeader,
    records: &[u8],
) {
    assert!(SYNC_FIXED_BYTES + records.len() <= SYNC_PAYLOAD_BYTES_MAX);
    w.message(buf, op::SYNC, request_id, |b| {
        put_sync_fixed(b, h);
        b.put_slice(records);
    });
}

/// The bytes before a SYNC's records when the SYNC is sent as a frame of
/// its own: the frame's length, the message header, the fixed part.
pub const SYNC_HEAD_BYTES: usize =
    crate::codec::FRAME_PREFIX_BYTES + crate::codec::HEADER_BYTES + SYNC_FIXED_BYTES;

/// The head of a frame holding one SYNC whose records are `records_len`
/// bytes: sent with the records after it, the same bytes as
/// [`put_sync`] alone in a [`FrameWriter`], without copying the records
/// (the primary writes head and records as one vectored write).
pub fn sync_frame_head(
    request_id: u32,
    h: &SyncHeader,
    records_len: usize,
) -> [u8; SYNC_HEAD_BYTES] {
    use crate::codec::{message_header, FRAME_PREFIX_BYTES, HEADER_BYTES};
    assert!(SYNC_FIXED_BYTES + records_len <= SYNC_PAYLOAD_BYTES_MAX);
    let payload = SYNC_FIXED_BYTES + records_len;
    let mut out = [0u8; SYNC_HEAD_BYTES];
    let frame = (HEADER_BYTES + payload) as u32;
    out[..FRAME_PREFIX_BYTES].copy_from_slice(&frame.to_le_bytes());
    out[FRAME_PREFIX_BYTES..FRAME_PREFIX_BYTES + HEADER_BYTES].copy_from_slice(&message_header(
        op::SYNC,
        request_id,
        payload as u16,
    ));
    let mut fixed = &mut out[FRAME_PREFIX_BYTES + HEADER_BYTES..];
    put_sync_fixed(&mut fixed, h);
    out
}

/// A SYNC payload's fixed part ([`SYNC_FIXED_BYTES`]), which its records
/// follow (snapshots store payloads without a frame around them).
pub fn put_sync_fixed(b: &mut impl BufMut, h: &SyncHeader) {
    b.put_u64_le(h.seq);
    b.put_u64_le(h.epoch);
    b.put_u64_le(h.now_ns);
    b.put_u8(h.flags);
    b.put_u32_le(h.count);
}

/// Why a SYNC did not parse (the flow can't be trusted: the follower drops
/// the connection and resyncs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// The payload ends inside a field.
    #[error("SYNC truncated")]
    Truncated,
    /// A record names a kind this version does not know.
    #[error("SYNC record of unknown kind {0}")]
    UnknownKind(u8),
    /// A record's runs or leases are not a state decisions can produce.
    #[error("SYNC record with a corrupt state")]
    CorruptState,
    /// A continued record changed key or kind (a record split in parts may
    /// run on into the next SYNC: see [`SyncReader::in_part`]).
    #[error("SYNC record parts do not line up")]
    BrokenParts,
    /// Bytes after the last record.
    #[error("SYNC has bytes after its records")]
    Trailing,
}

/// Reassembles records split into parts across SYNCs of one flow.
#[derive(Debug, Default)]
pub struct SyncReader {
    /// The bucket being continued: kind, key, window, items so far.
    partial: Option<(Kind, u128, u64, Vec<[u64; 3]>)>,
}

impl SyncReader {
    /// A reader with nothing pending.
    pub fn new() -> SyncReader {
        SyncReader::default()
    }

    /// Parses one SYNC payload, calling `apply` for every whole record.
    pub fn parse(
        &mut self,
        p: &[u8],
        mut apply: impl FnMut(Record),
    ) -> Result<SyncHeader, SyncError> {
        let mut r = Reader(p);
        let h = sync_header(&mut r)?;
        for _ in 0..h.count {
            if let Some(rec) = self.record(&mut r)? {
                apply(rec);
            }
        }
        if !r.0.is_empty() {
            return Err(SyncError::Trailing);
        }
        Ok(h)
    }

    /// [`SyncReader::parse`], with every token-bucket record (the common
    /// kind) handed to `bucket` as its key and state (`None`: absent)
    /// without building a [`Record`], and every other record to `apply`.
    /// The same records, checked the same way; only a token bucket's path
    /// is shorter. Applying the two lists one after the other keeps each
    /// kind's records in order, which is all the order there is: every
    /// kind is a table of its own. `parse` keeps its own loop on purpose:
    /// it is the reference this path is checked against (a unit test and
    /// the `replication` fuzz target), which one shared loop would lose.
    pub fn parse_buckets(
        &mut self,
        p: &[u8],
        mut bucket: impl FnMut(u128, Option<Bucket>),
        mut apply: impl FnMut(Record),
    ) -> Result<SyncHeader, SyncError> {
        const PRESENT: u8 = 1;
        const ABSENT: u8 = 1 | RECORD_ABSENT;
        let mut r = Reader(p);
        let h = sync_header(&mut r)?;
        for _ in 0..h.count {
            // Not while a split record is being continued: `record` says
            // what is wrong with a token bucket there.
            let code = if self.partial.is_none() {
                r.0.first().copied()
            } else {
                None
            };
            match code {
                Some(PRESENT) if r.0.len() >= RECORD_HEAD_BYTES + 16 => {
                    let b = r.bytes(RECORD_HEAD_BYTES + 16).expect("length checked");
                    let key = u128::from_le_bytes(b[1..17].try_into().expect("16 bytes"));
                    let tat_fp = u128::from_le_bytes(b[17..33].try_into().expect("16 bytes"));
                    bucket(key, Some(Bucket { tat_fp }));
                }
                Some(ABSENT) if r.0.len() >= RECORD_HEAD_BYTES => {
                    let b = r.bytes(RECORD_HEAD_BYTES).expect("length checked");
                    bucket(
                        u128::from_le_bytes(b[1..17].try_into().expect("16 bytes")),
                        None,
                    );
                }
                _ => {
                    if let Some(rec) = self.record(&mut r)? {
                        apply(rec);
                    }
                }
            }
        }
        if !r.0.is_empty() {
            return Err(SyncError::Trailing);
        }
        Ok(h)
    }

    fn record(&mut self, r: &mut Reader<'_>) -> Result<Option<Record>, SyncError> {
        let t = SyncError::Truncated;
        let code = r.u8().ok_or(t)?;
        let kind = kind_from_code(code & !(RECORD_ABSENT | RECORD_MORE))
            .ok_or(SyncError::UnknownKind(code))?;
        let key = r.u128().ok_or(t)?;
        let continuing = self.partial.as_ref().map(|(k, key, _, _)| (*k, *key));
        if continuing.is_some_and(|c| c != (kind, key)) {
            return Err(SyncError::BrokenParts);
        }
        if code & RECORD_ABSENT != 0 {
            if continuing.is_some() || code & RECORD_MORE != 0 {
                return Err(SyncError::BrokenParts);
            }
            return Ok(Some(Record {
                kind,
                key,
                state: None,
            }));
        }
        let state = match kind {
            Kind::TokenBucket => State::TokenBucket(Bucket {
                tat_fp: r.u128().ok_or(t)?,
            }),
            Kind::FixedWindow => State::FixedWindow {
                window_ns: r.u64().ok_or(t)?,
                state: FixedWindowState {
                    window_start_ns: r.u64().ok_or(t)?,
                    count: r.u64().ok_or(t)?,
                },
            },
            Kind::SlidingCounter => State::SlidingCounter {
                window_ns: r.u64().ok_or(t)?,
                state: SlidingCounterState {
                    window_start_ns: r.u64().ok_or(t)?,
                    prev: r.u64().ok_or(t)?,
                    cur: r.u64().ok_or(t)?,
                },
            },
            Kind::SlidingLog | Kind::Concurrency => {
                return self.part(r, code, kind, key);
            }
        };
        if code & RECORD_MORE != 0 {
            return Err(SyncError::BrokenParts);
        }
        Ok(Some(Record {
            kind,
            key,
            state: Some(state),
        }))
    }

    fn part(
        &mut self,
        r: &mut Reader<'_>,
        code: u8,
        kind: Kind,
        key: u128,
    ) -> Result<Option<Record>, SyncError> {
        let t = SyncError::Truncated;
        let window_ns = r.u64().ok_or(t)?;
        let n = r.u32().ok_or(t)? as usize;
        let width = if kind == Kind::SlidingLog { 2 } else { 3 };
        // Checked against what is there before anything is allocated.
        if n > RECORD_PART_ITEMS_MAX || r.0.len() < n * width * 8 {
            return Err(t);
        }
        let (_, _, _, items) = self
            .partial
            .get_or_insert_with(|| (kind, key, window_ns, Vec::new()));
        for _ in 0..n {
            let mut item = [0u64; 3];
            for v in item.iter_mut().take(width) {
                *v = r.u64().ok_or(t)?;
            }
            items.push(item);
        }
        // Bounded like the states themselves (limits of at most 65,536).
        if items.len() > crate::limit::SLIDING_LOG_LIMIT_MAX as usize {
            return Err(SyncError::CorruptState);
        }
        if code & RECORD_MORE != 0 {
            return Ok(None);
        }
        let (_, _, window_ns, items) = self.partial.take().expect("set above");
        let state = if kind == Kind::SlidingLog {
            let log = SlidingLogState::from_runs(items.iter().map(|i| (i[0], i[1])))
                .ok_or(SyncError::CorruptState)?;
            State::SlidingLog { window_ns, log }
        } else {
            let leases = items.iter().map(|i| Lease {
                id: i[0],
                expires_ns: i[1],
                units: i[2],
            });
            State::Concurrency(
                ConcurrencyState::from_leases(leases).ok_or(SyncError::CorruptState)?,
            )
        };
        Ok(Some(Record {
            kind,
            key,
            state: Some(state),
        }))
    }

    /// Whether a record is waiting for its next part.
    pub fn in_part(&self) -> bool {
        self.partial.is_some()
    }
}

/// Reads little-endian fields off a payload.
/// A SYNC payload's fixed part.
fn sync_header(r: &mut Reader<'_>) -> Result<SyncHeader, SyncError> {
    let t = SyncError::Truncated;
    Ok(SyncHeader {
        seq: r.u64().ok_or(t)?,
        epoch: r.u64().ok_or(t)?,
        now_ns: r.u64().ok_or(t)?,
        flags: r.u8().ok_or(t)?,
        count: r.u32().ok_or(t)?,
    })
}

#[derive(Debug)]
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.bytes(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.bytes(2)
            .map(|b| u16::from_le_bytes(b.try_into().unwrap()))
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.bytes(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
    fn u128(&mut self) -> Option<u128> {
        self.bytes(16)
            .map(|b| u128::from_le_bytes(b.try_into().unwrap()))
    }
}

/// Whether a message header is a SYNC (a follower's flow reads nothing
/// else).
pub fn is_sync(h: &MessageHeader) -> bool {
    h.op == op::SYNC
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SYNC framed alone by its head and records is the bytes a
    /// FrameWriter makes of it, heartbeats (no records) included.
    #[test]
    fn a_sync_frame_head_and_its_records_are_put_sync_in_a_frame() {
        let h = SyncHeader {
            seq: 0x0102_0304_0506_0708,
            epoch: 9,
            now_ns: u64::MAX - 1,
            flags: SYNC_FULL_DONE,
            count: 3,
        };
        for records in [&b""[..], b"abc", &[7u8; 1000][..]] {
            let mut want = BytesMut::new();
            let mut w = FrameWriter::new();
            put_sync(&mut w, &mut want, 0xdead_beef, &h, records);
            w.finish(&mut want);
            let mut got = sync_frame_head(0xdead_beef, &h, records.len()).to_vec();
            got.extend_from_slice(records);
            assert_eq!(got, &want[..], "{} bytes of records", records.len());
        }
    }

    /// A token bucket's record written in place (push_bucket,
    /// overwrite_bucket) is byte for byte the one FixedRecord makes, and
    /// an overwrite happens exactly where overwrite_fixed's would.
    #[test]
    fn bucket_records_in_place_are_the_fixed_records() {
        let state = |t: Option<u128>| t.map(|tat_fp| State::TokenBucket(Bucket { tat_fp }));
        let rec = |key, t| FixedRecord::new(Kind::TokenBucket, key, state(t).as_ref()).unwrap();
        let writes: [(u128, Option<u128>); 7] = [
            (u128::MAX - 5, Some(7 << 32)),
            (0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10, None),
            (u128::MAX - 5, Some(9 << 32)),
            (0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10, None),
            (u128::MAX - 5, None),
            (0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10, Some(u128::MAX)),
            (3, Some(1)),
        ];
        let (mut fixed, mut in_place) = (SyncWriter::new(), SyncWriter::new());
        let mut places = Vec::new();
        for (key, t) in writes {
            let a = fixed.push_fixed(&rec(key, t));
            let b = in_place.push_bucket(key, t);
            assert_eq!(a, b);
            places.push((key, a.unwrap()));
        }
        // Every earlier place, tried with every write: the same answer
        // and the same bytes after.
        for &(_, at) in &places {
            for (key, t) in writes {
                assert_eq!(
                    fixed.overwrite_fixed(at, &rec(key, t)),
                    in_place.overwrite_bucket(at, key, t),
                    "at {at}, key {key:x}, {t:?}"
                );
            }
        }
        assert!(
            !in_place.overwrite_bucket(1 << 16, 3, Some(1)),
            "a payload not yet begun"
        );
        assert_eq!(fixed.take(), in_place.take());
    }

    fn sample() -> Vec<Record> {
        let log = SlidingLogState::from_runs((1..=5000u64).map(|i| (i * 10, 1))).unwrap();
        let leases = ConcurrencyState::from_leases([
            Lease {
                id: 7,
                expires_ns: 500,
                units: 2,
            },
            Lease {
                id: 3,
                expires_ns: 900,
                units: 1,
            },
        ])
        .unwrap();
        vec![
            Record {
                kind: Kind::TokenBucket,
                key: 1,
                state: Some(State::TokenBucket(Bucket { tat_fp: 99 << 32 })),
            },
            Record {
                kind: Kind::FixedWindow,
                key: 2,
                state: Some(State::FixedWindow {
                    window_ns: 60,
                    state: FixedWindowState {
                        window_start_ns: 120,
                        count: 5,
                    },
                }),
            },
            Record {
                kind: Kind::SlidingCounter,
                key: 3,
                state: Some(State::SlidingCounter {
                    window_ns: 60,
                    state: SlidingCounterState {
                        window_start_ns: 120,
                        prev: 4,
                        cur: 1,
                    },
                }),
            },
            Record {
                kind: Kind::SlidingLog,
                key: 4,
                state: Some(State::SlidingLog {
                    window_ns: 1_000_000,
                    log,
                }),
            },
            Record {
                kind: Kind::Concurrency,
                key: 5,
                state: Some(State::Concurrency(leases)),
            },
            Record {
                kind: Kind::SlidingLog,
                key: 6,
                state: None,
            },
        ]
    }

    /// Encodes records into SYNC payloads as a primary would.
    fn encode(records: &[Record]) -> Vec<Vec<u8>> {
        let mut sw = SyncWriter::new();
        for r in records {
            sw.push(r.kind, r.key, r.state.as_ref());
        }
        sw.take()
            .into_iter()
            .enumerate()
            .map(|(i, (count, body))| {
                let mut p = BytesMut::new();
                p.put_u64_le(i as u64 + 1);
                p.put_u64_le(3);
                p.put_u64_le(42);
                p.put_u8(0);
                p.put_u32_le(count);
                p.put_slice(&body);
                assert!(p.len() <= SYNC_PAYLOAD_BYTES_MAX);
                p.to_vec()
            })
            .collect()
    }

    #[test]
    fn every_kind_round_trips_across_payloads() {
        let records = sample();
        let payloads = encode(&records);
        assert!(payloads.len() > 1, "the long log is split over SYNCs");
        let mut reader = SyncReader::new();
        let mut out = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            let h = reader.parse(p, |r| out.push(r)).unwrap();
            assert_eq!((h.seq, h.epoch, h.now_ns), (i as u64 + 1, 3, 42));
        }
        assert!(!reader.in_part());
        assert_eq!(out, records);
    }

    /// `parse_buckets` against `parse`: token buckets in one list, the rest
    /// in the other, each in stream order, and the same verdict on every
    /// truncation and corruption of the payloads.
    #[test]
    fn parse_buckets_reads_what_parse_reads() {
        let tb = |key, tat: Option<u128>| Record {
            kind: Kind::TokenBucket,
            key,
            state: tat.map(|tat_fp| State::TokenBucket(Bucket { tat_fp })),
        };
        let mut records = sample();
        // Token buckets before, inside (after the log's first part) and
        // after the split records, present and absent, one key twice.
        records.insert(0, tb(10, None));
        records.insert(4, tb(11, Some(7 << 32)));
        records.push(tb(10, Some(u128::MAX)));
        records.push(tb(12, None));
        let both = |reader: &mut SyncReader, p: &[u8]| {
            let mut buckets = Vec::new();
            let mut others = Vec::new();
            let h = reader.parse_buckets(
                p,
                |key, b| buckets.push(tb(key, b.map(|b| b.tat_fp))),
                |r| others.push(r),
            );
            (h, buckets, others)
        };
        let payloads = encode(&records);
        let mut reader = SyncReader::new();
        let (mut buckets, mut others) = (Vec::new(), Vec::new());
        for p in &payloads {
            let (h, b, o) = both(&mut reader, p);
            h.unwrap();
            buckets.extend(b);
            others.extend(o);
        }
        let (want_tb, want_rest): (Vec<_>, Vec<_>) = records
            .into_iter()
            .partition(|r| r.kind == Kind::TokenBucket);
        assert_eq!(buckets, want_tb);
        assert_eq!(others, want_rest);
        for p in &payloads {
            for cut in 0..p.len().min(1024) {
                let mut all = Vec::new();
                let h = SyncReader::new().parse(&p[..cut], |r| all.push(r));
                let (h2, b, o) = both(&mut SyncReader::new(), &p[..cut]);
                assert_eq!(h, h2, "cut at {cut}");
                assert_eq!(all.len(), b.len() + o.len());
            }
            for i in 0..p.len().min(1024) {
                let mut q = p.clone();
                q[i] ^= 0xa5;
                let mut all = Vec::new();
                let h = SyncReader::new().parse(&q, |r| all.push(r));
                let (h2, b, o) = both(&mut SyncReader::new(), &q);
                assert_eq!(h, h2, "byte {i} flipped");
                let (tb, rest): (Vec<_>, Vec<_>) =
                    all.into_iter().partition(|r| r.kind == Kind::TokenBucket);
                assert_eq!((tb, rest), (b, o), "byte {i} flipped");
            }
        }
    }

    #[test]
    fn corrupt_syncs_are_refused_never_panic() {
        let payloads = encode(&sample());
        let first = &payloads[0];
        // Every truncation of a SYNC is refused (or, cut at a record edge,
        // parses fewer records: the count then says more were due).
        for cut in 0..first.len() {
            assert!(SyncReader::new().parse(&first[..cut], |_| {}).is_err());
        }
        // Flipping any byte either still parses or is refused; never panics.
        for i in 0..first.len().min(4096) {
            let mut p = first.clone();
            p[i] ^= 0xa5;
            let _ = SyncReader::new().parse(&p, |_| {});
        }
        // A huge item count is refused before allocating.
        let mut p = BytesMut::new();
        p.put_slice(&first[..SYNC_FIXED_BYTES - 4]);
        p.put_u32_le(1);
        p.put_u8(Kind::SlidingLog as u8);
        p.put_u128_le(9);
        p.put_u64_le(1);
        p.put_u32_le(u32::MAX);
        assert_eq!(
            SyncReader::new().parse(&p, |_| {}),
            Err(SyncError::Truncated)
        );
    }

    #[test]
    fn sizes_round_trip() {
        let mut w = FrameWriter::new();
        let mut b = BytesMut::new();
        put_sizes(&mut w, &mut b, 2, &[1, 2, 3, 4, 5]);
        w.finish(&mut b);
        assert_eq!(parse_sizes(&b[12..]), Some([1, 2, 3, 4, 5]));
        assert_eq!(parse_sizes(&b[12..b.len() - 1]), None);
    }

    #[test]
    fn role_ok_round_trips() {
        let r = RoleOk {
            role: Role::Follower,
            state: ReplState::Streaming,
            mode: Mode::Sync,
            epoch: 4,
            lag_us: 1500,
            keys_synced: 1_000_000,
            stream_bytes: 40_000_000,
            stream_records: 1_000_000,
            primary: "127.0.0.1:7700".into(),
            follower: String::new(),
        };
        let mut b = BytesMut::new();
        r.put(&mut b);
        assert_eq!(RoleOk::parse(&b), Some(r));
        assert_eq!(RoleOk::parse(&b[..b.len() - 1]), None);
        let s = Subscribe {
            node_id: 1,
            epoch: 2,
            shard: 3,
            promote_after_ms: 1000,
            addr: "127.0.0.1:7701".into(),
        };
        let mut w = FrameWriter::new();
        let mut b = BytesMut::new();
        s.encode(&mut w, &mut b, 5);
        w.finish(&mut b);
        assert_eq!(Subscribe::parse(&b[12..]).as_ref(), Some(&s));
    }
}
