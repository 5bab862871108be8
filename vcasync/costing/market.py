"""Spot prices that move during a run: a replayed trace or a seeded random walk.

A list price is a snapshot; a real spot price moves (hourly per zone on AWS, with capacity on Azure,
up to monthly on GCP). A :class:`SpotPath` prices a billed interval by integrating a piecewise-constant
$/h over it, so a long run pays the prices of the hours it actually ran in:

* :class:`SpotTrace`: ``t_s,spot_per_h`` rows (CSV with that header), each price holding until the
  next row's time; before the first row the first price holds.
* :class:`SpotWalk`: the table's spot price times a multiplicative random walk, one step per
  ``step_s`` (log-normal steps of ``sigma``, clipped to ``[low, high]`` x the list price), seeded.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..coerce import is_finite_number
from ..errors import ConfigError
from .params import csv_records, read_text_file
from .prices import MAX_PRICE_PER_H

__all__ = ["MIN_WALK_STEP_S", "SpotPath", "SpotTrace", "SpotWalk"]


#: The shortest step of a :class:`SpotWalk`: it draws one price per step from the run's start, so a
#: step of microseconds drew billions (no provider moves a spot price more often than hourly).
MIN_WALK_STEP_S = 1.0


class SpotPath(Protocol):
    """Prices ``start_s..end_s`` given the table's spot rate ``base_per_h``."""

    def usd(self, base_per_h: float, start_s: float, end_s: float) -> float: ...


def _integrate(times: Sequence[float], rates: Sequence[float], start_s: float, end_s: float) -> float:
    """USD over ``[start_s, end_s]`` of a step function: ``rates[i]`` $/h from ``times[i]`` on."""
    total = 0.0
    i = max(0, bisect.bisect_right(times, start_s) - 1)
    t = start_s
    while t < end_s:
        nxt = times[i + 1] if i + 1 < len(times) else math.inf
        stop = min(end_s, nxt)
        total += (stop - t) / 3600.0 * rates[i]
        t = stop
        i += 1 if stop == nxt else 0
    return total


@dataclass(frozen=True, slots=True)
class SpotTrace:
    """Absolute spot prices over time (the table's list price is ignored)."""

    times: tuple[float, ...]
    rates: tuple[float, ...]
    source: str = "trace"

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.rates):
            raise ConfigError(f"{self.source}: a spot trace needs one price per time, and at least one")
        # a NaN time passed the increasing check (every comparison with NaN is false) and priced
        # its hour with whatever bisect made of it
        bad = [t for t in self.times if not is_finite_number(t)]
        if bad:
            raise ConfigError(f"{self.source}: trace times must be finite numbers of seconds, got {bad[0]!r}")
        if any(b <= a for a, b in zip(self.times, self.times[1:], strict=False)):
            raise ConfigError(f"{self.source}: trace times must increase")
        # 1e300 $/h was accepted (a saving of -3e300), and 1.7e308 made the report's saving -inf: the run
        # ended on a ValueError traceback after it had run, its report lost; a price row is
        # capped at MAX_PRICE_PER_H too
        bad = [r for r in self.rates if not (is_finite_number(r) and 0 <= r <= MAX_PRICE_PER_H)]
        if bad:
            raise ConfigError(f"{self.source}: trace prices must be finite, from 0 to "
                              f"{MAX_PRICE_PER_H:g} $/h, got {bad[0]!r}")

    @classmethod
    def parse(cls, text: str, *, source: str = "trace") -> SpotTrace:
        """``t_s,spot_per_h`` rows, read as a price file's (:mod:`vcasync.costing.prices`) are: header
        names stripped, a name given twice or a row with more cells than the header refused (the
        last ``spot_per_h`` of two, or a row's extra cell, was dropped without a word), a price at
        most :data:`~vcasync.costing.prices.MAX_PRICE_PER_H`, and times that increase, each checked
        against the row before it and named by its line."""
        names, records = csv_records(text, f"{source}:")
        if not {"t_s", "spot_per_h"} <= set(names):
            raise ConfigError(f"{source}: the CSV header must name t_s and spot_per_h, got {names}")
        times: list[float] = []
        rates: list[float] = []
        for line, rec in records:
            try:
                t, rate = float(rec["t_s"]), float(rec["spot_per_h"])
            except (TypeError, ValueError):
                raise ConfigError(f"{source}:{line}: not a number in {dict(rec)}") from None
            if not (math.isfinite(t) and math.isfinite(rate) and 0 <= rate <= MAX_PRICE_PER_H):
                raise ConfigError(f"{source}:{line}: t_s must be a finite number of seconds and spot_per_h "
                                  f"a finite price from 0 to {MAX_PRICE_PER_H:g} $/h, got "
                                  f"t_s={rec['t_s']!r}, spot_per_h={rec['spot_per_h']!r}")
            if times and t <= times[-1]:
                raise ConfigError(f"{source}:{line}: trace times must increase: t_s {t:g} after "
                                  f"{times[-1]:g} (sort the rows; one price per time)")
            times.append(t)
            rates.append(rate)
        return cls(tuple(times), tuple(rates), source)

    @classmethod
    def from_csv(cls, path: str | Path) -> SpotTrace:
        return cls.parse(read_text_file(path, "spot trace"), source=str(path))

    def usd(self, base_per_h: float, start_s: float, end_s: float) -> float:
        # the trace's own tuples: a copy of both for each billed session cost O(rows) a session
        return _integrate(self.times, self.rates, start_s, end_s)

    def as_dict(self) -> dict[str, object]:
        """What a report records of the trace: where it came from and how many rows it has."""
        return {"kind": "trace", "source": self.source, "rows": len(self.times)}


@dataclass(frozen=True)
class SpotWalk:
    """The list spot price times a seeded multiplicative random walk (one step per ``step_s``)."""

    seed: int = 0
    step_s: float = 3600.0
    sigma: float = 0.05
    low: float = 0.5
    high: float = 2.0
    # not __init__ arguments: dataclasses.replace(walk, seed=8) passed the old walk's cache on, and
    # the new seed priced at the old seed's factors. The factors drawn so far (index: the step; 0 is
    # the list price) and the generator that draws the next ones, where each step not drawn yet
    # drew every step before it again: pricing N steps took O(N^2) (a 4,000-step walk, 67 minutes
    # at --spot-walk-step 1, took 21 s to price; a week of 10-s steps, hours, after the run)
    _factors: list[float] = field(default_factory=lambda: [1.0], repr=False, compare=False, init=False)
    _rng: np.random.Generator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # NaN passed the old comparisons: sigma=nan clipped every step to ``low`` (half the list
        # price, silently), step_s=nan raised a bare ValueError when pricing; inf was accepted
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"SpotWalk.seed must be an int, got {self.seed!r}")
        for name, lo, hi, what in (
                ("step_s", MIN_WALK_STEP_S, math.inf,
                 f"a finite number of seconds >= {MIN_WALK_STEP_S:g} (one price step each; spot "
                 "prices move hourly at the fastest)"),
                ("sigma", 0.0, math.inf, "a finite number >= 0 (the log-normal step's spread)"),
                ("low", 0.0, 1.0, "a finite factor in (0, 1] of the list price"),
                ("high", 1.0, math.inf, "a finite factor >= 1 of the list price")):
            value = getattr(self, name)
            # low is the one open bound: a factor of 0 would make the spot price free
            if not is_finite_number(value) or not (
                    (value > lo if name == "low" else value >= lo) and value <= hi):
                raise ConfigError(f"SpotWalk.{name} must be {what}, got {value!r}")
        object.__setattr__(self, "_rng", np.random.default_rng(
            np.random.SeedSequence([self.seed & 0xFFFFFFFF, 0x5B07])))

    def factor(self, step: int) -> float:
        """The multiplier in force during step ``step`` (step 0 is the list price). The steps are
        drawn in order from one generator, once each: the same draws as all ``step`` of them at
        once (numpy's normal draws one value after the other)."""
        if step <= 0:
            return 1.0
        factors = self._factors
        if step >= len(factors):
            more = step + 1 - len(factors)
            draws = self._rng.normal(0.0, self.sigma, size=more) if self.sigma else np.zeros(more)
            f = factors[-1]
            for d in draws.tolist():
                # a large (finite) sigma draws steps past exp's range: math.exp raised OverflowError
                # when the run was priced; a step that large takes the walk to ``high`` anyway
                mult = math.exp(d) if d < 700.0 else math.inf
                f = min(self.high, max(self.low, f * mult))
                factors.append(f)
        return factors[step]

    def usd(self, base_per_h: float, start_s: float, end_s: float) -> float:
        first, last = int(start_s // self.step_s), int(max(start_s, end_s - 1e-9) // self.step_s)
        times = [k * self.step_s for k in range(first, last + 1)]
        rates = [base_per_h * self.factor(k) for k in range(first, last + 1)]
        return _integrate(times, rates, start_s, end_s)

    def as_dict(self) -> dict[str, object]:
        """What a report records of the walk: enough to draw the same prices again."""
        return {"kind": "walk", "seed": self.seed, "sigma": self.sigma, "step_s": self.step_s,
                "low": self.low, "high": self.high}
