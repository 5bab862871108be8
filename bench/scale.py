"""Many simulated workers leasing and heartbeating against one coordinator over HTTP, as a NAT would
see them (``python -m bench.scale [--quick] [--json]``).

Each run starts a fresh coordinator process (the real Coordinator behind the real vcasync server;
in-memory storage, leases long enough never to expire, a ``--params`` float32 model). This process
simulates ``N`` workers, each its own coroutine: it joins (token), then, at a random phase within the
first heartbeat interval, leases a unit, then heartbeats every ``--interval`` seconds with growing
progress, for ``--rounds`` intervals. Arrivals are open-loop (each worker keeps its own schedule
whatever the latency), so the request rate is ``N / interval``: 1,000/s for 10,000 workers every 10 s.
Requests are msgpack, as the real worker sends them. Meanwhile a real worker client (``vcasync``'s
``CoordinatorClient``) leases and uploads delta results back to back, so results are merged while
the fleet heartbeats (``results_merged_*`` says how many).

Connections, per run:

* ``pool``: the workers share ``--connections`` keep-alive connections (a proxy in front of a fleet);
* ``conn``: every worker has its own TCP connection (what a NAT sees: 10,000 workers, 10,000
  connections, each opened at join and kept alive);
* ``tls``: the same over TLS 1.3 (a self-signed ECDSA certificate made at run time; every worker
  does its own handshake).

Failures are figures, never dropped. Every request has a ``--timeout``; a request that fails (an
HTTP error, a broken connection) or times out is counted in ``failed_*`` and enters the latency
list *as a timeout* (``--timeout`` seconds), and so does every heartbeat a worker could not send
because its lease failed: a p99 cannot look good while 1 % of the fleet is failing. In the merging
runs a real worker uploads results back to back from a process of its own (``results_merged``);
the fleet starts once it has joined, so every merging run's figures are taken while merging, and a
merger that never got ready, or died, counts as one failed request.

Repetitions: every run above runs ``--reps`` times (default 3; ``--quick`` 2), each time against a
fresh server process, one repetition after the other (each repetition runs every run once, so a
ratio such as ``heartbeats_vs_bare_aiohttp`` is taken between runs of the same repetition). Each
figure is the median of its repetitions (``bench._stats.over_reps``); the headline figures have
``NAME_spread``, ``[min, median, max]`` over the repetitions, beside them. Failures are summed over
every repetition, never a median: ``failed_10k``, ``failed_total`` and every run's ``failed`` count
all of them, the headline ones with ``NAME_per_rep`` (each repetition's count). A figure a
repetition could not give (``beats_per_core_s`` with too little server CPU to time) is None, with
the repetition named under ``reasons``, never the median of the others. The default run (two pooled
fleets, then 10,000 workers on their own connections, over TLS, quiet and bare, 10 s x 3 rounds)
takes about 5 minutes a repetition on 2 idle cores: about 15 minutes (27 minutes on 2 cores at load
average 11, 2026-12-06); ``--quick`` about 50 s a repetition: under 2 minutes (2 repetitions, not
3, to stay within them; 3.6 minutes at load average 10).

Figures (named by the fleet size run: ``--quick`` runs 1,000 workers and names them ``_1k``; the
default run, ``--workers 1000,10000``, gives the ``_10k`` names issue 18 asks for; each the median
over the repetitions, failures summed):
``p99_ms_1k``/``p99_ms_10k`` (pooled), ``p99_ms_10k_conn``, ``p99_ms_10k_tls`` (p99 of lease +
heartbeat latency, measured here, including this process's own scheduling delay, reported as
``client_lag_ms_p99_*``), ``failed_10k`` (failed or timed-out requests of the conn and tls runs),
``bytes_per_worker_10k`` (the coordinator's resident memory once every worker has joined over its
own connection, leased and heartbeated, its connections still open, minus its memory before the
first join, divided by ``N``, in the run without merging, whose buffers would count too, and with a
ledger sized to the fleet, whose start-up leaves no freed heap to hide the connections in;
``bytes_per_worker_10k_vs_bare_aiohttp`` against bare aiohttp under the same load, below 1 a sign
that freed heap absorbed them; ``bytes_per_worker_10k_pool`` with pooled connections, merging) and
``heartbeats_vs_bare_aiohttp``: successful heartbeats per server core-second (server CPU time over
the heartbeat-only rounds, the same fleet on its own connections, no merging) against a bare aiohttp
handler that reads the body and answers a few bytes (``bench._peers bare``) under the identical
load. A server that cannot keep up is charged for the requests it failed: they are not counted as
served, their CPU is. Raises ``RLIMIT_NOFILE`` to its hard limit here and in the server and says so
if the hard limit is below what the fleet needs.
``<run>_server_gc_max_ms``: the server's longest garbage-collector pass over the run (its joins
included). Both servers run under :class:`vcasync.server.CollectorGuard`, as ``vcasync
coordinator`` does (``python -m bench._peers coordinator --no-gc-guard`` runs one without it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.tls import self_signed
from vcasync._loop import run
from vcasync.protocol import _messages as P
from vcasync.wire import encode_payload
from vcasync.worker._client import CoordinatorClient

from ._http import LeanPool, OneConn
from ._peers import SECRET, bench_model
from ._proc import peer
from ._signals import exit_with, restores_sigterm, start_process, stop_on_sigterm
from ._stats import (
    add_quick,
    finite,
    over_reps,
    parse_args,
    positive_float,
    positive_int,
    positive_ints,
    show,
)
from ._tls import client_context


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def raise_nofile(need: int) -> str:
    """Raise this process's soft open-file limit to its hard limit; a note if that is short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < need:
        return f"RLIMIT_NOFILE hard limit {hard} < {need} needed: connections will fail"
    return f"RLIMIT_NOFILE {soft} (raised to the hard limit)"


@dataclass(frozen=True)
class Run:
    """One measured run: how the workers connect, how many, whether results merge meanwhile."""

    label: str
    connect: str          # "pool", "conn" or "tls"
    workers: int
    merging: bool = True
    server: str = "coordinator"   # or "bare"


class Failed(Exception):
    """A request that did not succeed (HTTP error, broken connection, timeout)."""


class Fleet:
    """``n`` simulated workers, on a shared pool or each on its own connection."""

    def __init__(self, run_: Run, url: str, interval: float, rounds: int, connections: int,
                 timeout: float, tls: Any) -> None:
        self.run, self.url, self.interval, self.rounds = run_, url, interval, rounds
        self.timeout = timeout
        n = run_.workers
        self.pool = LeanPool(url, connections) if run_.connect == "pool" else None
        self.conns = [] if self.pool else [OneConn(url, tls) for _ in range(n)]
        self.lease_ms: list[float] = []
        self.beat_ms: list[float] = []
        self.lag_ms: list[float] = []
        self.errors: dict[str, int] = {}
        self.failed = 0
        self.served: list[float] = []   # due offsets (from start) of heartbeats that succeeded

    def _http(self, i: int) -> LeanPool | OneConn:
        return self.pool if self.pool is not None else self.conns[i]

    def _fail(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        self.failed += 1

    async def _post(self, i: int, path: str, kind: str, body: dict[str, Any], reply: str,
                    credential: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {credential}", "Content-Type": P.MSGPACK, "Accept": P.MSGPACK}
        try:
            async with asyncio.timeout(self.timeout):
                status, data = await self._http(i).request(
                    "POST", path, headers, P.encode_control(kind, body, P.MSGPACK))
        except TimeoutError:
            self._fail("timeout")
            raise Failed("timeout") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self._fail(type(exc).__name__)
            raise Failed(type(exc).__name__) from None
        if status >= 400:
            try:
                code = f"{status} {json.loads(data).get('error', '?')}"
            except ValueError:
                code = f"{status} ?"
            self._fail(code)
            raise Failed(code)
        if self.run.server == "bare":
            return {"token": "bare", "lease_id": "bare"}
        return P.decode_control(data, P.MSGPACK, reply)

    async def join_all(self) -> list[str]:
        tokens: list[str] = [""] * self.run.workers
        sem = asyncio.Semaphore(256)   # at most this many handshakes in flight (the listen backlog)

        async def one(i: int) -> None:
            async with sem:
                with contextlib.suppress(Failed):   # counted; its requests will count as failed
                    body = await self._post(i, "/v1/join", "join", {"name": f"sim{i}"}, "joined", SECRET)
                    tokens[i] = body["token"]

        async with asyncio.TaskGroup() as tg:
            for i in range(self.run.workers):
                tg.create_task(one(i))
        return tokens

    async def _timed(self, i: int, out: list[float], path: str, kind: str, body: dict[str, Any],
                     reply: str, token: str) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        try:
            got = await self._post(i, path, kind, body, reply, token)
        except Failed:
            out.append(self.timeout * 1000)   # a failure counts as a timeout, never dropped
            return None
        out.append((time.perf_counter() - t0) * 1000)
        return got

    async def simulate(self, i: int, token: str, start: float, rng: random.Random) -> None:
        loop = asyncio.get_running_loop()
        phase = rng.uniform(0, self.interval)
        due = start + phase
        await asyncio.sleep(max(0.0, due - loop.time()))
        self.lag_ms.append((loop.time() - due) * 1000)
        grant = None
        if token:
            grant = await self._timed(i, self.lease_ms, "/v1/leases", "lease_request", {}, "lease", token)
        else:
            self._fail("no token")
            self.lease_ms.append(self.timeout * 1000)
        path = f"/v1/leases/{grant['lease_id']}/heartbeat" if grant else ""
        for k in range(1, self.rounds + 1):
            due = start + phase + k * self.interval
            await asyncio.sleep(max(0.0, due - loop.time()))
            self.lag_ms.append((loop.time() - due) * 1000)
            if not path:       # no lease: every heartbeat it owed is a failure
                self._fail("no lease")
                self.beat_ms.append(self.timeout * 1000)
                continue
            if await self._timed(i, self.beat_ms, path, "heartbeat", {"steps_done": k}, "lease",
                                 token) is not None:
                self.served.append(phase + k * self.interval)

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
        for c in self.conns:
            await c.aclose()


class Merger:
    """A real worker uploading delta results back to back while the fleet runs (in a process of
    its own, ``python -m bench.scale --merger URL``: encoding results here would stall the
    fleet's own loop and show up as server latency)."""

    def __init__(self, url: str, params: int, ssl_context: Any) -> None:
        self.url, self.ssl = url, ssl_context
        gen = torch.Generator().manual_seed(1)
        self.delta = {k: torch.randn(v.shape, generator=gen) * 1e-3
                      for k, v in bench_model(params).items()}
        self.merged = 0
        self.failed = 0

    async def loop(self, stop: asyncio.Event, ready: Callable[[], None] = lambda: None) -> None:
        async with CoordinatorClient(self.url, timeout_s=120, ssl_context=self.ssl) as client:
            await client.join(SECRET, "merger")
            ready()
            while not stop.is_set():
                try:
                    grant = await client.lease()
                    meta = {"lease_id": grant.lease_id, "base_version": grant.base_version,
                            "kind": "delta", "samples": 1, "steps": 1, "partial": False, "metrics": {}}
                    data = b"".join(encode_payload("result", meta, self.delta))
                    receipt = await client.submit(grant.lease_id, data, size=len(data))
                except Exception:   # counted, the run goes on
                    self.failed += 1
                    await asyncio.sleep(0.1)
                    continue
                if receipt.status == "accepted":
                    self.merged += 1
                else:
                    self.failed += 1


def merger_main(url: str, params: int, cert: str | None) -> int:
    """The merger process: upload results until SIGTERM, then print ``merged failed``."""
    import signal

    async def go() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        m = Merger(url, params, client_context(Path(cert)) if cert else None)
        try:
            await m.loop(stop, lambda: print("ready", flush=True))
        finally:
            print(m.merged, m.failed, flush=True)

    run(go())
    return 0


#: How long a merger process may take to start and join before the run goes on without it.
MERGER_READY_S = 120.0


@contextlib.contextmanager
def merger_process(url: str, params: int, cert: Path | None) -> Iterator[list[int]]:
    """A merger process for the ``with`` block; yields ``[merged, failed]``, filled at exit.

    The block starts once the merger has joined (it says ``ready``): a short run (the tests' 200
    workers for one round) used to end while the merger was still importing torch on a loaded
    machine, so nothing was merged during it and the merger, stopped before it could handle
    SIGTERM, was counted as a failed request. One that is not ready within ``MERGER_READY_S`` is
    counted as a failure and the run goes on without it."""
    import select
    import subprocess
    counts = [0, 0]
    cmd = [sys.executable, "-m", "bench.scale", "--merger", url, "--params", str(params)]
    proc = start_process(cmd + (["--cert", str(cert)] if cert else []), stdout=subprocess.PIPE,
                         text=True)
    try:   # from its start: a run interrupted while the merger started (up to MERGER_READY_S) left it
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], MERGER_READY_S)
        ready = bool(readable) and proc.stdout.readline().strip() == "ready"
        if not ready:
            counts[1] += 1                 # never ready (died, or hung): a failure, not silence
        yield counts
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # hung: killed below, and a failure
            out = ""
        parts = out.split()
        if len(parts) >= 2:
            counts[0], counts[1] = int(parts[-2]), counts[1] + int(parts[-1])
        elif ready:   # it died after it was ready: a failure, never silence (once)
            counts[1] += 1
    finally:          # interrupted (Ctrl-C, SIGTERM), an error, or hung: it never outlives the run
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def probe(url: str, tls: Any) -> tuple[int, float, dict[str, Any]]:
    """The server process's resident bytes, CPU seconds so far, and what else it reports."""
    c = OneConn(url, tls)
    try:
        _, data = await c.request("GET", "/bench/rss", {})
    finally:
        await c.aclose()
    body = json.loads(data)
    return int(body["rss"]), float(body["cpu_s"]), body


async def measure(run_: Run, url: str, a: argparse.Namespace, tls: Any) -> dict[str, Any]:
    """One run of the fleet (the merger, if any, runs in its own process meanwhile)."""
    fleet = Fleet(run_, url, a.interval, a.rounds, a.connections, a.timeout, tls)
    try:
        before, _, _ = await probe(url, tls)
        t0 = time.perf_counter()
        tokens = await fleet.join_all()
        join_s = time.perf_counter() - t0
        rng = random.Random(run_.workers)
        gc.collect()
        gc.freeze()  # the load generator's own full GC passes would show up as server latency
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.5

        async def beats_window() -> tuple[float, float]:
            # Heartbeats only: after every lease (the first interval), until the last round.
            await asyncio.sleep(max(0.0, start + a.interval - loop.time()))
            _, c0, _ = await probe(url, tls)
            await asyncio.sleep(max(0.0, start + (a.rounds + 0.9) * a.interval - loop.time()))
            _, c1, _ = await probe(url, tls)
            return c0, c1

        async with asyncio.TaskGroup() as tg:
            window = tg.create_task(beats_window())
            for i, tok in enumerate(tokens):
                tg.create_task(fleet.simulate(i, tok, start, rng))
        after, _, info = await probe(url, tls)
        c0, c1 = window.result()
    finally:
        gc.unfreeze()
        await fleet.aclose()
    n = run_.workers
    both = fleet.lease_ms + fleet.beat_ms
    lo, hi = a.interval, (a.rounds + 0.9) * a.interval   # the CPU window, after ``start``
    # Only heartbeats that succeeded count: a failed one costs the server little and serves nobody.
    window_beats = sum(1 for due in fleet.served if lo <= due <= hi)
    cpu = c1 - c0
    return {"label": run_.label, "connect": run_.connect, "workers": n, "requests": len(both),
            "failed": fleet.failed, "errors": fleet.errors,
            "p50_ms": _pct(both, 0.5), "p99_ms": _pct(both, 0.99),
            "lease_p99_ms": _pct(fleet.lease_ms, 0.99), "heartbeat_p99_ms": _pct(fleet.beat_ms, 0.99),
            "client_lag_ms_p99": _pct(fleet.lag_ms, 0.99), "join_per_s": n / join_s,
            "bytes_per_worker": (after - before) / n, "rate_per_s": n / a.interval,
            "beats_per_core_s": window_beats / cpu if cpu > 0.01 else None,   # None: too few to time
            "results_merged": 0,
            "connections_opened": sum(c.opened for c in fleet.conns) if fleet.conns else a.connections,
            "server_gc_max_ms": info.get("gc_max_ms", 0.0)}


def runs(a: argparse.Namespace) -> list[Run]:
    big = max(int(x) for x in a.workers.split(","))
    out = [Run(f"pool_{n}", "pool", n) for n in (int(x) for x in a.workers.split(","))]
    out += [Run(f"conn_{big}", "conn", big), Run(f"tls_{big}", "tls", big),
            Run(f"quiet_{big}", "conn", big, merging=False),
            Run(f"bare_{big}", "conn", big, merging=False, server="bare")]
    return out


def units(r: Run) -> int:
    """Units in the run's ledger: enough for the merger's results beside the fleet's leases; in a
    run without merging (``quiet``, ``bare``: the memory figure's), one per worker and 1,000 spare.
    A 100,000-unit ledger built at start-up left enough freed heap for 1,000 workers' connections
    to fit in without the RSS growing: 102 bytes per worker, measured, against 12.7 kB with the
    ledger sized to the fleet (and 10.9 kB for bare aiohttp under the same load)."""
    return r.workers + (100_000 if r.merging else 1000)


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's figures from the runs' rows, named by the fleet size each run had (``_10k``
    for 10,000 workers, ``_1k`` for 1,000), never by the size a default run would have had."""
    by = {r["label"]: r for r in rows}
    big = max(r["workers"] for r in rows)
    t = _tag(big)
    quiet, bare = by[f"quiet_{big}"], by[f"bare_{big}"]
    figures: dict[str, Any] = {
        f"p99_ms_{t}_conn": by[f"conn_{big}"]["p99_ms"], f"p99_ms_{t}_tls": by[f"tls_{big}"]["p99_ms"],
        f"failed_{t}": by[f"conn_{big}"]["failed"] + by[f"tls_{big}"]["failed"],
        # memory per connected worker from the run without merging (merges allocate too), its
        # connections still open; bare aiohttp under the same load is its reference (below 1, the
        # figure is suspect: freed heap absorbed the connections)
        f"bytes_per_worker_{t}": quiet["bytes_per_worker"],
        f"bytes_per_worker_{t}_vs_bare_aiohttp": _ratio(quiet["bytes_per_worker"], bare["bytes_per_worker"]),
        "heartbeats_vs_bare_aiohttp": _ratio(quiet["beats_per_core_s"], bare["beats_per_core_s"]),
        "workers": big,
    }
    for r in rows:
        if r["connect"] == "pool":
            figures[f"p99_ms_{_tag(r['workers'])}"] = r["p99_ms"]
            figures[f"bytes_per_worker_{_tag(r['workers'])}_pool"] = r["bytes_per_worker"]
        for k in ("p50_ms", "p99_ms", "failed", "bytes_per_worker", "beats_per_core_s",
                  "results_merged", "client_lag_ms_p99", "heartbeat_p99_ms", "lease_p99_ms",
                  "server_gc_max_ms"):
            figures[f"{r['label']}_{k}"] = r[k]
    figures["failed_total"] = sum(r["failed"] for r in rows)
    return figures


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _tag(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


QUICK: dict[str, Any] = {"workers": "1000", "interval": 2.0, "rounds": 1, "reps": 2}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--workers", type=positive_ints, default="1000,10000",
                   help="pooled fleet sizes; the largest also "
                   "runs on its own connections, over TLS, and against bare aiohttp")
    p.add_argument("--interval", type=positive_float, default=10.0, help="heartbeat interval, seconds")
    p.add_argument("--rounds", type=positive_int, default=3, help="heartbeats per worker after its lease")
    p.add_argument("--connections", type=positive_int, default=256, help="pool size of the pooled runs")
    p.add_argument("--params", type=positive_int, default=1_000_000, help="model size the merger uploads")
    p.add_argument("--timeout", type=positive_float, default=10.0, help="per request, seconds")
    p.add_argument("--reps", type=positive_int, default=3,
                   help="repetitions of every run (each figure: the median, with min / max)")
    add_quick(p, QUICK, "1,000 workers every 2 s, 1 round, 2 repetitions")
    p.add_argument("--json", action="store_true")
    p.add_argument("--merger", default=None, help=argparse.SUPPRESS)   # the merger process
    p.add_argument("--cert", default=None, help=argparse.SUPPRESS)
    return parse_args(p, argv)


def one_run(r: Run, a: argparse.Namespace, cert: Path, key: Path) -> dict[str, Any]:
    """``r`` against a fresh server process (and a merger process when it merges): its row."""
    tls = client_context(cert) if r.connect == "tls" else None
    extra = ["--tls-cert", str(cert), "--tls-key", str(key)] if tls else []
    args = ["--params", str(a.params), "--units", str(units(r)), "--steps", "1000000",
            "--durability", "none", "--lease-timeout", str(max(600.0, 10 * a.interval)), *extra]
    with peer(r.server, *args) as url, contextlib.ExitStack() as stack:
        counts = (stack.enter_context(merger_process(url, a.params, cert if tls else None))
                  if r.merging else None)
        row = run(measure(r, url, a, tls))
    if counts is not None:   # the merger has exited: its counts are final
        row["results_merged"], row["failed"] = counts[0], row["failed"] + counts[1]
    return row


#: A single run's figures in :func:`headline` (``conn_10000_p99_ms``), not the headline's own.
_PER_RUN = re.compile(r"^(pool|conn|tls|quiet|bare)_\d+_")


def summarise(per_rep: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures over every repetition (``bench._stats.over_reps``): failures summed (each
    repetition's beside the headline's ``failed_*``), every other figure the median of its
    repetitions, the headline ones with ``NAME_spread`` (``[min, median, max]``) beside them."""
    head = [k for k in per_rep[0] if not _PER_RUN.match(k) and k != "workers"]
    return over_reps(per_rep, head, lambda k: k.startswith("failed") or k.endswith("_failed"))


def _table(rows: list[dict[str, Any]], title: str) -> None:
    print(title)
    print(f"{'run':>12}{'req/s':>7}{'requests':>9}{'failed':>7}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'lease p99':>10}{'beat p99':>9}{'lag p99':>8}{'B/worker':>9}{'beats/core-s':>13}{'merged':>7}")
    for r in rows:
        print(f"{r['label']:>12}{r['rate_per_s']:>7.0f}{r['requests']:>9}{r['failed']:>7}{r['p50_ms']:>8.2f}"
              f"{r['p99_ms']:>8.2f}{r['lease_p99_ms']:>10.2f}{r['heartbeat_p99_ms']:>9.2f}"
              f"{r['client_lag_ms_p99']:>8.2f}{r['bytes_per_worker']:>9.0f}"
              f"{r['beats_per_core_s'] or float('nan'):>13.0f}"
              f"{r['results_merged']:>7}")
        if r["errors"]:
            print(f"  errors: {r['errors']}")
    sys.stdout.flush()   # a repetition's table as it ends, not at the end of the run


def _summary(per_rep: list[dict[str, Any]], figures: dict[str, Any]) -> None:
    print(f"over {len(per_rep)} repetition(s): median (min-max); failures summed")
    for k, v in figures.items():
        if k.endswith("_spread") and v is not None:
            name = k.removesuffix("_spread")
            print(f"  {name:<40}{show([r[name] for r in per_rep], 3)}")
        elif k.endswith("_per_rep"):
            name = k.removesuffix("_per_rep")
            print(f"  {name:<40}{figures[name]} (per repetition: {', '.join(map(str, v))})")
    for name, why in (figures.get("reasons") or {}).items():
        print(f"  {name:<40}{why}")


@restores_sigterm
def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.merger:
        return merger_main(a.merger, a.params, a.cert)
    stop_on_sigterm()  # its server and merger stopped, its directories removed
    big = max(int(x) for x in a.workers.split(","))
    note = raise_nofile(big + 1000)
    print(f"simulated workers over HTTP: heartbeat every {a.interval:g}s for {a.rounds} round(s), "
          f"open-loop arrivals, {a.timeout:g}s timeout (failures count as timeouts), "
          f"{a.reps} repetition(s); {note}", flush=True)
    per_rep = []
    with tempfile.TemporaryDirectory(prefix="vcasync-scale-") as tmp:
        cert, key = self_signed(Path(tmp))
        for rep in range(a.reps):     # every run once per repetition: the ratios are paired
            rows = [one_run(r, a, cert, key) for r in runs(a)]
            _table(rows, f"repetition {rep + 1} of {a.reps}")
            per_rep.append(headline(rows))
    figures = summarise(per_rep)
    _summary(per_rep, figures)
    figures["config"] = (f"interval {a.interval:g}s, rounds {a.rounds}, pool {a.connections}, "
                         f"merger model {a.params} params, timeout {a.timeout:g}s, reps {a.reps}")
    figures["nofile"] = note
    if a.json:
        print(json.dumps(finite(_rounded(figures))))
    return 0


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 3)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


if __name__ == "__main__":
    exit_with(main, "bench.scale")
