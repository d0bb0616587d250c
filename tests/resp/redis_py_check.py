"""Redis client libraries as gateways configure them, against Sluice's RESP
listener: redis-py from PyPI with its default settings (HELLO 3 on
connect), with a client name, with db=0, and with protocol=2, each calling
CL.THROTTLE through the generic command call. Prints one line per case;
exits non-zero at the first failure.

Usage: python redis_py_check.py PORT
"""

import sys

import redis

port = int(sys.argv[1])
cases = {
    "default": {},
    "client_name": {"client_name": "gateway-1"},
    "db0": {"db": 0},
    "protocol2": {"protocol": 2},
    "protocol3": {"protocol": 3},
}
for i, (case, kwargs) in enumerate(cases.items()):
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, **kwargs)
    key = f"py:{case}"
    # max_burst 2: 3 units, then denied.
    first = r.execute_command("CL.THROTTLE", key, 2, 1, 60)
    assert list(first) == [0, 3, 2, -1, 60], (case, first)
    for _ in range(2):
        r.execute_command("CL.THROTTLE", key, 2, 1, 60)
    denied = r.execute_command("CL.THROTTLE", key, 2, 1, 60)
    assert denied[0] == 1 and denied[2] == 0, (case, denied)
    assert r.ping() is True, case
    if "client_name" in kwargs:
        name = r.client_getname()
        assert name in ("gateway-1", b"gateway-1"), (case, name)
    try:
        r.execute_command("CL.THROTTLE", key, -1, 1, 60)
        raise AssertionError("a negative max_burst was accepted")
    except redis.ResponseError as e:
        assert str(e).startswith("Cell error: Store error: "), (case, str(e))
    print(f"{case}: ok (redis-py {redis.__version__}, protocol {r.connection_pool.connection_kwargs.get('protocol', 'default')})")
