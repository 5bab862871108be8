"""What the coordinator has been doing lately, for the live status page: a bounded ring of recent
events, the merge rate, and the evaluation curve (accuracy, loss, ... by model version).

Everything here is bounded whatever the run's length or a worker's behaviour: at most
``max_events`` events, ``max_merge_times`` merge times, ``MAX_SERIES`` curves of at most
``max_points`` points each (a full curve keeps every other point and goes on, so it still spans
the whole run). Text that came from a worker is cut to one printable line. No asyncio, no IO; the
clock is injected (wall time: the page shows when things happened).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._redact import one_line
from ..errors import ConfigError, FrameError, LimitExceededError
from ..protocol._bodies import MAX_EVAL_SERIES

__all__ = ["MAX_SERIES", "Activity", "Event"]

#: At most this many named curves (``accuracy``, ``loss``...): a client cannot grow the memory.
MAX_SERIES: Final = MAX_EVAL_SERIES
_MAX_NAME: Final = 32
_MAX_TEXT: Final = 200


def _line(text: object, limit: int = _MAX_TEXT) -> str:
    """One printable line of at most ``limit`` characters (worker words must not forge lines)."""
    return one_line(text, limit)


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened: a join, a preemption, an expired lease, a refused result..."""

    t: float
    kind: str
    worker: str | None = None
    unit: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "worker": self.worker, "unit": self.unit,
                "detail": self.detail}


class Activity:
    """Recent events, merge times and evaluation points of one coordinator (in memory only)."""

    def __init__(self, *, max_events: int = 200, max_merge_times: int = 4096, max_points: int = 512,
                 rate_window_s: float = 10.0, clock: Callable[[], float] = time.time) -> None:
        if min(max_events, max_merge_times) < 1 or max_points < 2 or not rate_window_s > 0:
            raise ConfigError("activity bounds must be positive (max_points >= 2)")
        self._events: deque[Event] = deque(maxlen=max_events)
        self.totals: Counter[str] = Counter()      # events by kind since start, kept or not
        self._merges: deque[float] = deque(maxlen=max_merge_times)
        self._window = rate_window_s
        self._max_points = max_points
        self._curves: dict[str, list[tuple[float, int, float]]] = {}
        self._clock = clock
        self.started = clock()

    # -- events -----------------------------------------------------------------------------------
    def note(self, kind: str, *, worker: str | None = None, unit: str | None = None,
             detail: object = "") -> None:
        """Remember one event (the oldest is dropped once ``max_events`` are held)."""
        self.totals[kind] += 1
        self._events.append(Event(self._clock(), kind, None if worker is None else _line(worker, 128),
                                  None if unit is None else _line(unit, 256), _line(detail)))

    def events(self, limit: int | None = None) -> list[Event]:
        """The newest events first."""
        out = list(reversed(self._events))
        return out if limit is None else out[:limit]

    # -- merge rate -------------------------------------------------------------------------------
    def merged(self) -> None:
        """A result was merged now."""
        self._merges.append(self._clock())

    def merges_per_s(self) -> float:
        """Merges over the last ``rate_window_s`` (or since start, when the run is younger)."""
        now = self._clock()
        span = min(self._window, max(now - self.started, 1e-9))
        recent = sum(1 for t in self._merges if t > now - span)
        return recent / span

    # -- evaluation curve -------------------------------------------------------------------------
    def record_eval(self, version: int, values: Mapping[str, float]) -> None:
        """Evaluation figures of model ``version`` (e.g. ``{"accuracy": 0.91, "loss": 0.3}``).

        :class:`FrameError` names a bad name or value (nothing is recorded then); at most
        :data:`MAX_SERIES` names per run.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise FrameError(f"an evaluation needs a model version >= 0, got {version!r}", field="version")
        if not values:
            raise FrameError("an evaluation needs at least one named value", field="values")
        checked: dict[str, float] = {}
        for name, value in values.items():
            if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME \
                    or not name.replace("_", "").isalnum():
                raise FrameError(f"evaluation name {_line(name, 40)!r} must be 1-{_MAX_NAME} letters, "
                                 "digits or '_'", field="values")
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise FrameError(f"evaluation value {name!r} must be a finite number", field="values")
            checked[name] = float(value)
        new = [n for n in checked if n not in self._curves]
        if len(self._curves) + len(new) > MAX_SERIES:
            raise LimitExceededError(f"at most {MAX_SERIES} evaluation names per run",
                                     field="values", limit=MAX_SERIES,
                                     value=len(self._curves) + len(new))
        now = self._clock()
        for name, value in checked.items():
            points = self._curves.setdefault(name, [])
            if len(points) >= self._max_points:
                del points[1::2]             # keep the run's whole span at half the resolution
            points.append((now, version, value))

    def curves(self) -> dict[str, list[tuple[float, int, float]]]:
        """Name -> ``(time, version, value)`` points, oldest first."""
        return {name: list(points) for name, points in self._curves.items()}

    def view(self, events: int = 50) -> dict[str, Any]:
        """The JSON-able part of the status page this object knows."""
        return {"started": self.started, "merges_per_s": round(self.merges_per_s(), 3),
                "events": [e.to_dict() for e in self.events(events)],
                "event_totals": dict(self.totals),
                "curves": {n: [[t, v, x] for t, v, x in pts] for n, pts in self._curves.items()}}
