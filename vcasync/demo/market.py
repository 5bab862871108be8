"""The demo's spot market: which worker is preempted when, and with which signal.

Two ways to play it, both seeded:

* **by progress** (the default): ``count`` preemptions at random points between 10 % and 80 % of the
  units done, ``round(kill_fraction * count)`` of them SIGKILL (no notice) and the rest SIGTERM (the
  notice: the worker checkpoints within its grace period). The count does not depend on how fast the
  machine is, so a default run always shows a few, however long its training takes.
* **in time**: a Poisson process of ``per_min`` preemptions per minute of a worker's training, for
  runs that want the rate of a real market (compressed) rather than a fixed count.

Only a worker that is training (its trainer has written an event) is picked, so preemptions land on
work in progress rather than on a process still importing torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from .procs import Slot, Timeline

__all__ = ["SpotMarket"]


class SpotMarket:
    """Preempts the demo's worker slots until ``stop`` is set; see the module docstring."""

    def __init__(self, slots: Sequence[Slot], timeline: Timeline, events_dir: Path, rng: random.Random, *,
                 stop: asyncio.Event, kill_fraction: float, tick_s: float = 0.25) -> None:
        self.slots = slots
        self.timeline = timeline
        self.events_dir = events_dir
        self.rng = rng
        self.stop = stop
        self.kill_fraction = kill_fraction
        self.tick_s = tick_s
        self.injected = 0

    def training(self) -> list[Slot]:
        """The slots whose current process has started training."""
        out = []
        for s in self.slots:
            pid = s.proc.pid
            if s.state == "running" and pid is not None and (self.events_dir / f"{pid}.jsonl").exists():
                out.append(s)
        return out

    def preempt(self, victim: Slot, hard: bool) -> None:
        victim.state = "preempting"
        self.injected += 1
        if hard:
            victim.kills += 1
        else:
            victim.preemptions += 1
        self.timeline.add(victim.name, "preempted", "SIGKILL" if hard else "SIGTERM")
        victim.proc.send(signal.SIGKILL if hard else signal.SIGTERM)

    async def _tick(self) -> bool:
        """Wait one tick; False once the market is told to stop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.tick_s):
                await self.stop.wait()
        return not self.stop.is_set()

    async def by_progress(self, count: int, total_units: int, units_done: Callable[[], int | None]) -> None:
        """``count`` preemptions at seeded points of the run's progress (10-80 % of the units)."""
        points = sorted(self.rng.uniform(0.1, 0.8) * total_units for _ in range(count))
        kills = round(self.kill_fraction * count)
        hard = [True] * kills + [False] * (count - kills)
        self.rng.shuffle(hard)
        for point, is_hard in zip(points, hard, strict=True):
            while True:
                if not await self._tick():
                    return
                done = units_done()
                training = self.training()
                if done is not None and done >= point and training:
                    self.preempt(self.rng.choice(training), is_hard)
                    break

    async def in_time(self, per_min: float) -> None:
        """A Poisson process of ``per_min`` preemptions per minute of training exposure.

        The thresholds come from the seeded generator, so the n-th preemption always falls after the
        same amount of exposure, whatever the machine's speed.
        """
        rate_per_s = per_min / 60.0
        exposure = 0.0
        threshold = self.rng.expovariate(rate_per_s)
        while await self._tick():
            training = self.training()
            exposure += self.tick_s * len(training)
            if exposure < threshold or not training:
                continue
            threshold = exposure + self.rng.expovariate(rate_per_s)
            victim = self.rng.choice(training)
            self.preempt(victim, self.rng.random() < self.kill_fraction)
