#!/usr/bin/env bash
# Priority classes under overload (issue 16), one command: one shared key
# (a token bucket) offered about five times its capacity by `sluice bench`,
# each request's class drawn 60 % low, 30 % normal, 10 % critical. Two runs
# against fresh nodes, the same generator and settings: the baseline with
# no reserves, then with reserve=critical:20% and reserve=normal:50%.
# Prints and writes benches/priority.md (each class's offered and admitted
# rates and its share of what was admitted, then the reserved run's
# timeline), and puts that section into BENCHMARKS.md (benches/report.py
# includes it when compare.sh rewrites the file). Fails if critical
# requests got less than their reserved 20 % of any overloaded step.
#
# Usage: bash benches/priority.sh
# Environment: PORT (7790), SECONDS_PER_RUN (5), OVERLOAD (5: offered /
# capacity), OUT (benches/priority.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PORT=${PORT:-7790}
RUN_S=${SECONDS_PER_RUN:-5}
OVERLOAD=${OVERLOAD:-5}
OUT=${OUT:-$ROOT/benches/priority.md}
WORK=$(mktemp -d /tmp/sluice-priority.XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== build (release)"
cargo build --release --quiet -p sluice-server -p sluice-cli --bins
SLUICED=$ROOT/target/release/sluiced
SLUICE=$ROOT/target/release/sluice

# A fresh node (one shard: the one key's), waited for by its first line.
fresh() {
  [ -n "$PID" ] && { kill "$PID"; wait "$PID" 2>/dev/null || true; }
  "$SLUICED" --bind 127.0.0.1 --port "$PORT" --shards 1 >"$WORK/node.log" 2>&1 &
  PID=$!
  for _ in $(seq 200); do
    grep -q "listening on" "$WORK/node.log" 2>/dev/null && return
    sleep 0.05
  done
  echo "sluiced did not start" >&2
  exit 1
}

bench() { # NAME SECONDS RATE [FLAGS...]
  local name=$1 secs=$2 rate=$3
  shift 3
  "$SLUICE" --addr "127.0.0.1:$PORT" bench --connections 8 --pipeline 16 --keys 1 \
    --kind token-bucket --rate "$rate/s" --burst $((rate / 10)) \
    --priority-mix 60,30,10 --interval-ms 500 --requests 1000000000 \
    --duration-s "$secs" --json "$@" >"$WORK/$name.json"
}

echo "== calibrate: what the generator offers one key"
fresh
bench calibrate 2 1000000000
OFFERED=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1]))['ops_per_s']))" "$WORK/calibrate.json")
RATE=$((OFFERED / OVERLOAD))
echo "   offered ${OFFERED}/s; capacity ${RATE}/s"

echo "== baseline: no reserves"
fresh
bench plain "$RUN_S" "$RATE"
echo "== reserve=critical:20% reserve=normal:50%"
fresh
bench reserved "$RUN_S" "$RATE" --reserve critical:20% --reserve normal:50%

python3 - "$WORK/plain.json" "$WORK/reserved.json" "$RATE" "$OUT" <<'EOF'
import json, sys
plain, reserved = (json.load(open(p)) for p in sys.argv[1:3])
rate, out = int(sys.argv[3]), sys.argv[4]
lines = []
w = lines.append
w("## Priority classes under overload")
w("")
w("One key, a token bucket of capacity C = %s/s (burst C/10), offered by "
  "`sluice bench` (8 connections x pipeline 16, one shard) about %.1f times C in "
  "the baseline run and %.1f times in the reserved one; each request's class drawn "
  "60 %% low, 30 %% normal, 10 %% critical. Baseline: no reserves. Reserved: "
  "`reserve=critical:20%%,reserve=normal:50%%`. %s s each, fresh nodes; written by "
  "`bash benches/priority.sh`." % (f"{rate:,}", plain["ops_per_s"] / rate,
                                   reserved["ops_per_s"] / rate, round(plain["seconds"])))
w("")
w("| class | offered/s | admitted/s, baseline | share, baseline | admitted/s, reserved | share, reserved |")
w("|---|---:|---:|---:|---:|---:|")
for a, b in zip(plain["classes"]["by_class"], reserved["classes"]["by_class"]):
    w("| %s | %s | %s | %.1f %% | %s | %.1f %% |" % (
        a["class"], f"{b['sent'] / reserved['seconds']:,.0f}",
        f"{a['admitted'] / plain['seconds']:,.0f}", 100 * a["share"],
        f"{b['admitted'] / reserved['seconds']:,.0f}", 100 * b["share"]))
w("")
step = reserved["classes"]["interval_ms"]
w("Reserved run, admitted per second in each %d ms step (the last step is partial):" % step)
w("")
w("| from | low | normal | critical | critical's share |")
w("|---:|---:|---:|---:|---:|")
short = []
timeline = reserved["classes"]["timeline"]
whole = int(reserved["seconds"] * 1000 // step)
for i, (low, normal, critical) in enumerate(timeline):
    total = low + normal + critical
    share = critical / total if total else 0.0
    per_s = lambda n: f"{n * 1000 / step:,.0f}"
    w("| %d ms | %s | %s | %s | %.1f %% |" % (i * step, per_s(low), per_s(normal), per_s(critical), 100 * share))
    if i < whole and total and share < 0.20:
        short.append(i * step)
w("")
ok = not short
w("Critical requests received at least their reserved 20 %% of what was admitted "
  "in every whole step: **%s**." % ("yes" if ok else "no, at " + ", ".join(f"{t} ms" for t in short)))
low, normal, crit = reserved["classes"]["by_class"]
asked = lambda c: 100 * c["admitted"] / max(c["sent"], 1)
w("Without reserves the bucket admits classes as they arrive, so critical gets about "
  "its 10 %% of the offered mix. With them, critical got %.0f %% of what it asked for, "
  "normal %.1f %% and low %.2f %% (of what each asked for): while critical asks for "
  "less than the capacity, normal gets what critical leaves above normal's floor; "
  "low gets little more than the first burst." % (asked(crit), asked(normal), asked(low)))
text = "\n".join(lines) + "\n"
open(out, "w").write(text)
print(text)
sys.exit(0 if ok else 1)
EOF

# Into BENCHMARKS.md: replace the section if there, else before the notes.
python3 "$ROOT/benches/splice.py" "$ROOT/BENCHMARKS.md" "$OUT"
echo "== wrote $OUT and its section of BENCHMARKS.md"
