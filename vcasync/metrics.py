"""The coordinator's counters, gauges and histograms, exposed through ``prometheus-client``.

Counters only go up within one process (Prometheus handles restarts), except the run's result counts
(``merges``, ``results`` accepted and rejected) and the merge histograms (``staleness``,
``merge_seconds``): a restarted coordinator takes them up where its ledger and its snapshot left
them (:meth:`Metrics.resume_results`, :meth:`Metrics.resume_histograms`), so they count the run, not
the process, in every durability mode, and a merge the journal replays is counted once. Gauges that
other objects already know (current version, workers alive, lease counts) are *pulled* from a
callback at collect time instead of being copied on every change. The numbers are plain attributes:
``as_dict()`` is JSON-able for ``status()``; :meth:`Metrics.collect` hands them to prometheus-client
as metric families, and each :class:`Metrics` owns its own ``CollectorRegistry`` (two coordinators
in one process never share series), so ``render_prometheus()`` is the library's one text exposition
(format 0.0.4: ``NaN``, ``+Inf`` and ``-Inf`` spelled the standard way).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["Histogram", "Metrics"]

STALENESS_BUCKETS: tuple[float, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
#: Distinct (worker, reason) pairs counted in ``worker_rejects``: bounds the metric's cardinality.
MAX_WORKER_SERIES = 1000
SECONDS_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60)
#: A bucket bound as an ``le`` label, the way prometheus-client's own histograms spell it.
_le: Callable[[float], str] = floatToGoString


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: ``le`` upper bounds, plus +Inf)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip([*self.bounds, math.inf], self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == math.inf else _num(bound), running))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "buckets": dict(self.cumulative())}

    def to_plain(self) -> dict[str, Any]:
        """Bounds, per-bucket counts and sum, as a snapshot keeps them (:meth:`resume`)."""
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum}

    def resume(self, plain: object) -> bool:
        """Start from ``plain`` (what :meth:`to_plain` gave, before a restart) when its bounds are
        this histogram's and its counts are counts; else stay as it is. True when taken."""
        if not isinstance(plain, Mapping):
            return False
        bounds, counts, total = plain.get("bounds"), plain.get("counts"), plain.get("sum")
        if not (isinstance(bounds, list) and tuple(bounds) == self.bounds
                and isinstance(counts, list) and len(counts) == len(self.counts)
                and all(type(n) is int and n >= 0 for n in counts)
                and isinstance(total, int | float) and not isinstance(total, bool)
                and math.isfinite(total)):
            return False
        self.counts = list(counts)
        self.count = sum(counts)
        self.sum = float(total)
        return True

    def add_to(self, family: HistogramMetricFamily, labels: Sequence[str] = ()) -> None:
        """Add this histogram's buckets, sum and count to ``family`` under ``labels``."""
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip([*self.bounds, math.inf], self.counts, strict=True):
            running += n
            buckets.append((_le(bound), running))
        family.add_metric(list(labels), buckets, self.sum)

    def family(self, name: str, help_: str) -> HistogramMetricFamily:
        """This (unlabelled) histogram as a prometheus-client metric family."""
        family = HistogramMetricFamily(name, help_)
        self.add_to(family)
        return family


def _num(value: float) -> str:
    """A bucket bound as ``status()`` keys it (``"1"``, ``"0.5"``); unchanged JSON for clients."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class Metrics:
    """What the coordinator counts. The server renders it; ``status()`` embeds ``as_dict()``."""

    PREFIX = "vcasync_"

    def __init__(self, gauges: Callable[[], Mapping[str, float]] | None = None) -> None:
        self._gauges = gauges
        self.merges = 0                      # results merged (policy returned a model or buffered)
        self.results: Counter[str] = Counter()   # receipts by status
        self.rejects: Counter[str] = Counter()   # refused results by reason (never merged)
        self.worker_rejects: Counter[tuple[str, str]] = Counter()   # by (worker id, reason)
        self.heartbeats = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.journal_writes = 0
        self.snapshots = 0
        self.snapshot_failures = 0
        self.staleness = Histogram(STALENESS_BUCKETS)
        self.merge_seconds = Histogram(SECONDS_BUCKETS)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)

    def bind(self, gauges: Callable[[], Mapping[str, float]]) -> None:
        """Where the pulled gauges come from (the coordinator binds itself)."""
        self._gauges = gauges

    def resume_results(self, *, accepted: int, rejected: int) -> None:
        """Start from the run's counts so far (a restart: what its ledger recorded); results merged
        or rejected from then on, a journal's replay included, add to them."""
        self.merges = accepted
        for status, n in (("accepted", accepted), ("rejected", rejected)):
            self.results.pop(status, None)
            if n:                # a status shows once a result had it, as in a fresh run
                self.results[status] = n

    def histograms(self) -> dict[str, Any]:
        """The merge histograms as plain data, for a snapshot to keep beside the ledger (taken at
        the same point between two merges, so they hold exactly the merges it holds)."""
        return {"staleness": self.staleness.to_plain(), "merge_seconds": self.merge_seconds.to_plain()}

    def resume_histograms(self, plain: object) -> None:
        """Start the merge histograms from a snapshot's (:meth:`histograms`), a restart's: merges
        the journal replays after it add to them once. Until 2026-12-07 they started empty and the
        replayed merges were observed again, so a Prometheus series counted them twice across the
        restart (its reset read as new merges); a snapshot without them (older) leaves them empty."""
        if not isinstance(plain, Mapping):
            return
        self.staleness.resume(plain.get("staleness"))
        self.merge_seconds.resume(plain.get("merge_seconds"))

    def reject(self, reason: str, worker_id: str | None = None) -> None:
        """Count a refused result; with ``worker_id``, also against its sender (a worker sending
        scaled, flipped or random updates shows up here, in ``status()["suspects"]`` and as
        ``vcasync_worker_rejects_total``). At most ``MAX_WORKER_SERIES`` pairs are kept."""
        self.rejects[reason] += 1
        if worker_id is None:
            return
        key = (worker_id, reason)
        if key in self.worker_rejects or len(self.worker_rejects) < MAX_WORKER_SERIES:
            self.worker_rejects[key] += 1

    def suspects(self, limit: int = 50) -> dict[str, dict[str, int]]:
        """The workers with the most refused results: worker id -> reason -> count."""
        totals: Counter[str] = Counter()
        for (worker, _), n in self.worker_rejects.items():
            totals[worker] += n
        out: dict[str, dict[str, int]] = {}
        for worker, _ in totals.most_common(limit):
            out[worker] = {r: n for (w, r), n in sorted(self.worker_rejects.items()) if w == worker}
        return out

    def gauges(self) -> dict[str, float]:
        return dict(self._gauges()) if self._gauges is not None else {}

    def as_dict(self) -> dict[str, Any]:
        return {
            "merges": self.merges, "results": dict(self.results), "rejects": dict(self.rejects),
            "heartbeats": self.heartbeats, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "journal_writes": self.journal_writes, "snapshots": self.snapshots,
            "snapshot_failures": self.snapshot_failures, "staleness": self.staleness.as_dict(),
            "merge_seconds": self.merge_seconds.as_dict(), **self.gauges(),
        }

    @property
    def registry(self) -> CollectorRegistry:
        """This coordinator's own registry (never the process-global default one): its metrics, and
        whatever the server registers beside them (its HTTP counters)."""
        return self._registry

    def render_prometheus(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of everything in :attr:`registry`."""
        return generate_latest(self._registry).decode("utf-8")

    def collect(self) -> Iterator[Metric]:
        """The metric families at this instant (the prometheus-client collector protocol)."""
        p = self.PREFIX
        yield _counter(p + "merges_total", "Results merged into the model since the run began.",
                       self.merges)
        yield _labelled(p + "results_total", "Submitted results by receipt status (accepted and "
                        "rejected: since the run began; duplicate: since the process started).",
                        ("status",),
                        (((k,), v) for k, v in self.results.items()))
        yield _labelled(p + "rejects_total", "Results refused, by reason; never merged.", ("reason",),
                        (((k,), v) for k, v in self.rejects.items()))
        yield _labelled(p + "worker_rejects_total", "Results refused, by sending worker and reason.",
                        ("worker", "reason"), self.worker_rejects.items())
        yield _counter(p + "heartbeats_total", "Heartbeats received.", self.heartbeats)
        yield _counter(p + "bytes_in_total", "Result payload bytes received.", self.bytes_in)
        yield _counter(p + "bytes_out_total", "Model payload bytes sent.", self.bytes_out)
        yield _counter(p + "journal_writes_total", "Journal entries made durable.", self.journal_writes)
        yield _counter(p + "snapshots_total", "Snapshots written.", self.snapshots)
        yield _counter(p + "snapshot_failures_total", "Snapshot writes that failed.",
                       self.snapshot_failures)
        yield self.staleness.family(
            p + "staleness", "Versions between a merged result's base and the model it merged into.")
        yield self.merge_seconds.family(
            p + "merge_seconds", "Seconds per merge (policy plus publishing the new version).")
        for name, value in sorted(self.gauges().items()):
            help_ = _GAUGE_HELP.get(name, name.replace("_", " ") + ".")
            if name.endswith("_total"):
                yield _counter(p + name, help_, value)
            else:
                yield GaugeMetricFamily(p + name, help_, value=value)


def _counter(name: str, help_: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_, value=value)


def _labelled(name: str, help_: str, labels: Sequence[str],
              counts: Iterable[tuple[tuple[str, ...], float]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_, labels=list(labels))
    for key, value in sorted(counts):
        family.add_metric(list(key), value)
    return family


_GAUGE_HELP = {
    "version": "Current model version.",
    "workers_alive": "Workers seen within the alive window, not preempted, quarantined nor left.",
    "workers_known": "Workers with a record (those silent for forget_workers_s are dropped).",
    "leases_issued_total": "Leases granted.",
    "leases_expired_total": "Leases that missed their deadline.",
    "leases_reissued_total": "Leases granted for a unit that had been leased before.",
    "leases_released_total": "Leases given up by their holder.",
    "leases_refused_total": "Leases freed at once because their holder's upload was refused.",
    "units_requeued_total": "Parked work units an operator queued again.",
    "worker_backoffs_total": "Failures attributed to a worker (each backs it off from leasing).",
    "workers_quarantined": "Workers that failed too often in a row and get no more work.",
    "units_queued": "Work units waiting for a worker.",
    "units_leased": "Work units being trained.",
    "units_done": "Work units with a merged result.",
    "units_parked": "Work units given up on after failing on several workers (the run ends with "
                    "exit code 3 unless an operator requeues them).",
    "merge_queue": "Validated results waiting for the merge loop.",
    "retained_versions": "Model versions kept in memory.",
    "process_cpu_seconds_total": "CPU seconds (user + system, all threads) the coordinator's process "
                                 "has used.",
    "storage_state": "Storage health: 0 ok, 1 degraded (a snapshot failed), 2 unavailable (results "
                     "refused with 503 storage_unavailable), 3 failed (the coordinator stops).",
    "storage_unavailable_seconds": "Seconds the storage has been unavailable (0 when it is not).",
    "storage_write_failures_total": "Storage writes that failed after the backend's own retries.",
    "storage_outages_total": "Times the storage became unavailable.",
    "storage_probes_total": "Probe writes tried while the storage was unavailable.",
}
