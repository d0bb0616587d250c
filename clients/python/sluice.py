#!/usr/bin/env python3
"""A minimal Sluice client: Python 3 standard library only.

It follows protocol/PROTOCOL.md's "Minimal client" section and nothing
else (no Rust code was read to write it): HELLO, then THROTTLE, PEEK and
PING on one connection, each request answered before the next is sent.
Shard-aware routing, DECIDE, pipelining and failover are what the full
client (the sluice-client crate) adds.

    from sluice import Client
    with Client("127.0.0.1", 7700) as c:
        v = c.throttle(b"user:42", count=10, period_ns=10**9, burst=20)
        if not v.allowed:
            ...  # 429, Retry-After: v.retry_after_ns

From the command line:

    python3 clients/python/sluice.py [--addr HOST:PORT] throttle KEY \
        --rate COUNT/PERIOD [--burst N] [--cost N]
"""

import socket
import struct
import sys
from typing import NamedTuple, Optional

# Ops (PROTOCOL.md, "Ops").
HELLO, PING, THROTTLE, PEEK = 0x01, 0x02, 0x03, 0x04
HELLO_OK, PONG, THROTTLE_OK, PEEK_OK, ERROR = 0x81, 0x82, 0x83, 0x84, 0xFF

NO_SHARD = 0xFFFF
FRAME_BYTES_MAX = 1 << 20


class Verdict(NamedTuple):
    """THROTTLE_OK / PEEK_OK: times are nanoseconds from the decision."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_ns: int
    reset_after_ns: int


class ServerError(Exception):
    """An ERROR reply: act on `code` (PROTOCOL.md, "Error codes")."""

    def __init__(self, code: int, text: str):
        super().__init__(f"server error {code}: {text}")
        self.code = code
        self.text = text


class ProtocolError(Exception):
    """The bytes are not the protocol: the connection is unusable."""


class Client:
    """One connection to a node; not safe for use by several threads."""

    def __init__(self, host: str = "127.0.0.1", port: int = 7700,
                 token: bytes = b"", timeout_s: float = 5.0):
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""
        self._next_id = 1
        # HELLO: versions 1..=1, no shard binding, the token (may be empty).
        payload = struct.pack("<HHHH", 1, 1, NO_SHARD, len(token)) + token
        op, body = self._call(HELLO, payload)
        if op != HELLO_OK or len(body) != 24:
            raise ProtocolError(f"expected HELLO_OK, got op {op:#04x}")
        (self.version, self.shard_count, _shard, self.routing, _reserved,
         self.node_id, self.epoch) = struct.unpack("<HHHBBQQ", body)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ping(self) -> None:
        op, _ = self._call(PING, b"")
        if op != PONG:
            raise ProtocolError(f"expected PONG, got op {op:#04x}")

    def throttle(self, key: bytes, count: int, period_ns: int, burst: int,
                 cost: int = 1) -> Verdict:
        """Spend `cost` units of `key`'s token bucket if it has them."""
        return self._decide(THROTTLE, THROTTLE_OK, key, count, period_ns,
                            burst, cost)

    def peek(self, key: bytes, count: int, period_ns: int, burst: int,
             cost: int = 1) -> Verdict:
        """What throttle would answer now; changes nothing."""
        return self._decide(PEEK, PEEK_OK, key, count, period_ns, burst, cost)

    def _decide(self, op: int, ok: int, key: bytes, count: int,
                period_ns: int, burst: int, cost: int) -> Verdict:
        payload = struct.pack("<QQQQH", count, period_ns, burst, cost,
                              len(key)) + key
        got, body = self._call(op, payload)
        if got != ok or len(body) != 40:
            raise ProtocolError(f"expected op {ok:#04x}, got {got:#04x}")
        allowed, limit, remaining, retry, reset = struct.unpack("<5Q", body)
        return Verdict(allowed != 0, limit, remaining, retry, reset)

    def _call(self, op: int, payload: bytes):
        """Sends one request in a frame of its own; returns (op, payload)
        of its reply, or raises ServerError for an ERROR."""
        request_id = self._next_id
        self._next_id = self._next_id % 0xFFFFFFFF + 1  # never 0
        header = struct.pack("<BBHI", op, 0, len(payload), request_id)
        message = header + payload
        self._sock.sendall(struct.pack("<I", len(message)) + message)
        while True:
            for reply_op, reply_id, body in self._messages():
                if reply_op == ERROR:
                    code, text_len = struct.unpack_from("<HH", body)
                    text = body[4:4 + text_len].decode("utf-8", "replace")
                    if reply_id in (0, request_id):
                        raise ServerError(code, text)
                    continue
                if reply_id != request_id:
                    raise ProtocolError(f"reply to {reply_id}, "
                                        f"expected {request_id}")
                return reply_op, body

    def _messages(self):
        """Reads one whole frame; yields its messages."""
        while len(self._buf) < 4:
            self._read()
        (body_len,) = struct.unpack_from("<I", self._buf)
        if not 8 <= body_len <= FRAME_BYTES_MAX:
            raise ProtocolError(f"frame of {body_len} bytes")
        while len(self._buf) < 4 + body_len:
            self._read()
        body = self._buf[4:4 + body_len]
        self._buf = self._buf[4 + body_len:]
        at = 0
        while at < len(body):
            if len(body) - at < 8:
                raise ProtocolError("truncated message header")
            op, _flags, n, rid = struct.unpack_from("<BBHI", body, at)
            if at + 8 + n > len(body):
                raise ProtocolError("payload past the frame's end")
            yield op, rid, body[at + 8:at + 8 + n]
            at += 8 + n

    def _read(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ProtocolError("the server closed the connection")
        self._buf += chunk


PERIODS_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9,
              "d": 86400 * 10**9}


def parse_rate(rate: str):
    """`10/s`, `100/m`, `5/250ms`, `3/10s`: (count, period_ns)."""
    count, _, period = rate.partition("/")
    digits = period.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = period[len(digits):]
    if unit not in PERIODS_NS:
        raise ValueError(f"bad period {period!r}: use ms, s, m, h or d")
    return int(count), int(digits or "1") * PERIODS_NS[unit]


def main(argv) -> int:
    import argparse
    p = argparse.ArgumentParser(description="A minimal Sluice client.")
    p.add_argument("--addr", default="127.0.0.1:7700")
    p.add_argument("--token", default="", help="the node's auth token")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("ping")
    for name in ("throttle", "peek"):
        s = sub.add_parser(name)
        s.add_argument("key")
        s.add_argument("--rate", required=True, help="COUNT/PERIOD")
        s.add_argument("--burst", type=int)
        s.add_argument("--cost", type=int, default=1)
    a = p.parse_args(argv)
    host, _, port = a.addr.rpartition(":")
    try:
        with Client(host, int(port), a.token.encode()) as c:
            if a.command == "ping":
                c.ping()
                print(f"PONG ({c.shard_count} shards, epoch {c.epoch})")
                return 0
            count, period_ns = parse_rate(a.rate)
            call = c.throttle if a.command == "throttle" else c.peek
            v = call(a.key.encode(), count, period_ns, a.burst or count,
                     a.cost)
    except (ServerError, ProtocolError, OSError, ValueError) as e:
        print(f"sluice.py: {e}", file=sys.stderr)
        return 2
    print(f"{'allowed' if v.allowed else 'denied'} limit={v.limit} "
          f"remaining={v.remaining} retry_after_ns={v.retry_after_ns} "
          f"reset_after_ns={v.reset_after_ns}")
    return 0 if v.allowed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
