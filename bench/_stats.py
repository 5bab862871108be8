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


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (0 or -1 repetitions ended in 'no median for empty
    data', a negative fleet in a hang)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def positive_ints(text: str) -> str:
    """An argparse type: comma-separated whole numbers >= 1, kept as the text."""
    for part in text.split(","):
        positive_int(part)
    return text
