#!/usr/bin/env bash
# Instructions the server executes per decision, by callgrind: repeatable
# even on a noisy machine, for before/after comparisons of the hot path.
# Runs `sluiced --shards 1` under callgrind, driven by `sluice bench` with
# N requests (default 300,000), and prints the server's instructions over
# N (start and shutdown, a few million, are included). Batching varies a
# little with timing, so compare runs of the same N, and expect a few
# percent between two runs of one binary.
# Usage: bash benches/callgrind.sh [SLUICED SLUICE] [-- BENCH ARGS...]
#   default binaries: target/release/{sluiced,sluice} (build them first);
#   default bench args: --connections 4 --pipeline 64 --keys 1000 (under the limit).
# REPLICATION=sync|async: the server runs as a primary in that mode with a
# follower (not under callgrind) attached and streaming before the load:
# the primary's cost of replication, against a run without.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICED=${1:-target/release/sluiced}
SLUICE=${2:-target/release/sluice}
shift 2 2>/dev/null || shift $#
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--connections 4 --pipeline 64 --keys 1000)
N=${N:-300000}
WORK=$(mktemp -d /tmp/sluice-callgrind.XXXXXX)
[ -n "${KEEP:-}" ] && echo "callgrind output kept in $WORK" >&2 || trap 'rm -rf "$WORK"' EXIT
run() {
  local n=$1 out=$WORK/cg.$1
  local repl=()
  [ -n "${REPLICATION:-}" ] && repl=(--replication "$REPLICATION")
  valgrind --tool=callgrind --callgrind-out-file="$out" "$SLUICED" --port 0 --shards 1 "${repl[@]}" \
    >"$WORK/out.$n" 2>"$WORK/err.$n" &
  local pid=$!
  for _ in $(seq 600); do [ -s "$WORK/out.$n" ] && break; sleep 0.1; done
  local addr fpid=""
  addr=$(sed -n '1s/^sluiced listening on \([^ ]*\) .*/\1/p' "$WORK/out.$n")
  if [ -n "${REPLICATION:-}" ]; then
    "$SLUICED" --port 0 --resp-port 0 --shards 1 --replica-of "$addr" >"$WORK/fout.$n" 2>"$WORK/ferr.$n" &
    fpid=$!
    for _ in $(seq 600); do [ -s "$WORK/fout.$n" ] && break; sleep 0.1; done
    local faddr
    faddr=$(sed -n '1s/^sluiced listening on \([^ ]*\) .*/\1/p' "$WORK/fout.$n")
    for _ in $(seq 600); do
      "$SLUICE" --addr "$faddr" --timeout-ms 60000 role --json | grep -q '"streaming"' && break
      sleep 0.1
    done
  fi
  "$SLUICE" --addr "$addr" --timeout-ms 60000 bench "${args[@]}" --requests "$n" --duration-s 600 >/dev/null
  kill -TERM "$pid"
  wait "$pid" || true
  [ -z "$fpid" ] || { kill "$fpid"; wait "$fpid" || true; }
  # callgrind's total: "summary: N" in the output file.
  sed -n 's/^summary: \([0-9]*\).*/\1/p' "$out"
}
total=$(run "$N")
echo "$(( total / N )) instructions per decision ($SLUICED; ${args[*]}; N=$N${REPLICATION:+; replication $REPLICATION})"
