//! What a drill found: each round's cost (unavailable window, over- and
//! under-admitted units, errors, fallback decisions), the totals against
//! the replication mode's promise, and the ways to show them: a summary on
//! stdout, one JSON object, report.md and drill.svg.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::audit::{self, Call};
use super::load::{Origin, Plan, Record};
use super::Fault;

/// Async mode's allowance: a failover may re-grant what the old primary
/// admitted within the follower's lag before the fault, plus this much
/// (the drain interval and the sampling of the lag, with room to spare).
pub const ASYNC_GRACE_MS: f64 = 10.0;

/// What the drill did in one round, as the orchestrator saw it.
#[derive(Debug, Clone)]
pub struct RoundLog {
    /// The fault.
    pub fault: Fault,
    /// The group, by topology index.
    pub group: usize,
    /// Its name.
    pub group_name: String,
    /// The primary the fault hit, as the cluster file names it.
    pub node: String,
    /// When the round began (ns since the Unix epoch).
    pub start_ns: u64,
    /// When the fault was injected.
    pub fault_ns: u64,
    /// The primary's replication lag just before, in ms.
    pub lag_ms: f64,
    /// The group's epoch before the fault.
    pub epoch_before: u64,
    /// Its epoch once recovered.
    pub epoch_after: u64,
    /// The primary once recovered.
    pub primary_after: Option<String>,
    /// Time from the fault until the group had a primary and a follower
    /// in sync again; `None` if it never did.
    pub recovered_ms: Option<f64>,
    /// The fault could not be injected (or the handover was refused).
    pub fault_error: Option<String>,
    /// A handover's own report of the window it admitted nothing.
    pub server_unavailable_ms: Option<f64>,
}

/// How the drill was set up (printed with the results).
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// `local` or `cluster`.
    pub target: String,
    /// `sync` or `async`.
    pub mode: String,
    /// The --fault asked for.
    pub fault: String,
    /// Groups.
    pub groups: usize,
    /// --rounds.
    pub rounds_asked: usize,
    /// Decisions per second asked for.
    pub rate: f64,
    /// Concurrent callers.
    pub callers: usize,
    /// Keys in all.
    pub keys: usize,
    /// Of which hot.
    pub hot_keys: usize,
    /// The limit of each kind.
    pub policies: Vec<String>,
    /// The clients' failure policy.
    pub failure: String,
    /// The setup broken on purpose, if any.
    pub sabotage: Option<String>,
    /// Times the clients moved a group to another primary.
    pub failovers_seen: u64,
    /// Where the local nodes' logs are.
    pub node_logs: Option<String>,
    /// How the load reached the cluster: `client` (the cluster client), or
    /// through random nodes' entry points: `v1`, `resp` (CL.THROTTLE) or
    /// `rls` (Envoy's ShouldRateLimit).
    pub entry: String,
    /// The followers' `--promote-after-ms` (a local cluster's; `None`
    /// when the drill does not know it): drawn beside each round's
    /// unavailable window.
    pub promote_after_ms: Option<u64>,
    /// Stall watches the clients started (a call to a primary waited
    /// `stall_after`), and how many moved a group to a newer primary.
    pub stalls_seen: (u64, u64),
}

/// Client-side errors in a round, by type.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Errors {
    /// Sent and not answered (timeout, dropped connection): the store may
    /// have applied it; the failure policy answered.
    pub outcome_unknown: u64,
    /// No primary could be reached or admitted (refused, NOT_PRIMARY,
    /// fenced): the failure policy answered.
    pub no_primary: u64,
    /// The call returned an error and no verdict at all.
    pub error: u64,
}

/// One round's cost.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// 0, 1, ...
    pub round: usize,
    /// The fault.
    pub fault: &'static str,
    /// The group it hit.
    pub group: String,
    /// The primary it hit.
    pub node: String,
    /// That primary's replication lag just before, ms.
    pub lag_ms: f64,
    /// Epoch before the fault.
    pub epoch_before: u64,
    /// Epoch after recovery.
    pub epoch_after: u64,
    /// Whether a promotion happened.
    pub promoted: bool,
    /// The primary after recovery.
    pub primary_after: Option<String>,
    /// The group had a primary and a follower in sync again.
    pub recovered: bool,
    /// Time from the fault until then, ms.
    pub recovered_ms: Option<f64>,
    /// Time from the fault to the group's first store verdict (for a call
    /// sent after the fault, by the primary of the new epoch when there
    /// was a promotion), ms; the rest of the round when none came.
    pub unavailable_ms: f64,
    /// Whether the group answered at all after the fault in this round.
    pub answered: bool,
    /// Store admissions beyond the limits, in this round.
    pub over_admitted_units: u64,
    /// Admissions beyond the limits from any source (fallbacks included).
    pub over_admitted_with_fallback_units: u64,
    /// Denials a correct limiter would have admitted.
    pub under_admitted_units: u64,
    /// Async only: what a failover may re-grant (store admissions of the
    /// group within lag + grace before the fault).
    pub async_allowance_units: Option<u64>,
    /// Decisions in this round (every group).
    pub decisions: u64,
    /// Decisions of the faulted group by a fallback after the fault.
    pub fallback_decisions: u64,
    /// Of which admitted.
    pub fallback_admitted_units: u64,
    /// Errors the faulted group's callers saw after the fault.
    pub errors: Errors,
    /// A handover's own measure of its window, ms.
    pub server_unavailable_ms: Option<f64>,
    /// Why the fault could not be injected, if so.
    pub fault_error: Option<String>,
}

/// Totals of one fault kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultTotals {
    /// Rounds with this fault.
    pub rounds: u64,
    /// Store admissions beyond the limits.
    pub over_admitted_units: u64,
    /// Denials a correct limiter would have admitted.
    pub under_admitted_units: u64,
    /// Longest unavailable window, ms.
    pub max_unavailable_ms: f64,
}

/// Totals of one limit kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KindTotals {
    /// Keys of this kind.
    pub keys: u64,
    /// Units the store admitted.
    pub admitted_units: u64,
    /// Store admissions beyond the limits.
    pub over_admitted_units: u64,
    /// Denials a correct limiter would have admitted.
    pub under_admitted_units: u64,
}

/// A line of the picture: its label, colour and value per bin.
type Series = (&'static str, plotters::style::RGBColor, fn(&Bin) -> u64);

/// Counts per bin of the timeline (for the picture).
#[derive(Debug, Clone, Copy, Default)]
struct Bin {
    store_allowed: u64,
    store_denied: u64,
    fallback: u64,
    errors: u64,
    over: u64,
    under: u64,
}

/// Everything a drill found.
#[derive(Debug, Clone)]
pub struct Outcome {
    setup: Setup,
    rounds: Vec<Round>,
    by_fault: BTreeMap<&'static str, FaultTotals>,
    by_kind: BTreeMap<String, KindTotals>,
    decisions: u64,
    store_decisions: u64,
    fallback_decisions: u64,
    duration_s: f64,
    failures: Vec<String>,
    bins: Vec<Bin>,
    bin_s: f64,
    fault_marks: Vec<(f64, &'static str)>,
}

/// Judges the records of a run.
pub fn judge(
    setup: Setup,
    plan: &Plan,
    records: &[Record],
    logs: Vec<RoundLog>,
    start_ns: u64,
    end_ns: u64,
) -> Outcome {
    let timeline = Timeline::new(&logs, start_ns, end_ns);
    let mut bins = vec![Bin::default(); timeline.bin_of(end_ns) + 1];
    let admission = Admission::audit(plan, records, &timeline, &mut bins);
    let traffic = Traffic::tally(records, &logs, &timeline, &mut bins);
    let found = Found {
        records,
        timeline: &timeline,
        admission: &admission,
        traffic: &traffic,
        sync: setup.mode == "sync",
    };
    let mut rounds = Vec::new();
    let mut failures = Vec::new();
    let mut by_fault: BTreeMap<&'static str, FaultTotals> = BTreeMap::new();
    let mut fault_marks = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        let round = found.round(i, log);
        round_failures(&round, log, &mut failures);
        let t = by_fault.entry(round.fault).or_default();
        t.rounds += 1;
        t.over_admitted_units += round.over_admitted_units;
        t.under_admitted_units += round.under_admitted_units;
        t.max_unavailable_ms = t.max_unavailable_ms.max(round.unavailable_ms);
        fault_marks.push((
            log.fault_ns.saturating_sub(start_ns) as f64 / 1e9,
            round.fault,
        ));
        rounds.push(round);
    }
    if rounds.len() < setup.rounds_asked {
        failures.push(format!(
            "only {} of {} rounds ran: a group did not recover",
            rounds.len(),
            setup.rounds_asked
        ));
    }
    Outcome {
        setup,
        rounds,
        by_fault,
        by_kind: admission.by_kind,
        decisions: records.len() as u64,
        store_decisions: traffic.store_decisions,
        fallback_decisions: traffic.fallback_decisions,
        duration_s: timeline.duration_s,
        failures,
        bins,
        bin_s: timeline.bin_s,
        fault_marks,
    }
}

/// Where a time of the run falls: in which round, and in which bin of the
/// picture.
#[derive(Debug)]
struct Timeline {
    /// Each round's start; round i owns [start_i, start_{i+1}), round 0
    /// from the load's start.
    starts: Vec<u64>,
    /// Rounds, at least 1 (a run without rounds is one long round 0).
    rounds: usize,
    /// The load's start (ns since the Unix epoch).
    start_ns: u64,
    /// The load's end.
    end_ns: u64,
    /// The load's length in seconds.
    duration_s: f64,
    /// Seconds per bin of the picture (about 400 bins, 0.25 s at least).
    bin_s: f64,
}

impl Timeline {
    fn new(logs: &[RoundLog], start_ns: u64, end_ns: u64) -> Timeline {
        let mut starts: Vec<u64> = logs.iter().map(|l| l.start_ns).collect();
        if let Some(s) = starts.first_mut() {
            *s = start_ns;
        }
        let duration_s = end_ns.saturating_sub(start_ns) as f64 / 1e9;
        Timeline {
            starts,
            rounds: logs.len().max(1),
            start_ns,
            end_ns,
            duration_s,
            bin_s: (duration_s / 400.0).max(0.25),
        }
    }

    /// The round that owns time `t`.
    fn round_of(&self, t: u64) -> usize {
        let i = self.starts.partition_point(|&s| s <= t).saturating_sub(1);
        i.min(self.rounds - 1)
    }

    /// When round `i`'s window ends: the next round's start, or the load's
    /// end.
    fn window_end(&self, i: usize) -> u64 {
        self.starts.get(i + 1).copied().unwrap_or(self.end_ns)
    }

    /// The picture's bin of time `t`.
    fn bin_of(&self, t: u64) -> usize {
        (t.saturating_sub(self.start_ns) as f64 / 1e9 / self.bin_s) as usize
    }
}

/// What the judge found of each key's admissions, summed by round and by
/// limit kind.
#[derive(Debug)]
struct Admission {
    /// Units admitted over the limits, by round.
    over: Vec<u64>,
    /// The same, counting the clients' fallback decisions too.
    over_fb: Vec<u64>,
    /// Units refused that a correct limiter would have admitted, by round.
    under: Vec<u64>,
    /// Keys, admissions and the above, by limit kind.
    by_kind: BTreeMap<String, KindTotals>,
}

impl Admission {
    /// Audits each key's calls ([`audit::audit`]) and adds up what it
    /// found (and marks it in `bins`).
    fn audit(plan: &Plan, records: &[Record], timeline: &Timeline, bins: &mut [Bin]) -> Admission {
        let mut calls: Vec<Vec<Call>> = vec![Vec::new(); plan.keys.len()];
        for r in records {
            calls[r.key as usize].push(Call {
                send_ns: r.send_ns,
                recv_ns: r.recv_ns,
                cost: 1,
                allowed: r.allowed,
                store: r.origin == Origin::Store,
                maybe_applied: r.unknown,
                verdict: r.origin != Origin::Error,
            });
        }
        let n = timeline.rounds;
        let mut found = Admission {
            over: vec![0u64; n],
            over_fb: vec![0u64; n],
            under: vec![0u64; n],
            by_kind: BTreeMap::new(),
        };
        for (k, key_calls) in calls.iter().enumerate() {
            let key = &plan.keys[k];
            let limit = &plan.limits[key.kind];
            let f = audit::audit(limit, key_calls);
            let kind = limit.kind().name().to_owned();
            let t = found.by_kind.entry(kind).or_default();
            t.keys += 1;
            t.admitted_units += key_calls.iter().filter(|c| c.allowed && c.store).count() as u64;
            for &(at, units) in &f.over {
                found.over[timeline.round_of(at)] += units;
                t.over_admitted_units += units;
                if let Some(b) = bins.get_mut(timeline.bin_of(at)) {
                    b.over += units;
                }
            }
            for &(at, units) in &f.over_with_fallback {
                found.over_fb[timeline.round_of(at)] += units;
            }
            for &(at, units) in &f.under {
                found.under[timeline.round_of(at)] += units;
                t.under_admitted_units += units;
                if let Some(b) = bins.get_mut(timeline.bin_of(at)) {
                    b.under += units;
                }
            }
        }
        found
    }
}

/// The calls of each round: how many, and what those to the faulted
/// group got once the fault was in.
#[derive(Debug)]
struct Traffic {
    /// Calls sent in each round.
    decisions_in: Vec<u64>,
    /// The faulted group's fallback decisions, and those that admitted.
    fallback: Vec<(u64, u64)>,
    /// The faulted group's errors.
    errors: Vec<Errors>,
    /// When the faulted group's store first answered after the fault (from
    /// the new primary, when one was promoted).
    first_answer: Vec<Option<u64>>,
    /// Decisions the store made, the whole run.
    store_decisions: u64,
    /// Decisions the clients made in its place.
    fallback_decisions: u64,
}

impl Traffic {
    /// Counts every record by round and into its bin of the picture.
    fn tally(
        records: &[Record],
        logs: &[RoundLog],
        timeline: &Timeline,
        bins: &mut [Bin],
    ) -> Traffic {
        let n = timeline.rounds;
        let mut t = Traffic {
            decisions_in: vec![0u64; n],
            fallback: vec![(0u64, 0u64); n],
            errors: vec![Errors::default(); n],
            first_answer: vec![None; n],
            store_decisions: 0,
            fallback_decisions: 0,
        };
        for r in records {
            let i = timeline.round_of(r.send_ns);
            t.decisions_in[i] += 1;
            let last = bins.len() - 1;
            bin_record(&mut bins[timeline.bin_of(r.recv_ns).min(last)], r);
            match r.origin {
                Origin::Store => t.store_decisions += 1,
                Origin::Error => {}
                _ => t.fallback_decisions += 1,
            }
            let Some(log) = logs.get(i) else { continue };
            if usize::from(r.group) != log.group || r.send_ns < log.fault_ns {
                continue;
            }
            t.faulted_group_call(i, log, r);
        }
        t
    }

    /// Counts a call of round `i` to its faulted group, after the fault.
    fn faulted_group_call(&mut self, i: usize, log: &RoundLog, r: &Record) {
        match r.origin {
            Origin::Store => {
                let promoted = log.epoch_after > log.epoch_before;
                if !promoted || r.epoch > log.epoch_before {
                    let first = self.first_answer[i].get_or_insert(r.recv_ns);
                    *first = (*first).min(r.recv_ns);
                }
            }
            Origin::Error => self.errors[i].error += 1,
            _ => {
                self.fallback[i].0 += 1;
                self.fallback[i].1 += u64::from(r.allowed);
                if r.unknown {
                    self.errors[i].outcome_unknown += 1;
                } else {
                    self.errors[i].no_primary += 1;
                }
            }
        }
    }
}

/// Counts record `r` in its bin of the picture.
fn bin_record(b: &mut Bin, r: &Record) {
    match r.origin {
        Origin::Store if r.allowed => b.store_allowed += 1,
        Origin::Store => b.store_denied += 1,
        Origin::Error => b.errors += 1,
        _ => b.fallback += 1,
    }
    if r.unknown {
        b.errors += 1;
    }
}

/// What the judge gathered before it writes each round's result.
#[derive(Debug)]
struct Found<'a> {
    /// Every verdict of the run.
    records: &'a [Record],
    /// The rounds' windows.
    timeline: &'a Timeline,
    /// Over- and under-admission by round.
    admission: &'a Admission,
    /// Calls, errors and first answers by round.
    traffic: &'a Traffic,
    /// Sync mode (no allowance for over-admission).
    sync: bool,
}

impl Found<'_> {
    /// Round `i`'s result.
    fn round(&self, i: usize, log: &RoundLog) -> Round {
        let (a, t) = (self.admission, self.traffic);
        let answered = t.first_answer[i].is_some();
        let unavailable_ms = t.first_answer[i]
            .unwrap_or(self.timeline.window_end(i))
            .saturating_sub(log.fault_ns) as f64
            / 1e6;
        Round {
            round: i,
            fault: log.fault.name(),
            group: log.group_name.clone(),
            node: log.node.clone(),
            lag_ms: log.lag_ms,
            epoch_before: log.epoch_before,
            epoch_after: log.epoch_after,
            promoted: log.epoch_after > log.epoch_before,
            primary_after: log.primary_after.clone(),
            recovered: log.recovered_ms.is_some(),
            recovered_ms: log.recovered_ms,
            unavailable_ms,
            answered,
            over_admitted_units: a.over[i],
            over_admitted_with_fallback_units: a.over_fb[i],
            under_admitted_units: a.under[i],
            async_allowance_units: (!self.sync).then(|| async_allowance(self.records, log)),
            decisions: t.decisions_in[i],
            fallback_decisions: t.fallback[i].0,
            fallback_admitted_units: t.fallback[i].1,
            errors: t.errors[i].clone(),
            server_unavailable_ms: log.server_unavailable_ms,
            fault_error: log.fault_error.clone(),
        }
    }
}

/// Async mode's allowance for a round: what the faulted group's store
/// admitted from the follower's lag (plus [`ASYNC_GRACE_MS`]) before the
/// fault to [`ASYNC_GRACE_MS`] after it.
fn async_allowance(records: &[Record], log: &RoundLog) -> u64 {
    let from = log.fault_ns as f64 - (log.lag_ms + ASYNC_GRACE_MS) * 1e6;
    let to = log.fault_ns as f64 + ASYNC_GRACE_MS * 1e6;
    records
        .iter()
        .filter(|r| {
            r.origin == Origin::Store
                && r.allowed
                && usize::from(r.group) == log.group
                && (r.recv_ns as f64) >= from
                && (r.recv_ns as f64) <= to
        })
        .count() as u64
}

/// Why a round broke the mode's promise, if it did: added to `failures`.
fn round_failures(round: &Round, log: &RoundLog, failures: &mut Vec<String>) {
    let i = round.round;
    if !round.recovered {
        failures.push(format!(
            "round {i}: group {} did not recover (no primary with a follower in sync)",
            round.group
        ));
    }
    if let Some(e) = &round.fault_error {
        failures.push(format!("round {i}: {} failed: {e}", round.fault));
    }
    match round.async_allowance_units {
        None if round.over_admitted_units > 0 => failures.push(format!(
            "round {i}: {} units admitted over the limits (sync promises 0)",
            round.over_admitted_units
        )),
        Some(a) if round.over_admitted_units > a => failures.push(format!(
            "round {i}: {} units over the limits, more than the {a} admitted in the last {:.1} ms before the fault",
            round.over_admitted_units,
            log.lag_ms + ASYNC_GRACE_MS
        )),
        _ => {}
    }
}

impl Outcome {
    /// Whether the run kept the mode's promise: every round recovered, and
    /// over-admission 0 (sync) or within each round's allowance (async).
    pub fn promise_kept(&self) -> bool {
        self.failures.is_empty()
    }

    /// The mode's promise, in words.
    fn promise(&self) -> String {
        if self.setup.mode == "sync" {
            "sync: 0 units over the limits, every group recovers".into()
        } else {
            format!(
                "async: at most what the old primary admitted within its lag + {ASYNC_GRACE_MS} ms before the fault, every group recovers"
            )
        }
    }

    fn total(&self, f: impl Fn(&Round) -> u64) -> u64 {
        self.rounds.iter().map(f).sum()
    }

    fn worst_unavailable(&self) -> Option<&Round> {
        self.rounds
            .iter()
            .max_by(|a, b| a.unavailable_ms.total_cmp(&b.unavailable_ms))
    }

    /// Exactly one JSON object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "setup": self.setup,
            "promise": self.promise(),
            "promise_kept": self.promise_kept(),
            "failures": self.failures,
            "rounds": self.rounds,
            "over_admitted_units": self.total(|r| r.over_admitted_units),
            "over_admitted_with_fallback_units": self.total(|r| r.over_admitted_with_fallback_units),
            "under_admitted_units": self.total(|r| r.under_admitted_units),
            "max_unavailable_ms": self.worst_unavailable().map_or(0.0, |r| r.unavailable_ms),
            "decisions": self.decisions,
            "store_decisions": self.store_decisions,
            "fallback_decisions": self.fallback_decisions,
            "duration_s": self.duration_s,
            "by_fault": self.by_fault,
            "by_kind": self.by_kind,
        })
    }

    /// The human summary: the setup, a line per round, a verdict line.
    pub fn summary(&self) -> String {
        let s = &self.setup;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "drill: {} cluster, {} groups, {}, faults {}, {} rounds; load {}/s over {} callers through {}, {} keys ({} hot); fallback {}{}",
            s.target,
            s.groups,
            s.mode,
            s.fault,
            s.rounds_asked,
            s.rate,
            s.callers,
            match s.entry.as_str() {
                "client" => "the cluster client".to_owned(),
                other => format!("entry points ({other})"),
            },
            s.keys,
            s.hot_keys,
            s.failure,
            s.sabotage
                .as_ref()
                .map_or(String::new(), |x| format!("; SABOTAGED: {x}"))
        );
        let _ = writeln!(
            out,
            "round  fault      group  lag_ms  epoch   unavail_ms  recovered_ms  over  under  fallback  unknown  no_primary"
        );
        for r in &self.rounds {
            let _ = writeln!(
                out,
                "{:5}  {:<9}  {:<5}  {:6.2}  {:>6}  {:11.1}  {:>12}  {:4}  {:5}  {:8}  {:7}  {:10}{}",
                r.round,
                r.fault,
                r.group,
                r.lag_ms,
                format!("{}>{}", r.epoch_before, r.epoch_after),
                r.unavailable_ms,
                r.recovered_ms
                    .map_or("never".to_owned(), |m| format!("{m:.1}")),
                r.over_admitted_units,
                r.under_admitted_units,
                r.fallback_decisions,
                r.errors.outcome_unknown,
                r.errors.no_primary,
                r.fault_error
                    .as_ref()
                    .map_or(String::new(), |e| format!("  ({e})"))
            );
        }
        for f in &self.failures {
            let _ = writeln!(out, "broken: {f}");
        }
        let worst = self.worst_unavailable();
        let _ = writeln!(
            out,
            "verdict: promise {} ({}); over-admitted {} units (with fallback {}), under-admitted {}, max unavailable {:.1} ms{}; {} decisions, {:.2} % by fallback",
            if self.promise_kept() { "KEPT" } else { "BROKEN" },
            self.promise(),
            self.total(|r| r.over_admitted_units),
            self.total(|r| r.over_admitted_with_fallback_units),
            self.total(|r| r.under_admitted_units),
            worst.map_or(0.0, |r| r.unavailable_ms),
            worst.map_or(String::new(), |r| format!(" (round {}, {})", r.round, r.fault)),
            self.decisions,
            100.0 * self.fallback_decisions as f64 / self.decisions.max(1) as f64
        );
        out
    }

    /// report.md, drill.svg and drill.json (what --json prints) in `dir`.
    pub fn write_report(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        self.draw(&dir.join("drill.svg"))
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        std::fs::write(dir.join("drill.json"), format!("{}\n", self.json()))?;
        std::fs::write(dir.join("report.md"), self.markdown())
    }

    /// report.md's text.
    pub fn markdown(&self) -> String {
        let s = &self.setup;
        let mut md = String::new();
        let _ = writeln!(
            md,
            "# Failover drill: {} mode, faults {}\n",
            s.mode, s.fault
        );
        let _ = writeln!(
            md,
            "**Promise {}** ({}).\n",
            if self.promise_kept() {
                "kept"
            } else {
                "broken"
            },
            self.promise()
        );
        for f in &self.failures {
            let _ = writeln!(md, "- broken: {f}");
        }
        let worst = self.worst_unavailable();
        let _ = writeln!(
            md,
            "| | |\n|---|---|\n| rounds | {} |\n| over-admitted units (store) | {} |\n| over-admitted units (with fallback) | {} |\n| under-admitted units | {} |\n| max unavailable | {:.1} ms |\n| decisions | {} ({:.2} % by fallback) |\n| length | {:.1} s |\n",
            self.rounds.len(),
            self.total(|r| r.over_admitted_units),
            self.total(|r| r.over_admitted_with_fallback_units),
            self.total(|r| r.under_admitted_units),
            worst.map_or(0.0, |r| r.unavailable_ms),
            self.decisions,
            100.0 * self.fallback_decisions as f64 / self.decisions.max(1) as f64,
            self.duration_s
        );
        let _ = writeln!(md, "![decisions, errors and admissions over the limits over time; faults marked](drill.svg)\n");
        let _ = writeln!(
            md,
            "Setup: {} cluster of {} groups (a primary and a follower each), load {}/s over {} callers on {} keys ({} hot, pushed far over their limits), the clients' failure policy `{}`{}. Limits: {}.\n",
            s.target,
            s.groups,
            s.rate,
            s.callers,
            s.keys,
            s.hot_keys,
            s.failure,
            s.sabotage.as_ref().map_or(String::new(), |x| format!(", **sabotaged: {x}**")),
            s.policies.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        );
        let _ = writeln!(md, "## By fault\n\n| fault | rounds | over | under | max unavailable ms |\n|---|---:|---:|---:|---:|");
        for (f, t) in &self.by_fault {
            let _ = writeln!(
                md,
                "| {f} | {} | {} | {} | {:.1} |",
                t.rounds, t.over_admitted_units, t.under_admitted_units, t.max_unavailable_ms
            );
        }
        let _ = writeln!(md, "\n## By limit kind\n\n| kind | keys | admitted by the store | over | under |\n|---|---:|---:|---:|---:|");
        for (k, t) in &self.by_kind {
            let _ = writeln!(
                md,
                "| {k} | {} | {} | {} | {} |",
                t.keys, t.admitted_units, t.over_admitted_units, t.under_admitted_units
            );
        }
        let _ = writeln!(md, "\n## Rounds\n\n| round | fault | group | lag ms | epoch | unavailable ms | recovered ms | over | under | fallback | unknown | no primary |\n|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in &self.rounds {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.2} | {}→{} | {:.1} | {} | {} | {} | {} | {} | {} |",
                r.round,
                r.fault,
                r.group,
                r.lag_ms,
                r.epoch_before,
                r.epoch_after,
                r.unavailable_ms,
                r.recovered_ms.map_or("never".into(), |m| format!("{m:.1}")),
                r.over_admitted_units,
                r.under_admitted_units,
                r.fallback_decisions,
                r.errors.outcome_unknown,
                r.errors.no_primary
            );
        }
        let _ = writeln!(
            md,
            "\n## Reading this report\n\n\
- **unavailable ms**: from the fault to the group's first verdict from the store for a call sent after the fault (from the new epoch's primary when there was a promotion). Calls in between got the failure policy's answer (*fallback*).\n\
- **over**: units the store admitted beyond what a correct limiter could have, judged from the recorded send and answer times of every call alone (never from the servers' counters), each time read in the server's favour. Sync mode promises 0.\n\
- **with fallback**: the same, counting what the local fallback admitted too (it decides without the store, with the policy's share of the limit).\n\
- **under**: denials a correct limiter would surely have admitted, counting every call that may have been applied (including those whose outcome is unknown).\n\
- **unknown**: calls sent to the store that got no answer (the store may have applied them); **no primary**: calls that found no primary to send to.\n"
        );
        if let Some(logs) = &s.node_logs {
            let _ = writeln!(md, "The nodes' logs: `{logs}`.");
        }
        md
    }

    /// drill.svg: on the left, decisions per second by source and errors
    /// (top), admissions over the limits and denials under them (bottom),
    /// a line at each fault; on the right, each round's unavailable window
    /// (a bar per round, coloured by fault) against the promotion delay.
    fn draw(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        use plotters::prelude::*;
        let root = SVGBackend::new(path, (1600, 640)).into_drawing_area();
        root.fill(&WHITE)?;
        let (timeline, per_round) = root.split_horizontally(1100);
        self.draw_rounds(&per_round)?;
        let (top, bottom) = timeline.split_vertically(400);
        let x_max = (self.bins.len() as f64 * self.bin_s).max(1.0);
        self.draw_decisions(&top, x_max)?;
        self.draw_admissions(&bottom, x_max)?;
        root.present()?;
        Ok(())
    }

    /// The top left panel: decisions per second by source, and errors, a
    /// line at each fault with its letter.
    fn draw_decisions<DB: plotters::prelude::DrawingBackend>(
        &self,
        area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
        x_max: f64,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        DB::ErrorType: 'static,
    {
        use plotters::prelude::*;
        let per_s = |v: u64| v as f64 / self.bin_s;
        let y_top = self
            .bins
            .iter()
            .map(|b| per_s(b.store_allowed + b.store_denied + b.fallback + b.errors))
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "sluice drill: {} mode, faults {} ({} rounds)",
                    self.setup.mode,
                    self.setup.fault,
                    self.rounds.len()
                ),
                ("sans-serif", 20),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_top)?;
        chart
            .configure_mesh()
            .y_desc("decisions / s")
            .x_desc("seconds")
            .draw()?;
        let series: [Series; 4] = [
            ("store: allowed", RGBColor(31, 119, 180), |b| {
                b.store_allowed
            }),
            ("store: denied", RGBColor(44, 160, 44), |b| b.store_denied),
            ("fallback", RGBColor(255, 127, 14), |b| b.fallback),
            ("errors / unknown", RGBColor(214, 39, 40), |b| b.errors),
        ];
        for (name, color, get) in series {
            chart
                .draw_series(LineSeries::new(
                    self.bins
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (i as f64 * self.bin_s, per_s(get(b)))),
                    color.stroke_width(2),
                ))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        for &(t, f) in &self.fault_marks {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(t, 0.0), (t, y_top)],
                BLACK.mix(0.35),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                mark(f),
                (t, y_top * 0.97),
                ("sans-serif", 12),
            )))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        Ok(())
    }

    /// The bottom left panel: units admitted over the limits and denied
    /// under them, per bin, a line at each fault.
    fn draw_admissions<DB: plotters::prelude::DrawingBackend>(
        &self,
        area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
        x_max: f64,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        DB::ErrorType: 'static,
    {
        use plotters::prelude::*;
        let y_bot = self
            .bins
            .iter()
            .map(|b| b.over.max(b.under) as f64)
            .fold(1.0, f64::max)
            * 1.2;
        let mut chart = ChartBuilder::on(area)
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_bot)?;
        chart
            .configure_mesh()
            .y_desc(format!("units per {:.2} s", self.bin_s))
            .x_desc("seconds (faults: K kill, P pause, X partition, H handover)")
            .draw()?;
        let series: [Series; 2] = [
            ("over the limits (store)", RGBColor(214, 39, 40), |b| b.over),
            ("under the limits", RGBColor(148, 103, 189), |b| b.under),
        ];
        for (name, color, get) in series {
            chart
                .draw_series(LineSeries::new(
                    self.bins
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (i as f64 * self.bin_s, get(b) as f64)),
                    color.stroke_width(2),
                ))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        for &(t, _) in &self.fault_marks {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(t, 0.0), (t, y_bot)],
                BLACK.mix(0.35),
            )))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        Ok(())
    }

    /// The per-round panel: one bar per round, its height the round's
    /// unavailable ms, its colour the fault; the promotion delay as a
    /// horizontal line (what a stall, a kill or a cut should cost).
    fn draw_rounds<DB: plotters::prelude::DrawingBackend>(
        &self,
        area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        DB::ErrorType: 'static,
    {
        use plotters::prelude::*;
        let n = self.rounds.len().max(1) as f64;
        let promote = self.setup.promote_after_ms.map(|ms| ms as f64);
        let y_max = self
            .rounds
            .iter()
            .map(|r| r.unavailable_ms)
            .chain(promote)
            .fold(1.0, f64::max)
            * 1.4; // the top for the legend
        let mut chart = ChartBuilder::on(area)
            .caption("unavailable ms per round", ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..n, 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc("unavailable ms")
            .x_desc("round")
            .draw()?;
        let mut faults: Vec<&'static str> = self.rounds.iter().map(|r| r.fault).collect();
        faults.sort_unstable();
        faults.dedup();
        for fault in faults {
            let color = fault_color(fault);
            chart
                .draw_series(self.rounds.iter().filter(|r| r.fault == fault).map(|r| {
                    let x = r.round as f64;
                    Rectangle::new(
                        [(x + 0.1, 0.0), (x + 0.9, r.unavailable_ms)],
                        color.filled(),
                    )
                }))?
                .label(fault)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        if let Some(ms) = promote {
            chart
                .draw_series(LineSeries::new([(0.0, ms), (n, ms)], BLACK.stroke_width(2)))?
                .label(format!("promotion delay ({ms:.0} ms)"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        Ok(())
    }
}

/// A fault's colour in the per-round panel.
fn fault_color(fault: &str) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    match fault {
        "kill" => RGBColor(214, 39, 40),
        "pause" => RGBColor(31, 119, 180),
        "partition" => RGBColor(255, 127, 14),
        "handover" => RGBColor(44, 160, 44),
        "etcd-down" => RGBColor(148, 103, 189),
        _ => RGBColor(140, 86, 75),
    }
}

/// The letter a fault is marked with in the picture.
fn mark(fault: &str) -> &'static str {
    match fault {
        "kill" => "K",
        "pause" => "P",
        "partition" => "X",
        _ => "H",
    }
}
