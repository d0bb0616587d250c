"""Envoy's rate limit API, asked of a real sluiced by a gRPC client no one
here wrote: grpcio, with Envoy's message types from PyPI's xds-protos
(generated from envoyproxy/data-plane-api). The cases follow what
envoyproxy/ratelimit's README documents for the rule files in
tests/rls/rules/, plus Sluice's own (all or nothing, refunds, algorithms).

Usage: envoy_rls_check.py PORT MODE [ARGS]
  examples         every documented case; prints "CASE: ok" for each
  headers PREFIX   the reply carries PREFIX-Limit/-Remaining/-Reset
  limit D K V      prints the requests_per_unit of (K, V) in domain D, or none
  unavailable      every request is refused with UNAVAILABLE (a follower)
  unlimited N      N calls matching only the unlimited rule of example7
  limited          one call matching example7's limited rule
  share_threshold  the values of a share_threshold wildcard share one limit
  hits_zero        a descriptor's hits_addend of 0 checks without spending
  reset            duration_until_reset is whole seconds, rounded up
  wildcards        wildcard values match as envoyproxy/ratelimit matches them
  replaces_unlimited  replaces beside unlimited rules
  auth TOKEN       calls without the token, or with a wrong one, are
                   UNAUTHENTICATED and spend nothing; with it they count
  open             a call without a token is answered
  tls CA TOKEN     over TLS (CA: the server's certificate, for localhost)
                   a call with the token is answered; in clear, none is
  over_limit V     a key over its limit (domain "sluice", a=V..., 5 a day)
                   is denied with the shard's own numbers however it is
                   answered, and a refund makes room at once
  concurrent N     N calls at once on each of the six tenants of domain
                   "conc" (t{i}: 10 + i an hour): each tenant admits exactly
                   its limit, every answer carries its own tenant's limit,
                   and the admitted ones' remainders are each left once
"""

import sys
import time

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit
U32_MAX = 2**32 - 1

port = sys.argv[1]
mode = sys.argv[2]
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def descriptor(entries, hits=None, negative=False, limit=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if negative:
        # is_negative_hits is field 4 (bool) of RateLimitDescriptor, newer
        # than xds-protos 1.85: encoded by hand from its published number,
        # and carried as an unknown field.
        d = ratelimit_pb2.RateLimitDescriptor.FromString(d.SerializeToString() + b"\x20\x01")
    if limit is not None:
        d.limit.CopyFrom(
            ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
                requests_per_unit=limit[0], unit=limit[1]
            )
        )
    return d


def ask(domain, *descriptors, hits=0, timeout=10):
    ds = [d if isinstance(d, ratelimit_pb2.RateLimitDescriptor) else descriptor(d) for d in descriptors]
    request = rls_pb2.RateLimitRequest(domain=domain, descriptors=ds, hits_addend=hits)
    return stub.ShouldRateLimit(request, timeout=timeout)


def expect(response, overall, *statuses):
    """statuses: (code, requests_per_unit or None, remaining or None)."""
    assert response.overall_code == overall, response
    assert len(response.statuses) == len(statuses), response
    for s, (code, rpu, remaining) in zip(response.statuses, statuses):
        assert s.code == code, (response, statuses)
        if rpu is None:
            assert not s.HasField("current_limit"), response
        else:
            assert s.current_limit.requests_per_unit == rpu, response
        if remaining is not None:
            assert s.limit_remaining == remaining, (response, statuses)


def in_one_second(case):
    """Runs a case whose limits are per second within one aligned second:
    starts it early in a second (an alignment wait, not a wait for time to
    pass in the algorithm) and runs it again with fresh keys if it spilled
    into the next."""
    for attempt in range(5):
        frac = time.time() % 1
        if frac > 0.3 or attempt > 0:
            time.sleep(1.02 - frac)
        start = time.time()
        try:
            case(f"{attempt}")
        except AssertionError:
            if int(time.time()) != int(start):
                continue
            raise
        if int(time.time()) == int(start):
            return
    raise AssertionError("five attempts each crossed a second")


def examples():
    # Example 1: 500 a second for database=users and database=default.
    def mongo(run):
        # Fresh values per attempt are not possible (the rule names them), so
        # an attempt that spilled into the next second starts a fresh window.
        expect(ask("mongo_cps", [("database", "users")], hits=500), OK, (OK, 500, 0))
        expect(ask("mongo_cps", [("database", "users")]), OVER, (OVER, 500, 0))
        expect(ask("mongo_cps", [("database", "default")], hits=499), OK, (OK, 500, 1))

    in_one_second(mongo)
    r = ask("mongo_cps", [("database", "users")])
    assert r.statuses[0].current_limit.unit == Unit.SECOND, r
    expect(ask("mongo_cps", [("database", "other")]), OK, (OK, None, 0))
    print("mongo_cps: ok")

    # Example 2: 5 marketing messages a day per number; 100 a day per number.
    marketing = lambda n: [("message_type", "marketing"), ("to_number", n)]
    for left in [4, 3, 2, 1, 0]:
        expect(ask("messaging", marketing("2061111111")), OK, (OK, 5, left))
    expect(ask("messaging", marketing("2061111111")), OVER, (OVER, 5, 0))
    expect(ask("messaging", marketing("2062222222")), OK, (OK, 5, 4))
    expect(ask("messaging", [("to_number", "2061111111")]), OK, (OK, 100, 99))
    expect(ask("messaging", [("message_type", "marketing")]), OK, (OK, None, 0))
    r = ask("messaging", [("to_number", "2061111111")])
    assert r.statuses[0].current_limit.unit == Unit.DAY, r
    reset = r.statuses[0].duration_until_reset.seconds
    assert abs(reset - (86400 - time.time() % 86400)) < 3, r
    print("messaging: ok")

    # Example 3: 10 a second per address; 50.0.0.5 always limited.
    for _ in range(3):
        expect(ask("edge_proxy_per_ip", [("remote_address", "50.0.0.5")]), OVER, (OVER, 0, 0))

    def per_ip(run):
        a, b = f"10.0.{run}.1", f"10.0.{run}.2"
        expect(ask("edge_proxy_per_ip", [("remote_address", a)], hits=10), OK, (OK, 10, 0))
        expect(ask("edge_proxy_per_ip", [("remote_address", a)]), OVER, (OVER, 10, 0))
        expect(ask("edge_proxy_per_ip", [("remote_address", b)]), OK, (OK, 10, 9))

    in_one_second(per_ip)
    print("edge_proxy_per_ip: ok")

    # replaces: bar's rule replaces key_value's in a request that has both.
    for left in [2, 1, 0]:
        expect(
            ask("example4", [("key", "value")], [("bar", "x")]),
            OK,
            (OK, None, 0),
            (OK, 3, left),
        )
    expect(ask("example4", [("key", "value")], [("bar", "x")]), OVER, (OK, None, 0), (OVER, 3, 0))
    # Alone, key_value's limit applies, and the requests above never counted.
    expect(ask("example4", [("key", "value")]), OK, (OK, 10, 9))
    print("replaces: ok")

    # shadow_mode: counted, never denied.
    def shadow(run):
        ip = f"10.1.{run}.1"
        expect(ask("example5", [("remote_address", ip)], hits=10), OK, (OK, 10, 0))
        for _ in range(3):
            expect(ask("example5", [("remote_address", ip)]), OK, (OK, 10, 0))
        expect(ask("example5", [("remote_address", f"10.1.{run}.2")], hits=4), OK, (OK, 10, 6))

    in_one_second(shadow)
    expect(ask("example5", [("remote_address", "10.1.9.9")], hits=11), OK, (OK, 10, 0))
    print("shadow_mode: ok")

    # Wildcards: each bb* destination its own limit of 1 a second.
    def wildcard(run):
        dest = lambda d: [("source_cluster", "proxy"), ("destination_cluster", d)]
        expect(ask("example6", dest(f"bb{run}a")), OK, (OK, 1, 0))
        expect(ask("example6", dest(f"bb{run}a")), OVER, (OVER, 1, 0))
        expect(ask("example6", dest(f"bb{run}b")), OK, (OK, 1, 0))
        expect(ask("example6", dest(f"cc{run}")), OK, (OK, None, 0))

    in_one_second(wildcard)
    print("wildcard: ok")

    # unlimited: never counted, never denied; its sibling is limited.
    for _ in range(5):
        expect(
            ask("example7", [("key1", "value1"), ("user", "alice")], hits=1_000_000),
            OK,
            (OK, None, U32_MAX),
        )
    expect(ask("example7", [("key1", "value1"), ("key2", "k")], hits=10), OK, (OK, 10, 0))
    expect(ask("example7", [("key1", "value1"), ("key2", "k")]), OVER, (OVER, 10, 0))
    print("unlimited: ok")

    # Sluice: a request over any limit consumes none of the others.
    # Eight pairs of keys: on 4 shards, some pairs are surely split.
    for i in range(8):
        a, b = ("a", f"x{i}"), ("b", f"x{i}")
        expect(ask("sluice", [a], [b]), OK, (OK, 5, 4), (OK, 1, 0))
        for _ in range(3):
            expect(ask("sluice", [a], [b]), OVER, (OK, 5, 4), (OVER, 1, 0))
        for left in [3, 2, 1, 0]:
            expect(ask("sluice", [a]), OK, (OK, 5, left))
        expect(ask("sluice", [a]), OVER, (OVER, 5, 0))
    # A cost over the limit: denied, and nothing else is spent.
    expect(ask("sluice", [("a", "y")], [("b", "y")], hits=2), OVER, (OK, 5, 5), (OVER, 1, 0))
    expect(ask("sluice", [("a", "y")]), OK, (OK, 5, 4))
    print("all_or_nothing: ok")

    # Per-descriptor hits override the request's; negative hits give back.
    expect(ask("sluice", descriptor([("a", "h")], hits=3), hits=1), OK, (OK, 5, 2))
    expect(ask("sluice", descriptor([("a", "h")], hits=2, negative=True)), OK, (OK, 5, 4))
    expect(ask("sluice", [("a", "h")], hits=3), OK, (OK, 5, 1))
    expect(ask("sluice", [("a", "h")], hits=2), OVER, (OVER, 5, 1))
    print("hits_addend: ok")

    # A descriptor's own limit, in a known domain.
    over = descriptor([("database", "users2")], limit=(2, Unit.MINUTE))
    expect(ask("mongo_cps", over), OK, (OK, 2, 1))
    expect(ask("mongo_cps", over), OK, (OK, 2, 0))
    expect(ask("mongo_cps", over), OVER, (OVER, 2, 0))
    expect(ask("no_such_domain", descriptor([("k", "v")], limit=(2, Unit.MINUTE))), OK, (OK, None, 0))
    print("override: ok")

    # The other algorithms.
    for left in [2, 1, 0]:
        expect(ask("sluice", [("bucket", "x")]), OK, (OK, 3, left))
    r = ask("sluice", [("bucket", "x")])
    expect(r, OVER, (OVER, 3, 0))
    assert r.statuses[0].duration_until_reset.seconds > 3000, r
    for kind in ["rolling", "log"]:
        expect(ask("sluice", [(kind, "x")]), OK, (OK, 2, 1))
        expect(ask("sluice", [(kind, "x")]), OK, (OK, 2, 0))
        expect(ask("sluice", [(kind, "x")]), OVER, (OVER, 2, 0))
    print("algorithms: ok")

    # Requests Envoy never sends: clear errors.
    for request, text in [
        (rls_pb2.RateLimitRequest(domain="", descriptors=[descriptor([("a", "b")])]), "domain"),
        (rls_pb2.RateLimitRequest(domain="sluice"), "descriptor"),
        (
            rls_pb2.RateLimitRequest(domain="sluice", descriptors=[descriptor([("a", "b")])] * 65),
            "at most 64",
        ),
    ]:
        try:
            stub.ShouldRateLimit(request, timeout=10)
            raise AssertionError(f"{request} was answered")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert text in e.details(), e.details()
    print("invalid: ok")


def concurrent(n):
    from concurrent.futures import ThreadPoolExecutor

    def call(i):
        tenant = i % 6
        # A call decided in place may be held until its thread's hops to
        # other shards are answered (server/src/rls/outbox.rs); a lost
        # release would leave it to its deadline, far above any answer's
        # time, so it fails here.
        r = ask("conc", [("tenant", f"t{tenant}")], timeout=3)
        s = r.statuses[0]
        return tenant, s.code, s.current_limit.requests_per_unit, s.limit_remaining

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(call, range(6 * n)))
    for tenant in range(6):
        limit = 10 + tenant
        mine = [a for a in answers if a[0] == tenant]
        assert all(a[2] == limit for a in mine), (tenant, mine)
        admitted = sorted(a[3] for a in mine if a[1] == OK)
        assert admitted == list(range(limit)), (tenant, mine)
    print("concurrent: ok")


if mode == "examples":
    examples()
elif mode == "concurrent":
    concurrent(int(sys.argv[3]))
elif mode == "over_limit":
    v1, v2 = sys.argv[3] + "-1", sys.argv[3] + "-2"
    for left in range(4, -1, -1):
        expect(ask("sluice", [("a", v1)]), OK, (OK, 5, left))
    for _ in range(20):
        r = ask("sluice", [("a", v1)])
        expect(r, OVER, (OVER, 5, 0))
        assert 0 < r.statuses[0].duration_until_reset.seconds <= 86400, r
    # A check (hits 0) is within it, over or not.
    expect(ask("sluice", descriptor([("a", v1)], hits=0)), OK, (OK, 5, 0))
    # A refund makes room for the next two at once.
    ask("sluice", descriptor([("a", v1)], hits=2, negative=True))
    expect(ask("sluice", [("a", v1)]), OK, (OK, 5, 1))
    expect(ask("sluice", [("a", v1)]), OK, (OK, 5, 0))
    expect(ask("sluice", [("a", v1)]), OVER, (OVER, 5, 0))
    # All or nothing: a request with the key over its limit spends nothing
    # on its other descriptor.
    expect(ask("sluice", [("a", v2)]), OK, (OK, 5, 4))
    expect(ask("sluice", [("a", v1)], [("a", v2)]), OVER, (OVER, 5, 0), (OK, 5, 4))
    expect(ask("sluice", [("a", v2)]), OK, (OK, 5, 3))
    print("over_limit: ok")
elif mode == "headers":
    prefix = sys.argv[3]
    r = ask("sluice", [("a", "x")], [("b", "x")])
    headers = {h.key: h.value for h in r.response_headers_to_add}
    # The limit closest to its end: b, 1 a day, 0 left.
    assert headers[f"{prefix}-Limit"] == "1", headers
    assert headers[f"{prefix}-Remaining"] == "0", headers
    reset = int(headers[f"{prefix}-Reset"])
    assert 0 < reset <= 86400, headers
    assert len(headers) == 3, headers
    # Over a limit, the headers are the limit's that denied, even where
    # another has less left (h1 has 1, h2 has 3 but is asked 4).
    ask("sluice", [("a", "h1")], hits=4)
    ask("sluice", [("a", "h2")], hits=2)
    r = ask("sluice", descriptor([("a", "h1")], hits=1), descriptor([("a", "h2")], hits=4))
    expect(r, OVER, (OK, 5, 1), (OVER, 5, 3))
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers[f"{prefix}-Remaining"] == "3", headers
    print("headers: ok")
elif mode == "limit":
    domain, key, value = sys.argv[3:6]
    r = ask(domain, [(key, value)])
    s = r.statuses[0]
    print(s.current_limit.requests_per_unit if s.HasField("current_limit") else "none")
elif mode == "unlimited":
    for i in range(int(sys.argv[3])):
        expect(
            ask("example7", [("key1", "value1"), ("user", f"u{i % 7}")], hits=1000),
            OK,
            (OK, None, U32_MAX),
        )
    print("unlimited: ok")
elif mode == "limited":
    expect(ask("example7", [("key1", "value1"), ("key2", "k")]), OK, (OK, 10, 9))
    print("limited: ok")
elif mode == "share_threshold":
    # Ten reports of any name use up the ten an hour of all of them.
    for left in range(9, -1, -1):
        expect(ask("shared", [("report", "reports/q1.pdf")]), OK, (OK, 10, left))
    for name in ["reports/q2.csv", "reports/", "reports/q1.pdf"]:
        expect(ask("shared", [("report", name)]), OVER, (OVER, 10, 0))
    # The exact value beside the wildcard is counted on its own.
    expect(ask("shared", [("report", "reports/annual")]), OK, (OK, 2, 1))
    # A wildcard without share_threshold: each value its own limit.
    expect(ask("shared", [("export", "exports/a")], hits=3), OK, (OK, 3, 0))
    expect(ask("shared", [("export", "exports/b")]), OK, (OK, 3, 2))
    # Every algorithm.
    for key in ["bucket", "rolling", "log"]:
        expect(ask("shared", [(key, f"{key}/a")], hits=2), OK, (OK, 2, 0))
        expect(ask("shared", [(key, f"{key}/b")]), OVER, (OVER, 2, 0))
    # Below a shared wildcard: the tenants share, the actions do not.
    tenant = lambda t, a: [("tenant", t), ("action", a)]
    expect(ask("shared", tenant("acme/x", "read"), hits=2), OK, (OK, 3, 1))
    expect(ask("shared", tenant("acme/y", "read")), OK, (OK, 3, 0))
    expect(ask("shared", tenant("acme/z", "read")), OVER, (OVER, 3, 0))
    expect(ask("shared", tenant("acme/z", "write")), OK, (OK, 3, 2))
    print("share_threshold: ok")
elif mode == "hits_zero":
    # A descriptor's hits_addend set to 0: answered, nothing spent.
    check = lambda v: descriptor([("a", v)], hits=0)
    expect(ask("sluice", check("c0")), OK, (OK, 5, 5))
    expect(ask("sluice", [("a", "c0")], hits=4), OK, (OK, 5, 1))
    for _ in range(3):
        expect(ask("sluice", check("c0")), OK, (OK, 5, 1))
    expect(ask("sluice", [("a", "c0")]), OK, (OK, 5, 0))
    # At the limit a check is still within it (0 more is not over), as
    # envoyproxy/ratelimit answers; the next unit is not.
    expect(ask("sluice", check("c0")), OK, (OK, 5, 0))
    expect(ask("sluice", [("a", "c0")]), OVER, (OVER, 5, 0))
    # The request's hits_addend of 0 is unset: 1.
    expect(ask("sluice", [("a", "c1")], hits=0), OK, (OK, 5, 4))
    # A check beside a spend that is denied: neither spends.
    expect(ask("sluice", [("b", "c2")]), OK, (OK, 1, 0))
    expect(ask("sluice", check("c2"), [("b", "c2")]), OVER, (OK, 5, 5), (OVER, 1, 0))
    # A check of a limit of 0 requests (50.0.0.5 is blocked): within it.
    blocked = descriptor([("remote_address", "50.0.0.5")], hits=0)
    expect(ask("edge_proxy_per_ip", blocked), OK, (OK, 0, 0))
    print("hits_zero: ok")
elif mode == "reset":
    # A fixed window's: whole seconds to the end of the aligned window, as
    # envoyproxy/ratelimit computes it from the Unix second.
    before = int(time.time())
    r = ask("sluice", [("a", "r0")], [("b", "r0")])
    after = int(time.time())
    day = {86400 - before % 86400, 86400 - after % 86400}
    for s in r.statuses:
        d = s.duration_until_reset
        assert d.nanos == 0 and d.seconds in day, (r, day)
    # The header Envoy would add says the same (the server runs with
    # --rls-headers ratelimit).
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers["RateLimit-Reset"] == str(r.statuses[1].duration_until_reset.seconds), r
    # The other algorithms: until the limit is whole again, rounded up. One
    # of 3 an hour comes back after 1,200 s; a logged one after the hour.
    for key, want in [("bucket", 1200), ("log", 3600)]:
        d = ask("sluice", [(key, "r0")]).statuses[0].duration_until_reset
        assert (d.seconds, d.nanos) == (want, 0), (key, d)
    d = ask("sluice", [("rolling", "r0")]).statuses[0].duration_until_reset
    assert d.nanos == 0 and 0 < d.seconds <= 7200, d
    print("reset: ok")
elif mode == "wildcards":
    # Asked with hits_addend 0: which rule, spending nothing.
    rule = lambda k, v: ask("wildcards", descriptor([(k, v)], hits=0)).statuses[0]
    rpu = lambda k, v: rule(k, v).current_limit.requests_per_unit
    for value, want in [
        ("/shop/*/cart", 1),
        ("/shop/de/cart", 2),
        ("/shop/eu/cart", 2),
        ("/shop/eu*", 3),
        ("/s*p/x", 4),
        ("/sxp/x", 5),
        ("/status", 6),
    ]:
        got = rpu("path", value)
        assert got == want, (value, got, want)
    for value in ["north", ""]:
        assert rpu("region", value) == 7, value
    # The buckets are the values' own: /shop/de/cart and /shop/fr/cart
    # each have their 2 (no share_threshold).
    expect(ask("wildcards", [("path", "/shop/de/cart")], hits=2), OK, (OK, 2, 0))
    expect(ask("wildcards", [("path", "/shop/fr/cart")], hits=2), OK, (OK, 2, 0))
    print("wildcards: ok")
elif mode == "replaces_unlimited":
    d = "replaces_unlimited"
    # The partner plan's unlimited rule is named in a replaces: it stays
    # unlimited.
    r = ask(d, [("plan", "partner")], [("plan", "gold")])
    expect(r, OK, (OK, None, U32_MAX), (OK, 5, 4))
    # An unlimited rule replaces a limited one: that one is gone.
    r = ask(d, [("user", "u1")], [("vip", "x")])
    expect(r, OK, (OK, None, 0), (OK, None, U32_MAX))
    expect(ask(d, [("user", "u1")]), OK, (OK, 2, 1))
    print("replaces_unlimited: ok")
elif mode == "auth":
    token = sys.argv[3]
    number = f"206{int(time.time() * 1000) % 10_000_000:07d}"
    request = rls_pb2.RateLimitRequest(
        domain="messaging",
        descriptors=[descriptor([("message_type", "marketing"), ("to_number", number)])],
    )
    # What an attacker without the token tries: a spend, a refund, its own
    # limit through an override.
    refund = rls_pb2.RateLimitRequest(
        domain="messaging",
        descriptors=[descriptor([("message_type", "marketing"), ("to_number", number)], negative=True)],
    )
    override = rls_pb2.RateLimitRequest(
        domain="messaging",
        descriptors=[descriptor([("to_number", number)], limit=(1_000_000, Unit.DAY))],
    )
    for metadata in [None, [("authorization", "Bearer wrong-" + token)], [("authorization", token)]]:
        for r in [request, refund, override]:
            try:
                stub.ShouldRateLimit(r, timeout=10, metadata=metadata)
                raise AssertionError(f"answered without the token: {metadata}")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
    good = [("authorization", f"Bearer {token}")]
    r = stub.ShouldRateLimit(request, timeout=10, metadata=good)
    # Nothing the refused calls asked was done: 5 a day, this is the first.
    expect(r, OK, (OK, 5, 4))
    r = stub.ShouldRateLimit(override, timeout=10, metadata=good)
    expect(r, OK, (OK, 1_000_000, None))
    print("auth: ok")
elif mode == "tls":
    ca, token = sys.argv[3], sys.argv[4]
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    secure = rls_pb2_grpc.RateLimitServiceStub(grpc.secure_channel(f"localhost:{port}", creds))
    request = rls_pb2.RateLimitRequest(
        domain="messaging", descriptors=[descriptor([("to_number", "2068888888")])]
    )
    r = secure.ShouldRateLimit(request, timeout=10, metadata=[("authorization", f"Bearer {token}")])
    expect(r, OK, (OK, 100, None))
    try:
        stub.ShouldRateLimit(request, timeout=5, metadata=[("authorization", f"Bearer {token}")])
        raise AssertionError("answered in clear")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    print("tls: ok")
elif mode == "open":
    expect(ask("messaging", [("to_number", "2069999999")]), OK, (OK, 100, None))
    print("open: ok")
elif mode == "unavailable":
    try:
        ask("sluice", [("a", "x")])
        raise AssertionError("a follower answered")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        print(f"unavailable: {e.details()}")
else:
    raise SystemExit(f"unknown mode {mode}")
