"""Many simulated workers leasing and heartbeating against one coordinator over HTTP
(``python -m bench.scale [--quick] [--json]``).

For each fleet size (1,000 and 10,000 by default) a fresh coordinator process serves ``N`` units
(the real Coordinator behind the real vcasync server; in-memory storage, leases long enough never to
expire). This process simulates ``N`` workers, each its own coroutine: it joins (token), then, at a
random phase within the first heartbeat interval, leases a unit, then heartbeats every ``--interval``
seconds with growing progress, for ``--rounds`` intervals. Arrivals are open-loop (each worker keeps its
own schedule whatever the latency), so the request rate is ``N / interval``: 100/s and 1,000/s with the
defaults. Workers share a pool of keep-alive connections (``--connections``), as a NAT or proxy in
front of a fleet would; requests are msgpack, as the real worker sends them.

Figures: ``p99_ms_1k`` / ``p99_ms_10k`` (p99 latency of lease + heartbeat requests, measured here,
including this process's own scheduling delay, reported separately as ``client_lag_ms_p99``) and
``bytes_per_worker_10k``: the coordinator's resident memory once every worker has joined, leased and
heartbeated, minus its memory before the first join (units already created), divided by ``N``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from typing import Any

from vcasync._loop import run
from vcasync.protocol import _messages as P

from ._http import LeanPool
from ._peers import SECRET
from ._proc import peer


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


class Fleet:
    """``n`` simulated workers sharing one HTTP session."""

    def __init__(self, url: str, n: int, interval: float, rounds: int, connections: int) -> None:
        self.url, self.n, self.interval, self.rounds = url, n, interval, rounds
        self.connections = connections
        self.lease_ms: list[float] = []
        self.beat_ms: list[float] = []
        self.lag_ms: list[float] = []
        self.errors: dict[str, int] = {}

    async def _post(self, http: LeanPool, path: str, kind: str, body: dict[str, Any],
                    reply: str, credential: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {credential}", "Content-Type": P.MSGPACK, "Accept": P.MSGPACK}
        status, data = await http.request("POST", path, headers, P.encode_control(kind, body, P.MSGPACK))
        if status >= 400:
            code = f"{status} {json.loads(data).get('error', '?')}"
            self.errors[code] = self.errors.get(code, 0) + 1
            raise RuntimeError(code)
        return P.decode_control(data, P.MSGPACK, reply)

    async def join_all(self, http: LeanPool) -> list[str]:
        tokens: list[str] = [""] * self.n
        sem = asyncio.Semaphore(self.connections)

        async def one(i: int) -> None:
            async with sem:
                body = await self._post(http, "/v1/join", "join", {"name": f"sim{i}"}, "joined", SECRET)
                tokens[i] = body["token"]

        async with asyncio.TaskGroup() as tg:
            for i in range(self.n):
                tg.create_task(one(i))
        return tokens

    async def simulate(self, http: LeanPool, token: str, start: float,
                       rng: random.Random) -> None:
        loop = asyncio.get_running_loop()
        phase = rng.uniform(0, self.interval)
        due = start + phase
        await asyncio.sleep(max(0.0, due - loop.time()))
        self.lag_ms.append((loop.time() - due) * 1000)
        t0 = time.perf_counter()
        try:
            grant = await self._post(http, "/v1/leases", "lease_request", {}, "lease", token)
        except RuntimeError:
            return
        self.lease_ms.append((time.perf_counter() - t0) * 1000)
        path = f"/v1/leases/{grant['lease_id']}/heartbeat"
        for k in range(1, self.rounds + 1):
            due = start + phase + k * self.interval
            await asyncio.sleep(max(0.0, due - loop.time()))
            self.lag_ms.append((loop.time() - due) * 1000)
            t0 = time.perf_counter()
            try:
                await self._post(http, path, "heartbeat", {"steps_done": k}, "lease", token)
            except RuntimeError:
                continue
            self.beat_ms.append((time.perf_counter() - t0) * 1000)


async def probe(http: LeanPool) -> tuple[int, float, dict[str, Any]]:
    """The coordinator process's resident bytes, CPU seconds so far, and its GC pauses."""
    _, data = await http.request("GET", "/bench/rss", {})
    body = json.loads(data)
    return int(body["rss"]), float(body["cpu_s"]), body


async def measure(url: str, n: int, interval: float, rounds: int, connections: int) -> dict[str, Any]:
    fleet = Fleet(url, n, interval, rounds, connections)
    http = LeanPool(url, connections)
    try:
        before, _, _ = await probe(http)
        t0 = time.perf_counter()
        tokens = await fleet.join_all(http)
        join_s = time.perf_counter() - t0
        rng = random.Random(n)
        gc.collect()
        gc.freeze()  # the load generator's own full GC passes would show up as server latency
        start = asyncio.get_running_loop().time() + 0.5
        _, cpu0, _ = await probe(http)
        async with asyncio.TaskGroup() as tg:
            for token in tokens:
                tg.create_task(fleet.simulate(http, token, start, rng))
        after, cpu1, info = await probe(http)
    finally:
        gc.unfreeze()
        await http.aclose()
    both = fleet.lease_ms + fleet.beat_ms
    return {"workers": n, "requests": len(both), "errors": fleet.errors,
            "p50_ms": _pct(both, 0.5), "p99_ms": _pct(both, 0.99),
            "lease_p99_ms": _pct(fleet.lease_ms, 0.99), "heartbeat_p99_ms": _pct(fleet.beat_ms, 0.99),
            "client_lag_ms_p99": _pct(fleet.lag_ms, 0.99), "join_per_s": n / join_s,
            "bytes_per_worker": (after - before) / n, "rate_per_s": n / interval,
            "server_cpu_us_per_request": (cpu1 - cpu0) / max(1, len(both)) * 1e6,
            "server_gc_max_ms": info.get("gc_max_ms", 0.0), "server_gc_gen2": info.get("gc_gen2_passes", 0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--workers", default="1000,10000", help="fleet sizes, comma-separated")
    p.add_argument("--interval", type=float, default=10.0, help="heartbeat interval, seconds")
    p.add_argument("--rounds", type=int, default=3, help="heartbeats per worker after its lease")
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--quick", action="store_true", help="one heartbeat round")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds = 1
    rows = []
    for n in (int(x) for x in a.workers.split(",")):
        with peer("coordinator", "--params", "1000", "--units", str(n), "--steps", "1000000",
                  "--durability", "none", "--lease-timeout", str(max(600.0, 10 * a.interval))) as url:
            rows.append(run(measure(url, n, a.interval, a.rounds, a.connections)))
    print(f"simulated workers over HTTP: heartbeat every {a.interval:.0f}s for {a.rounds} round(s), "
          f"{a.connections} pooled connections, open-loop arrivals")
    print(f"{'workers':>8}{'req/s':>8}{'requests':>10}{'p50 ms':>9}{'p99 ms':>9}{'lease p99':>11}"
          f"{'beat p99':>10}{'client lag p99':>16}{'bytes/worker':>14}{'joins/s':>9}{'srv us/req':>11}")
    for r in rows:
        print(f"{r['workers']:>8}{r['rate_per_s']:>8.0f}{r['requests']:>10}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['lease_p99_ms']:>11.2f}{r['heartbeat_p99_ms']:>10.2f}{r['client_lag_ms_p99']:>16.2f}"
              f"{r['bytes_per_worker']:>14.0f}{r['join_per_s']:>9.0f}"
              f"{r['server_cpu_us_per_request']:>11.0f}")
        print(f"  server GC: {r['server_gc_gen2']} full passes, longest pause {r['server_gc_max_ms']:.1f} ms")
        if r["errors"]:
            print(f"  errors: {r['errors']}")
    figures: dict[str, Any] = {}
    for r in rows:
        tag = f"{r['workers'] // 1000}k" if r["workers"] % 1000 == 0 else str(r["workers"])
        figures[f"p99_ms_{tag}"] = r["p99_ms"]
        figures[f"p50_ms_{tag}"] = r["p50_ms"]
        figures[f"bytes_per_worker_{tag}"] = r["bytes_per_worker"]
        figures[f"client_lag_ms_p99_{tag}"] = r["client_lag_ms_p99"]
        figures[f"errors_{tag}"] = sum(r["errors"].values())
    ordered = {k: figures[k] for k in ("p99_ms_1k", "p99_ms_10k", "bytes_per_worker_10k") if k in figures}
    if a.json:
        print(json.dumps({**ordered, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
