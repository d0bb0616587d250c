//! The client side: the reply parser the client crate and `sluice` use on
//! whatever a server (or something posing as one) sends, and the
//! replication replies a follower parses (ROLE_OK, FAILOVER_OK). None may
//! panic.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sluice_protocol::codec::FrameDecoder;
use sluice_protocol::message::Reply;
use sluice_protocol::replication::{FailoverOk, RoleOk};
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let mut decoder = FrameDecoder::new(1 << 20);
    while let Ok(Some(frame)) = decoder.decode(&mut buf) {
        for (header, payload) in frame.messages() {
            let _ = Reply::parse(header, payload);
            let _ = RoleOk::parse(payload);
            let _ = FailoverOk::parse(payload);
        }
    }
});
