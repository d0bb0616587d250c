//! The server's first contact with a client's bytes: the v1 frame decoder
//! (as a connection feeds it, in reads of any size) and the request
//! parser. Neither may panic; a request that parses encodes back to
//! bytes that parse to the same request.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::message::Request;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the read size: the decoder must give the same
    // frames however the stream is cut.
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut decoder = FrameDecoder::new(1 << 16);
    let mut buf = BytesMut::new();
    for chunk in data.chunks(step) {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    for (header, payload) in frame.messages() {
                        let Ok(request) = Request::parse(header, payload) else {
                            continue;
                        };
                        let mut out = BytesMut::new();
                        let mut w = FrameWriter::new();
                        request.encode(&mut w, &mut out, header.request_id);
                        w.finish(&mut out);
                        let again = FrameDecoder::new(1 << 20)
                            .decode(&mut out)
                            .expect("an encoded request decodes")
                            .expect("a whole frame");
                        let (h2, p2) = again.messages().next().expect("one message");
                        let reparsed = Request::parse(h2, p2).expect("an encoded request parses");
                        assert_eq!(format!("{request:?}"), format!("{reparsed:?}"));
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
