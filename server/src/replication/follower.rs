//! A follower's side of replication.
//!
//! One coordinator task (on shard 0) connects to the primary, learns its
//! shard count P and epoch from HELLO_OK, clears every shard's table (a
//! new full sync follows), and starts P flows, flow `i` on this node's
//! shard `i % F`. Each flow binds a connection to primary shard `i`,
//! SUBSCRIBEs, and applies every record it reads on the shard that owns
//! the key *in this node's layout* (locally when that is its own shard,
//! else as an [`Apply`] message it waits on), then acks the last SYNC it
//! has fully applied: an ack means "applied", so a promotion right after it
//! loses nothing acknowledged. When any flow fails, the attempt ends
//! (every flow of it stops) and the coordinator starts again after
//! [`RECONNECT_MS`](super::RECONNECT_MS). Promotion ends following for good.
//!
//! What a flow decides (in sync, what to ack, a handover) is
//! [`FollowerFlow`]'s, in [`machine`]; the tasks here connect, read, apply
//! and write.

use std::rc::Rc;
use std::time::Duration;

use crate::inbox::{self, oneshot};
use crate::stream::Stream;
use bytes::BytesMut;
use sluice_protocol::auth;
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::message::{Hello, Reply, Request};
use sluice_protocol::replication::{put_ack, Record, ReplState, Subscribe, SyncReader};
use sluice_protocol::routing::shard_of;
use sluice_protocol::{Clock, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::Decoder;

use super::machine::{self, FollowerFlow, Refused};
use super::RECONNECT_MS;
use crate::mailbox::{Apply, Reset, ShardMsg, StartFlow, TokenRecord};
use crate::node::ShardCore;
use crate::shard::table::ForeignRecords;
use crate::sync::Ordering;

/// Parsed records at which a flow applies them before parsing the next
/// SYNC of the same read. A read holds up to 64 KiB of SYNCs (about 2,000
/// token-bucket records: an async primary's 1 ms drain under load), which
/// parsed whole before any was applied made a list of about 160 KiB; this
/// bounds it (no CPU saving was measurable: benches/notes.md). Each SYNC
/// is still parsed whole, checked, before any of its records is applied.
const APPLY_AT: usize = 256;

/// Why one attempt to follow failed.
#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error("cannot reach the primary: {0}")]
    Io(#[from] std::io::Error),
    #[error("the primary refused HELLO: {0}")]
    Refused(String),
    #[error("the primary's stream is corrupt: {0}")]
    Corrupt(String),
    #[error("not trusted, not followed: {0}")]
    Untrusted(String),
}

/// The coordinator: follows the primary until this node is promoted.
pub async fn follow(core: Rc<ShardCore>, primary: String) {
    let repl = &core.node.repl;
    if let Some(ms) = core.node.config.promote_after_ms {
        tokio::task::spawn_local(watchdog(core.clone(), ms));
    }
    loop {
        if repl.is_primary() {
            return;
        }
        let generation = repl.follow_gen.fetch_add(1, Ordering::AcqRel) + 1;
        match attempt(&core, &primary, generation).await {
            Ok(()) => {}
            Err(e) => tracing::warn!(primary = %primary, error = %e, "following failed"),
        }
        if repl.is_primary() {
            return;
        }
        repl.set_state(ReplState::Down);
        tokio::time::sleep(Duration::from_millis(RECONNECT_MS)).await;
    }
}

/// Promotes this follower once it has heard nothing from its primary for
/// `promote_after_ms`, if it was in sync. Its primary's lease (half of
/// that) has surely run out by then: it admits no more.
async fn watchdog(core: Rc<ShardCore>, promote_after_ms: u64) {
    let repl = &core.node.repl;
    let silence_max_ns = promote_after_ms * 1_000_000;
    let mut tick = tokio::time::interval(Duration::from_millis(super::WATCHDOG_MS));
    loop {
        tick.tick().await;
        if repl.is_primary() {
            return;
        }
        let promoted = repl
            .watch
            .promote_if_silent(core.clock.now_ns(), silence_max_ns, || {
                tracing::warn!(promote_after_ms, "primary silent: promoting");
                repl.promote(core.node.advertised()).is_ok()
            });
        if promoted {
            return;
        }
    }
}

/// Asks the node at `addr` for its role (a short connection of its own).
pub async fn query_role(
    core: &ShardCore,
    addr: &str,
) -> Result<sluice_protocol::replication::RoleOk, String> {
    let timeout = Duration::from_millis(super::PEER_CHECK_MS);
    let ask = async {
        let (mut stream, _, mut rbuf) =
            connect(core, addr, None).await.map_err(|e| e.to_string())?;
        let mut w = FrameWriter::new();
        let mut buf = BytesMut::new();
        Request::Role.encode(&mut w, &mut buf, 2);
        w.finish(&mut buf);
        send(&mut stream, &buf).await.map_err(|e| e.to_string())?;
        let mut decoder = FrameDecoder::new(core.node.config.frame_bytes_max);
        loop {
            if let Some(frame) = decoder.decode(&mut rbuf).map_err(|e| e.to_string())? {
                let reply = frame
                    .messages()
                    .next()
                    .and_then(|(h, p)| Reply::parse(h, p));
                return match reply {
                    Some(Reply::Role(r)) => Ok(*r),
                    other => Err(format!("no ROLE_OK: {other:?}")),
                };
            }
            if stream
                .read_buf(&mut rbuf)
                .await
                .map_err(|e| e.to_string())?
                == 0
            {
                return Err("closed".into());
            }
        }
    };
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| "no answer in time".to_string())?
}

/// A primary with `--peer`: looks at the peer's role before admitting
/// anything, then every [`PEER_CHECK_MS`](super::PEER_CHECK_MS); steps down
/// and follows the peer when it is a primary of a newer epoch.
pub async fn watch_peer(core: Rc<ShardCore>, peer: String) {
    let repl = &core.node.repl;
    let mut tick = tokio::time::interval(Duration::from_millis(super::PEER_CHECK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !repl.is_primary() {
            continue;
        }
        match query_role(&core, &peer).await {
            Ok(r) if r.role == sluice_protocol::replication::Role::Primary => {
                let own = core.node.advertised();
                let newer = r.epoch > repl.epoch() || (r.epoch == repl.epoch() && peer < own);
                if newer {
                    repl.step_down(&peer, r.epoch);
                    let primary = peer.clone();
                    tokio::task::spawn_local(follow(core.clone(), primary));
                    continue;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(peer = %peer, error = %e, "peer did not answer"),
        }
        if repl.probing.swap(0, Ordering::AcqRel) == 1 {
            tracing::info!(peer = %peer, "peer is not a newer primary: admitting");
        }
    }
}

/// One attempt: handshake, reset, start the flows, wait for one to end.
async fn attempt(core: &Rc<ShardCore>, primary: &str, generation: u64) -> Result<(), FollowError> {
    let (_stream, hello, _rbuf) = connect(core, primary, None).await?;
    let repl = &core.node.repl;
    // From here the table is rebuilt: no promoting ourselves until the new
    // full sync is complete.
    machine::start_attempt(repl, hello.epoch);
    tracing::info!(primary = %primary, primary_shards = hello.shard_count, epoch = hello.epoch, "following: full sync");
    let mut resets = Vec::new();
    for tx in &core.node.shards {
        let (done, rx) = oneshot();
        if tx
            .send(ShardMsg::Reset(Reset { generation, done }))
            .is_err()
        {
            return Ok(());
        }
        resets.push(rx);
    }
    for rx in resets {
        let _ = rx.recv().await;
    }
    let (ended_tx, mut ended_rx) = inbox::inbox();
    for i in 0..hello.shard_count {
        let start = StartFlow {
            generation,
            primary: primary.to_owned(),
            primary_shard: i,
            ended: ended_tx.clone(),
        };
        let owner = usize::from(i % core.node.shard_count);
        let _ = core.node.shards[owner].send(ShardMsg::Flow(start));
    }
    drop(ended_tx);
    // Any flow ending ends the attempt: the others stop at their next
    // message (the generation moves on).
    let _ = ended_rx.recv_many(&mut Vec::new()).await;
    repl.follow_gen
        .compare_exchange(
            generation,
            generation + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .ok();
    Ok(())
}

/// Connects and says HELLO (binding `shard` if given); returns the stream,
/// HELLO_OK and any bytes read past it. With a token, the node must first
/// prove it knows it (CHALLENGE), and the HELLO carries this node's proof,
/// never the token: a node at `primary` that does not know the token gets
/// nothing from us (PROTOCOL.md, "CHALLENGE").
async fn connect(
    core: &ShardCore,
    primary: &str,
    shard: Option<u16>,
) -> Result<(Stream, sluice_protocol::HelloOk, BytesMut), FollowError> {
    // A node that accepts and never answers must not hold the follower:
    // the handshake has what a client has to authenticate.
    let limit = Duration::from_millis(core.node.config.auth_timeout_ms);
    tokio::time::timeout(limit, handshake(core, primary, shard))
        .await
        .map_err(|_| {
            FollowError::Refused(format!(
                "{primary} did not finish the handshake within --auth-timeout-ms ({} ms)",
                limit.as_millis()
            ))
        })?
}

async fn handshake(
    core: &ShardCore,
    primary: &str,
    shard: Option<u16>,
) -> Result<(Stream, sluice_protocol::HelloOk, BytesMut), FollowError> {
    // TLS with --replica-tls-ca: the primary's certificate is checked
    // before anything of ours is sent.
    let mut stream = crate::stream::connect(primary, core.node.replica_tls.as_ref()).await?;
    let mut decoder = FrameDecoder::new(core.node.config.frame_bytes_max);
    let mut rbuf = BytesMut::with_capacity(4096);
    let mut w = FrameWriter::new();
    let mut buf = BytesMut::new();
    let token = core.node.config.auth_token.as_deref().unwrap_or_default();
    let proof;
    let hello_token = if token.is_empty() {
        &[][..]
    } else {
        let ours = crate::challenge::random_nonce()?;
        Request::Challenge { nonce: ours }.encode(&mut w, &mut buf, 1);
        w.finish(&mut buf);
        send(&mut stream, &buf).await?;
        buf.clear();
        let theirs = match read_reply(&mut stream, &mut decoder, &mut rbuf).await? {
            Reply::Challenge { nonce, proof }
                if auth::verify_node(token.as_bytes(), &ours, &nonce, &proof) =>
            {
                nonce
            }
            Reply::Challenge { .. } => {
                return Err(FollowError::Untrusted(format!(
                    "{primary} answered CHALLENGE with a wrong proof: it does not know the token"
                )))
            }
            Reply::Error { code, text } => {
                return Err(FollowError::Untrusted(format!(
                    "{primary} did not prove it knows the token: {text} ({code})"
                )))
            }
            other => {
                return Err(FollowError::Corrupt(format!(
                    "{primary} answered CHALLENGE with {other:?}"
                )))
            }
        };
        proof = auth::peer_proof(token.as_bytes(), &theirs, &ours);
        &proof[..]
    };
    let hello = Request::Hello(Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        shard,
        token: hello_token,
        // A primary older than what we know learns that it is stale.
        epoch: core.node.repl.epoch(),
        layout: 0,
    });
    hello.encode(&mut w, &mut buf, 2);
    w.finish(&mut buf);
    send(&mut stream, &buf).await?;
    match read_reply(&mut stream, &mut decoder, &mut rbuf).await? {
        Reply::HelloOk(ok) => {
            check_hello_ok(core, primary, &ok)?;
            Ok((stream, ok, rbuf))
        }
        Reply::Error { code, text } => Err(FollowError::Refused(format!("{text} ({code})"))),
        _ => Err(FollowError::Corrupt("no HELLO_OK".into())),
    }
}

/// Most shards a primary may claim: what a node may run.
const PRIMARY_SHARDS_MAX: u16 = crate::config::SHARDS_MAX;

/// What a follower accepts of a HELLO_OK: a shard count a node can have
/// (it opens one flow per shard) and an epoch that is credible.
fn check_hello_ok(
    core: &ShardCore,
    primary: &str,
    ok: &sluice_protocol::HelloOk,
) -> Result<(), FollowError> {
    if ok.shard_count == 0 || ok.shard_count > PRIMARY_SHARDS_MAX {
        return Err(FollowError::Untrusted(format!(
            "{primary} claims {} shards; a node has 1 to {PRIMARY_SHARDS_MAX}",
            ok.shard_count
        )));
    }
    if !core.node.repl.epoch_credible(ok.epoch) {
        core.node.repl.log_incredible_epoch(ok.epoch);
        return Err(FollowError::Untrusted(format!(
            "{primary} claims epoch {}, beyond this node's {} by more than 2^32",
            ok.epoch,
            core.node.repl.epoch()
        )));
    }
    Ok(())
}

/// Writes all of `buf` and flushes it (a TLS stream may otherwise hold
/// its last record).
async fn send(stream: &mut Stream, buf: &[u8]) -> std::io::Result<()> {
    stream.write_all(buf).await?;
    stream.flush().await
}

/// Reads the first message of the next frame as a reply.
async fn read_reply(
    stream: &mut Stream,
    decoder: &mut FrameDecoder,
    rbuf: &mut BytesMut,
) -> Result<Reply, FollowError> {
    loop {
        if let Some(frame) = decoder
            .decode(rbuf)
            .map_err(|e| FollowError::Corrupt(e.to_string()))?
        {
            let (h, p) = frame
                .messages()
                .next()
                .ok_or_else(|| FollowError::Corrupt("empty frame".into()))?;
            return Reply::parse(h, p).ok_or_else(|| {
                FollowError::Corrupt(format!("a reply of op {:#x} out of shape", h.op))
            });
        }
        if stream.read_buf(rbuf).await? == 0 {
            return Err(FollowError::Refused("closed during HELLO".into()));
        }
    }
}

/// Runs one flow on this shard until it fails or its attempt ends.
pub async fn run_flow(core: Rc<ShardCore>, start: StartFlow) {
    let shard = start.primary_shard;
    if let Err(e) = flow(&core, &start).await {
        if current(&core, start.generation) {
            tracing::warn!(primary_shard = shard, error = %e, "flow ended");
        }
    }
    let _ = start.ended.send(start.generation);
}

/// Whether `generation` is still the attempt in force (and we still
/// follow).
fn current(core: &ShardCore, generation: u64) -> bool {
    let repl = &core.node.repl;
    !repl.is_primary() && repl.follow_gen.load(Ordering::Acquire) == generation
}

async fn flow(core: &Rc<ShardCore>, start: &StartFlow) -> Result<(), FollowError> {
    let (mut stream, hello, mut rbuf) =
        connect(core, &start.primary, Some(start.primary_shard)).await?;
    let mut machine = FollowerFlow::new(u64::from(hello.shard_count));
    let mut w = FrameWriter::new();
    let mut wbuf = BytesMut::new();
    subscription(core, start).encode(&mut w, &mut wbuf, 2);
    w.finish(&mut wbuf);
    send(&mut stream, &wbuf).await?;
    wbuf.clear();
    let mut decoder = FrameDecoder::new(core.node.config.frame_bytes_max);
    let mut reader = SyncReader::new();
    let mut records = Vec::new();
    let mut buckets = Vec::new();
    loop {
        if !current(core, start.generation) {
            return Ok(());
        }
        while let Some(frame) = decoder
            .decode(&mut rbuf)
            .map_err(|e| FollowError::Corrupt(e.to_string()))?
        {
            for (h, p) in frame.messages() {
                if h.op == sluice_protocol::replication::op::SIZES {
                    let sizes = sluice_protocol::replication::parse_sizes(p)
                        .ok_or_else(|| FollowError::Corrupt("bad SIZES".into()))?;
                    reserve(core, start.generation, sizes);
                    continue;
                }
                if h.op != sluice_protocol::replication::op::SYNC {
                    let text = match Reply::parse(h, p) {
                        Some(Reply::Error { text, .. }) => text,
                        _ => format!("unexpected op {:#x}", h.op),
                    };
                    return Err(FollowError::Refused(text));
                }
                let sh = reader
                    .parse_buckets(p, |key, b| buckets.push((key, b)), |r| records.push(r))
                    .map_err(|e| FollowError::Corrupt(e.to_string()))?;
                let now_ns = core.clock.now_ns();
                machine
                    .on_sync(&core.node.repl, &sh, p.len(), now_ns)
                    .map_err(|Refused::Incredible(epoch)| {
                        FollowError::Untrusted(format!(
                            "a SYNC at epoch {epoch}, beyond this node's {} by more than 2^32",
                            core.node.repl.epoch()
                        ))
                    })?;
                if records.len() + buckets.len() >= APPLY_AT {
                    if !current(core, start.generation) {
                        return Ok(());
                    }
                    apply(core, start.generation, &mut records, &mut buckets).await;
                }
            }
        }
        if !records.is_empty() || !buckets.is_empty() {
            if !current(core, start.generation) {
                return Ok(());
            }
            apply(core, start.generation, &mut records, &mut buckets).await;
        }
        let now_ns = core.clock.now_ns();
        let Some(applied) =
            machine.applied(&core.node.repl, now_ns, || current(core, start.generation))
        else {
            return Ok(());
        };
        if let Some(seq) = applied.ack {
            put_ack(&mut w, &mut wbuf, seq);
            w.finish(&mut wbuf);
            send(&mut stream, &wbuf).await?;
            wbuf.clear();
        }
        if let Some(epoch) = applied.take_over {
            // Planned handover: everything before it is applied.
            let repl = &core.node.repl;
            match repl.promote_to(core.node.advertised(), epoch) {
                Ok(epoch) => tracing::warn!(epoch, "planned failover: now primary"),
                Err(e) => tracing::warn!(error = %e, "planned failover refused"),
            }
            return Ok(());
        }
        rbuf.reserve(64 << 10);
        if stream.read_buf(&mut rbuf).await? == 0 {
            return Err(FollowError::Refused("the primary closed the flow".into()));
        }
    }
}

/// What this follower asks of the primary's shard for one flow.
fn subscription(core: &ShardCore, start: &StartFlow) -> Subscribe {
    let promote_after_ms = core.node.config.promote_after_ms.unwrap_or(0);
    Subscribe {
        node_id: core.node.node_id,
        epoch: core.node.repl.epoch(),
        shard: start.primary_shard,
        promote_after_ms: u32::try_from(promote_after_ms).unwrap_or(u32::MAX),
        addr: core.node.advertised(),
    }
}

/// Sizes every shard of this node for one primary shard's full sync: its
/// buckets spread evenly over this node's shards (by hash).
fn reserve(core: &ShardCore, generation: u64, sizes: [u64; 5]) {
    let count = u64::from(core.node.shard_count);
    // No more than a shard may hold (--keys-max), whatever the primary
    // claims: SIZES is a hint, the records are what count.
    let cap = core.node.config.keys_max as u64;
    let share = sizes.map(|n| n.div_ceil(count).min(cap));
    for (i, tx) in core.node.shards.iter().enumerate() {
        if i == usize::from(core.id) {
            core.table.borrow_mut().reserve(share);
        } else {
            let _ = tx.send(ShardMsg::Reserve(generation, share));
        }
    }
}

/// Applies records on their owners (this shard directly), and returns
/// once every owner has applied its part; both lists are left empty, their
/// room kept for the next batch. Each kind's records keep their order
/// (the two lists hold different kinds, and every kind has its own table).
async fn apply(
    core: &ShardCore,
    generation: u64,
    records: &mut Vec<Record>,
    buckets: &mut Vec<TokenRecord>,
) {
    let count = core.node.shard_count;
    let now_ns = core.clock.now_ns();
    let mut others: Vec<ForeignRecords> = (0..count).map(|_| (Vec::new(), Vec::new())).collect();
    let owner = |key| {
        let owner = shard_of(key, count);
        (owner != core.id).then_some(usize::from(owner))
    };
    core.table
        .borrow_mut()
        .apply_records(records, buckets, now_ns, owner, &mut others);
    let mut waits = Vec::new();
    for (owner, (records, buckets)) in others.into_iter().enumerate() {
        if records.is_empty() && buckets.is_empty() {
            continue;
        }
        let (done, rx) = oneshot();
        let msg = ShardMsg::Apply(Apply {
            generation,
            records,
            buckets,
            done,
        });
        if core.node.shards[owner].send(msg).is_ok() {
            waits.push(rx);
        }
    }
    for rx in waits {
        let _ = rx.recv().await;
    }
}
