#!/usr/bin/env bash
# What building and testing Sluice needs beyond the Rust toolchain, from
# Debian's packages: protoc (the etcd client's build compiles etcd's .proto
# files) and etcd itself (the etcd tests start one on loopback). Installs
# only what is missing.
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]} (apt)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
# redis-cli (redis-tools) and redis-py from PyPI in a venv of the
# project's (target/redis-py), for tests/tests/resp_clients.rs: Redis
# client libraries no one here wrote, against the RESP listener.
if ! command -v redis-cli >/dev/null 2>&1; then
  echo "== installing redis-tools (apt)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-tools >/dev/null
fi
venv="$(dirname "$0")/../target/redis-py"
if ! "$venv/bin/python" -c 'import redis' >/dev/null 2>&1; then
  echo "== installing redis-py (PyPI) into target/redis-py"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q redis
fi
