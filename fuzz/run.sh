#!/usr/bin/env bash
# Runs every fuzz target (libFuzzer, with AddressSanitizer) for SECONDS
# each (default 10), from the seed corpora in fuzz/seeds/ (the golden
# vectors, the README's commands, the example config) and what earlier
# runs found (fuzz/corpus/, not in git).
#
# Needs the nightly toolchain (cargo +nightly); it builds the targets as
# `cargo fuzz build` does (the same flags), so cargo-fuzz itself is not
# needed (developers may use `cargo +nightly fuzz run TARGET` as well).
# Without nightly it says so and runs the stable harness instead: the
# property tests of the same decoders and of the limiter.
#
# Usage: bash fuzz/run.sh [SECONDS] [TARGET...]
# A crash leaves its input in fuzz/artifacts/TARGET/ and fails the run;
# docs/FUZZING.md says what each one found became.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-10}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(frame_request reply resp config replication snapshot limiter_model)
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: no nightly toolchain here (rustup toolchain install nightly);"
  echo "running the stable harness instead: the decoders' and the limiter's property tests"
  cd ..
  exec cargo test -q -p sluice-protocol -p sluice-server
fi
triple=x86_64-unknown-linux-gnu
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags+=" -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
flags+=" -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Zsanitizer=address"
flags+=" -Cdebug-assertions -Cforce-frame-pointers"
echo "== build (nightly, libFuzzer + AddressSanitizer)"
RUSTFLAGS="$flags" cargo +nightly build --quiet --release --target "$triple" --bins
bin=target/$triple/release
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  echo "== $t, ${seconds}s"
  log=$(mktemp)
  if ! "$bin/$t" "corpus/$t" "${seeds[@]}" -max_total_time="$seconds" \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1; then
    status=1
    grep -E "panicked|ERROR: AddressSanitizer|SUMMARY|Test unit written" "$log" >&2 || tail -20 "$log" >&2
    echo "fuzz/run.sh: $t crashed; its input is in fuzz/artifacts/$t/" >&2
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
  rm -f "$log"
done
exit $status
