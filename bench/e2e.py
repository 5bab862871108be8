"""End to end over loopback: a worker's upload until it is acknowledged and merged
(``python -m bench.e2e [--quick] [--json]``).

Three server processes run side by side on 127.0.0.1, on the same event loop implementation (uvloop
when installed): the real coordinator behind the real vcasync server (``vcasgd``, durability as
``--durability``), a bare aiohttp server that streams a POST body in and drops it, and a bare asyncio
TCP server that reads a length-prefixed blob. This process uploads the *same bytes* (one raw-codec
result payload, ``4 x --params`` bytes) to each: the coordinator through ``CoordinatorClient.submit``
until the receipt comes back and the new version is visible, the others until their one-line answer.
Each round runs the three back to back (the references first, while the coordinator is idle), so
load from elsewhere on the machine slows them alike.

Figures: ``e2e_vs_raw_post`` and ``e2e_vs_raw_tcp`` (throughput ratios, medians of ``--reps`` after one
warm-up; buffers warm: every run reuses the same client bytes and the servers' freed memory), and
``loop_stall_ms_p99``: the p99 lateness of a 1 ms timer on the coordinator's event loop, sampled only
while uploads are decoded, validated and merged (how long heartbeats would wait).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from typing import Any

import aiohttp
import torch

from vcasync._loop import run
from vcasync.client import CoordinatorClient
from vcasync.wire import encode_payload

from ._peers import SECRET, bench_model
from ._proc import peer


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else 0.0


class E2E:
    """Uploads one result per call to the coordinator: upload -> receipt -> version visible."""

    def __init__(self, url: str, params: int) -> None:
        self.url = url
        spec = bench_model(params)
        gen = torch.Generator().manual_seed(1)
        self.delta = {k: torch.randn(v.shape, generator=gen) * 1e-3 for k, v in spec.items()}
        self.stalls: list[float] = []
        self.size = 0

    async def once(self, client: CoordinatorClient, http: aiohttp.ClientSession, keep: bool) -> float:
        grant = await client.lease()
        meta = {"lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
                "samples": 1, "steps": 1, "partial": False, "metrics": {}}
        data = b"".join(encode_payload("result", meta, self.delta))
        self.size = len(data)
        async with http.get(f"{self.url}/bench/stall") as r:
            await r.read()  # drop samples from before this upload
        t0 = time.perf_counter()
        receipt = await client.submit(grant.lease_id, data, size=len(data))
        while True:  # merged: the new version is what the coordinator serves
            async with http.get(f"{self.url}/bench/rss") as r:
                if (await r.json())["version"] >= receipt.version:
                    break
        elapsed = time.perf_counter() - t0
        async with http.get(f"{self.url}/bench/stall") as r:
            window = (await r.json())["samples"]
        if receipt.status != "accepted":
            raise RuntimeError(f"the coordinator did not accept the result: {receipt}")
        if keep:
            self.stalls.extend(window)
        return elapsed


async def post_once(http: aiohttp.ClientSession, url: str, data: bytes) -> float:
    t0 = time.perf_counter()
    async with http.post(f"{url}/sink", data=data) as r:
        got = (await r.json())["bytes"]
    elapsed = time.perf_counter() - t0
    if got != len(data):
        raise RuntimeError("the POST sink lost bytes")
    return elapsed


async def tcp_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> float:
    t0 = time.perf_counter()
    writer.write(len(data).to_bytes(8, "little"))
    writer.write(data)
    await writer.drain()
    await reader.readexactly(1)
    return time.perf_counter() - t0


async def measure(curl: str, purl: str, taddr: str, params: int, reps: int) -> dict[str, Any]:
    """One warm-up, then ``reps`` rounds; each round runs the three paths back to back, so a noisy
    neighbour slows all three alike."""
    e2e = E2E(curl, params)
    times: dict[str, list[float]] = {"e2e": [], "raw_post": [], "raw_tcp": []}
    host, port = taddr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        async with CoordinatorClient(curl, timeout_s=600) as client, aiohttp.ClientSession() as http:
            await client.join(SECRET, "bench")
            await e2e.once(client, http, keep=False)  # warm-up, and it tells the payload size
            data = bytes(e2e.size)  # same length; the sinks never look inside
            for i in range(reps + 1):
                keep = i > 0  # round 0 warms the sinks up
                t_post = await post_once(http, purl, data)  # references first: the coordinator is idle
                t_tcp = await tcp_once(reader, writer, data)
                t_e2e = await e2e.once(client, http, keep)
                if keep:
                    times["e2e"].append(t_e2e)
                    times["raw_post"].append(t_post)
                    times["raw_tcp"].append(t_tcp)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return {"bytes": e2e.size, **{k: statistics.median(v) for k, v in times.items()},
            "stall_p99_ms": _pct(e2e.stalls, 0.99), "stall_max_ms": max(e2e.stalls, default=0.0),
            "stall_samples": len(e2e.stalls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--params", type=int, default=25_000_000, help="float32 parameters (default 25M)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--durability", default="journal", choices=["none", "snapshot", "journal"])
    p.add_argument("--quick", action="store_true", help="5M parameters, 3 reps")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.params, a.reps = 5_000_000, 3
    with peer("coordinator", "--params", str(a.params), "--units", str(a.reps + 4),
              "--durability", a.durability, "--stall-monitor") as curl, \
            peer("post") as purl, peer("tcp") as taddr:
        e2e = run(measure(curl, purl, taddr, a.params, a.reps))
    post_s, tcp_s = e2e["raw_post"], e2e["raw_tcp"]
    gbps = {name: e2e["bytes"] / e2e[name] / 1e9 for name in ("e2e", "raw_post", "raw_tcp")}
    figures = {
        "e2e_vs_raw_post": gbps["e2e"] / gbps["raw_post"],
        "e2e_vs_raw_tcp": gbps["e2e"] / gbps["raw_tcp"],
        "loop_stall_ms_p99": e2e["stall_p99_ms"],
        "loop_stall_ms_max": e2e["stall_max_ms"],
        "e2e_gbps": gbps["e2e"], "raw_post_gbps": gbps["raw_post"], "raw_tcp_gbps": gbps["raw_tcp"],
        "payload_mb": e2e["bytes"] / 1e6, "durability": a.durability, "reps": a.reps,
    }
    print(f"e2e over loopback, {e2e['bytes'] / 1e6:.0f} MB result payload, durability={a.durability}, "
          f"median of {a.reps} interleaved rounds after 1 warm-up (warm buffers)")
    print(f"{'path':<34}{'seconds':>10}{'GB/s':>9}{'ratio':>9}")
    for name, label, s in (("e2e", "upload -> ack -> merged", e2e["e2e"]),
                           ("raw_post", "raw aiohttp POST (same bytes)", post_s),
                           ("raw_tcp", "raw TCP (same bytes)", tcp_s)):
        print(f"{label:<34}{s:>10.3f}{gbps[name]:>9.3f}{gbps['e2e'] / gbps[name]:>9.2f}")
    print(f"coordinator loop stall while merging: p99 {e2e['stall_p99_ms']:.1f} ms, "
          f"max {e2e['stall_max_ms']:.1f} ms over {e2e['stall_samples']} samples")
    if a.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
