//! What a follower parses from its primary's stream (SYNC payloads, in
//! parts that continue across payloads) and what a primary parses from its
//! follower (SUBSCRIBE, ACK, sizes). None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_protocol::replication::{parse_ack, parse_sizes, Subscribe, SyncReader};

fuzz_target!(|data: &[u8]| {
    let _ = Subscribe::parse(data);
    let _ = parse_ack(data);
    let _ = parse_sizes(data);
    // The first byte cuts the rest into payloads: records may span them.
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut reader = SyncReader::new();
    for payload in data.chunks(step) {
        if reader.parse(payload, |_record| {}).is_err() {
            return;
        }
    }
});
