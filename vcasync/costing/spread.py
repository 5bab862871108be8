"""Mean and a 95 % interval over seeds, so no headline figure is a single point.

The interval is Student's t on the seeds' values (``mean +/- t(0.975, n-1) * sd / sqrt(n)``): with five
seeds the half-width is 1.24 standard deviations, which is what a reader should see beside the mean.

A value that does not exist (a run that never reached its target) is not dropped, and it is not
given a number either. The rule:

* it is counted (``missing``): every summary says ``n of m seeds reached``, and :attr:`Spread.mean`
  is the mean *of the reached seeds* only, labelled so (:meth:`Spread.label`);
* it makes the interval **unbounded on its side** (``None``): a run that paid for machines and never
  reached the target has an unbounded cost to target, so its saving is unbounded below
  (``miss="low"``) and its time or samples to target unbounded above (``miss="high"``); with the side
  not known (``miss="unknown"``, the default) both ends are unbounded. The other end is the reached
  seeds' interval: a miss can only move the true figure towards its own side.

Counting a miss as the worst saving observed was the other candidate and is not used: it invents a
finite saving for a run that bought nothing, and with one seed (the demo) there is no worst to take.
So ``spread([0.60, None, None, None, None], miss="low")`` is "0.60, 1 of 5 seeds reached, interval
unbounded below", never the same summary as five seeds at 0.60, and a headline check on the
interval's low end (``saving_real_ci_low >= 0.70``) cannot pass with a seed missing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Counted", "Miss", "Spread", "spread", "t_975"]

#: Where a missing value lies: below every value (a saving), above (a time or samples ratio, a gap),
#: or not known.
Miss = Literal["low", "high", "unknown"]
#: What a seed with a value did: reached its target, or was measured (a gap exists either way).
Counted = Literal["reached", "measured"]

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom; beyond that the
# Cornish-Fisher expansion about the normal's quantile (below). The normal's 1.96 itself, used here
# until 2026-12-07, is 2-4 % under Student's t at 31-59 degrees of freedom: too narrow an interval.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)

#: The normal distribution's 97.5 % quantile, Student's t's limit.
_Z975 = 1.959963984540054


def t_975(dof: int) -> float:
    """The 97.5 % quantile of Student's t with ``dof`` degrees of freedom (``dof >= 1``)."""
    if dof < 1:
        raise ValueError(f"need at least one degree of freedom, got {dof}")
    if dof <= len(_T975):
        return _T975[dof - 1]
    # Abramowitz & Stegun 26.7.5: within 1e-5 of Student's t from 30 degrees of freedom up
    z, v = _Z975, float(dof)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


@dataclass(frozen=True, slots=True)
class Spread:
    """``n`` reached values' mean, the 95 % interval (None under two values, and on the side a
    missing value lies), and how many were missing; see the module docstring for the rule."""

    n: int
    missing: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    values: tuple[float, ...]
    miss: Miss = "unknown"
    #: what a seed with a value did: "reached" (its target: a saving, a time or samples to target)
    #: or "measured" (a gap to DDP exists for every seed that ran, target reached or not: "5 of 5
    #: seeds reached" beside two missed targets read as a contradiction)
    counted: Counted = "reached"

    @property
    def seeds(self) -> int:
        """Every seed, reached or not."""
        return self.n + self.missing

    @property
    def complete(self) -> bool:
        """True when every seed produced a value (no run missed its target)."""
        return self.missing == 0 and self.n > 0

    @property
    def unbounded(self) -> str | None:
        """Which end a miss left unbounded: ``"low"``, ``"high"``, ``"both"``; None without a miss."""
        if not self.missing:
            return None
        return "both" if self.miss == "unknown" else self.miss

    def label(self) -> str:
        """``n of m seeds reached`` (or ``measured``), what every printed mean is said to be over."""
        return f"{self.n} of {self.seeds} seed{'s' if self.seeds != 1 else ''} {self.counted}"

    def describe(self, fmt: Callable[[float], str] = "{:.3f}".format) -> str:
        """One line: the mean (of the reached seeds), the interval with its unbounded ends, and
        how many seeds reached, e.g. ``0.600 (95 % interval unbounded .. 0.812; 4 of 5 seeds
        reached, the mean is theirs)``."""
        if self.mean is None:
            return f"n/a ({self.label()})"
        if self.seeds < 2:
            ci = "one seed: no interval"
        else:
            low, high = self.interval_ends(fmt)
            ci = f"95 % interval {low} .. {high}"
        theirs = ", the mean is theirs" if self.missing else ""
        return f"{fmt(self.mean)} ({ci}; {self.label()}{theirs})"

    def interval_ends(self, fmt: Callable[[float], str] = "{:.3f}".format) -> tuple[str, str]:
        """The interval's ends as text: ``unbounded`` where a miss left it so, ``n/a`` under two
        reached values."""
        side = self.unbounded

        def end(value: float | None, which: str) -> str:
            if side in (which, "both"):
                return "unbounded"
            return "n/a" if value is None else fmt(value)

        return end(self.ci_low, "low"), end(self.ci_high, "high")

    def as_dict(self) -> dict[str, object]:
        return {"mean": self.mean, "ci_low": self.ci_low, "ci_high": self.ci_high, "n": self.n,
                "missing": self.missing, "seeds": self.seeds, "reached": self.label(),
                "mean_of": f"{self.counted} seeds", "unbounded": self.unbounded, "values": list(self.values)}


def spread(values: Iterable[float | None], *, miss: Miss = "unknown",
           counted: Counted = "reached") -> Spread:
    """Summarise per-seed values; ``None`` entries are missing: counted, never dropped unseen, and
    the interval is unbounded on their side (``miss``; both ends when ``"unknown"``). ``counted``
    says what a seed with a value did (:attr:`Spread.counted`): a gap is ``"measured"``."""
    if miss not in ("low", "high", "unknown"):
        raise ValueError(f"miss must be 'low', 'high' or 'unknown', got {miss!r}")
    if counted not in ("reached", "measured"):
        raise ValueError(f"counted must be 'reached' or 'measured', got {counted!r}")
    seen = list(values)
    got = tuple(float(v) for v in seen if v is not None)
    missing = len(seen) - len(got)
    if any(not math.isfinite(v) for v in got):
        raise ValueError(f"values must be finite, got {got}")
    if not got:
        return Spread(0, missing, None, None, None, (), miss, counted)
    mean = statistics.fmean(got)
    low: float | None = None
    high: float | None = None
    if len(got) >= 2:
        half = t_975(len(got) - 1) * statistics.stdev(got) / math.sqrt(len(got))
        low, high = mean - half, mean + half
    if missing and miss in ("low", "unknown"):
        low = None
    if missing and miss in ("high", "unknown"):
        high = None
    return Spread(len(got), missing, mean, low, high, got, miss, counted)
