//! The requests and replies of protocol version 1 and their payload layouts
//! (PROTOCOL.md, "Ops"). Parsing borrows from the frame; encoding appends to
//! a [`FrameWriter`].

use bytes::{BufMut, BytesMut};

use crate::codec::{FrameWriter, MessageHeader};
use crate::gcra::Verdict;
use crate::policy::{Policy, PolicyError};
use crate::status::Status;

/// Op codes. A reply's op is its request's op with the high bit set;
/// [`op::ERROR`] answers any request.
pub mod op {
    pub const HELLO: u8 = 0x01;
    pub const PING: u8 = 0x02;
    pub const THROTTLE: u8 = 0x03;
    pub const PEEK: u8 = 0x04;
    /// Set on every reply op.
    pub const REPLY: u8 = 0x80;
    pub const HELLO_OK: u8 = HELLO | REPLY;
    pub const PONG: u8 = PING | REPLY;
    pub const THROTTLE_OK: u8 = THROTTLE | REPLY;
    pub const PEEK_OK: u8 = PEEK | REPLY;
    pub const ERROR: u8 = 0xff;
}

/// Longest routing key, in bytes.
pub const KEY_BYTES_MAX: usize = 512;
/// Longest auth token, in bytes.
pub const TOKEN_BYTES_MAX: usize = 256;
/// Longest error text a server sends, in bytes.
pub const ERROR_TEXT_BYTES_MAX: usize = 256;
/// HELLO's `shard` value meaning "no shard binding".
pub const SHARD_ANY: u16 = u16::MAX;

/// Fixed bytes of a HELLO payload before the token.
const HELLO_FIXED_BYTES: usize = 8;
/// Fixed bytes of a THROTTLE/PEEK payload before the key.
pub const THROTTLE_FIXED_BYTES: usize = 34;
/// Bytes of a HELLO_OK payload.
const HELLO_OK_BYTES: usize = 24;
/// Bytes of a verdict payload.
const VERDICT_BYTES: usize = 40;

const _: () = assert!(THROTTLE_FIXED_BYTES + KEY_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(HELLO_FIXED_BYTES + TOKEN_BYTES_MAX <= u16::MAX as usize);

/// HELLO: version negotiation, authentication and an optional shard binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    /// Lowest protocol version the client speaks.
    pub version_min: u16,
    /// Highest protocol version the client speaks.
    pub version_max: u16,
    /// The shard this connection wants to be served by, if any.
    pub shard: Option<u16>,
    /// The auth token; empty when the client has none.
    pub token: &'a [u8],
}

/// THROTTLE and PEEK: spend (or ask about) `cost` units of `key`'s bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle<'a> {
    /// The routing key (client id); 1..=KEY_BYTES_MAX bytes.
    pub key: &'a [u8],
    /// The limit, inline.
    pub policy: Policy,
    /// Units to spend; at most `policy.burst`.
    pub cost: u64,
}

/// A request, as parsed from one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Hello(Hello<'a>),
    Ping,
    Throttle(Throttle<'a>),
    Peek(Throttle<'a>),
}

/// Why a message is not a valid request: the status to answer it with,
/// and a detail for the human text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// The wire status.
    pub status: Status,
    /// What exactly was wrong, if more than the status says.
    pub detail: Option<PolicyError>,
}

impl From<Status> for RequestError {
    fn from(status: Status) -> Self {
        RequestError {
            status,
            detail: None,
        }
    }
}

impl From<PolicyError> for RequestError {
    fn from(e: PolicyError) -> Self {
        let status = match e {
            PolicyError::CostExceedsBurst { .. } => Status::CostExceedsBurst,
            _ => Status::InvalidPolicy,
        };
        RequestError {
            status,
            detail: Some(e),
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail {
            Some(d) => write!(f, "{}: {d}", self.status.text()),
            None => f.write_str(self.status.text()),
        }
    }
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl<'a> Request<'a> {
    /// Parses and validates one request message.
    #[inline]
    pub fn parse(header: MessageHeader, payload: &'a [u8]) -> Result<Request<'a>, RequestError> {
        if header.flags != 0 {
            return Err(Status::BadRequest.into());
        }
        match header.op {
            op::THROTTLE => Ok(Request::Throttle(parse_throttle(payload)?)),
            op::PEEK => Ok(Request::Peek(parse_throttle(payload)?)),
            op::PING if payload.is_empty() => Ok(Request::Ping),
            op::PING => Err(Status::BadRequest.into()),
            op::HELLO => parse_hello(payload),
            _ => Err(Status::UnknownOp.into()),
        }
    }

    /// Appends this request as one message.
    pub fn encode(&self, w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
        match self {
            Request::Hello(h) => w.message(buf, op::HELLO, request_id, |b| {
                b.put_u16_le(h.version_min);
                b.put_u16_le(h.version_max);
                b.put_u16_le(h.shard.unwrap_or(SHARD_ANY));
                b.put_u16_le(h.token.len() as u16);
                b.put_slice(h.token);
            }),
            Request::Ping => w.message(buf, op::PING, request_id, |_| {}),
            Request::Throttle(t) => {
                w.message(buf, op::THROTTLE, request_id, |b| put_throttle(b, t))
            }
            Request::Peek(t) => w.message(buf, op::PEEK, request_id, |b| put_throttle(b, t)),
        }
    }
}

fn parse_hello(payload: &[u8]) -> Result<Request<'_>, RequestError> {
    if payload.len() < HELLO_FIXED_BYTES {
        return Err(Status::BadRequest.into());
    }
    let token_len = usize::from(u16_at(payload, 6));
    if payload.len() != HELLO_FIXED_BYTES + token_len || token_len > TOKEN_BYTES_MAX {
        return Err(Status::BadRequest.into());
    }
    let shard = u16_at(payload, 4);
    Ok(Request::Hello(Hello {
        version_min: u16_at(payload, 0),
        version_max: u16_at(payload, 2),
        shard: (shard != SHARD_ANY).then_some(shard),
        token: &payload[HELLO_FIXED_BYTES..],
    }))
}

#[inline]
fn parse_throttle(payload: &[u8]) -> Result<Throttle<'_>, RequestError> {
    if payload.len() < THROTTLE_FIXED_BYTES {
        return Err(Status::BadRequest.into());
    }
    let key_len = usize::from(u16_at(payload, 32));
    if payload.len() != THROTTLE_FIXED_BYTES + key_len {
        return Err(Status::BadRequest.into());
    }
    if key_len == 0 || key_len > KEY_BYTES_MAX {
        return Err(Status::BadKey.into());
    }
    let policy = Policy {
        count: u64_at(payload, 0),
        period_ns: u64_at(payload, 8),
        burst: u64_at(payload, 16),
    };
    policy.validate()?;
    let cost = u64_at(payload, 24);
    policy.check_cost(cost)?;
    Ok(Throttle {
        key: &payload[THROTTLE_FIXED_BYTES..],
        policy,
        cost,
    })
}

fn put_throttle(b: &mut BytesMut, t: &Throttle<'_>) {
    b.put_u64_le(t.policy.count);
    b.put_u64_le(t.policy.period_ns);
    b.put_u64_le(t.policy.burst);
    b.put_u64_le(t.cost);
    b.put_u16_le(t.key.len() as u16);
    b.put_slice(t.key);
}

/// HELLO_OK: what a client learns at handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloOk {
    /// The negotiated protocol version.
    pub version: u16,
    /// How many shards the node has.
    pub shard_count: u16,
    /// The shard serving this connection, when HELLO asked for one.
    pub shard: Option<u16>,
    /// How keys map to shards (`routing::ROUTING_XXH3_128_MULSHIFT`).
    pub routing: u8,
    /// The node's identity, stable for the life of the process.
    pub node_id: u64,
    /// The node's replication epoch.
    pub epoch: u64,
}

/// A reply, as parsed by a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    HelloOk(HelloOk),
    Pong,
    Throttle(Verdict),
    Peek(Verdict),
    /// An error: the code (which a newer server may send unknown to us) and
    /// the human text.
    Error {
        code: u16,
        text: String,
    },
}

impl Reply {
    /// The status of an error reply, if this is one and its code is known.
    pub fn status(&self) -> Option<Status> {
        match self {
            Reply::Error { code, .. } => Status::from_code(*code),
            _ => None,
        }
    }

    /// Parses one reply message; `None` if it is not a valid reply.
    pub fn parse(header: MessageHeader, p: &[u8]) -> Option<Reply> {
        match header.op {
            op::HELLO_OK if p.len() == HELLO_OK_BYTES => {
                let shard = u16_at(p, 4);
                Some(Reply::HelloOk(HelloOk {
                    version: u16_at(p, 0),
                    shard_count: u16_at(p, 2),
                    shard: (shard != SHARD_ANY).then_some(shard),
                    routing: p[6],
                    node_id: u64_at(p, 8),
                    epoch: u64_at(p, 16),
                }))
            }
            op::PONG if p.is_empty() => Some(Reply::Pong),
            op::THROTTLE_OK if p.len() == VERDICT_BYTES => Some(Reply::Throttle(parse_verdict(p))),
            op::PEEK_OK if p.len() == VERDICT_BYTES => Some(Reply::Peek(parse_verdict(p))),
            op::ERROR if p.len() >= 4 && p.len() == 4 + usize::from(u16_at(p, 2)) => {
                Some(Reply::Error {
                    code: u16_at(p, 0),
                    text: String::from_utf8_lossy(&p[4..]).into_owned(),
                })
            }
            _ => None,
        }
    }
}

fn parse_verdict(p: &[u8]) -> Verdict {
    Verdict {
        allowed: u64_at(p, 0) != 0,
        limit: u64_at(p, 8),
        remaining: u64_at(p, 16),
        retry_after_ns: u64_at(p, 24),
        reset_after_ns: u64_at(p, 32),
    }
}

/// Appends a HELLO_OK.
pub fn put_hello_ok(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, h: &HelloOk) {
    w.message(buf, op::HELLO_OK, request_id, |b| {
        b.put_u16_le(h.version);
        b.put_u16_le(h.shard_count);
        b.put_u16_le(h.shard.unwrap_or(SHARD_ANY));
        b.put_u8(h.routing);
        b.put_u8(0);
        b.put_u64_le(h.node_id);
        b.put_u64_le(h.epoch);
    });
}

/// Appends a PONG.
pub fn put_pong(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32) {
    w.message(buf, op::PONG, request_id, |_| {});
}

/// Appends a verdict as the reply to THROTTLE (`peek == false`) or PEEK.
#[inline]
pub fn put_verdict(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    peek: bool,
    v: &Verdict,
) {
    let op = if peek { op::PEEK_OK } else { op::THROTTLE_OK };
    w.message(buf, op, request_id, |b| {
        b.put_u64_le(u64::from(v.allowed));
        b.put_u64_le(v.limit);
        b.put_u64_le(v.remaining);
        b.put_u64_le(v.retry_after_ns);
        b.put_u64_le(v.reset_after_ns);
    });
}

/// Appends an ERROR with `text` cut to [`ERROR_TEXT_BYTES_MAX`] bytes (at a
/// character boundary).
pub fn put_error(
    w: &mut FrameWriter,
    buf: &mut BytesMut,
    request_id: u32,
    status: Status,
    text: &str,
) {
    let mut end = text.len().min(ERROR_TEXT_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text.as_bytes()[..end];
    w.message(buf, op::ERROR, request_id, |b| {
        b.put_u16_le(status.code());
        b.put_u16_le(text.len() as u16);
        b.put_slice(text);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::FrameDecoder;
    use tokio_util::codec::Decoder;

    fn one_message(buf: &mut BytesMut) -> (MessageHeader, Vec<u8>) {
        let frame = FrameDecoder::default().decode(buf).unwrap().unwrap();
        let (h, p) = frame.messages().next().unwrap();
        (h, p.to_vec())
    }

    #[test]
    fn requests_round_trip() {
        let policy = Policy::new(10, 1_000_000_000, 20).unwrap();
        let reqs = [
            Request::Ping,
            Request::Hello(Hello {
                version_min: 1,
                version_max: 3,
                shard: Some(2),
                token: b"secret",
            }),
            Request::Hello(Hello {
                version_min: 1,
                version_max: 1,
                shard: None,
                token: b"",
            }),
            Request::Throttle(Throttle {
                key: b"user:42",
                policy,
                cost: 3,
            }),
            Request::Peek(Throttle {
                key: b"k",
                policy,
                cost: 0,
            }),
        ];
        for r in reqs {
            let mut buf = BytesMut::new();
            let mut w = FrameWriter::new();
            r.encode(&mut w, &mut buf, 99);
            w.finish(&mut buf);
            let (h, p) = one_message(&mut buf);
            assert_eq!(h.request_id, 99);
            assert_eq!(Request::parse(h, &p).unwrap(), r);
        }
    }

    #[test]
    fn bad_requests_get_their_status() {
        let policy = Policy::new(10, 1_000_000_000, 20).unwrap();
        let h = |op| MessageHeader {
            op,
            flags: 0,
            request_id: 1,
        };
        let status = |hd, p: &[u8]| Request::parse(hd, p).unwrap_err().status;
        assert_eq!(status(h(0x42), &[]), Status::UnknownOp);
        assert_eq!(status(h(op::PING), &[1]), Status::BadRequest);
        assert_eq!(
            status(
                MessageHeader {
                    op: op::PING,
                    flags: 1,
                    request_id: 1
                },
                &[]
            ),
            Status::BadRequest
        );
        assert_eq!(status(h(op::THROTTLE), &[0; 10]), Status::BadRequest);
        let encode = |key: &[u8], p: Policy, cost| {
            let mut b = BytesMut::new();
            put_throttle(
                &mut b,
                &Throttle {
                    key,
                    policy: p,
                    cost,
                },
            );
            b.to_vec()
        };
        assert_eq!(
            status(h(op::THROTTLE), &encode(b"", policy, 1)),
            Status::BadKey
        );
        assert_eq!(
            status(
                h(op::THROTTLE),
                &encode(&[b'x'; KEY_BYTES_MAX + 1], policy, 1)
            ),
            Status::BadKey
        );
        assert!(
            Request::parse(h(op::THROTTLE), &encode(&[b'x'; KEY_BYTES_MAX], policy, 1)).is_ok()
        );
        assert_eq!(
            status(h(op::THROTTLE), &encode(b"k", policy, 21)),
            Status::CostExceedsBurst
        );
        let zero = Policy { count: 0, ..policy };
        assert_eq!(
            status(h(op::THROTTLE), &encode(b"k", zero, 1)),
            Status::InvalidPolicy
        );
        let mut long = encode(b"k", policy, 1);
        long.push(0);
        assert_eq!(status(h(op::THROTTLE), &long), Status::BadRequest);
    }

    #[test]
    fn replies_round_trip() {
        let v = Verdict {
            allowed: true,
            limit: 20,
            remaining: 19,
            retry_after_ns: 0,
            reset_after_ns: 100,
        };
        let hello = HelloOk {
            version: 1,
            shard_count: 4,
            shard: None,
            routing: 1,
            node_id: 7,
            epoch: 3,
        };
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        put_verdict(&mut w, &mut buf, 1, false, &v);
        put_verdict(&mut w, &mut buf, 2, true, &v);
        put_hello_ok(&mut w, &mut buf, 3, &hello);
        put_pong(&mut w, &mut buf, 4);
        put_error(&mut w, &mut buf, 5, Status::BadKey, &"é".repeat(200));
        w.finish(&mut buf);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        let replies: Vec<Reply> = frame
            .messages()
            .map(|(h, p)| Reply::parse(h, p).unwrap())
            .collect();
        assert_eq!(replies[0], Reply::Throttle(v));
        assert_eq!(replies[1], Reply::Peek(v));
        assert_eq!(replies[2], Reply::HelloOk(hello));
        assert_eq!(replies[3], Reply::Pong);
        match &replies[4] {
            Reply::Error { code, text } => {
                assert_eq!(*code, Status::BadKey.code());
                assert_eq!(text.len(), 256, "cut to the limit at a char boundary");
            }
            other => panic!("{other:?}"),
        }
    }
}
