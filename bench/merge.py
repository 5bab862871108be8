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
time / memcpy time (lower is better; the target for mixing policies is <= 2). Deltas arrive with
their base (the worker's usual case); ``*_weights`` rows send full weights instead.

    python -m bench.merge                 # 25M and 100M params
    python -m bench.merge --quick         # 5M and 25M params, fewer repeats
    python -m bench.merge --json          # ... and one JSON object on the last line
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vcasync.errors import UpdateRejectedError
from vcasync.policy import MergePolicy, build_policy
from vcasync.tensors import ModelState, Update, UpdateKind

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


def paired(fn: Callable[[], object], copy: Callable[[], object],
           repeats: int) -> tuple[float, float, float]:
    """``(median seconds of fn, median seconds of copy, median of the per-pair ratios)``."""
    fn()  # warm-up
    copy()
    ts, cs, ratios = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        copy()
        mid = time.perf_counter()
        fn()
        end = time.perf_counter()
        cs.append(mid - start)
        ts.append(end - mid)
        ratios.append((end - mid) / (mid - start))
    return statistics.median(ts), statistics.median(cs), statistics.median(ratios)


def memcpy_fn(model: ModelState) -> Callable[[], None]:
    """The reference: ``copy_`` of every tensor of the model into a preallocated model."""
    dst = {n: torch.empty_like(t) for n, t in model.items()}

    def copy() -> None:
        for n, t in model.items():
            dst[n].copy_(t)

    return copy


def time_policy(case: Case, model: ModelState, base: ModelState, result: dict[str, torch.Tensor],
                copy: Callable[[], None], repeats: int) -> tuple[float, float]:
    """``(median seconds per merged result, ratio to memcpy)``, warm (see the module docstring)."""
    policy: MergePolicy = build_policy(case.policy, case.params)
    state = policy.init_state(model)
    update = Update(result, kind=case.kind, base=base if policy.needs_base else None, samples=10)

    def one_round() -> None:
        for _ in range(case.round_size):
            try:
                policy.merge(model, update, state)
            except UpdateRejectedError:  # pragma: no cover - the gate never rejects here
                raise SystemExit("the gate refused a benchmark result") from None

    one_round()
    seconds, _, ratio = paired(one_round, copy, repeats)
    return seconds / case.round_size, ratio / case.round_size


def time_flower(model: ModelState, result: dict[str, torch.Tensor], copy: Callable[[], None],
                repeats: int) -> tuple[float, float] | None:
    """Flower's FedAvg ``aggregate`` of the model and the result as two clients, or None."""
    try:
        from flwr.server.strategy.aggregate import aggregate
    except ImportError:
        return None
    arrays_w = [t.numpy() for t in model.values() if t.is_floating_point()]
    arrays_r = [t.numpy() for n, t in result.items() if t.is_floating_point()]
    seconds, _, ratio = paired(lambda: aggregate([(arrays_w, 10), (arrays_r, 10)]), copy, repeats)
    return seconds, ratio


def run(sizes: list[int], repeats: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    rows: list[tuple[str, int, float, float]] = []
    for size in sizes:
        model = make_model(size, 1.0)
        base = model.clone()
        delta = {n: (t * 1e-3 if t.is_floating_point() else t + 3) for n, t in base.items()}
        weights = {n: (t + d if t.is_floating_point() else d) for (n, t), d in
                   zip(base.items(), delta.values(), strict=True)}
        copy = memcpy_fn(model)
        _, memcpy, _ = paired(copy, copy, repeats)
        rows.append(("memcpy", size, memcpy, 1.0))
        tag = f"{size // 1_000_000}m"
        figures[f"memcpy_ms_{tag}"] = round(memcpy * 1e3, 3)
        for case in CASES:
            seconds, ratio = time_policy(case, model, base,
                                         weights if case.kind == "weights" else delta, copy, repeats)
            rows.append((case.label, size, seconds, ratio))
            figures[f"{case.label}_vs_memcpy_{tag}"] = round(ratio, 3)
        flower = time_flower(model, weights, copy, repeats)
        if flower is not None:
            rows.append(("flower_fedavg", size, *flower))
            figures[f"flower_fedavg_vs_memcpy_{tag}"] = round(flower[1], 3)
        del model, base, delta, weights, copy
        gc.collect()
    _print_table(rows, sizes)
    top = f"{max(sizes) // 1_000_000}m"
    head = {f"{c.label}_vs_memcpy": figures[f"{c.label}_vs_memcpy_{top}"] for c in CASES}
    if f"flower_fedavg_vs_memcpy_{top}" in figures:
        head["flower_fedavg_vs_memcpy"] = figures[f"flower_fedavg_vs_memcpy_{top}"]
    missing = [b for b in BUILTINS if f"{b}_vs_memcpy" not in head]
    assert not missing, missing
    return {**head, **figures, "mode": "warm", "sizes": sizes, "repeats": repeats,
            "threads": torch.get_num_threads(), "flower": "flower_fedavg_vs_memcpy" in head}


def _print_table(rows: list[tuple[str, int, float, float]], sizes: list[int]) -> None:
    labels = list(dict.fromkeys(r[0] for r in rows))
    by = {(r[0], r[1]): r for r in rows}
    header = f"{'policy (warm, per result)':<26}" + "".join(
        f"{f'{s // 1_000_000}M ms':>12}{'x memcpy':>10}" for s in sizes)
    print(header)
    print("-" * len(header))
    for label in labels:
        line = f"{label:<26}"
        for s in sizes:
            r = by.get((label, s))
            line += f"{r[2] * 1e3:>12.1f}{r[3]:>10.2f}" if r else f"{'-':>12}{'-':>10}"
        print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None,
                        help="comma-separated model sizes in millions of parameters (default 25,100)")
    parser.add_argument("--quick", action="store_true", help="5M and 25M parameters, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    sizes_text = args.sizes or ("5,25" if args.quick else "25,100")
    sizes = [int(float(s) * 1_000_000) for s in sizes_text.split(",")]
    repeats = args.repeats or (3 if args.quick else 5)
    figures = run(sizes, repeats)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
