"""Shared fixtures for the coordinator area: a virtual clock."""

from __future__ import annotations

import pytest


class FakeClock:
    """A clock that moves only when told to: lease expiry is tested in virtual time."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
