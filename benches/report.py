"""Writes BENCHMARKS.md from one run of benches/compare.sh.

Usage: report.py RESULTS.jsonl OUT.md SHARDS SLUICED_RSS_KB SCALE MEMORY.txt DEFAULT_SHARDS WORKDIR SNAPSHOT.jsonl
Every figure and ratio comes from RESULTS (this run); benches/notes.md (the
profile and what limits each figure) is appended as written.
"""
import datetime
import json
import os
import platform
import subprocess
import sys

results_path, out_path, shards, rss_kb, scale, memory_path, default_shards, work, snapshot_path = sys.argv[1:10]
rows = {}
with open(results_path) as f:
    for line in f:
        line = line.strip()
        if line:
            r = json.loads(line)
            rows[r["name"]] = r
# CPU time per decision of the processes named (compare.sh's cpu_row).
cpu_path = os.path.join(work, "cpu.jsonl")
cpu = {}
if os.path.exists(cpu_path):
    for line in open(cpu_path):
        r = json.loads(line)
        cpu[r["name"]] = r["cpu_us_per_decision"]


def get(name):
    return rows.get(name)


# redis-benchmark's 50 x 64 rows (Redis PING, Sluice's RESP CL.THROTTLE,
# the RESP floor's CL.THROTTLE) ran in three alternating rounds: the
# median round (by CL.THROTTLE / PING) stands for them.
_rounds = [(get(f"sluice-resp CL.THROTTLE c50 p64 r{i}"), get(f"redis PING c50 p64 r{i}"),
            get(f"floor-resp CL.THROTTLE c50 p64 r{i}")) for i in (1, 2, 3)]
if not all(all(r) for r in _rounds):
    sys.exit("report.py: a redis-benchmark 50 x 64 round is missing: compare.sh did not measure it")
resp_rounds = [s["ops_per_s"] / p["ops_per_s"] for s, p, _ in _rounds]
resp_floor_rounds = [s["ops_per_s"] / f["ops_per_s"] for s, _, f in _rounds]
floor_ping_rounds = [f["ops_per_s"] / p["ops_per_s"] for _, p, f in _rounds]
(rows["sluice-resp CL.THROTTLE c50 p64"], rows["redis PING c50 p64"],
 rows["floor-resp CL.THROTTLE c50 p64"]) = _rounds[sorted(range(3), key=lambda i: resp_rounds[i])[1]]


# The keyspace pair (1k keys, 10M keys) ran in three alternating rounds
# too: the median round (by 10M / 1k) stands for it.
# The floor's own pair (1k keys on the cache-resident floor, 10M on the
# 2^24-bucket one) ran in the same rounds.
_krounds = [(get(f"sluice 1k keys r{i}"), get(f"sluice 10M keys r{i}"),
             get(f"floor 1k keys r{i}"), get(f"floor 10M keys r{i}")) for i in (1, 2, 3)]
if not all(all(r) for r in _krounds):
    sys.exit("report.py: a keyspace round (1k or 10M keys, Sluice or floor) is missing: compare.sh did not measure it")
keyspace_rounds = [b["ops_per_s"] / a["ops_per_s"] for a, b, _, _ in _krounds]
floor_keyspace_rounds = [d["ops_per_s"] / c["ops_per_s"] for _, _, c, d in _krounds]
sluice_floor_10m_rounds = [b["ops_per_s"] / d["ops_per_s"] for _, b, _, d in _krounds]
(rows["sluice 1k keys"], rows["sluice 10M keys"], rows["floor 1k keys"],
 rows["floor 10M keys"]) = _krounds[sorted(range(3), key=lambda i: keyspace_rounds[i])[1]]

# Redis's SMISMEMBER of five members (CL.THROTTLE's command length and
# reply shape, Redis's cheapest way to answer it) in the same rounds.
_smis = [get(f"redis SMISMEMBER c50 p64 r{i}") for i in (1, 2, 3)]
if not all(_smis):
    sys.exit("report.py: a redis-benchmark SMISMEMBER round is missing: compare.sh did not measure it")
smis_ping_rounds = [m["ops_per_s"] / p["ops_per_s"] for m, (_, p, _) in zip(_smis, _rounds)]
sluice_smis_rounds = [s["ops_per_s"] / m["ops_per_s"] for m, (s, _, _) in zip(_smis, _rounds)]
rows["redis SMISMEMBER c50 p64"] = _smis[sorted(range(3), key=lambda i: resp_rounds[i])[1]]


def fmt_ops(x):
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def fmt_us(x):
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.0f} us"


def ratio(a, b):
    return a / b if b else float("nan")


def redis_version():
    try:
        return subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    except Exception:
        return "unknown"


out = []
w = out.append
w("# Benchmarks\n")
w("Produced by `bash benches/compare.sh` (do not edit by hand: rerun it). Every ratio is")
w("against Redis + Lua measured in the same run, on the same machine, by the same")
w("generator (`sluice bench`) with the same settings; redis-benchmark rows use")
w("redis-benchmark as the generator.\n")
w(f"- Run: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
  f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}; "
  f"redis-server {redis_version()}; sluiced with {shards} shards.")
w("- The load generator shares the cores with the server under test.")
w("- Limit: token bucket, 10/s with burst 100, keys `key:N` uniform over 100k keys")
w("  unless noted. Redis runs the usual token-bucket Lua script (HMGET, lazy refill,")
w("  HMSET, EXPIRE; reads TIME) via EVALSHA (`cli/src/bench/redis.rs`).")
if scale != "1":
    w(f"- **Quick run** (request counts divided by {scale}): figures are noisier.")
w("")
w("## Same generator, same settings\n")
w("| connections x pipeline | Sluice ops/s | p50 | p99 | Redis + Lua ops/s | p50 | p99 | throughput ratio | p99 ratio (Sluice / Redis) |")
w("|---|---|---|---|---|---|---|---|---|")
for c, p in [(50, 1), (50, 16), (50, 64), (1, 1)]:
    s, r = get(f"sluice c{c} p{p}"), get(f"redis-lua c{c} p{p}")
    if not s or not r:
        continue
    w(f"| {c} x {p} | {fmt_ops(s['ops_per_s'])} | {fmt_us(s['latency_us']['p50'])} | {fmt_us(s['latency_us']['p99'])} "
      f"| {fmt_ops(r['ops_per_s'])} | {fmt_us(r['latency_us']['p50'])} | {fmt_us(r['latency_us']['p99'])} "
      f"| **{ratio(s['ops_per_s'], r['ops_per_s']):.1f}x** | {ratio(s['latency_us']['p99'], r['latency_us']['p99']):.2f} |")
w("")


def admitted_share(row):
    """The share of a row's decisions that admitted, as text ("-" if none)."""
    decided = row.get("allowed", 0) + row.get("denied", 0) if row else 0
    return f"{100 * row['allowed'] / decided:.1f} %" if decided else "-"


main_rows = [get(f"{t} c{c} p{p}") for t in ["sluice", "redis-lua"] for c, p in [(50, 1), (50, 16), (50, 64), (1, 1)]]
if all(main_rows):
    allowed = sum(r["allowed"] for r in main_rows)
    decided = sum(r["allowed"] + r["denied"] for r in main_rows)
    w(f"Of these rows' decisions, {100 * allowed / decided:.1f} % admitted: a row asks at most 40 times a key,")
    w("within every key's burst of 100, so this is the cost of admitting (a denial writes nothing; the")
    w("spent workload below measures those).\n")
w("## The loopback floor\n")
w("`sluice-floor` (benches/src/bin/sluice-floor.rs): one thread that speaks just enough protocol v1")
w("(HELLO, THROTTLE and its reply, the same frame decoder, request parser and encoders) and decides")
w("with the real GCRA function on a 4,096-bucket array that stays in cache, driven by the same")
w("generator with the same settings in this run. What it leaves out (shards, a key table that grows,")
w("auth, limits, metrics, replication) is what the ratio measures; the generator shares the cores")
w("with both.\n")
w("| connections x pipeline | floor ops/s | p50 | p99 | Sluice ops/s | Sluice / floor |")
w("|---|---|---|---|---|---|")
floor_ratio = {}
for c, p in [(50, 1), (50, 16), (50, 64), (1, 1)]:
    s, f = get(f"sluice c{c} p{p}"), get(f"floor c{c} p{p}")
    if not f:
        sys.exit(f"report.py: no floor row for {c} x {p}: compare.sh did not measure it")
    if not s:
        continue
    floor_ratio[(c, p)] = ratio(s["ops_per_s"], f["ops_per_s"])
    w(f"| {c} x {p} | {fmt_ops(f['ops_per_s'])} | {fmt_us(f['latency_us']['p50'])} | {fmt_us(f['latency_us']['p99'])} "
      f"| {fmt_ops(s['ops_per_s'])} | **{floor_ratio[(c, p)]:.2f}** |")
w("")
fc, sc = cpu.get("floor c50 p64"), cpu.get("sluice c50 p64")
if fc and sc:
    w("The generator is the bottleneck for the floor as much as for Sluice here, so the server's own CPU")
    w(f"time per decision (from /proc, 50 x 64) says more: the floor {fc['server'] * 1000:.0f} ns, Sluice "
      f"{sc['primary'] * 1000:.0f} ns: floor / Sluice **{ratio(fc['server'], sc['primary']):.2f}**.\n")
w("### Workloads, one shard and the default shard count, against the floor\n")
w("50 connections, 100k keys. *Under the limit*: 1000/s, every bucket refilled when it is visited")
w("again (the usual state of a production client). *Spent*: 10/s, burst 100, as in the main rows.")
w(f"*10M keys*: the keyspace section's pre-filled 10M buckets (1/h, burst 100; each server filled), against")
w("the floor with a 2^24-bucket array (one cache line a key, a frame's buckets prefetched). Default")
w(f"shard count: {default_shards}, one per core, sharing the two cores with the generator.\n")
w("*Admitted*: the share of the requests that Sluice (one shard) and the floor admitted, which says whether")
w("the workload was what its name says (under the limit and spent: the floor's 4,096 buckets each take the")
w("traffic of about 24 keys).\n")
w("| workload | pipeline | floor ops/s | Sluice (1 shard) ops/s | / floor | admitted (Sluice / floor) | Sluice (default shards) ops/s | / floor |")
w("|---|---|---|---|---|---|---|---|")
workload_ratio = {}
workload_rounds = {}
for wname, label in [("under", "under the limit"), ("spent", "spent"), ("10M", "10M keys")]:
    for p in [1, 16, 64]:
        if wname == "10M":
            f = get(f"{wname} floor p{p}")
            s1 = get(f"{wname} sluice p{p}") or (get("sluice 10M keys") if p == 64 else None)
        else:
            # Three alternating rounds of the pair: the median round's.
            pairs = [(get(f"{wname} sluice p{p} r{i}"), get(f"{wname} floor p{p} r{i}")) for i in (1, 2, 3)]
            if not all(s and f for s, f in pairs):
                sys.exit(f"report.py: a {wname} round at pipeline {p} is missing: compare.sh did not measure it")
            xs = [ratio(s["ops_per_s"], f["ops_per_s"]) for s, f in pairs]
            workload_rounds[(label, p)] = xs
            s1, f = pairs[sorted(range(3), key=lambda i: xs[i])[1]]
        if not f or not s1:
            sys.exit(f"report.py: no {wname} row at pipeline {p}: compare.sh did not measure it")
        sd = get(f"{wname} sluice-default p{p}")
        workload_ratio[(wname, p)] = ratio(s1["ops_per_s"], f["ops_per_s"])
        dcells = f"{fmt_ops(sd['ops_per_s'])} | {ratio(sd['ops_per_s'], f['ops_per_s']):.2f}" if sd else "- | -"
        admitted = f"{admitted_share(s1)} / {admitted_share(f)}"
        w(f"| {label} | {p} | {fmt_ops(f['ops_per_s'])} | {fmt_ops(s1['ops_per_s'])} | **{workload_ratio[(wname, p)]:.2f}** | {admitted} | {dcells} |")
w("")
w("Under the limit and spent: three alternating rounds of Sluice (one shard) and the floor; each row is")
w("the round with the median ratio (the targets read it). Every round's ratio: "
  + "; ".join(f"{label} 50 x {p} " + ", ".join(f"{x:.2f}" for x in xs) for (label, p), xs in workload_rounds.items())
  + ".\n")
d64, d1 = get("sluice-default c50 p64"), get("sluice-default c50 p1")
if d64 and d1:
    w(f"Default shard count ({default_shards}, one per core) on the same machine, generator sharing the cores:\n")
    w("| connections x pipeline | ops/s | p50 | p99 |")
    w("|---|---|---|---|")
    for label, r in [("50 x 64", d64), ("50 x 1", d1)]:
        w(f"| {label} | {fmt_ops(r['ops_per_s'])} | {fmt_us(r['latency_us']['p50'])} | {fmt_us(r['latency_us']['p99'])} |")
    w("")
w("## redis-benchmark as the generator\n")
w("| what | ops/s | p50 | p99 | ratio to Redis + Lua (same connections x pipeline) |")
w("|---|---|---|---|---|")
for name, base in [("redis PING c50 p64", "redis-lua c50 p64"), ("redis PING c50 p1", "redis-lua c50 p1"),
                   ("sluice-resp CL.THROTTLE c50 p64", "redis-lua c50 p64"),
                   ("floor-resp CL.THROTTLE c50 p64", "redis-lua c50 p64"),
                   ("redis SMISMEMBER c50 p64", "redis-lua c50 p64"),
                   ("sluice-resp CL.THROTTLE c50 p1", "redis-lua c50 p1")]:
    r, b = get(name), get(base)
    if not r:
        continue
    rr = f"{ratio(r['ops_per_s'], b['ops_per_s']):.1f}x" if b else "-"
    w(f"| {name} | {fmt_ops(r['ops_per_s'])} | {fmt_us(r['latency_us']['p50'])} | {fmt_us(r['latency_us']['p99'])} | {rr} |")
w("")
w("50 x 64: three alternating rounds of PING, Sluice's CL.THROTTLE and the RESP floor's (sluice-floor")
w("--resp-port: the same RESP parser, command parse and reply encoder, a GCRA decision on a 4,096-bucket")
w("array); the rows above are the round whose CL.THROTTLE / PING is the median. Every round's")
w("Sluice / PING: " + ", ".join(f"{x:.2f}" for x in resp_rounds) + "; Sluice / RESP floor: "
  + ", ".join(f"{x:.2f}" for x in resp_floor_rounds) + "; RESP floor / PING: "
  + ", ".join(f"{x:.2f}" for x in floor_ping_rounds) + ". redis-benchmark spends about twice the CPU on")
w("a CL.THROTTLE (a key substituted, five integers parsed and freed) as on a PING, and shares the two")
w("cores with the server: the floor's row is the most this generator gets out of any server for this")
w("command.\n")
w("Redis's own answer of the same shape, `SMISMEMBER key:N 99 10 1 1` (a lookup that misses and an")
w("array of five integers, the command and reply CL.THROTTLE has), in the same rounds: SMISMEMBER /")
w("PING " + ", ".join(f"{x:.2f}" for x in smis_ping_rounds) + "; Sluice's CL.THROTTLE / Redis's SMISMEMBER "
  + ", ".join(f"{x:.2f}" for x in sluice_smis_rounds) + ". What PING measures that CL.THROTTLE cannot")
w("share is the generator's cheaper work on a one-line reply.\n")


def alone(mode, c, p):
    """The no-follower baseline of a replicated row: the same primary
    alone, just before its follower attached."""
    return get(f"sluice-alone-{mode} c{c} p{p}")


w("## Replication: the cost of a follower\n")
w("The same generator and settings against a primary (same shard count) whose")
w("follower runs on the same machine: three processes share the two cores.")
pinned_path = os.path.join(work, "pinned")
if os.path.exists(pinned_path):
    with open(pinned_path) as f:
        pinned = f.read().strip()
    w(f"Pinned ({pinned}; the generator unpinned), as a follower on a machine of its")
    w("own never takes the primary's core; the baselines are the same pinned primary. Ratios")
else:
    w("Unpinned (more than one shard, or one CPU). Ratios")
w("are to the same row against the same primary alone, measured right before its")
w("follower attached (so that the machine's drift over a run stays out of them). Lag: the follower's")
w("`lag_ms` (how far its newest SYNC is behind the primary's clock), sampled every")
w("20 ms during the 50 x 64 run by one `sluice role --json --every-ms 20` (a round")
w("trip a sample over one connection, charged to the replicated rows).\n")
w("| mode | connections x pipeline | ops/s | p50 | p99 | throughput / no follower | p50 added |")
w("|---|---|---|---|---|---|---|")
repl_ratio = {}
repl_rounds = {}


def median_round(mode, c, p):
    """The c x p pair (replicated, alone) whose ratio is the median of
    the rounds compare.sh measured, and every round's ratio."""
    pairs = [(get(f"sluice-{mode} c{c} p{p} r{i}"), get(f"sluice-alone-{mode} c{c} p{p} r{i}"))
             for i in (1, 2, 3)]
    pairs = [(r, b) for r, b in pairs if r and b]
    if not pairs:
        return None, None, []
    xs = [ratio(r["ops_per_s"], b["ops_per_s"]) for r, b in pairs]
    order = sorted(range(len(pairs)), key=lambda i: xs[i])
    r, b = pairs[order[len(order) // 2]]
    return r, b, xs


for mode in ["sync", "async"]:
    for c, p in [(50, 64), (50, 1), (1, 1)]:
        if c == 50:
            r, base, xs = median_round(mode, c, p)
            repl_rounds[(mode, p)] = xs
        else:
            r, base = get(f"sluice-{mode} c{c} p{p}"), alone(mode, c, p)
        if not r or not base:
            sys.exit(f"report.py: no {mode} replication row (or its baseline) at {c} x {p}: compare.sh did not measure it")
        x = ratio(r["ops_per_s"], base["ops_per_s"])
        repl_ratio[(mode, c, p)] = (x, r["latency_us"]["p50"] - base["latency_us"]["p50"])
        w(f"| {mode} | {c} x {p} | {fmt_ops(r['ops_per_s'])} | {fmt_us(r['latency_us']['p50'])} | {fmt_us(r['latency_us']['p99'])} "
          f"| **{x:.2f}** | {fmt_us(r['latency_us']['p50'] - base['latency_us']['p50'])} |")
w("")
if any(repl_rounds.values()):
    w("50 x 64 and 50 x 1: each of three rounds measures the primary alone, then with a")
    w("fresh follower attached; the row above is the round with the median ratio (and")
    w("its p50 added the one the target below reads). Every round's ratio: "
      + "; ".join(f"{m} 50 x {p} " + ", ".join(f"{x:.2f}" for x in xs)
                  for (m, p), xs in repl_rounds.items() if xs) + ".\n")
# The follower's acks during the 1 x 1 and 50 x 1 runs (compare.sh's
# acked_run): how long the replication link's round trip took, as the
# primary measured it (SYNC written to the ACK covering it).
acks = {}
acks_path = os.path.join(work, "acks.jsonl")
if os.path.exists(acks_path):
    for line in open(acks_path):
        if line.strip():
            r = json.loads(line)
            acks[r["name"]] = r
link_rtt = {}
w("What a sync reply waits for. A sync reply leaves after the follower's ACK of the SYNC that carried")
w("its decision: one more round trip over loopback (primary to follower and back, through both")
w("kernels and the follower's apply) on top of the client's. The primary measures that round trip")
w("(`sluice_replication_ack_seconds` on its admin port); *link round trip* is its mean over the run,")
w("*added* the run's mean latency minus the same primary's alone (the rows above; at 50 x 1 the")
w("median round). Async replies do not wait for it.\n")
w("| mode | connections x pipeline | mean alone | mean with follower | added | link round trip | acks | added - link round trip |")
w("|---|---|---|---|---|---|---|---|")
for mode in ["sync", "async"]:
    for c in [1, 50]:
        if c == 50:
            r, base, _ = median_round(mode, 50, 1)
        else:
            r, base = get(f"sluice-{mode} c1 p1"), alone(mode, 1, 1)
        a = acks.get(r["name"]) if r else None
        if not r or not base or not a or not a["acks"] or "mean" not in r["latency_us"]:
            sys.exit(f"report.py: no {mode} {c} x 1 mean latency or ack sample: compare.sh did not measure it")
        rtt = a["ack_s"] / a["acks"] * 1e6
        added = r["latency_us"]["mean"] - base["latency_us"]["mean"]
        link_rtt[(mode, c)] = (added, rtt)
        w(f"| {mode} | {c} x 1 | {fmt_us(base['latency_us']['mean'])} | {fmt_us(r['latency_us']['mean'])} | "
          f"{fmt_us(added)} | {fmt_us(rtt)} | {a['acks']:,} | {fmt_us(added - rtt)} |")
w("")
if any(name.startswith("sluice-alone-") for name in cpu):
    w("On two cores the generator, the primary and the follower compete for CPU, so")
    w("the throughput ratio above measures the machine as much as replication. The")
    w("cost itself, as CPU time per decision (from /proc, 50 x 64 runs, the mean of")
    w("the three rounds; each mode's primary alone right before):\n")
    w("| setup | primary CPU per decision | follower CPU per decision | primary CPU / no follower |")
    w("|---|---|---|---|")
    def cpu_mean(name, who):
        """CPU a decision of `who` in row `name`, the mean over its rounds."""
        rows = [cpu[f"{name} r{i}"] for i in (1, 2, 3) if f"{name} r{i}" in cpu]
        vals = [r[who] for r in rows if who in r]
        return sum(vals) / len(vals) if vals else None

    for mode in ["sync", "async"]:
        base_cpu = cpu_mean(f"sluice-alone-{mode} c50 p64", "primary")
        if not base_cpu:
            continue
        w(f"| {mode} primary alone | {base_cpu * 1000:.0f} ns | - | 1.00 |")
        primary = cpu_mean(f"sluice-{mode} c50 p64", "primary")
        if primary:
            follower = cpu_mean(f"sluice-{mode} c50 p64", "follower") or 0
            w(f"| {mode} | {primary * 1000:.0f} ns | {follower * 1000:.0f} ns | **{primary / base_cpu:.2f}** |")
    w("")
lags = {}
for mode in ["sync", "async"]:
    path = os.path.join(work, f"lag-{mode}.jsonl")
    if os.path.exists(path):
        vals = []
        for line in open(path):
            try:
                vals.append(float(json.loads(line)["lag_ms"]))
            except (ValueError, KeyError, TypeError):
                pass  # a sample cut short when the sampler was stopped
        vals.sort()
        if vals:
            lags[mode] = (vals[len(vals) // 2], vals[min(len(vals) - 1, int(len(vals) * 0.99))], len(vals))
if lags:
    w("| mode | lag p50 | lag p99 | samples |")
    w("|---|---|---|---|")
    for mode, (p50, p99, n) in lags.items():
        w(f"| {mode} | {p50:.2f} ms | {p99:.2f} ms | {n} |")
    w("")
repl_path = os.path.join(work, "replication.jsonl")
if os.path.exists(repl_path):
    w("Stream volume: SYNC payload bytes the primary sent per decision. *Under limits*:")
    w("1M distinct keys at 1000/s (every decision writes a bucket); *hot*: 100 keys at")
    w("10/s, burst 100, driven far over their limits (denials change nothing, the rest")
    w("coalesce per drain).\n")
    w("| mode | workload | decisions | records | bytes | bytes per decision |")
    w("|---|---|---|---|---|---|")
    for line in open(repl_path):
        r = json.loads(line)
        w(f"| {r['mode']} | {r['workload']} | {r['decisions']:,} | {r['records']:,} | {r['bytes']:,} | **{r['bytes'] / r['decisions']:.1f}** |")
    w("")

sync_path = os.path.join(work, "fullsync.jsonl")
if os.path.exists(sync_path):
    phases = [json.loads(l) for l in open(sync_path) if l.strip()]
    done = [p for p in phases if p.get("phase") == "sync"]
    if done:
        d = done[0]
        w("## Full sync of a large table\n")
        w(f"A new follower took the full sync of the primary's {d['keys']:,}-key table (the 10M")
        w(f"keyspace run's) in **{d['seconds']:.1f} s**, while load (50 x 16, 100k keys) ran")
        w("against the primary in one-second slices; the shard reads 8,192 slots per step and")
        w("serves between steps.\n")
        w("| load slices | ops/s | p50 | p99 |")
        w("|---|---|---|---|")
        for phase in ("before", "during", "after"):
            sl = [p for p in phases if p.get("phase") == phase]
            if not sl:
                continue
            ops = sorted(p["ops_per_s"] for p in sl)
            p50 = sorted(p["latency_us"]["p50"] for p in sl)
            p99 = sorted(p["latency_us"]["p99"] for p in sl)
            mid = len(sl) // 2
            label = f"{phase} ({len(sl)} s)" if len(sl) > 1 else phase
            worst = f" (worst second {fmt_us(p99[-1])})" if len(sl) > 1 else ""
            w(f"| {label} | {fmt_ops(ops[mid])} | {fmt_us(p50[mid])} | {fmt_us(p99[mid])}{worst} |")
        w("\nFor slices of more than a second, the median second is shown.\n")

w("## Keyspace size (Sluice, 50 x 64)\n")
k1, k10 = get("sluice 1k keys"), get("sluice 10M keys")
if k1 and k10:
    w("| keys | ops/s | p50 | p99 |")
    w("|---|---|---|---|")
    for label, r in [("1k", k1), ("10M (pre-filled, buckets persist)", k10)]:
        w(f"| {label} | {fmt_ops(r['ops_per_s'])} | {fmt_us(r['latency_us']['p50'])} | {fmt_us(r['latency_us']['p99'])} |")
    w(f"\n10M / 1k throughput: **{ratio(k10['ops_per_s'], k1['ops_per_s']):.2f}** (the median of three "
      "alternating rounds, 1k keys on a fresh node of the same shard count, 10M on the filled one; every "
      "round's: " + ", ".join(f"{x:.2f}" for x in keyspace_rounds) + "); "
      f"sluiced RSS after the 10M runs: {int(rss_kb) / 1024:.0f} MiB.\n")
    f1, f10 = get("floor 1k keys"), get("floor 10M keys")
    w("The floor in the same rounds (1k keys on the cache-resident floor, 10M on the one with a 2^24-bucket")
    w("array: one cache line a key, prefetched a frame ahead of its decisions, no probing, no growth):\n")
    w("| keys | floor ops/s | Sluice ops/s | Sluice / floor |")
    w("|---|---|---|---|")
    for label, f, s_ in [("1k", f1, k1), ("10M", f10, k10)]:
        w(f"| {label} | {fmt_ops(f['ops_per_s'])} | {fmt_ops(s_['ops_per_s'])} | **{ratio(s_['ops_per_s'], f['ops_per_s']):.2f}** |")
    w(f"\nThe floor's own 10M / 1k: **{ratio(f10['ops_per_s'], f1['ops_per_s']):.2f}** (every round's: "
      + ", ".join(f"{x:.2f}" for x in floor_keyspace_rounds) + "); Sluice / floor at 10M keys, every round's: "
      + ", ".join(f"{x:.2f}" for x in sluice_floor_10m_rounds) + ". What 10M keys cost a server that does")
    w("nothing but decide is this machine's memory latency (a random access into 512 MiB under nested paging):")
    w(f"the floor keeps {ratio(f10['ops_per_s'], f1['ops_per_s']):.2f} of its 1k-key throughput at 10M keys, "
      f"Sluice {ratio(k10['ops_per_s'], k1['ops_per_s']):.2f} of its own.\n")

w("## Memory: bytes per token-bucket bucket\n")
w("RSS growth of the server process divided by distinct keys, each key spent once")
w("(1/h, burst 10, so no bucket refills during the run); a fresh process each.\n")
w("| server | keys | RSS before | RSS after | bytes per bucket |")
w("|---|---|---|---|---|")
mem = []
with open(memory_path) as f:
    for line in f:
        who, n, before, after = line.split()
        n, before, after = int(n), int(before), int(after)
        per = (after - before) * 1024 / n
        mem.append((who, n, per))
        w(f"| {'Sluice' if who == 'sluice' else 'Redis + Lua (hash per bucket)'} | {n:,} | {before / 1024:.0f} MiB | {after / 1024:.0f} MiB | **{per:.0f}** |")
w("")
w("## Snapshots: write, load, and decisions while one is written\n")
w("The same pre-filled nodes (one shard, every bucket spent): the snapshot written at")
w("SIGTERM and loaded at the next start (`snapshot written` / `snapshot loaded` log lines),")
w("then, at the largest size, decision latency (8 connections, one request at a time, random")
w("keys, 12 s) on a node writing no snapshot and on the same node writing one every 2 s.\n")
snaps = [json.loads(l) for l in open(snapshot_path) if l.strip()]
if not snaps:
    sys.exit("report.py: no snapshot rows: compare.sh did not measure them")
w("| buckets | file | written in | of which the shard's walk | loaded in |")
w("|---|---|---|---|---|")
for r in snaps:
    walk = f"{r['collect_ms']:,} ms" if r.get("collect_ms") is not None else "n/a"
    w(f"| {r['keys']:,} | {r['bytes'] / 2**20:.0f} MiB | {r['write_ms']:,} ms | {walk} | {r['load_ms']:,} ms |")
w("")
for r in snaps:
    if r["quiet"] and r["busy"]:
        q, b = r["quiet"]["latency_us"], r["busy"]["latency_us"]
        qo, bo = r["quiet"]["ops_per_s"], r["busy"]["ops_per_s"]
        w(f"| {r['keys']:,} buckets | decisions/s | p50 | p99 | p99.9 | max |")
        w("|---|---|---|---|---|---|")
        w(f"| no snapshot | {qo:,.0f} | {fmt_us(q['p50'])} | {fmt_us(q['p99'])} | {fmt_us(q['p999'])} | {fmt_us(q['max'])} |")
        w(f"| a snapshot every 2 s ({r['written']} written) | {bo:,.0f} | {fmt_us(b['p50'])} | {fmt_us(b['p99'])} | {fmt_us(b['p999'])} | {fmt_us(b['max'])} |")
        w(f"\nWhile snapshots are written / without: p99 **{ratio(b['p99'], q['p99']):.2f}**, "
          f"max **{ratio(b['max'], q['max']):.2f}**, decisions per second **{ratio(bo, qo):.2f}**. "
          "With a snapshot every 2 s of 10M buckets, one is being written about half the time; on "
          "this 2-core machine the walk and the file write share the cores with the shard and the "
          "load generator, which is what the throughput ratio shows. A stall would show in max.\n")
w("## Targets (from this run)\n")
w("| target | measured | met |")
w("|---|---|---|")


def target(label, value, ok):
    w(f"| {label} | {value} | {'yes' if ok else '**no**'} |")


s64, r64, ping64 = get("sluice c50 p64"), get("redis-lua c50 p64"), get("redis PING c50 p64")
s1, r1 = get("sluice c50 p1"), get("redis-lua c50 p1")
resp64 = get("sluice-resp CL.THROTTLE c50 p64")
if s64 and r64:
    x = ratio(s64["ops_per_s"], r64["ops_per_s"])
    target("binary, 50 x 64: >= 15x Redis + Lua", f"{x:.1f}x", x >= 15)
if s64 and ping64:
    x = ratio(s64["ops_per_s"], ping64["ops_per_s"])
    target("binary, 50 x 64: >= Redis PING at 50 x 64", f"{x:.2f}x PING", x >= 1)
if s1 and r1:
    x = ratio(s1["ops_per_s"], r1["ops_per_s"])
    target("binary, 50 x 1: >= 1.5x Redis + Lua", f"{x:.1f}x", x >= 1.5)
    y = ratio(s1["latency_us"]["p99"], r1["latency_us"]["p99"])
    target("binary, 50 x 1: p99 <= 0.5x Redis + Lua's", f"{y:.2f}x", y <= 0.5)
if resp64 and r64:
    x = ratio(resp64["ops_per_s"], r64["ops_per_s"])
    target("RESP CL.THROTTLE (redis-benchmark), 50 x 64: >= 5x Redis + Lua", f"{x:.1f}x", x >= 5)
if resp64 and ping64:
    x = ratio(resp64["ops_per_s"], ping64["ops_per_s"])
    target("RESP CL.THROTTLE (redis-benchmark), 50 x 64: >= 0.8 of Redis PING", f"{x:.2f}", x >= 0.8)
rfloor64 = get("floor-resp CL.THROTTLE c50 p64")
if resp64 and rfloor64:
    x = ratio(resp64["ops_per_s"], rfloor64["ops_per_s"])
    target("RESP CL.THROTTLE (redis-benchmark), 50 x 64: >= 0.8 of the RESP floor's CL.THROTTLE",
           f"{x:.2f} (floor / PING {ratio(rfloor64['ops_per_s'], ping64['ops_per_s']):.2f})", x >= 0.8)
if k1 and k10:
    x = ratio(k10["ops_per_s"], k1["ops_per_s"])
    f1, f10 = get("floor 1k keys"), get("floor 10M keys")
    fx = ratio(f10["ops_per_s"], f1["ops_per_s"])
    target("10M keys within 20% of 1k keys", f"{x:.2f} (the floor's own: {fx:.2f})", x >= 0.8)
    y = ratio(k10["ops_per_s"], f10["ops_per_s"])
    target("10M keys: >= 0.8 of the floor at 10M keys", f"{y:.2f}", y >= 0.8)
if resp64 and get("redis SMISMEMBER c50 p64"):
    x = ratio(resp64["ops_per_s"], get("redis SMISMEMBER c50 p64")["ops_per_s"])
    target("RESP CL.THROTTLE (redis-benchmark), 50 x 64: >= Redis's SMISMEMBER (same reply shape)", f"{x:.2f}x", x >= 1)
if ("async", 50, 64) in repl_ratio:
    x = repl_ratio[("async", 50, 64)][0]
    target("async replication, 50 x 64: >= 0.8 of no follower", f"{x:.2f}", x >= 0.8)
if ("sync", 50, 64) in repl_ratio:
    x = repl_ratio[("sync", 50, 64)][0]
    target("sync replication, 50 x 64: >= 0.6 of no follower", f"{x:.2f}", x >= 0.6)
one = alone("sync", 1, 1)
if ("sync", 1) in link_rtt:
    # What sync can remove at all: its own round trip is the follower's to
    # make; beyond it a reply pays the SYNC's write and the ACK's read on the
    # primary's thread (two system calls and two task wake-ups, a few us).
    added, rtt = link_rtt[("sync", 1)]
    target("sync replication, 1 x 1: mean added <= the replication link's own round trip + 5 us",
           f"{fmt_us(added)} vs {fmt_us(rtt)} + 5 us", added <= rtt + 5)
for c in [50, 1]:
    if ("sync", c, 1) in repl_ratio and one:
        added = repl_ratio[("sync", c, 1)][1]
        target(f"sync replication, {c} x 1: p50 added <= one loopback round trip (the 1 x 1 p50)",
               f"{fmt_us(added)} vs {fmt_us(one['latency_us']['p50'])}", added <= one["latency_us"]["p50"])
for who, n, per in mem:
    if who == "sluice":
        target(f"bytes per token bucket at {n:,} keys <= 32", f"{per:.0f}", per <= 32)
for wname, label in [("under", "under the limit"), ("spent", "spent")]:
    for p, want in [(64, 0.75), (16, 0.85), (1, 0.9)]:
        if (wname, p) in workload_ratio:
            x = workload_ratio[(wname, p)]
            target(f"one shard, {label}, 50 x {p}: >= {want} of the loopback floor", f"{x:.2f}", x >= want)
w("")
# The priority scenario's section, from its own script (benches/priority.sh).
priority = os.path.join(os.path.dirname(os.path.abspath(__file__)), "priority.md")
if os.path.exists(priority):
    with open(priority) as f:
        w(f.read())
# The rate limit service's section, from its own script (benches/rls.sh).
rls = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rls.md")
if os.path.exists(rls):
    with open(rls) as f:
        w(f.read())
# ... and its runs at a set shard count (RLS_SHARDS=N bash benches/rls.sh).
import glob
for variant in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rls-shards-*.md"))):
    with open(variant) as f:
        w(f.read())
# Every node an entry point's section, from its own script (benches/entry.sh).
entry = os.path.join(os.path.dirname(os.path.abspath(__file__)), "entry.md")
if os.path.exists(entry):
    with open(entry) as f:
        w(f.read())
notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notes.md")
if os.path.exists(notes):
    with open(notes) as f:
        w(f.read())
with open(out_path, "w") as f:
    f.write("\n".join(out) + "\n")
