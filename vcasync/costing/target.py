"""Cost to target: what each side pays until its model first reaches the quality the baseline reached.

This is the headline's arithmetic, kept pure (numbers in, numbers out) so every rule is tested:

* **The target** is the synchronous DDP baseline's final quality minus a stated tolerance: 0.5 point
  of accuracy, or 1 % of validation loss (:class:`Target`). Both sides are judged on the same split.
* **Time to target** is the first evaluation at or past the target, on a clock that starts when the
  side's first process starts (so start-up, imports and data loading count on both sides).
* **Billing** is per machine session (a VM started, then stopped or preempted), per second after the
  provider's minimum (:meth:`InstancePrice.billed_seconds`); a session is cut at the time to target,
  since one would stop paying there. A preempted session is billed like any other: every second lost to
  preemption, restarts and re-downloads is inside some session, so it is paid for.
* **The asynchronous side** pays its workers at the spot price (optionally a price that moves, see
  :mod:`vcasync.costing.market`) and one coordinator at the on-demand price from its start to the target.
* **The DDP side** pays ``N`` on-demand machines from start to its own time to target.
* **A baseline that cannot set a target** (:func:`baseline_problem`): one that did not learn (5
  points of accuracy, or 5 % of its first loss) or fell back (its end 5 points, or 5 %, worse than
  its best evaluation: a learning rate at the edge of stability) sets no target and prices no
  saving: its final quality is the initial model's, or a point in a collapse. Given its ``steps``,
  one that took fewer than :data:`MIN_BASELINE_STEPS` sets none either: its end is a point in its
  first climb.
* **A fleet that did not hold the target** (:func:`fleet_problem`): one that reached the target
  but ended more than 5 points of accuracy (5 % of loss) short of it crossed it by chance and fell
  back: it prices no saving at the target, an instant no user would have known to stop at.
* **Saving** = ``1 - async / DDP``. A run that never reaches the target has no cost to target: its
  saving is ``None``, and :func:`summarize_savings` counts it as a miss, never dropping it: the mean
  is labelled "n of m seeds reached" and the interval is unbounded below
  (:mod:`vcasync.costing.spread`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from .market import SpotPath
from .prices import InstancePrice
from .spread import spread

__all__ = [
    "MIN_BASELINE_STEPS",
    "Comparison",
    "Metric",
    "SideCost",
    "Span",
    "Target",
    "async_cost",
    "baseline_problem",
    "billed_usd",
    "ddp_cost",
    "fleet_problem",
    "summarize_savings",
    "time_to_target",
]

Metric = Literal["accuracy", "loss"]


@dataclass(frozen=True, slots=True)
class Target:
    """A quality threshold derived from the baseline's final ``reference`` value."""

    metric: Metric
    value: float
    reference: float
    tolerance: str

    @classmethod
    def from_baseline(cls, metric: Metric, final: float, *, accuracy_points: float = 0.5,
                      loss_fraction: float = 0.01) -> Target:
        """``final - accuracy_points`` points of accuracy, or ``final x (1 + loss_fraction)`` of loss."""
        if not math.isfinite(final):
            raise ConfigError(f"the baseline's final {metric} must be finite, got {final!r}")
        if metric == "accuracy":
            if not 0 <= accuracy_points < 100:
                raise ConfigError(f"accuracy tolerance must be in [0, 100) points, got {accuracy_points}")
            return cls("accuracy", final - accuracy_points / 100.0, final, f"{accuracy_points:g} point(s)")
        if metric == "loss":
            if not 0 <= loss_fraction < 1:
                raise ConfigError(f"loss tolerance must be in [0, 1), got {loss_fraction}")
            return cls("loss", final * (1.0 + loss_fraction), final, f"{100 * loss_fraction:g} % of loss")
        raise ConfigError(f"metric must be 'accuracy' or 'loss', got {metric!r}")

    def reached(self, value: float) -> bool:
        """True when ``value`` is at least as good as the threshold (higher accuracy, lower loss)."""
        if not math.isfinite(value):
            return False
        return value >= self.value if self.metric == "accuracy" else value <= self.value

    def as_dict(self) -> dict[str, object]:
        return {"metric": self.metric, "value": self.value, "reference": self.reference,
                "tolerance": self.tolerance}


#: How far a baseline must move from its first evaluation to have learned, and how far its end may
#: lie from its best before it "fell back": points of accuracy, or a fraction of loss.
BASELINE_ACCURACY_POINTS = 5.0
BASELINE_LOSS_FRACTION = 0.05

#: The fewest optimiser steps a baseline takes before its final quality can set a target. On digits
#: synchronous SGD from the initial model (6 %) climbs 5 to 15 points a step for its first 8 to 10
#: steps at every worker count, batch and rate measured (4 to 256 workers, 1 to 32 a worker, rates
#: 0.1 to 0.4): 64 workers at 32 a worker took 4 steps on 5 epochs and ended at 51 %, 256 workers
#: took 1 and ended at 27 %, and the fleet "saved" 81 % and 74 % against those. Under 10 steps the
#: end is a point in that climb. A floor, not a proof of convergence: at step 10 those curves stood
#: at 56 to 79 %, and most went on to 89 to 96 %.
MIN_BASELINE_STEPS = 10


def learned(values: Sequence[float], metric: Metric) -> bool:
    """Whether a curve (evaluations in order) learned: 5 points of accuracy, or 5 % of its first loss."""
    first, last = values[0], values[-1]
    if metric == "accuracy":
        return last > first + BASELINE_ACCURACY_POINTS / 100.0
    return last < (1.0 - BASELINE_LOSS_FRACTION) * first


def held(values: Sequence[float], metric: Metric) -> bool:
    """Whether a curve kept what it learned: its last evaluation within 5 points of accuracy (or 5 %
    of loss) of its best one. One that rose and fell back ends at a point in its collapse."""
    best = max(values) if metric == "accuracy" else min(values)
    return (metric == "accuracy" or math.isfinite(best)) and _near(values[-1], best, metric)


def _near(value: float, reference: float, metric: Metric) -> bool:
    """Whether ``value`` is no more than 5 points of accuracy (5 % of loss) worse than ``reference``."""
    if metric == "accuracy":
        return value >= reference - BASELINE_ACCURACY_POINTS / 100.0
    return value <= reference * (1.0 + BASELINE_LOSS_FRACTION)


def baseline_problem(values: Sequence[float], metric: Metric, *,
                     rate: str = "its learning rate", steps: int | None = None,
                     fewer_steps: str = "a smaller batch, more epochs or fewer workers") -> str | None:
    """Why a baseline's curve (its evaluations in order, accuracy or loss) cannot set a target, or
    None when it can: it took fewer than :data:`MIN_BASELINE_STEPS` optimiser ``steps`` (None: not
    judged), it did not learn, or it fell back from its best. ``rate``: what the message tells the
    user to check (a tool's flag, ``--sync-lr``); ``fewer_steps``: what gives it more steps."""
    if steps is not None and steps < MIN_BASELINE_STEPS:
        end = f" and ended at {metric} {values[-1]:.4g}" if values else ""
        return (f"the synchronous baseline took only {steps} optimiser step(s){end}, fewer than the "
                f"{MIN_BASELINE_STEPS} a target needs: its end is a point in its first climb, not a "
                f"quality a user would train to (give it more steps: {fewer_steps})")
    if not values or not learned(values, metric):
        return (f"the synchronous baseline did not learn (check {rate}), so a target "
                "derived from its final quality means nothing")
    if not held(values, metric):
        best = max(values) if metric == "accuracy" else min(values)
        return (f"the synchronous baseline fell back from its best {metric} {best:.4g} to "
                f"{values[-1]:.4g} at its end (a learning rate at the edge of stability: check "
                f"{rate}), so its final quality is no target a user would train to")
    return None


def fleet_problem(values: Sequence[float], target: float, metric: Metric, *,
                  change: str = "a lower learning rate, more epochs or fewer workers") -> str | None:
    """Why a fleet's curve (its evaluations in order, accuracy or loss) prices no saving at
    ``target`` though it reached it, or None: its last evaluation is more than 5 points of accuracy
    (5 % of loss) worse than the target, or not a number. It crossed the target by chance and fell
    back, so the instant it first crossed is no time a user would have stopped at. A curve that
    never reached the target is a miss, not this (None). ``change``: what the message tells the
    user to change."""
    def reached(v: float) -> bool:
        return math.isfinite(v) and (v >= target if metric == "accuracy" else v <= target)

    if not any(reached(v) for v in values):
        return None
    last = values[-1]
    if math.isfinite(last) and _near(last, target, metric):
        return None
    return (f"the fleet reached the target {metric} {target:.4g} but did not hold it: it ended at "
            f"{last:.4g}, more than {_margin(metric)} worse, so it crossed the target by chance and "
            f"its time to target is no time a user would have stopped at (try {change})")


def _margin(metric: Metric) -> str:
    if metric == "accuracy":
        return f"{BASELINE_ACCURACY_POINTS:g} points"
    return f"{100 * BASELINE_LOSS_FRACTION:g} % of loss"


def time_to_target(curve: Iterable[tuple[float, float]], target: Target) -> float | None:
    """Seconds at the first ``(t_s, value)`` point that reaches ``target``; None if none does."""
    for t_s, value in sorted(curve, key=lambda p: p[0]):
        if target.reached(value):
            return t_s
    return None


@dataclass(frozen=True, slots=True)
class Span:
    """One machine session, ``start_s`` to ``end_s`` on the run's clock."""

    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)) or self.end_s < self.start_s:
            raise ConfigError(f"a session must have finite start <= end, got {self.start_s}..{self.end_s}")

    def cut(self, until_s: float) -> Span | None:
        """The part before ``until_s``, or None when the session had not started by then."""
        if self.start_s >= until_s:
            return None
        return Span(self.start_s, min(self.end_s, until_s))


def billed_usd(span: Span, price: InstancePrice, *, spot: bool, path: SpotPath | None = None) -> float:
    """USD for one session: per second after the minimum; a moving spot price is integrated."""
    billed = price.billed_seconds(span.end_s - span.start_s)
    if billed <= 0:
        return 0.0
    if not spot:
        return billed / 3600.0 * price.on_demand_per_h
    if path is None:
        return billed / 3600.0 * price.spot_per_h
    return path.usd(price.spot_per_h, span.start_s, span.start_s + billed)


@dataclass(frozen=True, slots=True)
class SideCost:
    """One side's cost to target (``usd`` None when it never got there)."""

    label: str
    time_to_target_s: float | None
    usd: float | None
    sessions: int
    machine_seconds: float
    billed_seconds: float
    coordinator_usd: float = 0.0
    lost_s: float = 0.0

    @property
    def reached(self) -> bool:
        return self.usd is not None

    def as_dict(self) -> dict[str, object]:
        return {"label": self.label, "time_to_target_s": self.time_to_target_s, "usd": self.usd,
                "reached": self.reached, "sessions": self.sessions, "machine_seconds": self.machine_seconds,
                "billed_seconds": self.billed_seconds, "coordinator_usd": self.coordinator_usd,
                "lost_s": self.lost_s}


def async_cost(sessions: Sequence[Span], t_target_s: float | None, *, worker: InstancePrice,
               coordinator: InstancePrice, path: SpotPath | None = None, lost_s: float = 0.0,
               end_s: float | None = None) -> SideCost:
    """Spot workers plus an on-demand coordinator, from the run's start to ``t_target_s``.

    When the target was never reached the cost is None, but the machine time up to ``end_s`` (the end
    of the run) is still reported, so a miss shows what was spent for nothing.
    """
    horizon = t_target_s if t_target_s is not None else end_s
    cut = list(sessions) if horizon is None else [c for s in sessions if (c := s.cut(horizon)) is not None]
    workers = sum(billed_usd(c, worker, spot=True, path=path) for c in cut)
    coord = billed_usd(Span(0.0, horizon), coordinator, spot=False) if horizon else 0.0
    return SideCost("async on spot", t_target_s, None if t_target_s is None else workers + coord,
                    len(cut), sum(c.end_s - c.start_s for c in cut),
                    sum(worker.billed_seconds(c.end_s - c.start_s) for c in cut), coord, lost_s)


def ddp_cost(workers: int, t_target_s: float | None, *, price: InstancePrice) -> SideCost:
    """``workers`` on-demand machines, all from the start to ``t_target_s`` (DDP has no coordinator)."""
    if workers < 1:
        raise ConfigError(f"DDP needs at least one worker, got {workers}")
    if t_target_s is None:
        return SideCost("DDP on on-demand", None, None, workers, 0.0, 0.0)
    span = Span(0.0, t_target_s)
    one = billed_usd(span, price, spot=False)
    return SideCost("DDP on on-demand", t_target_s, workers * one, workers, workers * t_target_s,
                    workers * price.billed_seconds(t_target_s))


@dataclass(frozen=True, slots=True)
class Comparison:
    """One seed: both sides' cost to the same target."""

    seed: int
    target: Target
    fleet: SideCost
    ddp: SideCost

    @property
    def saving(self) -> float | None:
        """``1 - async / DDP``; None when either side never reached the target."""
        if self.fleet.usd is None or self.ddp.usd is None or self.ddp.usd <= 0:
            return None
        return 1.0 - self.fleet.usd / self.ddp.usd

    @property
    def time_ratio(self) -> float | None:
        """Async wall time to target / DDP's (above 1: the fleet took longer)."""
        a, d = self.fleet.time_to_target_s, self.ddp.time_to_target_s
        return None if a is None or not d else a / d

    def as_dict(self) -> dict[str, object]:
        return {"seed": self.seed, "saving": self.saving, "time_ratio": self.time_ratio,
                "target": self.target.as_dict(), "async": self.fleet.as_dict(), "ddp": self.ddp.as_dict()}


def summarize_savings(runs: Sequence[Comparison]) -> dict[str, object]:
    """Mean saving with its 95 % interval, by :mod:`vcasync.costing.spread`'s rule for a miss.

    A seed that never reached the target is counted (``targets_missed``, ``reached``: "n of m seeds
    reached"); the mean is over the seeds that reached it, labelled so, and a miss leaves the
    saving's interval unbounded below (``saving_ci_low`` None: its cost to target is unbounded) and
    the time ratio's unbounded above. ``complete`` is False as soon as one seed missed, so a reader
    never sees a figure with its failures removed.
    """
    s = spread((r.saving for r in runs), miss="low")
    t = spread((r.time_ratio for r in runs), miss="high")
    return {"saving": s.mean, "saving_ci_low": s.ci_low, "saving_ci_high": s.ci_high,
            "saving_text": s.describe("{:.1%}".format), "reached": s.label(), "seeds_reached": s.n,
            "time_ratio": t.mean, "time_ratio_ci_high": t.ci_high, "seeds": [r.seed for r in runs],
            "runs": len(runs), "targets_missed": s.missing, "complete": s.complete,
            "savings": list(s.values)}
