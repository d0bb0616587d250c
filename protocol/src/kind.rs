//! A limit's kind, and its wire code.

use std::fmt;

crate::codes::wire_codes! {
    /// A limit's kind (`limit::Limit`'s variants). The numbers are the wire
    /// codes: never reuse one.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Kind {
        /// A token bucket (GCRA).
        TokenBucket = 1 => "token-bucket",
        /// A fixed window.
        FixedWindow = 2 => "fixed-window",
        /// A sliding log.
        SlidingLog = 3 => "sliding-log",
        /// A sliding window counter.
        SlidingCounter = 4 => "sliding-counter",
        /// Concurrency leases.
        Concurrency = 5 => "concurrency",
    }
}

impl Kind {
    /// Every kind, in code order.
    pub const ALL: [Kind; 5] = [
        Kind::TokenBucket,
        Kind::FixedWindow,
        Kind::SlidingLog,
        Kind::SlidingCounter,
        Kind::Concurrency,
    ];
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
