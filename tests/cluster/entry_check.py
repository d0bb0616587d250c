"""Clients no one here wrote, spreading their calls round robin over every
node of a Sluice cluster, as Envoy (a STRICT_DNS cluster of all the rate
limit servers) and a Redis client pool do: redis-py's CL.THROTTLE on the
RESP ports, grpcio's ShouldRateLimit on the rate limit service ports.
Prints one JSON object: what each key was granted.

Usage: entry_check.py MODE ARGS... -- PORT...
  resp MAX_BURST ATTEMPTS KEY...        CL.THROTTLE KEY MAX_BURST 1 3600, ATTEMPTS times a key
  rls ATTEMPTS VALUE...                 domain entry, (user, VALUE), ATTEMPTS times a value
  pair ATTEMPTS USER PAIR               domain entry, [(user, USER), (pair, PAIR)] ATTEMPTS
                                        times, then (user, USER) once: its limit_remaining
  queue ATTEMPTS VALUE                  domain entry, (user, VALUE) ATTEMPTS times at once to the
                                        first port; prints "sent" once they are on their way, then
                                        waits for every answer (10 s each)
"""

import json
import sys

args = sys.argv[1:]
split = args.index("--")
mode, rest, ports = args[0], args[1:split], args[split + 1 :]

if mode == "resp":
    import redis

    clients = [redis.Redis(host="127.0.0.1", port=int(p), protocol=2) for p in ports]
    max_burst, attempts, keys = int(rest[0]), int(rest[1]), rest[2:]
    granted = {k: 0 for k in keys}
    errors = []
    for attempt in range(attempts):
        for i, k in enumerate(keys):
            # Every key visits every node in turn.
            c = clients[(attempt + i) % len(clients)]
            try:
                r = c.execute_command("CL.THROTTLE", k, max_burst, 1, 3600)
            except redis.RedisError as e:
                errors.append(str(e))
                continue
            if r[0] == 0:
                granted[k] += 1
    print(json.dumps({"granted": granted, "errors": errors[:5], "error_count": len(errors)}))
else:
    import grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    stubs = [
        rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(f"127.0.0.1:{p}")) for p in ports
    ]

    def descriptor(k, v):
        return ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v)]
        )

    def ask(n, *ds):
        request = rls_pb2.RateLimitRequest(domain="entry", descriptors=list(ds))
        return stubs[n % len(stubs)].ShouldRateLimit(request, timeout=10)

    OK = rls_pb2.RateLimitResponse.OK
    if mode == "rls":
        attempts, values = int(rest[0]), rest[1:]
        granted = {v: 0 for v in values}
        errors = []
        for attempt in range(attempts):
            for i, v in enumerate(values):
                try:
                    r = ask(attempt + i, descriptor("user", v))
                except grpc.RpcError as e:
                    errors.append(f"{e.code()}: {e.details()}")
                    continue
                if r.overall_code == OK:
                    granted[v] += 1
        print(json.dumps({"granted": granted, "errors": errors[:5], "error_count": len(errors)}))
    elif mode == "pair":
        attempts, user, pair = int(rest[0]), rest[1], rest[2]
        ok = 0
        for n in range(attempts):
            r = ask(n, descriptor("user", user), descriptor("pair", pair))
            ok += r.overall_code == OK
        last = ask(attempts, descriptor("user", user))
        print(json.dumps({"ok": ok, "user_remaining": last.statuses[0].limit_remaining}))
    elif mode == "queue":
        import time

        attempts, value = int(rest[0]), rest[1]
        request = rls_pb2.RateLimitRequest(domain="entry", descriptors=[descriptor("user", value)])
        calls = [stubs[0].ShouldRateLimit.future(request, timeout=10) for _ in range(attempts)]
        # grpcio sends from its own threads: give them a moment to write.
        time.sleep(0.3)
        print("sent", flush=True)
        granted, errors = 0, []
        for c in calls:
            try:
                granted += c.result().overall_code == OK
            except grpc.RpcError as e:
                errors.append(f"{e.code()}: {e.details()}")
        print(json.dumps({"granted": {value: granted}, "errors": errors[:5], "error_count": len(errors)}))
    else:
        sys.exit(f"unknown mode {mode}")
