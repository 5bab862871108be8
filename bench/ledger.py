"""Ledger snapshots of long runs (``python -m bench.ledger [--quick] [--json]``).

A coordinator captures its ledger between two merges, every ``snapshot_every`` results (default
100), on its event loop: heartbeats wait while it runs. Its writer thread then packs it
(``pack_tree``), and a restart reads it back (``unpack_tree`` + ``Ledger.restore``). A ledger
holds every unit of the run and every lease granted, so all three grow with the run.

For each size (10,000, 100,000 and 300,000 units; ``--quick``: 10,000 and 50,000) this builds a
real :class:`~vcasync.ledger.Ledger` as a run that far along leaves it: 1,000 workers, every unit
leased once and its result recorded, and one lease still open per worker. Then, ``--reps`` times
each, interleaved:

- **capture**: ``Ledger.snapshot()``, the event-loop stall (format 2: columns);
- **pack** / **read**: ``pack_tree`` of it, and ``unpack_tree`` + ``Ledger.restore`` of the bytes;
- references in the same run: ``msgpack.packb`` of the same columns (the library alone, the floor
  for these values), and the same ledger in the row format coordinators wrote before (format 1: a
  list a unit and a lease; converted from the columns here, so it holds the same values) packed
  and read the same way.

Figures (``--json``, last line), per size ``<n>`` (units, e.g. ``100k``), each a median with its
``[min, median, max]`` spread under ``_spread``: ``capture_ms_<n>`` (milliseconds: the stall
itself, for scale), ``capture_vs_msgpack_<n>`` (capture / msgpack's packing of the result: below
1 the loop spends less than one C serialisation of it), ``pack_vs_msgpack_<n>``,
``pack_vs_rows_<n>`` and ``read_vs_rows_<n>`` (time against the row format: below 1 is faster),
``bytes_per_unit_<n>`` and ``bytes_vs_rows_<n>``, and ``memory_per_unit_<n>``: the Python memory
the ledger holds (``tracemalloc``, after a full collection) per unit, with its lease and receipt
and its share of the workers' records, what a coordinator's memory grows by per unit of a run (a
byte count, the same every repetition: no spread).

Failures: an iteration that raised (capture, pack or read) is counted in ``failed`` (``failed_<n>``
per size, ``failures_<n>`` its first error) and enters every figure of that iteration as an
infinite time and size (a ratio against it 0, of it null in the JSON), never dropped.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack

from vcasync.ledger import Ledger, WorkUnit
from vcasync.ledger._columns import LEASE_FIELDS, WORKER_FIELDS
from vcasync.wire import Limits, pack_tree, unpack_tree

from ._stats import add_quick, distinct, finite, parse_args, positive_int, show, spread

WORKERS = 1000


def build(n: int) -> Ledger:
    """A ledger of ``n`` units after a run's worth of results: all but one per worker done."""
    units = [WorkUnit(f"e{i // 1000}-s{i % 1000}", i % 1000, 1000, i // 1000, 40) for i in range(n)]
    now = [0.0]
    led = Ledger(units, clock=lambda: now[0])
    workers = [led.join(f"w{i}", {"host": f"10.0.{i // 256}.{i % 256}"}) for i in range(WORKERS)]
    for i in range(n - WORKERS):
        w = workers[i % WORKERS]
        g = led.lease(w, i // 100)
        led.record(g.lease_id, unit_id=g.unit.unit_id, worker_id=w, status="accepted",
                   version=i + 1, steps_done=40, base_version=g.base_version)
        now[0] += 0.001
    for w in workers:
        led.lease(w, n // 100)
    return led


def as_rows(snap: dict[str, Any]) -> dict[str, Any]:
    """The same snapshot in format 1 (rows), as coordinators wrote it before columns."""
    u = snap["units"]
    params = dict(zip(*u["params"], strict=True))
    failed = dict(zip(*u["failed_by"], strict=True))
    units = [[{"unit_id": uid, "shard": sh, "num_shards": ns, "epoch": ep, "steps": st,
               "params": params.get(i, {})}, state, att, iss, lid, reason, done_by,
              failed.get(i, []), last]
             for i, (uid, sh, ns, ep, st, state, att, iss, lid, reason, done_by, last) in enumerate(
                 zip(u["unit_id"], u["shard"], u["num_shards"], u["epoch"], u["steps"], u["state"],
                     u["attempts"], u["issued"], u["lease_id"], u["reason"], u["done_by"],
                     u["last_failure"], strict=True))]
    leases = [[lid, uid, wid, base, rem, steps, state,
               None if status is None else {"lease_id": lid, "unit_id": uid, "status": status,
                                            "version": version, "reason": reason}]
              for lid, uid, wid, base, rem, steps, state, status, version, reason in zip(
                  *(snap["leases"][k] for k in LEASE_FIELDS), strict=True)]
    w = snap["workers"]
    workers = [list(row) for row in zip(*(w[k] for k in WORKER_FIELDS), strict=True)]
    return {**snap, "format": 1, "units": units, "leases": leases, "workers": workers}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def read(data: bytes) -> Ledger:
    tree = unpack_tree(data, limits=Limits().for_stored_state(len(data)))
    return Ledger.restore(tree, clock=time.monotonic)


def one_rep(led: Ledger, out: dict[str, list[float]]) -> None:
    t, snap = timed(led.snapshot)
    out["capture"].append(t)
    out["msgpack"].append(timed(partial(msgpack.packb, snap, use_bin_type=True))[0])
    t, data = timed(partial(pack_tree, snap))
    out["pack"].append(t)
    out["read"].append(timed(partial(read, data))[0])
    t, rows_data = timed(partial(pack_tree, as_rows(snap)))
    out["rows_pack"].append(t)
    out["rows_read"].append(timed(partial(read, rows_data))[0])
    out["bytes"].append(len(data))
    out["rows_bytes"].append(len(rows_data))


def build_measured(n: int) -> tuple[Ledger, int]:
    """:func:`build`, and the bytes of Python memory the ledger holds once built (``tracemalloc``:
    what is still allocated after the build, less what was before it, after a full collection)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        led = build(n)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return led, held


def measure(n: int, reps: int, failures: list[str] | None = None) -> dict[str, list[float]]:
    """``reps`` iterations on a ledger of ``n`` units; one that raised is appended to ``failures``
    and enters as infinite everywhere (counted, never dropped). ``memory``: one value, the bytes
    the ledger holds (:func:`build_measured`)."""
    led, held = build_measured(n)
    keys = ("capture", "msgpack", "pack", "read", "rows_pack", "rows_read", "bytes", "rows_bytes")
    out: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(reps):
        gc.collect()
        one: dict[str, list[float]] = {k: [] for k in keys}
        try:
            one_rep(led, one)
        except Exception as exc:  # any failure of an iteration: counted, its figures infinite
            if failures is not None:
                failures.append(f"{type(exc).__name__}: {exc}")
            one = {k: [math.inf] for k in keys}
        for k in keys:
            out[k] += one[k]
    out["memory"] = [float(held)]
    return out


def label(n: int) -> str:
    return f"{n // 1000}k"


def ratios(num: list[float], den: list[float]) -> list[float]:
    """``num / den`` per iteration; a failed one (infinite) is infinite on top, 0 below."""
    return [math.inf if math.isinf(a) else a / b for a, b in zip(num, den, strict=True)]


QUICK: dict[str, Any] = {"sizes": [10_000, 50_000], "reps": 3}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", type=positive_int, nargs="+", default=[10_000, 100_000, 300_000],
                   help="units per ledger (default 10000 100000 300000)")
    p.add_argument("--reps", type=positive_int, default=5)
    add_quick(p, QUICK, "10,000 and 50,000 units, 3 reps")
    p.add_argument("--json", action="store_true")
    a = parse_args(p, argv)
    distinct(p, "--sizes", a.sizes)
    if any(n <= WORKERS for n in a.sizes):
        p.error(f"--sizes: every size must exceed the {WORKERS} workers, got {a.sizes}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    sizes, reps = a.sizes, a.reps
    figures: dict[str, Any] = {"workers": WORKERS, "reps": reps, "snapshot_format": 2, "failed": 0}
    print(f"ledger snapshots: {WORKERS} workers, every unit but one a worker done, {reps} reps "
          "(median, min-max)")
    heads = ("capture ms", "vs msgpack", "pack vs msgpack", "pack vs rows", "read vs rows",
             "bytes/unit", "vs rows", "memory B/unit")
    print(f"{'units':>8}" + "".join(f"{h:>20}" for h in heads))
    for n in sizes:
        failures: list[str] = []
        m = measure(n, reps, failures)
        k = label(n)
        figures[f"failed_{k}"] = len(failures)
        figures["failed"] += len(failures)
        if failures:
            figures[f"failures_{k}"] = failures[0]
            print(f"{n:>8} units: {len(failures)} of {reps} iterations FAILED (first: {failures[0]})",
                  flush=True)
        cols = {
            f"capture_ms_{k}": [t * 1e3 for t in m["capture"]],
            f"capture_vs_msgpack_{k}": ratios(m["capture"], m["msgpack"]),
            f"pack_vs_msgpack_{k}": ratios(m["pack"], m["msgpack"]),
            f"pack_vs_rows_{k}": ratios(m["pack"], m["rows_pack"]),
            f"read_vs_rows_{k}": ratios(m["read"], m["rows_read"]),
            f"bytes_per_unit_{k}": [b / n for b in m["bytes"]],
            f"bytes_vs_rows_{k}": ratios(m["bytes"], m["rows_bytes"]),
        }
        for name, values in cols.items():
            figures[name] = round(statistics.median(values), 3)
            figures[f"{name}_spread"] = spread(values)
        figures[f"memory_per_unit_{k}"] = round(m["memory"][0] / n)
        # every column median (min-max): the ratios' spreads too, not the capture's alone
        digits = (1, 2, 2, 3, 3, 0, 2)
        print(f"{n:>8}" + "".join(f"{show(values, d):>20}" for values, d in zip(cols.values(), digits,
                                                                                strict=True))
              + f"{figures[f'memory_per_unit_{k}']:>20}", flush=True)
    if a.json:
        print(json.dumps(finite(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
