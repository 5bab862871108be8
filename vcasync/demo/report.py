"""The demo's report: ``report.json`` and two PNG plots in the run directory.

Costs are cost to target against the DDP baseline (:mod:`vcasync.demo.headline`). Work lost to
preemption is the training time between a SIGKILLed worker's last checkpoint (or unit start) and the
kill, read from the trainer's event log (SIGTERMed workers checkpoint and lose nothing), plus the
start-up of every restarted worker before it trained again; both are inside billed sessions, and
are split at the fleet's time to target: the seconds before it are in the cost to target, those
after it are billed to the run but not to the target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._json import strict_json
from ..examples.workloads import get_workload
from .ddp import DdpResult
from .headline import LostSpan, headline, restart_overhead, split_at
from .procs import Slot
from .run import DemoRun
from .trainer import parse_event

__all__ = ["build_report", "plot_accuracy", "plot_timeline", "read_events", "timeline_legend",
           "write_report"]


def read_events(events_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """The trainer's JSON-lines events, per process id (unreadable lines are skipped)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(events_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            ev = parse_event(line)
            if ev is not None:
                out.setdefault(ev["pid"], []).append(ev)
    return out


def _pid_at(slot: Slot, t_s: float) -> int | None:
    """The slot's process that was up at ``t_s`` (sessions and pids are appended in step)."""
    spans = zip(slot.sessions, slot.pids, strict=False)
    return next((p for (a, b), p in spans if a <= t_s <= b), None)


def _in_progress(events: list[dict[str, Any]], t_wall: float) -> dict[str, Any] | None:
    """The trainer's last event before ``t_wall`` if a unit was in progress then, else None."""
    before = [e for e in events if e["t"] <= t_wall]
    if before and before[-1]["kind"] in ("unit_start", "checkpoint"):
        return before[-1]
    return None


#: What a signal did to the unit its process was training, read from that process's next event:
#: ``finished`` (its ``unit_end``: the signal landed as the unit was ending, nothing was cut),
#: ``stopped`` (its ``unit_stop``: stopped part way and checkpointed), ``killed`` (no further event:
#: the process died inside the unit, the steps since its last checkpoint lost); ``none``: no unit
#: was in progress at the signal.
_CUT_OUTCOMES = frozenset({"stopped", "killed"})


def _signal_outcome(events: list[dict[str, Any]], t_wall: float
                    ) -> tuple[str, dict[str, Any] | None, int | None]:
    """``(outcome, last event before the signal, steps of the unit kept)`` of a signal at ``t_wall``
    to the process whose trainer ``events`` these are; steps kept: the unit's steps when it
    finished, the checkpoint's at a stop, the last checkpoint's (or the resumed start's) at a kill."""
    last = _in_progress(events, t_wall)
    if last is None:
        return "none", None, None
    # the unit's next end: a checkpoint in between is the step the trainer was on as the signal came
    after = next((e for e in events if e["t"] > t_wall and e.get("kind") != "checkpoint"), None)
    kind = None if after is None else after.get("kind")
    if after is not None and kind in ("unit_end", "unit_stop"):
        return ("finished" if kind == "unit_end" else "stopped"), last, int(after.get("steps_done", 0))
    return "killed", last, int(last.get("steps_done", last.get("start", 0)))


def _killed_training(run: DemoRun, events: dict[int, list[dict[str, Any]]],
                     t0_wall: float) -> list[LostSpan]:
    """Training lost to SIGKILLs: from the last checkpoint (or unit start) to the kill, one span
    per kill that cut a unit part way (one that landed as the unit ended lost nothing)."""
    spans: list[LostSpan] = []
    by_name = {s.name: s for s in run.slots}
    for kill in run.timeline.events:
        slot = by_name.get(kill.who)
        if kill.kind != "preempted" or kill.detail != "SIGKILL" or slot is None:
            continue
        pid = _pid_at(slot, kill.t_s)
        if pid is None:
            continue
        outcome, last, _ = _signal_outcome(events.get(pid, []), t0_wall + kill.t_s)
        if outcome == "killed" and last is not None:
            spans.append((last["t"] - t0_wall, kill.t_s))
    return spans


def _lost_work(kills: list[LostSpan], restarting: list[LostSpan], after_work: list[LostSpan],
               cost: dict[str, Any]) -> dict[str, Any]:
    """Seconds lost to preemption, split at the fleet's time to target: before it they are billed
    in the cost to target; after it they are billed to the run but are no part of that cost (the
    summary said "billed, in the cost above" of restarts that came after the target)."""
    reached = cost.get("target") is not None and (cost.get("async") or {}).get("time_to_target_s") is not None
    t = (cost.get("async") or {}).get("time_to_target_s") if reached else None
    k_before, k_after = split_at(kills, t)
    r_before, r_after = split_at(restarting, t)
    w_before, w_after = split_at(after_work, t)
    out: dict[str, Any] = {
        "seconds_lost_to_kills": k_before + k_after, "units_interrupted_by_kill": len(kills),
        "seconds_restarting": r_before + r_after,
        # restarted sessions that never trained, begun once every unit was trained: not restarts
        # of work, but billed all the same
        "seconds_restarted_after_work_done": w_before + w_after, "sessions_after_work_done": len(after_work),
        "time_to_target_s": t,
        "split": "at the fleet's time to target" if reached else (
            "none: the fleet never reached the target, so no cost to target holds these seconds; all "
            "are billed in the machine time the run spent" if cost.get("target") is not None else
            "none: no target (no baseline)"),
    }
    if reached:
        out["before_target"] = {"seconds_lost_to_kills": k_before, "seconds_restarting": r_before,
                                "seconds_restarted_after_work_done": w_before, "in_cost_to_target": True}
        out["after_target"] = {"seconds_lost_to_kills": k_after, "seconds_restarting": r_after,
                               "seconds_restarted_after_work_done": w_after, "in_cost_to_target": False}
    else:
        out["before_target"] = out["after_target"] = None
    return out


def _recoveries(run: DemoRun, events: dict[int, list[dict[str, Any]]], t0_wall: float) -> dict[str, Any]:
    """Each preemption, when its slot came back, and whether the unit it cut was finished later.

    A preemption is *recovered* when the slot restarted (or the run was already complete) and the
    unit in progress at the signal, if any, was trained to its end afterwards by some worker (the
    same one resuming its lease, or another one given the unit or its remainder).
    """
    by_name = {s.name: s for s in run.slots}
    ends = [(e["t"], e.get("root", e.get("unit"))) for evs in events.values() for e in evs
            if e.get("kind") == "unit_end"]
    pairs: list[dict[str, Any]] = []
    for ev in run.timeline.events:
        if ev.kind != "preempted" or ev.who not in by_name:
            continue
        back = next((e for e in run.timeline.events
                     if e.who == ev.who and e.t_s > ev.t_s and e.kind == "restart"), None)
        pid = _pid_at(by_name[ev.who], ev.t_s)
        t_wall = t0_wall + ev.t_s
        outcome, cut, steps = _signal_outcome([] if pid is None else events.get(pid, []), t_wall)
        root = None if cut is None else cut.get("root", cut.get("unit"))
        done_at = None if root is None else min((t for t, r in ends if r == root and t > t_wall),
                                                default=None)
        restarted = back is not None or run.finished
        unit_ok = root is None or done_at is not None
        # a slot that went on to give up after repeated crashes did not recover: its trainer's
        # unit_end says a unit was trained, not that it was merged (`demo --lr 1e6`: every loss
        # NaN, nothing merged, and the summary said "all recovered")
        gave_up = by_name[ev.who].state == "failed"
        pairs.append({"worker": ev.who, "t_s": round(ev.t_s, 3), "signal": ev.detail, "pid": pid,
                      "recovered_at_s": None if back is None else round(back.t_s, 3),
                      # the unit in progress at the signal, what the signal did to it, and its steps
                      # kept (steps_done was the steps at the trainer's last event before the
                      # signal, 0 for any unit before its first checkpoint however far it had got)
                      "unit": root, "outcome": outcome, "steps_done": steps,
                      "unit_finished_at_s": None if done_at is None else round(done_at - t0_wall, 3),
                      "recovered": restarted and unit_ok and not gave_up})
    cfg = run.config
    rate = cfg.preempt_per_min if cfg.preempt_per_min > 0 else None
    asked: int | None = None if rate is not None else int(run.market.get("asked", cfg.preemptions))
    fired = len(pairs)
    not_fired = 0 if asked is None else max(0, asked - fired)
    fewer = not_fired > 0
    return {"preemptions": pairs,
            # asked for (a count, or None beside a rate), sent, how many landed inside a unit (the
            # trainer's last event before the signal a unit_start or checkpoint), and of those how
            # many cut it before its end (stopped or killed part way); one that landed as its unit
            # was ending (the unit_end followed) cut nothing, nor did one between units or after
            # the work, and "all recovered" is then no news. cut_unit_in_progress counted every
            # preemption inside a unit: "4 of 4 cut a unit" of units one of which finished anyway
            "asked": asked, "rate_per_min": rate, "fired": fired,
            "in_unit_at_signal": sum(1 for p in pairs if p["unit"] is not None),
            "cut_unit_in_progress": sum(1 for p in pairs if p["outcome"] in _CUT_OUTCOMES),
            "unit_finished_anyway": sum(1 for p in pairs if p["outcome"] == "finished"),
            "fewer_than_asked": fewer,
            "not_fired": not_fired,
            # "the other 4" read wrong when none fired: "any of the 4" then
            "why_fewer": None if not fewer else (
                f"the {'fleet finished its units' if run.finished else 'run was stopped'} before "
                f"{f'the other {not_fired}' if fired else f'any of the {not_fired}'} found a worker "
                "inside a unit"),
            "sigterm": sum(1 for p in pairs if p["signal"] == "SIGTERM"),
            "sigkill": sum(1 for p in pairs if p["signal"] == "SIGKILL"),
            # worker processes that exited on an error (not a preemption), and slots that gave up
            "crashes": sum(1 for e in run.timeline.events if e.kind == "crash" and e.who in by_name),
            "workers_gave_up": sum(1 for s in run.slots if s.state == "failed"),
            "all_recovered": all(p["recovered"] for p in pairs)}


def build_report(run: DemoRun, baseline: DdpResult | None, t0_wall: float, *,
                 baseline_error: str | None = None) -> dict[str, Any]:
    """``report.json``'s content; ``baseline`` None with ``baseline_error`` (why) when the DDP
    baseline failed: the fleet's figures without a target or a saving."""
    cfg = run.config
    events = read_events(run.run_dir / "events")
    curve, late = run.curve(), run.scored_after_limit()
    # the fleet at the limit; only when nothing could be scored by then, the score taken after it
    final = curve[-1] if curve else late[-1] if late else None
    samples = run.total_units * run.unit_steps * cfg.batch_size
    kills = _killed_training(run, events, t0_wall)
    restarting, after_work = restart_overhead(run.slots, events, t0_wall, finished=run.finished)
    cost = headline(run, baseline, lost=[*kills, *restarting, *after_work])
    lost = _lost_work(kills, restarting, after_work, cost)
    return {
        "final_accuracy": None if final is None else final[3],
        "ddp_accuracy": None if baseline is None else baseline.final_accuracy,
        "accuracy_gap": (None if final is None or baseline is None
                         else baseline.final_accuracy - final[3]),
        "final_loss": None if final is None else final[4],
        "ddp_loss": None if baseline is None else baseline.final_loss,
        "loss_gap": (None if final is None or baseline is None or not baseline.final_loss
                     else (final[4] - baseline.final_loss) / baseline.final_loss),
        "metric": get_workload(cfg.workload).metric,
        "chance_accuracy": 0.1,
        "finished": run.finished,
        # why it did not finish; with --max-wall, when the limit fired: the curve, the time to
        # target and the samples stop there, the sessions are billed until each worker stopped
        "incomplete_reason": run.incomplete_reason,
        "max_wall_s": cfg.max_wall_s,
        "stopped_at_limit_s": run.limit_s,
        "merged_after_limit": run.merged_after_limit,
        # the final figures are of a model scored after the limit (the coordinator could not be
        # reached when it fired, and nothing was scored before): not in the curve nor the target
        "final_scored_after_limit": final is not None and not curve,
        "final_scored_at_s": None if final is None else final[0],
        "final_version": None if final is None else final[1],
        "accuracy_after_limit": [list(p) for p in late],
        # the workers' sessions ran until they had stopped, up to their grace period past the limit
        "workers_stopped_s": run.workers_stopped_s,
        "wall_s": run.wall_s,
        "samples": samples,
        "saving": cost.get("saving"),
        "time_to_target_s": (cost.get("async") or {}).get("time_to_target_s"),
        "ddp_time_to_target_s": (cost.get("ddp") or {}).get("time_to_target_s"),
        "first_merge_s": cost["first_merge_s"],
        "cost": cost,
        "work_lost": lost,
        "recovery": _recoveries(run, events, t0_wall),
        "coordinator_restarts": run.coordinator_restarts,
        "config": {
            "workers": cfg.workers, "workload": cfg.workload, "policy": cfg.policy,
            "policy_params": dict(cfg.policy_params), "epochs": cfg.epochs, "shards": cfg.num_shards(),
            "units": run.total_units, "unit_steps": run.unit_steps, "batch_size": cfg.batch_size,
            "lr": cfg.worker_lr, "ddp_lr": cfg.baseline_lr, "momentum": cfg.momentum,
            "preemptions": cfg.preemptions,
            "preempt_per_min": cfg.preempt_per_min, "kill_fraction": cfg.kill_fraction,
            "restart_delay_s": list(cfg.restart_delay_s),
            "grace_s": cfg.grace_s, "kill_coordinator": cfg.kill_coordinator, "seed": cfg.seed,
            "run_dir": str(run.run_dir),
        },
        "baseline": None if baseline is None else baseline.as_dict(),
        # why there is no baseline (a DDP rank failed, or it ran out of time); None when there is one
        "baseline_error": baseline_error,
        "accuracy": [list(p) for p in curve],
        "workers": [{"name": s.name, "starts": s.starts, "sigterm": s.preemptions, "sigkill": s.kills,
                     "uptime_s": s.uptime_s, "sessions": [list(x) for x in s.sessions], "pids": s.pids,
                     "state": s.state} for s in run.slots],
        "timeline": [e.as_dict() for e in run.timeline.events],
        "units_seen": sorted({e["unit"] for evs in events.values() for e in evs if "unit" in e}),
        "coordinator_status": run.status,
    }


def plot_accuracy(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    acc = report["accuracy"]
    metric = report.get("metric", "accuracy")
    mine, theirs = (3, 2) if metric == "accuracy" else (4, 3)  # columns of the curves' points
    per_unit = report["config"]["unit_steps"] * report["config"]["batch_size"]
    label = f"async ({report['config']['policy']}, preempted)"
    a1.plot([p[0] for p in acc], [p[mine] for p in acc], marker=".", label=label)
    a2.plot([(p[2] or 0) * per_unit for p in acc], [p[mine] for p in acc], marker=".", label="async")
    base = report["baseline"]
    if base is not None:
        pts = base["points"]
        a1.plot([p[0] for p in pts], [p[theirs] for p in pts], marker=".",
                label=f"DDP ({base['workers']} processes, gloo)")
        a2.plot([p[1] for p in pts], [p[theirs] for p in pts], marker=".", label="DDP")
    target = report["cost"].get("target")
    if target is not None:
        for a in (a1, a2):
            a.axhline(target["value"], color="grey", linestyle=":",
                      label=f"target (DDP, {target['tolerance']})")
    first = report["first_merge_s"]
    if first is not None:
        a1.axvline(first, color="green", linestyle="--", label="first merged result")
    for ev in report["timeline"]:
        if ev["who"] == "coordinator" and ev["kind"] == "killed":
            a1.axvline(ev["t_s"], color="red", linestyle=":", label="coordinator killed")
    a1.set_xlabel("wall seconds since the first process started (both sides)")
    a2.set_xlabel("training samples (async: units merged x unit samples)")
    for a in (a1, a2):
        a.set_ylabel(f"test {metric}")
        a.legend(loc="lower right" if metric == "accuracy" else "upper right")
    a1.set_title(f"{metric} over time")
    a2.set_title(f"{metric} at equal samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@dataclass(frozen=True, slots=True)
class _Mark:
    """One kind of mark on the timeline plot: whose events, which of them, its legend text, and how
    it is drawn (a scatter ``marker`` on the worker's row; None: a dotted vertical line)."""

    who: str          # "worker" (any worker's row) or "coordinator"
    test: Callable[[dict[str, Any]], bool]
    legend: str
    marker: str | None
    color: str
    size: int = 60


#: The timeline plot's marks: what is drawn and what the legend says come from this one table, and
#: the legend names only the marks drawn (it said "dotted: coordinator" of runs with no
#: coordinator restart, where no dotted line is drawn).
_TIMELINE_MARKS: tuple[_Mark, ...] = (
    _Mark("worker", lambda e: e["kind"] == "preempted" and e["detail"] == "SIGTERM", "v SIGTERM",
          "v", "orange"),
    _Mark("worker", lambda e: e["kind"] == "preempted" and e["detail"] == "SIGKILL", "x SIGKILL",
          "x", "red"),
    _Mark("worker", lambda e: e["kind"] == "preempted" and e["detail"] not in ("SIGTERM", "SIGKILL"),
          "o other preemption", "o", "black"),
    _Mark("worker", lambda e: e["kind"] == "restart", "^ restart", "^", "green", 40),
    _Mark("coordinator", lambda e: e["kind"] == "killed", "red dotted: coordinator killed", None,
          "red"),
    _Mark("coordinator", lambda e: e["kind"] == "recovered", "green dotted: coordinator back", None,
          "green"),
)


def _marked(report: dict[str, Any], mark: _Mark) -> list[dict[str, Any]]:
    """The timeline events ``mark`` draws."""
    rows = {w["name"] for w in report["workers"]}
    return [e for e in report["timeline"]
            if (e["who"] in rows if mark.who == "worker" else e["who"] == mark.who) and mark.test(e)]


def timeline_legend(report: dict[str, Any]) -> str:
    """The timeline plot's x label: its axis and a legend of the marks drawn, only those."""
    drawn = ["bars: worker up"] if any(w["sessions"] for w in report["workers"]) else []
    drawn += [mark.legend for mark in _TIMELINE_MARKS if _marked(report, mark)]
    return "wall seconds" + (f"  ({'; '.join(drawn)})" if drawn else "")


def plot_timeline(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = report["workers"]
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(workers) + 1.5))
    for row, w in enumerate(workers):
        for a, b in w["sessions"]:
            ax.barh(row, b - a, left=a, height=0.6, color="#a6cee3", edgecolor="#1f78b4")
    rows = {w["name"]: i for i, w in enumerate(workers)}
    for mark in _TIMELINE_MARKS:
        for ev in _marked(report, mark):
            if mark.marker is None:
                ax.axvline(ev["t_s"], color=mark.color, linestyle=":")
            else:
                ax.scatter([ev["t_s"]], [rows[ev["who"]]], marker=mark.marker, color=mark.color,
                           zorder=3, s=mark.size)
    ax.set_yticks(range(len(workers)), [w["name"] for w in workers])
    ax.set_xlabel(timeline_legend(report))
    ax.set_title("worker timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(report: dict[str, Any], run_dir: Path) -> list[Path]:
    out = run_dir / "report.json"
    out.write_text(strict_json(report, indent=1))
    acc, tl = run_dir / "accuracy.png", run_dir / "timeline.png"
    plot_accuracy(report, acc)
    plot_timeline(report, tl)
    return [out, acc, tl]
