"""What a simulation records as it runs: merges, work, evaluations and the fleet's timeline.

Kept apart from the engine so the report, the CLI and the tests read one plain structure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["EvalPoint", "Recorder", "TimelineEvent"]


@dataclass(frozen=True, slots=True)
class EvalPoint:
    """The global model's test score at virtual time ``t_s``."""

    t_s: float
    version: int
    samples_merged: int
    accuracy: float
    loss: float


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One thing that happened to a slot: up, notice, preempted, killed, lease, result, down."""

    t_s: float
    slot: int
    kind: str
    detail: str = ""


@dataclass(slots=True)
class Recorder:
    """Counters the simulated workers and the engine update as events happen."""

    samples_trained: int = 0
    samples_merged: int = 0
    samples_lost_preempted: int = 0
    samples_rejected: int = 0
    samples_duplicate: int = 0
    samples_expired: int = 0
    leases: int = 0
    preemptions: int = 0
    hard_kills: int = 0
    partial_results: int = 0
    receipts: Counter[str] = field(default_factory=Counter)
    reject_reasons: Counter[str] = field(default_factory=Counter)
    #: merged results by staleness, as the coordinator's merge loop measured it (the engine counts
    #: what the coordinator observes: a worker cannot know when its result will be merged)
    staleness: Counter[int] = field(default_factory=Counter)
    #: ``(start_s, end_s)`` of machine time whose work a preemption threw away: from the start of
    #: the unit a killed (or, with ``on_notice="abandon"``, noticed) session was working on, to the
    #: kill; the cost to target reports the part before the target as ``lost_s``
    lost_spans: list[tuple[float, float]] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    #: when each model version was merged and the samples merged by then (version 0: the start),
    #: for points stamped by their version (``SimConfig.eval_at_s``)
    merged_at: dict[int, tuple[float, int]] = field(default_factory=lambda: {0: (0.0, 0)})
    timeline: list[TimelineEvent] = field(default_factory=list)
    keep_timeline: bool = True

    def event(self, t_s: float, slot: int, kind: str, detail: str = "") -> None:
        if self.keep_timeline:
            self.timeline.append(TimelineEvent(t_s, slot, kind, detail))

    @property
    def samples_wasted(self) -> int:
        """Samples trained that never reached the model (lost, rejected, duplicate, expired)."""
        return self.samples_trained - self.samples_merged

    def staleness_histogram(self) -> dict[str, int]:
        return {str(k): v for k, v in sorted(self.staleness.items())}
