"""End to end over loopback: a worker's upload until it is acknowledged and merged
(``python -m bench.e2e [--quick] [--json]``).

Three server processes run side by side on 127.0.0.1, on the same event loop implementation (uvloop
when installed): the real coordinator behind the real vcasync server (``vcasgd``, durability as
``--durability``), a bare aiohttp server that streams a POST body in and drops it, and a bare asyncio
TCP server that reads a length-prefixed blob. This process uploads the *same bytes* (one raw-codec
result payload, ``4 x --params`` bytes) to each: the coordinator through ``CoordinatorClient.submit``
until the receipt comes back and the new version is visible, the others until their one-line answer.

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


async def measure_e2e(url: str, params: int, runs: int) -> dict[str, Any]:
    spec = bench_model(params)
    gen = torch.Generator().manual_seed(1)
    delta = {k: torch.randn(v.shape, generator=gen) * 1e-3 for k, v in spec.items()}
    times: list[float] = []
    stalls: list[float] = []
    size = 0
    async with CoordinatorClient(url, timeout_s=600) as client, aiohttp.ClientSession() as http:
        await client.join(SECRET, "bench")
        for i in range(runs):
            grant = await client.lease()
            meta = {"lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
                    "samples": 1, "steps": 1, "partial": False, "metrics": {}}
            data = b"".join(encode_payload("result", meta, delta))
            size = len(data)
            async with http.get(f"{url}/bench/stall") as r:
                await r.read()  # drop samples from before this upload
            t0 = time.perf_counter()
            receipt = await client.submit(grant.lease_id, data, size=size)
            while True:  # merged: the new version is what the coordinator serves
                async with http.get(f"{url}/bench/rss") as r:
                    if (await r.json())["version"] >= receipt.version:
                        break
            elapsed = time.perf_counter() - t0
            async with http.get(f"{url}/bench/stall") as r:
                window = (await r.json())["samples"]
            if receipt.status != "accepted":
                raise RuntimeError(f"the coordinator did not accept the result: {receipt}")
            if i > 0:  # the first run is the warm-up
                times.append(elapsed)
                stalls.extend(window)
    return {"bytes": size, "seconds": statistics.median(times), "stall_p99_ms": _pct(stalls, 0.99),
            "stall_max_ms": max(stalls, default=0.0), "stall_samples": len(stalls)}


async def measure_post(url: str, data: bytes, runs: int) -> float:
    times: list[float] = []
    async with aiohttp.ClientSession() as http:
        for i in range(runs):
            t0 = time.perf_counter()
            async with http.post(f"{url}/sink", data=data) as r:
                got = (await r.json())["bytes"]
            elapsed = time.perf_counter() - t0
            if got != len(data):
                raise RuntimeError("the POST sink lost bytes")
            if i > 0:
                times.append(elapsed)
    return statistics.median(times)


async def measure_tcp(addr: str, data: bytes, runs: int) -> float:
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    times: list[float] = []
    try:
        for i in range(runs):
            t0 = time.perf_counter()
            writer.write(len(data).to_bytes(8, "little"))
            writer.write(data)
            await writer.drain()
            await reader.readexactly(1)
            elapsed = time.perf_counter() - t0
            if i > 0:
                times.append(elapsed)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return statistics.median(times)


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
    runs = a.reps + 1
    with peer("coordinator", "--params", str(a.params), "--units", str(runs + 2),
              "--durability", a.durability, "--stall-monitor") as curl:
        e2e = run(measure_e2e(curl, a.params, runs))
    data = bytes(e2e["bytes"])  # same length; these sinks never look inside
    with peer("post") as purl:
        post_s = run(measure_post(purl, data, runs))
    with peer("tcp") as taddr:
        tcp_s = run(measure_tcp(taddr, data, runs))
    gbps = {name: e2e["bytes"] / s / 1e9 for name, s in
            (("e2e", e2e["seconds"]), ("raw_post", post_s), ("raw_tcp", tcp_s))}
    figures = {
        "e2e_vs_raw_post": gbps["e2e"] / gbps["raw_post"],
        "e2e_vs_raw_tcp": gbps["e2e"] / gbps["raw_tcp"],
        "loop_stall_ms_p99": e2e["stall_p99_ms"],
        "loop_stall_ms_max": e2e["stall_max_ms"],
        "e2e_gbps": gbps["e2e"], "raw_post_gbps": gbps["raw_post"], "raw_tcp_gbps": gbps["raw_tcp"],
        "payload_mb": e2e["bytes"] / 1e6, "durability": a.durability, "reps": a.reps,
    }
    print(f"e2e over loopback, {e2e['bytes'] / 1e6:.0f} MB result payload, durability={a.durability}, "
          f"median of {a.reps} after 1 warm-up (warm buffers)")
    print(f"{'path':<34}{'seconds':>10}{'GB/s':>9}{'ratio':>9}")
    for name, label, s in (("e2e", "upload -> ack -> merged", e2e["seconds"]),
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
