//! Snapshots (`--snapshot-dir`): every shard's buckets, of every kind, in
//! one file, written every `--snapshot-interval-s` and at a graceful
//! shutdown, and loaded at start, so that a restart does not hand every
//! client a full bucket at once.
//!
//! The file, `DIR/sluiced.snapshot`, is a 64-byte header and a body:
//!
//! | Offset | Size | Field |
//! |---:|---:|---|
//! | 0 | 8 | magic `SLUICESN` |
//! | 8 | 4 | format version (1) |
//! | 12 | 2 | shard count of the node that wrote it |
//! | 14 | 2 | reserved, 0 |
//! | 16 | 8 | the node's epoch |
//! | 24 | 8 | when it was written (ns since the Unix epoch) |
//! | 32 | 8 | chunks in the body |
//! | 40 | 8 | records (buckets) in the body |
//! | 48 | 8 | body bytes |
//! | 56 | 8 | XXH3-64 of bytes 0..56 and of the body |
//!
//! The body is chunks, each a `u32` length and a SYNC payload exactly as
//! replication carries it (PROTOCOL.md, "SYNC"): the same record encoding,
//! parsed by the same reader, which checks every state. Records hold
//! absolute times, so time that passed while the node was down counts:
//! buckets refill by the real time elapsed, never more.
//!
//! Why not memmap2, which the design names for snapshots: the loader reads
//! the file in one `read` and the writer streams the shards' chunks. A map
//! would save the loader one copy of the file (about 0.1 s of a 10M-bucket
//! load that takes 2 s or more, most of it placing the records), and it
//! would turn a truncation of the file by anything else during the load
//! into SIGBUS, a crash, where a read gets a short file and the clear
//! error below. Writing through a map buys nothing over sequential writes
//! either way.
//!
//! Loading checks the whole file (length, checksum, every record) before
//! any of it is used, and places each record on the shard that owns its
//! bucket now (`shard_of`), so a snapshot written with another shard count
//! loads as well. A file that fails any check stops the start, naming the
//! file and `--snapshot-ignore-corrupt`, like Redis with a bad dump.
//!
//! Writing: each shard walks its tables' slots in order, a few thousand
//! slots at a time, encoding what it reads and yielding to its connections
//! between steps (a shard is never stalled for its table; the image is
//! then not of one instant, but every bucket in it is a state it really
//! had). An earlier version listed every key first, in one step: at 10M
//! buckets that step held the shard for 300 ms. The main thread seals the
//! file (header and checksum over the shards' chunks where they lie) and a
//! blocking thread writes it: a temporary file, fsync, rename over the old
//! one, fsync of the directory.
//!
//! The temporary file (`DIR/sluiced.snapshot.tmp`) is created afresh on
//! every write (whatever was at its name unlinked first, then O_EXCL and
//! O_NOFOLLOW), so a symlink planted there never makes the daemon write
//! through it. A write that fails removes its partial file and leaves a
//! marker, `DIR/sluiced.snapshot.failed` (why and when), which the next
//! write that succeeds removes; a start that finds it warns that the
//! snapshot it loads is older than the node's last state. A failed write
//! at shutdown makes the exit status 1.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use bytes::{BufMut, BytesMut};
use sluice_protocol::replication::{
    put_sync_fixed, Record, SyncHeader, SyncReader, SyncWriter, SYNC_FIXED_BYTES,
};

use crate::shard::table::{Table, Walk};

/// The file's first bytes.
pub const MAGIC: [u8; 8] = *b"SLUICESN";
/// The format this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 64;
/// The file's name in `--snapshot-dir`.
pub const FILE_NAME: &str = "sluiced.snapshot";
/// Slots a shard's walk reads between two yields to its connections
/// (a few hundred microseconds of work at most; see `collect`).
pub const SLOTS_PER_STEP: usize = 512;

/// What one shard contributes: its records' count, and SYNC payload
/// record parts (count, bytes) as [`SyncWriter::take`] gives them.
pub type ShardPart = (u64, Vec<(u32, BytesMut)>);

/// Why a snapshot cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a Sluice snapshot (its first bytes are not SLUICESN)")]
    Magic,
    #[error("format version {0}; this sluiced reads version {VERSION}")]
    Version(u32),
    #[error("truncated: {got} bytes, the header says {want}")]
    Length { got: u64, want: u64 },
    #[error("checksum mismatch: the file is corrupt")]
    Checksum,
    #[error("corrupt record data: {0}")]
    Records(String),
}

/// A checked snapshot.
#[derive(Debug)]
pub struct Loaded {
    /// The writer's epoch.
    pub epoch: u64,
    /// The writer's shard count.
    pub shard_count: u16,
    /// When it was written, ns since the Unix epoch.
    pub written_ns: u64,
    /// Every bucket.
    pub records: Vec<Record>,
}

/// The path of the snapshot in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// A file ready to be written: its header and its body's chunks, the
/// chunks left where the shards encoded them (a 10M-bucket body is a third
/// of a gigabyte: it is checksummed in place and written out chunk by
/// chunk, never copied into one buffer).
#[derive(Debug)]
pub struct Image {
    head: [u8; HEADER_BYTES],
    /// Each chunk: its length and SYNC fixed part, then its records.
    chunks: Vec<([u8; 4 + SYNC_FIXED_BYTES], BytesMut)>,
}

impl Image {
    /// Lays the node's parts out as one file and seals it.
    pub fn new(epoch: u64, shard_count: u16, written_ns: u64, parts: Vec<ShardPart>) -> Image {
        let (mut records, mut body_len) = (0u64, 0u64);
        let mut chunks = Vec::new();
        for (n, payloads) in parts {
            records += n;
            for (count, bytes) in payloads {
                let h = SyncHeader {
                    seq: chunks.len() as u64 + 1,
                    epoch,
                    now_ns: written_ns,
                    flags: 0,
                    count,
                };
                let len = SYNC_FIXED_BYTES + bytes.len();
                let mut fixed = [0u8; 4 + SYNC_FIXED_BYTES];
                let mut at = &mut fixed[..];
                at.put_u32_le(len as u32);
                put_sync_fixed(&mut at, &h);
                body_len += 4 + len as u64;
                chunks.push((fixed, bytes));
            }
        }
        let mut head = [0u8; HEADER_BYTES];
        let mut at = &mut head[..];
        at.put_slice(&MAGIC);
        at.put_u32_le(VERSION);
        at.put_u16_le(shard_count);
        at.put_u16_le(0);
        at.put_u64_le(epoch);
        at.put_u64_le(written_ns);
        at.put_u64_le(chunks.len() as u64);
        at.put_u64_le(records);
        at.put_u64_le(body_len);
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&head[..56]);
        for (fixed, bytes) in &chunks {
            h.update(fixed);
            h.update(bytes);
        }
        head[56..].copy_from_slice(&h.digest().to_le_bytes());
        Image { head, chunks }
    }

    /// Bytes in the file.
    pub fn file_bytes(&self) -> u64 {
        let body: usize = self.chunks.iter().map(|(f, b)| f.len() + b.len()).sum();
        (HEADER_BYTES + body) as u64
    }

    /// Writes the file to `w`.
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        w.write_all(&self.head)?;
        for (fixed, bytes) in &self.chunks {
            w.write_all(fixed)?;
            w.write_all(bytes)?;
        }
        Ok(())
    }
}

/// Encodes the node's parts as one file, in memory (tests and tools; the
/// daemon writes an [`Image`] straight to its file).
pub fn encode(epoch: u64, shard_count: u16, written_ns: u64, parts: Vec<ShardPart>) -> Vec<u8> {
    let image = Image::new(epoch, shard_count, written_ns, parts);
    let mut out = Vec::with_capacity(image.file_bytes() as usize);
    image.write_to(&mut out).expect("a Vec takes every write");
    out
}

/// The header's checksum field: XXH3 of the header's first 56 bytes and
/// the body (public for the fuzzer, which seals the files it makes up).
pub fn checksum(head: &[u8], body: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&head[..56]);
    h.update(body);
    h.digest()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks a whole file and returns its records; nothing is used unless
/// everything checks.
pub fn decode(bytes: &[u8]) -> Result<Loaded, SnapshotError> {
    let mut records = Vec::with_capacity(records_hint(bytes));
    let head = decode_with(bytes, |r| records.push(r))?;
    Ok(Loaded { records, ..head })
}

/// How many records the file says it holds, unchecked, capped by what its
/// size could hold (a record is at least its 17-byte head): room to
/// reserve before [`decode_with`], nothing to trust.
pub fn records_hint(bytes: &[u8]) -> usize {
    if bytes.len() < HEADER_BYTES {
        return 0;
    }
    let said = usize::try_from(u64_at(bytes, 40)).unwrap_or(usize::MAX);
    said.min((bytes.len() - HEADER_BYTES) / sluice_protocol::replication::RECORD_HEAD_BYTES)
}

/// [`decode`], handing each record to `each` as it is read instead of
/// collecting them (the daemon sorts them by shard as they come: one copy
/// of a 10M-bucket snapshot's records, not two). The records `each` was
/// given are only to be used if this returns `Ok`; the returned `records`
/// is empty.
pub fn decode_with(bytes: &[u8], mut each: impl FnMut(Record)) -> Result<Loaded, SnapshotError> {
    if bytes.len() < 8 || bytes[..8] != MAGIC {
        return Err(SnapshotError::Magic);
    }
    if bytes.len() < HEADER_BYTES {
        return Err(SnapshotError::Length {
            got: bytes.len() as u64,
            want: HEADER_BYTES as u64,
        });
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(SnapshotError::Version(version));
    }
    let shard_count = u16::from_le_bytes(bytes[12..14].try_into().expect("2 bytes"));
    let epoch = u64_at(bytes, 16);
    let written_ns = u64_at(bytes, 24);
    let chunks = u64_at(bytes, 32);
    let records_said = u64_at(bytes, 40);
    let body_len = u64_at(bytes, 48);
    let want = (HEADER_BYTES as u64).saturating_add(body_len);
    if bytes.len() as u64 != want {
        return Err(SnapshotError::Length {
            got: bytes.len() as u64,
            want,
        });
    }
    let body = &bytes[HEADER_BYTES..];
    if checksum(bytes, body) != u64_at(bytes, 56) {
        return Err(SnapshotError::Checksum);
    }
    let bad = |why: String| SnapshotError::Records(why);
    let mut reader = SyncReader::new();
    let mut records = 0u64;
    let mut rest = body;
    for _ in 0..chunks {
        if rest.len() < 4 {
            return Err(bad("a chunk's length is cut off".into()));
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let Some(payload) = rest.get(4..4 + len) else {
            return Err(bad("a chunk runs past the end".into()));
        };
        reader
            .parse(payload, |r| {
                records += 1;
                each(r);
            })
            .map_err(|e| bad(e.to_string()))?;
        rest = &rest[4 + len..];
    }
    if !rest.is_empty() || reader.in_part() {
        return Err(bad("bytes after the last chunk, or a record cut off".into()));
    }
    if records != records_said {
        return Err(bad(format!(
            "{records} records, the header says {records_said}"
        )));
    }
    Ok(Loaded {
        epoch,
        shard_count,
        written_ns,
        records: Vec::new(),
    })
}

/// Writes `image` as `dir`'s snapshot, atomically: a temporary file,
/// fsync, rename, fsync of the directory.
pub fn write_atomic(dir: &Path, image: &Image) -> std::io::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| at(dir, e))?;
    let tmp = tmp_path(dir);
    let file = create_fresh(&tmp)?;
    let written = (|| {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
        image.write_to(&mut f)?;
        // The data is on disk before the name points at it ...
        f.into_inner().map_err(|e| e.into_error())?.sync_all()
    })()
    .map_err(|e| at(&tmp, e))
    .and_then(|()| std::fs::rename(&tmp, path(dir)).map_err(|e| at(&path(dir), e)));
    if let Err(e) = written {
        // A partial file is never left behind (it would hold the disk
        // space that failed it).
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // ... and the rename is on disk before the write counts as done.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| at(dir, e))
}

/// Creates `path` afresh for writing. Whatever is there (the leftover of a
/// crash, or a symlink someone planted to make us write through it) is
/// unlinked, never followed: unlink removes the link itself. The file is
/// then created with `create_new` (O_EXCL) and O_NOFOLLOW, which refuse
/// anything that appeared there in between instead of opening it.
fn create_fresh(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(at(path, e)),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(path)
        .map_err(|e| at(path, e))
}

/// The temporary file a snapshot is written to before its rename.
pub fn tmp_path(dir: &Path) -> PathBuf {
    dir.join(format!("{FILE_NAME}.tmp"))
}

/// The marker a failed write leaves beside the snapshot (removed by the
/// next write that succeeds): a start that finds it says that the
/// snapshot it loads is older than the state the node last had.
pub fn failed_path(dir: &Path) -> PathBuf {
    dir.join(format!("{FILE_NAME}.failed"))
}

/// Records that a write failed (best effort: the disk that failed the
/// snapshot may fail this too, and the log has said it anyway).
pub fn mark_failed(dir: &Path, why: &str, error: &str, written_ns: u64) -> std::io::Result<()> {
    let text = format!(
        "a {why} snapshot failed at {written_ns} ns since the Unix epoch: {error}\n\
         {FILE_NAME} in this directory, if any, is older than that\n"
    );
    std::io::Write::write_all(&mut create_fresh(&failed_path(dir))?, text.as_bytes())
}

/// What the failure marker says, if there is one: at most 4 KiB of it,
/// read without following a symlink (the log never quotes another file).
pub fn read_failed(dir: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(failed_path(dir))
        .ok()?;
    let mut text = String::new();
    f.take(4 << 10).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Removes the failure marker after a write that succeeded.
pub fn clear_failed(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(failed_path(dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `e`, with the path it happened at.
fn at(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// One shard's part: its buckets, read by a walk over the tables' slots
/// ([`Walk::Snapshot`], in slot order) [`SLOTS_PER_STEP`] slots at a time,
/// yielding to the shard's connections between steps. Records the table
/// moves behind the walk's cursor are read again, so no bucket that exists
/// throughout is missed; a growth restarts the walk (a bucket may then be
/// in the file twice, the later being the later state, which is what a
/// load keeps).
pub async fn collect(table: &RefCell<Table>) -> ShardPart {
    struct Stop<'a>(&'a RefCell<Table>);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.borrow_mut().export_stop(Walk::Snapshot);
        }
    }
    table
        .borrow_mut()
        .export_start(Walk::Snapshot, SLOTS_PER_STEP);
    let _stop = Stop(table);
    let mut heap_keys = None;
    let (mut out, mut moved) = (Vec::new(), Vec::new());
    let mut w = SyncWriter::new();
    let mut n = 0u64;
    loop {
        let done = {
            let mut table = table.borrow_mut();
            let keys = heap_keys.get_or_insert_with(|| table.heap_keys());
            let done = table.export_step(Walk::Snapshot, SLOTS_PER_STEP, keys, &mut out);
            table.export_moved(Walk::Snapshot, &mut moved);
            for (key, kind) in moved.drain(..) {
                // Gone since it moved: nothing to keep.
                if let Some(state) = table.export(kind, key) {
                    out.push((key, kind, Some(state)));
                }
            }
            done
        };
        for (key, kind, state) in out.drain(..) {
            w.push(kind, key, state.as_ref());
            n += 1;
        }
        if done {
            return (n, w.take());
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(all(test, not(sluice_loom)))]
mod tests {
    use super::*;
    use sluice_protocol::limit::Kind;
    use sluice_protocol::replication::State;

    fn sample() -> Vec<u8> {
        let mut w = SyncWriter::new();
        let mut n = 0;
        for i in 0..500u128 {
            let state = State::FixedWindow {
                window_ns: 1_000_000_000,
                state: sluice_protocol::limit::fixed_window::FixedWindowState {
                    window_start_ns: 5_000_000_000 + i as u64,
                    count: i as u64 % 7 + 1,
                },
            };
            w.push(Kind::FixedWindow, i * 7919, Some(&state));
            n += 1;
        }
        encode(3, 2, 123, vec![(n, w.take())])
    }

    #[test]
    fn a_snapshot_round_trips() {
        let bytes = sample();
        let loaded = decode(&bytes).expect("a good file");
        assert_eq!(
            (loaded.epoch, loaded.shard_count, loaded.written_ns),
            (3, 2, 123)
        );
        assert_eq!(loaded.records.len(), 500);
        assert_eq!(loaded.records[7].key, 7 * 7919);
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_refused() {
        let bytes = sample();
        // 10,000 single-byte changes at positions spread over the file
        // (a fixed-seed xorshift), and truncations at every length.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % bytes.len() as u64) as usize;
            let flip = (x >> 32) as u8 | 1;
            let mut bad = bytes.clone();
            bad[at] ^= flip;
            assert!(decode(&bad).is_err(), "a flip at {at} was accepted");
        }
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "cut to {len} was accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
    }
}
