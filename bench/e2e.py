"""End to end over loopback: a worker's upload until it is acknowledged and merged
(``python -m bench.e2e [--quick] [--json] [--durability snapshot,journal]``).

Server processes run side by side on 127.0.0.1, on the same event loop implementation (uvloop when
installed): the real coordinator behind the real vcasync server (``vcasgd``; one coordinator per
durability mode in ``--durability``, one after the other), a bare aiohttp server that streams a POST
body in and drops it, the same server writing the body to a file as it arrives and fsyncing it
before it answers (on the disk the coordinator's ``file://`` storage uses, starting the disk's
writeback every 4 MiB as that storage does: the strictest floor; ``durable_plain_post`` is the same
without that advice, informational), and a bare asyncio TCP
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
``coordinator_cpu_s_per_upload_<mode>`` (the coordinator process's CPU seconds per upload, over
every round, with ``_spread``: the [min, median, max] of each measured round's:
what one pass over the bytes saves shows here even on a noisy machine), and
``loop_stall_ms_p99_<mode>``: the p99 lateness of a 1 ms timer on the coordinator's event loop,
sampled only while uploads are decoded, validated and merged (how long heartbeats would wait), over
every measured round's samples together, with ``_spread``: the [min, median, max] of each round's
own p99 (a round whose upload failed: infinite, null in the JSON).
Each ratio is the median of per-round ratios, with ``_min`` / ``_max`` beside it; each ``*_gbps``
(the median round's throughput) has the [min, median, max] of the rounds' under ``_spread``. A
failed or timed-out round counts (ratio 0, throughput 0): ``failed_<mode>`` says how many uploads
failed, ``failed_reference_<mode>`` how many reference requests, ``failed`` both over every mode.
The headline figures (``headline_durability``, ``e2e_vs_raw_post``, ``e2e_vs_durable_post``,
``e2e_vs_raw_tcp``, each with its ``_min`` / ``_max``) are the **default** durability's
(``journal``), the other modes are reported beside them; ``loop_stall_ms_p99`` (with its
``_spread``) is the worst mode's, ``loop_stall_mode``. In ``journal`` mode every result is on disk
(fsynced) before it is acknowledged, so that mode is bounded by the disk: compare it with the
durable POST, which does only that. The model is a ResNet-50 state dict by default (``--arch
flat``: four equal tensors, the best case for per-tensor cost).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import statistics
import sys
import time
from typing import Any

import aiohttp

from vcasync._aio import buffer_blocks
from vcasync._loop import run
from vcasync.coordinator import CoordinatorConfig
from vcasync.wire import encode_payload
from vcasync.worker._client import UPLOAD_BLOCK, CoordinatorClient

from ._peers import ARCHS, RESNET50_PARAMS, SECRET, bench_delta, bench_model
from ._proc import peer
from ._signals import exit_with, restores_sigterm, stop_on_sigterm
from ._stats import add_quick, distinct, finite, non_negative_int, parse_args, positive_int, show
from ._stats import spread as _stats_spread


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else 0.0


class E2E:
    """Uploads one result per call to the coordinator: upload -> receipt -> version visible."""

    def __init__(self, url: str, params: int, arch: str) -> None:
        self.url = url
        self.delta = bench_delta(bench_model(params, arch=arch))
        self.stalls: list[float] = []
        self.window: list[float] = []     # the last upload's samples
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
        self.window = window
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


#: One upload (or reference request) that takes longer than this counts as failed.
OP_TIMEOUT_S = 300.0


async def _timed(op: Any) -> float:
    """Seconds ``op`` took; ``inf`` when it failed or timed out (counted, never dropped)."""
    try:
        async with asyncio.timeout(OP_TIMEOUT_S):
            return float(await op)
    except Exception as exc:     # any failure (a timeout too) is a failed iteration
        print(f"  iteration failed: {exc!r}", file=sys.stderr)
        return math.inf


async def measure(curl: str, purl: str, durls: tuple[str, str], taddr: str, params: int, reps: int,
                  warmup: int, arch: str) -> dict[str, Any]:
    """``warmup`` uploads, then ``reps`` rounds; each round runs every path back to back, so a
    noisy neighbour slows them alike (``durls``: the durable sinks with and without early
    writeback). Times per round (``inf``: that iteration failed)."""
    e2e = E2E(curl, params, arch)
    durl, dpurl = durls
    times: dict[str, list[float]] = {name: [] for name, _ in PATHS}
    round_p99: list[float] = []      # each measured round's stall p99 (a failed upload: infinite)
    host, port = taddr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        async with CoordinatorClient(curl, timeout_s=600) as client, aiohttp.ClientSession() as http:
            await client.join(SECRET, "bench")
            for _ in range(max(1, warmup)):  # warm-up, and it tells the payload size
                await e2e.once(client, http, keep=False)
            data = e2e.last  # a real result payload: the sinks never look inside
            marks = [await _coordinator_cpu_s(http, curl)]   # before each round, and after the last
            for i in range(reps + 1):
                keep = i > 0  # round 0 warms the sinks up
                # References first, while the coordinator is idle.
                got = {"raw_post": await _timed(post_once(http, purl, data)),
                       "whole_buffer_post": await _timed(post_once(http, purl, data, whole=True)),
                       "durable_post": await _timed(post_once(http, durl, data)),
                       "durable_plain_post": await _timed(post_once(http, dpurl, data)),
                       "raw_tcp": await _timed(tcp_once(reader, writer, data))}
                got["e2e"] = await _timed(e2e.once(client, http, keep))
                if keep:
                    for name, t in got.items():
                        times[name].append(t)
                    round_p99.append(_pct(e2e.window, 0.99) if math.isfinite(got["e2e"]) else math.inf)
                marks.append(await _coordinator_cpu_s(http, curl))
            cpu_per_upload = (marks[-1] - marks[0]) / (reps + 1)
            cpu_rounds = [b - a for a, b in itertools.pairwise(marks[1:])]   # the measured rounds'
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return {"bytes": e2e.size, "times": times, "cpu_s_per_upload": cpu_per_upload, "cpu_s_rounds": cpu_rounds,
            "stall_p99_ms": _pct(e2e.stalls, 0.99), "stall_max_ms": max(e2e.stalls, default=0.0),
            "stall_samples": len(e2e.stalls), "stall_p99_ms_rounds": round_p99}


async def _coordinator_cpu_s(http: aiohttp.ClientSession, url: str) -> float:
    """CPU seconds (user + system) the coordinator process has used so far."""
    async with http.get(f"{url}/bench/rss") as r:
        return float((await r.json())["cpu_s"])


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max of per-round ratios (a failed round is 0: no throughput)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def gbps(size: int, times: list[float]) -> list[float]:
    """GB/s of every round (a failed round, an infinite time, is 0: none dropped)."""
    return [size / t / 1e9 for t in times]


def ratios(times: dict[str, list[float]], ref: str) -> list[float]:
    """Per round: e2e throughput / ``ref``'s throughput (reference time / e2e time)."""
    return [r / e if math.isfinite(e) and math.isfinite(r) else 0.0
            for e, r in zip(times["e2e"], times[ref], strict=True)]


PATHS = (("e2e", "upload -> ack -> merged"), ("raw_post", "raw aiohttp POST (same bytes)"),
         ("whole_buffer_post", "  the same, data=whole buffer"),
         ("durable_post", "POST written + fsynced (same)"),
         ("durable_plain_post", "  the same, no early writeback"), ("raw_tcp", "raw TCP (same bytes)"))


QUICK: dict[str, Any] = {"params": 5_000_000, "reps": 3}
MODES = ("none", "snapshot", "journal")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    default_mode = CoordinatorConfig().durability
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--params", type=positive_int, default=RESNET50_PARAMS,
                   help="float32 parameters (default: ResNet-50's 25.6M, a ~102 MB result)")
    p.add_argument("--arch", default="resnet50", choices=ARCHS,
                   help="tensor layout: a ResNet-50 state dict (320 tensors), or 4 flat tensors")
    p.add_argument("--reps", type=positive_int, default=5)
    p.add_argument("--warmup", type=non_negative_int, default=CoordinatorConfig().max_staleness + 2,
                   help="uploads before measuring (default: the staleness window + 2, the steady state)")
    p.add_argument("--durability", default=f"{default_mode},snapshot",
                   help=f"comma list of none, snapshot, journal; the headline figures are the default "
                        f"mode's ({default_mode}), else the first listed")
    add_quick(p, QUICK, "5M parameters, 3 reps")
    p.add_argument("--json", action="store_true")
    a = parse_args(p, argv)
    modes = [m.strip() for m in a.durability.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--durability: unknown mode(s) {bad}; use {', '.join(MODES)}")
    distinct(p, "--durability", modes)
    return a


@restores_sigterm
def main(argv: list[str] | None = None) -> int:
    default_mode = CoordinatorConfig().durability
    a = parse(argv)
    stop_on_sigterm()  # its peers stopped, their directories removed
    modes = [m.strip() for m in a.durability.split(",") if m.strip()]
    results: dict[str, dict[str, Any]] = {}
    with (peer("post") as purl, peer("durable") as durl, peer("durable-plain") as dpurl,
          peer("tcp") as taddr):
        for mode in modes:
            with peer("coordinator", "--params", str(a.params), "--arch", a.arch, "--units",
                      str(a.reps + a.warmup + 4), "--durability", mode, "--stall-monitor") as curl:
                results[mode] = run(measure(curl, purl, (durl, dpurl), taddr, a.params, a.reps,
                                            a.warmup, a.arch))
    figures: dict[str, Any] = {}
    for mode, e2e in results.items():
        times = e2e["times"]
        med = {name: statistics.median(times[name]) for name, _ in PATHS}
        rate = {name: e2e["bytes"] / med[name] / 1e9 for name, _ in PATHS}
        failed = sum(1 for t in times["e2e"] if not math.isfinite(t))
        # a reference that failed makes its ratio 0 in that round: counted too, not only the uploads
        ref_failed = sum(1 for name, _ in PATHS if name != "e2e" for t in times[name] if not math.isfinite(t))
        figures[f"failed_{mode}"] = failed
        figures[f"failed_reference_{mode}"] = ref_failed
        for ref in ("raw_post", "raw_tcp", "durable_post", "durable_plain_post", "whole_buffer_post"):
            sp = spread(ratios(times, ref))
            figures[f"e2e_{mode}_vs_{ref}"] = sp["median"]
            figures[f"e2e_{mode}_vs_{ref}_min"] = sp["min"]
            figures[f"e2e_{mode}_vs_{ref}_max"] = sp["max"]
        figures.update({f"loop_stall_ms_p99_{mode}": e2e["stall_p99_ms"],
                        f"loop_stall_ms_p99_{mode}_spread": _stats_spread(e2e["stall_p99_ms_rounds"]),
                        f"loop_stall_ms_max_{mode}": e2e["stall_max_ms"],
                        f"e2e_{mode}_gbps": rate["e2e"],
                        f"e2e_{mode}_gbps_spread": _stats_spread(gbps(e2e["bytes"], times["e2e"])),
                        f"coordinator_cpu_s_per_upload_{mode}": e2e["cpu_s_per_upload"],
                        f"coordinator_cpu_s_per_upload_{mode}_spread": _stats_spread(e2e["cpu_s_rounds"])})
        tag = " (default)" if mode == default_mode else ""
        print(f"e2e over loopback, {e2e['bytes'] / 1e6:.0f} MB result payload ({a.arch}, "
              f"{a.params / 1e6:.1f}M params), durability={mode}{tag}, "
              f"{a.reps} interleaved rounds after {a.warmup} warm-up uploads (warm buffers); "
              f"{failed} failed, {ref_failed} reference requests failed")
        print(f"{'path':<34}{'s median (min-max)':>22}{'GB/s median (min-max)':>24}"
              f"{'e2e / path min / median / max':>31}")
        for name, label in PATHS:
            sp = spread(ratios(times, name)) if name != "e2e" else {"min": 1.0, "median": 1.0, "max": 1.0}
            print(f"{label:<34}{show(times[name], 3):>22}{show(gbps(e2e['bytes'], times[name]), 3):>24}"
                  f"{sp['min']:>13.2f}{sp['median']:>9.2f}{sp['max']:>9.2f}")
        print(f"coordinator CPU per upload: {e2e['cpu_s_per_upload']:.3f} s (each round's: "
              f"{show(e2e['cpu_s_rounds'], 3)}; user + system, all threads: a figure the machine's "
              f"load does not inflate much)")
        print(f"coordinator loop stall while merging: p99 {e2e['stall_p99_ms']:.1f} ms (each round's: "
              f"{show(e2e['stall_p99_ms_rounds'], 1)}), max {e2e['stall_max_ms']:.1f} ms over "
              f"{e2e['stall_samples']} samples\n")
    head = default_mode if default_mode in modes else modes[0]
    worst = max(modes, key=lambda m: figures[f"loop_stall_ms_p99_{m}"])
    last = results[modes[-1]]
    headline = {"headline_durability": head,
                **{k: figures[f"e2e_{head}_{k.removeprefix('e2e_')}"]
                   for k in ("e2e_vs_raw_post", "e2e_vs_raw_post_min", "e2e_vs_raw_post_max",
                             "e2e_vs_durable_post", "e2e_vs_durable_post_min",
                             "e2e_vs_durable_post_max", "e2e_vs_raw_tcp", "e2e_vs_raw_tcp_min",
                             "e2e_vs_raw_tcp_max")},
                "failed": sum(figures[f"failed_{m}"] + figures[f"failed_reference_{m}"] for m in modes),
                "loop_stall_ms_p99": figures[f"loop_stall_ms_p99_{worst}"],
                "loop_stall_ms_p99_spread": figures[f"loop_stall_ms_p99_{worst}_spread"],
                "loop_stall_mode": worst,
                "centres": {"loop_stall_ms_p99": "p99 of every round's samples together"}}
    lt = last["times"]
    refs: dict[str, Any] = {}
    for name, _ in PATHS[1:]:
        refs[f"{name}_gbps"] = last["bytes"] / statistics.median(lt[name]) / 1e9
        refs[f"{name}_gbps_spread"] = _stats_spread(gbps(last["bytes"], lt[name]))
    figures = {**headline, **figures, **refs,
               "payload_mb": last["bytes"] / 1e6, "arch": a.arch, "params": a.params,
               "reps": a.reps, "warmup": a.warmup}
    if a.json:
        print(json.dumps(finite(figures)))
    return 0


if __name__ == "__main__":
    exit_with(main, "bench.e2e")
