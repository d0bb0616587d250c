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
