"""Cost accounting: what a run's machines are billed, on spot and on demand.

A run is a set of machine *sessions* (an instance started, then stopped or preempted). Each session
is billed per second after the provider's minimum (see :class:`~vcasync.costing.prices.InstancePrice`).
The same sessions priced on demand give the "on-demand equivalent" of an asynchronous run; the
synchronous baseline is priced separately from its own duration and machine count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..costing.market import SpotPath
from ..costing.prices import InstancePrice
from ..costing.target import Span, billed_usd

__all__ = ["Billing", "CostSummary", "Session", "ring_allreduce_s"]


@dataclass(slots=True)
class Session:
    """One machine run of one slot: ``start_s`` to ``end_s`` (None while it runs)."""

    slot: int
    start_s: float
    end_s: float | None = None

    def uptime_s(self, until_s: float | None = None) -> float:
        end = self.end_s if self.end_s is not None else until_s
        if end is None:
            raise ValueError(f"session of slot {self.slot} is still open")
        if until_s is not None:
            end = min(end, until_s)
        return max(0.0, end - self.start_s)


@dataclass(slots=True)
class Billing:
    """Sessions per slot; ``cost`` prices them (optionally only the part before ``until_s``)."""

    sessions: list[Session] = field(default_factory=list)
    _open: dict[int, Session] = field(default_factory=dict)

    def start(self, slot: int, now: float) -> None:
        if slot in self._open:
            raise ValueError(f"slot {slot} already has a running machine")
        s = Session(slot, now)
        self._open[slot] = s
        self.sessions.append(s)

    def stop(self, slot: int, now: float) -> None:
        s = self._open.pop(slot, None)
        if s is not None:
            s.end_s = now

    def stop_all(self, now: float) -> None:
        for slot in list(self._open):
            self.stop(slot, now)

    def machine_seconds(self, until_s: float | None = None) -> float:
        return sum(s.uptime_s(until_s) for s in self.sessions if until_s is None or s.start_s < until_s)

    def cost(self, price: InstancePrice, *, spot: bool, until_s: float | None = None,
             path: SpotPath | None = None) -> float:
        """USD for every session (cut at ``until_s``), each billed with the provider's minimum. With
        a spot ``path`` (its times on the run's virtual clock) the spot seconds are priced on it as
        :func:`vcasync.costing.target.billed_usd` prices the demo's: each session from its start for
        its billed seconds, so one shorter than the minimum pays the path's prices past its end."""
        sessions = [s for s in self.sessions if until_s is None or s.start_s < until_s]
        if not spot or path is None:
            return sum(price.cost(s.uptime_s(until_s), spot=spot) for s in sessions)
        return sum(billed_usd(Span(s.start_s, s.start_s + s.uptime_s(until_s)), price, spot=True, path=path)
                   for s in sessions)


def ring_allreduce_s(nbytes: int, workers: int, bandwidths_bps: Iterable[float], latency_s: float) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` among ``workers``: 2(n-1)/n of the bytes over the
    slowest link, plus 2(n-1) latencies (the classic bandwidth-optimal ring)."""
    if workers <= 1:
        return 0.0
    slowest = min(bandwidths_bps)
    return 2 * (workers - 1) / workers * 8.0 * nbytes / slowest + 2 * (workers - 1) * latency_s


@dataclass(frozen=True, slots=True)
class CostSummary:
    """What the asynchronous spot run and the synchronous on-demand baseline cost, to a point in time."""

    worker_hours: float
    spot_usd: float
    on_demand_equivalent_usd: float
    coordinator_usd: float
    sync_workers: int
    #: the baseline's wall-clock hours (its machine-hours are ``sync_workers`` times as many)
    sync_wall_hours: float | None
    sync_on_demand_usd: float | None

    @property
    def total_usd(self) -> float:
        return self.spot_usd + self.coordinator_usd

    @property
    def saving(self) -> float | None:
        """1 - (spot workers + coordinator) / synchronous on-demand; None without a baseline."""
        if not self.sync_on_demand_usd:
            return None
        return 1.0 - self.total_usd / self.sync_on_demand_usd

    def as_dict(self) -> dict[str, object]:
        return {
            "worker_hours": self.worker_hours, "spot_usd": self.spot_usd,
            "on_demand_equivalent_usd": self.on_demand_equivalent_usd,
            "coordinator_usd": self.coordinator_usd, "total_usd": self.total_usd,
            "sync_workers": self.sync_workers, "sync_wall_hours": self.sync_wall_hours,
            "sync_machine_hours": (None if self.sync_wall_hours is None
                                   else self.sync_workers * self.sync_wall_hours),
            "sync_on_demand_usd": self.sync_on_demand_usd, "saving": self.saving,
        }
