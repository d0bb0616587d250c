#!/usr/bin/env bash
# What building and testing Sluice needs beyond the Rust toolchain, from
# Debian's packages: protoc (the etcd client's build compiles etcd's .proto
# files), etcd itself (the etcd tests start one on loopback) and promtool;
# and the Redis clients the RESP tests use. Installs only what is missing.
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
# make: jemalloc's build (tikv-jemalloc-sys, sluiced's allocator) runs it.
command -v make >/dev/null 2>&1 || need+=(make)
# openssl makes the self-signed certificate of the TLS tests
# (tests/tests/security.rs).
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# promtool (Debian's prometheus package, without its recommended extras),
# which checks a real scrape of the admin port's /metrics
# (tests/tests/admin.rs).
lean=()
command -v promtool >/dev/null 2>&1 || lean+=(prometheus)
if [ ${#need[@]} -gt 0 ] || [ ${#lean[@]} -gt 0 ]; then
  echo "== installing ${need[*]} ${lean[*]} (apt)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  # Install the packages, start none of their services (a policy-rc.d
  # that says no, as container images do, unless one is there already).
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod +x "$policy"
  fi
  export DEBIAN_FRONTEND=noninteractive
  if [ ${#need[@]} -gt 0 ]; then
    $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if [ ${#lean[@]} -gt 0 ]; then
    $sudo apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
  fi
  [ -z "$policy" ] || $sudo rm -f "$policy"
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
# grpcio and Envoy's message types (xds-protos, generated from
# envoyproxy/data-plane-api) in the same venv, for tests/tests/rls_envoy.rs:
# a gRPC client no one here wrote, against the Envoy rate limit service.
if ! "$venv/bin/python" -c 'import grpc, envoy.service.ratelimit.v3.rls_pb2' >/dev/null 2>&1; then
  echo "== installing grpcio and xds-protos (PyPI) into target/redis-py"
  "$venv/bin/pip" install -q grpcio protobuf xds-protos
fi
