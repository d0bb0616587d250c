//! What a follower parses from its primary's stream (SYNC payloads, in
//! parts that continue across payloads) and what a primary parses from its
//! follower (SUBSCRIBE, ACK, sizes). None may panic, and the follower's
//! shorter path for token buckets (`parse_buckets`) reads exactly what
//! `parse` reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_protocol::limit::Kind;
use sluice_protocol::replication::{parse_ack, parse_sizes, Record, State, Subscribe, SyncReader};

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
    let mut split = SyncReader::new();
    for payload in data.chunks(step) {
        let mut all = Vec::new();
        let whole = reader.parse(payload, |r| all.push(r));
        let (mut buckets, mut others) = (Vec::new(), Vec::new());
        let short = split.parse_buckets(
            payload,
            |key, b| {
                buckets.push(Record {
                    kind: Kind::TokenBucket,
                    key,
                    state: b.map(State::TokenBucket),
                })
            },
            |r| others.push(r),
        );
        assert_eq!(whole, short);
        let (tb, rest): (Vec<_>, Vec<_>) =
            all.into_iter().partition(|r| r.kind == Kind::TokenBucket);
        assert_eq!(tb, buckets);
        assert_eq!(rest, others);
        if whole.is_err() {
            return;
        }
    }
});
