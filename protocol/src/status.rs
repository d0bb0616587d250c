//! Every error a Sluice server can put on the wire, as one enum with stable
//! numeric codes. The code is the contract; the text is for humans.

/// What a client should do after receiving a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The same request may succeed if sent again, on this connection.
    Retry,
    /// This connection is finished; open a new one (possibly to another node).
    Reconnect,
    /// The request itself is wrong; sending it again gives the same answer.
    GiveUp,
    /// This node does not admit (a follower, or a primary that is fenced
    /// or handing over): nothing was applied; send the request to the
    /// group's primary (ask the other member's ROLE).
    FailOver,
    /// No answer came for a request that was sent: it may or may not have
    /// been applied. Do not resend a spend blindly (it could be charged
    /// twice); the next call may fail over.
    OutcomeUnknown,
}

macro_rules! statuses {
    ($( $(#[$doc:meta])* $name:ident = $code:literal, $text:literal, $action:ident;)*) => {
        /// A wire error code (ERROR reply, PROTOCOL.md "Error codes").
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Status {
            $( $(#[$doc])* $name = $code, )*
        }

        impl Status {
            /// Every status, in code order (for tests and documentation).
            pub const ALL: &'static [Status] = &[$(Status::$name,)*];

            /// The stable numeric code.
            pub const fn code(self) -> u16 {
                self as u16
            }

            /// Looks a code up; `None` for a code this version does not know.
            pub const fn from_code(code: u16) -> Option<Status> {
                match code {
                    $( $code => Some(Status::$name), )*
                    _ => None,
                }
            }

            /// The short human text sent with the code.
            pub const fn text(self) -> &'static str {
                match self {
                    $( Status::$name => $text, )*
                }
            }

            /// What a client should do next.
            pub const fn action(self) -> Action {
                match self {
                    $( Status::$name => Action::$action, )*
                }
            }
        }
    };
}

statuses! {
    /// The frame's bytes do not parse; the server closes the connection.
    Malformed = 1, "malformed frame", Reconnect;
    /// The frame declares more bytes than the server accepts; the server
    /// closes the connection without reading them.
    FrameTooLarge = 2, "frame too large", Reconnect;
    /// HELLO offered no version the server speaks.
    UnsupportedVersion = 3, "unsupported protocol version", GiveUp;
    /// The server has an auth token and this connection has not sent it.
    AuthRequired = 4, "authentication required", GiveUp;
    /// HELLO carried a wrong auth token.
    AuthFailed = 5, "authentication failed", GiveUp;
    /// The request's op code is not one this version knows.
    UnknownOp = 6, "unknown op", GiveUp;
    /// The request's payload does not have the layout its op requires.
    BadRequest = 7, "bad request", GiveUp;
    /// The routing key is empty or longer than the protocol allows.
    BadKey = 8, "bad key", GiveUp;
    /// The policy's numbers are out of range (see PROTOCOL.md).
    InvalidPolicy = 9, "invalid policy", GiveUp;
    /// The cost is larger than the burst: it could never be admitted.
    CostExceedsBurst = 10, "cost exceeds burst", GiveUp;
    /// The frame holds more requests than the server accepts in one batch.
    BatchTooLarge = 11, "batch too large", GiveUp;
    /// The server is at its connection limit; it closes this connection.
    TooManyConnections = 12, "too many connections", Reconnect;
    /// The server is shutting down; try another node or later.
    ShuttingDown = 13, "shutting down", Reconnect;
    /// A server fault; the request was not applied.
    Internal = 14, "internal error", Retry;
    /// DECIDE, RELEASE or RENEW named a tier the server's configuration does
    /// not define.
    UnknownTier = 15, "unknown tier", GiveUp;
    /// The shard is at its bucket cap and has no full bucket to drop, so a
    /// request that needs a new bucket is refused (rather than evicting a
    /// partly spent one). Nothing was applied; buckets fill up as time
    /// passes, so the same request may succeed later.
    KeysFull = 16, "keys full", Retry;
    /// RELEASE or RENEW named a lease that is unknown, already released or
    /// expired; nothing changed.
    LeaseNotFound = 17, "lease not found", GiveUp;
    /// RELOAD found the configuration invalid; the old one stays in force.
    ConfigInvalid = 18, "config invalid", GiveUp;
    /// This node is a follower: it refuses every request that spends,
    /// refunds or resets. The error text names the primary and the epoch;
    /// send the request there.
    NotPrimary = 19, "not primary", FailOver;
    /// The connection owes more bytes of replies than the server holds for
    /// one connection (`--reply-bytes-max`): this request, later in a frame
    /// whose earlier requests' replies reached the bound, was not applied.
    /// Send fewer large requests (STATS) per frame, and read the replies.
    ReplyBufferFull = 20, "reply buffer full", Retry;
    /// The key belongs to another shard group, and this connection came
    /// from a node that forwards (its HELLO carried a layout hash), which a
    /// node never forwards again. Nothing was applied. With equal layouts
    /// it cannot happen: it means the layouts changed in between.
    WrongGroup = 21, "wrong group", GiveUp;
    /// HELLO carried a cluster layout hash that differs from this node's:
    /// the two nodes read different cluster files (or versions of one), so
    /// they could disagree on who owns a key. The text names both hashes;
    /// the connection is not authenticated by that HELLO.
    LayoutMismatch = 22, "layout mismatch", GiveUp;
    /// The node forwards this key to another group, and no primary of that
    /// group answered (the text names the group and its last known
    /// primary). Nothing was applied.
    GroupUnavailable = 23, "group unavailable", Retry;
    /// The node forwarded this spend to its owner and no answer came in
    /// time: it may or may not have been applied there. Not resent.
    OutcomeUnknown = 24, "outcome unknown", OutcomeUnknown;
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.text(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &s in Status::ALL {
            assert!(seen.insert(s.code()), "duplicate code {}", s.code());
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::from_code(0), None);
        assert_eq!(Status::from_code(999), None);
        // Codes are stable and dense: a new status takes the next number.
        for (code, &s) in (1u16..).zip(Status::ALL) {
            assert_eq!(s.code(), code);
        }
        assert_eq!(Status::KeysFull.action(), Action::Retry);
    }
}
