"""Waiting on real processes in tests: one polling loop, with what it waited for in its failure."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(what: str, predicate: Callable[[], object], timeout: float = 120.0,
               every: float = 0.05) -> None:
    """Return once ``predicate()`` is true; ``AssertionError`` naming ``what`` after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
