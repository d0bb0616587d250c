//! Helpers the message tests share.

use bytes::BytesMut;
use tokio_util::codec::Decoder;

use super::reply::{LimitVerdict, Reply};
use crate::codec::{FrameDecoder, MessageHeader};
use crate::gcra::Verdict;
use crate::limit::Kind;

pub(super) const S: u64 = 1_000_000_000;

pub(super) fn one_message(buf: &mut BytesMut) -> (MessageHeader, Vec<u8>) {
    let frame = FrameDecoder::default().decode(buf).unwrap().unwrap();
    let (h, p) = frame.messages().next().unwrap();
    (h, p.to_vec())
}

pub(super) fn lv(kind: Kind, allowed: bool, retry_after_ns: u64, lease_id: u64) -> LimitVerdict {
    LimitVerdict {
        kind,
        verdict: Verdict {
            allowed,
            limit: 10,
            remaining: 3,
            retry_after_ns,
            reset_after_ns: 9,
        },
        lease_id,
    }
}

pub(super) fn parse_all(buf: &mut BytesMut) -> Vec<Option<Reply>> {
    let frame = FrameDecoder::default().decode(buf).unwrap().unwrap();
    frame.messages().map(|(h, p)| Reply::parse(h, p)).collect()
}
