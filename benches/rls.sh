#!/usr/bin/env bash
# Envoy's rate limit service (issue 14), one command: ShouldRateLimit calls
# per second and their latency at 50 concurrent streams, from
# sluice-rls-bench (benches/src/bin/sluice-rls-bench.rs, a tonic client
# with Envoy's types), one descriptor per call (remote_address, 100,000
# addresses, 1,000 a second each: every call is under its limit, as most
# are in production), against a release sluiced on its default shards.
#
# The baseline, in the same run: Redis doing the work envoyproxy/ratelimit
# asks of it for such a call (it pipelines INCRBY and EXPIRE per descriptor:
# two commands, one round trip), measured by redis-benchmark with 50
# connections, -P 2 and INCRBY on random keys. That is Redis's share alone:
# envoyproxy/ratelimit's own gRPC server and Go code come on top, so the
# real service can only be slower than this baseline (it cannot be built
# here: no Go toolchain newer than 1.19, and no Go module proxy).
#
# Writes benches/rls.md and puts that section into BENCHMARKS.md
# (benches/report.py includes it when compare.sh rewrites the file).
#
# Usage: bash benches/rls.sh
# Environment: SECONDS_PER_RUN (10), STREAMS (50), OUT (benches/rls.md),
# PORT (7795), RLS_PORT (7796), REDIS_PORT (7797).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN_S=${SECONDS_PER_RUN:-10}
STREAMS=${STREAMS:-50}
PORT=${PORT:-7795}
RLS_PORT=${RLS_PORT:-7796}
REDIS_PORT=${REDIS_PORT:-7797}
OUT=${OUT:-$ROOT/benches/rls.md}
WORK=$(mktemp -d /tmp/sluice-rls.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== build (release, feature rls)"
cargo build --release --quiet -p sluice-server -p sluice-benches \
  --features sluice-server/rls,sluice-benches/rls --bins
SLUICED=$ROOT/target/release/sluiced
BENCH=$ROOT/target/release/sluice-rls-bench
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)"; exit 1; }

cat >"$WORK/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 1000 }
YAML

wait_line() { # file, text
  for _ in $(seq 1 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "no '$2' in $1:"; cat "$1"; exit 1
}

echo "== sluiced --rls-port, $STREAMS streams, ${RUN_S} s"
"$SLUICED" --bind 127.0.0.1 --port "$PORT" --rls-port "$RLS_PORT" \
  --rls-config "$WORK/bench.yaml" >"$WORK/sluiced.log" 2>&1 &
PIDS+=($!)
wait_line "$WORK/sluiced.log" "rls listening"
SHARDS=$(sed -n 's/.*shards=\([0-9]*\).*/\1/p' "$WORK/sluiced.log" | head -1)
# A short warm-up (connections, the table's first growth), then the run.
"$BENCH" --addr "127.0.0.1:$RLS_PORT" --streams "$STREAMS" --seconds 1 >/dev/null
"$BENCH" --addr "127.0.0.1:$RLS_PORT" --streams "$STREAMS" --seconds "$RUN_S" | tee "$WORK/sluice.json"
kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true
PIDS=()

echo "== redis-server: INCRBY + EXPIRE's round trip (redis-benchmark -P 2), 50 connections"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
N=$(python3 -c "import json; d=json.load(open('$WORK/sluice.json')); print(max(200000, int(d['calls_per_s'] * $RUN_S * 2)))")
redis-benchmark -p "$REDIS_PORT" -c 50 -P 2 -n "$N" -r 100000 --csv \
  INCRBY 'rl:__rand_int__' 1 | tee "$WORK/redis.csv"

python3 - "$WORK/sluice.json" "$WORK/redis.csv" "$OUT" "$STREAMS" "$SHARDS" "$RUN_S" <<'PY'
import csv, json, sys
sluice = json.load(open(sys.argv[1]))
rows = list(csv.reader(open(sys.argv[2])))
# redis-benchmark --csv: "test","rps","avg_latency_ms","min","p50","p95","p99","max"
head, vals = rows[0], rows[1]
col = {h: i for i, h in enumerate(head)}
commands = float(vals[col["rps"]])
calls = commands / 2  # INCRBY and EXPIRE: two commands per call
p99_ms = float(vals[col["p99_latency_ms"]])
out, streams, shards, run_s = sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
ratio = sluice["calls_per_s"] / calls
lines = []
w = lines.append
w("## Envoy's rate limit service (gRPC)")
w("")
w("From `bash benches/rls.sh` (one run; %s s; this machine's 2 cores run the server "
  "and the load generator both). `sluice-rls-bench`: %s concurrent streams over 4 HTTP/2 "
  "connections, one descriptor per `ShouldRateLimit` (remote_address, 100,000 addresses, "
  "each under its 1,000 a second), against `sluiced --rls-port` on %s shards." % (run_s, streams, shards))
w("")
w("| | calls/s | p50 | p99 | p99.9 | failed |")
w("|---|---:|---:|---:|---:|---:|")
w("| Sluice, `ShouldRateLimit` over gRPC | %s | %d us | %d us | %d us | %d |" % (
    f"{sluice['calls_per_s']:,.0f}", sluice["p50_us"], sluice["p99_us"], sluice["p999_us"], sluice["failed"]))
w("| Redis alone, envoyproxy/ratelimit's part of a call (INCRBY + EXPIRE, one round trip, 50 connections) | %s | | %d us | | |" % (
    f"{calls:,.0f}", p99_ms * 1000))
w("")
w("Sluice / Redis alone: **%.2fx**. The baseline is only the Redis round trip "
  "envoyproxy/ratelimit makes per descriptor: its gRPC server, its Go code and "
  "its own network hop to Redis come on top of it, so the real envoyproxy/ratelimit "
  "on this machine would be slower than that row (it could not be built here: "
  "Debian's Go is 1.19 and no Go module proxy is reachable). Sluice's row "
  "includes everything: HTTP/2, protobuf, the rule lookup and the decision on "
  "the owning shard." % ratio)
text = "\n".join(lines) + "\n"
open(out, "w").write(text)
print(text)
PY

python3 "$ROOT/benches/splice.py" "$ROOT/BENCHMARKS.md" "$OUT"
echo "== wrote $OUT and its section of BENCHMARKS.md"
