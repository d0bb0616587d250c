//! One RESP connection, served on the shard thread it was handed to. Like
//! protocol v1's [`connection`](crate::connection), the task is a
//! *coordinator*: it parses every command in what it read, answers those it
//! can on the spot (CL.THROTTLE on a key this shard owns is decided inline,
//! on this shard's table), forwards CL.THROTTLEs for other shards' keys in
//! one batch per shard per read, and writes every reply in command order,
//! as many as are ready in one write. The read-decide-write loop is the
//! shared `coordinator::run` (this module is RESP's `coordinator::Handler`
//! for it); ordering and forwarding are the shared [`Pipeline`]'s.
//!
//! Limits: a command longer than `frame_bytes_max` or one that does not
//! parse is answered `-ERR Protocol error: ...` and ends the connection
//! once earlier replies are written (the stream can't be trusted; other
//! connections are untouched), after a short linger so the client reads
//! the error (`coordinator::ERROR_LINGER_MS`); with `inflight_max`
//! commands unanswered the task stops reading until replies drain. QUIT
//! answers `+OK` and closes; at shutdown (Drain) the task stops reading,
//! finishes what is in flight and closes.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::rc::Rc;

use crate::stream::Stream;
use bytes::{Buf, BytesMut};
use sluice_protocol::cell::CellPolicy;
use sluice_protocol::routing::{key_hash, shard_of};
use sluice_protocol::{Clock, Status};

use super::command::{self, Command, CommandProbe, Field, Reply};
use super::parser::{Args, Parser};
use crate::coordinator::{self, constant_time_eq, Handler, ReplyShare, READ_CHUNK_BYTES};
use crate::forward::{CellByHash, RemoteOp};
use crate::mailbox::AdoptResp;
use crate::node::ShardCore;
use crate::pipeline::{Pipeline, Protocol};
use crate::shard::{BatchReply, ConnectionGuard, Op, Outcome};

/// The RESP protocol's use of the [`Pipeline`]: a forwarded command is
/// always a CL.THROTTLE, and RESP replies are positional, so a waiting
/// slot needs to remember nothing.
#[derive(Debug)]
struct Resp;

impl Protocol for Resp {
    type Tag = ();
    type Reply = Reply;

    // Inlined into the pass that files a forwarded batch's answers: the
    // owner's verdict goes into the RESP reply with no 72-byte outcome
    // passed between (benches/notes.md, stop 59). `always`: with `inline`
    // alone the compiler stopped inlining it after unrelated changes (a
    // call of 24 instructions an op, stop 60).
    #[inline(always)]
    fn answered((): (), outcome: Outcome) -> Reply {
        match outcome {
            Outcome::Cell(verdict) => Reply::Cell(verdict),
            Outcome::Refused(status) => Reply::err(status.text()),
            Outcome::Failed(status, text) => Reply::Error(resp_error(status, &text)),
            _ => unreachable!("the RESP connection forwards only CL.THROTTLE"),
        }
    }

    fn refused((): ()) -> Reply {
        Reply::err(Status::ShuttingDown.text())
    }

    fn weight(reply: &Reply) -> usize {
        reply.weight()
    }

    /// A verdict's reply owns nothing: forgotten (its drop was a call an
    /// answer on a forwarding node, benches/notes.md, stop 61).
    #[inline(always)]
    fn encoded(reply: Reply) {
        if matches!(reply, Reply::Cell(_)) {
            std::mem::forget(reply);
        } else {
            drop(reply);
        }
    }
}

/// What the command handlers work on: everything but the socket and the
/// bytes being parsed (the [`coordinator`]'s), and the parser (which the
/// parsed arguments borrow).
#[derive(Debug)]
struct Session {
    /// The shard this task runs on.
    core: Rc<ShardCore>,
    /// Encoded replies not yet written.
    wbuf: BytesMut,
    /// Replies in command order, and CL.THROTTLEs out at other shards.
    pipe: Pipeline<Resp>,
    /// Whether AUTH succeeded (or no token is configured).
    authed: bool,
    /// The RESP version replies use: 2 until `HELLO 3`.
    proto: u8,
    /// CLIENT SETNAME's (or HELLO SETNAME's) name.
    name: Option<Vec<u8>>,
    /// CLIENT ID: unique in the process.
    id: u64,
    /// Stop reading; close once every pending reply is written.
    closing: bool,
    /// The input did not parse: linger on close (see
    /// [`ERROR_LINGER_MS`](crate::coordinator::ERROR_LINGER_MS)).
    bad_input: bool,
    /// Keeps the node's connection count while the connection lives.
    guard: ConnectionGuard,
    /// Its part of the shard's reply bytes owed.
    share: ReplyShare,
    /// The client's address, for the failed-authentication budget.
    peer: Option<std::net::IpAddr>,
}

/// The state of one RESP connection task, but for the socket and the bytes
/// read and not yet parsed (the [`coordinator`]'s).
#[derive(Debug)]
struct RespConnection {
    /// Splits the read bytes into commands, enforcing `frame_bytes_max`.
    parser: Parser,
    /// No command yet: the first bytes tell a client of the binary
    /// protocol that came to the wrong port.
    fresh: bool,
    /// The node's command size limit, which applies once authenticated
    /// (before, [`PRE_AUTH_FRAME_BYTES_MAX`](crate::connection::PRE_AUTH_FRAME_BYTES_MAX)).
    command_bytes_max: usize,
    /// Whole commands wait in the read buffer, not parsed: the connection
    /// owes `reply_bytes_max` or has `inflight_max` commands unanswered.
    backlog: bool,
    /// CL.THROTTLEs parsed but not yet decided (at most [`AHEAD_MAX`]).
    ahead: Vec<Ahead>,
    /// With `--cluster`: the keys of `ahead` another node decides, one
    /// after the other; each forwarded op's key is a slice of it (no
    /// allocation per key, and none freed on the forwarder's thread).
    keys: BytesMut,
    /// The rest.
    session: Session,
}

/// CL.THROTTLEs an authenticated connection parses before it decides the
/// first of them. Each owned key's slot is prefetched when it is parsed,
/// so its load overlaps the parse of the commands after it: at 100k keys
/// that load was a fifth of the shard's time (perf, redis-benchmark c50
/// P64), and a look-ahead that parsed every command twice to the same end
/// gained nothing (benches/notes.md). 16 commands of parse cover a miss.
const AHEAD_MAX: usize = 16;

/// Bytes at least of each buffer that forwarded keys are gathered in: one
/// allocation for many keys (a buffer lives until its last key's call is
/// answered).
const KEYS_CHUNK_BYTES: usize = 4096;

/// A CL.THROTTLE parsed ahead of its decision.
#[derive(Clone, Debug)]
struct Ahead {
    /// With `--cluster`, for a key this node does not decide: the key, for
    /// the forwarder (none when its group takes the key's hash), and its
    /// group (a ring index of the read's view).
    remote: Option<(Option<std::ops::Range<usize>>, usize)>,
    /// Its offset in the read buffer: where parsing resumes if the
    /// connection's reply bound stops it before its decision.
    at: usize,
    /// Its key's hash.
    key: u128,
    /// The limit.
    policy: CellPolicy,
    /// Units to spend.
    quantity: u64,
}

impl Ahead {
    /// CL.THROTTLE `t`, at offset `at` of the read buffer. With `route`
    /// (`--cluster`: the layout, and whether this node decides its own
    /// keys), a key this node does not decide is kept for the forwarder;
    /// one this shard decides has its bucket prefetched.
    fn new(
        t: &sluice_protocol::cell::CellRequest<'_>,
        at: usize,
        route: Option<&(std::sync::Arc<crate::forward::View>, bool)>,
        core: &ShardCore,
        keys: &mut BytesMut,
    ) -> Ahead {
        let key = key_hash(t.key);
        // (group, decided here, its owner takes the key's hash in place of
        // the key)
        let group = route.map(|(view, decides_own)| {
            let group = view.group_of(key);
            let own = *decides_own && view.is_own(group);
            (group, own, !own && view.takes_cells_by_hash(group))
        });
        let remote = match group {
            // The key is not kept then: no copy, no slice of the keys'
            // buffer.
            Some((group, false, true)) => Some((None, group)),
            Some((group, false, false)) => {
                if keys.capacity() - keys.len() < t.key.len() {
                    keys.reserve(KEYS_CHUNK_BYTES.max(t.key.len()));
                }
                let start = keys.len();
                keys.extend_from_slice(t.key);
                Some((Some(start..keys.len()), group))
            }
            _ => None,
        };
        if remote.is_none() && shard_of(key, core.node.shard_count) == core.id {
            core.table.borrow().prefetch(key);
        }
        Ahead {
            remote,
            at,
            key,
            policy: t.policy,
            quantity: t.quantity,
        }
    }
}

/// A forwarded CL.THROTTLE's failure in Redis's words: `TRYAGAIN` when
/// the owner group could not answer (Redis Cluster's word for "not now,
/// nothing done"), `CLUSTERDOWN`-like text for an unknown outcome, the
/// owner's text otherwise.
fn resp_error(status: Status, text: &str) -> String {
    match status {
        Status::GroupUnavailable => format!("TRYAGAIN {text}"),
        Status::OutcomeUnknown => format!("TRYAGAIN {text} (do not resend a spend blindly)"),
        Status::NotPrimary => format!("READONLY {text}"),
        Status::LayoutMismatch | Status::WrongGroup => format!("CLUSTERDOWN {text}"),
        _ => format!("ERR {text}"),
    }
}

/// What a client of the binary protocol hears on the RESP port.
pub const BINARY_ON_RESP_PORT: &str = "this is sluiced's RESP port (--resp-port): sluice and the sluice-client crate speak the binary protocol, on sluiced's --port (default 7700)";

/// Whether a command's first byte may be this: an array (`*`) or an inline
/// command (printable text).
fn may_start_resp(b: u8) -> bool {
    b == b'*' || b.is_ascii_graphic() || b.is_ascii_whitespace()
}

/// The Redis version HELLO names: the one whose commands and replies the
/// listener follows (clients pick features by it).
const REDIS_VERSION: &str = "7.2.0";

/// The next CLIENT ID.
static NEXT_CLIENT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Serves one RESP connection until it closes.
pub async fn run(core: Rc<ShardCore>, adopt: AdoptResp) {
    let AdoptResp { stream, guard } = adopt;
    let command_bytes_max = usize::try_from(core.node.config.frame_bytes_max).unwrap_or(usize::MAX);
    let authed = core.node.config.auth_token.is_none();
    let pre_auth =
        usize::try_from(crate::connection::PRE_AUTH_FRAME_BYTES_MAX).unwrap_or(usize::MAX);
    let conn = RespConnection {
        parser: Parser::new(if authed {
            command_bytes_max
        } else {
            pre_auth.min(command_bytes_max)
        }),
        command_bytes_max,
        backlog: false,
        ahead: Vec::with_capacity(AHEAD_MAX),
        keys: BytesMut::new(),
        fresh: true,
        session: Session {
            core: core.clone(),
            wbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            pipe: Pipeline::new(core.node.shard_count),
            authed,
            proto: 2,
            name: None,
            id: NEXT_CLIENT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            closing: false,
            bad_input: false,
            peer: stream.peer_addr().ok().map(|a| a.ip()),
            guard,
            share: ReplyShare::new(core.clone()),
        },
    };
    coordinator::run(
        crate::stream::Moving::Plain(stream),
        BytesMut::with_capacity(READ_CHUNK_BYTES),
        conn,
    )
    .await;
}

impl RespConnection {
    /// A fresh connection whose first byte cannot start RESP is a Sluice
    /// frame (its length's low byte): `sluice` or the client crate pointed
    /// at this port. It is told so in RESP, which the client recognises,
    /// then closed.
    fn refuse_a_sluice_frame(&mut self, rbuf: &BytesMut) {
        if self.fresh && rbuf.first().is_some_and(|&b| !may_start_resp(b)) {
            self.session.reply(Reply::err(BINARY_ON_RESP_PORT));
            self.session.closing = true;
            self.session.bad_input = true;
        }
    }
}

impl Handler for RespConnection {
    type Protocol = Resp;
    /// A RESP connection never moves on.
    type Handoff = Infallible;
    const NAME: &'static str = "RESP connection";

    fn core(&self) -> &Rc<ShardCore> {
        &self.session.core
    }

    fn pipe(&mut self) -> &mut Pipeline<Resp> {
        &mut self.session.pipe
    }

    fn closing(&self) -> bool {
        self.session.closing
    }

    fn authed(&self) -> bool {
        self.session.authed
    }

    fn eviction(&self) -> Option<std::sync::Arc<crate::signal::Signal>> {
        self.session.guard.eviction()
    }

    fn close(&mut self) {
        self.session.closing = true;
    }

    /// Parses and carries out every whole command in `rbuf`, then sends the
    /// forwarded batches they produced.
    fn handle_read(&mut self, rbuf: &mut BytesMut) {
        let mut at = 0;
        // The clock is read once per read, and only if a decision needs it.
        let mut now_ns = None;
        self.refuse_a_sluice_frame(rbuf);
        let (reply_max, inflight_max) = {
            let config = &self.session.core.node.config;
            (config.reply_bytes_max, config.inflight_max)
        };
        self.backlog = false;
        // With --cluster: which keys this node decides (a follower: none).
        let route = self.session.core.node.forward.as_ref().map(|f| {
            let primary = self.session.core.node.repl.is_primary();
            (f.view(), primary)
        });
        loop {
            let parsed = if self.session.closing {
                Ok(None)
            } else if self.session.owes_too_much(reply_max, inflight_max) {
                // The rest waits in `rbuf` until the replies are written.
                self.backlog = true;
                Ok(None)
            } else {
                self.parser.parse(&rbuf[at..])
            };
            let step = parsed.map(|whole| {
                whole.map(|n| {
                    self.fresh = false;
                    (n, command::parse(&self.parser.args(&rbuf[at..])))
                })
            });
            let queued = match &step {
                Ok(Some((n, Ok(Some(Command::Throttle(t)))))) if self.session.authed => {
                    self.ahead.push(Ahead::new(
                        t,
                        at,
                        route.as_ref(),
                        &self.session.core,
                        &mut self.keys,
                    ));
                    at += n;
                    true
                }
                _ => false,
            };
            if queued && self.ahead.len() < AHEAD_MAX {
                continue;
            }
            // Anything else goes after the CL.THROTTLEs before it.
            if let Some(stop) = self.session.decide_ahead(
                &mut self.ahead,
                &mut self.keys,
                route.as_ref().map(|(view, _)| view),
                reply_max,
                inflight_max,
                &mut now_ns,
            ) {
                // Back to a command boundary: whatever the parser had of a
                // partial command after it belongs to another offset.
                at = stop;
                self.parser.restart();
                self.backlog = true;
                break;
            }
            match step {
                _ if queued => {}
                Ok(Some((n, parsed))) => {
                    if self.session.owes_too_much(reply_max, inflight_max) {
                        self.backlog = true;
                        break;
                    }
                    let was_authed = self.session.authed;
                    self.session.execute(parsed, &mut now_ns);
                    if self.session.authed && !was_authed {
                        self.parser.set_command_bytes_max(self.command_bytes_max);
                    }
                    at += n;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(shard = self.session.core.id, error = %e, "closing a RESP connection on bad input");
                    self.session.reply(Reply::err(e));
                    self.session.closing = true;
                    self.session.bad_input = true;
                }
            }
        }
        rbuf.advance(at);
        let s = &mut self.session;
        let proto = s.proto;
        s.pipe
            .send_forwards(&s.core.node, |r| command::encode(&mut s.wbuf, r, proto));
    }

    fn fill(&mut self, reply: BatchReply) {
        let s = &mut self.session;
        let proto = s.proto;
        s.pipe
            .fill(reply, |r| command::encode(&mut s.wbuf, r, proto));
    }

    fn output(&mut self) -> &mut BytesMut {
        &mut self.session.wbuf
    }

    fn backlog(&self) -> bool {
        self.backlog
    }

    fn settle_replies(&mut self) {
        let s = &mut self.session;
        s.share.settle(s.wbuf.len() + s.pipe.held_bytes());
    }

    fn linger_on_close(&self) -> bool {
        self.session.bad_input
    }

    async fn hand_off(self, _: Stream, _: BytesMut, handoff: Infallible) {
        match handoff {}
    }
}

impl Session {
    /// Whether the connection owes `reply_max` bytes or has `inflight_max`
    /// commands unanswered: then no further command is carried out.
    fn owes_too_much(&self, reply_max: usize, inflight_max: usize) -> bool {
        self.share
            .full(self.wbuf.len() + self.pipe.held_bytes(), reply_max)
            || self.pipe.len() >= inflight_max
    }

    /// Decides the CL.THROTTLEs parsed ahead, in order, and empties
    /// `ahead`. Where the connection's bounds stop it first, returns the
    /// offset of the first one left undecided (parsing resumes there).
    fn decide_ahead(
        &mut self,
        ahead: &mut Vec<Ahead>,
        keys: &mut BytesMut,
        view: Option<&std::sync::Arc<crate::forward::View>>,
        reply_max: usize,
        inflight_max: usize,
        now_ns: &mut Option<u64>,
    ) -> Option<usize> {
        let mut stop = None;
        // The forwarded keys gathered so far, shared by their ops.
        let keys = (!keys.is_empty()).then(|| keys.split().freeze());
        for a in ahead.iter_mut() {
            if self.owes_too_much(reply_max, inflight_max) {
                stop = Some(a.at);
                break;
            }
            if let Some((range, group)) = a.remote.take() {
                let view = view.expect("a remote key was routed by a view");
                let forward = self.core.node.forward.as_ref();
                let forward = forward.expect("a remote key was routed by a view");
                match range {
                    Some(range) => {
                        let op = RemoteOp::Cell {
                            key: keys.as_ref().expect("gathered when parsed").slice(range),
                            policy: a.policy,
                            quantity: a.quantity,
                        };
                        self.pipe.forward_remote((), op, (view, group), forward);
                    }
                    None => {
                        let cell = CellByHash {
                            hash: RemoteOp::hash_halves(a.key),
                            policy: a.policy,
                            quantity: a.quantity,
                        };
                        self.pipe.forward_remote((), cell, (view, group), forward);
                    }
                }
                continue;
            }
            self.throttle(a.key, &a.policy, a.quantity, now_ns);
        }
        ahead.clear();
        stop
    }

    /// CL.THROTTLE on the key whose hash is `key`: decided here if this
    /// shard owns it, forwarded otherwise; refused on a follower.
    fn throttle(
        &mut self,
        key: u128,
        policy: &CellPolicy,
        quantity: u64,
        now_ns: &mut Option<u64>,
    ) {
        let now = *now_ns.get_or_insert_with(|| self.core.clock.now_ns());
        if !self.core.admits(now) {
            // Redis's own words for a write sent to a replica, then ours.
            let text = format!(
                "READONLY You can't write against a read only replica. {}",
                self.core.node.repl.not_primary_text()
            );
            return self.reply(Reply::Error(text));
        }
        let shard = shard_of(key, self.core.node.shard_count);
        if shard == self.core.id {
            let verdict = self
                .core
                .table
                .borrow_mut()
                .cell_throttle(key, policy, quantity, now);
            match verdict {
                Ok(v) => self.reply(Reply::Cell(v)),
                Err(status) => self.reply(Reply::err(status.text())),
            }
        } else {
            let op = Op::Cell {
                policy: *policy,
                quantity,
            };
            self.pipe.forward(shard, (), key, op);
        }
    }

    /// Queues `reply` behind every earlier one (or encodes it right away).
    fn reply(&mut self, reply: Reply) {
        if let Some(r) = self.pipe.ready(reply) {
            command::encode(&mut self.wbuf, &r, self.proto);
        }
    }

    /// Carries out one command, as [`command::parse`] left it.
    fn execute(&mut self, parsed: Result<Option<Command<'_>>, Reply>, now_ns: &mut Option<u64>) {
        let command = match parsed {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(reply) => {
                // Before authentication, one try: then closed.
                self.closing |= !self.authed;
                return self.reply(reply);
            }
        };
        if !self.authed && command.needs_auth() {
            // Before authentication: AUTH, HELLO and QUIT only.
            self.closing = true;
            return self.reply(Reply::no_auth());
        }
        match command {
            Command::Throttle(t) => {
                self.throttle(key_hash(t.key), &t.policy, t.quantity, now_ns);
            }
            Command::Ping(None) => self.reply(Reply::Simple("PONG")),
            Command::Ping(Some(message)) | Command::Echo(message) => {
                self.reply(Reply::Bulk(message.to_vec()))
            }
            Command::Quit => {
                self.reply(Reply::Simple("OK"));
                self.closing = true;
            }
            Command::Info(args) => {
                let text = self.info(&args);
                self.reply(Reply::Bulk(text.into_bytes()));
            }
            Command::Auth { user, token } => self.auth(user, token),
            Command::Role => {
                let now = *now_ns.get_or_insert_with(|| self.core.clock.now_ns());
                let role = self.core.node.repl.role_ok(now);
                self.reply(Reply::Raw(super::role::role_reply(&role)));
            }
            Command::ConfigGet(args) => self.config_get(&args),
            Command::Hello { proto, auth, name } => self.hello(proto, auth, name),
            Command::Select | Command::SetInfo => self.reply(Reply::Simple("OK")),
            Command::SetName(name) => {
                self.name = (!name.is_empty()).then(|| name.to_vec());
                self.reply(Reply::Simple("OK"));
            }
            Command::GetName => {
                let reply = self.name.clone().map_or(Reply::Null, Reply::Bulk);
                self.reply(reply);
            }
            Command::ClientId => self.reply(Reply::Int(i64::try_from(self.id).unwrap_or(i64::MAX))),
            Command::CommandProbe(probe) => self.reply(match probe {
                CommandProbe::List => Reply::Array(Vec::new()),
                CommandProbe::Docs => Reply::Map(Vec::new()),
                CommandProbe::Count => Reply::Int(0),
            }),
        }
    }

    /// HELLO as Redis answers it: authenticates with AUTH, names the
    /// connection with SETNAME, switches the protocol, and answers with
    /// the connection's facts (in the protocol it switched to).
    fn hello(&mut self, proto: Option<u8>, auth: Option<(&[u8], &[u8])>, name: Option<&[u8]>) {
        if let Some((user, token)) = auth {
            let ok = match &self.core.node.config.auth_token {
                None => user == b"default",
                Some(_) if self.auth_blocked() => false,
                Some(expected) => {
                    let ok = user == b"default" && constant_time_eq(expected.as_bytes(), token);
                    if !ok {
                        self.auth_failed();
                    }
                    ok
                }
            };
            if !ok {
                // No second guess on this connection.
                self.closing = true;
                return self.reply(Reply::wrong_pass());
            }
            self.authed = true;
            self.guard.authenticated();
        }
        if !self.authed {
            self.closing = true;
            return self.reply(Reply::Error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                 HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                 select the RESP protocol version at the same time"
                    .to_owned(),
            ));
        }
        if let Some(n) = name {
            self.name = (!n.is_empty()).then(|| n.to_vec());
        }
        if let Some(p) = proto {
            self.proto = p;
        }
        let role = if self.core.node.repl.is_primary() {
            "master"
        } else {
            "replica"
        };
        self.reply(Reply::Map(vec![
            ("server", Field::Bulk(b"redis".to_vec())),
            ("version", Field::Bulk(REDIS_VERSION.as_bytes().to_vec())),
            ("proto", Field::Int(i64::from(self.proto))),
            ("id", Field::Int(i64::try_from(self.id).unwrap_or(i64::MAX))),
            ("mode", Field::Bulk(b"standalone".to_vec())),
            ("role", Field::Bulk(role.as_bytes().to_vec())),
            ("modules", Field::Empty),
        ]));
    }

    /// AUTH as Redis answers it for its `default` user.
    fn auth(&mut self, user: Option<&[u8]>, token: &[u8]) {
        let reply = match (&self.core.node.config.auth_token, user) {
            (None, None) => Reply::err(
                "AUTH <password> called without any password configured for the default user. \
                 Are you sure your configuration is correct?",
            ),
            (None, Some(b"default")) => Reply::Simple("OK"),
            (Some(_), _) if self.auth_blocked() => {
                self.closing = true;
                Reply::wrong_pass()
            }
            (Some(expected), None | Some(b"default"))
                if constant_time_eq(expected.as_bytes(), token) =>
            {
                self.authed = true;
                self.guard.authenticated();
                Reply::Simple("OK")
            }
            _ => {
                self.auth_failed();
                // No second guess on this connection.
                self.closing = true;
                Reply::wrong_pass()
            }
        };
        self.reply(reply);
    }

    /// Whether this client's address is blocked for failed
    /// authentications (the attempt then counts as one, its token unread).
    fn auth_blocked(&self) -> bool {
        let now = std::time::Instant::now();
        self.peer
            .is_some_and(|ip| self.core.node.auth_failures.blocked(ip, now).is_some())
    }

    /// Records a wrong token from this client's address.
    fn auth_failed(&self) {
        if let Some(ip) = self.peer {
            self.core
                .node
                .auth_failures
                .failed(ip, std::time::Instant::now());
        }
    }

    /// INFO: a few facts per section, Redis's `field:value` lines. Asked
    /// for sections (case-insensitive) or all of them.
    fn info(&self, args: &Args<'_>) -> String {
        let node = &self.core.node;
        let want = |section: &str| {
            args.len() <= 1
                || args.iter().skip(1).any(|a| {
                    [section, "all", "everything", "default"]
                        .iter()
                        .any(|n| a.eq_ignore_ascii_case(n.as_bytes()))
                })
        };
        let mut out = String::new();
        if want("server") {
            let resp_port = node.resp_addr.map_or(0, |a| a.port());
            let _ = write!(
                out,
                "# Server\r\nsluice_version:{}\r\nredis_mode:standalone\r\nprocess_id:{}\r\n\
                 tcp_port:{}\r\nresp_port:{resp_port}\r\nuptime_in_seconds:{}\r\nshards:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                std::process::id(),
                node.addr.port(),
                node.started.elapsed().as_secs(),
                node.shard_count,
            );
        }
        if want("clients") {
            let _ = write!(
                out,
                "{}# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n",
                if out.is_empty() { "" } else { "\r\n" },
                self.guard.open_count(),
                node.config.connections_max,
            );
        }
        if want("replication") {
            let role = node.repl.role_ok(self.core.clock.now_ns());
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            out.push_str(&super::role::info_replication(&role));
        }
        if want("shard") {
            let _ = write!(
                out,
                "{}# Shard\r\nshard_id:{}\r\nshard_buckets:{}\r\nshard_connections:{}\r\n",
                if out.is_empty() { "" } else { "\r\n" },
                self.core.id,
                self.core.table.borrow().len(),
                self.core.connections.get(),
            );
        }
        out
    }

    /// CONFIG GET for the settings Redis tools ask about (`redis-benchmark`
    /// reads `save` and `appendonly` at start); others are an empty answer,
    /// as Redis gives for an unknown name.
    fn config_get(&mut self, args: &Args<'_>) {
        let connections_max = self.core.node.config.connections_max.to_string();
        let known: [(&str, &str); 3] = [
            ("save", ""),
            ("appendonly", "no"),
            ("maxclients", &connections_max),
        ];
        let mut items = Vec::new();
        for (name, value) in known {
            let asked = args
                .iter()
                .skip(2)
                .any(|a| a == b"*" || a.eq_ignore_ascii_case(name.as_bytes()));
            if asked {
                items.push(name.as_bytes().to_vec());
                items.push(value.as_bytes().to_vec());
            }
        }
        self.reply(Reply::Array(items));
    }
}
