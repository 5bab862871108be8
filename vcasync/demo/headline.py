"""The demo's headline: cost to target of the preempted fleet on spot against DDP on on-demand.

Both sides ran ``N`` processes on this machine, each standing for one instance of
``config.instance``; both clocks start before their first process. The target is the DDP run's final
test accuracy minus 0.5 point, or its final test loss plus 1 % for a loss-judged
workload (:class:`vcasync.costing.target.Target`). The fleet's sessions (each worker
process from start to exit, restarts included) are billed per second after the provider's minimum at
the spot price, plus the coordinator on demand from its start; DDP's ``N`` processes are billed on
demand from the spawn to its time to target. With ``config.spot_path`` (``--spot-trace`` or
``--spot-walk``) the workers' spot price moves during the run (:mod:`vcasync.costing.market`): both
fleet costs below are priced on that path, on the run's clock, and ``spot_path`` records which one
(DDP stays on demand). Beside the money: wall time to target on each side, and
the time the fleet spent before its first merged result, and ``saving_per_second``: the same
sessions billed per second from the first (no minimum), which on a run shorter than the minimum
separates what training and preemption cost from what the minimum adds to each restart.

One run is one seed, so it has no interval; ``bench/convergence.py`` repeats it over seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..costing.spot_options import spot_path_record
from ..costing.target import (
    Comparison,
    Span,
    Target,
    async_cost,
    baseline_problem,
    ddp_cost,
    summarize_savings,
    time_to_target,
)
from ..examples.workloads import get_workload
from .ddp import DdpResult
from .procs import Slot
from .run import DemoRun

__all__ = ["ACCURACY_TOLERANCE_POINTS", "LOSS_TOLERANCE", "LostSpan", "headline", "restart_overhead",
           "split_at"]

#: How far below DDP's final accuracy the target sits (points of accuracy).
ACCURACY_TOLERANCE_POINTS = 0.5
#: How far above DDP's final loss the target sits for a loss-judged workload (tinylm): 1 %.
LOSS_TOLERANCE = 0.01


#: A span of lost time on the run's clock, ``(start_s, end_s)``.
LostSpan = tuple[float, float]


def restart_overhead(slots: Sequence[Slot], events: Mapping[int, list[dict[str, Any]]],
                     t0_wall: float, *, finished: bool = True) -> tuple[list[LostSpan], list[LostSpan]]:
    """Restarted sessions' time before their first training event (boot, import, re-download):
    ``(restarting, after_work)``, the second being the whole of each restarted session that never
    trained and began once every unit had been trained (it came back to hear the run was over).
    Only a ``finished`` run has such sessions: in one that did not finish (workers that crashed
    after every unit, a limit) the last unit trained is not the end of the work, and those were
    "restarted after all work was done" of a run that merged nothing.

    Spans, not a sum: :func:`split_at` tells the seconds before the fleet reached its target (in
    the cost to target) from those after (billed to the run, not to the target).
    """
    last_end = max((e["t"] - t0_wall for evs in events.values() for e in evs if e.get("kind") == "unit_end"),
                   default=None)
    restarting: list[LostSpan] = []
    after_work: list[LostSpan] = []
    for s in slots:
        for (start, end), pid in list(zip(s.sessions, s.pids, strict=False))[1:]:
            first = min((e["t"] - t0_wall for e in events.get(pid, [])), default=None)
            if first is None and finished and last_end is not None and start >= last_end:
                after_work.append((start, end))
            elif first is None:
                restarting.append((start, end))
            elif first > start:
                restarting.append((start, min(first, end)))
    return restarting, after_work


def split_at(spans: Sequence[LostSpan], t_s: float | None) -> tuple[float, float]:
    """Seconds of ``spans`` before ``t_s`` and after it (``t_s`` None: all before, none after)."""
    total = sum(b - a for a, b in spans)
    if t_s is None:
        return total, 0.0
    before = sum(max(0.0, min(b, t_s) - a) for a, b in spans)
    return before, total - before


def _first_reaching(points: Sequence[tuple[float, int, float]], target: Target) -> int | None:
    """The samples of the earliest ``(t_s, samples, value)`` point that reaches ``target``."""
    return next((n for _, n, v in sorted(points, key=lambda p: p[0]) if target.reached(v)), None)


def headline(run: DemoRun, ddp: DdpResult | None, *, lost: Sequence[LostSpan] = ()) -> dict[str, Any]:
    """The cost-to-target section of ``report.json`` (``ddp`` None: no baseline, no saving).

    ``lost``: spans of time lost to preemption (training cut by a SIGKILL, restarts); the fleet's
    ``lost_s`` is their part before its time to target, the part inside its cost to target.
    """
    cfg = run.config
    price = cfg.prices[cfg.instance]
    coord = cfg.prices[cfg.coordinator_instance]
    first_merge = next((t for t, v in run.versions if v >= 1), None)
    path = cfg.spot_path
    out: dict[str, Any] = {"instance": price.as_dict(), "coordinator_instance": coord.as_dict(),
                           "first_merge_s": first_merge, "seeds": 1, "saving_ci": None,
                           "spot_path": spot_path_record(path, price.spot_per_h)}
    if ddp is None:
        return out | {"saving": None, "target": None}
    metric = get_workload(cfg.workload).metric
    # (t_s, units merged or samples, value) on each side, the value being what the target judges
    if metric == "accuracy":
        target = Target.from_baseline("accuracy", ddp.final_accuracy,
                                      accuracy_points=ACCURACY_TOLERANCE_POINTS)
        fleet_curve = [(p[0], p[2] or 0, p[3]) for p in run.curve()]
        ddp_curve = [(p[0], p[1], p[2]) for p in ddp.points]
    else:
        target = Target.from_baseline("loss", ddp.final_loss, loss_fraction=LOSS_TOLERANCE)
        fleet_curve = [(p[0], p[2] or 0, p[4]) for p in run.curve()]
        ddp_curve = [(p[0], p[1], p[3]) for p in ddp.points]
    # a DDP run that did not learn, fell back from its best or took too few steps sets no target:
    # its final quality is the initial model's, a point in a collapse or in its first climb, and a
    # saving against it says nothing
    why = baseline_problem([v for _, _, v in sorted(ddp_curve, key=lambda p: p[0])], metric,
                           rate="--sync-lr", steps=ddp.config.steps,
                           fewer_steps="more --epochs, a smaller --batch-size or fewer --workers")
    if why is not None:
        return out | {"saving": None, "target": None, "target_withheld": why}
    t_async = time_to_target(((t, v) for t, _, v in fleet_curve), target)
    t_ddp = time_to_target(((t, v) for t, _, v in ddp_curve), target)
    # Samples each side had trained on when it first reached the target (the fleet: merged units x
    # a unit's samples): more samples than DDP's is the fleet learning less per sample, which no
    # saving on start-up or merging can buy back.
    per_unit = run.unit_steps * cfg.batch_size
    n_async = _first_reaching([(t, units * per_unit, v) for t, units, v in fleet_curve], target)
    n_ddp = _first_reaching(ddp_curve, target)
    sessions = [Span(a, b) for s in run.slots for a, b in s.sessions]
    end = max([run.wall_s, *(s.end_s for s in sessions)])
    lost_s = split_at(lost, t_async)[0]     # no target reached: all of it, in the machine time spent
    fleet = async_cost(sessions, t_async, worker=price, coordinator=coord, path=path, lost_s=lost_s,
                       end_s=end)
    base = ddp_cost(cfg.workers, t_ddp, price=price)
    cmp = Comparison(cfg.seed, target, fleet, base)
    summary = summarize_savings([cmp])
    # The same sessions billed per second from the first (no provider minimum): on a run shorter than
    # the minimum the saving above counts sessions (a restart pays a whole minimum); this one is what
    # the run's training, start-ups and preemptions cost.
    per_s, coord_per_s = (dataclasses.replace(p, min_billed_s=0.0) for p in (price, coord))
    fleet_s = async_cost(sessions, t_async, worker=per_s, coordinator=coord_per_s, path=path, lost_s=lost_s,
                         end_s=end)
    per_second = Comparison(cfg.seed, target, fleet_s, ddp_cost(cfg.workers, t_ddp, price=per_s)).saving
    if fleet.usd is not None and fleet.billed_seconds > 0:
        # what the path made of the spot price: the workers' mean $/h over their billed seconds
        workers_usd = fleet.usd - fleet.coordinator_usd
        out["spot_path"]["mean_paid_per_h"] = workers_usd / fleet.billed_seconds * 3600
    return out | {
        "target": target.as_dict(), "saving": cmp.saving, "saving_per_second": per_second,
        "targets_missed": summary["targets_missed"], "reached": summary["reached"],
        "async": fleet.as_dict(), "ddp": base.as_dict(), "time_ratio": cmp.time_ratio,
        "ddp_first_step_s": ddp.first_step_s,
        "samples_to_target": {"async": n_async, "ddp": n_ddp,
                              "ratio": None if n_async is None or not n_ddp else n_async / n_ddp},
        "note": "each process is priced as one instance; per-second billing after each provider's "
                "minimum; list prices as published at the date shown, they drift",
    }
