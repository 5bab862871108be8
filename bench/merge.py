"""Merge benchmark: every built-in policy merging one result into a 25M- and a 100M-parameter model.

Reference, measured in the same run on the same tensors: memcpy of the model (``copy_`` of every
tensor into a preallocated model). Peer: Flower's FedAvg ``aggregate`` (``flwr``, when importable)
averaging the model and the result as two weighted clients, on numpy views of the same tensors.

Mode: *warm*. Each policy is built, its state initialised and one full round merged before timing,
so state buffers and scratch are touched and reused, as in a long-running coordinator. Each timed
merge round is paired with a memcpy timed right before it, and a ratio is the median of the
per-pair ratios over ``--repeats`` pairs, so a machine whose load drifts cannot skew it. Buffered
policies (fedbuff, median, trimmed_mean, sync) are timed over a whole round of ``K`` results and
reported per result (the flush included); ``gate`` wraps vcasgd. ``<policy>_vs_memcpy`` is merge
time / memcpy time (lower is better). Deltas arrive with their base (the worker's usual case);
``*_weights`` rows send full weights instead.

The traffic floor. A merge must read and write a known number of model-sized streams; a memcpy
moves two (it reads one, writes one), so a policy's floor is ``memcpy time x streams / 2`` and
``<policy>_vs_floor`` is merge time / floor (1.0: the merge runs at memory speed; the target for
mixing policies is <= 1.2). The streams per merged result, as :data:`STREAMS` states them:

| case | reads | writes | streams |
|---|---|---|---|
| vcasgd, fedasync (delta) | model, base, delta | model | 4 |
| vcasgd, fedasync (weights) | model, weights | model | 3 |
| fedbuff (K=4) | buffer, delta; flush/K: model, buffer | buffer; flush/K: model, buffer | 3 + 4/K = 4 |
| diloco (delta or weights) | model, momentum, result | model, momentum | 5 |
| median, trimmed_mean (K=3) | delta; flush/K: K slots, model | slot; flush/K: model | 2 + (K+2)/K |
| gate (vcasgd inside) | delta, reference (measure); model, base, delta, reference | model, reference | 8 |
| sync (K=4) | mean, delta; flush/K: model, mean | mean; flush/K: model, mean | 3 + 4/K = 4 |

The floor is a model, and a loose one for in-place kernels: a memcpy into another buffer also
reads its destination (the cache's read-for-ownership), so it moves three streams' worth of traffic
for the two the table counts, while a kernel that updates a tensor in place (``a.add_(b)``: read
a and b, write a, whose lines are already cached) moves exactly what it counts. The row
``inplace_add`` measures that ideal kernel on the same tensors (3 streams by the table): its
``inplace_add_vs_floor`` (0.53-0.57 here, not 1.0) is how far below 1.0 a policy made only of
in-place passes can go, which is why fedbuff and sync (a running buffer updated in place) read below
1.0. A policy's figure over ``inplace_add_vs_floor`` is its distance from that kernel.

The coordinator checks every merged model for non-finite values (one read of it, on every merge,
outside the policy's own time above): ``finite_check_vs_memcpy`` is that pass over the memcpy of the
same tensors (one stream of the memcpy's two).

Every figure is the median of ``--repeats`` paired ratios; ``<figure>_spread`` (per size
``<figure>_spread_<size>``) holds their [min, median, max] (``mixing_max_vs_floor_spread``: that of
the mixing policy the maximum is, ``mixing_max_policy``). A repetition that fails (the merge
raised, a refused result among them; warm-ups too) or a case whose model ends with a non-finite
value is counted in ``failed`` (per case in ``failed_<case>_<size>``, the first error in
``failures``); a failed repetition is an infinite time and ratio in its figure (null in the JSON),
never left out.

    python -m bench.merge                 # 25M and 100M params
    python -m bench.merge --quick         # 5M and 25M params, fewer repeats
    python -m bench.merge --json          # ... and one JSON object on the last line
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench._stats import show, spread
from vcasync.coordinator._model_owner import first_non_finite
from vcasync.policy import MergePolicy, build_policy
from vcasync.tensors import ModelState, Update, UpdateKind

from ._stats import add_quick, finite, parse_args, positive_int, positive_ints

BLOCK = 4_000_000  # elements per weight tensor; each block also has a bias of 1,024 elements



@dataclass(frozen=True)
class Case:
    """One row: a policy, its parameters, the kind of result it gets, results per timed round."""

    label: str
    policy: str
    params: dict[str, Any]
    kind: UpdateKind = "delta"
    round_size: int = 1


CASES: list[Case] = [
    Case("vcasgd", "vcasgd", {"alpha": 0.5}),
    Case("vcasgd_weights", "vcasgd", {"alpha": 0.5}, "weights"),
    Case("fedasync", "fedasync", {}),
    Case("fedasync_weights", "fedasync", {}, "weights"),
    Case("fedbuff", "fedbuff", {"buffer_size": 4}, round_size=4),
    Case("diloco", "diloco", {}),
    Case("diloco_weights", "diloco", {}, "weights"),
    Case("median", "median", {"buffer_size": 3}, round_size=3),
    Case("trimmed_mean", "trimmed_mean", {"buffer_size": 3, "beta": 0.34}, round_size=3),
    Case("gate", "gate", {"inner": "vcasgd", "warmup": 1000}),
    Case("sync", "sync", {"buffer_size": 4}, round_size=4),
]
BUILTINS = ["vcasgd", "fedasync", "fedbuff", "diloco", "median", "trimmed_mean", "gate", "sync"]
#: Mixing policies: linear updates that can run at memory speed (robust ones sort, gate measures).
MIXING = ["vcasgd", "fedasync", "fedbuff", "diloco", "sync"]


def streams(case: Case) -> float:
    """Model-sized streams one merged result reads and writes (the table in the module doc)."""
    k = case.round_size
    flush = {"fedbuff": 4.0, "sync": 4.0, "median": k + 2.0, "trimmed_mean": k + 2.0}
    per_result = {"vcasgd": 4.0 if case.kind == "delta" else 3.0,
                  "fedasync": 4.0 if case.kind == "delta" else 3.0,
                  "fedbuff": 3.0, "sync": 3.0, "diloco": 5.0, "gate": 8.0,
                  "median": 2.0 if case.kind == "delta" else 3.0,
                  "trimmed_mean": 2.0 if case.kind == "delta" else 3.0}
    return per_result[case.policy] + flush.get(case.policy, 0.0) / k


def make_model(params: int, value: float) -> ModelState:
    """``params`` float32 parameters in 4M-element weights with small biases, plus a counter."""
    tensors: dict[str, torch.Tensor] = {}
    left, i = params, 0
    gen = torch.Generator().manual_seed(0)
    while left > 0:
        n = min(BLOCK, left)
        tensors[f"layer{i}.weight"] = torch.empty(n).uniform_(-value, value, generator=gen)
        b = min(1024, max(left - n, 0))
        if b:
            tensors[f"layer{i}.bias"] = torch.empty(b).uniform_(-value, value, generator=gen)
        left -= n + b
        i += 1
    tensors["bn.num_batches_tracked"] = torch.tensor(1)
    return ModelState(tensors)


#: The clock: ``thread_time`` (CPU seconds of this thread; torch runs single-threaded ops in the
#: calling thread) unless ``--clock wall``. On a machine shared with other jobs, wall time also
#: counts the time this process waited for a core; CPU time does not (the cache is still shared).
CLOCK: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCK["cpu"]


def paired(fn: Callable[[], object], copy: Callable[[], object], repeats: int,
           failures: list[str] | None = None) -> tuple[float, float, list[float]]:
    """``(median seconds of fn, median seconds of copy, every per-pair ratio)``; a call of ``fn``
    that raises (the warm-up too) is appended to ``failures`` and its repetition is an infinite
    time and ratio."""
    failed = failures if failures is not None else []

    def attempt() -> bool:
        try:
            fn()
        except Exception as exc:   # counted, the run goes on
            failed.append(f"{type(exc).__name__}: {exc}")
            return False
        return True

    attempt()  # warm-up
    copy()
    ts, cs, ratios = [], [], []
    for _ in range(repeats):
        start = clock()
        copy()
        mid = clock()
        ok = attempt()
        end = clock()
        cs.append(mid - start)
        ts.append(end - mid if ok else math.inf)
        ratios.append(ts[-1] / (mid - start))
    return statistics.median(ts), statistics.median(cs), ratios


def memcpy_fn(model: ModelState) -> Callable[[], None]:
    """The reference: ``copy_`` of every tensor of the model into a preallocated model."""
    dst = {n: torch.empty_like(t) for n, t in model.items()}

    def copy() -> None:
        for n, t in model.items():
            dst[n].copy_(t)

    return copy


def inplace_add_fn(model: ModelState) -> Callable[[], None]:
    """The ideal in-place kernel (3 streams by the table): ``a.add_(model)`` into a copy of the
    model's floating tensors, so the model itself is left as it is."""
    scratch = {n: t.clone() for n, t in model.items() if t.is_floating_point()}

    def add() -> None:
        for n, t in scratch.items():
            t.add_(model[n])

    return add


def time_policy(case: Case, model: ModelState, base: ModelState, result: dict[str, torch.Tensor],
                copy: Callable[[], None], repeats: int,
                failures: list[str] | None = None) -> tuple[float, list[float]]:
    """``(median seconds per merged result, ratios to memcpy)``, warm (see the module docstring);
    failed repetitions (a merge raised, the gate refusing a result among them) are appended to
    ``failures``, and a model left with a non-finite value counts as one more."""
    failed = failures if failures is not None else []
    policy: MergePolicy = build_policy(case.policy, case.params)
    state = policy.init_state(model)
    update = Update(result, kind=case.kind, base=base if policy.needs_base else None, samples=10)

    def one_round() -> None:
        for _ in range(case.round_size):
            policy.merge(model, update, state)

    seconds, _, ratios = paired(one_round, copy, repeats, failed)
    bad = [n for n, t in model.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        failed.append(f"non-finite values in {bad[:3]} after the merges")
    return seconds / case.round_size, [r / case.round_size for r in ratios]


def time_flower(model: ModelState, result: dict[str, torch.Tensor], copy: Callable[[], None],
                repeats: int, failures: list[str] | None = None) -> tuple[float, list[float]] | None:
    """Flower's FedAvg ``aggregate`` of the model and the result as two clients, or None."""
    try:
        from flwr.server.strategy.aggregate import aggregate
    except ImportError:
        return None
    arrays_w = [t.numpy() for t in model.values() if t.is_floating_point()]
    arrays_r = [t.numpy() for n, t in result.items() if t.is_floating_point()]
    seconds, _, ratios = paired(lambda: aggregate([(arrays_w, 10), (arrays_r, 10)]), copy, repeats, failures)
    return seconds, ratios


def run(sizes: list[int], repeats: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    failures: dict[str, list[str]] = {}
    rows: list[tuple[str, int, float, list[float], float]] = []
    for size in sizes:
        model = make_model(size, 1.0)
        base = model.clone()
        delta = {n: (t * 1e-3 if t.is_floating_point() else t + 3) for n, t in base.items()}
        weights = {n: (t + d if t.is_floating_point() else d) for (n, t), d in
                   zip(base.items(), delta.values(), strict=True)}
        copy = memcpy_fn(model)
        _, memcpy, _ = paired(copy, copy, repeats)
        rows.append(("memcpy", size, memcpy, [1.0], 2.0))
        tag = f"{size // 1_000_000}m"
        figures[f"memcpy_ms_{tag}"] = round(memcpy * 1e3, 3)
        _, _, ratios = paired(inplace_add_fn(model), copy, repeats,
                              failures.setdefault(f"inplace_add_{tag}", []))
        rows.append(("inplace_add", size, statistics.median(ratios) * memcpy, ratios, 3.0))
        figures[f"inplace_add_vs_floor_{tag}"] = spread([r * 2.0 / 3.0 for r in ratios])[1]
        figures[f"inplace_add_vs_floor_spread_{tag}"] = spread([r * 2.0 / 3.0 for r in ratios])
        _, _, ratios = paired(functools.partial(first_non_finite, model.tensors), copy, repeats,
                              failures.setdefault(f"finite_check_{tag}", []))
        figures[f"finite_check_vs_memcpy_{tag}"] = spread(ratios)[1]
        figures[f"finite_check_vs_memcpy_spread_{tag}"] = spread(ratios)
        gc.collect()
        for case in CASES:
            failed = failures.setdefault(f"{case.label}_{tag}", [])
            seconds, ratios = time_policy(case, model, base,
                                          weights if case.kind == "weights" else delta, copy, repeats,
                                          failed)
            figures[f"failed_{case.label}_{tag}"] = len(failed)
            n = streams(case)
            rows.append((case.label, size, seconds, ratios, n))
            floor = [r * 2.0 / n for r in ratios]
            figures[f"{case.label}_vs_memcpy_{tag}"] = spread(ratios)[1]
            figures[f"{case.label}_vs_memcpy_spread_{tag}"] = spread(ratios)
            figures[f"{case.label}_vs_floor_{tag}"] = spread(floor)[1]
            figures[f"{case.label}_vs_floor_spread_{tag}"] = spread(floor)
            figures[f"{case.label}_streams"] = round(n, 3)
        flower = time_flower(model, weights, copy, repeats, failures.setdefault(f"flower_fedavg_{tag}", []))
        if flower is not None:
            rows.append(("flower_fedavg", size, flower[0], flower[1], 3.0))
            figures[f"flower_fedavg_vs_memcpy_{tag}"] = spread(flower[1])[1]
            figures[f"flower_fedavg_vs_memcpy_spread_{tag}"] = spread(flower[1])
        del model, base, delta, weights, copy
        gc.collect()
    _print_table(rows, sizes)
    top = f"{max(sizes) // 1_000_000}m"
    head: dict[str, Any] = {}
    for c in CASES:
        head[f"{c.label}_vs_floor"] = figures[f"{c.label}_vs_floor_{top}"]
        head[f"{c.label}_vs_floor_spread"] = figures[f"{c.label}_vs_floor_spread_{top}"]
    for c in CASES:
        head[f"{c.label}_vs_memcpy"] = figures[f"{c.label}_vs_memcpy_{top}"]
        head[f"{c.label}_vs_memcpy_spread"] = figures[f"{c.label}_vs_memcpy_spread_{top}"]
    if f"flower_fedavg_vs_memcpy_{top}" in figures:
        head["flower_fedavg_vs_memcpy"] = figures[f"flower_fedavg_vs_memcpy_{top}"]
        head["flower_fedavg_vs_memcpy_spread"] = figures[f"flower_fedavg_vs_memcpy_spread_{top}"]
    missing = [b for b in BUILTINS if f"{b}_vs_floor" not in head]
    assert not missing, missing
    worst = max(MIXING, key=lambda b: head[f"{b}_vs_floor"])
    head["mixing_max_vs_floor"] = head[f"{worst}_vs_floor"]
    head["mixing_max_vs_floor_spread"] = head[f"{worst}_vs_floor_spread"]   # that policy's
    head["mixing_max_policy"] = worst
    for name in ("inplace_add_vs_floor", "finite_check_vs_memcpy"):
        head[name] = figures[f"{name}_{top}"]
        head[f"{name}_spread"] = figures[f"{name}_spread_{top}"]
    head["failed"] = sum(len(f) for f in failures.values())
    head["failures"] = {k: {"count": len(f), "first": f[0]} for k, f in failures.items() if f}
    for k, what in head["failures"].items():
        print(f"FAILED {k}: {what['count']} repetition(s), first: {what['first']}")
    return {**head, **figures, "mode": "warm", "sizes": sizes, "repeats": repeats,
            "threads": torch.get_num_threads(), "flower": "flower_fedavg_vs_memcpy" in head,
            "config": "defaults of each policy except: vcasgd alpha 0.5, buffer sizes as in CASES"}


def _print_table(rows: list[tuple[str, int, float, list[float], float]], sizes: list[int]) -> None:
    labels = list(dict.fromkeys(r[0] for r in rows))
    by = {(r[0], r[1]): r for r in rows}
    header = f"{'policy (warm, per result)':<26}{'streams':>8}" + "".join(
        f"{f'{s // 1_000_000}M ms':>10}  {'x floor (min-max)':<24}" for s in sizes)
    print(header)
    print("-" * len(header))
    for label in labels:
        first = next(by[(label, s)] for s in sizes if (label, s) in by)
        line = f"{label:<26}{first[4]:>8.2f}"
        for s in sizes:
            r = by.get((label, s))
            cell = show([x * 2.0 / r[4] for x in r[3]]) if r else "-"
            line += f"{r[2] * 1e3:>10.1f}  {cell:<24}" if r else f"{'-':>10}  {cell:<24}"
        print(line)


QUICK: dict[str, Any] = {"sizes": "5,25", "repeats": 3}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=positive_ints, default="25,100",
                        help="comma-separated model sizes in whole millions of parameters (default 25,100)")
    add_quick(parser, QUICK, "5M and 25M parameters, 3 repeats")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch threads (default 1: a shared machine's second core is not ours)")
    parser.add_argument("--clock", choices=sorted(CLOCK), default="cpu",
                        help="cpu: this thread's CPU time (default; needs --threads 1), wall: elapsed")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parse_args(parser, argv)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: use --threads 1 or --clock wall")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    sizes = [int(s) * 1_000_000 for s in args.sizes.split(",")]
    repeats = args.repeats
    figures = run(sizes, repeats)
    figures["clock"] = args.clock
    if args.json:
        print(json.dumps(finite(figures)))


if __name__ == "__main__":
    main()
