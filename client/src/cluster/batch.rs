//! Many decisions at once ([`Cluster::batch`]): what a node that is an
//! entry point forwards, a read's worth of other groups' requests at a
//! time.
//!
//! A batch costs per group what one call costs: the ops of a group go to
//! its primary as one message per shard connection (so one frame), wait
//! under one deadline (and one stall timer), and their replies are
//! gathered in place; no channel, timer, task or future per op. The rules
//! are the single call's ([`Cluster::decide`], the module doc), applied
//! per op: an op the primary surely did not apply (no connection,
//! NOT_PRIMARY, SHUTTING_DOWN) is sent once more, after one search, to the
//! primary found; a spend that was sent and got no answer is
//! outcome-unknown and never resent; a group that cannot answer gets the
//! failure policy's answer, op by op.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use sluice_protocol::cell::CellVerdict;
use sluice_protocol::message::{DecideOk, LeaseOk, LimitSet, Limits, Mode, Reply};
use sluice_protocol::{Limit, Priority, Verdict};

use super::{forget, not_applied, unavailable, Cluster, FailurePolicy, Group, Source};
use crate::client::unexpected;
use crate::connection::{Batch, BatchOp, CellByHash, MakeAnswer, Op, Sink, Taken};
use crate::{Client, Error};

/// An op's answer ([`Cluster::batch`]), by the op's kind.
#[derive(Debug)]
pub enum Answer {
    /// THROTTLE or PEEK.
    Verdict(Source, Verdict),
    /// DECIDE.
    Decide(Source, DecideOk),
    /// CELL.
    Cell(Source, CellVerdict),
    /// RELEASE or RENEW.
    Lease(LeaseOk),
}

/// An op's answer, or why it has none.
pub type Answered = Result<Answer, Error>;

impl Cluster {
    /// Decides every op of `ops` through its key's group, the answers in
    /// `ops`'s order; `failure` answers the ops of a group that cannot.
    /// Groups are asked at once.
    pub async fn batch(&self, ops: Vec<Op>, failure: FailurePolicy) -> Vec<Answered> {
        self.batch_routed(ops, None, failure).await
    }

    /// [`Cluster::batch`] with each op's group already looked up: `route`
    /// is `(generation, groups)`, `groups[i]` the ring index of `ops[i]`'s
    /// key in this client's layout of [`Cluster::generation`]
    /// `generation`. Under another layout (a reload came between) the
    /// groups are looked up again, so a stale route never misroutes. An
    /// entry point, which looked the groups up to tell its own keys from
    /// others', passes them on.
    pub async fn batch_routed(
        &self,
        ops: Vec<Op>,
        route: Option<(u64, &[usize])>,
        failure: FailurePolicy,
    ) -> Vec<Answered> {
        self.batch_routed_with(ops, route, failure, std::convert::identity)
            .await
    }

    /// [`Cluster::batch_routed`], each answer passed through `f` as it is
    /// made (an op's as its reply is read): a caller that turns answers
    /// into its own type does it in the same pass, with no vector of
    /// [`Answered`] between.
    pub async fn batch_routed_with<T, F>(
        &self,
        ops: Vec<Op>,
        route: Option<(u64, &[usize])>,
        failure: FailurePolicy,
        f: F,
    ) -> Vec<T>
    where
        T: Send + 'static,
        F: Fn(Answered) -> T + Clone + Send + Sync + 'static,
    {
        let n = ops.len();
        self.count_calls(n);
        let layout = self.layout();
        let known = match route {
            Some((generation, groups)) if generation == layout.generation && groups.len() == n => {
                Some(groups)
            }
            _ => None,
        };
        let group_of = |i: usize, op: &Op| match known {
            Some(groups) => groups[i],
            None => layout.ring.group_of(op.route_hash()),
        };
        if let Some(g) = known.and_then(one_group) {
            if ops.iter().all(valid) {
                // An entry point's batch, routed to one group and every op
                // valid (the common case): straight to the group, with no
                // per-op bookkeeping (the general path's cost an op more).
                let group = layout.groups[g].clone();
                return self.group_batch(&group, ops, failure, f).await;
            }
        }
        // Ops refused before they are sent: (position, why).
        let mut refused: Vec<(usize, Error)> = Vec::new();
        // Ops by group, in order: (ring index, positions in `ops`).
        let mut by_group: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Err(e) = check(op) {
                refused.push((i, e));
                continue;
            }
            let g = group_of(i, op);
            match by_group.iter_mut().find(|(at, _)| *at == g) {
                Some((_, items)) => items.push(i),
                None => {
                    let mut items = Vec::with_capacity(n - i);
                    items.push(i);
                    by_group.push((g, items));
                }
            }
        }
        if let [(g, items)] = by_group.as_slice() {
            if items.len() == n {
                // One group, every op sent (the common case): the group's
                // answers are the batch's, with no vector of answers made
                // for the batch first (a pass over memory that, on an
                // entry point at load, cost a cache miss per op).
                let group = layout.groups[*g].clone();
                return self.group_batch(&group, ops, failure, f.clone()).await;
            }
        }
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        for (i, e) in refused {
            out[i] = Some(f(Err(e)));
        }
        let mut ops: Vec<Option<Op>> = ops.into_iter().map(Some).collect();
        let mut calls: Vec<Pin<Box<dyn Future<Output = Vec<T>> + Send + '_>>> = Vec::new();
        let mut positions = Vec::new();
        for (g, items) in by_group {
            let mine: Vec<Op> = items
                .iter()
                .map(|&i| ops[i].take().expect("each op in one group"))
                .collect();
            let group = layout.groups[g].clone();
            let f = f.clone();
            calls.push(Box::pin(async move {
                self.group_batch(&group, mine, failure, f).await
            }));
            positions.push(items);
        }
        for (answers, items) in join_all(calls).await.into_iter().zip(positions) {
            for (answer, i) in answers.into_iter().zip(items) {
                out[i] = Some(answer);
            }
        }
        out.into_iter()
            .map(|a| a.expect("every op answered"))
            .collect()
    }

    /// [`Cluster::batch_routed_with`] of CELLs by their keys' hash that
    /// all belong to one group: `route` is `(generation, group)`, the
    /// group's ring index in this client's layout of [`Cluster::generation`]
    /// `generation` (under another layout they are routed again, op by
    /// op). What a forwarding node sends for its CL.THROTTLEs: a batch of
    /// [`CellByHash`] is valid by its type, encoded with no dispatch over
    /// op kinds, answered with no look at its op, and dropped with no pass
    /// over its ops (benches/notes.md, stop 61).
    pub async fn cells_by_hash_with<T, F>(
        &self,
        cells: Vec<CellByHash>,
        route: (u64, usize),
        failure: FailurePolicy,
        f: F,
    ) -> Vec<T>
    where
        T: Send + 'static,
        F: Fn(Answered) -> T + Clone + Send + Sync + 'static,
    {
        let layout = self.layout();
        let (generation, g) = route;
        let Some(group) = layout
            .groups
            .get(g)
            .filter(|_| generation == layout.generation)
        else {
            let ops = cells.into_iter().map(Op::from).collect();
            return self.batch_routed_with(ops, None, failure, f).await;
        };
        let group = group.clone();
        drop(layout);
        self.count_calls(cells.len());
        self.group_batch(&group, cells, failure, f).await
    }

    /// Counts `n` calls made.
    fn count_calls(&self, n: usize) {
        self.inner
            .stats
            .calls_total
            .fetch_add(n as u64, Ordering::Relaxed);
        for _ in 0..n {
            crate::metrics::call();
        }
    }

    /// [`Cluster::batch`] of ops that all belong to `group`.
    async fn group_batch<O, T, F>(
        &self,
        group: &Arc<Group>,
        ops: Vec<O>,
        failure: FailurePolicy,
        f: F,
    ) -> Vec<T>
    where
        O: Answers,
        T: Send + 'static,
        F: Fn(Answered) -> T + Clone + Send + Sync + 'static,
    {
        let n = ops.len();
        // An op's answer from its reply, made as the reply is read.
        let made = Made(f.clone());
        // Made only when an op is not answered at the first try: a batch
        // answered in full (the common case) never fills them.
        let mut out: Vec<Option<T>> = Vec::new();
        // Which of `out` each op of `batch` answers.
        let mut at: Vec<usize> = Vec::new();
        let mut batch = Batch::new(ops, made.clone());
        for attempt in 0..2 {
            let Some((node, client)) = self.primary_of(group, attempt > 0).await else {
                break;
            };
            let sink: Arc<dyn Sink> = batch.clone();
            self.send_and_wait(group, &node, &client, &sink, batch.finished())
                .await;
            let taken = batch.take();
            let stats = &self.inner.stats;
            stats
                .store_total
                .fetch_add(taken.answered as u64, Ordering::Relaxed);
            if attempt == 0 {
                if let Some(all) = taken.all {
                    // Every op answered at the first try: the answers as
                    // they are.
                    return all;
                }
                out = (0..n).map(|_| None).collect();
                at = (0..n).collect();
            }
            let again = self.settle(
                group,
                &node,
                taken,
                (&batch.ops, &at),
                &mut out,
                (failure, &f),
            );
            let ops: Vec<O> = again.iter().map(|&p| batch.ops[p].clone()).collect();
            at = again.iter().map(|&p| at[p]).collect();
            batch = Batch::new(ops, made.clone());
            if at.is_empty() {
                break;
            }
        }
        if out.is_empty() {
            // No primary at the first try: no op was sent.
            out = (0..n).map(|_| None).collect();
            at = (0..n).collect();
        }
        // Never sent, or refused twice: not applied.
        for (pos, &i) in at.iter().enumerate() {
            let op = batch.ops[pos].to_op();
            out[i] = Some(f(self.op_unavailable(group, &op, failure, false)));
        }
        out.into_iter()
            .map(|a| a.expect("every op answered"))
            .collect()
    }

    /// The ops of a try at `node` that got no answer (by position in
    /// `ops`; `at`: where each one's answer goes in `out`): a failure that
    /// is final answers its op; a spend sent and unanswered is
    /// outcome-unknown (the failure policy's answer); the others, surely
    /// not applied, are returned, to be sent again.
    fn settle<O, T, F>(
        &self,
        group: &Arc<Group>,
        node: &Arc<str>,
        taken: Taken<T>,
        (ops, at): (&[O], &[usize]),
        out: &mut [Option<T>],
        (failure, f): (FailurePolicy, &F),
    ) -> Vec<usize>
    where
        O: BatchOp,
        F: Fn(Answered) -> T,
    {
        let mut failed = taken.failed;
        let mut again = Vec::new();
        let mut forgot = false;
        let answers = match taken.all {
            Some(all) => all.into_iter().map(Some).collect(),
            None => taken.answers,
        };
        for (pos, answered) in answers.into_iter().enumerate() {
            if let Some(answered) = answered {
                out[at[pos]] = Some(answered);
                continue;
            }
            let op = &ops[pos];
            let e = match failed.get_mut(pos).and_then(Option::take) {
                Some(e) => e,
                None => Error::Timeout(self.inner.config.client.deadline),
            };
            crate::metrics::error(&e);
            let unknown = matches!(e, Error::Timeout(_) | Error::Disconnected);
            if !not_applied(&e) && !unknown {
                out[at[pos]] = Some(f(Err(e)));
                continue;
            }
            if !forgot {
                group.note_error(&e);
                // Only if no newer primary replaced it meanwhile.
                forget(group, node);
                forgot = true;
            }
            if unknown && op.spends() {
                crate::metrics::outcome_unknown();
                let stats = &self.inner.stats;
                stats.unknown_total.fetch_add(1, Ordering::Relaxed);
                let op = op.to_op();
                out[at[pos]] = Some(f(self.op_unavailable(group, &op, failure, true)));
            } else {
                again.push(pos);
            }
        }
        again
    }

    /// Sends `batch` to `client` (the group's primary at `node`) and waits
    /// for its replies until the deadline; one that waits `stall_after`
    /// (or times out) starts the group's stall watch, as a single call's
    /// does. Ops with no reply then have none in [`Batch::take`].
    async fn send_and_wait(
        &self,
        group: &Arc<Group>,
        node: &Arc<str>,
        client: &Client,
        batch: &Arc<dyn Sink>,
        finished: impl Future<Output = ()>,
    ) {
        let began = Instant::now();
        let deadline = self.inner.config.client.deadline;
        client.send_batch(batch).await;
        tokio::pin!(finished);
        let left = |now: Instant| deadline.saturating_sub(now.duration_since(began));
        if let Some(after) = self.inner.config.stall_after {
            let first = after.min(left(Instant::now()));
            if tokio::time::timeout(first, &mut finished).await.is_ok() {
                return;
            }
            self.suspect(group, node, client);
        }
        if tokio::time::timeout(left(Instant::now()), &mut finished)
            .await
            .is_err()
        {
            // A deadline shorter than `stall_after`: the timeout is the
            // first sign of a stall (a no-op if the watch runs already).
            self.suspect(group, node, client);
        }
    }

    /// An op's answer when its group could not answer: the failure
    /// policy's, as the single call of its kind gives it.
    fn op_unavailable(
        &self,
        group: &Group,
        op: &Op,
        failure: FailurePolicy,
        unknown: bool,
    ) -> Answered {
        match op {
            Op::Throttle {
                key,
                policy,
                cost,
                peek,
            } => {
                let set = LimitSet::new(&[Limit::TokenBucket(*policy)]).expect("one limit fits");
                let mode = if *peek { Mode::Probe } else { Mode::Spend };
                let v = self.decide_unavailable(
                    group,
                    key,
                    Limits::Inline(set),
                    (mode, Priority::Normal),
                    *cost,
                    failure,
                    unknown,
                )?;
                let verdict = v.decision.verdicts.first().map(|l| l.verdict);
                Ok(Answer::Verdict(v.source, verdict.unwrap_or_default()))
            }
            Op::Decide {
                mode,
                key,
                limits,
                cost,
                priority,
            } => {
                let v = self.decide_unavailable(
                    group,
                    key,
                    limits.borrow(),
                    (*mode, *priority),
                    *cost,
                    failure,
                    unknown,
                )?;
                Ok(Answer::Decide(v.source, v.decision))
            }
            Op::Cell { policy, .. } | Op::CellByHash { policy, .. } => {
                let (source, v) = self.cell_unavailable(group, *policy, failure, unknown)?;
                Ok(Answer::Cell(source, v))
            }
            // A lease has no fixed or local answer.
            Op::Lease { .. } => Err(unavailable(group, unknown)),
        }
    }
}

/// `op`'s arguments checked as the single call checks them.
#[inline]
fn check(op: &Op) -> Result<(), Error> {
    match op {
        Op::Throttle {
            key, policy, cost, ..
        } => {
            crate::client::check_key(key)?;
            policy
                .validate()
                .and_then(|()| policy.check_cost(*cost))
                .map_err(|e| Error::Invalid(e.to_string()))
        }
        Op::Decide {
            mode,
            key,
            limits,
            cost,
            ..
        } => crate::client::check_decide(key, &limits.borrow(), *mode, *cost),
        Op::Lease {
            key,
            target,
            lease_id,
            ..
        } => crate::client::check_lease(key, &target.borrow(), *lease_id),
        Op::Cell { key, .. } => crate::client::check_key(key),
        // (Its policy is valid by its type; its key was checked by whoever
        // hashed it.)
        Op::CellByHash { .. } => Ok(()),
    }
}

/// Whether `op` passes [`check`]: a CELL's key tested in place (the
/// forwarded CL.THROTTLE's op, checked per op of an entry point's batch),
/// no `Result` made.
#[inline]
fn valid(op: &Op) -> bool {
    match op {
        Op::Cell { key, .. } => crate::client::key_ok(key),
        Op::CellByHash { .. } => true,
        op => check(op).is_ok(),
    }
}

/// The group every op of a routed batch is in, if there is one.
fn one_group(groups: &[usize]) -> Option<usize> {
    let g = *groups.first()?;
    groups.iter().all(|&h| h == g).then_some(g)
}

/// An op of the batch path: its answer from its reply.
pub(crate) trait Answers: BatchOp {
    /// `reply` as this op's answer, if it is of this op's kind.
    fn answer(&self, reply: Reply) -> Answered;

    /// A CELL_OK of verdict `v` as this op's answer.
    #[inline]
    fn answer_cell(&self, v: CellVerdict) -> Answered {
        self.answer(Reply::Cell(v))
    }
}

/// A batch's answers as the caller makes them (`f`), from the store.
#[derive(Clone)]
struct Made<F>(F);

impl<O: Answers, T, F: Fn(Answered) -> T> MakeAnswer<O, T> for Made<F> {
    #[inline]
    fn reply(&self, op: &O, reply: Reply) -> T {
        crate::metrics::verdict(Source::Store);
        (self.0)(op.answer(reply))
    }

    #[inline]
    fn cell(&self, op: &O, v: CellVerdict) -> T {
        crate::metrics::verdict(Source::Store);
        (self.0)(op.answer_cell(v))
    }
}

impl Answers for Op {
    #[inline]
    fn answer(&self, reply: Reply) -> Answered {
        answer(self, reply)
    }
}

impl Answers for CellByHash {
    /// A CELL's answer is CELL_OK, whatever the op: no look at it.
    #[inline]
    fn answer(&self, reply: Reply) -> Answered {
        match reply {
            Reply::Cell(v) => Ok(Answer::Cell(Source::Store, v)),
            other => Err(unexpected(&other)),
        }
    }

    #[inline]
    fn answer_cell(&self, v: CellVerdict) -> Answered {
        Ok(Answer::Cell(Source::Store, v))
    }
}

/// `reply` as `op`'s answer, if it is of `op`'s kind. Inlined into the
/// batch's pass over its replies, where the caller's own answer is made
/// from it at once (an entry node's `Kept`): the enums between are never
/// built whole.
#[inline]
fn answer(op: &Op, reply: Reply) -> Answered {
    // A verdict is copied out and its reply forgotten, not dropped: those
    // variants own nothing, and the drop (a call that reads the variant
    // again) was 17 instructions of a forwarding node's op.
    let verdict = match (op, &reply) {
        (Op::Cell { .. } | Op::CellByHash { .. }, Reply::Cell(v)) => {
            Some(Ok(Answer::Cell(Source::Store, *v)))
        }
        (Op::Throttle { peek: false, .. }, Reply::Throttle(v))
        | (Op::Throttle { peek: true, .. }, Reply::Peek(v)) => {
            Some(Ok(Answer::Verdict(Source::Store, *v)))
        }
        _ => None,
    };
    if let Some(verdict) = verdict {
        std::mem::forget(reply);
        return verdict;
    }
    match (op, reply) {
        (Op::Decide { .. }, Reply::Decide(d)) => Ok(Answer::Decide(Source::Store, d)),
        (Op::Lease { renew: false, .. }, Reply::Release(ok))
        | (Op::Lease { renew: true, .. }, Reply::Renew(ok)) => Ok(Answer::Lease(ok)),
        (_, other) => Err(unexpected(&other)),
    }
}

/// Polls every future to its end; the outputs in the input's order.
pub async fn join_all<T>(mut futures: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let mut left = futures.len();
    std::future::poll_fn(move |cx: &mut Context<'_>| {
        for (i, f) in futures.iter_mut().enumerate() {
            if out[i].is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    out[i] = Some(v);
                    left -= 1;
                }
            }
        }
        if left == 0 {
            Poll::Ready(out.iter_mut().map(|o| o.take().expect("done")).collect())
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterConfig, Topology};
    use bytes::Bytes;
    use sluice_protocol::routing::key_hash;
    use sluice_protocol::Policy;

    /// Groups whose primaries refuse every connection (port 1): each op's
    /// error names the group it was routed to.
    fn down(names: &[&str]) -> Topology {
        names
            .iter()
            .fold(Topology::new(), |t, n| t.group(n, "127.0.0.1:1", None))
    }

    fn routed_to(answers: &[Answered]) -> Vec<String> {
        answers
            .iter()
            .map(|a| match a {
                Err(Error::Unavailable { group, .. }) => group.clone(),
                other => panic!("a down group's answer: {other:?}"),
            })
            .collect()
    }

    /// A reply is its op's answer only when it is of the op's kind: a
    /// verdict of another kind is a protocol error, not a verdict.
    #[test]
    fn a_reply_answers_only_an_op_of_its_kind() {
        let cell = sluice_protocol::cell::CellVerdict {
            limited: false,
            limit: 6,
            remaining: 5,
            retry_after_ns: -1,
            reset_after_ns: 0,
        };
        let verdict = sluice_protocol::Verdict {
            allowed: true,
            limit: 10,
            remaining: 9,
            retry_after_ns: 0,
            reset_after_ns: 0,
        };
        let policy = Policy::new(10, 1_000_000_000, 10).unwrap();
        let throttle = |peek| Op::Throttle {
            key: Bytes::from_static(b"k"),
            policy,
            cost: 1,
            peek,
        };
        let cell_op = Op::Cell {
            key: Bytes::from_static(b"k"),
            policy: sluice_protocol::cell::CellPolicy::new(5, 5, 60).unwrap(),
            quantity: 1,
        };
        assert!(matches!(
            answer(&cell_op, Reply::Cell(cell)),
            Ok(Answer::Cell(Source::Store, v)) if v == cell
        ));
        assert!(matches!(
            answer(&throttle(false), Reply::Throttle(verdict)),
            Ok(Answer::Verdict(Source::Store, v)) if v == verdict
        ));
        assert!(matches!(
            answer(&throttle(true), Reply::Peek(verdict)),
            Ok(Answer::Verdict(Source::Store, v)) if v == verdict
        ));
        for (op, reply) in [
            (cell_op.clone(), Reply::Throttle(verdict)),
            (throttle(false), Reply::Cell(cell)),
            (throttle(false), Reply::Peek(verdict)),
            (throttle(true), Reply::Throttle(verdict)),
        ] {
            assert!(
                matches!(answer(&op, reply), Err(Error::Protocol(_))),
                "{op:?}"
            );
        }
    }

    /// A CELL by its key's hash takes a CELL_OK as its answer with no look
    /// at the op, and any other reply as a protocol error.
    #[test]
    fn a_cell_by_hash_takes_only_a_cell_ok() {
        let v = sluice_protocol::cell::CellVerdict {
            limited: true,
            limit: 6,
            remaining: 0,
            retry_after_ns: 5,
            reset_after_ns: 7,
        };
        let cell = CellByHash {
            hash: Op::hash_halves(key_hash(b"k")),
            policy: sluice_protocol::cell::CellPolicy::new(5, 5, 60).unwrap(),
            quantity: 1,
        };
        assert!(matches!(
            cell.answer(Reply::Cell(v)),
            Ok(Answer::Cell(Source::Store, got)) if got == v
        ));
        assert!(matches!(cell.answer(Reply::Pong), Err(Error::Protocol(_))));
        assert!(
            matches!(cell.to_op(), Op::CellByHash { hash, quantity: 1, .. } if hash == cell.hash)
        );
        assert!(
            cell.spends()
                && !CellByHash {
                    quantity: 0,
                    ..cell
                }
                .spends()
        );
    }

    /// CELLs by hash go to the group their route names under the layout in
    /// force; under a stale one each is routed by its own hash.
    #[tokio::test]
    async fn cells_by_hash_go_to_the_routes_group_or_are_routed_again() {
        let cluster = Cluster::new(&down(&["a", "b", "c"]), ClusterConfig::default()).unwrap();
        let policy = sluice_protocol::cell::CellPolicy::new(5, 5, 60).unwrap();
        let hashes: Vec<u128> = (0..12)
            .map(|i| key_hash(format!("k{i}").as_bytes()))
            .collect();
        let cells: Vec<CellByHash> = hashes
            .iter()
            .map(|&h| CellByHash {
                hash: Op::hash_halves(h),
                policy,
                quantity: 1,
            })
            .collect();
        let layout = cluster.layout();
        let by_hash: Vec<String> = hashes
            .iter()
            .map(|&h| layout.ring.name(layout.ring.group_of(h)).to_owned())
            .collect();
        let distinct: std::collections::HashSet<&String> = by_hash.iter().collect();
        assert!(distinct.len() > 1, "the keys span groups: {by_hash:?}");
        let named = layout.ring.name(2).to_owned();
        let generation = cluster.generation();
        drop(layout);
        let id = std::convert::identity;
        let fresh = cluster
            .cells_by_hash_with(cells.clone(), (generation, 2), FailurePolicy::Error, id)
            .await;
        assert_eq!(routed_to(&fresh), vec![named; cells.len()]);
        let stale = cluster
            .cells_by_hash_with(cells, (generation + 1, 2), FailurePolicy::Error, id)
            .await;
        assert_eq!(routed_to(&stale), by_hash);
    }

    /// A batch routed to one group with an invalid op among its ops: the
    /// invalid one is refused in its place, the others go to the group.
    #[tokio::test]
    async fn an_invalid_op_in_a_routed_batch_is_refused_in_its_place() {
        let cluster = Cluster::new(&down(&["a", "b"]), ClusterConfig::default()).unwrap();
        let policy = sluice_protocol::cell::CellPolicy::new(5, 5, 60).unwrap();
        let keys: [&[u8]; 3] = [b"k0", b"", b"k2"];
        let ops: Vec<Op> = keys
            .iter()
            .map(|k| Op::Cell {
                key: Bytes::copy_from_slice(k),
                policy,
                quantity: 1,
            })
            .collect();
        let route = vec![1; ops.len()];
        let answers = cluster
            .batch_routed(
                ops,
                Some((cluster.generation(), &route)),
                FailurePolicy::Error,
            )
            .await;
        let second = cluster.layout().ring.name(1).to_owned();
        assert!(
            matches!(&answers[1], Err(Error::Invalid(_))),
            "{:?}",
            answers[1]
        );
        for i in [0, 2] {
            assert!(
                matches!(&answers[i], Err(Error::Unavailable { group, .. }) if *group == second),
                "{i}: {:?}",
                answers[i]
            );
        }
    }

    /// A route looked up under the layout in force is used as given; one
    /// looked up under an older layout is looked up again, so a reload
    /// between an entry point's lookup and its batch never misroutes.
    #[tokio::test]
    async fn a_route_is_trusted_only_under_the_layout_it_was_made_in() {
        let cluster = Cluster::new(&down(&["a", "b", "c"]), ClusterConfig::default()).unwrap();
        let keys: Vec<Bytes> = (0..24).map(|i| Bytes::from(format!("k{i}"))).collect();
        let ops = || -> Vec<Op> {
            keys.iter()
                .map(|k| Op::Throttle {
                    key: k.clone(),
                    policy: Policy::new(10, 1_000_000_000, 10).unwrap(),
                    cost: 1,
                    peek: false,
                })
                .collect()
        };
        let owners =
            |c: &Cluster| -> Vec<String> { keys.iter().map(|k| c.owner_of(key_hash(k))).collect() };
        let policy = FailurePolicy::Error;
        let looked_up = routed_to(&cluster.batch(ops(), policy).await);
        assert_eq!(looked_up, owners(&cluster));
        // Every op said to be the first group's, under the current layout:
        // taken as given.
        let first = cluster.layout().ring.name(0).to_owned();
        let all_first = vec![0; keys.len()];
        let gen = cluster.generation();
        let given = cluster
            .batch_routed(ops(), Some((gen, &all_first)), policy)
            .await;
        assert!(routed_to(&given).iter().all(|g| *g == first));
        // After a reload (another layout), the same route is stale: looked
        // up again, by the new ring.
        cluster.reload(&down(&["a", "c", "d"])).unwrap();
        let stale = cluster
            .batch_routed(ops(), Some((gen, &all_first)), policy)
            .await;
        assert_eq!(routed_to(&stale), owners(&cluster));
        assert_ne!(owners(&cluster), vec![first; keys.len()], "the keys spread");
    }
}
