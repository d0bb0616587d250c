#!/usr/bin/env python3
"""Tests of clients/python/sluice.py against a real sluiced.

tests/tests/python_client.rs starts the node and runs this with
SLUICE_ADDR (host:port), SLUICE_TOKEN (the node's --auth-token) and
SLUICE_SHARDS (its --shards). By hand:

    sluiced --port 7705 --shards 2 --auth-token s3cret &
    SLUICE_ADDR=127.0.0.1:7705 SLUICE_TOKEN=s3cret SLUICE_SHARDS=2 \
        python3 clients/python/test_sluice.py
"""

import os
import sys
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sluice import Client, ServerError, parse_rate  # noqa: E402

HOST, _, PORT = os.environ["SLUICE_ADDR"].rpartition(":")
TOKEN = os.environ["SLUICE_TOKEN"].encode()
SHARDS = int(os.environ["SLUICE_SHARDS"])
S = 10**9


def key() -> bytes:
    """A key no other test touches: a fresh, full bucket."""
    return b"py:" + uuid.uuid4().hex.encode()


def client(token: bytes = TOKEN) -> Client:
    return Client(HOST, int(PORT), token)


class Hello(unittest.TestCase):
    def test_hello_ok_gives_the_nodes_shape(self):
        with client() as c:
            self.assertEqual(c.version, 1)
            self.assertEqual(c.shard_count, SHARDS)
            self.assertEqual(c.routing, 1)
            self.assertNotEqual(c.node_id, 0)
            c.ping()

    def test_a_wrong_token_is_auth_failed(self):
        with self.assertRaises(ServerError) as e:
            client(b"wrong")
        self.assertEqual(e.exception.code, 5)

    def test_no_token_is_auth_failed_and_says_one_is_required(self):
        # HELLO with token_len 0 is "any other token" (PROTOCOL.md).
        with self.assertRaises(ServerError) as e:
            client(b"")
        self.assertEqual(e.exception.code, 5)
        self.assertIn("requires a token", e.exception.text)


class Throttle(unittest.TestCase):
    def test_the_golden_conversation(self):
        # PROTOCOL.md's golden vectors: 10/s, burst 20, a fresh bucket.
        k = key()
        with client() as c:
            v = c.throttle(k, 10, S, 20)
            self.assertEqual(tuple(v), (True, 20, 19, 0, 100_000_000))
            p = c.peek(k, 10, S, 20)
            self.assertTrue(p.allowed)
            self.assertEqual(p.remaining, 18)
            # The peek spent nothing.
            self.assertEqual(c.peek(k, 10, S, 20).remaining, 18)

    def test_a_bucket_runs_out_and_says_when_to_retry(self):
        k = key()
        with client() as c:
            for i in range(20):
                v = c.throttle(k, 10, 3600 * S, 20)
                self.assertTrue(v.allowed, i)
                self.assertEqual(v.remaining, 19 - i)
            v = c.throttle(k, 10, 3600 * S, 20)
            self.assertFalse(v.allowed)
            self.assertEqual(v.remaining, 0)
            # One unit comes back every 360 s; a little has passed.
            self.assertTrue(0 < v.retry_after_ns <= 360 * S, v)

    def test_bad_requests_get_their_codes(self):
        with client() as c:
            cases = [
                ((key(), 10, S, 20, 21), 10),  # COST_EXCEEDS_BURST
                ((b"", 10, S, 20, 1), 8),  # BAD_KEY
                ((b"x" * 513, 10, S, 20, 1), 8),  # BAD_KEY
                ((key(), 0, S, 20, 1), 9),  # INVALID_POLICY
            ]
            for args, code in cases:
                with self.assertRaises(ServerError, msg=args[1:]) as e:
                    c.throttle(*args)
                self.assertEqual(e.exception.code, code, e.exception.text)
            # The connection goes on after each.
            self.assertTrue(c.throttle(key(), 10, S, 20).allowed)


class Rates(unittest.TestCase):
    def test_rates_parse(self):
        self.assertEqual(parse_rate("10/s"), (10, S))
        self.assertEqual(parse_rate("5/250ms"), (5, 250 * 10**6))
        self.assertEqual(parse_rate("3/10s"), (3, 10 * S))
        self.assertEqual(parse_rate("100/h"), (100, 3600 * S))


if __name__ == "__main__":
    unittest.main(verbosity=2)
