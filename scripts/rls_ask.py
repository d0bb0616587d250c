"""Asks an Envoy rate limit service what Envoy would: one ShouldRateLimit
call, printed as protobuf text. Needs grpcio and xds-protos (scripts/deps.sh
puts them in target/redis-py).

Usage: rls_ask.py HOST:PORT DOMAIN KEY=VALUE[,KEY=VALUE...] [...] [--hits N]
  each argument after DOMAIN is one descriptor; its entries are joined by ','
"""

import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

args = sys.argv[1:]
hits = 0
if "--hits" in args:
    i = args.index("--hits")
    hits = int(args[i + 1])
    del args[i : i + 2]
if len(args) < 3:
    sys.exit(__doc__)
addr, domain, descriptors = args[0], args[1], args[2:]
Entry = ratelimit_pb2.RateLimitDescriptor.Entry
request = rls_pb2.RateLimitRequest(
    domain=domain,
    hits_addend=hits,
    descriptors=[
        ratelimit_pb2.RateLimitDescriptor(
            entries=[Entry(key=e.split("=", 1)[0], value=e.split("=", 1)[1]) for e in d.split(",")]
        )
        for d in descriptors
    ],
)
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(addr))
try:
    print(stub.ShouldRateLimit(request, timeout=5), end="")
except grpc.RpcError as e:
    sys.exit(f"{e.code().name}: {e.details()}")
