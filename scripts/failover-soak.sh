#!/usr/bin/env bash
# The failover soak: ROUNDS (default 100) kill -9 rounds of a primary under
# load, each followed by promotion of its follower and the dead node's
# return as the new follower; prints one line per round (admitted,
# over-admission, unknown-outcome calls, unavailable window) and a summary.
# Sync mode must over-admit nothing: the script exits non-zero otherwise.
# Usage: bash scripts/failover-soak.sh [ROUNDS] [sync|async]
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_ROUNDS="${1:-100}" SOAK_MODE="${2:-sync}"
cargo build --release --workspace --bins --quiet
export SLUICE_BIN_DIR="$PWD/target/release"
cargo test --release -p sluice-tests --test replication_soak -- --ignored --nocapture 2>&1 \
  | grep -v "WARN\|^$"
