"""The suite's order: files that hold a ``slow`` test first, each file's tests together and in their
own order.

pytest-xdist (``--dist loadfile``, see pyproject.toml) hands files to its processes in this order,
each to the next process that is free: a slow file handed out last kept one process busy for
minutes after the other had finished (the longest first is the classic remedy for that tail).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first: dict[Path, int] = {}
    slow: set[Path] = set()
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
        if item.get_closest_marker("slow") is not None:
            slow.add(item.path)
    items.sort(key=lambda item: (item.path not in slow, first[item.path]))
