"""A coordinator stopped in-process the way SIGKILL stops one, for the recovery tests."""

from __future__ import annotations

import asyncio

from vcasync.coordinator import Coordinator


async def crash(coord: Coordinator) -> None:
    """No drain, no final snapshot (the journal holds what came after the last one), and the
    run's prefix neither renewed nor released: a new coordinator on the storage takes it over."""
    assert coord._runner is not None
    coord._runner.cancel()
    await asyncio.gather(coord._runner, return_exceptions=True)
    coord._abandon_prefix()
    coord._phase = "closed"
