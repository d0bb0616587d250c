//! The protocol's size bounds, sentinel values and payload sizes.

/// Longest routing key, in bytes.
pub const KEY_BYTES_MAX: usize = 512;
/// Longest auth token, in bytes.
pub const TOKEN_BYTES_MAX: usize = 256;
/// Longest error text a server sends, in bytes.
pub const ERROR_TEXT_BYTES_MAX: usize = 256;
/// HELLO's `shard` value meaning "no shard binding".
pub const SHARD_ANY: u16 = u16::MAX;
/// Most limits one DECIDE names, inline or through a tier (so a tier has
/// at most this many limits too). Eight covers "per second AND per minute
/// AND per day AND concurrent" with room to spare, and bounds a composite
/// decision's work and its reply.
pub const LIMITS_MAX: usize = 8;
/// Longest tier name, in bytes (UTF-8).
pub const TIER_BYTES_MAX: usize = 64;
/// Bytes of a limit record (DECIDE, RELEASE, RENEW).
pub const LIMIT_RECORD_BYTES: usize = 32;
/// Bytes of a verdict record (DECIDE_OK, RELEASE_OK, RENEW_OK).
pub const VERDICT_RECORD_BYTES: usize = 48;
/// Bytes of the per-shard record of STATS_OK in this version: seven `u64`
/// counters. Replies announce their record size, so a later server may
/// append counters and older clients skip them.
pub const STATS_RECORD_BYTES: usize = 56;
/// HELLO_OK `features` bit: this connection may send CELL with the
/// [`CELL_KEY_HASH`](crate::message::CELL_KEY_HASH) flag (the key's hash
/// in place of the key). Set for a forwarding node's connection, whose
/// HELLO named the layout this node has.
pub const FEATURE_CELL_KEY_HASH: u8 = 0x01;
/// DECIDE_OK's `denied_index` when no limit denied.
pub const DENIED_NONE: u8 = 0xff;

/// Fixed bytes of a HELLO payload before the token.
pub(super) const HELLO_FIXED_BYTES: usize = 8;
/// Fixed bytes of a THROTTLE/PEEK payload before the key.
pub const THROTTLE_FIXED_BYTES: usize = 34;
/// Fixed bytes of a CELL payload before the key.
pub const CELL_FIXED_BYTES: usize = 26;
/// Bytes of a CELL_OK payload.
pub(super) const CELL_OK_BYTES: usize = 40;
/// Bytes of a HELLO_OK payload.
pub(super) const HELLO_OK_BYTES: usize = 24;
/// Bytes of a verdict payload.
pub(super) const VERDICT_BYTES: usize = 40;
/// Fixed bytes of a DECIDE payload before the key.
pub(super) const DECIDE_FIXED_BYTES: usize = 16;
/// Fixed bytes of a DECIDE_OK payload before the verdict records.
pub(super) const DECIDE_OK_FIXED_BYTES: usize = 16;
/// Fixed bytes of a RELEASE/RENEW payload before the key.
pub(super) const LEASE_FIXED_BYTES: usize = 16;
/// Bytes of a RELEASE_OK/RENEW_OK payload: a verdict record and the lease's
/// remaining life.
pub(super) const LEASE_OK_BYTES: usize = VERDICT_RECORD_BYTES + 8;
/// Bytes of a RELOAD_OK payload.
pub(super) const RELOAD_OK_BYTES: usize = 8;
/// Bytes of a STATS request that names its first shard.
pub(super) const STATS_PAGED_BYTES: usize = 4;
/// Fixed bytes of a STATS_OK payload before the shard records.
pub(super) const STATS_OK_FIXED_BYTES: usize = 8;
/// Most shard records one STATS_OK holds at this version's record size.
pub const STATS_RECORDS_MAX: usize =
    (u16::MAX as usize - STATS_OK_FIXED_BYTES) / STATS_RECORD_BYTES;

const _: () = assert!(THROTTLE_FIXED_BYTES + KEY_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(HELLO_FIXED_BYTES + TOKEN_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(
    DECIDE_FIXED_BYTES + KEY_BYTES_MAX + TIER_BYTES_MAX + LIMITS_MAX * LIMIT_RECORD_BYTES
        <= u16::MAX as usize
);
const _: () = assert!(
    LEASE_FIXED_BYTES + KEY_BYTES_MAX + TIER_BYTES_MAX + LIMIT_RECORD_BYTES <= u16::MAX as usize
);
const _: () =
    assert!(DECIDE_OK_FIXED_BYTES + LIMITS_MAX * VERDICT_RECORD_BYTES <= u16::MAX as usize);
// A limit's index fits a u8 and is never DENIED_NONE.
const _: () = assert!(LIMITS_MAX > 0 && LIMITS_MAX < DENIED_NONE as usize);
// Tier names fit identity's hash buffer and a u8 of length.
const _: () = assert!(TIER_BYTES_MAX <= u8::MAX as usize);
// `sluiced` runs at most 1,024 shards: one STATS_OK holds them all.
const _: () = assert!(STATS_RECORDS_MAX >= 1_024);
