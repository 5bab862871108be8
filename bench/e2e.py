"""End to end over loopback: a worker's upload until it is acknowledged and merged
(``python -m bench.e2e [--quick] [--json] [--durability snapshot,journal]``).

Server processes run side by side on 127.0.0.1, on the same event loop implementation (uvloop when
installed): the real coordinator behind the real vcasync server (``vcasgd``; one coordinator per
durability mode in ``--durability``, one after the other), a bare aiohttp server that streams a POST
body in and drops it, the same server writing the body to a file as it arrives and fsyncing it
before it answers (on the disk the coordinator's ``file://`` storage uses), and a bare asyncio TCP
server that reads a length-prefixed blob. This process uploads the *same bytes* (one raw-codec
result payload, ``4 x --params`` bytes) to each: the coordinator through ``CoordinatorClient.submit``
until the receipt comes back and the new version is visible, the others until their one-line answer.
The raw POST sends them as the client does, in ``UPLOAD_BLOCK`` memoryview blocks with a
Content-Length; a second, informational row posts the whole buffer as ``data=bytes``, which aiohttp
copies once (twice with a Content-Length) before its first byte goes out. Each round runs them
back to back (the references first, while the coordinator is idle), so load from elsewhere on the
machine slows them alike.

Figures, per durability mode: ``e2e_<mode>_vs_raw_post``, ``e2e_<mode>_vs_raw_tcp``,
``e2e_<mode>_vs_durable_post`` and ``e2e_<mode>_vs_whole_buffer_post`` (throughput ratios, medians
of ``--reps`` after ``--warmup`` uploads; buffers warm: every run reuses the same client bytes and
the servers' freed memory, and the warm-up fills the coordinator's staleness window
(``max_staleness`` + 2 uploads by default), so it measures the steady state of a long run, where
published versions and decoded uploads land in recycled memory instead of fresh pages), and
``loop_stall_ms_p99_<mode>``: the p99 lateness of a 1 ms timer on the coordinator's event loop,
sampled only while uploads are decoded, validated and merged (how long heartbeats would wait).
``e2e_vs_raw_post`` / ``e2e_vs_raw_tcp`` are the first mode's (the headline: ``snapshot``, whose
acknowledgement waits for no disk); ``loop_stall_ms_p99`` is the worst mode's. In ``journal`` mode
every result is on disk (fsynced) before it is acknowledged, so that mode is bounded by the disk:
compare it with the durable POST, which does only that.
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

from vcasync._aio import buffer_blocks
from vcasync._loop import run
from vcasync.coordinator import CoordinatorConfig
from vcasync.wire import encode_payload
from vcasync.worker._client import UPLOAD_BLOCK, CoordinatorClient

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
        self.last = b""

    async def once(self, client: CoordinatorClient, http: aiohttp.ClientSession, keep: bool) -> float:
        grant = await client.lease()
        meta = {"lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
                "samples": 1, "steps": 1, "partial": False, "metrics": {}}
        data = b"".join(encode_payload("result", meta, self.delta))
        self.size = len(data)
        self.last = data
        async with http.get(f"{self.url}/bench/stall") as r:
            await r.read()  # drop samples from before this upload
        t0 = time.perf_counter()
        receipt = await client.submit(grant.lease_id, data, size=len(data))
        # merged: the new version is what the coordinator serves (one request that waits)
        async with http.get(f"{self.url}/bench/merged",
                            params={"version": str(receipt.version)}) as r:
            if (await r.json())["version"] < receipt.version:
                raise RuntimeError(f"version {receipt.version} was never served")
        elapsed = time.perf_counter() - t0
        async with http.get(f"{self.url}/bench/stall") as r:
            window = (await r.json())["samples"]
        if receipt.status != "accepted":
            raise RuntimeError(f"the coordinator did not accept the result: {receipt}")
        if keep:
            self.stalls.extend(window)
        return elapsed


async def post_once(http: aiohttp.ClientSession, url: str, data: bytes, *, whole: bool = False) -> float:
    """POST ``data`` in blocks as the client sends a result, or (``whole``) as one buffer."""
    t0 = time.perf_counter()
    body: Any = data if whole else buffer_blocks(memoryview(data), UPLOAD_BLOCK)
    async with http.post(f"{url}/sink", data=body, headers={"Content-Length": str(len(data))}) as r:
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


async def measure(curl: str, purl: str, durl: str, taddr: str, params: int, reps: int,
                  warmup: int) -> dict[str, Any]:
    """``warmup`` uploads, then ``reps`` rounds; each round runs the four paths back to back, so a
    noisy neighbour slows them alike."""
    e2e = E2E(curl, params)
    times: dict[str, list[float]] = {name: [] for name, _ in PATHS}
    host, port = taddr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        async with CoordinatorClient(curl, timeout_s=600) as client, aiohttp.ClientSession() as http:
            await client.join(SECRET, "bench")
            for _ in range(max(1, warmup)):  # warm-up, and it tells the payload size
                await e2e.once(client, http, keep=False)
            data = e2e.last  # a real result payload: the sinks never look inside
            for i in range(reps + 1):
                keep = i > 0  # round 0 warms the sinks up
                # References first, while the coordinator is idle.
                got = {"raw_post": await post_once(http, purl, data),
                       "whole_buffer_post": await post_once(http, purl, data, whole=True),
                       "durable_post": await post_once(http, durl, data),
                       "raw_tcp": await tcp_once(reader, writer, data)}
                got["e2e"] = await e2e.once(client, http, keep)
                if keep:
                    for name, t in got.items():
                        times[name].append(t)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return {"bytes": e2e.size, **{k: statistics.median(v) for k, v in times.items()},
            "stall_p99_ms": _pct(e2e.stalls, 0.99), "stall_max_ms": max(e2e.stalls, default=0.0),
            "stall_samples": len(e2e.stalls)}


PATHS = (("e2e", "upload -> ack -> merged"), ("raw_post", "raw aiohttp POST (same bytes)"),
         ("whole_buffer_post", "  the same, data=whole buffer"),
         ("durable_post", "POST written + fsynced (same)"), ("raw_tcp", "raw TCP (same bytes)"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--params", type=int, default=25_000_000, help="float32 parameters (default 25M)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=CoordinatorConfig().max_staleness + 2,
                   help="uploads before measuring (default: the staleness window + 2, the steady state)")
    p.add_argument("--durability", default="snapshot,journal",
                   help="comma list of none, snapshot, journal; the first gives the headline figures")
    p.add_argument("--quick", action="store_true", help="5M parameters, 3 reps")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    modes = [m.strip() for m in a.durability.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("none", "snapshot", "journal")]
    if bad or not modes:
        p.error(f"--durability: unknown mode(s) {bad}; use none, snapshot, journal")
    if a.quick:
        a.params, a.reps = 5_000_000, 3
    results: dict[str, dict[str, Any]] = {}
    with peer("post") as purl, peer("durable") as durl, peer("tcp") as taddr:
        for mode in modes:
            with peer("coordinator", "--params", str(a.params), "--units",
                      str(a.reps + a.warmup + 4), "--durability", mode, "--stall-monitor") as curl:
                results[mode] = run(measure(curl, purl, durl, taddr, a.params, a.reps, a.warmup))
    figures: dict[str, Any] = {}
    for mode, e2e in results.items():
        gbps = {name: e2e["bytes"] / e2e[name] / 1e9 for name, _ in PATHS}
        figures.update({
            f"e2e_{mode}_vs_raw_post": gbps["e2e"] / gbps["raw_post"],
            f"e2e_{mode}_vs_raw_tcp": gbps["e2e"] / gbps["raw_tcp"],
            f"e2e_{mode}_vs_durable_post": gbps["e2e"] / gbps["durable_post"],
            f"e2e_{mode}_vs_whole_buffer_post": gbps["e2e"] / gbps["whole_buffer_post"],
            f"loop_stall_ms_p99_{mode}": e2e["stall_p99_ms"],
            f"loop_stall_ms_max_{mode}": e2e["stall_max_ms"],
            f"e2e_{mode}_gbps": gbps["e2e"],
        })
        print(f"e2e over loopback, {e2e['bytes'] / 1e6:.0f} MB result payload, durability={mode}, "
              f"median of {a.reps} interleaved rounds after {a.warmup} warm-up uploads (warm buffers)")
        print(f"{'path':<34}{'seconds':>10}{'GB/s':>9}{'ratio':>9}")
        for name, label in PATHS:
            print(f"{label:<34}{e2e[name]:>10.3f}{gbps[name]:>9.3f}{gbps['e2e'] / gbps[name]:>9.2f}")
        print(f"coordinator loop stall while merging: p99 {e2e['stall_p99_ms']:.1f} ms, "
              f"max {e2e['stall_max_ms']:.1f} ms over {e2e['stall_samples']} samples\n")
    head = modes[0]
    last = results[modes[-1]]
    headline = {"e2e_vs_raw_post": figures[f"e2e_{head}_vs_raw_post"],
                "e2e_vs_raw_tcp": figures[f"e2e_{head}_vs_raw_tcp"],
                "loop_stall_ms_p99": max(figures[f"loop_stall_ms_p99_{m}"] for m in modes),
                "headline_durability": head}
    figures = {**headline, **figures,
               "raw_post_gbps": last["bytes"] / last["raw_post"] / 1e9,
               "whole_buffer_post_gbps": last["bytes"] / last["whole_buffer_post"] / 1e9,
               "durable_post_gbps": last["bytes"] / last["durable_post"] / 1e9,
               "raw_tcp_gbps": last["bytes"] / last["raw_tcp"] / 1e9,
               "payload_mb": last["bytes"] / 1e6, "reps": a.reps, "warmup": a.warmup}
    if a.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
