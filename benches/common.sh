# What benches/entry.sh and benches/rls.sh share (sourced, not run): a
# work directory removed at exit with every process in PIDS killed, the
# release build with the rate limit service, the one-descriptor rules both
# load, and helpers. Expects ROOT (the repository) and sets WORK, PIDS,
# the rules file $WORK/bench.yaml, TCK.
WORK=$(mktemp -d "/tmp/sluice-$(basename "$0" .sh).XXXXXX")
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

cat >"$WORK/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 1000 }
YAML

# two_groups A B: the cluster file of two groups, `a` with primary A and
# `b` with primary B (host:port), at $WORK/cluster.toml (entry.sh and
# entry-callgrind.sh).
two_groups() {
  cat >"$WORK/cluster.toml" <<TOML
[[groups]]
name = "a"
primary = "$1"

[[groups]]
name = "b"
primary = "$2"
TOML
}
# wait_line FILE TEXT: until TEXT is in FILE (10 s at most).
wait_line() {
  for _ in $(seq 1 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "no '$2' in $1:"; cat "$1"; exit 1
}
# cpu_ticks PID: its utime + stime so far, in clock ticks (of TCK a second).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)
