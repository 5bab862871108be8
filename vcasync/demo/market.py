"""The demo's spot market: which worker is preempted when, and with which signal.

Two ways to play it, both seeded:

* **by progress** (the default): ``count`` preemptions at random points between 10 % and 80 % of the
  units trained, ``round(kill_fraction * count)`` of them SIGKILL (no notice) and the rest SIGTERM
  (the notice: the worker checkpoints within its grace period). The count does not depend on how
  fast the machine is, so a default run always shows a few, however long its training takes.
* **in time**: a Poisson process of ``per_min`` preemptions per minute of a worker's training, for
  runs that want the rate of a real market (compressed) rather than a fixed count.

Both watch the trainers themselves, not the coordinator: progress is the ``unit_end`` events the
trainers write (:mod:`vcasync.demo.trainer`), read as they are written, and a preemption goes only
to a worker whose trainer is inside a unit (its last event a ``unit_start`` or a ``checkpoint``), so
it cuts work in progress: by progress, a seeded 20-80 % of a typical unit (the median of those
trained so far) into it. Progress used to be the coordinator's ``units.done`` as the monitor polled
it every half second, and any worker whose trainer had started was a target: a ``--quick`` run,
whose units all train within a second, had its preemptions land after every unit was merged, on
workers with nothing in progress, and the ones left when the run finished never fired.
:attr:`SpotMarket.asked`, :attr:`SpotMarket.fired` and :meth:`SpotMarket.stats` say how many were
asked for and sent, for the report to say so when fewer fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .procs import Slot, Timeline
from .trainer import parse_event

__all__ = ["SpotMarket"]

#: The trainer events after which a unit is in progress (until its ``unit_end`` or ``unit_stop``).
_IN_UNIT = frozenset({"unit_start", "checkpoint"})


class SpotMarket:
    """Preempts the demo's worker slots until ``stop`` is set; see the module docstring."""

    def __init__(self, slots: Sequence[Slot], timeline: Timeline, events_dir: Path, rng: random.Random, *,
                 stop: asyncio.Event, kill_fraction: float, tick_s: float = 0.02) -> None:
        self.slots = slots
        self.timeline = timeline
        self.events_dir = events_dir
        self.rng = rng
        self.stop = stop
        self.kill_fraction = kill_fraction
        self.tick_s = tick_s
        self.injected = 0
        #: preemptions asked for (by progress), None for a rate
        self.asked: int | None = None
        self.rate_per_min: float | None = None
        #: preemptions sent whose victim's trainer was inside a unit as the market last read it
        self.in_unit_at_signal = 0
        #: unit_end events read so far (the run's progress, from the trainers)
        self.units_ended = 0
        self._last: dict[int, str] = {}          # pid -> kind of its trainer's last event
        self._began: dict[int, float] = {}       # pid -> wall time its current unit started
        self._unit_s: list[float] = []           # wall seconds of the units trained so far
        self._read: dict[Path, int] = {}         # events file -> bytes read (whole lines)

    @property
    def fired(self) -> int:
        return self.injected

    def stats(self) -> dict[str, Any]:
        """What was asked for and what was sent, for the report."""
        return {"asked": self.asked, "rate_per_min": self.rate_per_min, "fired": self.injected,
                "in_unit_at_signal": self.in_unit_at_signal,
                "not_fired": None if self.asked is None else max(0, self.asked - self.injected)}

    def refresh(self) -> None:
        """Read the trainers' new event lines (whole lines only: a line being written waits)."""
        for path in sorted(self.events_dir.glob("*.jsonl")):
            done = self._read.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(done)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1
            if end == 0:
                continue
            self._read[path] = done + end
            for line in chunk[:end].splitlines():
                ev = parse_event(line)
                if ev is None:
                    continue
                kind, pid, at = str(ev.get("kind", "")), ev["pid"], ev.get("t")
                self._last[pid] = kind
                if kind == "unit_start" and isinstance(at, float | int):
                    self._began[pid] = float(at)
                if kind == "unit_end":
                    self.units_ended += 1
                    began = self._began.pop(pid, None)
                    if began is not None and isinstance(at, float | int):
                        self._unit_s.append(float(at) - began)

    def training(self) -> list[Slot]:
        """The running slots whose current process is inside a unit (as of the last :meth:`refresh`)."""
        return [s for s in self.slots
                if s.state == "running" and s.proc.pid is not None and self._last.get(s.proc.pid) in _IN_UNIT]

    def typical_unit_s(self) -> float:
        """The median wall time of the units trained so far (0 before the first ends)."""
        return statistics.median(self._unit_s) if self._unit_s else 0.0

    def ripe(self, training: Sequence[Slot], into: float) -> list[Slot]:
        """Of ``training``, the slots at least ``into`` of a typical unit into their current one: a
        signal there cuts that much training (at the first look after a ``unit_start`` it cut
        none, the unit having just begun)."""
        now, need = time.time(), into * self.typical_unit_s()
        return [s for s in training if s.proc.pid is not None
                and now - self._began.get(s.proc.pid, now) >= need]

    def preempt(self, victim: Slot, hard: bool) -> None:
        if victim.proc.pid is not None and self._last.get(victim.proc.pid) in _IN_UNIT:
            self.in_unit_at_signal += 1
        victim.state = "preempting"
        self.injected += 1
        if hard:
            victim.kills += 1
        else:
            victim.preemptions += 1
        self.timeline.add(victim.name, "preempted", "SIGKILL" if hard else "SIGTERM")
        victim.proc.send(signal.SIGKILL if hard else signal.SIGTERM)

    async def _tick(self) -> bool:
        """Wait one tick, then read the trainers' events; False once the market is told to stop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.tick_s):
                await self.stop.wait()
        if self.stop.is_set():
            return False
        self.refresh()
        return True

    async def by_progress(self, count: int, total_units: int) -> None:
        """``count`` preemptions at seeded points of the run's progress (10-80 % of the units
        trained), each at a worker inside a unit."""
        self.asked = count
        points = sorted(self.rng.uniform(0.1, 0.8) * total_units for _ in range(count))
        kills = round(self.kill_fraction * count)
        hard = [True] * kills + [False] * (count - kills)
        self.rng.shuffle(hard)
        for point, is_hard in zip(points, hard, strict=True):
            into = self.rng.uniform(0.2, 0.8)     # how far into a unit this one lands
            while True:
                if not await self._tick():
                    return
                ripe = self.ripe(self.training(), into) if self.units_ended >= point else []
                if ripe:
                    self.preempt(self.rng.choice(ripe), is_hard)
                    break

    async def in_time(self, per_min: float) -> None:
        """A Poisson process of ``per_min`` preemptions per minute of training exposure (time
        workers spent inside units).

        The thresholds come from the seeded generator, so the n-th preemption always falls after the
        same amount of exposure, whatever the machine's speed.
        """
        self.rate_per_min = per_min
        rate_per_s = per_min / 60.0
        exposure = 0.0
        threshold = self.rng.expovariate(rate_per_s)
        while await self._tick():
            training = self.training()
            exposure += self.tick_s * len(training)
            if exposure < threshold or not training:
                continue
            threshold = exposure + self.rng.expovariate(rate_per_s)
            victim = self.rng.choice(training)    # exposure is time in units: it lands inside one
            self.preempt(victim, self.rng.random() < self.kill_fraction)
