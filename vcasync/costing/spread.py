"""Mean and a 95 % interval over seeds, so no headline figure is a single point.

The interval is Student's t on the seeds' values (``mean +/- t(0.975, n-1) * sd / sqrt(n)``): with five
seeds the half-width is 1.24 standard deviations, which is what a reader should see beside the mean.
Values that do not exist (a run that never reached its target) are not values: they are counted in
``missing`` and make the summary :attr:`Spread.complete` false, so a caller can never average them
away silently.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Spread", "spread", "t_975"]

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom; beyond that the normal 1.96
# is within 2 %.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def t_975(dof: int) -> float:
    """The 97.5 % quantile of Student's t with ``dof`` degrees of freedom (``dof >= 1``)."""
    if dof < 1:
        raise ValueError(f"need at least one degree of freedom, got {dof}")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


@dataclass(frozen=True, slots=True)
class Spread:
    """``n`` values' mean, 95 % interval (None under two values) and how many were missing."""

    n: int
    missing: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    values: tuple[float, ...]

    @property
    def complete(self) -> bool:
        """True when every seed produced a value (no run missed its target)."""
        return self.missing == 0 and self.n > 0

    def as_dict(self) -> dict[str, object]:
        return {"mean": self.mean, "ci_low": self.ci_low, "ci_high": self.ci_high, "n": self.n,
                "missing": self.missing, "values": list(self.values)}


def spread(values: Iterable[float | None]) -> Spread:
    """Summarise per-seed values; ``None`` entries are counted as missing, never dropped unseen."""
    seen = list(values)
    got = tuple(float(v) for v in seen if v is not None)
    missing = len(seen) - len(got)
    if any(not math.isfinite(v) for v in got):
        raise ValueError(f"values must be finite, got {got}")
    if not got:
        return Spread(0, missing, None, None, None, ())
    mean = statistics.fmean(got)
    if len(got) < 2:
        return Spread(1, missing, mean, None, None, got)
    half = t_975(len(got) - 1) * statistics.stdev(got) / math.sqrt(len(got))
    return Spread(len(got), missing, mean, mean - half, mean + half, got)
