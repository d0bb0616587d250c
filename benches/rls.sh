#!/usr/bin/env bash
# Envoy's rate limit service against its gRPC floor (issues 14 and 39),
# one command. Three servers, started alike and measured in alternating
# rounds by the same generators:
#
#  - sluiced --rls-port (default shards, --rls-threads T);
#  - sluice-rls-floor (benches/src/bin/sluice-rls-floor.rs): tonic and
#    envoy-types on the same runtime setup and HTTP/2 settings, answering
#    every ShouldRateLimit OK at once, a status per descriptor: the floor
#    issue 39's targets read;
#  - sluice-rls-floor --stack h2: the same answers on HTTP/2 directly,
#    the stack sluiced serves the port with (server/src/rls/http2.rs).
#    Sluice's ratio to it is what its rules, decisions and shards cost.
#
# Generators: sluice-rls-bench (a tonic client, 50 streams over 4
# connections) and h2load (nghttp2's, -c 4 -m 50, one prepared body: the
# hot descriptor only, since its body cannot vary). Scenarios: `hot` (one
# descriptor value, over its limit most of the time), `100k` (100,000
# values, each under its limit), `4desc` (4 descriptors a call, from the
# 100,000). T = 0 (the shard threads), 1 and 2 (this machine's cores). Each run reports calls/s,
# p50/p99 (sluice-rls-bench) and the server's CPU per call (utime + stime
# from /proc over the run).
#
# The Redis baseline, as before: Redis doing the work envoyproxy/ratelimit
# asks of it for a call (INCRBY and EXPIRE pipelined, one round trip),
# redis-benchmark with 50 connections, -P 2, random keys. Redis's share
# alone: envoyproxy/ratelimit's own gRPC server and Go code come on top.
#
# Writes benches/rls.md and puts that section into BENCHMARKS.md
# (benches/report.py includes it when compare.sh rewrites the file).
#
# Usage: bash benches/rls.sh
# Environment: SECONDS_PER_RUN (5), ROUNDS (3), THREADS ("0 1 2"; 0 serves the
# service on the shard threads, against a floor of as many threads),
# OUT (benches/rls.md), PORT (7795), RLS_PORT (7796), REDIS_PORT (7797),
# FLOOR_PORT (7798), FLOOR2_PORT (7799).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN_S=${SECONDS_PER_RUN:-5}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-"0 1 2"}
PORT=${PORT:-7795}
RLS_PORT=${RLS_PORT:-7796}
REDIS_PORT=${REDIS_PORT:-7797}
FLOOR_PORT=${FLOOR_PORT:-7798}
FLOOR2_PORT=${FLOOR2_PORT:-7799}
# RLS_SHARDS=N: sluiced --shards N (default: its own, the cores), written
# to benches/rls-shards-N.md, a section of its own.
RLS_SHARDS=${RLS_SHARDS:-}
if [ -n "$RLS_SHARDS" ]; then
  OUT=${OUT:-$ROOT/benches/rls-shards-$RLS_SHARDS.md}
else
  OUT=${OUT:-$ROOT/benches/rls.md}
fi
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
SLUICED=$ROOT/target/release/sluiced
FLOOR=$ROOT/target/release/sluice-rls-floor
BENCH=$ROOT/target/release/sluice-rls-bench
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)"; exit 1; }
command -v h2load >/dev/null || { echo "h2load is needed (apt-get install nghttp2-client)"; exit 1; }

# h2load's body: one length-prefixed RateLimitRequest (domain "bench", one
# descriptor (remote_address, "hot"), hits_addend 1), encoded by hand.
python3 - "$WORK/body.bin" <<'PY'
import sys
def field(num, wire, payload):
    key = bytes([(num << 3) | wire])
    if wire == 2:
        return key + bytes([len(payload)]) + payload
    return key + payload
entry = field(1, 2, b"remote_address") + field(2, 2, b"hot")
descriptor = field(1, 2, entry)
request = field(1, 2, b"bench") + field(2, 2, descriptor) + field(3, 0, bytes([1]))
open(sys.argv[1], "wb").write(b"\0" + len(request).to_bytes(4, "big") + request)
PY

: >"$WORK/runs.jsonl"

# run SERVER PID PORT THREADS ROUND SCENARIO GENERATOR
run() {
  local server=$1 pid=$2 port=$3 threads=$4 round=$5 scenario=$6 gen=$7 t0 t1
  t0=$(cpu_ticks "$pid")
  if [ "$gen" = h2load ]; then
    local n
    n=$(python3 -c "print(int(30000 * $RUN_S))")
    h2load -n "$n" -c 4 -m 50 -H 'content-type: application/grpc' -H 'te: trailers' \
      -d "$WORK/body.bin" "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
      >"$WORK/h2load.txt" 2>&1
    python3 - "$WORK/h2load.txt" >"$WORK/run.json" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read()
rps = float(re.search(r"finished in [^,]+, ([\d.]+) req/s", t).group(1))
done = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", t).group(2))
total = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", t).group(1))
secs = done / rps if rps else 0
print(json.dumps({"calls": done, "calls_per_s": rps, "seconds": secs, "failed": total - done}))
PY
  else
    local keys=100000 desc=1
    [ "$scenario" = hot ] && keys=1
    [ "$scenario" = 4desc ] && desc=4
    "$BENCH" --addr "127.0.0.1:$port" --domain bench --streams 50 --connections 4 \
      --seconds "$RUN_S" --keys "$keys" --descriptors "$desc" >"$WORK/run.json"
  fi
  t1=$(cpu_ticks "$pid")
  python3 - "$WORK/run.json" "$server" "$threads" "$round" "$scenario" "$gen" "$((t1 - t0))" "$TCK" >>"$WORK/runs.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
server, threads, rnd, scenario, gen, ticks, tck = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]), int(sys.argv[8])
r.update(server=server, threads=threads, round=rnd, scenario=scenario, gen=gen,
         cpu_us_per_call=ticks / tck * 1e6 / max(r["calls"], 1))
print(json.dumps(r))
PY
  tail -n 1 "$WORK/runs.jsonl" | cut -c1-220
}

SHARDS=
for threads in $THREADS; do
  echo "== --rls-threads $threads"
  "$SLUICED" --bind 127.0.0.1 --port "$PORT" --rls-port "$RLS_PORT" --rls-threads "$threads" \
    ${RLS_SHARDS:+--shards "$RLS_SHARDS"} \
    --rls-config "$WORK/bench.yaml" >"$WORK/sluiced.log" 2>&1 &
  SPID=$!; PIDS+=($SPID)
  wait_line "$WORK/sluiced.log" "rls listening"
  SHARDS=$(sed -n 's/.*shards=\([0-9]*\).*/\1/p' "$WORK/sluiced.log" | head -1)
  # --rls-threads 0 serves on the shard threads: the floor gets as many.
  floor_threads=$threads
  [ "$threads" = 0 ] && floor_threads=$SHARDS
  "$FLOOR" --port "$FLOOR_PORT" --threads "$floor_threads" >"$WORK/floor.log" 2>&1 &
  FPID=$!; PIDS+=($FPID)
  wait_line "$WORK/floor.log" "listening"
  "$FLOOR" --port "$FLOOR2_PORT" --threads "$floor_threads" --stack h2 >"$WORK/floor2.log" 2>&1 &
  F2PID=$!; PIDS+=($F2PID)
  wait_line "$WORK/floor2.log" "listening"
  # Warm-up: connections, the table's first growth.
  "$BENCH" --addr "127.0.0.1:$RLS_PORT" --domain bench --seconds 1 >/dev/null
  "$BENCH" --addr "127.0.0.1:$FLOOR_PORT" --domain bench --seconds 1 >/dev/null
  "$BENCH" --addr "127.0.0.1:$FLOOR2_PORT" --domain bench --seconds 1 >/dev/null
  for round in $(seq 1 "$ROUNDS"); do
    for scenario in hot 100k 4desc; do
      for gen in sluice-rls-bench h2load; do
        [ "$gen" = h2load ] && [ "$scenario" != hot ] && continue
        run floor "$FPID" "$FLOOR_PORT" "$threads" "$round" "$scenario" "$gen"
        run sluice "$SPID" "$RLS_PORT" "$threads" "$round" "$scenario" "$gen"
        run floor-h2 "$F2PID" "$FLOOR2_PORT" "$threads" "$round" "$scenario" "$gen"
      done
    done
  done
  kill "$SPID" "$FPID" "$F2PID"; wait "$SPID" "$FPID" "$F2PID" 2>/dev/null || true
  PIDS=()
done

echo "== redis-server: INCRBY + EXPIRE's round trip (redis-benchmark -P 2), 50 connections"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
RPID=$!; PIDS+=($RPID)
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
# Redis's own CPU over the run, as the servers' above: 1,000,000 commands.
r0=$(cpu_ticks "$RPID")
redis-benchmark -p "$REDIS_PORT" -c 50 -P 2 -n 1000000 -r 100000 --csv \
  INCRBY 'rl:__rand_int__' 1 | tee "$WORK/redis.csv"
r1=$(cpu_ticks "$RPID")

python3 - "$WORK/runs.jsonl" "$WORK/redis.csv" "$OUT" "$SHARDS" "$RUN_S" "$ROUNDS" "$RLS_SHARDS" "$((r1 - r0))" "$TCK" <<'PY'
import csv, json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
rows = list(csv.reader(open(sys.argv[2])))
col = {h: i for i, h in enumerate(rows[0])}
redis_calls = float(rows[1][col["rps"]]) / 2  # INCRBY and EXPIRE: two commands a call
# Redis's CPU a call (two commands) over the 1,000,000 commands.
redis_cpu_us = int(sys.argv[8]) / int(sys.argv[9]) * 1e6 / 500_000
out, shards, run_s, rounds = sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
def median_round(threads, scenario, gen):
    """The round whose Sluice / floor CPU ratio is the median."""
    pairs = []
    for rnd in range(1, rounds + 1):
        f = [r for r in runs if (r["server"], r["threads"], r["round"], r["scenario"], r["gen"]) == ("floor", threads, rnd, scenario, gen)]
        s = [r for r in runs if (r["server"], r["threads"], r["round"], r["scenario"], r["gen"]) == ("sluice", threads, rnd, scenario, gen)]
        h = [r for r in runs if (r["server"], r["threads"], r["round"], r["scenario"], r["gen"]) == ("floor-h2", threads, rnd, scenario, gen)]
        if f and s:
            pairs.append((f[0]["cpu_us_per_call"] / s[0]["cpu_us_per_call"], f[0], s[0], h[0] if h else None))
    pairs.sort(key=lambda p: p[0])
    return pairs[len(pairs) // 2], [p[0] for p in pairs], [p[3]["cpu_us_per_call"] / p[2]["cpu_us_per_call"] for p in pairs if p[3]]
lines = []
w = lines.append
plural = lambda n: "%s shard%s" % (n, "" if str(n) == "1" else "s")
w("## Envoy's rate limit service (gRPC)" + (", " + plural(sys.argv[7]) if sys.argv[7] else ""))
w("")
w("From `bash benches/rls.sh` (%d alternating rounds of %s s runs; this machine's 2 cores run "
  "the server and the generator both). *Floor*: `sluice-rls-floor`, tonic and envoy-types on "
  "the service's runtime setup and HTTP/2 settings, answering OK at once: the floor issue 39's "
  "targets read. *h2 floor*: the same answers from `sluice-rls-floor --stack h2`, on HTTP/2 "
  "directly, the stack sluiced serves the port with (server/src/rls/http2.rs); Sluice's ratio "
  "to it is what its own work costs. *Sluice*: `sluiced "
  "--rls-port` on %s, the rules of one descriptor (remote_address, 1,000 a second). "
  "Scenarios: *hot*, one value (over its limit most of the time); *100k*, 100,000 values each "
  "under its limit; *4desc*, 4 descriptors a call. Generators: `sluice-rls-bench` (50 streams "
  "over 4 connections) and h2load (`-c 4 -m 50`, one prepared body: hot only). *CPU per call*: "
  "the server's utime + stime from /proc over the run. Each row is the round with the median "
  "floor / Sluice CPU ratio; all rounds' ratios follow it." % (rounds, run_s, plural(shards)))
w("")
w("| rls-threads | scenario | generator | floor calls/s | Sluice calls/s | calls/s, Sluice / floor | floor p50 / p99 | Sluice p50 / p99 | floor CPU/call | Sluice CPU/call | **CPU, floor / Sluice** (all rounds) | h2 floor CPU/call | CPU, h2 floor / Sluice (all rounds) |")
w("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
med = {}
threads_seen = sorted({r["threads"] for r in runs})
label = lambda t: "on the shard threads" if t == 0 else "%d thread(s)" % t
for threads in threads_seen:
    for scenario in ["hot", "100k", "4desc"]:
        for gen in ["sluice-rls-bench", "h2load"]:
            try:
                (ratio, f, s, h), all_r, all_h = median_round(threads, scenario, gen)
            except IndexError:
                continue
            med[(threads, scenario, gen)] = (ratio, f, s)
            p99 = lambda r: ("%d / %d us" % (r["p50_us"], r["p99_us"])) if "p99_us" in r else "-"
            w("| %d | %s | %s | %s | %s | %.2f | %s | %s | %.1f us | %.1f us | **%.2f** (%s) | %s | %s |" % (
                threads, scenario, gen, f"{f['calls_per_s']:,.0f}", f"{s['calls_per_s']:,.0f}",
                s["calls_per_s"] / f["calls_per_s"], p99(f), p99(s), f["cpu_us_per_call"],
                s["cpu_us_per_call"], ratio, ", ".join("%.2f" % x for x in all_r),
                "%.1f us" % h["cpu_us_per_call"] if h else "-",
                ("%.2f (%s)" % (h["cpu_us_per_call"] / s["cpu_us_per_call"], ", ".join("%.2f" % x for x in all_h))) if h else "-"))
w("")
one = med.get((1, "100k", "sluice-rls-bench"))
four = med.get((1, "4desc", "sluice-rls-bench"))
at_100k = [v for k, v in med.items() if k[1] == "100k" and k[2] == "sluice-rls-bench"]
best = max((v[2]["calls_per_s"] for v in at_100k), default=0)
best_floor = max((v[1]["calls_per_s"] for v in at_100k), default=0)
least_cpu = min((v[2]["cpu_us_per_call"] for v in at_100k), default=0)
least_floor_cpu = min((v[1]["cpu_us_per_call"] for v in at_100k), default=0)
w("| target (issue 39, median round) | measured | |")
w("|---|---|---|")
def row(name, value, ok):
    w("| %s | %s | %s |" % (name, value, "met" if ok else "**not met**"))
for (threads, scenario, gen), (ratio, f, s) in sorted(med.items()):
    if scenario in ("hot", "100k"):
        row("CPU per call >= 0.8 of the floor's: %s, %s, %s" % (label(threads), scenario, gen), "%.2f" % ratio, ratio >= 0.8)
for (threads, scenario, gen), (ratio, f, s) in sorted(med.items()):
    if scenario in ("hot", "100k"):
        r = s["calls_per_s"] / f["calls_per_s"]
        row("calls/s >= 0.8 of the floor's: %s, %s, %s" % (label(threads), scenario, gen), "%.2f" % r, r >= 0.8)
        if "p99_us" in s:
            p = s["p99_us"] / max(f["p99_us"], 1)
            row("p99 <= 1.5x the floor's: %s, %s" % (label(threads), scenario), "%.2fx" % p, p <= 1.5)
hot_h2 = [v for k, v in med.items() if k[1] == "hot" and k[2] == "h2load"]
best_h2 = max((v[2]["calls_per_s"] for v in hot_h2), default=0)
best_h2_floor = max((v[1]["calls_per_s"] for v in hot_h2), default=0)
row("calls/s >= 3x Redis's INCRBY + EXPIRE (%s calls/s)" % f"{redis_calls:,.0f}",
    "%.2fx (best thread count, 100k; the floor %.2fx); h2load, hot: %.2fx (the floor %.2fx)" % (
        best / redis_calls, best_floor / redis_calls, best_h2 / redis_calls, best_h2_floor / redis_calls),
    best >= 3 * redis_calls)
if one and four:
    c = four[2]["cpu_us_per_call"] / one[2]["cpu_us_per_call"]
    row("4 descriptors a call cost <= 2x one (CPU per call, 1 thread)", "%.2fx" % c, c <= 2)
w("")
w("On two shared cores the generator competes with the server, so calls/s here are the "
  "machine's as much as the server's; CPU per call is the figure that does not depend on "
  "who else runs. The Redis baseline is only the Redis round trip envoyproxy/ratelimit makes "
  "per descriptor: its gRPC server and Go code come on top (it could not be built here: "
  "Debian's Go is 1.19 and no Go module proxy is reachable). Redis's own CPU a call "
  "(INCRBY and EXPIRE, two commands pipelined two at a time by redis-benchmark): %.1f us; "
  "at 100k the floor's least %.1f us, Sluice's %.1f us." % (redis_cpu_us, least_floor_cpu, least_cpu))
text = "\n".join(lines) + "\n"
open(out, "w").write(text)
print(text)
PY

python3 "$ROOT/benches/splice.py" "$ROOT/BENCHMARKS.md" "$OUT"
echo "== wrote $OUT and its section of BENCHMARKS.md"
