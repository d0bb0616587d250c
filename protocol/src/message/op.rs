//! Op codes. A reply's op is its request's op with the high bit set;
//! [`op::ERROR`](ERROR) answers any request.

pub const HELLO: u8 = 0x01;
pub const PING: u8 = 0x02;
pub const THROTTLE: u8 = 0x03;
pub const PEEK: u8 = 0x04;
pub const DECIDE: u8 = 0x05;
pub const RELEASE: u8 = 0x06;
pub const RENEW: u8 = 0x07;
pub const RELOAD: u8 = 0x08;
pub const STATS: u8 = 0x09;
/// redis-cell's CL.THROTTLE, forwarded by a node for a RESP client.
pub const CELL: u8 = 0x0d;
/// The cluster as the node sees it (layout, groups, a key's owner).
pub const CLUSTER: u8 = 0x0e;
/// A proof, before HELLO, that the node knows the token (`auth`).
pub const CHALLENGE: u8 = 0x0f;
/// Set on every reply op.
pub const REPLY: u8 = 0x80;
pub const HELLO_OK: u8 = HELLO | REPLY;
pub const PONG: u8 = PING | REPLY;
pub const THROTTLE_OK: u8 = THROTTLE | REPLY;
pub const PEEK_OK: u8 = PEEK | REPLY;
pub const DECIDE_OK: u8 = DECIDE | REPLY;
pub const RELEASE_OK: u8 = RELEASE | REPLY;
pub const RENEW_OK: u8 = RENEW | REPLY;
pub const RELOAD_OK: u8 = RELOAD | REPLY;
pub const STATS_OK: u8 = STATS | REPLY;
pub const CELL_OK: u8 = CELL | REPLY;
pub const CLUSTER_OK: u8 = CLUSTER | REPLY;
pub const CHALLENGE_OK: u8 = CHALLENGE | REPLY;
pub const ERROR: u8 = 0xff;
