"""Turn a :class:`~vcasync.sim.engine.SimOutcome` into figures: JSON, a text table and a plot.

The headline figures are priced *to the target accuracy* with :mod:`vcasync.costing.target`: the
asynchronous run on spot machines (each session billed with the provider's minimum, plus an on-demand
coordinator) until its model first reaches the target, against the synchronous on-demand baseline
until its model first reaches it. Without an explicit target, the target is half a point of accuracy
below the synchronous baseline's final accuracy, or, on a signal judged by loss (``tinylm``), 1 %
above its final validation loss. A run that never reaches it has no saving
(``target_missed`` true), never a dropped figure; a run without a target (``--no-sync`` and no
``--target-accuracy``) has ``target_missed`` null. A baseline that did not learn (5 points of accuracy,
or 5 % of its first loss) prices no saving at all, at the target or over the full run, and sets no
target either: ``target`` is null (so are the times to it and ``target_missed``) and
``target_withheld`` says why (null otherwise); a target given explicitly is kept. The same holds for
a baseline that learned and then fell back (its final quality 5 points of accuracy, or 5 % of loss,
worse than its best evaluation: a learning rate at the edge of stability): its final quality is a
point in a collapse, not what a user would have trained to, so it sets no target and prices no
saving (``baseline_held`` false; on digits, 64 workers' synchronous SGD at the searched rate 0.1
rose to 84 %, fell to 12 % and ended at 55 %, and the fleet "saved" against a 54.5 % target), and
for one that took fewer than ``MIN_BASELINE_STEPS`` (10) optimiser steps: its end is a point in its
first climb (64 workers on digits took 4 steps of 2,048 samples to 51 %, and the fleet "saved" 81 %).
A fleet that reached the target and ended more than 5 points of accuracy (5 % of loss) short of it
prices no saving at it (``fleet_held`` false, ``saving_withheld`` says why; ``time_to_target_s`` and
the costs to it are kept): it crossed it by chance. A run that did not finish says why
(``incomplete_reason``; null when it finished).

Hours in ``cost_at_target`` / ``cost_full_run``: ``worker_hours`` are the fleet's machine-hours;
``sync_wall_hours`` the baseline's wall-clock hours and ``sync_machine_hours`` its machine-hours (its
workers times those). ``comparison.async.lost_s`` is the machine time, before the target, spent on
units a preemption threw away (``work.lost_to_preemption_s``: over the whole run).

With ``config.spot_path`` (``--spot-trace`` or ``--spot-walk``) the fleet's spot seconds, at the
target and over the full run, are priced on that path on the virtual clock (each session from its
start for its billed seconds, the provider's minimum included, as the demo's); ``spot_path`` records
which price it was, as the demo's ``cost.spot_path`` does, with the mean $/h the workers paid (to the
target and over the full run). The coordinator, the on-demand equivalent and the synchronous
baseline stay on demand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..costing.prices import InstancePrice
from ..costing.spot_options import spot_path_record, spot_path_text
from ..costing.target import (
    Comparison,
    Metric,
    Span,
    Target,
    async_cost,
    baseline_problem,
    ddp_cost,
    fleet_problem,
    learned,
)
from ..costing.target import held as held_curve
from .engine import SimOutcome
from .fleet import PoissonPreemption, TracePreemption
from .records import EvalPoint

__all__ = ["held", "lost_seconds", "plot_summary", "quality", "render_text", "summarize", "time_to_target"]


def quality(p: EvalPoint, metric: Metric) -> float:
    """The figure a run is judged by at one evaluation: accuracy, or loss."""
    return p.accuracy if metric == "accuracy" else p.loss


def time_to_target(evals: Sequence[EvalPoint], target: float, metric: Metric = "accuracy") -> float | None:
    """Virtual seconds until the first evaluation that reaches ``target`` (accuracy at or above it,
    loss at or below it); None if never."""
    for p in evals:
        if (p.accuracy >= target) if metric == "accuracy" else (p.loss <= target):
            return p.t_s
    return None


def _learned(evals: Sequence[EvalPoint], metric: Metric) -> bool:
    """Whether a run learned at all (:func:`vcasync.costing.target.learned`)."""
    return learned([quality(p, metric) for p in evals], metric)


def lost_seconds(spans: Sequence[tuple[float, float]], until_s: float | None) -> float:
    """Machine seconds of ``spans`` (work thrown away by preemptions) before ``until_s`` (None: all,
    as the cost of a run that missed its target counts all the time spent)."""
    if until_s is None:
        return sum(b - a for a, b in spans)
    return sum(max(0.0, min(b, until_s) - a) for a, b in spans)


def _tolerance(metric: Metric, target: float, ref: float) -> str:
    if metric == "accuracy":
        return f"{100 * (ref - target):.2f} point(s)"
    return f"{100 * (target / ref - 1):.2f} % of loss"


def held(evals: Sequence[EvalPoint], metric: Metric) -> bool:
    """Whether a run kept what it learned (:func:`vcasync.costing.target.held`)."""
    return held_curve([quality(p, metric) for p in evals], metric)


def _baseline_learned(out: SimOutcome) -> bool | None:
    """Whether the synchronous baseline learned (:func:`_learned`); None without one."""
    if out.sync is None or not out.sync.evals:
        return None
    return _learned(out.sync.evals, out.metric)


def _baseline_held(out: SimOutcome) -> bool | None:
    """Whether the synchronous baseline kept what it learned (:func:`held`); None without one."""
    if out.sync is None or not out.sync.evals:
        return None
    return held(out.sync.evals, out.metric)


def _baseline_unusable(out: SimOutcome) -> str | None:
    """Why the synchronous baseline cannot set a target or price a saving; None when it can
    (:func:`vcasync.costing.target.baseline_problem`)."""
    if out.sync is None or not out.sync.evals:
        return None
    return baseline_problem([quality(p, out.metric) for p in out.sync.evals], out.metric,
                            rate="--sync-lr", steps=out.sync.steps, fewer_steps=FEWER_STEPS)


#: What gives the synchronous baseline more optimiser steps on the same samples.
FEWER_STEPS = "a smaller --sync-batch-size, more --epochs or fewer --workers"
#: What a fleet that crossed its target by chance and fell back may change.
FLEET_CHANGE = "a lower --lr, more --epochs or fewer --workers"


def _fleet_unheld(out: SimOutcome, target: float | None) -> str | None:
    """Why the fleet, which reached ``target``, prices no saving at it: it did not hold it
    (:func:`vcasync.costing.target.fleet_problem`); None when it did, or never reached it. 256
    workers on digits crossed a 26.4 % target, ended at 10 % (chance), and "saved" 74 %."""
    if target is None:
        return None
    return fleet_problem([quality(p, out.metric) for p in out.rec.evals], target, out.metric,
                         change=FLEET_CHANGE)


def _costs(out: SimOutcome, until_s: float | None, sync_until_s: float | None) -> dict[str, Any]:
    """Both sides' bills to ``until_s`` / ``sync_until_s``. ``saving`` is None without a baseline,
    and when the baseline did not learn (the rule :func:`_comparison` applies): a sync run at
    ``--sync-lr nan`` stayed at 0.10 and the fleet "saved 81.5 %" against it."""
    cfg = out.config
    price: InstancePrice = cfg.prices[cfg.instance]
    coord_price: InstancePrice = cfg.prices[cfg.coordinator_instance]
    horizon = out.duration_s if until_s is None else until_s
    spot = out.billing.cost(price, spot=True, until_s=until_s, path=cfg.spot_path)
    on_demand_eq = out.billing.cost(price, spot=False, until_s=until_s)
    coordinator = coord_price.cost(horizon, spot=False)
    sync_usd = None
    if out.sync is not None and sync_until_s is not None:
        sync_usd = out.sync.workers * price.cost(sync_until_s, spot=False)
    total = spot + coordinator
    return {
        "worker_hours": out.billing.machine_seconds(until_s) / 3600.0,   # machine-hours
        "spot_usd": spot, "coordinator_usd": coordinator, "total_usd": total,
        "on_demand_equivalent_usd": on_demand_eq,
        "sync_on_demand_usd": sync_usd,
        # the baseline's wall-clock hours, and its machine-hours (all its workers for all of
        # them), the figure to set beside worker_hours (a single "sync_hours" was the first, read
        # as the second)
        "sync_wall_hours": None if sync_until_s is None else sync_until_s / 3600.0,
        "sync_machine_hours": (None if sync_until_s is None or out.sync is None
                               else out.sync.workers * sync_until_s / 3600.0),
        "saving": None if not sync_usd or _baseline_unusable(out) else 1.0 - total / sync_usd,
    }


def _comparison(out: SimOutcome, target: float | None, t_async: float | None,
                t_sync: float | None) -> Comparison | None:
    """Both sides' cost to target by the headline's rules (None without a baseline or a target)."""
    if out.sync is None or target is None:
        return None
    cfg, metric = out.config, out.metric
    price, coord = cfg.prices[cfg.instance], cfg.prices[cfg.coordinator_instance]
    spans = [Span(s.start_s, out.duration_s if s.end_s is None else s.end_s) for s in out.billing.sessions]
    if _baseline_unusable(out):
        return None  # the baseline did not learn or fell back (its rate diverged): no target to price
    ref = quality(out.sync.evals[-1], metric)
    tgt = Target(metric, target, ref, _tolerance(metric, target, ref))
    fleet = async_cost(spans, t_async, worker=price, coordinator=coord, path=cfg.spot_path,
                       end_s=out.duration_s, lost_s=lost_seconds(out.rec.lost_spans, t_async))
    return Comparison(cfg.seed, tgt, fleet, ddp_cost(out.sync.workers, t_sync, price=price))


def summarize(out: SimOutcome, target: float | None = None) -> dict[str, Any]:
    """All figures of a run as a JSON-able dict (ratios and headline figures first)."""
    cfg, rec, metric = out.config, out.rec, out.metric
    sync = out.sync
    final = rec.evals[-1] if rec.evals else None
    sync_final = sync.evals[-1] if sync is not None else None
    if target is None and metric == "accuracy":
        target = cfg.target_accuracy
    withheld = None
    if target is None and sync_final is not None and math.isfinite(quality(sync_final, metric)):
        if (why := _baseline_unusable(out)) is not None:
            # its "final quality" is the initial model's, or a point in a collapse: a target half a
            # point under it is one the fleet "reaches" early, and time to target and
            # target_missed would mean nothing
            withheld = why
        else:
            target = Target.from_baseline(metric, quality(sync_final, metric)).value
    t_async = time_to_target(rec.evals, target, metric) if target is not None else None
    t_sync = (time_to_target(sync.evals, target, metric)
              if (sync is not None and target is not None) else None)
    at_target = _costs(out, t_async, t_sync) if t_async is not None else None
    unheld = _fleet_unheld(out, target)
    # a fleet that crossed the target and fell back well short of it: no saving at the target,
    # what it cost to the crossing kept (a fleet of 256 on digits "saved" 74 % ending at chance)
    cmp = None if unheld else _comparison(out, target, t_async, t_sync)
    if unheld and at_target is not None:
        at_target["saving"] = None
    full = _costs(out, None, sync.duration_s if sync is not None else None)
    merged = rec.receipts.get("accepted", 0)
    trained = rec.samples_trained
    return {
        # figures of a model run, not a measurement: every "*_s" figure is virtual seconds
        "simulated": True,
        "clock": "virtual seconds",
        "saving_at_target": None if cmp is None else cmp.saving,
        # no target (no baseline, none given): nothing was missed, and a tool counting misses must
        # not count this run
        "target_missed": None if target is None else t_async is None,
        "metric": metric,
        "baseline_learned": _baseline_learned(out),
        "baseline_held": _baseline_held(out),
        "comparison": None if cmp is None else cmp.as_dict(),
        "saving_full_run": full["saving"],
        "accuracy_gap_vs_sync": (None if final is None or sync_final is None
                                 else sync_final.accuracy - final.accuracy),
        "loss_gap_vs_sync": (None if final is None or sync_final is None or not sync_final.loss
                             else (final.loss - sync_final.loss) / sync_final.loss),
        "wasted_fraction": (rec.samples_wasted / trained) if trained else 0.0,
        "target": target,
        "target_withheld": withheld,
        # the fleet reached the target and kept it (None: no target, or never reached)
        "fleet_held": None if target is None or t_async is None else unheld is None,
        "saving_withheld": unheld,
        "target_accuracy": target if metric == "accuracy" else None,
        "target_loss": target if metric == "loss" else None,
        "time_to_target_s": t_async,
        "sync_time_to_target_s": t_sync,
        # the initial model met the target (a --target-accuracy under it): both sides "reach" it
        # at 0 s for $0, so there is no saving to price; said, where "saving n/a" said nothing
        "target_met_at_start": t_async == 0.0,
        "final_accuracy": None if final is None else final.accuracy,
        "final_loss": None if final is None else final.loss,
        "sync_final_accuracy": None if sync_final is None else sync_final.accuracy,
        "sync_final_loss": None if sync_final is None else sync_final.loss,
        "finished": out.finished,
        "incomplete_reason": None if out.finished else _incomplete_reason(out),
        "units_parked": len(out.parked),
        "parked": dict(list(out.parked.items())[:20]),
        "duration_s": out.duration_s,
        "final_version": out.final_version,
        "cost_at_target": at_target,
        "cost_full_run": full,
        "spot_path": _spot_path(out, cmp, full),
        "work": {
            "samples_planned": out.total_samples, "samples_trained": trained,
            "samples_merged": rec.samples_merged, "samples_wasted": rec.samples_wasted,
            "lost_to_preemption": rec.samples_lost_preempted,
            "lost_to_preemption_s": lost_seconds(rec.lost_spans, None), "rejected": rec.samples_rejected,
            "duplicate": rec.samples_duplicate, "expired": rec.samples_expired,
        },
        "merges": {"accepted": merged, "duplicate": rec.receipts.get("duplicate", 0),
                   "rejected": rec.receipts.get("rejected", 0) + rec.receipts.get("error", 0),
                   "reject_reasons": dict(sorted(rec.reject_reasons.items())),
                   "partial_results": rec.partial_results},
        "staleness_histogram": rec.staleness_histogram(),
        "fleet": {"workers": len(out.fleet), "leases": rec.leases, "preemptions": rec.preemptions,
                  "hard_kills": rec.hard_kills,
                  "speeds": [round(m.speed, 4) for m in out.fleet],
                  "bandwidth_mbps": [round(m.bandwidth_bps / 1e6, 1) for m in out.fleet]},
        "config": {
            "signal": cfg.signal, "policy": cfg.policy, "policy_params": dict(cfg.policy_params),
            "seed": cfg.seed, "epochs": cfg.epochs, "units": out.units, "unit_steps": out.unit_steps,
            "eval_split": cfg.eval_split,
            "batch_size": out.workload.batch_size, "lr": out.workload.lr,
            "momentum": out.workload.momentum, "sample_cost_s": out.workload.sample_cost_s,
            "model_bytes": out.workload.model_bytes, "on_notice": cfg.on_notice,
            "max_staleness": cfg.staleness_window, "preemption": _preemption(out),
            "instance": cfg.prices[cfg.instance].as_dict(),
            "coordinator_instance": cfg.prices[cfg.coordinator_instance].as_dict(),
        },
        "sync": None if sync is None else {
            "workers": sync.workers, "steps": sync.steps, "step_s": sync.step_s,
            "duration_s": sync.duration_s, "lr": sync.lr, "batch_size": sync.batch_size,
            "evals": [[p.t_s, p.samples_merged, p.accuracy, p.loss] for p in sync.evals],
        },
        "evals": [[p.t_s, p.version, p.samples_merged, p.accuracy, p.loss] for p in rec.evals],
        "coordinator_status": out.coordinator_status,
    }


def _incomplete_reason(out: SimOutcome) -> str:
    """Why a run did not finish: it ran to the virtual-time limit (with what it had done and, under
    Poisson preemptions, how long a machine stays up against what a unit needs), or it parked
    units. A run at --preemption-rate 1000 ran 720 virtual hours, exited 5 and said only
    "finished False"."""
    whys = []
    if out.limit_reached:
        units = out.coordinator_status.get("units")
        done = units.get("done", 0) if isinstance(units, dict) else 0
        w = out.workload
        unit_s = out.unit_steps * w.batch_size * w.sample_cost_s
        why = (f"the run reached the simulator's limit of {out.config.max_virtual_s / 3600:,.0f} virtual "
               f"hours with {done} of {out.units} unit(s) trained ({out.rec.leases} lease(s), "
               f"{out.rec.preemptions} preemption(s))")
        model = out.config.preemption
        if isinstance(model, PoissonPreemption) and model.rate_per_hour > 0:
            up_s = 3600.0 / model.rate_per_hour
            why += (f": at --preemption-rate {model.rate_per_hour:g} a machine stays up {up_s:,.3g} "
                    f"virtual s on average, against {w.boot_s:g} s to boot and about {unit_s:,.3g} s for "
                    "a unit on a reference machine: give a lower --preemption-rate or shorter units "
                    "(--local-steps)")
        else:
            why += (": the fleet could not train its units in that time: give fewer preemptions, "
                    "shorter units (--local-steps) or more --workers")
        whys.append(why)
    if out.parked:
        whys.append(f"{len(out.parked)} unit(s) parked after failing on several workers (see parked)")
    return "; ".join(whys) or "the fleet did not finish"


def _spot_path(out: SimOutcome, cmp: Comparison | None, full: dict[str, Any]) -> dict[str, Any]:
    """Which spot price the fleet was priced at (:func:`vcasync.costing.spot_options.spot_path_record`,
    as the demo's ``cost.spot_path``), with the mean $/h its workers paid over their billed seconds:
    to the target (``mean_paid_per_h``, as the demo's; only when a comparison reached it) and over
    the full run (``mean_paid_per_h_full_run``)."""
    cfg = out.config
    price: InstancePrice = cfg.prices[cfg.instance]
    rec = spot_path_record(cfg.spot_path, price.spot_per_h)
    if cmp is not None and cmp.fleet.usd is not None and cmp.fleet.billed_seconds > 0:
        rec["mean_paid_per_h"] = (cmp.fleet.usd - cmp.fleet.coordinator_usd) / cmp.fleet.billed_seconds * 3600
    billed = sum(price.billed_seconds(s.uptime_s(out.duration_s)) for s in out.billing.sessions)
    if billed > 0:
        rec["mean_paid_per_h_full_run"] = full["spot_usd"] / billed * 3600
    return rec


def _preemption(out: SimOutcome) -> dict[str, object]:
    """The preemption model, and for a trace what this fleet replays of it (it wraps around)."""
    model = out.config.preemption
    described = model.describe()
    if isinstance(model, TracePreemption):
        described |= model.on_fleet(len(out.fleet))
    return described


def _fmt(x: object, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{100 * x:.1f} %" if pct else f"{x:,.4g}"
    return str(x)


def _target(s: dict[str, Any]) -> str:
    if s["target"] is not None:
        return _fmt(s["target"])
    if s.get("target_withheld"):
        return f"none: {s['target_withheld']}"
    return "none (no baseline to set it, none given)"


def render_text(s: dict[str, Any]) -> str:
    """A readable table of the headline figures."""
    cfg = s["config"]
    inst = cfg["instance"]
    lines = [
        f"vcasync simulate (simulated figures: virtual clock, modelled machines and preemptions): "
        f"{s['fleet']['workers']} workers, policy {cfg['policy']}, signal "
        f"{cfg['signal']}, seed {cfg['seed']}, preemption {cfg['preemption']}",
        f"prices: {inst['provider']}:{inst['instance']} ({inst['region']}) on-demand "
        f"${inst['on_demand_per_h']}/h, spot ${inst['spot_per_h']}/h; {inst['source']}, as of "
        f"{inst['as_of']}{' (approximate)' if inst['approximate'] else ''}: list prices, they drift",
        *_spot_path_lines(s.get("spot_path")),
        f"  {'target ' + s['metric']:<22} "
        f"{_target(s)}",
        f"  time to target         async {_fmt(_hours(s['time_to_target_s']))} h virtual   "
        f"sync on-demand {_fmt(_hours(s['sync_time_to_target_s']))} h virtual",
        f"  final accuracy         async {_fmt(s['final_accuracy'])}   sync {_fmt(s['sync_final_accuracy'])}",
    ]
    if s["metric"] == "loss":
        lines.append(f"  final loss             async {_fmt(s['final_loss'])}   "
                     f"sync {_fmt(s['sync_final_loss'])}")
    at = s["cost_at_target"]
    if s["baseline_learned"] is False:
        # no saving to print: both sides were priced against a baseline that never learned
        lines.append("  cost to target         no target: the synchronous baseline did not learn (check "
                     "--sync-lr), so no saving at equal quality")
    elif s["target_met_at_start"]:
        lines.append("  cost to target         n/a: the initial model already meets the target, both "
                     "sides at 0 s for $0 (give a --target-accuracy above the initial model's)")
    elif s.get("saving_withheld"):
        lines.append(f"  cost to target         no saving: {s['saving_withheld']}")
    elif at is not None:
        lines.append(f"  cost to target         spot ${at['spot_usd']:.4f} + coordinator "
                     f"${at['coordinator_usd']:.4f}   sync on-demand {_money(at['sync_on_demand_usd'])}"
                     f"   saving {_fmt(at['saving'], pct=True)}")
    elif s["target"] is not None:
        # the full run's saving alone read as the result (77.6 % on a tinylm fleet 4 points short)
        lines.append("  cost to target         n/a: async never reached the target, so the full run's "
                     "saving below is not at equal quality")
    full = s["cost_full_run"]
    lines += [
        f"  cost of the full run   spot ${full['spot_usd']:.4f} + coordinator ${full['coordinator_usd']:.4f}"
        f"   sync on-demand {_money(full['sync_on_demand_usd'])}   saving {_fmt(full['saving'], pct=True)}",
        f"  wasted work            {_fmt(s['wasted_fraction'], pct=True)} of samples trained "
        f"({s['work']['lost_to_preemption']} lost to preemption, {s['work']['rejected']} rejected, "
        f"{s['work']['expired']} expired)",
        f"  merges                 {s['merges']['accepted']} accepted, {s['merges']['rejected']} rejected, "
        f"{s['merges']['duplicate']} duplicate, {s['merges']['partial_results']} partial",
        f"  preemptions            {s['fleet']['preemptions']} ({s['fleet']['hard_kills']} without notice)"
        f"{_trace_text(cfg['preemption'])}",
        f"  staleness              {_staleness_text(s['staleness_histogram'])}",
        f"  finished               {s['finished']} after {_fmt(_hours(s['duration_s']))} h virtual",
    ]
    if s.get("incomplete_reason"):
        lines.append(f"  incomplete             {s['incomplete_reason']}")
    if s["units_parked"]:
        why = next(iter(s["parked"].values()), "")
        lines.append(f"  parked                 {s['units_parked']} unit(s) never trained: they failed on "
                     f"several workers (first: {why})")
    return "\n".join(lines)


def _spot_path_lines(rec: dict[str, Any] | None) -> list[str]:
    """The spot price path the fleet was priced on (--spot-trace, --spot-walk), under the prices
    line; none for the fixed list price, which that line gives."""
    what = spot_path_text(rec, start="the run's start on the virtual clock", seconds="virtual-s")
    if rec is None or what is None:
        return []
    mean = rec.get("mean_paid_per_h")
    paid = "" if mean is None else f"; the workers paid ${mean:.5f}/h on average to the target"
    return [f"  spot price path        {what}{paid}; the synchronous baseline stays on demand"]


def _trace_text(pre: dict[str, Any]) -> str:
    """For a trace: how many of its outages the fleet was scheduled, and that a larger fleet wraps
    (a 2-outage trace said "outages: 2" above "preemptions 4", and nothing said why)."""
    if pre.get("kind") != "trace":
        return ""
    wraps = f" (wrapped: slot k replays trace worker k mod {pre['workers']})" if pre["wraps"] else ""
    return (f"; trace: {pre['outages']} outage(s) of {pre['workers']} worker(s), "
            f"{pre['outages_scheduled']} scheduled on the {pre['fleet_workers']} slots{wraps}")


def _staleness_text(hist: dict[str, int]) -> str:
    """The histogram itself when short, else its median, 90th percentile and maximum."""
    if len(hist) <= 16:
        return str(hist)
    values = sorted((int(k), n) for k, n in hist.items())
    total = sum(n for _, n in values)

    def pct(q: float) -> int:
        seen = 0
        for k, n in values:
            seen += n
            if seen >= q * total:
                return k
        return values[-1][0]

    return f"median {pct(0.5)}, p90 {pct(0.9)}, max {values[-1][0]} versions ({total} merges)"


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0


def _money(x: float | None) -> str:
    return "n/a" if x is None else f"${x:.4f}"


def plot_summary(s: dict[str, Any], path: str | Path) -> Path:
    """Accuracy over virtual time (async vs sync) and the staleness histogram, as a PNG, titled as
    simulated (as the text summary and the JSON say it): a plot is often seen without them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ev, metric = s["evals"], s["metric"]
    col = 3 if metric == "accuracy" else 4           # evals: t, version, samples, accuracy, loss
    ax1.plot([p[0] / 3600 for p in ev], [p[col] for p in ev], label=f"async ({s['config']['policy']}, spot)")
    if s["sync"] is not None:
        sv = s["sync"]["evals"]                      # t, samples, accuracy, loss
        ax1.plot([p[0] / 3600 for p in sv], [p[col - 1] for p in sv], label="sync SGD (on-demand)")
    if s["target"] is not None:
        ax1.axhline(s["target"], color="grey", linestyle=":", label="target")
    ax1.set_xlabel("virtual hours")
    ax1.set_ylabel(f"{s['config']['eval_split']} {metric}")
    ax1.legend(loc="lower right" if metric == "accuracy" else "upper right")
    ax1.set_title(f"{metric} over time")
    hist = s["staleness_histogram"]
    ax2.bar([int(k) for k in hist], list(hist.values()))
    ax2.set_xlabel("staleness (versions)")
    ax2.set_ylabel("merged results")
    ax2.set_title("staleness")
    cfg = s["config"]
    fig.suptitle(f"simulated (virtual clock, modelled machines and preemptions): {s['fleet']['workers']} "
                 f"workers, {cfg['policy']}, {cfg['signal']}, seed {cfg['seed']}", fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
