//! CLUSTER (0x0e) and CLUSTER_OK (0x8e): the cluster as a node sees it
//! (`sluiced --cluster`): its layout hash, its group, every group's members
//! and epoch, and which group owns a key. What `sluice role --json` and
//! `sluice --addr NODE route KEY` read from any node.

use bytes::{BufMut, BytesMut};

use super::consts::KEY_BYTES_MAX;
use super::op;
use super::read::{u16_at, u64_at};
use crate::codec::FrameWriter;

/// CLUSTER_OK's "none" for a group index.
pub const GROUP_NONE: u16 = u16::MAX;
/// Longest group name or address CLUSTER_OK carries, in bytes (longer ones
/// are cut at a character boundary).
pub const CLUSTER_TEXT_BYTES_MAX: usize = 255;
/// Fixed bytes of a CLUSTER_OK before its group records.
const CLUSTER_OK_FIXED_BYTES: usize = 16;
/// Most bytes of one CLUSTER_OK; groups past it are left out (`truncated`).
const CLUSTER_OK_BYTES_MAX: usize = u16::MAX as usize;

/// One group in a CLUSTER_OK.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupInfo {
    /// The group's name.
    pub name: String,
    /// Its primary as the node last found it (or as the file names it).
    pub primary: String,
    /// Its follower; empty when none.
    pub follower: String,
    /// The group's epoch as the node last saw it (0: not yet asked).
    pub epoch: u64,
}

/// CLUSTER_OK.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterOk {
    /// The node's layout hash; 0 for a node without `--cluster` (then
    /// every other field is empty).
    pub layout: u64,
    /// This node's group, by index into `groups`.
    pub own: Option<u16>,
    /// The group that owns the request's key, if it named one.
    pub owner: Option<u16>,
    /// Groups left out: the reply reached its size bound.
    pub truncated: bool,
    /// The groups.
    pub groups: Vec<GroupInfo>,
}

/// Parses CLUSTER's payload: `key_len` (u16, 0 ..= 512), then the key.
pub(super) fn parse_cluster(payload: &[u8]) -> Option<&[u8]> {
    if payload.len() < 2 {
        return None;
    }
    let key_len = usize::from(u16_at(payload, 0));
    (key_len <= KEY_BYTES_MAX && payload.len() == 2 + key_len).then(|| &payload[2..])
}

/// Encodes CLUSTER's payload.
pub(super) fn put_cluster(b: &mut BytesMut, key: &[u8]) {
    b.put_u16_le(key.len() as u16);
    b.put_slice(key);
}

fn cut(s: &str) -> &str {
    if s.len() <= CLUSTER_TEXT_BYTES_MAX {
        return s;
    }
    let mut end = CLUSTER_TEXT_BYTES_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends a CLUSTER_OK: `layout` (u64), `group_count` (u16), `own` and
/// `owner` (u16 indices, 0xFFFF for none), `truncated` (u8), a reserved
/// byte; then per group `epoch` (u64) and `name`, `primary`, `follower`,
/// each a u8 length and its UTF-8 bytes.
pub fn put_cluster_ok(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, ok: &ClusterOk) {
    let mut records = BytesMut::new();
    let mut count = 0u16;
    let mut truncated = ok.truncated;
    for g in &ok.groups {
        let mut r = BytesMut::new();
        r.put_u64_le(g.epoch);
        for text in [&g.name, &g.primary, &g.follower] {
            let t = cut(text);
            r.put_u8(t.len() as u8);
            r.put_slice(t.as_bytes());
        }
        if CLUSTER_OK_FIXED_BYTES + records.len() + r.len() > CLUSTER_OK_BYTES_MAX {
            truncated = true;
            break;
        }
        records.extend_from_slice(&r);
        count += 1;
    }
    w.message(buf, op::CLUSTER_OK, request_id, |b| {
        b.put_u64_le(ok.layout);
        b.put_u16_le(count);
        b.put_u16_le(ok.own.unwrap_or(GROUP_NONE));
        b.put_u16_le(ok.owner.unwrap_or(GROUP_NONE));
        b.put_u8(u8::from(truncated));
        b.put_u8(0);
        b.put_slice(&records);
    });
}

/// Parses a CLUSTER_OK; `None` when its bytes do not tile exactly.
pub(super) fn parse_cluster_ok(p: &[u8]) -> Option<ClusterOk> {
    if p.len() < CLUSTER_OK_FIXED_BYTES || p[14] > 1 || p[15] != 0 {
        return None;
    }
    let count = usize::from(u16_at(p, 8));
    let index = |at| Some(u16_at(p, at)).filter(|&i| i != GROUP_NONE);
    let mut ok = ClusterOk {
        layout: u64_at(p, 0),
        own: index(10),
        owner: index(12),
        truncated: p[14] == 1,
        groups: Vec::with_capacity(count.min(1024)),
    };
    let mut at = CLUSTER_OK_FIXED_BYTES;
    for _ in 0..count {
        let epoch = u64_at(p.get(at..at + 8)?, 0);
        at += 8;
        let mut text = || {
            let len = usize::from(*p.get(at)?);
            let s = std::str::from_utf8(p.get(at + 1..at + 1 + len)?).ok()?;
            at += 1 + len;
            Some(s.to_owned())
        };
        let (name, primary, follower) = (text()?, text()?, text()?);
        ok.groups.push(GroupInfo {
            name,
            primary,
            follower,
            epoch,
        });
    }
    (at == p.len()).then_some(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{FrameDecoder, FrameWriter};
    use crate::message::Reply;
    use tokio_util::codec::Decoder;

    fn round_trip(ok: &ClusterOk) -> ClusterOk {
        let (mut w, mut buf) = (FrameWriter::new(), BytesMut::new());
        put_cluster_ok(&mut w, &mut buf, 9, ok);
        w.finish(&mut buf);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        let (h, p) = frame.messages().next().unwrap();
        match Reply::parse(h, p) {
            Some(Reply::Cluster(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cluster_ok_round_trips_and_cuts_what_does_not_fit() {
        let g = |name: &str| GroupInfo {
            name: name.into(),
            primary: "127.0.0.1:7700".into(),
            follower: String::new(),
            epoch: 3,
        };
        let ok = ClusterOk {
            layout: 0xfeed,
            own: Some(1),
            owner: None,
            truncated: false,
            groups: vec![g("a"), g("b")],
        };
        assert_eq!(round_trip(&ok), ok);
        // 300 groups with the longest texts: cut at the size bound, and
        // the reply says so.
        let long = "x".repeat(400);
        let big = ClusterOk {
            groups: (0..300)
                .map(|i| GroupInfo {
                    name: format!("{i}{long}"),
                    primary: long.clone(),
                    follower: long.clone(),
                    epoch: i,
                })
                .collect(),
            ..ok
        };
        let back = round_trip(&big);
        assert!(back.truncated);
        assert!(!back.groups.is_empty() && back.groups.len() < 300);
        assert_eq!(back.groups[0].primary.len(), CLUSTER_TEXT_BYTES_MAX);
    }
}
