//! Loom model of a shard's published over-limit windows
//! (`server/src/shard/over_limit.rs`): while the shard thread replaces one
//! key's entry with another key's on the same slot, another thread looks
//! the first key up. Under every interleaving the lookup finds nothing or
//! exactly the entry that was published for that key, never fields of the
//! two entries mixed (the seqlock's promise). One write against one read
//! keeps the model small: every further write multiplies the interleavings
//! of seven atomics.
#![cfg(sluice_loom)]

use loom::sync::Arc;
use loom::thread;
use sluice_loom_tests::over_limit::{Entry, OverLimit};

const WINDOW_NS: u64 = 1_000;

#[test]
fn a_reader_never_mixes_two_entries() {
    loom::model(|| {
        // One slot: both keys share it.
        let published = Arc::new(OverLimit::new(1));
        let a = Entry {
            window_start_ns: 0,
            count: 5,
        };
        let b = Entry {
            window_start_ns: 0,
            count: 9,
        };
        published.publish(1, 5, WINDOW_NS, a);
        let shard = {
            let published = published.clone();
            // Key 2 under a limit of 5 too: only the count tells them apart.
            thread::spawn(move || published.publish(2, 5, WINDOW_NS, b))
        };
        let seen = published.lookup(1, 5, WINDOW_NS, 10);
        assert!(seen.is_none() || seen == Some(a), "{seen:?}");
        shard.join().unwrap();
        assert_eq!(published.lookup(1, 5, WINDOW_NS, 10), None);
        assert_eq!(published.lookup(2, 5, WINDOW_NS, 10), Some(b));
    });
}
