#!/usr/bin/env bash
# Is this commit's sluiced slower than REV's? Builds REV's sluiced (release,
# default features) in a git worktree of its own, and this tree's, then
# drives both with this tree's `sluice bench` in alternating rounds, with
# Redis + Lua as the same run's baseline: compare.sh's token-bucket load
# (100,000 keys, 10/s, burst 100) at 50 x 64 and 50 x 1. Prints per round
# ops/s, p99 and each sluiced's CPU per decision from /proc, then the
# medians and new / old (which of the two runs first alternates by
# round). For a change that should cost nothing (a
# restructure), where compare.sh's ratios against Redis move with the host
# from one day to the next.
# Usage: bash benches/ab.sh REV [ROUNDS]   (ROUNDS: 3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REV=${1:?usage: bash benches/ab.sh REV [ROUNDS]}
ROUNDS=${2:-3}
WORK=$(mktemp -d /tmp/sluice-ab.XXXXXX)
OLD_TREE=$WORK/old
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  git worktree remove --force "$OLD_TREE" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== build: this tree, and $REV (its own target directory: a first build takes minutes)"
cargo build --release --quiet -p sluice-server -p sluice-cli --bins
git worktree add --detach --force "$OLD_TREE" "$REV" >/dev/null 2>&1
OLD_TARGET=${AB_OLD_TARGET:-$ROOT/target/ab-old}
(cd "$OLD_TREE" && CARGO_TARGET_DIR=$OLD_TARGET cargo build --release --quiet -p sluice-server)
NEW=$ROOT/target/release/sluiced
OLD=$OLD_TARGET/release/sluiced
SLUICE=$ROOT/target/release/sluice

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)
# start NAME BIN: sets NAME_ADDR and NAME_PID.
start() {
  "$2" --port 0 >"$WORK/$1.out" 2>"$WORK/$1.err" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 100); do [ -s "$WORK/$1.out" ] && break; sleep 0.1; done
  local addr
  addr=$(sed -n '1s/^sluiced listening on \([^ ]*\) .*/\1/p' "$WORK/$1.out")
  [ -n "$addr" ] || { echo "$1 did not start"; cat "$WORK/$1.err"; exit 1; }
  printf -v "${1}_ADDR" '%s' "$addr"
  printf -v "${1}_PID" '%s' "$pid"
}
start new "$NEW"
start old "$OLD"
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --logfile "$WORK/redis.log" &
PIDS+=($!)
sleep 1

RESULTS=$WORK/results.jsonl
# bench NAME ADDR TARGET CONNS PIPE REQUESTS [PID]: one run, one line.
bench() {
  local t0=0 t1=0 json
  [ -n "${7:-}" ] && t0=$(cpu_ticks "$7")
  json=$("$SLUICE" --addr "$2" bench --target "$3" --redis-addr "127.0.0.1:$RPORT" \
    --connections "$4" --pipeline "$5" --keys 100000 --requests "$6" --duration-s 20 \
    --rate 10/s --burst 100 --json)
  [ -n "${7:-}" ] && t1=$(cpu_ticks "$7")
  python3 - "$1" "$json" "$t0" "$t1" "$TCK" >>"$RESULTS" <<'PY'
import json, sys
name, r, t0, t1, tck = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cpu = (t1 - t0) / tck * 1e9 / r["requests"] if t1 > t0 else None
print(json.dumps({"name": name, "ops": r["ops_per_s"], "p99": r["latency_us"]["p99"], "cpu_ns": cpu}))
PY
  tail -n 1 "$RESULTS"
}

echo "== warm-up (not measured)"
for who in "new $new_ADDR" "old $old_ADDR"; do
  set -- $who
  bench warm "$2" sluice 50 64 400000 >/dev/null
done
bench warm "$new_ADDR" redis-lua 50 64 400000 >/dev/null
: >"$RESULTS"
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  for cp in "64 4000000 1000000" "1 400000 200000"; do
    set -- $cp
    # Which goes first alternates by round: the run after Redis's pays
    # for its background expiry of the keys the last run wrote.
    if [ $((r % 2)) = 1 ]; then order="new old"; else order="old new"; fi
    for who in $order; do
      addr=${who}_ADDR pid=${who}_PID
      bench "$who 50x$1" "${!addr}" sluice 50 "$1" "$2" "${!pid}"
    done
    bench "redis 50x$1" "$new_ADDR" redis-lua 50 "$1" "$3"
  done
done
echo "== medians over $ROUNDS rounds ($REV = old)"
python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(name, field):
    v = [r[field] for r in rows if r["name"] == name and r[field] is not None]
    return statistics.median(v) if v else None
print("| load | new ops/s | old ops/s | new / old | new CPU/decision | old CPU/decision | new x Redis + Lua | old x Redis + Lua |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for cp in ("50x64", "50x1"):
    n, o, rd = med("new " + cp, "ops"), med("old " + cp, "ops"), med("redis " + cp, "ops")
    nc, oc = med("new " + cp, "cpu_ns"), med("old " + cp, "cpu_ns")
    print(f"| {cp} | {n:,.0f} | {o:,.0f} | {n / o:.2f} | {nc:.0f} ns | {oc:.0f} ns | {n / rd:.1f}x | {o / rd:.1f}x |")
PY
