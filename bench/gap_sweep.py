"""What closes the fleet's gap to DDP: more epochs, another alpha (simulated, marked as such).

``python -m bench.gap_sweep [--workloads mnist5000 tinylm digits] [--seeds 0 1] [--json]``

The real runs of ``bench.convergence`` on mnist5000 and tinylm end with the fleet short of DDP's
final quality at the same samples (docs/headline-notebook.md). This measures, on the same model, data,
optimiser and run shape as those real runs (4 workers, 2 shards a worker, the workload's batch size
and steps per unit, preemptions at 30 %/h of a 5-hour job), how that gap moves with the number of
epochs and with VC-ASGD's ``alpha`` (the weight kept on the server's copy: lower lets each result
move the model further). Training is real (the simulator runs the workload's own trainer); only time
is virtual, so the gaps are what the optimisation gives, not a model of it.

Rates: the same learning-rate search as the real runs (``bench.convergence.search_lr``: 3 rates a
side, validation split, one run each), once per workload and epoch count at the default alpha, so
both sides get the same budget; the fleet's rate is then kept across alphas. The gap is DDP's final
test quality minus the fleet's (points of accuracy, or the relative loss excess), per seed, with the
mean and a 95 % interval; a cell "reaches" when the fleet came within the tolerance the headline uses
(0.5 point, 1 % of loss) at any evaluation, and ``samples_ratio`` is the samples the fleet had
merged when it first did, over the samples DDP had used when it first did (above 1: the fleet
learns less per sample, which costs time on any machine). ``--workloads digits`` asks that of
the default real run's shape, where the final gap is nil but the fleet reaches the target later.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

from vcasync.costing.spread import spread
from vcasync.costing.target import Target
from vcasync.errors import ConfigError
from vcasync.examples.workloads import get_workload
from vcasync.policy import available_policies, build_policy
from vcasync.sim import Simulation

from ._stats import add_quick, distinct, distinct_seeds, parse_args, positive_int, seed_arg, vcasgd_alpha
from .convergence import REAL_SHAPE, Rates, preempted_fleet, search_lr

#: Epochs and alphas per workload: the default budget (3 and 2 were the real runs' epochs when the
#: sweep was made; mnist5000's real runs train 12 since).
GRID: dict[str, dict[str, tuple[Any, ...]]] = {
    "mnist5000": {"epochs": (3, 6, 12), "alpha": (0.25, 0.5, 0.75)},
    "tinylm": {"epochs": (2, 4), "alpha": (0.25, 0.5)},
    # digits: the default real run's shape (20 epochs); here the question is when, in samples, the
    # fleet reaches DDP's target (its final quality is DDP's), so it is evaluated 20 times a run
    "digits": {"epochs": (20,), "alpha": (0.25, 0.5, 0.75), "eval_points": (20,)},
}
WORKERS = 4
RATE = 0.3     # preemptions per worker-hour
HOURS = 5.0    # the job the real runs stand for


def cell(workload: str, epochs: int, alpha: float | None, seed: int, *, lr: float, sync_lr: float,
         steps: int | None, sync: bool, policy: str = "vcasgd",
         params: dict[str, Any] | None = None, eval_points: int = 8) -> dict[str, Any]:
    """One simulated run of the real runs' shape; DDP's arithmetic beside it when ``sync``.
    ``alpha`` is VC-ASGD's; another ``policy`` runs with ``params`` over its defaults (``alpha`` None)."""
    work = get_workload(workload)
    params = dict(params or {}) if alpha is None else {**(params or {}), "alpha": alpha}
    cfg = preempted_fleet(workload, WORKERS, RATE, seed, epochs=epochs, hours=HOURS, identical=True,
                          policy=(policy, params), rates=Rates(lr, sync_lr), shards=2 * WORKERS,
                          local_steps=steps, batch_size=work.batch_size, eval_points=eval_points,
                          sync_baseline=sync)
    out = Simulation(cfg).run()
    pick = (lambda e: e.accuracy) if work.metric == "accuracy" else (lambda e: e.loss)
    return {"fleet": [pick(e) for e in out.rec.evals],
            "fleet_samples": [e.samples_merged for e in out.rec.evals],
            "sync": None if out.sync is None else pick(out.sync.evals[-1]),
            "sync_curve": None if out.sync is None else [(e.samples_merged, pick(e)) for e in out.sync.evals]}


def samples_to(target: Target, curve: list[tuple[int, float]]) -> int | None:
    """Samples at the first ``(samples, value)`` point that reaches ``target``."""
    return next((n for n, v in curve if target.reached(v)), None)


def gap(metric: str, fleet: float, ddp: float) -> float:
    """Points of accuracy below DDP, or the fleet's relative loss excess (positive: behind)."""
    return 100 * (ddp - fleet) if metric == "accuracy" else (fleet - ddp) / ddp


def sweep(workload: str, seeds: list[int], grid: dict[str, tuple[Any, ...]], *, policy: str = "vcasgd",
          params: dict[str, Any] | None = None, steps: int | None = None,
          log: Any = sys.stderr) -> dict[str, Any]:
    work = get_workload(workload)
    steps = steps if steps is not None else REAL_SHAPE[workload]["steps"]
    cells: list[dict[str, Any]] = []
    searches: dict[int, dict[str, Any]] = {}
    for epochs in grid["epochs"]:
        t = time.perf_counter()
        sim_shape = {"shards": 2 * WORKERS, "local_steps": steps, "batch_size": work.batch_size,
                     "policy": policy, "policy_params": dict(params or {})}
        found = searches[epochs] = search_lr(workload, WORKERS, epochs, steps, shape=sim_shape)
        print(f"  {workload} {epochs} epochs: rates fleet {found['lr']:.4g}, DDP {found['sync_lr']:.4g} "
              f"({time.perf_counter() - t:.0f} s)", file=log)
        ddp: dict[int, float] = {}
        ddp_curve: dict[int, list[tuple[int, float]]] = {}
        for alpha in grid["alpha"] if policy == "vcasgd" else (None,):
            gaps: list[float | None] = []
            ratios: list[float | None] = []
            reached = 0
            for seed in seeds:
                r = cell(workload, epochs, alpha, seed, lr=found["lr"], sync_lr=found["sync_lr"],
                         steps=steps, sync=seed not in ddp, policy=policy, params=params,
                         eval_points=int(grid.get("eval_points", (8,))[0]))
                if r["sync"] is not None:
                    ddp[seed], ddp_curve[seed] = r["sync"], r["sync_curve"]
                ref = ddp[seed]
                final = r["fleet"][-1]
                ok = math.isfinite(final) and math.isfinite(ref)
                gaps.append(gap(work.metric, final, ref) if ok else None)
                target = Target.from_baseline(work.metric, ref) if math.isfinite(ref) else None
                n_fleet = None if target is None else samples_to(target, list(zip(r["fleet_samples"],
                                                                                  r["fleet"], strict=True)))
                n_ddp = None if target is None else samples_to(target, ddp_curve[seed])
                reached += int(n_fleet is not None)
                ratios.append(None if n_fleet is None or not n_ddp else n_fleet / n_ddp)
            # a seed without a gap (its fleet ended without a finite quality) is as far behind as
            # can be, one that never reached the target took more samples than any: both unbounded
            # above (as bench.convergence's gaps), never left out of the spread
            s, q = spread(gaps, miss="high", counted="measured"), spread(ratios, miss="high")
            cells.append({"epochs": epochs, "alpha": alpha, "gap": s.as_dict(), "reached": reached,
                          "seeds": len(seeds), "ddp_final": [ddp[x] for x in seeds],
                          "samples_ratio": q.as_dict()})
            print(f"  {workload} {epochs} epochs alpha {alpha}: gap {s.mean} "
                  f"({s.ci_low} .. {s.ci_high}), reached {reached}/{len(seeds)}, samples to target "
                  f"{q.mean} x DDP's ({q.ci_low} .. {q.ci_high})", file=log)
    unit = "points" if work.metric == "accuracy" else "relative loss"
    return {"workload": workload, "policy": policy, "params": dict(params or {}), "steps": steps,
            "metric": work.metric, "unit": unit, "cells": cells, "learning_rates": searches}


def seed_spread(summary: dict[str, Any]) -> list[float | None] | None:
    """``[min, median, max]`` over every seed of a ``vcasync.costing.spread`` summary: a seed
    without a value (``missing``) lies on its ``unbounded`` side, so an end it reaches is None
    (unbounded), never a range of the other seeds alone; None when no seed ran."""
    values = [float(v) for v in summary.get("values") or []]
    missing = int(summary.get("missing") or 0)
    side = summary.get("unbounded") or ("both" if missing else None)
    if not values and not missing:
        return None
    if missing and side not in ("low", "high"):
        return [None, None, None]      # neither end nor the middle is known
    full = values + [math.inf if side == "high" else -math.inf] * missing
    three = [min(full), statistics.median(full), max(full)]
    return [x if math.isfinite(x) else None for x in three]


def flat_figures(sweeps: list[dict[str, Any]]) -> dict[str, Any]:
    """One figure per cell, first in the JSON: ``gap_<workload>_<epochs>ep[_alpha<a>]`` (mean over
    seeds, in the sweep's unit), its ``_spread`` ([min, median, max] over every seed: one without a
    gap is unbounded above, :func:`seed_spread`), ``_reached`` (seeds within the tolerance / seeds)
    and ``samples_ratio_...`` with its ``_spread`` likewise (a seed that never reached the target:
    unbounded above)."""
    out: dict[str, Any] = {}
    for s in sweeps:
        for c in s["cells"]:
            tag = f"{s['workload']}_{c['epochs']}ep" + ("" if c["alpha"] is None else f"_alpha{c['alpha']:g}")
            out[f"gap_{tag}"] = c["gap"]["mean"]
            out[f"gap_{tag}_spread"] = seed_spread(c["gap"])
            out[f"gap_{tag}_reached"] = f"{c['reached']}/{c['seeds']}"
            out[f"samples_ratio_{tag}"] = c["samples_ratio"]["mean"]
            out[f"samples_ratio_{tag}_spread"] = seed_spread(c["samples_ratio"])
    return out


def parse_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as JSON (numbers, true/false), else kept as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"wants KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


QUICK: dict[str, Any] = {"seeds": [0]}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--workloads", nargs="+", choices=sorted(GRID), default=["mnist5000"])
    p.add_argument("--seeds", type=seed_arg, nargs="+", default=[0, 1])
    add_quick(p, QUICK, "one seed, the first two epoch counts, alpha 0.25 and 0.5")
    p.add_argument("--policy", default="vcasgd", choices=available_policies(),
                   help="merge policy (default vcasgd; another runs with its defaults, no alpha axis)")
    p.add_argument("--param", type=parse_param, action="append", default=[], metavar="KEY=VALUE",
                   help="a policy parameter over its defaults (repeatable), e.g. lr=0.3 buffer_size=4")
    p.add_argument("--epochs", type=positive_int, nargs="+", help="epoch grid (default: the workload's)")
    p.add_argument("--steps", type=positive_int, help="local steps per unit (default: the real runs')")
    p.add_argument("--alpha", type=vcasgd_alpha, nargs="+",
                   help="VC-ASGD alpha grid (default: the workload's)")
    p.add_argument("--json", action="store_true")
    a = parse_args(p, argv)
    distinct_seeds(p, a.seeds)
    for flag in ("--workloads", "--epochs", "--alpha"):
        distinct(p, flag, getattr(a, flag[2:]))
    # a flag the sweep would not use is refused, never ignored: --policy diloco --alpha 0.5 ran
    # diloco's defaults, and --param alpha=0.3 was replaced by the alpha grid in every cell
    distinct(p, "--param", [k for k, _ in a.param], "the last would replace the others")
    if a.alpha and a.policy != "vcasgd":
        p.error(f"--alpha is VC-ASGD's alpha grid: --policy {a.policy} has no alpha axis and would "
                "ignore it (give its own parameters with --param)")
    if a.policy == "vcasgd" and any(k == "alpha" for k, _ in a.param):
        p.error("--param alpha: VC-ASGD's alpha is the sweep's axis, which would replace it in every "
                "cell; give the alphas with --alpha")
    # the policy's own checks, before any training: an unknown or out-of-range parameter ended
    # in a traceback from the first simulated cell
    for alpha in (a.alpha or [None]) if a.policy == "vcasgd" else [None]:
        params = dict(a.param) | ({} if alpha is None else {"alpha": alpha})
        try:
            build_policy(a.policy, params)
        except ConfigError as exc:
            given = (f" --alpha {alpha}" if alpha is not None else "") + "".join(
                f" --param {k}={v}" for k, v in a.param)
            p.error(f"--policy {a.policy}{given}: {exc}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    seeds = a.seeds
    out = {"simulated": True, "workers": WORKERS, "preemptions_per_hour": RATE, "seeds": seeds,
           "sweeps": []}
    params = dict(a.param)
    for w in a.workloads:
        grid = ({**GRID[w], "epochs": GRID[w]["epochs"][:2], "alpha": (0.25, 0.5)} if a.quick
                else dict(GRID[w]))
        if a.epochs:
            grid["epochs"] = tuple(a.epochs)
        if a.alpha:
            grid["alpha"] = tuple(a.alpha)
        out["sweeps"].append(sweep(w, seeds, grid, policy=a.policy, params=params, steps=a.steps))
    out["wall_s"] = time.perf_counter() - t0
    out = {**flat_figures(out["sweeps"]), **out}
    for s in out["sweeps"]:
        print(f"\n{s['workload']}, {s['policy']} {s['params'] or ''} (simulated; gap in {s['unit']}, "
              "positive: the fleet is behind DDP)")
        print(f"{'epochs':>7}{'alpha':>7}{'gap mean':>10}{'95 % interval':>22}{'reached':>9}"
              f"{'samples to target / DDP':>26}")
        for c in s["cells"]:
            g, q = c["gap"], c["samples_ratio"]
            ci = "n/a" if g["ci_low"] is None else f"{g['ci_low']:.3f} .. {g['ci_high']:.3f}"
            mean = "n/a" if g["mean"] is None else f"{g['mean']:.3f}"
            ratio = "n/a" if q["mean"] is None else f"{q['mean']:.2f}" + (
                "" if q["ci_low"] is None else f" ({q['ci_low']:.2f} .. {q['ci_high']:.2f})")
            print(f"{c['epochs']:>7}{c['alpha']!s:>7}{mean:>10}{ci:>22}{c['reached']:>6}/{c['seeds']}"
                  f"{ratio:>26}")
    print(f"{out['wall_s']:.0f} s")
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
