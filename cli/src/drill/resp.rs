//! `--entry resp`: the drill's load as redis-cell's `CL.THROTTLE` over RESP,
//! sent to the nodes' RESP listeners (`sluiced --resp-port`), followers
//! included, as a Redis client of any node would send it.
//!
//! A hand-rolled RESP2 client, small on purpose: a command is an array of
//! bulk strings, and the only replies the drill reads are CL.THROTTLE's
//! array of five integers and an error line. A [`Pool`] keeps a few
//! pipelined connections to one node. Each connection is one task that
//! owns its socket (mini-redis's shape): it writes each command as it
//! comes and hands each reply to the call that has waited longest (RESP
//! answers in order). When the socket fails or a reply cannot be read,
//! the task ends: every call it had written hears [`Answer::Failed`] with
//! `maybe_applied` (sent, not answered: outcome unknown, as a v1 call
//! that timed out), every call it had not written hears it without, and
//! the next call opens a new connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use sluice_protocol::Limit;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::load::Answer;

/// Connections to each entry node: a few, so that one node's calls are
/// read by more than one of its threads.
pub const CONNECTIONS_PER_NODE: usize = 2;
/// How long a call waits for its reply (the v1 entry's deadline): past it,
/// its outcome is unknown.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long opening a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Most calls one connection has written and not yet had answered (a
/// stopped node answers nothing): past it, the connection takes no more
/// commands until replies come, and new calls wait in its queue.
pub const PENDING_MAX: usize = 1_024;
/// Most calls queued for one connection and not yet written; a call past
/// it fails at once, unsent.
pub const QUEUED_MAX: usize = 1_024;
/// Longest reply line or bulk string the client reads: a CL.THROTTLE reply
/// is about 30 bytes, an error line a few hundred. Longer is a stream this
/// client does not understand, and it closes the connection.
pub const REPLY_BYTES_MAX: usize = 64 << 10;
/// Most elements of a reply array (CL.THROTTLE's has 5).
pub const ARRAY_LEN_MAX: usize = 16;

/// redis-cell's `max_burst`, `count per period` and `period` (seconds):
/// `CL.THROTTLE key max_burst count period 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellArgs {
    /// `burst - 1` (redis-cell's bucket holds `max_burst + 1`).
    pub max_burst: u64,
    /// Units per period.
    pub count: u64,
    /// Whole seconds.
    pub period_s: u64,
}

impl CellArgs {
    /// The CL.THROTTLE arguments that make redis-cell's GCRA exactly
    /// `limit`, a token bucket: `None` when there are none (another kind;
    /// a period of not whole seconds; or an emission interval,
    /// `period / count`, of not whole nanoseconds, which redis-cell
    /// truncates and the judge's bucket does not).
    pub fn of(limit: &Limit) -> Option<CellArgs> {
        let Limit::TokenBucket(p) = limit else {
            return None;
        };
        const NS_PER_S: u64 = 1_000_000_000;
        let exact = p.period_ns % NS_PER_S == 0 && p.period_ns % p.count == 0 && p.burst >= 1;
        exact.then_some(CellArgs {
            max_burst: p.burst - 1,
            count: p.count,
            period_s: p.period_ns / NS_PER_S,
        })
    }
}

/// `CL.THROTTLE key max_burst count period 1` as RESP: an array of bulk
/// strings.
pub fn throttle_command(key: &[u8], cell: &CellArgs) -> Vec<u8> {
    let numbers = [cell.max_burst, cell.count, cell.period_s, 1].map(|n| n.to_string());
    let mut parts: Vec<&[u8]> = vec![b"CL.THROTTLE", key];
    parts.extend(numbers.iter().map(|n| n.as_bytes()));
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        out.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One RESP2 reply, as far as the drill reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// `:N`.
    Int(i64),
    /// `+TEXT`.
    Simple(String),
    /// `-TEXT`.
    Error(String),
    /// `$N` and its bytes; `None` for the null bulk `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*N` and its elements; `None` for the null array `*-1`.
    Array(Option<Vec<Frame>>),
}

/// The stream cannot be read as RESP2 (or exceeds this client's bounds):
/// close the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corrupt(pub String);

/// Reads one frame from the front of `buf`: `Ok(None)` when more bytes are
/// needed, else the frame and the bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Frame, usize)>, Corrupt> {
    parse_at(buf, 0)
}

fn parse_at(buf: &[u8], depth: usize) -> Result<Option<(Frame, usize)>, Corrupt> {
    let Some(end) = line_end(buf)? else {
        return Ok(None);
    };
    let line = &buf[1..end];
    let text = || String::from_utf8_lossy(line).into_owned();
    let int = || -> Result<i64, Corrupt> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Corrupt(format!("not an integer: {:?}", text())))
    };
    let head = end + 2;
    let frame = match buf[0] {
        b':' => Frame::Int(int()?),
        b'+' => Frame::Simple(text()),
        b'-' => Frame::Error(text()),
        b'$' => {
            let Ok(n) = usize::try_from(int()?) else {
                return Ok(Some((Frame::Bulk(None), head)));
            };
            if n > REPLY_BYTES_MAX {
                return Err(Corrupt(format!("a bulk string of {n} bytes")));
            }
            if buf.len() < head + n + 2 {
                return Ok(None);
            }
            if &buf[head + n..head + n + 2] != b"\r\n" {
                return Err(Corrupt("a bulk string without its CRLF".into()));
            }
            return Ok(Some((
                Frame::Bulk(Some(buf[head..head + n].to_vec())),
                head + n + 2,
            )));
        }
        b'*' => {
            let Ok(n) = usize::try_from(int()?) else {
                return Ok(Some((Frame::Array(None), head)));
            };
            if n > ARRAY_LEN_MAX || depth > 0 {
                return Err(Corrupt(format!("an array of {n} at depth {depth}")));
            }
            let mut items = Vec::with_capacity(n);
            let mut at = head;
            for _ in 0..n {
                let Some((item, used)) = parse_at(&buf[at..], depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at += used;
            }
            return Ok(Some((Frame::Array(Some(items)), at)));
        }
        other => return Err(Corrupt(format!("a reply starting with {other:#04x}"))),
    };
    Ok(Some((frame, head)))
}

/// Where the first line of `buf` ends (its `\r`), if it has ended.
fn line_end(buf: &[u8]) -> Result<Option<usize>, Corrupt> {
    let limit = buf.len().min(REPLY_BYTES_MAX + 1);
    match buf[..limit].windows(2).position(|w| w == b"\r\n") {
        Some(end) if end >= 1 => Ok(Some(end)),
        Some(_) => Err(Corrupt("an empty reply line".into())),
        None if buf.len() > REPLY_BYTES_MAX => Err(Corrupt("a reply line too long".into())),
        None => Ok(None),
    }
}

/// What a CL.THROTTLE reply says: `[limited, limit, remaining,
/// retry_after, reset_after]` is a verdict; an error line is none, and
/// may have been applied only when it says the outcome is unknown (the
/// entry forwarded the call and heard nothing: `TRYAGAIN outcome unknown
/// ...`); `TRYAGAIN group unavailable`, `READONLY`, `CLUSTERDOWN` and the
/// rest were refused before anything was spent.
pub fn answer(frame: &Frame) -> Answer {
    match frame {
        Frame::Array(Some(items))
            if items.len() == 5 && items.iter().all(|i| matches!(i, Frame::Int(_))) =>
        {
            Answer::Verdict(items[0] == Frame::Int(0))
        }
        Frame::Error(text) => Answer::Failed {
            maybe_applied: text.contains("outcome unknown")
                || text.contains("may have been applied"),
        },
        // Something else answered the call: read as the worst case.
        _ => Answer::Failed {
            maybe_applied: true,
        },
    }
}

/// Why a call got no reply from its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lost {
    /// The connection ended before it wrote the call.
    Unsent,
    /// The connection ended after it wrote the call.
    Sent,
}

/// A call handed to a connection's task.
type Queued = (Vec<u8>, oneshot::Sender<Result<Frame, Lost>>);

/// A few pipelined connections to one node's RESP listener, each opened
/// when first needed and again after it failed.
#[derive(Debug)]
pub struct Pool {
    /// The node's RESP address.
    addr: SocketAddr,
    /// Each connection's queue into its task; `None` before the first call
    /// and after the task ended (held across a reconnect, so that one
    /// connection is opened at a time).
    conns: Vec<Mutex<Option<mpsc::Sender<Queued>>>>,
    /// Round robin over `conns`.
    next: AtomicUsize,
}

impl Pool {
    /// A pool for the node at `addr`; connects on the first call.
    pub fn new(addr: SocketAddr) -> Pool {
        Pool {
            addr,
            conns: (0..CONNECTIONS_PER_NODE)
                .map(|_| Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Sends `CL.THROTTLE key ...` on one of the connections and reads its
    /// answer.
    pub async fn throttle(&self, key: &[u8], cell: &CellArgs) -> Answer {
        let unsent = Answer::Failed {
            maybe_applied: false,
        };
        let Some(queue) = self.connection().await else {
            return unsent;
        };
        let (tx, rx) = oneshot::channel();
        if queue.try_send((throttle_command(key, cell), tx)).is_err() {
            return unsent;
        }
        match tokio::time::timeout(CALL_TIMEOUT, rx).await {
            Ok(Ok(Ok(frame))) => answer(&frame),
            Ok(Ok(Err(Lost::Unsent))) => unsent,
            // Written and then the connection failed, its task dropped the
            // call unanswered, or no answer in time: it may have been
            // applied.
            Ok(Ok(Err(Lost::Sent))) | Ok(Err(_)) | Err(_) => Answer::Failed {
                maybe_applied: true,
            },
        }
    }

    /// The queue of the next connection, opened now if it is not open.
    async fn connection(&self) -> Option<mpsc::Sender<Queued>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut slot = self.conns[i].lock().await;
        if let Some(queue) = slot.as_ref().filter(|q| !q.is_closed()) {
            return Some(queue.clone());
        }
        *slot = None;
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.addr))
            .await
            .ok()?
            .ok()?;
        let _ = stream.set_nodelay(true);
        let (tx, rx) = mpsc::channel(QUEUED_MAX);
        tokio::spawn(run(stream, rx));
        *slot = Some(tx.clone());
        Some(tx)
    }
}

/// A connection's task: writes queued calls, hands out replies in order,
/// and when it ends, tells every call it holds whether it was written.
async fn run(mut stream: TcpStream, mut queue: mpsc::Receiver<Queued>) {
    let mut pending = std::collections::VecDeque::new();
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        tokio::select! {
            read = stream.read_buf(&mut buf) => {
                match read {
                    Ok(n) if n > 0 => {}
                    _ => break,
                }
                if !hand_out(&mut buf, &mut pending) {
                    break;
                }
            }
            call = queue.recv(), if pending.len() < PENDING_MAX => {
                let Some((bytes, reply)) = call else { break };
                // Pending first: a write that fails half-way may have
                // reached the node.
                pending.push_back(reply);
                if stream.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        }
    }
    queue.close();
    while let Ok((_, reply)) = queue.try_recv() {
        let _ = reply.send(Err(Lost::Unsent));
    }
    for reply in pending {
        let _ = reply.send(Err(Lost::Sent));
    }
}

/// Gives each whole reply in `buf` to the call waiting longest; `false`
/// when the stream cannot be read on (corrupt, or a reply nobody asked
/// for).
fn hand_out(
    buf: &mut BytesMut,
    pending: &mut std::collections::VecDeque<oneshot::Sender<Result<Frame, Lost>>>,
) -> bool {
    loop {
        match parse(buf) {
            Ok(Some((frame, used))) => {
                buf.advance(used);
                let Some(reply) = pending.pop_front() else {
                    return false;
                };
                // The caller may have given up (timed out): nothing to do.
                let _ = reply.send(Ok(frame));
            }
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drill::audit::{self, Call};
    use sluice_protocol::cell::{self, CellPolicy};

    #[test]
    fn the_drill_bucket_is_this_cell_throttle() {
        let limit: Limit = "token-bucket:10/s,burst=20".parse().unwrap();
        let args = CellArgs::of(&limit).unwrap();
        assert_eq!(
            args,
            CellArgs {
                max_burst: 19,
                count: 10,
                period_s: 1
            }
        );
        assert_eq!(
            throttle_command(b"k", &args),
            b"*6\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$2\r\n19\r\n$2\r\n10\r\n$1\r\n1\r\n$1\r\n1\r\n"
        );
        // Not expressible exactly: other kinds, a period of not whole
        // seconds, an interval redis-cell would truncate.
        for spec in [
            "fixed-window:20/1s",
            "token-bucket:10/500ms",
            "token-bucket:3/1s",
        ] {
            assert_eq!(CellArgs::of(&spec.parse().unwrap()), None, "{spec}");
        }
    }

    /// redis-cell's decisions (protocol::cell, what sluiced runs for
    /// CL.THROTTLE) under the drill's arguments are the judge's bucket:
    /// random traffic decided by it is neither over nor under.
    #[test]
    fn cell_decisions_are_exactly_the_judged_bucket() {
        let limit: Limit = "token-bucket:10/s,burst=20".parse().unwrap();
        let a = CellArgs::of(&limit).unwrap();
        let policy =
            CellPolicy::new(a.max_burst as i64, a.count as i64, a.period_s as i64).expect("valid");
        let mut tat = None;
        let mut now = 1_800_000_000_000_000_000u64;
        let mut rng = 7u64;
        let mut calls = Vec::new();
        for _ in 0..20_000 {
            now += crate::drill::load::xorshift(&mut rng) % 60_000_000;
            let d = cell::throttle(tat, &policy, 1, now);
            if !d.verdict.limited {
                tat = d.tat_ns;
            }
            calls.push(Call {
                send_ns: now,
                recv_ns: now,
                cost: 1,
                allowed: !d.verdict.limited,
                store: true,
                maybe_applied: false,
                verdict: true,
            });
        }
        let admitted = calls.iter().filter(|c| c.allowed).count();
        assert!(admitted > 1_000 && admitted < calls.len(), "{admitted}");
        let f = audit::audit(&limit, &calls);
        assert_eq!((f.over.len(), f.under.len()), (0, 0), "{f:?}");
    }

    #[test]
    fn replies_are_read_whole_or_not_at_all() {
        let reply = b"*5\r\n:1\r\n:20\r\n:0\r\n:1\r\n:2\r\n";
        let (frame, used) = parse(reply).unwrap().unwrap();
        assert_eq!(used, reply.len());
        assert_eq!(answer(&frame), Answer::Verdict(false));
        for cut in 0..reply.len() {
            assert_eq!(parse(&reply[..cut]), Ok(None), "{cut}");
        }
        let ok = b"*5\r\n:0\r\n:20\r\n:19\r\n:-1\r\n:0\r\n";
        assert_eq!(
            answer(&parse(ok).unwrap().unwrap().0),
            Answer::Verdict(true)
        );
        let err = |line: &[u8]| answer(&parse(line).unwrap().unwrap().0);
        assert_eq!(
            err(b"-TRYAGAIN group unavailable: g1\r\n"),
            Answer::Failed {
                maybe_applied: false
            }
        );
        assert_eq!(
            err(b"-TRYAGAIN outcome unknown: no answer (do not resend a spend blindly)\r\n"),
            Answer::Failed {
                maybe_applied: true
            }
        );
        assert_eq!(
            parse(b"$3\r\nabc\r\n+OK\r\n").unwrap(),
            Some((Frame::Bulk(Some(b"abc".to_vec())), 9))
        );
        assert!(parse(b"?\r\n").is_err());
        assert!(parse(b"*17\r\n").is_err());
        assert!(parse(format!("${}\r\n", REPLY_BYTES_MAX + 1).as_bytes()).is_err());
    }
}
