#!/usr/bin/env bash
# Runs every test Sluice has: unit and property tests, integration tests
# against real sluiced processes on loopback, and the loom models.
# Usage: bash scripts/test.sh   (from anywhere in the repo)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== build (binaries the integration tests start)"
cargo build --workspace --bins --quiet
# The integration tests start these; building once here spares each test
# process its own `cargo build`.
export SLUICE_BIN_DIR="$PWD/target/debug"

echo "== unit, property and integration tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
  # nextest does not run doctests.
  cargo test --workspace --doc --quiet
else
  cargo test --workspace --no-fail-fast
fi

echo "== loom models of the cross-thread handoff"
RUSTFLAGS="--cfg sluice_loom" LOOM_MAX_PREEMPTIONS=2 \
  cargo test -p sluice-loom-tests --release --target-dir target/loom
