//! One client connection, served on the shard thread that adopted it. The
//! task is a *coordinator*: it decodes frames, validates requests, decides
//! those whose keys this shard owns on the spot, forwards the rest to their
//! owners in one batch per shard, and writes every reply in request order,
//! as many as are ready in one write.
//!
//! The read-decide-write loop (sync-replication wait, flush, Drain,
//! closing, back-pressure) is `coordinator::run`, shared with the RESP
//! connection; this module is protocol v1's `coordinator::Handler` for it,
//! and says what becomes of a socket the loop hands on: a HELLO moves it
//! to another shard, a follower's SUBSCRIBE turns it into this shard's
//! replication flow. Ordering and forwarding are the [`Pipeline`]'s
//! (shared too): while nothing forwarded is outstanding, replies are
//! encoded straight into the write buffer; otherwise they wait their turn
//! there.
//!
//! Limits: a frame larger than `frame_bytes_max` or one that does not parse
//! ends the connection after an error reply (the stream can't be trusted);
//! a frame with more than `batch_max` requests is answered BATCH_TOO_LARGE
//! request by request; with `inflight_max` requests unanswered the task
//! stops reading until replies drain.

use std::rc::Rc;

use crate::stream::Stream;
use bytes::BytesMut;
use sluice_protocol::auth;
use sluice_protocol::codec::{Frame, FrameDecoder, FrameWriter, MessageHeader};
use sluice_protocol::gcra::Verdict;
use sluice_protocol::message::{
    self, Decide, Hello, HelloOk, LeaseOk, LeaseOp, LeaseTarget, LimitVerdict, Limits, Request,
    RequestError, ShardStats, Throttle,
};
use sluice_protocol::routing::{key_hash, shard_of, ROUTING_XXH3_128_MULSHIFT};
use sluice_protocol::{Clock, Status, PROTOCOL_VERSION};
use tokio_util::codec::Decoder;

use crate::coordinator::{self, constant_time_eq, Handler, ReplyShare, READ_CHUNK_BYTES};
use crate::forward::{OwnedLimits, OwnedTarget, RemoteOp};
use crate::mailbox::{Adopt, ShardMsg};
use crate::node::ShardCore;
use crate::pipeline::{Pipeline, Protocol};
use crate::shard::{BatchReply, ConnectionGuard, DecideOp, MultiVerdict, Op, Outcome};
use sluice_protocol::replication::{self, RoleOk, Subscribe};

/// A reply ready to be encoded.
#[derive(Debug)]
enum Reply {
    /// A THROTTLE or PEEK verdict.
    Verdict {
        /// The id to answer to.
        request_id: u32,
        /// PEEK rather than THROTTLE (the reply types differ).
        peek: bool,
        /// The decision.
        verdict: Verdict,
    },
    /// Anything else.
    Other {
        /// The id to answer to.
        request_id: u32,
        /// The reply.
        reply: Local,
    },
}

/// What a forwarded request's slot keeps until its verdict comes back.
#[derive(Clone, Copy, Debug)]
struct Tag {
    /// The id to answer to.
    request_id: u32,
    /// PEEK rather than THROTTLE (the reply types differ).
    peek: bool,
    /// For RENEW: how long the renewed lease lasts (its reply says so).
    renew_ns: Option<u64>,
}

/// Protocol v1's use of the [`Pipeline`].
#[derive(Debug)]
struct V1;

impl Protocol for V1 {
    type Tag = Tag;
    type Reply = Reply;

    fn answered(tag: Tag, outcome: Outcome) -> Reply {
        let reply = match outcome {
            Outcome::Verdict(verdict) => {
                return Reply::Verdict {
                    request_id: tag.request_id,
                    peek: tag.peek,
                    verdict,
                };
            }
            Outcome::Multi(m) => Local::Decide(m),
            Outcome::Lease(verdict) => lease_reply(verdict, tag.renew_ns),
            Outcome::Refused(status) => error(status.into()),
            Outcome::Failover(Ok(ok)) => Local::Failover(ok),
            Outcome::Failover(Err(text)) => Local::Error(Status::BadRequest, text),
            Outcome::Cell(v) => Local::Cell(v),
            Outcome::Failed(status, text) => Local::Error(status, text),
            Outcome::LeaseOk(ok) => Local::Lease {
                renew: tag.renew_ns.is_some(),
                ok,
            },
        };
        Reply::Other {
            request_id: tag.request_id,
            reply,
        }
    }

    fn refused(tag: Tag) -> Reply {
        let reply = Local::Error(Status::ShuttingDown, Status::ShuttingDown.text().to_owned());
        Reply::Other {
            request_id: tag.request_id,
            reply,
        }
    }

    fn weight(reply: &Reply) -> usize {
        use std::mem::size_of;
        let heap = match reply {
            Reply::Verdict { .. } => 0,
            Reply::Other { reply, .. } => match reply {
                Local::Error(_, text) => text.capacity(),
                Local::Decide(_) => size_of::<MultiVerdict>(),
                Local::Role(_) => size_of::<RoleOk>(),
                Local::Stats { shards, .. } => {
                    shards.len() * (size_of::<ShardStats>() + message::STATS_RECORD_BYTES)
                }
                _ => 0,
            },
        };
        size_of::<Reply>() + heap
    }
}

/// A reply decided on this thread that is not a verdict.
#[derive(Debug)]
enum Local {
    Pong,
    HelloOk(HelloOk),
    Error(Status, String),
    Decide(Box<MultiVerdict>),
    Lease {
        renew: bool,
        ok: LeaseOk,
    },
    Reload(u32),
    Role(Box<RoleOk>),
    Promote(u64),
    Failover(replication::FailoverOk),
    Cell(sluice_protocol::cell::CellVerdict),
    Cluster(Box<message::ClusterOk>),
    /// CHALLENGE_OK: this node's nonce and proof.
    Challenge(Box<([u8; auth::NONCE_BYTES], [u8; auth::PROOF_BYTES])>),
    Stats {
        shard_count: u16,
        shard_first: u16,
        shards: Vec<ShardStats>,
    },
}

/// The RELEASE_OK / RENEW_OK for a lease verdict.
fn lease_reply(verdict: LimitVerdict, renew_ns: Option<u64>) -> Local {
    Local::Lease {
        renew: renew_ns.is_some(),
        ok: LeaseOk {
            verdict,
            expires_after_ns: renew_ns.unwrap_or(0),
        },
    }
}

/// Where a HELLO asked this connection to go.
#[derive(Debug)]
struct Migration {
    shard: u16,
    request_id: u32,
}

/// Why the read-decide-write loop hands the socket on.
#[derive(Debug)]
enum Handoff {
    /// HELLO bound the connection to another shard.
    Move(Migration),
    /// A follower subscribed: the socket becomes this shard's flow.
    Flow(u32, Subscribe),
}

/// The state of one connection task, but for the socket and the bytes read
/// and not yet decoded (the [`coordinator`]'s).
#[derive(Debug)]
struct Connection {
    /// The shard this task runs on.
    core: Rc<ShardCore>,
    /// Encoded replies not yet written.
    wbuf: BytesMut,
    /// Frames replies into `wbuf`.
    writer: FrameWriter,
    /// Splits the read bytes into frames, enforcing `frame_bytes_max`.
    decoder: FrameDecoder,
    /// Replies in request order, and requests out at other shards.
    pipe: Pipeline<V1>,
    /// Key hashes of the frame being handled, by message index (0 for a
    /// message that is not a THROTTLE or PEEK): computed in a first pass
    /// that also starts loading each local key's slot, so a batch's cache
    /// misses overlap instead of queueing one after another.
    hashes: Vec<u128>,
    /// Whether HELLO carried the right token (or none is needed).
    authed: bool,
    /// The layout hash a forwarding node's HELLO carried, when it matched
    /// this node's (`forward`): its keys are decided here or refused,
    /// never forwarded again.
    forwarded: Option<u64>,
    /// A frame was decoded (or a HELLO, before a move): bytes that are not
    /// a frame are then just bad, not a Redis client at the wrong port.
    framed: bool,
    /// Stop reading; close once every pending reply is written.
    closing: bool,
    /// Whole frames wait in the read buffer, not decoded: the connection
    /// owes `reply_bytes_max` or has `inflight_max` requests unanswered.
    backlog: bool,
    /// Set by a HELLO that binds the connection to another shard, or by a
    /// follower's SUBSCRIBE.
    migrate: Option<Handoff>,
    /// Keeps the node's connection count while the connection lives.
    guard: ConnectionGuard,
    /// Its part of the shard's reply bytes owed.
    share: ReplyShare,
    /// The client's address, for the failed-authentication budget.
    peer: Option<std::net::IpAddr>,
    /// After a CHALLENGE: its nonce and this node's; HELLO must then carry
    /// the client's proof, not the token (`sluice_protocol::auth`).
    challenge: Option<Box<([u8; auth::NONCE_BYTES], [u8; auth::NONCE_BYTES])>>,
}

/// Serves one connection until it closes (or moves to another shard, or
/// becomes a replication flow).
pub async fn run(core: Rc<ShardCore>, adopt: Adopt) {
    let Adopt {
        stream,
        read_buf,
        hello_request_id,
        authed,
        forwarded,
        guard,
    } = adopt;
    let frame_bytes_max = if authed {
        core.node.config.frame_bytes_max
    } else {
        PRE_AUTH_FRAME_BYTES_MAX.min(core.node.config.frame_bytes_max)
    };
    let peer = stream.peer_addr().ok().map(|a| a.ip());
    let mut conn = Connection {
        peer,
        core: core.clone(),
        wbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
        writer: FrameWriter::new(),
        decoder: FrameDecoder::new(frame_bytes_max),
        pipe: Pipeline::new(core.node.shard_count),
        hashes: Vec::new(),
        authed,
        forwarded,
        framed: hello_request_id.is_some(),
        closing: false,
        backlog: false,
        migrate: None,
        guard,
        share: ReplyShare::new(core.clone()),
        challenge: None,
    };
    if let Some(request_id) = hello_request_id {
        let hello = conn.hello_ok(Some(core.id));
        conn.push(request_id, Local::HelloOk(hello));
    }
    coordinator::run(stream, read_buf, conn).await;
}

impl Handler for Connection {
    type Protocol = V1;
    type Handoff = Handoff;
    const NAME: &'static str = "connection";

    fn core(&self) -> &Rc<ShardCore> {
        &self.core
    }

    fn pipe(&mut self) -> &mut Pipeline<V1> {
        &mut self.pipe
    }

    fn closing(&self) -> bool {
        self.closing
    }

    fn authed(&self) -> bool {
        self.authed
    }

    fn eviction(&self) -> Option<std::sync::Arc<crate::signal::Signal>> {
        self.guard.eviction()
    }

    fn close(&mut self) {
        self.closing = true;
    }

    /// Bytes that came along with a moved connection may hold whole frames.
    fn started(&mut self, rbuf: &mut BytesMut) {
        self.decode_buffered(rbuf);
    }

    fn handle_read(&mut self, rbuf: &mut BytesMut) {
        self.decode_buffered(rbuf);
    }

    fn backlog(&self) -> bool {
        self.backlog
    }

    fn settle_replies(&mut self) {
        let owed = self.owed();
        self.share.settle(owed);
    }

    fn fill(&mut self, reply: BatchReply) {
        let (writer, wbuf, core) = (&mut self.writer, &mut self.wbuf, &self.core);
        self.pipe.fill(reply, |r| encode(core, writer, wbuf, r));
    }

    /// Closes the frame being written: every encoded reply goes in one
    /// write.
    fn output(&mut self) -> &mut BytesMut {
        self.writer.finish(&mut self.wbuf);
        &mut self.wbuf
    }

    fn take_handoff(&mut self) -> Option<Handoff> {
        self.migrate.take()
    }

    async fn hand_off(self, stream: Stream, rbuf: BytesMut, handoff: Handoff) {
        let core = self.core.clone();
        match handoff {
            Handoff::Move(m) => {
                self.move_to(stream, rbuf, m);
                core.connection_closed();
            }
            Handoff::Flow(request_id, sub) => {
                // A flow is not a client connection: it does not hold a slot.
                core.connection_closed();
                drop(self);
                crate::replication::primary::serve_flow(core, stream, rbuf, request_id, sub).await;
            }
        }
    }
}

impl Connection {
    /// Bytes of replies this connection owes: encoded and not yet written,
    /// or held in order behind a forwarded request.
    #[inline]
    fn owed(&self) -> usize {
        self.wbuf.len() + self.pipe.held_bytes()
    }

    /// Decodes and handles every whole frame in `rbuf`, then sends the
    /// forwarded batches it produced.
    fn decode_buffered(&mut self, rbuf: &mut BytesMut) {
        let (reply_max, inflight_max) = {
            let config = &self.core.node.config;
            (config.reply_bytes_max, config.inflight_max)
        };
        self.backlog = false;
        while !self.closing && self.migrate.is_none() {
            if self.share.full(self.owed(), reply_max) || self.pipe.len() >= inflight_max {
                // The rest waits in `rbuf` until the replies are written
                // (this connection's, or at the shard's share of
                // --reply-bytes-node-max others'; the coordinator reads no
                // more meanwhile).
                self.backlog = true;
                break;
            }
            match self.decoder.decode(rbuf) {
                Ok(Some(frame)) => {
                    self.framed = true;
                    // One clock read more per frame: the decisions' own
                    // reading is where the frame's time starts.
                    let now_ns = self.core.clock.now_ns();
                    self.handle_frame(&frame, now_ns);
                    let ns = self.core.clock.now_ns().saturating_sub(now_ns);
                    self.core.count_frame(ns);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(shard = self.core.id, error = %e, "closing a connection on a bad frame");
                    if !self.framed && looks_like_resp(rbuf) {
                        // A Redis client (redis-cli, a library) at this
                        // port: told in its own protocol, which it shows.
                        self.wbuf.extend_from_slice(RESP_ON_BINARY_PORT.as_bytes());
                    } else {
                        self.push(0, Local::Error(e.status(), e.to_string()));
                    }
                    self.closing = true;
                }
            }
        }
        self.send_forwards();
        self.core.publish_stats();
    }

    /// A frame of more requests than `--batch-max`: each refused
    /// BATCH_TOO_LARGE, none served.
    #[cold]
    fn refuse_batch(&mut self, frame: &Frame) {
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
    }

    fn handle_frame(&mut self, frame: &Frame, now_ns: u64) {
        if frame.len() > self.core.node.config.batch_max {
            return self.refuse_batch(frame);
        }
        self.core.sync_epoch();
        let primary = self.core.admits(now_ns);
        let reply_max = self.core.node.config.reply_bytes_max;
        let route = self.route();
        self.hash_and_prefetch(frame);
        for (i, (h, payload)) in frame.messages().enumerate() {
            if self.closing || self.migrate.is_some() {
                // AUTH_FAILED: nothing after it in the frame is served.
                break;
            }
            if h.request_id == 0 {
                // 0 names the connection as a whole: answered so, and the
                // connection is over (PROTOCOL.md, "Request ids").
                let text = "request id 0 is reserved for errors about the connection".to_owned();
                self.push(0, Local::Error(Status::BadRequest, text));
                self.closing = true;
                break;
            }
            if !self.authed && h.op != message::op::HELLO && h.op != message::op::CHALLENGE {
                // Before authentication: HELLO (or CHALLENGE) and nothing
                // else.
                self.push(h.request_id, error(Status::AuthRequired.into()));
                self.closing = true;
                break;
            }
            if h.op == replication::op::SUBSCRIBE {
                self.subscribe(h.request_id, payload, frame.len());
                continue;
            }
            if self.owed() >= reply_max {
                // A frame whose replies outgrow the bound (STATS at many
                // shards): the rest of it is refused, not held.
                let text = format!(
                    "{} bytes of replies owed to this connection; the limit is {reply_max} (--reply-bytes-max)",
                    self.owed()
                );
                self.push(h.request_id, Local::Error(Status::ReplyBufferFull, text));
                continue;
            }
            // Matched by reference: a DECIDE is 340 bytes, not worth a copy.
            let parsed = self.parse(h, payload);
            if let (Some(route), Ok(request)) = (&route, &parsed) {
                if self.routed(route, h.request_id, request, self.hashes[i]) {
                    continue;
                }
            }
            match &parsed {
                Ok(
                    Request::Throttle(_)
                    | Request::Release(_)
                    | Request::Renew(_)
                    | Request::Cell(_),
                ) if !primary => self.not_primary(h.request_id),
                Ok(Request::Decide(d)) if !primary && d.mode != message::Mode::Probe => {
                    self.not_primary(h.request_id)
                }
                Ok(Request::Throttle(t)) => {
                    self.decide(h.request_id, t, self.hashes[i], false, now_ns)
                }
                Ok(Request::Peek(t)) => self.decide(h.request_id, t, self.hashes[i], true, now_ns),
                Ok(Request::Ping) => self.push(h.request_id, Local::Pong),
                Ok(Request::Hello(hello)) => self.hello(h.request_id, hello, frame.len()),
                Ok(Request::Challenge { nonce }) => self.challenge(h.request_id, *nonce),
                Ok(Request::Decide(d)) => self.decide_many(h.request_id, d, now_ns),
                Ok(Request::Release(op)) => self.lease(h.request_id, op, false, now_ns),
                Ok(Request::Renew(op)) => self.lease(h.request_id, op, true, now_ns),
                Ok(Request::Reload) => self.reload(h.request_id),
                Ok(Request::Stats(st)) => self.stats(h.request_id, st.shard_first),
                Ok(Request::Role) => {
                    let role = Box::new(self.core.node.repl.role_ok(now_ns));
                    self.push(h.request_id, Local::Role(role));
                }
                Ok(Request::Promote) => self.promote(h.request_id),
                Ok(Request::Failover) => self.failover(h.request_id),
                Ok(Request::Cell(c)) => self.cell(h.request_id, c, self.hashes[i], now_ns),
                Ok(Request::Cluster { key }) => {
                    let ok = crate::forward::cluster_ok(self.core.node.forward.as_deref(), key);
                    self.push(h.request_id, Local::Cluster(Box::new(ok)));
                }
                Err(e) => self.push(h.request_id, error(*e)),
            }
        }
    }

    /// Parses a request. A CELL that carries its key's hash is taken
    /// only from a forwarding node (its HELLO named this node's layout,
    /// and HELLO_OK announced the feature): from anyone else,
    /// BAD_REQUEST, as a flag the connection was not offered.
    #[inline]
    fn parse<'a>(&self, h: MessageHeader, payload: &'a [u8]) -> Result<Request<'a>, RequestError> {
        if h.flags == message::CELL_KEY_HASH && h.op == message::op::CELL {
            if self.forwarded.is_none() {
                return Err(Status::BadRequest.into());
            }
            return Request::parse_cell_hashed(payload);
        }
        Request::parse(h, payload)
    }

    /// First pass over a frame: hash every THROTTLE/PEEK/CELL key (a CELL
    /// is what an entry node forwards a CL.THROTTLE as) and prefetch
    /// the table slot of each key this shard owns, so the batch's cache
    /// misses overlap; the second pass then decides on cached slots. A key
    /// that turns out malformed just wasted a hash.
    fn hash_and_prefetch(&mut self, frame: &Frame) {
        self.hashes.clear();
        let table = self.core.table.borrow();
        for (h, payload) in frame.messages() {
            let hash = match h.op {
                message::op::THROTTLE | message::op::PEEK => payload
                    .get(message::THROTTLE_FIXED_BYTES..)
                    .map_or(0, key_hash),
                // A forwarding node sent the key's hash: no hashing again
                // (whether it may is checked as the request is parsed).
                message::op::CELL
                    if h.flags == message::CELL_KEY_HASH
                        && payload.len() == message::CELL_FIXED_BYTES + 16 =>
                {
                    message::cell_hash_at(payload)
                }
                message::op::CELL => payload.get(message::CELL_FIXED_BYTES..).map_or(0, key_hash),
                _ => 0,
            };
            if hash != 0 && shard_of(hash, self.core.node.shard_count) == self.core.id {
                table.prefetch(hash);
            }
            self.hashes.push(hash);
        }
    }

    /// Decides a THROTTLE or PEEK (whose key hashes to `key`) here, or
    /// queues it for its owner.
    #[inline]
    fn decide(&mut self, request_id: u32, t: &Throttle<'_>, key: u128, peek: bool, now_ns: u64) {
        debug_assert_eq!(key, key_hash(t.key));
        let shard = shard_of(key, self.core.node.shard_count);
        if shard == self.core.id {
            let mut table = self.core.table.borrow_mut();
            let verdict = if peek {
                Ok(table.peek(key, &t.policy, t.cost, now_ns))
            } else {
                table.throttle(key, &t.policy, t.cost, now_ns)
            };
            drop(table);
            let verdict = match verdict {
                Ok(v) => v,
                Err(status) => return self.push(request_id, error(status.into())),
            };
            if self.pipe.take_turn() {
                message::put_verdict(&mut self.writer, &mut self.wbuf, request_id, peek, &verdict);
            } else {
                self.pipe.queue(Reply::Verdict {
                    request_id,
                    peek,
                    verdict,
                });
            }
        } else {
            let (policy, cost) = (t.policy, t.cost);
            let op = if peek {
                Op::Peek { policy, cost }
            } else {
                Op::Throttle { policy, cost }
            };
            self.pipe.forward(
                shard,
                Tag {
                    request_id,
                    peek,
                    renew_ns: None,
                },
                key,
                op,
            );
        }
    }

    /// DECIDE: resolves the limits (inline, or the tier in force on this
    /// shard), then decides here or forwards to the key's owner.
    fn decide_many(&mut self, request_id: u32, d: &Decide<'_>, now_ns: u64) {
        let key = key_hash(d.key);
        let mut op = DecideOp::EMPTY;
        if let Err(e) = self.core.resolve(key, d, &mut op) {
            let tier = match d.limits {
                Limits::Tier(name) => Some(name),
                Limits::Inline(_) => None,
            };
            return self.push(request_id, self.refusal(e, tier));
        }
        let shard = shard_of(key, self.core.node.shard_count);
        if shard != self.core.id {
            let tag = Tag {
                request_id,
                peek: false,
                renew_ns: None,
            };
            return self.pipe.forward(shard, tag, key, Op::Decide(Box::new(op)));
        }
        let refs = &op.refs[..usize::from(op.count)];
        let result = self
            .core
            .table
            .borrow_mut()
            .decide_many(refs, op.mode, op.cost, now_ns);
        match result {
            Ok(mut m) => {
                m.priority = op.priority;
                self.push(request_id, Local::Decide(m))
            }
            Err(status) => self.push(request_id, error(status.into())),
        }
    }

    /// RELEASE and RENEW of a concurrency lease.
    fn lease(&mut self, request_id: u32, l: &LeaseOp<'_>, renew: bool, now_ns: u64) {
        let key = key_hash(l.key);
        let (bucket, limit) = match self.core.resolve_lease(key, l) {
            Ok(found) => found,
            Err(e) => {
                let tier = match l.target {
                    LeaseTarget::Tier { name, .. } => Some(name),
                    LeaseTarget::Inline { .. } => None,
                };
                return self.push(request_id, self.refusal(e, tier));
            }
        };
        let renew_ns = renew.then_some(limit.lease_ns);
        let shard = shard_of(key, self.core.node.shard_count);
        if shard != self.core.id {
            let op = if renew {
                Op::Renew {
                    bucket,
                    limit,
                    lease_id: l.lease_id,
                }
            } else {
                Op::Release {
                    bucket,
                    limit,
                    lease_id: l.lease_id,
                }
            };
            return self.pipe.forward(
                shard,
                Tag {
                    request_id,
                    peek: false,
                    renew_ns,
                },
                key,
                op,
            );
        }
        let mut table = self.core.table.borrow_mut();
        let result = if renew {
            table.renew(bucket, &limit, l.lease_id, now_ns)
        } else {
            table.release(bucket, &limit, l.lease_id, now_ns)
        };
        drop(table);
        match result {
            Ok(v) => self.push(request_id, lease_reply(v, renew_ns)),
            Err(status) => self.push(request_id, error(status.into())),
        }
    }

    /// A follower refuses to spend: NOT_PRIMARY, naming the primary.
    fn not_primary(&mut self, request_id: u32) {
        let text = self.core.node.repl.not_primary_text();
        self.push(request_id, Local::Error(Status::NotPrimary, text));
    }

    /// PROMOTE: this follower becomes the primary at a new epoch (on a
    /// fenced or probing primary: lifts the fence, the operator having
    /// made sure the follower is gone).
    fn promote(&mut self, request_id: u32) {
        let repl = &self.core.node.repl;
        let now_ns = self.core.clock.now_ns();
        let result = if repl.coordinated {
            Err(crate::replication::COORDINATED.to_owned())
        } else if repl.is_primary() && !repl.admits(now_ns) {
            repl.unfence()
        } else {
            repl.promote(self.core.node.advertised())
        };
        match result {
            Ok(epoch) => {
                self.core.sync_epoch();
                self.push(request_id, Local::Promote(epoch));
            }
            Err(text) => self.push(request_id, Local::Error(Status::BadRequest, text)),
        }
    }

    /// FAILOVER: a planned handover, answered (in order) when it is done.
    fn failover(&mut self, request_id: u32) {
        let tag = Tag {
            request_id,
            peek: false,
            renew_ns: None,
        };
        let (seq, tx) = self.pipe.defer(tag);
        let core = self.core.clone();
        tokio::task::spawn_local(async move {
            let result = crate::replication::primary::failover(core).await;
            let outcomes = vec![(seq, Outcome::Failover(result))];
            let _ = tx.send(BatchReply::new(outcomes));
        });
    }

    /// SUBSCRIBE: a follower asks for this shard's flow. The connection must
    /// be bound to this shard by its HELLO, with the SUBSCRIBE alone in its
    /// frame and nothing in flight; the socket then becomes the flow.
    fn subscribe(&mut self, request_id: u32, payload: &[u8], frame_len: usize) {
        let Some(sub) = Subscribe::parse(payload) else {
            return self.push(request_id, error(Status::BadRequest.into()));
        };
        if !self.core.node.repl.is_primary() {
            return self.not_primary(request_id);
        }
        if sub.shard != self.core.id
            || frame_len != 1
            || !self.pipe.is_empty()
            || self.pipe.has_unsent()
        {
            let text = format!(
                "SUBSCRIBE must come alone, with nothing in flight, on a connection bound to shard {}",
                sub.shard
            );
            return self.push(request_id, Local::Error(Status::BadRequest, text));
        }
        self.migrate = Some(Handoff::Flow(request_id, sub));
    }

    /// RELOAD: re-reads the config file's tiers (a small file, read on this
    /// thread) and hands them to every shard; this shard uses them at once.
    fn reload(&mut self, request_id: u32) {
        match self.core.node.reload_tiers("RELOAD") {
            Ok(tiers) => {
                let n = tiers.len() as u32;
                *self.core.tiers.borrow_mut() = tiers;
                self.push(request_id, Local::Reload(n));
            }
            Err(text) => self.push(request_id, Local::Error(Status::ConfigInvalid, text)),
        }
    }

    /// STATS: every shard's counters as last published, from `shard_first`.
    fn stats(&mut self, request_id: u32, shard_first: u16) {
        let keys_max = self.core.node.config.keys_max as u64;
        let shards = self
            .core
            .node
            .stats
            .iter()
            .skip(usize::from(shard_first))
            .take(message::STATS_RECORDS_MAX)
            .map(|s| s.read(keys_max))
            .collect();
        let shard_count = self.core.node.shard_count;
        self.push(
            request_id,
            Local::Stats {
                shard_count,
                shard_first,
                shards,
            },
        );
    }

    /// Answers HELLO: version, token, and an optional move to another shard.
    fn hello(&mut self, request_id: u32, hello: &Hello<'_>, frame_len: usize) {
        if !(hello.version_min..=hello.version_max).contains(&PROTOCOL_VERSION) {
            let text = format!("this server speaks version {PROTOCOL_VERSION}");
            return self.push(request_id, Local::Error(Status::UnsupportedVersion, text));
        }
        // (A handle of our own: the refusals below borrow the connection.)
        let core = self.core.clone();
        if let Some(expected) = &core.node.config.auth_token {
            let now = std::time::Instant::now();
            if self.refused_as_blocked(request_id, now) {
                return;
            }
            let failures = &self.core.node.auth_failures;
            let right = match self.challenge.as_deref() {
                // After a CHALLENGE, the client's proof and nothing else.
                Some((peer_nonce, node_nonce)) => {
                    auth::verify_peer(expected.as_bytes(), node_nonce, peer_nonce, hello.token)
                }
                None => constant_time_eq(expected.as_bytes(), hello.token),
            };
            if !right {
                if let Some(ip) = self.peer {
                    failures.failed(ip, now);
                }
                self.closing = true;
                // Whether a token came at all says nothing about the token.
                let text = if hello.token.is_empty() {
                    "authentication failed: this node requires a token (give it with --auth-token or SLUICE_AUTH_TOKEN)"
                } else {
                    "authentication failed: the token is wrong"
                };
                return self.push(
                    request_id,
                    Local::Error(Status::AuthFailed, text.to_owned()),
                );
            }
        }
        // Never adopted, nor fenced on: an epoch no promotion could reach.
        if !self.core.node.repl.epoch_credible(hello.epoch) {
            let own = self.core.node.epoch();
            self.core.node.repl.log_incredible_epoch(hello.epoch);
            let text = format!(
                "epoch {} is beyond this node's {own} by more than 2^32: refused",
                hello.epoch
            );
            return self.push(request_id, Local::Error(Status::BadRequest, text));
        }
        if hello.layout != 0 {
            // A forwarding node: same layout, or no forwards at all.
            let ours = self.core.node.forward.as_ref().map(|f| f.layout_hash());
            if ours != Some(hello.layout) {
                return self.layout_mismatch(request_id, hello.layout, ours);
            }
            self.forwarded = Some(hello.layout);
        }
        // (Only from an authenticated peer: a stale primary stops admitting.)
        self.core.node.repl.saw_epoch(hello.epoch);
        let Some(shard) = hello.shard else {
            self.authenticated();
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
        if shard == self.core.id {
            self.authenticated();
            let hello_ok = self.hello_ok(Some(shard));
            return self.push(request_id, Local::HelloOk(hello_ok));
        }
        if frame_len != 1 || !self.pipe.is_empty() || self.pipe.has_unsent() {
            let text =
                "a HELLO that binds a shard must be alone in its frame with nothing in flight"
                    .to_owned();
            return self.push(request_id, Local::Error(Status::BadRequest, text));
        }
        self.authenticated();
        self.migrate = Some(Handoff::Move(Migration { shard, request_id }));
    }

    /// Refuses (AUTH_FAILED, and the connection ends) an attempt from an
    /// address blocked after failed authentications; whether it did.
    fn refused_as_blocked(&mut self, request_id: u32, now: std::time::Instant) -> bool {
        let failures = &self.core.node.auth_failures;
        let Some(wait) = self.peer.and_then(|ip| failures.blocked(ip, now)) else {
            return false;
        };
        self.closing = true;
        let text = format!(
            "authentication failed: too many failed authentications from this address; retry in {} ms",
            wait.as_millis()
        );
        self.push(request_id, Local::Error(Status::AuthFailed, text));
        true
    }

    /// Answers CHALLENGE: this node's nonce and its proof that it knows the
    /// token (PROTOCOL.md, "CHALLENGE").
    fn challenge(&mut self, request_id: u32, peer_nonce: [u8; auth::NONCE_BYTES]) {
        let core = self.core.clone();
        let Some(token) = &core.node.config.auth_token else {
            self.closing = true;
            let text = "authentication failed: this node has no token, so it cannot prove one (give both nodes the same --auth-token)";
            return self.push(
                request_id,
                Local::Error(Status::AuthFailed, text.to_owned()),
            );
        };
        if self.authed || self.challenge.is_some() {
            self.closing = true;
            let text = "CHALLENGE comes once, before HELLO".to_owned();
            return self.push(request_id, Local::Error(Status::BadRequest, text));
        }
        if self.refused_as_blocked(request_id, std::time::Instant::now()) {
            return;
        }
        let node_nonce = match crate::challenge::random_nonce() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "no nonce for a CHALLENGE: /dev/urandom failed");
                self.closing = true;
                let text = format!("no nonce: {e}");
                return self.push(request_id, Local::Error(Status::Internal, text));
            }
        };
        let proof = auth::node_proof(token.as_bytes(), &peer_nonce, &node_nonce);
        self.challenge = Some(Box::new((peer_nonce, node_nonce)));
        self.push(request_id, Local::Challenge(Box::new((node_nonce, proof))));
    }

    /// A forwarding node's HELLO with another layout: refused, counted,
    /// logged (once a connection: the forwarder reconnects at most every
    /// search interval).
    fn layout_mismatch(&mut self, request_id: u32, theirs: u64, ours: Option<u64>) {
        let ours_text = match ours {
            Some(h) => format!("{h:016x}"),
            None => "none (this node has no --cluster)".to_owned(),
        };
        if let Some(f) = &self.core.node.forward {
            f.stats
                .layout_mismatches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        tracing::warn!(
            theirs = format_args!("{theirs:016x}"),
            ours = %ours_text,
            "refused a forwarding node whose cluster layout differs from this node's"
        );
        let text = format!(
            "layout mismatch: the forwarding node's cluster layout is {theirs:016x}, this node's is {ours_text}; give both the same cluster file"
        );
        self.push(request_id, Local::Error(Status::LayoutMismatch, text));
    }

    /// The connection has authenticated: frames up to the node's limit.
    fn authenticated(&mut self) {
        if !self.authed {
            self.authed = true;
            self.guard.authenticated();
            self.decoder
                .set_frame_bytes_max(self.core.node.config.frame_bytes_max);
        }
    }

    fn hello_ok(&self, shard: Option<u16>) -> HelloOk {
        HelloOk {
            version: PROTOCOL_VERSION,
            shard_count: self.core.node.shard_count,
            shard,
            routing: ROUTING_XXH3_128_MULSHIFT,
            node_id: self.core.node.node_id,
            epoch: self.core.node.epoch(),
            // A forwarding node's connection may send a CELL with its
            // key's hash in place of the key (the one sender this node
            // trusts to have hashed it; PROTOCOL.md, "CELL").
            features: if self.forwarded.is_some() {
                message::FEATURE_CELL_KEY_HASH
            } else {
                0
            },
        }
    }

    /// Queues a non-verdict reply behind everything before it.
    fn push(&mut self, request_id: u32, reply: Local) {
        if let Some(r) = self.pipe.ready(Reply::Other { request_id, reply }) {
            encode(&self.core, &mut self.writer, &mut self.wbuf, &r);
        }
    }

    /// Sends each shard its batch (see [`Pipeline::send_forwards`]).
    fn send_forwards(&mut self) {
        let (writer, wbuf, core) = (&mut self.writer, &mut self.wbuf, &self.core);
        self.pipe
            .send_forwards(&core.node, |r| encode(core, writer, wbuf, r));
    }

    /// Hands the socket, and any bytes read past the HELLO, to `m.shard`.
    fn move_to(self, stream: Stream, rbuf: BytesMut, m: Migration) {
        let core = self.core.clone();
        let stream = match stream.park() {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "could not move a connection"),
        };
        let adopt = Adopt {
            stream,
            read_buf: rbuf,
            hello_request_id: Some(m.request_id),
            authed: self.authed,
            forwarded: self.forwarded,
            guard: self.guard,
        };
        // Refused only while shutting down: dropping the socket closes it.
        let _ = core.node.shards[usize::from(m.shard)].send(ShardMsg::Adopt(adopt));
    }
}

/// How a frame's keys are placed on a node of a cluster (`--cluster`).
#[derive(Debug)]
struct Route {
    /// The cluster as the node sees it now.
    view: std::sync::Arc<crate::forward::View>,
    /// Whether this node decides its own group's keys (it is the primary).
    decides_own: bool,
    /// The connection came from a forwarding node: never forward again.
    forwarded: bool,
}

impl Connection {
    /// How this frame's keys are placed, on a node of a cluster; `None`
    /// when they are all decided here as on a lone node.
    fn route(&self) -> Option<Route> {
        self.core.node.forward.as_ref().and_then(|f| {
            let view = f.view();
            // A forwarding node routes each connection's keys by the layout
            // its HELLO named (it opens new connections when its layout
            // changes): while that is this node's too, every key it sends
            // is this group's, decided here with no lookup (nor a call per
            // request: an owner's hot path).
            if self.forwarded == Some(view.hash) {
                return None;
            }
            Some(Route {
                forwarded: self.forwarded.is_some(),
                view,
                // A follower's own keys go to its primary too.
                decides_own: self.core.node.repl.is_primary(),
            })
        })
    }

    /// Places a keyed request on a node of a cluster: `true` when it was
    /// taken (forwarded to another node, or refused WRONG_GROUP), `false`
    /// when it is decided here as on a lone node. `hash`: the key's hash
    /// for a THROTTLE, PEEK or CELL (computed by the prefetch pass), else
    /// 0.
    #[inline(never)]
    fn routed(
        &mut self,
        route: &Route,
        request_id: u32,
        request: &Request<'_>,
        hash: u128,
    ) -> bool {
        let key = match request {
            Request::Throttle(t) | Request::Peek(t) => t.key,
            Request::Decide(d) => d.key,
            Request::Release(l) | Request::Renew(l) => l.key,
            Request::Cell(c) => c.key,
            _ => return false,
        };
        let hash = match request {
            // (Taken only from a forwarding node, never forwarded again.)
            Request::Cell(message::Cell { hash: Some(h), .. }) => *h,
            _ if hash != 0 => hash,
            _ => key_hash(key),
        };
        let group = route.view.group_of(hash);
        let own = route.view.is_own(group);
        if route.forwarded {
            if own {
                return false;
            }
            let forward = self
                .core
                .node
                .forward
                .as_ref()
                .expect("a route needs --cluster");
            forward
                .stats
                .wrong_group
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let text = format!(
                "wrong group: the key belongs to group `{}` and this node is in `{}`; a forwarded request is never forwarded again (the two nodes' layouts changed apart)",
                route.view.owner(hash),
                forward.group()
            );
            self.push(request_id, Local::Error(Status::WrongGroup, text));
            return true;
        }
        if own && route.decides_own {
            return false;
        }
        let (tag, op) = remote_op(request_id, request, key);
        let forward = self.core.node.forward.as_ref();
        let forward = forward.expect("a route needs --cluster");
        self.pipe
            .forward_remote(tag, op, (&route.view, group), forward);
        true
    }

    /// CELL: a CL.THROTTLE another node forwarded (or a v1 client sent),
    /// decided on the key's shard with redis-cell's arithmetic.
    fn cell(&mut self, request_id: u32, c: &message::Cell<'_>, hash: u128, now_ns: u64) {
        // (The first pass read a hashed CELL's hash, or hashed the key.)
        let key = match c.hash {
            _ if hash != 0 => hash,
            Some(h) => h,
            None => key_hash(c.key),
        };
        let shard = shard_of(key, self.core.node.shard_count);
        if shard != self.core.id {
            let tag = Tag {
                request_id,
                peek: false,
                renew_ns: None,
            };
            let op = Op::Cell {
                policy: c.policy,
                quantity: c.quantity,
            };
            return self.pipe.forward(shard, tag, key, op);
        }
        let verdict = self
            .core
            .table
            .borrow_mut()
            .cell_throttle(key, &c.policy, c.quantity, now_ns);
        match verdict {
            // Encoded at once when it has its turn, with no `Reply` built
            // and dropped (a forwarded CL.THROTTLE's owner answers one per
            // op: benches/notes.md).
            Ok(v) if self.pipe.take_turn() => {
                message::put_cell_ok(&mut self.writer, &mut self.wbuf, request_id, &v);
            }
            Ok(v) => self.pipe.queue(Reply::Other {
                request_id,
                reply: Local::Cell(v),
            }),
            Err(status) => self.push(request_id, error(status.into())),
        }
    }

    /// A resolved request's refusal; an unknown tier's says which tiers
    /// there are.
    fn refusal(&self, e: RequestError, tier: Option<&str>) -> Local {
        match tier {
            Some(name) if e.status == Status::UnknownTier => {
                Local::Error(e.status, self.core.unknown_tier_text(name))
            }
            _ => error(e),
        }
    }
}

/// A keyed request as the forwarder sends it to another node, and what
/// its slot remembers.
#[inline(never)]
fn remote_op(request_id: u32, request: &Request<'_>, key: &[u8]) -> (Tag, RemoteOp) {
    let key = bytes::Bytes::copy_from_slice(key);
    let mut tag = Tag {
        request_id,
        peek: false,
        renew_ns: None,
    };
    let op = match *request {
        Request::Throttle(t) | Request::Peek(t) => {
            tag.peek = matches!(request, Request::Peek(_));
            RemoteOp::Throttle {
                key,
                policy: t.policy,
                cost: t.cost,
                peek: tag.peek,
            }
        }
        Request::Decide(d) => RemoteOp::Decide {
            key,
            limits: OwnedLimits::new(&d.limits),
            mode: d.mode,
            cost: d.cost,
            priority: d.priority,
        },
        Request::Release(l) | Request::Renew(l) => {
            let renew = matches!(request, Request::Renew(_));
            // The owner's RENEW_OK carries the lease's life; the tag only
            // says which reply it is.
            tag.renew_ns = renew.then_some(0);
            RemoteOp::Lease {
                key,
                target: OwnedTarget::new(&l.target),
                lease_id: l.lease_id,
                renew,
            }
        }
        Request::Cell(c) => RemoteOp::Cell {
            key,
            policy: c.policy,
            quantity: c.quantity,
        },
        _ => unreachable!("only keyed requests are forwarded"),
    };
    (tag, op)
}

/// Largest frame body a connection may send before it has authenticated:
/// room for a HELLO with the longest token (8 + 256 + 8 bytes, plus its
/// header) and little else, so that a client without the token cannot make
/// the node buffer or answer much.
pub const PRE_AUTH_FRAME_BYTES_MAX: u32 = 1024;

/// What a Redis client hears on the binary port (a RESP error line).
const RESP_ON_BINARY_PORT: &str = "-ERR this is sluiced's binary port: Redis clients connect to its RESP listener (start sluiced with --resp-port PORT, then use that port)\r\n";

/// Whether bytes that are no frame look like a Redis client's first
/// command: an array (`*1\r\n...`) or an inline command (`PING\r\n`).
/// (As a frame, either declares hundreds of MiB: always refused.)
fn looks_like_resp(bytes: &[u8]) -> bool {
    let start = &bytes[..bytes.len().min(16)];
    match start.first() {
        Some(b'*') => start.get(1).is_some_and(u8::is_ascii_digit),
        Some(b) if b.is_ascii_alphabetic() => start
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()),
        _ => false,
    }
}

fn error(e: RequestError) -> Local {
    Local::Error(e.status, e.to_string())
}

fn encode(core: &ShardCore, w: &mut FrameWriter, buf: &mut BytesMut, reply: &Reply) {
    if let Reply::Other {
        reply: Local::Error(status, _),
        ..
    } = reply
    {
        core.count_error(*status);
    }
    match reply {
        Reply::Verdict {
            request_id,
            peek,
            verdict,
        } => message::put_verdict(w, buf, *request_id, *peek, verdict),
        Reply::Other { request_id, reply } => encode_local(w, buf, *request_id, reply),
    }
}

fn encode_local(w: &mut FrameWriter, buf: &mut BytesMut, request_id: u32, reply: &Local) {
    match reply {
        Local::Pong => message::put_pong(w, buf, request_id),
        Local::HelloOk(h) => message::put_hello_ok(w, buf, request_id, h),
        Local::Challenge(c) => message::put_challenge_ok(w, buf, request_id, &c.0, &c.1),
        Local::Error(status, text) => message::put_error(w, buf, request_id, *status, text),
        Local::Decide(m) => message::put_decide_ok(w, buf, request_id, m.verdicts(), m.priority),
        Local::Lease { renew, ok } => message::put_lease_ok(w, buf, request_id, *renew, ok),
        Local::Reload(n) => message::put_reload_ok(w, buf, request_id, *n),
        Local::Role(r) => replication::put_role_ok(w, buf, request_id, r),
        Local::Promote(epoch) => replication::put_promote_ok(w, buf, request_id, *epoch),
        Local::Failover(ok) => replication::put_failover_ok(w, buf, request_id, ok),
        Local::Cell(v) => message::put_cell_ok(w, buf, request_id, v),
        Local::Cluster(c) => message::put_cluster_ok(w, buf, request_id, c),
        Local::Stats {
            shard_count,
            shard_first,
            shards,
        } => {
            message::put_stats(w, buf, request_id, *shard_count, *shard_first, shards);
        }
    }
}
