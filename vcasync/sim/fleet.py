"""The simulated fleet: heterogeneous machines and when the spot market takes them away.

A :class:`FleetConfig` draws one :class:`MachineProfile` per worker slot (compute speed relative to
a reference machine, link bandwidth, latency). A preemption model says when each slot's machine is
taken away and when capacity returns:

* :class:`PoissonPreemption`: preemptions arrive as a Poisson process of ``rate_per_hour`` per
  worker-hour of uptime; a fraction arrive with no notice (a hard kill), the rest with
  ``notice_s`` of warning (about 30 s on GCP, 2 min on AWS); the slot comes back after a restart
  delay drawn around ``restart_delay_s``.
* :class:`TracePreemption`: outages read from a CSV trace (``worker,down_s,up_s[,notice_s]``), for
  replaying a real spot-market history.

Everything is drawn from ``numpy.random.Generator`` streams derived from the seed, one per slot,
so adding a worker does not reshuffle the others.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..costing.params import csv_records, read_text_file
from ..errors import ConfigError

log = logging.getLogger("vcasync.sim")

__all__ = [
    "MAX_WORKERS",
    "FleetConfig",
    "MachineProfile",
    "NoPreemption",
    "Outage",
    "PoissonPreemption",
    "PreemptionModel",
    "TracePreemption",
    "make_fleet",
    "slot_rng",
]


#: The most worker slots a simulated fleet may have: each is a task on one event loop, drawn and
#: scheduled up front (2**40 workers ran for ever before the first event).
MAX_WORKERS = 100_000


def slot_rng(seed: int, stream: str, slot: int) -> np.random.Generator:
    """An independent generator for one (stream, slot): stable when other slots are added."""
    tag = int.from_bytes(stream.encode()[:8].ljust(8, b"\0"), "little")
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, tag, slot]))


@dataclass(frozen=True, slots=True)
class MachineProfile:
    """One worker slot's machine: speed relative to the reference, link bandwidth, latency."""

    slot: int
    speed: float
    bandwidth_bps: float
    latency_s: float

    def transfer_s(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` over this machine's link (one request)."""
        return self.latency_s + 8.0 * nbytes / self.bandwidth_bps


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """How heterogeneous the fleet is.

    ``speed_sigma`` is the sigma of a log-normal around 1.0 (0: identical machines);
    ``slow_fraction`` of the machines run ``slow_factor`` times slower on top (stragglers).
    Bandwidth is log-uniform in ``[bandwidth_min_bps, bandwidth_max_bps]``.
    """

    workers: int = 8
    speed_sigma: float = 0.25
    slow_fraction: float = 0.1
    slow_factor: float = 3.0
    bandwidth_min_bps: float = 100e6
    bandwidth_max_bps: float = 2e9
    latency_s: float = 0.02

    @classmethod
    def identical(cls, workers: int, *, bandwidth_bps: float = 1e9, latency_s: float = 0.02) -> FleetConfig:
        """``workers`` reference machines (speed 1, one link speed): what an on-demand group looks like,
        and the fleet to compare against it when the spot discount alone is the question."""
        return cls(workers=workers, speed_sigma=0.0, slow_fraction=0.0, bandwidth_min_bps=bandwidth_bps,
                   bandwidth_max_bps=bandwidth_bps, latency_s=latency_s)

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"a fleet needs 1 to {MAX_WORKERS:,} workers (--workers), got {self.workers}")
        # each by name, and finite: NaN passed every comparison below, and inf slowed a machine to
        # speed 0 (ZeroDivisionError) or overflowed the log-uniform bandwidth draw
        for name, flag in (("speed_sigma", "--speed-sigma"), ("slow_fraction", "--slow-fraction"),
                           ("slow_factor", "--slow-factor"), ("latency_s", None)):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ConfigError(f"FleetConfig.{name}{f' ({flag})' if flag else ''} must be finite, "
                                  f"got {value}")
        if self.speed_sigma < 0:
            raise ConfigError(f"FleetConfig.speed_sigma (--speed-sigma) must be >= 0, got {self.speed_sigma}")
        if not 0 <= self.slow_fraction <= 1:
            raise ConfigError(f"FleetConfig.slow_fraction (--slow-fraction) must be in [0, 1], "
                              f"got {self.slow_fraction}")
        if self.slow_factor < 1:
            raise ConfigError(f"FleetConfig.slow_factor (--slow-factor) must be >= 1, got {self.slow_factor}")
        lo_ok = 0 < self.bandwidth_min_bps <= self.bandwidth_max_bps
        if not (lo_ok and math.isfinite(self.bandwidth_max_bps)):
            lo, hi = self.bandwidth_min_bps / 1e6, self.bandwidth_max_bps / 1e6
            raise ConfigError(f"bandwidth needs finite 0 < MIN <= MAX, got {lo:g} {hi:g} Mbit/s "
                              "(--bandwidth-mbps; FleetConfig.bandwidth_min_bps/_max_bps)")
        if self.latency_s < 0:
            raise ConfigError(f"latency_s must be >= 0, got {self.latency_s}")


def make_fleet(config: FleetConfig, seed: int) -> list[MachineProfile]:
    """Draw one machine per slot, deterministically for ``seed``."""
    fleet: list[MachineProfile] = []
    lo, hi = math.log(config.bandwidth_min_bps), math.log(config.bandwidth_max_bps)
    for slot in range(config.workers):
        rng = slot_rng(seed, "machine", slot)
        speed = float(np.exp(rng.normal(0.0, config.speed_sigma))) if config.speed_sigma else 1.0
        if rng.random() < config.slow_fraction:
            speed /= config.slow_factor
        bw = float(np.exp(rng.uniform(lo, hi))) if hi > lo else config.bandwidth_min_bps
        fleet.append(MachineProfile(slot, speed, bw, config.latency_s))
    return fleet


@dataclass(frozen=True, slots=True)
class Outage:
    """A slot's machine is taken at ``down_s`` (after ``notice_s`` of warning) and back at ``up_s``."""

    down_s: float
    up_s: float
    notice_s: float = 0.0

    @property
    def hard(self) -> bool:
        return self.notice_s <= 0.0


class PreemptionModel(Protocol):
    """Yields each slot's outages in time order; ``describe`` says what the model is (for reports)."""

    def outages(self, slot: int, seed: int) -> Iterator[Outage]: ...

    def describe(self) -> dict[str, object]: ...


@dataclass(frozen=True, slots=True)
class NoPreemption:
    """Machines that are never taken away (on-demand)."""

    def outages(self, slot: int, seed: int) -> Iterator[Outage]:
        return iter(())

    def describe(self) -> dict[str, object]:
        return {"kind": "none"}


@dataclass(frozen=True, slots=True)
class PoissonPreemption:
    """Preemptions at ``rate_per_hour`` per worker-hour of uptime (0.3 = 30 % of workers per hour)."""

    rate_per_hour: float
    restart_delay_s: float = 120.0
    notice_s: float = 30.0
    hard_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not self.rate_per_hour >= 0 or math.isinf(self.rate_per_hour):
            raise ConfigError(f"rate_per_hour must be a finite rate >= 0, got {self.rate_per_hour}")
        # finite: a delay of inf slept for ever (the run never ended), NaN ran to the virtual limit
        for name, flag in (("restart_delay_s", "--restart-delay-s"), ("notice_s", "--notice-s")):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"PoissonPreemption.{name} ({flag}) must be a finite number of "
                                  f"seconds >= 0, got {value}")
        if not 0 <= self.hard_fraction <= 1:
            raise ConfigError(f"hard_fraction must be in [0, 1], got {self.hard_fraction}")

    def outages(self, slot: int, seed: int) -> Iterator[Outage]:
        if self.rate_per_hour == 0:
            return
        rng = slot_rng(seed, "preempt", slot)
        t = 0.0
        while True:
            t += float(rng.exponential(3600.0 / self.rate_per_hour))
            hard = bool(rng.random() < self.hard_fraction)
            # Capacity comes back after a delay around the mean (gamma, shape 4: rarely instant).
            delay = float(rng.gamma(4.0, self.restart_delay_s / 4.0)) if self.restart_delay_s else 0.0
            notice = 0.0 if hard else self.notice_s
            yield Outage(t, t + delay, notice)
            t += delay

    def describe(self) -> dict[str, object]:
        return {"kind": "poisson", "rate_per_hour": self.rate_per_hour,
                "restart_delay_s": self.restart_delay_s, "notice_s": self.notice_s,
                "hard_fraction": self.hard_fraction}


def _outage_problem(o: Outage) -> str | None:
    """What is wrong with one outage, naming the field, or None."""
    for name in ("down_s", "up_s", "notice_s"):
        value = getattr(o, name)
        if not math.isfinite(value):
            # up_s inf: the machine never came back and the run waited for it for ever
            return f"{name} must be a finite number of seconds, got {value!r}"
    if o.down_s < 0:
        return f"down_s must be >= 0 (seconds from the run's start), got {o.down_s:g}"
    if o.up_s < o.down_s:
        return f"up_s {o.up_s:g} is before down_s {o.down_s:g}: the machine comes back after it is taken"
    if o.notice_s < 0:
        return f"notice_s must be >= 0, got {o.notice_s:g}"
    return None


class TracePreemption:
    """Outages replayed from a CSV trace with a header ``worker,down_s,up_s`` (and ``notice_s``).

    ``worker`` is the slot index; rows of a slot must not overlap. Slots beyond the trace's workers
    wrap around (slot ``k`` replays worker ``k mod W``), so a small trace can drive a big fleet;
    :meth:`on_fleet` says how many outages a fleet is scheduled, and the report shows it.
    """

    def __init__(self, rows: Sequence[tuple[int, Outage]], *, source: str = "trace",
                 lines: Sequence[int] | None = None) -> None:
        """``rows``: ``(worker, outage)`` pairs; ``lines``: the file line of each (as :meth:`parse`
        gives them), so a refusal names it as ``SOURCE:LINE``, else ``SOURCE: row N`` (from 1)."""
        if lines is not None and len(lines) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(lines)} line numbers")
        per: dict[int, list[tuple[Outage, str]]] = {}
        for i, (worker, outage) in enumerate(rows):
            label, at = ((f"line {lines[i]}", f"{source}:{lines[i]}") if lines is not None
                         else (f"row {i + 1}", f"{source}: row {i + 1}"))
            if worker < 0:
                raise ConfigError(f"{at}: worker must be a slot index >= 0, got {worker}")
            problem = _outage_problem(outage)
            if problem:
                # the line and the field: a 500-row trace said only "(worker 0: Outage(...))"
                raise ConfigError(f"{at}: worker {worker}: {problem} (need finite times, "
                                  "0 <= down_s <= up_s and notice_s >= 0)")
            per.setdefault(worker, []).append((outage, label))
        for worker, outs in per.items():
            outs.sort(key=lambda o: o[0].down_s)
            for (a, label_a), (b, label_b) in itertools.pairwise(outs):
                if b.down_s < a.up_s:
                    raise ConfigError(f"{source}: worker {worker} has overlapping outages "
                                      f"({a.down_s:g}-{a.up_s:g} s on {label_a} and "
                                      f"{b.down_s:g}-{b.up_s:g} s on {label_b})")
        if not per:
            raise ConfigError(f"{source}: the trace holds no outage")
        self._per = {w: [o for o, _ in outs] for w, outs in per.items()}
        self._workers = max(per) + 1
        self.source = source

    @classmethod
    def from_csv(cls, path: str | Path) -> TracePreemption:
        return cls.parse(read_text_file(path, "preemption trace"), source=str(path))

    @classmethod
    def parse(cls, text: str, *, source: str = "trace") -> TracePreemption:
        # read as every CSV input is (csv_records): header names stripped, a name given twice or a
        # row with more cells than the header refused (a row's extra cell, a notice under a header
        # without notice_s, was dropped without a word)
        names, records = csv_records(text, f"{source}:")
        need = {"worker", "down_s", "up_s"}
        if not need <= set(names):
            raise ConfigError(f"{source}: the CSV header must name {sorted(need)} (optionally notice_s), "
                              f"got {names}")
        rows: list[tuple[int, Outage]] = []
        lines: list[int] = []
        for line, rec in records:
            cells: dict[str, float] = {}
            for name in ("worker", "down_s", "up_s", "notice_s"):
                cell = rec.get(name)
                if name == "notice_s" and not (cell or "").strip():
                    cells[name] = 0.0     # no column, or an empty cell: a hard kill
                    continue
                try:
                    cells[name] = int(cell) if name == "worker" else float(cell)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    # the field by name: the whole row's dict was printed, and which cell was wrong
                    # (or missing, in a short row) left to the reader
                    what = "a whole number (the slot index)" if name == "worker" else "a number of seconds"
                    got = "missing (the row is short)" if cell is None else f"= {cell!r}"
                    raise ConfigError(f"{source}:{line}: not a number: {name} {got} ({name} is {what})"
                                      ) from None
            rows.append((int(cells["worker"]), Outage(cells["down_s"], cells["up_s"], cells["notice_s"])))
            lines.append(line)
        return cls(rows, source=source, lines=lines)

    def outages(self, slot: int, seed: int) -> Iterator[Outage]:
        return iter(self._per.get(slot % self._workers, []))

    def check_fleet(self, workers: int) -> None:
        """Refuse a trace none of whose outages a fleet of ``workers`` would replay (a trace of
        worker 99 for 2 workers ran with no preemption, silently), and say which trace workers a
        smaller fleet leaves out."""
        replayed = {k % self._workers for k in range(workers)}
        if not replayed & set(self._per):
            raise ConfigError(f"{self.source}: a fleet of {workers} worker(s) replays trace workers "
                              f"0..{min(workers, self._workers) - 1}, and the trace has outages only "
                              f"for {sorted(self._per)[:5]}: no preemption would happen")
        left = sorted(set(self._per) - replayed)
        if left:
            log.warning("%s: the trace's workers %s%s are beyond the fleet's %d and not replayed",
                        self.source, left[:5], " ..." if len(left) > 5 else "", workers)

    def describe(self) -> dict[str, object]:
        return {"kind": "trace", "source": self.source, "workers": self._workers,
                "outages": sum(len(v) for v in self._per.values())}

    def on_fleet(self, workers: int) -> dict[str, object]:
        """What a fleet of ``workers`` replays: a larger fleet than the trace's wraps around (slot
        ``k`` replays trace worker ``k mod W``), so it is scheduled more outages than the trace has
        (a 2-outage trace on 4 slots: 4). Wrapping is on purpose: a slot the trace does not cover
        would otherwise never be preempted, and the fleet would look safer than the market was."""
        return {"fleet_workers": workers, "wraps": workers > self._workers,
                "outages_scheduled": sum(len(self._per.get(k % self._workers, [])) for k in range(workers))}
