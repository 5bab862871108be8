"""Spreads for honest figures: every headline ratio is printed and saved with the min, median and
max of its repetitions, so a reader sees how much a noisy machine moved it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float], digits: int = 3) -> list[float]:
    """``[min, median, max]`` of ``values`` (all of them: no repetition is dropped)."""
    if not values:
        raise ValueError("no repetitions to summarise")
    return [round(min(values), digits), round(statistics.median(values), digits),
            round(max(values), digits)]


def show(values: Sequence[float], digits: int = 2) -> str:
    """``median (min-max)`` for a table cell."""
    lo, mid, hi = spread(values, digits)
    return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"
