//! One client connection, served on the shard thread that adopted it. The
//! task is a *coordinator*: it decodes frames, validates requests, decides
//! those whose keys this shard owns on the spot, forwards the rest to their
//! owners in one batch per shard, and writes every reply in request order,
//! as many as are ready in one write.
//!
//! Ordering: each request gets a sequence number. While nothing forwarded
//! is outstanding, replies are encoded straight into the write buffer;
//! otherwise they wait in `pending` (a slot per request, oldest first) until
//! every reply before them is in.
//!
//! Limits: a frame larger than `frame_bytes_max` or one that does not parse
//! ends the connection after an error reply (the stream can't be trusted);
//! a frame with more than `batch_max` requests is answered BATCH_TOO_LARGE
//! request by request; with `inflight_max` requests unanswered the task
//! stops reading until replies drain.

use std::collections::VecDeque;
use std::rc::Rc;

use bytes::BytesMut;
use sluice_protocol::codec::{Frame, FrameDecoder, FrameWriter};
use sluice_protocol::gcra::Verdict;
use sluice_protocol::message::{self, Hello, HelloOk, Request, RequestError, Throttle};
use sluice_protocol::routing::{key_hash, shard_of, ROUTING_XXH3_128_MULSHIFT};
use sluice_protocol::{Clock, Status, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

use crate::inbox::{self, Receiver, Sender};
use crate::shard::{Adopt, Batch, BatchReply, ConnectionGuard, FwdItem, ShardCore, ShardMsg};

/// Spare read-buffer capacity kept before each read.
const READ_CHUNK_BYTES: usize = 16 << 10;

/// A reply that is ready but must wait for an earlier one.
#[derive(Debug)]
enum Slot {
    /// Forwarded; its verdict has not come back.
    Waiting { request_id: u32, peek: bool },
    /// A verdict, ready.
    Verdict {
        request_id: u32,
        peek: bool,
        verdict: Verdict,
    },
    /// Anything else, ready.
    Other { request_id: u32, reply: Local },
}

/// A reply decided on this thread that is not a verdict.
#[derive(Debug)]
enum Local {
    Pong,
    HelloOk(HelloOk),
    Error(Status, String),
}

/// Where a HELLO asked this connection to go.
#[derive(Debug)]
struct Migration {
    shard: u16,
    request_id: u32,
}

/// The state of one connection task.
#[derive(Debug)]
struct Connection {
    /// The shard this task runs on.
    core: Rc<ShardCore>,
    /// The socket.
    stream: TcpStream,
    /// Bytes read and not yet decoded.
    rbuf: BytesMut,
    /// Encoded replies not yet written.
    wbuf: BytesMut,
    /// Frames replies into `wbuf`.
    writer: FrameWriter,
    /// Splits `rbuf` into frames, enforcing `frame_bytes_max`.
    decoder: FrameDecoder,
    /// Replies held for order; `pending[0]` has sequence `head_seq`.
    pending: VecDeque<Slot>,
    /// Sequence number of `pending[0]` (or of the next request when empty).
    head_seq: u64,
    /// Requests forwarded per shard, gathered while decoding one read.
    fwd: Vec<Vec<FwdItem>>,
    /// Where other shards send verdicts for this connection.
    replies_tx: Sender<BatchReply>,
    /// ... and where this task reads them.
    replies_rx: Receiver<BatchReply>,
    /// Batches forwarded and not yet answered.
    batches_out: usize,
    /// Whether HELLO carried the right token (or none is needed).
    authed: bool,
    /// Stop reading; close once every pending reply is written.
    closing: bool,
    /// Set by a HELLO that binds the connection to another shard.
    migrate: Option<Migration>,
    /// Keeps the node's connection count while the connection lives.
    guard: ConnectionGuard,
}

/// Serves one connection until it closes (or moves to another shard).
pub async fn run(core: Rc<ShardCore>, adopt: Adopt) {
    let Adopt {
        stream,
        read_buf,
        hello_request_id,
        authed,
        guard,
    } = adopt;
    let stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "could not register a connection");
            core.connection_closed();
            return;
        }
    };
    let (replies_tx, replies_rx) = inbox::inbox();
    let shard_count = usize::from(core.node.shard_count);
    let frame_bytes_max = core.node.config.frame_bytes_max;
    let mut conn = Connection {
        core: core.clone(),
        stream,
        rbuf: read_buf,
        wbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
        writer: FrameWriter::new(),
        decoder: FrameDecoder::new(frame_bytes_max),
        pending: VecDeque::new(),
        head_seq: 0,
        fwd: vec![Vec::new(); shard_count],
        replies_tx,
        replies_rx,
        batches_out: 0,
        authed,
        closing: false,
        migrate: None,
        guard,
    };
    if let Some(request_id) = hello_request_id {
        let hello = conn.hello_ok(Some(core.id));
        conn.push(request_id, Local::HelloOk(hello));
    }
    // Bytes that came along with a moved connection may hold whole frames.
    conn.decode_buffered();
    let result = conn.serve().await;
    if let Err(e) = &result {
        tracing::debug!(shard = core.id, error = %e, "connection ended");
    }
    if let Ok(Some(m)) = result {
        conn.move_to(m);
    }
    core.connection_closed();
}

impl Connection {
    /// The read-decide-write loop. `Ok(Some(m))` when HELLO asked to move.
    async fn serve(&mut self) -> std::io::Result<Option<Migration>> {
        let mut draining = self.core.draining.subscribe();
        let mut replies = Vec::new();
        loop {
            self.flush().await?;
            if let Some(m) = self.migrate.take() {
                return Ok(Some(m));
            }
            if *draining.borrow() {
                self.closing = true;
            }
            if self.closing && self.pending.is_empty() {
                let _ = self.stream.shutdown().await;
                return Ok(None);
            }
            let can_read = !self.closing && self.pending.len() < self.core.node.config.inflight_max;
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK_BYTES {
                self.rbuf.reserve(READ_CHUNK_BYTES);
            }
            tokio::select! {
                biased;
                more = self.replies_rx.recv_many(&mut replies), if self.batches_out > 0 => {
                    assert!(more, "the connection holds a sender of its own reply inbox");
                    for reply in replies.drain(..) {
                        self.batches_out -= 1;
                        self.fill(reply);
                    }
                }
                read = self.stream.read_buf(&mut self.rbuf), if can_read => {
                    if read? == 0 {
                        // The peer is gone or finished sending; a partial
                        // frame is dropped, pending replies still go out.
                        self.closing = true;
                    } else {
                        self.decode_buffered();
                    }
                }
                _ = draining.changed(), if !self.closing => {}
            }
        }
    }

    /// Decodes and handles every whole frame in the read buffer, then sends
    /// the forwarded batches it produced.
    fn decode_buffered(&mut self) {
        while !self.closing && self.migrate.is_none() {
            match self.decoder.decode(&mut self.rbuf) {
                Ok(Some(frame)) => self.handle_frame(&frame),
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(shard = self.core.id, error = %e, "closing a connection on a bad frame");
                    self.push(0, Local::Error(e.status(), e.to_string()));
                    self.closing = true;
                }
            }
        }
        self.send_forwards();
    }

    fn handle_frame(&mut self, frame: &Frame) {
        if frame.len() > self.core.node.config.batch_max {
            let text = format!(
                "{} requests in one frame; the limit is {}",
                frame.len(),
                self.core.node.config.batch_max
            );
            for (h, _) in frame.messages() {
                self.push(
                    h.request_id,
                    Local::Error(Status::BatchTooLarge, text.clone()),
                );
            }
            return;
        }
        let now_ns = self.core.clock.now_ns();
        for (h, payload) in frame.messages() {
            if self.closing {
                // AUTH_FAILED: nothing after it in the frame is served.
                break;
            }
            if !self.authed && h.op != message::op::HELLO {
                self.push(h.request_id, error(Status::AuthRequired.into()));
                continue;
            }
            match Request::parse(h, payload) {
                Ok(Request::Throttle(t)) => self.decide(h.request_id, &t, false, now_ns),
                Ok(Request::Peek(t)) => self.decide(h.request_id, &t, true, now_ns),
                Ok(Request::Ping) => self.push(h.request_id, Local::Pong),
                Ok(Request::Hello(hello)) => self.hello(h.request_id, &hello, frame.len()),
                Err(e) => self.push(h.request_id, error(e)),
            }
        }
    }

    /// Decides a THROTTLE or PEEK here, or queues it for its owner.
    #[inline]
    fn decide(&mut self, request_id: u32, t: &Throttle<'_>, peek: bool, now_ns: u64) {
        let key = key_hash(t.key);
        let shard = shard_of(key, self.core.node.shard_count);
        if shard == self.core.id {
            let mut table = self.core.table.borrow_mut();
            let verdict = if peek {
                table.peek(key, &t.policy, t.cost, now_ns)
            } else {
                table.throttle(key, &t.policy, t.cost, now_ns)
            };
            drop(table);
            if self.pending.is_empty() {
                message::put_verdict(&mut self.writer, &mut self.wbuf, request_id, peek, &verdict);
                self.head_seq += 1;
            } else {
                self.pending.push_back(Slot::Verdict {
                    request_id,
                    peek,
                    verdict,
                });
            }
        } else {
            let seq = self.head_seq + self.pending.len() as u64;
            self.pending.push_back(Slot::Waiting { request_id, peek });
            self.fwd[usize::from(shard)].push(FwdItem {
                seq,
                key,
                policy: t.policy,
                cost: t.cost,
                peek,
            });
        }
    }

    /// Answers HELLO: version, token, and an optional move to another shard.
    fn hello(&mut self, request_id: u32, hello: &Hello<'_>, frame_len: usize) {
        if !(hello.version_min..=hello.version_max).contains(&PROTOCOL_VERSION) {
            let text = format!("this server speaks version {PROTOCOL_VERSION}");
            return self.push(request_id, Local::Error(Status::UnsupportedVersion, text));
        }
        if let Some(expected) = &self.core.node.config.auth_token {
            if !constant_time_eq(expected.as_bytes(), hello.token) {
                self.closing = true;
                return self.push(request_id, error(Status::AuthFailed.into()));
            }
        }
        let Some(shard) = hello.shard else {
            self.authed = true;
            let hello_ok = self.hello_ok(None);
            return self.push(request_id, Local::HelloOk(hello_ok));
        };
        if shard >= self.core.node.shard_count {
            let text = format!(
                "shard {shard} does not exist; this node has {}",
                self.core.node.shard_count
            );
            return self.push(request_id, Local::Error(Status::BadRequest, text));
        }
        // Authenticated only by a HELLO that succeeds as a whole.
        self.authed = true;
        if shard == self.core.id {
            let hello_ok = self.hello_ok(Some(shard));
            return self.push(request_id, Local::HelloOk(hello_ok));
        }
        if frame_len != 1 || !self.pending.is_empty() || self.fwd.iter().any(|f| !f.is_empty()) {
            let text =
                "a HELLO that binds a shard must be alone in its frame with nothing in flight"
                    .to_owned();
            return self.push(request_id, Local::Error(Status::BadRequest, text));
        }
        self.migrate = Some(Migration { shard, request_id });
    }

    fn hello_ok(&self, shard: Option<u16>) -> HelloOk {
        HelloOk {
            version: PROTOCOL_VERSION,
            shard_count: self.core.node.shard_count,
            shard,
            routing: ROUTING_XXH3_128_MULSHIFT,
            node_id: self.core.node.node_id,
            epoch: self.core.node.epoch,
        }
    }

    /// Queues a non-verdict reply behind everything before it.
    fn push(&mut self, request_id: u32, reply: Local) {
        if self.pending.is_empty() {
            encode_local(&mut self.writer, &mut self.wbuf, request_id, &reply);
            self.head_seq += 1;
        } else {
            self.pending.push_back(Slot::Other { request_id, reply });
        }
    }

    /// Sends each shard its batch; a shard that no longer accepts work
    /// (shutting down) gets its requests answered SHUTTING_DOWN.
    fn send_forwards(&mut self) {
        for shard in 0..self.fwd.len() {
            if self.fwd[shard].is_empty() {
                continue;
            }
            let items = std::mem::take(&mut self.fwd[shard]);
            let batch = Batch {
                reply_to: self.replies_tx.clone(),
                items,
            };
            match self.core.node.shards[shard].send(ShardMsg::Batch(batch)) {
                Ok(()) => self.batches_out += 1,
                Err(ShardMsg::Batch(b)) => {
                    for it in b.items {
                        let reply = Local::Error(
                            Status::ShuttingDown,
                            Status::ShuttingDown.text().to_owned(),
                        );
                        self.set_slot(it.seq, |request_id, _| Slot::Other { request_id, reply });
                    }
                }
                Err(_) => unreachable!("send returns the message it was given"),
            }
        }
        self.drain_ready();
    }

    /// Files a batch's verdicts into their slots.
    fn fill(&mut self, reply: BatchReply) {
        for (seq, verdict) in reply.verdicts {
            self.set_slot(seq, |request_id, peek| Slot::Verdict {
                request_id,
                peek,
                verdict,
            });
        }
        self.drain_ready();
    }

    fn set_slot(&mut self, seq: u64, make: impl FnOnce(u32, bool) -> Slot) {
        let index = usize::try_from(seq - self.head_seq).expect("pending index fits usize");
        let slot = &mut self.pending[index];
        let Slot::Waiting { request_id, peek } = *slot else {
            panic!("reply for sequence {seq} arrived twice");
        };
        *slot = make(request_id, peek);
    }

    /// Encodes every ready reply at the head of `pending`.
    fn drain_ready(&mut self) {
        while let Some(slot) = self.pending.front() {
            match slot {
                Slot::Waiting { .. } => break,
                Slot::Verdict {
                    request_id,
                    peek,
                    verdict,
                } => {
                    message::put_verdict(
                        &mut self.writer,
                        &mut self.wbuf,
                        *request_id,
                        *peek,
                        verdict,
                    );
                }
                Slot::Other { request_id, reply } => {
                    encode_local(&mut self.writer, &mut self.wbuf, *request_id, reply)
                }
            }
            self.pending.pop_front();
            self.head_seq += 1;
        }
    }

    /// Writes every encoded reply in one write.
    async fn flush(&mut self) -> std::io::Result<()> {
        self.writer.finish(&mut self.wbuf);
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Hands the socket, and any bytes read past the HELLO, to `m.shard`.
    fn move_to(self, m: Migration) {
        let core = self.core.clone();
        let stream = match self.stream.into_std() {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "could not move a connection"),
        };
        let adopt = Adopt {
            stream,
            read_buf: self.rbuf,
            hello_request_id: Some(m.request_id),
            authed: self.authed,
            guard: self.guard,
        };
        // Refused only while shutting down: dropping the socket closes it.
        let _ = core.node.shards[usize::from(m.shard)].send(ShardMsg::Adopt(adopt));
    }
}

fn error(e: RequestError) -> Local {
    Local::Error(e.status, e.to_string())
}

fn encode_local(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, reply: &Local) {
    match reply {
        Local::Pong => message::put_pong(w, buf, request_id),
        Local::HelloOk(h) => message::put_hello_ok(w, buf, request_id, h),
        Local::Error(status, text) => message::put_error(w, buf, request_id, *status, text),
    }
}

/// Compares secrets in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
