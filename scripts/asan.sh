#!/usr/bin/env bash
# The table's unit and property tests (server/src/shard: the bucket map and
# the table over it) under AddressSanitizer, on the nightly toolchain. Miri
# is not installed on these machines; this is the check of the memory
# handling instead. About 5 minutes on 2 cores the first time (nightly
# builds every dependency with the sanitizer), seconds after.
# Usage: bash scripts/asan.sh [TEST FILTER]   (default: shard::)
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" \
  cargo +nightly test -p sluice-server --lib --target x86_64-unknown-linux-gnu \
  --target-dir target/asan -- "${1:-shard::}"
