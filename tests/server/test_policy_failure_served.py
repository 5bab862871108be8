"""A merge policy that raises on every result, served to a real worker over HTTP: the coordinator
refuses 3 results, then stops with PolicyFailedError naming the policy (in /v1/status and as what
``wait_finished`` raises: ``vcasync coordinator`` exits 2). It used to refuse the same unit ~50
times a second, forever, with one ERROR traceback each (probe D7)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from vcasync.coordinator._merger import POLICY_FAILURE_LIMIT
from vcasync.errors import PolicyFailedError
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy

from .conftest import running
from .test_worker import make_trainer, worker


def raiser():
    class Raiser(type(build_policy("vcasgd"))):     # type: ignore[misc]
        name = "raiser"

        def merge(self, model, update, state):
            raise RuntimeError("raiser policy exploded")

    return Raiser()


async def test_a_policy_that_always_raises_stops_the_served_run_after_three_results(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with running(tmp_path, units=make_units(3, steps=2), policy=raiser()) as (coord, server):
        before = coord.model()
        w = asyncio.ensure_future(worker(server.url, tmp_path / "w", make_trainer()).run())
        try:
            with caplog.at_level(logging.ERROR, "vcasync.coordinator"), \
                    pytest.raises(PolicyFailedError) as stopped:
                await asyncio.wait_for(coord.wait_finished(), 30)
        finally:
            w.cancel()
            with contextlib.suppress(BaseException):
                await w
        assert stopped.value.policy == "raiser"
        assert coord.metrics.results["rejected"] == POLICY_FAILURE_LIMIT
        assert coord.metrics.results["accepted"] == 0
        assert coord.version == 0
        assert coord.model().equal(before)
        status = coord.status()
        assert status["phase"] == "failed"
        assert "merge policy 'raiser' failed on 3 results in a row" in status["error"]
        tracebacks = [r for r in caplog.records
                      if r.name == "vcasync.coordinator" and r.exc_info]
        assert len(tracebacks) == 1          # the first failure's; not one per refused result
