#!/usr/bin/env bash
# The drills behind DRILLS.md: a 100-round sync-mode drill and a 100-round
# async-mode drill, each with mixed faults (kill -9, SIGSTOP/SIGCONT, a cut
# link, a planned handover) on a local cluster of 2 groups, under the
# default load. Each writes its summary (summary.txt), report.md,
# drill.svg, drill.json and the nodes' logs (nodes/, not committed) into
# docs/drills/MODE/. About 5 minutes per mode.
# Usage: bash scripts/drills.sh [ROUNDS] [MODE...]   (default: 100 sync async)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-100}"
shift || true
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(sync async)
cargo build --release --bins --quiet
status=0
for mode in "${modes[@]}"; do
  out="docs/drills/$mode"
  rm -rf "$out" && mkdir -p "$out"
  cmd=(sluice drill --local --groups 2 --replication "$mode"
       --rounds "$rounds" --fault mixed --report "$out")
  echo "\$ ${cmd[*]}" > "$out/summary.txt"
  set +e
  PATH="$PWD/target/release:$PATH" "${cmd[@]}" | tee -a "$out/summary.txt"
  code=${PIPESTATUS[0]}
  set -e
  echo "exit status $code" >> "$out/summary.txt"
  [ "$code" -eq 0 ] || status=$code
done
exit $status
