//! Loom model of fencing's follower side (`server/src/replication/lease.rs`):
//! a flow thread receives a SYNC and acks it if the node still follows; the
//! watchdog thread promotes the node if the primary has been silent too
//! long. The ack renews the old primary's lease, so an ack decided after the
//! promotion would let two primaries admit at once. Under every
//! interleaving: never both an ack and a promotion that did not see the
//! acked receipt.
#![cfg(sluice_loom)]

use std::collections::BTreeSet;
use std::sync::{Arc as StdArc, Mutex as StdMutex};

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use sluice_loom_tests::lease::Watch;

/// The follower's watchdog would promote after 10 units of silence.
const SILENCE_MAX: u64 = 10;

#[test]
fn no_ack_after_the_decision_to_promote() {
    let reached = StdArc::new(StdMutex::new(BTreeSet::new()));
    let seen = reached.clone();
    loom::model(move || {
        let watch = Arc::new(Watch::default());
        watch.set_in_sync(true);
        // Last SYNC at 0; the flow receives one at 10; the watchdog looks
        // at 15: silent for 15 if it misses the receipt, 5 if it sees it.
        let promoted = Arc::new(AtomicBool::new(false));
        let flow = {
            let (watch, promoted) = (watch.clone(), promoted.clone());
            thread::spawn(move || watch.receipt(10, || !promoted.load(Ordering::Acquire)))
        };
        let did_promote = watch.promote_if_silent(15, SILENCE_MAX, || {
            promoted.store(true, Ordering::Release);
            true
        });
        let acked = flow.join().unwrap();
        assert!(
            !(acked && did_promote),
            "acked a receipt the promotion did not see"
        );
        seen.lock().unwrap().insert((acked, did_promote));
    });
    // Both orders happened: the model exercised the race.
    let reached = reached.lock().unwrap().clone();
    assert!(reached.contains(&(true, false)), "{reached:?}");
    assert!(reached.contains(&(false, true)), "{reached:?}");
}
