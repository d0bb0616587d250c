#!/usr/bin/env bash
# The deterministic simulation of a primary/follower group
# (server/tests/simulation.rs) over more seeds than CI runs: N seeds
# (default 100000) from FIRST (default 0), in release. A failing seed is
# printed; rerun it alone with its trace:
#   SLUICE_SIM_SEED=S SLUICE_SIM_TRACE=1 cargo test -p sluice-server --test simulation -- --nocapture
# and add it to REGRESSIONS in the test.
# Usage: bash scripts/simulate.sh [N] [FIRST]
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICE_SIM_SEEDS=${1:-100000} SLUICE_SIM_FIRST=${2:-0} \
  cargo test --release -q -p sluice-server --test simulation -- --nocapture
