#!/usr/bin/env bash
# The pause drills behind DRILLS.md's "Pauses" table (issue 40): SIGSTOP of
# a group's primary for 1 s and for 5 s, in sync and in async mode, ROUNDS
# rounds each (100 by default) on a local cluster of 2 groups under the
# default load. Each writes its summary (summary.txt, the command on its
# first line), report.md, drill.svg and drill.json into
# docs/drills/pause-MODE-Ns/. About 4 minutes a mode for 1 s pauses and 13
# for 5 s pauses at 100 rounds.
# Usage: bash scripts/pause-drills.sh [ROUNDS] [MODE-SECONDS...]
#        (default: 100 sync-1 async-1 sync-5 async-5)
# ENTRY=v1|resp|rls: the load through random nodes' entry points (every
# node started with --cluster) instead of the cluster client, into
# docs/drills/pause-MODE-Ns-ENTRY/.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-100}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(sync-1 async-1 sync-5 async-5)
entry="${ENTRY:-client}"
cargo build --release --bins --quiet --features sluice-server/rls,sluice-cli/rls
status=0
for run in "${runs[@]}"; do
  mode=${run%-*}
  seconds=${run#*-}
  out="docs/drills/pause-$mode-${seconds}s"
  [ "$entry" = client ] || out="$out-$entry"
  rm -rf "$out" && mkdir -p "$out"
  cmd=(sluice drill --local --groups 2 --replication "$mode" --rounds "$rounds"
       --fault pause --pause-ms "${seconds}000" --report "$out")
  [ "$entry" = client ] || cmd+=(--entry "$entry")
  echo "\$ ${cmd[*]}" > "$out/summary.txt"
  set +e
  PATH="$PWD/target/release:$PATH" "${cmd[@]}" 2>&1 | tee -a "$out/summary.txt"
  code=${PIPESTATUS[0]}
  set -e
  echo "exit status $code" >> "$out/summary.txt"
  [ "$code" -eq 0 ] || status=$code
done
exit $status
