"""Processor sharing: a simulated fleet that runs on fewer cores than it has processes.

On a real cloud fleet every worker has its own machine. The demo and the benchmark's real runs put
``N`` workers, the coordinator and the accuracy monitor on one small machine, where a worker's compute
takes longer whenever more processes want a core than there are cores. :class:`CpuShare` models that
the simplest way that is still right on average (egalitarian processor sharing): with ``runnable``
processes on ``cores`` cores, compute that needs ``t`` seconds of one core takes
``t x max(1, runnable / cores)`` seconds. ``runnable`` counts the workers inside a unit's training
right now, plus ``extra`` processes that are always busy (the coordinator's merges, the monitor's
evaluations, other jobs on a shared machine). ``cores=None`` is one machine per worker: no stretch.
The stretch is sampled when a stretch of compute starts (a heartbeat's worth of steps), so it follows
the fleet's load as workers start, stop and are preempted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..errors import ConfigError

__all__ = ["CpuShare", "MergeQueue"]


@dataclass(slots=True)
class CpuShare:
    cores: float | None = None
    extra: float = 0.0
    running: int = 0
    #: the cores sessions on their way out keep busy (``SimConfig.notice_cpu`` each)
    exiting: float = 0.0

    def __post_init__(self) -> None:
        if self.cores is not None and not self.cores > 0:
            raise ConfigError(f"cores must be > 0, got {self.cores}")
        if self.extra < 0:
            raise ConfigError(f"extra runnable processes must be >= 0, got {self.extra}")

    def stretch(self) -> float:
        """How much longer a second of one core's compute takes now (>= 1)."""
        if self.cores is None:
            return 1.0
        return max(1.0, (self.running + self.extra + self.exiting) / self.cores)

    def stretch_for(self, processes: int) -> float:
        """The stretch with ``processes`` busy (DDP: every rank computes at once)."""
        if self.cores is None:
            return 1.0
        return max(1.0, (processes + self.extra) / self.cores)


@dataclass(slots=True)
class MergeQueue:
    """The coordinator's merge loop as one server: each accepted result holds it ``merge_s`` seconds.

    A worker's upload is answered once its result is merged (the receipt names the new version), so
    when results arrive faster than the coordinator merges them, workers wait in this queue. With
    ``merge_s=0`` (the default) merging takes no virtual time, as on a coordinator that keeps up.
    """

    merge_s: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        if self.merge_s < 0:
            raise ConfigError(f"merge_s must be >= 0, got {self.merge_s}")

    async def serve(self) -> None:
        if self.merge_s <= 0:
            return
        async with self._lock:
            await asyncio.sleep(self.merge_s)
