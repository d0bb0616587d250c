#!/usr/bin/env python3
"""Writes fuzz/seeds/: the golden vectors of protocol/PROTOCOL.md (requests
for frame_request, replies for reply, SYNC payloads for replication), the
README's RESP commands, and the example config and limit specs. Run it
again when the golden vectors change: python3 fuzz/make_seeds.py"""
import os, re, pathlib

root = pathlib.Path(__file__).resolve().parent.parent
seeds = root / "fuzz" / "seeds"
doc = (root / "protocol" / "PROTOCOL.md").read_text()

def put(target, name, data):
    d = seeds / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)

for m in re.finditer(r"```hex golden=(\S+)\n(.*?)```", doc, re.S):
    name, body = m.group(1), m.group(2)
    toks = [t for line in body.splitlines() for t in line.split("#")[0].split()]
    data = bytes(int(t, 16) for t in toks)
    # The first byte is the targets' read size: 255, whole reads.
    if "reply" in name or name.endswith("_ok"):
        put("reply", name, data)
    else:
        put("frame_request", name, b"\xff" + data)
    if "sync" in name:
        put("replication", name, b"\xff" + data[12:])

resp = [
    b"*6\r\n$11\r\nCL.THROTTLE\r\n$7\r\nuser123\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n$1\r\n1\r\n",
    b"CL.THROTTLE user123 15 30 60 1\r\n",
    b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n",
    b"PING\r\nINFO\r\n",
]
for i, r in enumerate(resp):
    put("resp", "cmd%d" % i, b"\xff" + r)

put("config", "example_toml", (root / "sluice.example.toml").read_bytes())
specs = ["token-bucket:100/s,burst=20", "fixed-window:1000/h", "sliding-log:100/m",
         "sliding-counter:50/10s", "concurrency:8,lease=30s", "token-bucket:10/m",
         "token-bucket:1000/s,burst=2000,reserve=critical:20%,reserve=normal:50%",
         "concurrency:2000,lease=30s,reserve=critical:12.5%"]
for i, s in enumerate(specs):
    put("config", "spec%d" % i, s.encode())
