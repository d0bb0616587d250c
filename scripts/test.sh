#!/usr/bin/env bash
# Runs every test Sluice has: the loom models of the connection-to-shard
# handoff, unit and property tests, and the integration tests that start
# real sluiced processes on loopback.
# Usage: bash scripts/test.sh   (from anywhere in the repo)
set -euo pipefail
cd "$(dirname "$0")/.."

# protoc and etcd (Debian packages), when missing.
bash scripts/deps.sh

echo "== loom models of the cross-thread handoff"
# Release without LTO or debug info: the models run in well under a second
# either way, and the build is a third shorter.
RUSTFLAGS="--cfg sluice_loom" LOOM_MAX_PREEMPTIONS=2 \
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  cargo test -p sluice-loom-tests --release --target-dir target/loom --test handoff --test promotion --test over_limit

echo "== build (binaries the integration tests start)"
# --all-features: sluiced with etcd (--coordinator), for tests/tests/etcd_failover.rs.
cargo build --workspace --bins --all-features --quiet
# The example gateway (feature `tower`) that tests/tests/gateway_http.rs
# starts: target/debug/examples/gateway.
cargo build -p sluice-client --example gateway --features tower --quiet
# The client as a gateway that builds its topology in code links it: no
# serde, no toml (feature `toml` off).
cargo check -p sluice-client --no-default-features --quiet
# The integration tests start these; building once here spares each test
# process its own `cargo build`.
export SLUICE_BIN_DIR="$PWD/target/debug"

echo "== unit, property and integration tests"
# --all-features: the `tower` layer's unit tests too.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast
else
  cargo test --workspace --all-features --no-fail-fast
fi
