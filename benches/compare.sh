#!/usr/bin/env bash
# Side-by-side comparison, one command: builds release binaries, installs
# redis-server if it is missing, starts Redis, Sluice and the loopback
# floor (benches/src/bin/sluice-floor.rs) on loopback, drives them with the
# same generator (`sluice bench`) and the same settings, adds
# redis-benchmark against Redis PING (the protocol floor) and against
# Sluice's RESP CL.THROTTLE, stops everything it started, and writes
# BENCHMARKS.md with ops/s, p50, p99 and ratios to Redis + Lua from THIS run.
#
# Usage: bash benches/compare.sh [--quick]
#   --quick   smaller request counts (a smoke run; figures are noisier)
# Environment: SLUICE_SHARDS (default: one per core), OUT (default BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/BENCHMARKS.md}
SCALE=1
[ "${1:-}" = "--quick" ] && SCALE=10
WORK=$(mktemp -d /tmp/sluice-compare.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== build (release)"
cargo build --release --quiet -p sluice-server -p sluice-cli -p sluice-benches --bins
SLUICED=$ROOT/target/release/sluiced
SLUICE=$ROOT/target/release/sluice
FLOOR=$ROOT/target/release/sluice-floor

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "== installing redis-server and redis-tools"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi

# cpu_ticks PID: user + system CPU time of a process so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
CPU=$WORK/cpu.jsonl
: >"$CPU"
# cpu_row NAME DECISIONS WHO TICKS...: CPU per decision of each process.
cpu_row() {
  python3 -c 'import json,sys,os; n=int(sys.argv[2]); hz=os.sysconf("SC_CLK_TCK"); print(json.dumps({"name":sys.argv[1],"decisions":n,"cpu_us_per_decision":{w:int(t)*1e6/hz/n for w,t in zip(sys.argv[3::2],sys.argv[4::2])}}))' "$@" >>"$CPU"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== start redis-server and sluiced on loopback"
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --protected-mode yes \
  --daemonize no --logfile "$WORK/redis.log" &
PIDS+=($!)
# start_sluiced NAME ARGS...: starts sluiced on free ports; sets NAME_ADDR,
# NAME_RESP and NAME_PID.
start_sluiced() {
  local name=$1; shift
  "$SLUICED" --port 0 --resp-port 0 "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  local pid=$!
  PIDS+=($pid)
  # Up to a minute: a node loading a 10M-bucket snapshot takes seconds.
  for _ in $(seq 600); do
    [ "$(wc -l <"$WORK/$name.out")" -ge 2 ] && break
    sleep 0.1
  done
  local addr resp
  addr=$(sed -n '1s/^sluiced listening on \([^ ]*\) .*/\1/p' "$WORK/$name.out")
  resp=$(sed -n '2s/^sluiced resp listening on \([^ ]*\).*/\1/p' "$WORK/$name.out")
  [ -n "$addr" ] && [ -n "$resp" ] || { echo "sluiced did not start"; cat "$WORK/$name.err"; exit 1; }
  printf -v "${name}_ADDR" '%s' "$addr"
  printf -v "${name}_RESP" '%s' "$resp"
  printf -v "${name}_PID" '%s' "$pid"
}
# The loopback floor (benches/src/bin/sluice-floor.rs): protocol v1 and a
# GCRA decision on a small cache-resident table, nothing else; driven by
# the same generator with the same settings, for Sluice / floor ratios.
# Its RESP port is the floor of redis-benchmark's CL.THROTTLE row.
"$FLOOR" --port 0 --resp-port 0 >"$WORK/floor.out" 2>"$WORK/floor.err" &
FLOOR_PID=$!
PIDS+=($FLOOR_PID)
for _ in $(seq 100); do [ "$(wc -l <"$WORK/floor.out")" -ge 2 ] && break; sleep 0.1; done
FLOOR_ADDR=$(sed -n '1s/^sluice-floor listening on \(.*\)$/\1/p' "$WORK/floor.out")
FLOOR_RESP=$(sed -n '2s/^sluice-floor resp listening on \(.*\)$/\1/p' "$WORK/floor.out")
[ -n "$FLOOR_ADDR" ] && [ -n "$FLOOR_RESP" ] || { echo "sluice-floor did not start"; cat "$WORK/floor.err"; exit 1; }
# The floor for 10M keys: the same server with a 2^24-bucket array (512
# MiB, one cache line a key, a frame's buckets prefetched before its first
# decision, as the shard does): the least memory traffic a 10M-key store
# can have, so that the 10M rows compare Sluice with what this machine's
# memory allows at that size, not with a table that stays in cache.
"$FLOOR" --port 0 --buckets 16777216 >"$WORK/floorbig.out" 2>"$WORK/floorbig.err" &
FLOORBIG_PID=$!
PIDS+=($FLOORBIG_PID)
for _ in $(seq 100); do [ "$(wc -l <"$WORK/floorbig.out")" -ge 1 ] && break; sleep 0.1; done
FLOORBIG_ADDR=$(sed -n '1s/^sluice-floor listening on \(.*\)$/\1/p' "$WORK/floorbig.out")
[ -n "$FLOORBIG_ADDR" ] || { echo "sluice-floor --buckets did not start"; cat "$WORK/floorbig.err"; exit 1; }
# The generator takes one of the cores, so the main runs give sluiced the
# other one (--shards 1): more shard threads than free cores makes the
# kernel time-slice them, which shows up as p99. The default (one shard per
# core) is measured too, in its own rows.
SHARDS=${SLUICE_SHARDS:-1}
start_sluiced S --shards "$SHARDS"
start_sluiced D
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
SADDR=$S_ADDR
RESPADDR=$S_RESP
DSHARDS=$(sed -n '1s/.*shards=\([0-9]*\).*/\1/p' "$WORK/D.out")
echo "   redis 127.0.0.1:$RPORT, sluice $SADDR (resp $RESPADDR, $SHARDS shards), default sluice $D_ADDR ($DSHARDS shards)"

# The limit every request uses: 10/s with burst 100, so buckets persist
# through a run on both sides. A row asks at most 40 times a key, within
# the burst: these rows admit (report.py prints the share); the spent
# workload below measures denials.
LIMIT=(--rate 10/s --burst 100)
RESULTS=$WORK/results.jsonl
: >"$RESULTS"

# run NAME TARGET CONNS PIPE KEYS REQUESTS [extra args]  (ADDR: which sluiced)
run() {
  local name=$1 target=$2 conns=$3 pipe=$4 keys=$5 reqs=$(( $6 / SCALE )); shift 6
  local json
  local limit
  read -r -a limit <<<"${LIMIT_ARGS:-${LIMIT[*]}}"
  json=$("$SLUICE" --addr "${ADDR:-$SADDR}" bench --target "$target" --redis-addr "127.0.0.1:$RPORT" \
    --connections "$conns" --pipeline "$pipe" --keys "$keys" --requests "$reqs" --duration-s 20 \
    "${limit[@]}" --json "$@")
  echo "   $name: $(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("%.0f ops/s p50 %.0f us p99 %.0f us" % (r["ops_per_s"], r["latency_us"]["p50"], r["latency_us"]["p99"]))' "$json")"
  python3 -c 'import json,sys; r=json.loads(sys.argv[2]); r["name"]=sys.argv[1]; print(json.dumps(r))' "$name" "$json" >>"$RESULTS"
}

# rb NAME PORT CONNS PIPE REQUESTS ARGS... (redis-benchmark; CSV)
rb() {
  local name=$1 port=$2 conns=$3 pipe=$4 reqs=$(( $5 / SCALE )); shift 5
  local csv
  csv=$(redis-benchmark -p "$port" -c "$conns" -P "$pipe" -n "$reqs" --csv "$@" 2>/dev/null | tail -n 1)
  echo "   $name: $csv"
  python3 - "$name" "$conns" "$pipe" "$csv" >>"$RESULTS" <<'PY'
import csv, json, sys
name, conns, pipe, line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
row = next(csv.reader([line]))
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
print(json.dumps({"name": name, "target": "redis-benchmark", "connections": conns, "pipeline": pipe,
  "keys": 100000, "ops_per_s": float(row[1]),
  "latency_us": {"p50": float(row[4]) * 1000, "p99": float(row[6]) * 1000}}))
PY
}

echo "== warm-up (not measured): every server grows its table over the keyspace first"
for target_addr in "sluice $SADDR" "sluice $D_ADDR" "redis-lua -"; do
  set -- $target_addr
  "$SLUICE" --addr "${2/-/$SADDR}" bench --target "$1" --redis-addr "127.0.0.1:$RPORT" --connections 50 \
    --pipeline 64 --keys 100000 --requests $(( 400000 / SCALE )) --duration-s 20 "${LIMIT[@]}" >/dev/null
done

echo "== same generator, same settings: Sluice (binary) vs Redis + Lua"
for cp in "50 1" "50 16" "50 64" "1 1"; do
  set -- $cp
  c=$1 p=$2
  base=$(( p == 1 ? (c == 1 ? 100000 : 400000) : 4000000 ))
  t0=$(cpu_ticks "$S_PID")
  run "sluice c$c p$p" sluice "$c" "$p" 100000 "$base"
  [ "$c $p" = "50 64" ] && cpu_row "sluice c50 p64" $(( base / SCALE )) primary $(( $(cpu_ticks "$S_PID") - t0 ))
  run "redis-lua c$c p$p" redis-lua "$c" "$p" 100000 $(( base / 8 ))
  t0=$(cpu_ticks "$FLOOR_PID")
  ADDR=$FLOOR_ADDR run "floor c$c p$p" sluice "$c" "$p" 100000 "$base"
  [ "$c $p" = "50 64" ] && cpu_row "floor c50 p64" $(( base / SCALE )) server $(( $(cpu_ticks "$FLOOR_PID") - t0 ))
done

echo "== the default shard count ($DSHARDS, one per core) with the generator on the same cores"
ADDR=$D_ADDR run "sluice-default c50 p64" sluice 50 64 100000 4000000
ADDR=$D_ADDR run "sluice-default c50 p1" sluice 50 1 100000 400000

echo "== workloads at 50 x 1, 16 and 64: one shard, the default shard count, the floor"
# under: clients far below their limits (1000/s, 100k keys: every bucket
# has refilled when it is visited again, the usual state in production);
# spent: the main rows' 10/s, burst 100.
for wl in "under --rate 1000/s" "spent --rate 10/s --burst 100"; do
  set -- $wl
  wname=$1; shift
  limits="$*"
  for p in 1 16 64; do
    n=$(( p == 1 ? 400000 : 4000000 ))
    # Three rounds of the pair (one shard, floor), alternating, since two
    # runs a few seconds apart differ by 10-20 % here and these ratios sit
    # near their targets; report.py takes the median round. The default
    # shard count (no target) once.
    for target in "sluice $SADDR r1" "floor $FLOOR_ADDR r1" "sluice-default $D_ADDR" \
      "sluice $SADDR r2" "floor $FLOOR_ADDR r2" "sluice $SADDR r3" "floor $FLOOR_ADDR r3"; do
      set -- $target
      if [ "$wname" = spent ]; then
        # Spend every bucket right before the row (not measured): a row's
        # requests (40 a key) never exhaust a burst of 100, and the other
        # servers' rows in between give each key 50 units back at 10/s,
        # so without this the rows measured admissions only. At 50 x 1 the
        # keys refill faster than they are visited: that row admits what
        # it asks (its admitted share says so).
        "$SLUICE" --addr "$2" bench --connections 50 --pipeline 64 --keys 100000 \
          --requests $(( 12000000 / SCALE )) --duration-s 20 $limits >/dev/null
      fi
      LIMIT_ARGS="$limits" ADDR=$2 run "$wname $1 p$p${3:+ $3}" sluice 50 "$p" 100000 "$n"
    done
  done
done

echo "== redis-benchmark: Redis PING (protocol floor), Sluice RESP CL.THROTTLE, the RESP floor's CL.THROTTLE"
# The 50 x 64 rows in three alternating rounds (the CL.THROTTLE / PING
# ratio, the RESP target, moved from 0.96 to 0.74 between two single
# runs): report.py takes the median round. The floor's CL.THROTTLE is the
# same command against sluice-floor's RESP port: what redis-benchmark
# itself allows for this command and its five-integer reply.
for round in 1 2 3; do
  rb "redis PING c50 p64 r$round" "$RPORT" 50 64 4000000 -t ping
  rb "sluice-resp CL.THROTTLE c50 p64 r$round" "${RESPADDR##*:}" 50 64 4000000 -r 100000 CL.THROTTLE 'key:__rand_int__' 99 10 1 1
  rb "floor-resp CL.THROTTLE c50 p64 r$round" "${FLOOR_RESP##*:}" 50 64 4000000 -r 100000 CL.THROTTLE 'key:__rand_int__' 99 10 1 1
  # Redis's own cheapest reply of CL.THROTTLE's shape: SMISMEMBER of five
  # members on a key that does not exist is a lookup that misses and an
  # array of five integers, the same command length and the same reply
  # shape for redis-benchmark to build and parse.
  rb "redis SMISMEMBER c50 p64 r$round" "$RPORT" 50 64 4000000 -r 100000 SMISMEMBER 'key:__rand_int__' 99 10 1 1
done
rb "redis PING c50 p1" "$RPORT" 50 1 400000 -t ping
rb "sluice-resp CL.THROTTLE c50 p1" "${RESPADDR##*:}" 50 1 400000 -r 100000 CL.THROTTLE 'key:__rand_int__' 99 10 1 1

echo "== replication: the same runs against a primary with a follower (sync, then async)"
# role_field ADDR FIELD: one field of `sluice role --json`.
role_field() { "$SLUICE" --addr "$1" --timeout-ms 10000 role --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"; }
REPL=$WORK/replication.jsonl
: >"$REPL"
# The primary on CPU 0 and the follower on CPU 1 (`--cpu-list`; the load
# generator runs where the kernel puts it), as a follower on a machine of
# its own would never take the primary's core. Unpinned, on two cores
# shared by three processes, the follower's thread and table evicted the
# primary's: perf put the primary's first load of a bucket slot at 52 % of
# its decision time with a follower against 21 % alone, about 45 ns more
# a decision (benches/notes.md, "Replication"). The baselines ("alone")
# are the same pinned primary. One shard only: with more, the list would
# put them all on CPU 0.
PIN_P=() PIN_F=()
rm -f "$WORK/pinned"
if [ "$SHARDS" = 1 ] && [ "$(nproc)" -ge 2 ]; then
  PIN_P=(--cpu-list 0) PIN_F=(--cpu-list 1)
  echo "primary --cpu-list 0, follower --cpu-list 1" >"$WORK/pinned"
fi
# ack_sample ADDR: the primary's ack histogram (count and seconds summed
# over its shards) from its admin port: the replication link's round trip,
# SYNC written to the ACK covering it, as the primary measured it.
ack_sample() {
  python3 - "$1" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
n = s = 0.0
for line in body.splitlines():
    if line.startswith("sluice_replication_ack_seconds_count{"):
        n += float(line.split()[-1])
    elif line.startswith("sluice_replication_ack_seconds_sum{"):
        s += float(line.split()[-1])
print(int(n), s)
PY
}
ACKS=$WORK/acks.jsonl
: >"$ACKS"
# acked_run NAME ARGS...: `run NAME ARGS...` against the primary, with the
# acks its follower sent meanwhile and their summed round trips.
acked_run() {
  local name=$1 n0 s0 n1 s1
  read -r n0 s0 < <(ack_sample "$P_ADMIN")
  ADDR=$P_ADDR run "$@"
  read -r n1 s1 < <(ack_sample "$P_ADMIN")
  python3 -c 'import json,sys; print(json.dumps({"name":sys.argv[1],"acks":int(sys.argv[3])-int(sys.argv[2]),"ack_s":float(sys.argv[5])-float(sys.argv[4])}))' \
    "$name" "$n0" "$n1" "$s0" "$s1" >>"$ACKS"
}
for mode in sync async; do
  start_sluiced P --shards "$SHARDS" --replication "$mode" --admin-port 0 "${PIN_P[@]}"
  for _ in $(seq 100); do [ "$(wc -l <"$WORK/P.out")" -ge 3 ] && break; sleep 0.1; done
  P_ADMIN=$(sed -n '3s/^sluiced admin listening on \([^ ]*\).*/\1/p' "$WORK/P.out")
  [ -n "$P_ADMIN" ] || { echo "the primary's admin port did not open"; cat "$WORK/P.err"; exit 1; }
  ADDR=$P_ADDR "$SLUICE" --addr "$P_ADDR" bench --connections 50 --pipeline 64 --keys 100000 \
    --requests $(( 400000 / SCALE )) --duration-s 20 "${LIMIT[@]}" >/dev/null
  # The baselines for this mode's ratios: the same primary, alone, right
  # before a follower attaches. This machine's speed drifts over a run (up
  # to 2x on a bad day), so the "sluice" rows, minutes earlier, made these
  # ratios measure the drift too; and since two runs a few seconds apart
  # still differ by 10-20 %, the pipelined pair is measured three times
  # (a fresh follower each time: a full sync of 100k keys takes well under
  # a second) and report.py takes the median ratio (benches/notes.md).
  # So is the 50 x 1 pair, whose p50 added sits near its target (one
  # round trip) and moved by 100 us between single runs.
  ADDR=$P_ADDR run "sluice-alone-$mode c1 p1" sluice 1 1 100000 40000
  : >"$WORK/lag-$mode.jsonl"
  for round in 1 2 3; do
    tp=$(cpu_ticks "$P_PID")
    ADDR=$P_ADDR run "sluice-alone-$mode c50 p64 r$round" sluice 50 64 100000 4000000
    cpu_row "sluice-alone-$mode c50 p64 r$round" $(( 4000000 / SCALE )) primary $(( $(cpu_ticks "$P_PID") - tp ))
    ADDR=$P_ADDR run "sluice-alone-$mode c50 p1 r$round" sluice 50 1 100000 400000
    start_sluiced F --shards "$SHARDS" --replica-of "$P_ADDR" "${PIN_F[@]}"
    for _ in $(seq 200); do [ "$(role_field "$F_ADDR" state)" = streaming ] && break; sleep 0.05; done
    # The follower's lag, sampled every 20 ms during the pipelined run: one
    # `role --json --every-ms` process asking over one connection (a round
    # trip a sample), its lines parsed after the run by report.py. A
    # process a sample, as this loop once started, cost about 2 ms of CPU
    # each (10 % of a core); parsing each with python3 here, as it did
    # before that, about 85 ms: most of a core taken from the run it
    # measures (benches/notes.md).
    "$SLUICE" --addr "$F_ADDR" --timeout-ms 10000 role --json --every-ms 20 \
      >>"$WORK/lag-$mode.jsonl" 2>/dev/null &
    LAG_PID=$!
    tp=$(cpu_ticks "$P_PID"); tf=$(cpu_ticks "$F_PID")
    ADDR=$P_ADDR run "sluice-$mode c50 p64 r$round" sluice 50 64 100000 4000000
    cpu_row "sluice-$mode c50 p64 r$round" $(( 4000000 / SCALE )) primary $(( $(cpu_ticks "$P_PID") - tp )) \
      follower $(( $(cpu_ticks "$F_PID") - tf ))
    kill "$LAG_PID" 2>/dev/null || true; wait "$LAG_PID" 2>/dev/null || true
    acked_run "sluice-$mode c50 p1 r$round" sluice 50 1 100000 400000
    [ "$round" = 3 ] && break
    # Alone again: the primary detaches a follower whose link closed.
    kill "$F_PID"; wait "$F_PID" 2>/dev/null || true
    for _ in $(seq 200); do [ "$(role_field "$P_ADDR" state)" = alone ] && break; sleep 0.05; done
  done
  # One client, no pipelining: the round trips alone, without 50
  # connections and three processes queueing for two cores.
  acked_run "sluice-$mode c1 p1" sluice 1 1 100000 40000
  # Stream bytes per decision: clients under their limits (every decision
  # writes a bucket: fresh keys, 1000/s) and hot keys (100 keys far over
  # their limits: most decisions deny and change nothing; the rest coalesce).
  for wl in "under 1000000 --rate 1000/s --burst 1000" "hot 100 --rate 10/s --burst 100"; do
    set -- $wl
    wname=$1 keys=$2; shift 2
    b0=$(role_field "$P_ADDR" stream_bytes); r0=$(role_field "$P_ADDR" stream_records)
    n=$(( 1000000 / SCALE ))
    "$SLUICE" --addr "$P_ADDR" bench --connections 50 --pipeline 64 --keys "$keys" --requests "$n" \
      --duration-s 20 "$@" >/dev/null
    sleep 0.2
    b1=$(role_field "$P_ADDR" stream_bytes); r1=$(role_field "$P_ADDR" stream_records)
    echo "   $mode $wname: $(( (b1 - b0) )) stream bytes, $(( r1 - r0 )) records for $n decisions"
    python3 -c 'import json,sys; print(json.dumps({"mode":sys.argv[1],"workload":sys.argv[2],"decisions":int(sys.argv[3]),"bytes":int(sys.argv[4]),"records":int(sys.argv[5])}))' \
      "$mode" "$wname" "$n" "$(( b1 - b0 ))" "$(( r1 - r0 ))" >>"$REPL"
  done
  kill "$P_PID" "$F_PID" 2>/dev/null || true
done

echo "== keyspace: 1k keys vs 10M keys (Sluice, c50 p64; 10M pre-filled first)"
# Same limit for both sizes (1/h, burst 100: buckets persist), only the
# keyspace differs. The pair runs in three alternating rounds (single runs
# of it gave 0.52-0.87 within a day): 1k keys on a node of their own (K,
# the same shard count, started fresh), 10M on S after its fill; report.py
# takes the median round.
start_sluiced K --shards "$SHARDS"
for a in "$SADDR" "$FLOORBIG_ADDR"; do
  "$SLUICE" --addr "$a" bench --connections 50 --pipeline 64 --keys 10000000 --requests $(( 20000000 / SCALE )) \
    --duration-s 60 --rate 1/h --burst 100 --json >/dev/null
done
# The floor's own pair in the same rounds: 1k keys on the cache-resident
# floor, 10M on the 2^24-bucket one. Its 10M / 1k is what this machine's
# memory costs a server that does nothing else.
for round in 1 2 3; do
  LIMIT_ARGS="--rate 1/h --burst 100" ADDR=$K_ADDR run "sluice 1k keys r$round" sluice 50 64 1000 4000000
  LIMIT_ARGS="--rate 1/h --burst 100" run "sluice 10M keys r$round" sluice 50 64 10000000 4000000
  LIMIT_ARGS="--rate 1/h --burst 100" ADDR=$FLOOR_ADDR run "floor 1k keys r$round" sluice 50 64 1000 4000000
  LIMIT_ARGS="--rate 1/h --burst 100" ADDR=$FLOORBIG_ADDR run "floor 10M keys r$round" sluice 50 64 10000000 4000000
done
kill "$K_PID" 2>/dev/null || true
LIMIT_ARGS="--rate 1/h --burst 100" run "10M sluice p16" sluice 50 16 10000000 4000000
LIMIT_ARGS="--rate 1/h --burst 100" run "10M sluice p1" sluice 50 1 10000000 400000
for p in 1 16 64; do
  LIMIT_ARGS="--rate 1/h --burst 100" ADDR=$FLOORBIG_ADDR run "10M floor p$p" sluice 50 "$p" 10000000 \
    $(( p == 1 ? 400000 : 4000000 ))
done
kill "$FLOORBIG_PID" 2>/dev/null || true
RSS_KB=$(ps -o rss= -p "$S_PID" | tr -d ' ')
# The default shard count: the same fill, the same runs.
"$SLUICE" --addr "$D_ADDR" bench --connections 50 --pipeline 64 --keys 10000000 --requests $(( 20000000 / SCALE )) \
  --duration-s 60 --rate 1/h --burst 100 --json >/dev/null
for p in 1 16 64; do
  LIMIT_ARGS="--rate 1/h --burst 100" ADDR=$D_ADDR run "10M sluice-default p$p" sluice 50 "$p" 10000000 \
    $(( p == 1 ? 400000 : 4000000 ))
done

echo "== full sync of the 10M-key table to a new follower, while the primary answers"
SYNC=$WORK/fullsync.jsonl
: >"$SYNC"
# sync_bench PHASE: one second of load on the primary (50 x 16), its JSON
# tagged with the phase.
sync_bench() {
  "$SLUICE" --addr "$SADDR" bench --connections 50 --pipeline 16 --keys 100000 --requests 100000000 \
    --duration-s 1 --rate 1/h --burst 100 --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); r["phase"]=sys.argv[1]; print(json.dumps(r))' "$1" >>"$SYNC"
}
sync_bench before
start_sluiced FS --shards "$SHARDS" --replica-of "$SADDR"
t0=$(date +%s.%N)
for _ in $(seq 120); do
  [ "$(role_field "$FS_ADDR" state)" = streaming ] && break
  sync_bench during
done
t1=$(date +%s.%N)
synced=$(role_field "$FS_ADDR" keys_synced)
sync_bench after
python3 -c 'import json,sys; print(json.dumps({"phase":"sync","seconds":float(sys.argv[2])-float(sys.argv[1]),"keys":int(sys.argv[3])}))' \
  "$t0" "$t1" "$synced" >>"$SYNC"
echo "   full sync: $synced keys in $(python3 -c "print(round($t1 - $t0, 2))") s (load ran in 1 s slices meanwhile)"
kill "$FS_PID" 2>/dev/null || true
kill "$S_PID" "$D_PID" 2>/dev/null || true

echo "== memory: bytes per token-bucket bucket (RSS growth / distinct keys)"
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
MEM=$WORK/memory.txt
: >"$MEM"
# The same fills give the snapshot figures: the write at SIGTERM, the load
# at the next start, and (10M) decision latency while snapshots are written
# every 2 s against the same node writing none.
SNAP=$WORK/snapshot.jsonl
: >"$SNAP"
# log_ms NAME MESSAGE: the `ms` field of NAME's JSON log line MESSAGE.
log_ms() {
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: r = json.loads(l)
    except ValueError: continue
    f = r.get("fields", {})
    if f.get("message") == sys.argv[2]: print(f["ms"], f.get("bytes", 0), f.get("collect_ms", "")); break' "$WORK/$1.err" "$2"
}
# stop_wait PID: SIGTERM and wait for the exit (the shutdown snapshot).
stop_wait() { kill "$1"; while kill -0 "$1" 2>/dev/null; do sleep 0.1; done; }
latency() {
  "$SLUICE" --addr "$1" bench --connections 8 --pipeline 1 --keys "$2" --rate 1/h --burst 10 \
    --duration-s 12 --requests 100000000 --json
}
for n in 1000000 10000000; do
  n=$(( n / SCALE ))
  dir=$WORK/snap-$n
  start_sluiced M --shards 1 --keys-max 0 --snapshot-dir "$dir" --snapshot-interval-s 0 --log-format json
  before=$(rss "$M_PID")
  "$SLUICE" --addr "$M_ADDR" bench --connections 50 --pipeline 64 --keys "$n" --requests "$n" \
    --key-order sequential --rate 1/h --burst 10 --duration-s 120 >/dev/null
  after=$(rss "$M_PID")
  echo "sluice $n $before $after" >>"$MEM"
  echo "   sluice, $n keys: $(( (after - before) * 1024 / n )) bytes per bucket"
  stop_wait "$M_PID"
  read -r write_ms bytes collect_ms < <(log_ms M "snapshot written")
  start_sluiced M --shards 1 --keys-max 0 --snapshot-dir "$dir" --snapshot-interval-s 0 --log-format json
  read -r load_ms _ < <(log_ms M "snapshot loaded")
  echo "   snapshot of $n buckets: $bytes bytes, written in $write_ms ms (shard walk $collect_ms ms), loaded in $load_ms ms"
  quiet="" busy=""
  if [ "$n" -ge $(( 10000000 / SCALE )) ]; then
    quiet=$(latency "$M_ADDR" "$n")
    kill -9 "$M_PID"; wait "$M_PID" 2>/dev/null || true
    start_sluiced M --shards 1 --keys-max 0 --snapshot-dir "$dir" --snapshot-interval-s 2 --log-format json
    busy=$(latency "$M_ADDR" "$n")
    written=$(grep -c '"snapshot written"' "$WORK/M.err" || true)
    echo "   latency at $n buckets, no snapshot / a snapshot every 2 s ($written written):"
    echo "     $quiet"
    echo "     $busy"
  fi
  python3 -c 'import json,sys
q = json.loads(sys.argv[5]) if sys.argv[5] else None
b = json.loads(sys.argv[6]) if sys.argv[6] else None
print(json.dumps({"keys": int(sys.argv[1]), "bytes": int(sys.argv[2]), "write_ms": int(sys.argv[3]),
                  "load_ms": int(sys.argv[4]), "quiet": q, "busy": b, "written": int(sys.argv[7] or 0),
                  "collect_ms": int(sys.argv[8]) if sys.argv[8] else None}))' \
    "$n" "$bytes" "$write_ms" "$load_ms" "$quiet" "$busy" "${written:-0}" "$collect_ms" >>"$SNAP"
  kill -9 "$M_PID"; wait "$M_PID" 2>/dev/null || true
done
n=$(( 1000000 / SCALE ))
MPORT=$(free_port)
redis-server --port "$MPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --logfile "$WORK/redis-m.log" &
RM_PID=$!
PIDS+=($RM_PID)
for _ in $(seq 100); do redis-cli -p "$MPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
before=$(rss "$RM_PID")
"$SLUICE" bench --target redis-lua --redis-addr "127.0.0.1:$MPORT" --connections 50 --pipeline 64 --keys "$n" \
  --requests "$n" --key-order sequential --rate 1/h --burst 10 --duration-s 120 >/dev/null
after=$(rss "$RM_PID")
echo "redis-lua $n $before $after" >>"$MEM"
echo "   redis + lua, $n keys: $(( (after - before) * 1024 / n )) bytes per bucket"

echo "== writing $OUT"
python3 "$ROOT/benches/report.py" "$RESULTS" "$OUT" "$SHARDS" "$RSS_KB" "$SCALE" "$MEM" "$DSHARDS" "$WORK" "$SNAP"
echo "done"
