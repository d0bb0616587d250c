#!/usr/bin/env bash
# Instructions an entry point and an owner execute per forwarded call, by
# callgrind (repeatable on a noisy machine, for before/after comparisons
# of the forwarding path; benches/notes.md quotes it).
# Two groups of one shard each, `a` and `b`, every node started with
# --cluster; the load's keys are all owned by `a` and sent to node B (so
# every call is forwarded to A), or to A (TO=a: every call local).
# One of the two nodes runs under callgrind (NODE=b, the default, or a);
# prints calls and the node's instructions per call. Only the measured run
# is counted: the node starts with collection off, a warm-up run of the
# same load first (WARM_SECONDS of RESP, WARM_CALLS of RLS) creates the
# keys' buckets, then `callgrind_control -i on` starts the count. (Counting
# from the start charged a run the creation of its 100,000 buckets and the
# node's start, spread over however many calls the run made: a local run,
# slower under callgrind, read about 2,450 instructions a call where its
# steady state is about 2,100, and a ratio against it read 1.44 for 1.60.)
# Usage: bash benches/entry-callgrind.sh [resp|rls]
# Environment: NODE (b), TO (b), SECONDS_PER_RUN (8, resp), WARM_SECONDS (4,
# resp), WARM_CALLS (5000, rls), CONNECTIONS (20, resp), PIPELINE (64, resp),
# CALLS (20000,
# rls), KEEP (a file to copy callgrind's output to), CALLGRIND_ARGS (more
# callgrind flags, e.g. "--cache-sim=yes --LL=524288,8,64" to count the
# misses of an L2-sized cache: where a path's time goes that its
# instruction count does not show).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
PROTO=${1:-resp}
NODE=${NODE:-b}
TO=${TO:-b}
BIN=$ROOT/target/release
two_groups 127.0.0.1:7880 127.0.0.1:7881
# node GROUP PORT: RESP at PORT+2, RLS at PORT+4
node() {
  local pre=()
  [ "$1" = "$NODE" ] && pre=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/cg.out" ${CALLGRIND_ARGS:-})
  "${pre[@]}" "$BIN/sluiced" --bind 127.0.0.1 --port "$2" --shards 1 \
    --cluster "$WORK/cluster.toml" --group "$1" --resp-port $(($2 + 2)) \
    --rls-port $(($2 + 4)) --rls-config "$WORK/bench.yaml" >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
}
node a 7880
node b 7881
# (Under valgrind a node takes longer to start than wait_line's 10 s.)
for _ in $(seq 1 600); do
  grep -q "rls listening" "$WORK/a.log" && grep -q "rls listening" "$WORK/b.log" && break
  sleep 0.1
done
wait_line "$WORK/a.log" "rls listening"
wait_line "$WORK/b.log" "rls listening"
BASE=7881
[ "$TO" = a ] && BASE=7880
MEASURED=${PIDS[0]}
[ "$NODE" = b ] && MEASURED=${PIDS[1]}
# load SECONDS CALLS: the run's load, to RUN_JSON
load() {
  if [ "$PROTO" = resp ]; then
    "$BIN/sluice-resp-bench" --addr "127.0.0.1:$((BASE + 2))" --connections "${CONNECTIONS:-20}" --pipeline "${PIPELINE:-64}" \
      --seconds "$1" --keys 100000 --groups a,b --owned-by a >"$RUN_JSON"
  else
    "$BIN/sluice-rls-bench" --addr "127.0.0.1:$((BASE + 4))" --domain bench --streams 50 \
      --connections 4 --requests "$2" --seconds 120 --keys 100000 \
      --groups a,b --owned-by a >"$RUN_JSON"
  fi
}
RUN_JSON=$WORK/warm.json load "${WARM_SECONDS:-4}" "${WARM_CALLS:-5000}"
callgrind_control -i on "$MEASURED" >/dev/null
RUN_JSON=$WORK/run.json load "${SECONDS_PER_RUN:-8}" "${CALLS:-20000}"
# SIGTERM, so that callgrind writes its output as the node exits.
kill -TERM "${PIDS[@]}"
wait "${PIDS[@]}" 2>/dev/null || true
PIDS=()
[ -z "${KEEP:-}" ] || cp "$WORK/cg.out" "$KEEP"
python3 - "$WORK/run.json" "$WORK/cg.out" "$PROTO" "$NODE" "$TO" <<'PY'
import json, re, sys
calls = json.load(open(sys.argv[1]))["calls"]
total = int(re.search(r"^summary: (\d+)", open(sys.argv[2]).read(), re.M).group(1))
print(f"{sys.argv[3]}: {calls} calls sent to node {sys.argv[5].upper()}, keys owned by A; "
      f"node {sys.argv[4].upper()}: {total / calls:,.0f} instructions a call")
PY
