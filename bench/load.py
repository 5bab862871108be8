"""Load with merges: N simulated workers lease and heartbeat while real results are merged
(``python -m bench.load [--quick] [--json]``).

Built on :mod:`bench.scale` (the same coordinator process, the same open-loop fleet of coroutines on a
lean HTTP pool): while its ``N`` workers lease and heartbeat every ``--interval`` seconds, a few
*submitters* (real clients, :class:`vcasync.CoordinatorClient`) lease units, download the model,
and upload delta results as fast as they can, so the coordinator merges all along. The lease timeout
is only ``--timeout-factor`` heartbeat intervals, so a heartbeat that is answered late or dropped shows
up as an expired lease: ``leases_expired`` must stay 0 (no lease expires wrongly).

Failures are figures, never dropped: ``failed`` counts the fleet's failed or timed-out requests
(:mod:`bench.scale`'s rules) *and* every submitter error, listed by kind in ``submit_errors``: a
join, lease, download or upload that failed or took over ``SUBMIT_TIMEOUT_S``, and a result the
coordinator answered but did not accept (``rejected`` and its reason). A submitter counts its error
and tries again (after ``RETRY_S``), handing back the lease it held. (Until 2026-12-06 submitter
errors were listed but left out of ``failed``, and one that was not a vcasync error, a refused
connection, ended the run in a traceback.)

Figures: ``p50_ms`` / ``p99_ms`` of lease and heartbeat requests during the merges, ``merges`` and
``merges_per_s``, ``bytes_per_worker`` (the coordinator's resident memory after, minus before the
fleet joined, over ``N``; retained model versions included), ``leases_expired``, ``failed``.

Repetitions: ``--reps`` measurements (default 5; ``--quick`` 3), each in a fresh coordinator
process. Each figure is the median of its repetitions (``bench._stats.over_reps``), the headline
ones (``HEADLINE``) with ``NAME_spread``, ``[min, median, max]``, beside them; ``failed`` and
``leases_expired`` are summed over every repetition, each repetition's under ``NAME_per_rep``, and
the errors are summed by kind. The default run (10,000 workers, 10 s x 3 rounds) takes about 50 s a
repetition on 2 idle cores: about 4 minutes (6 minutes at load average 11); ``--quick`` about 15 s
a repetition: under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import torch

from vcasync._loop import run
from vcasync.wire import decode_payload_bytes, encode_payload
from vcasync.worker._client import CoordinatorClient

from . import scale
from ._http import LeanPool
from ._peers import SECRET
from ._proc import peer
from ._signals import exit_with, restores_sigterm, stop_on_sigterm
from ._stats import add_quick, finite, over_reps, parse_args, positive_float, positive_int, show


async def _metric(http: LeanPool, name: str) -> float:
    _, data = await http.request("GET", "/metrics", {})
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


#: One submission (lease, download, upload) that takes longer than this is a failure.
SUBMIT_TIMEOUT_S = 120.0
#: A submitter waits this long after an error before it tries again (a failing coordinator is not
#: hammered while the fleet's latency is measured on it).
RETRY_S = 0.1


class NotAccepted(Exception):
    """A result the coordinator answered but did not merge (``rejected``, a duplicate)."""


def _count(errors: dict[str, int], kind: str) -> None:
    errors[kind] = errors.get(kind, 0) + 1


async def submitter(url: str, stop: asyncio.Event, done: list[int], errors: dict[str, int],
                    rng: random.Random) -> None:
    """Lease, download, upload a small delta, repeat, until ``stop``: real results, really merged.

    Every error is counted in ``errors`` by kind, never raised: a join that fails (tried again), a
    request that fails or times out, a result the coordinator did not accept (``rejected``)."""
    with tempfile.TemporaryDirectory(prefix="vcasync-load-") as tmp:
        async with CoordinatorClient(url, timeout_s=60.0) as client:
            path = Path(tmp) / "model.vca"
            joined = False
            while not stop.is_set():
                if not joined:
                    joined = await _attempt(client.join(SECRET, "submitter"), "join", errors)
                    if joined:
                        continue
                elif await _submit_one(client, path, done, errors, rng):
                    continue
                await asyncio.sleep(RETRY_S)


async def _attempt(op: Awaitable[Any], what: str, errors: dict[str, int]) -> bool:
    """Await ``op`` within ``SUBMIT_TIMEOUT_S``; False, with the failure counted, if it failed."""
    try:
        async with asyncio.timeout(SUBMIT_TIMEOUT_S):
            await op
    except TimeoutError:
        _count(errors, f"{what}: timeout")
        return False
    except NotAccepted as exc:
        _count(errors, f"{what}: {exc}")
        return False
    except Exception as exc:    # any failure (HTTP, connection, a refused request) is counted
        _count(errors, f"{what}: {type(exc).__name__}")
        return False
    return True


async def _submit_one(client: CoordinatorClient, path: Path, done: list[int], errors: dict[str, int],
                      rng: random.Random) -> bool:
    """One lease, download and upload; True when the result was accepted, else the failure is
    counted in ``errors``."""
    async def once() -> None:
        grant = await client.lease()
        try:
            await client.download_model(grant.base_version, path)
            data = await asyncio.to_thread(path.read_bytes)
            model = decode_payload_bytes(data, expected_kind="model").tensors
            gen = torch.Generator().manual_seed(rng.randrange(2**31))
            delta = {k: 1e-3 * torch.randn(v.shape, generator=gen) for k, v in model.items()}
            meta = {"lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
                    "samples": 1, "steps": 1, "partial": False, "metrics": {}}
            body = b"".join(encode_payload("result", meta, delta))
            receipt = await client.submit(grant.lease_id, body)
        except Exception:   # handed back, as a worker would: left to expire, it would count as
            with contextlib.suppress(Exception):   # a lease expired wrongly
                await client.release(grant.lease_id, "bench.load: the submission failed")
            raise
        if receipt.status != "accepted":
            raise NotAccepted(f"{receipt.status} {receipt.reason or ''}".strip())
        done.append(receipt.version)

    return await _attempt(once(), "submit", errors)


async def measure(url: str, n: int, interval: float, rounds: int, connections: int,
                  submitters: int) -> dict[str, Any]:
    fleet = scale.Fleet(scale.Run("load", "pool", n), url, interval, rounds, connections,
                        timeout=max(10.0, interval), tls=None)
    http = LeanPool(url, 4)   # for the metrics probes; the fleet has its own pool
    merged: list[int] = []
    sub_errors: dict[str, int] = {}
    stop = asyncio.Event()
    try:
        before, _, _ = await scale.probe(url, None)
        tokens = await fleet.join_all()
        gc.collect()
        gc.freeze()
        start = asyncio.get_running_loop().time() + 0.5
        t0 = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            subs = [tg.create_task(submitter(url, stop, merged, sub_errors, random.Random(i)))
                    for i in range(submitters)]
            async with asyncio.TaskGroup() as sims:
                for i, token in enumerate(tokens):
                    sims.create_task(fleet.simulate(i, token, start, random.Random(hash(token))))
            stop.set()
            await asyncio.gather(*subs)
        seconds = time.perf_counter() - t0
        expired = await _metric(http, "vcasync_leases_expired_total")
        merges = await _metric(http, "vcasync_merges_total")
        after, _, _ = await scale.probe(url, None)
    finally:
        gc.unfreeze()
        await fleet.aclose()
        await http.aclose()
    both = fleet.lease_ms + fleet.beat_ms
    return {"workers": n, "requests": len(both), "errors": fleet.errors, "submit_errors": sub_errors,
            # every failure counts: the fleet's requests and the submitters' (until 2026-12-06 a
            # submitter's errors were listed in submit_errors but left out of failed)
            "failed": fleet.failed + sum(sub_errors.values()),
            "p50_ms": scale._pct(both, 0.5), "p99_ms": scale._pct(both, 0.99),
            "heartbeat_p99_ms": scale._pct(fleet.beat_ms, 0.99),
            "client_lag_ms_p99": scale._pct(fleet.lag_ms, 0.99),
            "merges": int(merges), "results_accepted": len(merged), "merges_per_s": merges / seconds,
            "leases_expired": int(expired), "bytes_per_worker": (after - before) / n}


def load(workers: int, interval: float, rounds: int, connections: int, submitters: int,
         params: int, timeout_factor: float) -> dict[str, Any]:
    """One measurement in a fresh coordinator process (what ``bench.chaos`` calls)."""
    with peer("coordinator", "--params", str(params), "--units", str(workers + 100_000), "--steps", "1000000",
              "--durability", "none", "--lease-timeout", str(timeout_factor * interval)) as url:
        return run(measure(url, workers, interval, rounds, connections, submitters))


QUICK: dict[str, Any] = {"workers": 1000, "interval": 2.0, "rounds": 2, "reps": 3}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--workers", type=positive_int, default=10_000)
    p.add_argument("--interval", type=positive_float, default=10.0, help="heartbeat interval, seconds")
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--connections", type=positive_int, default=256)
    p.add_argument("--submitters", type=positive_int, default=4)
    p.add_argument("--params", type=positive_int, default=100_000, help="model size (float32 parameters)")
    p.add_argument("--timeout-factor", type=positive_float, default=3.0,
                   help="lease timeout in heartbeat intervals")
    p.add_argument("--reps", type=positive_int, default=5,
                   help="repetitions, each in a fresh coordinator (each figure: the median, with min / max)")
    add_quick(p, QUICK, "1,000 workers, 2 s heartbeats, 2 rounds, 3 repetitions")
    p.add_argument("--json", action="store_true")
    return parse_args(p, argv)


#: The figures given with their min / median / max over the repetitions (counts: each repetition's).
HEADLINE = ("p99_ms", "leases_expired", "failed", "p50_ms", "heartbeat_p99_ms", "client_lag_ms_p99",
            "merges_per_s", "bytes_per_worker")
#: Counts, summed over the repetitions (a failure in any of them stays in the figure).
COUNTS = ("failed", "leases_expired")


def summarise(per_rep: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures over every repetition (``bench._stats.over_reps``): ``failed`` and
    ``leases_expired`` summed, each repetition's beside them; every other figure the median, the
    headline ones with ``NAME_spread`` (``[min, median, max]``); errors summed by kind."""
    first = [{k: r[k] for k in (*HEADLINE, *r)} for r in per_rep]   # the headline first
    return over_reps(first, HEADLINE, lambda k: k in COUNTS)


@restores_sigterm
def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    stop_on_sigterm()  # its coordinator stopped, its directories removed
    print(f"{a.workers} simulated workers, heartbeat every {a.interval:g}s x {a.rounds}, lease timeout "
          f"{a.timeout_factor * a.interval:g}s, {a.submitters} submitters merging {a.params:,}-param "
          f"results; {a.reps} repetition(s), each in a fresh coordinator")
    print(f"{'rep':>4}{'requests':>9}{'failed':>7}{'p50 ms':>9}{'p99 ms':>9}{'beat p99':>10}{'merges':>8}"
          f"{'merges/s':>10}{'expired':>9}{'bytes/worker':>14}", flush=True)
    per_rep = []
    for rep in range(a.reps):
        r = load(a.workers, a.interval, a.rounds, a.connections, a.submitters, a.params, a.timeout_factor)
        print(f"{rep + 1:>4}{r['requests']:>9}{r['failed']:>7}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['heartbeat_p99_ms']:>10.2f}{r['merges']:>8}{r['merges_per_s']:>10.1f}"
              f"{r['leases_expired']:>9}{r['bytes_per_worker']:>14.0f}", flush=True)
        if r["errors"] or r["submit_errors"]:
            print(f"      errors: {r['errors']} submitters: {r['submit_errors']}")
        per_rep.append(r)
    figures = summarise(per_rep)
    print(f"over {a.reps} repetition(s): median (min-max); failed and expired summed")
    for k in HEADLINE:
        if k in COUNTS:
            print(f"  {k:<20}{figures[k]} (per repetition: {', '.join(map(str, figures[f'{k}_per_rep']))})")
        elif figures[f"{k}_spread"] is not None:
            print(f"  {k:<20}{show([r[k] for r in per_rep], 3)}")
    for k, why in (figures.get("reasons") or {}).items():
        print(f"  {k:<20}{why}")
    if a.json:
        print(json.dumps(finite(figures)))
    return 0


if __name__ == "__main__":
    exit_with(main, "bench.load")
