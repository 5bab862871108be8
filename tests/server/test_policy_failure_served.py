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
from vcasync.errors import PolicyFailedError, UpdateRejectedError
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy

from .conftest import running
from .test_worker import eventually, make_trainer, worker


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


def locks_out(after: int):
    """A policy that accepts ``after`` results, then refuses every one (``norm_outlier``), as gate
    did once honest results drifted outside the statistics it learnt from the first few: refused
    results leave its state as it was, so it refuses them again for ever. Its count is in its
    state, so a replay refuses exactly what the live run refused."""
    class LocksOut(type(build_policy("vcasgd"))):     # type: ignore[misc]
        name = "locks_out"

        def init_state(self, model):
            return {**super().init_state(model), "taken": 0}

        def merge(self, model, update, state):
            if state["taken"] >= after:
                raise UpdateRejectedError(f"delta norm 3.3 is more than 3.0 spreads above the "
                                          f"running mean 1.3 (after {after} results)",
                                          reason="norm_outlier")
            state["taken"] += 1
            return super().merge(model, update, state)

    return LocksOut()


FAST_REFUSALS = {"policy_refusal_limit": 6, "worker_backoff_s": 0.01, "worker_backoff_max_s": 0.02}


async def test_a_policy_that_refuses_the_whole_fleet_stops_the_served_run(tmp_path: Path) -> None:
    # Found by a probe: gate (on fedbuff, warmup=2) accepted 4 results, then refused every result
    # of 2 honest workers as norm_outlier, ~1,000 in 150 s, and the run hung for ever.
    async with running(tmp_path, units=make_units(8, steps=2), policy=locks_out(2),
                       coordinator=FAST_REFUSALS) as (coord, server):
        ws = [asyncio.ensure_future(worker(server.url, tmp_path / f"w{i}", make_trainer()).run())
              for i in (1, 2)]
        try:
            with pytest.raises(PolicyFailedError) as stopped:
                await asyncio.wait_for(coord.wait_finished(), 60)
        finally:
            for w in ws:
                w.cancel()
            for w in ws:
                with contextlib.suppress(BaseException):
                    await w
        assert stopped.value.policy == "locks_out"
        message = str(stopped.value)
        assert "refused 6 results in a row from 2 workers" in message
        assert "norm_outlier" in message
        assert "--reset-policy" in message
        assert coord.metrics.results["accepted"] == 2
        assert coord.metrics.results["rejected"] == 6
        assert coord.version == 2
        merged = coord.model()
        assert coord.status()["phase"] == "failed"
    # the stop lost nothing it acknowledged: a start on the same storage has both merged results
    async with running(tmp_path, units=make_units(8, steps=2), policy=locks_out(2),
                       coordinator=FAST_REFUSALS) as (again, _):
        assert again.version == 2
        assert again.model().equal(merged)


async def test_one_refused_worker_alone_never_stops_the_run(tmp_path: Path) -> None:
    # an attacker the policy rightly refuses, alone: past the limit, the run still serves
    async with running(tmp_path, units=make_units(4, steps=2), policy=locks_out(0),
                       coordinator=FAST_REFUSALS) as (coord, server):
        w = asyncio.ensure_future(worker(server.url, tmp_path / "w", make_trainer()).run())
        try:
            await eventually(lambda: coord.metrics.results["rejected"] >= 2 * 6 or w.done())
        finally:
            w.cancel()
            with contextlib.suppress(BaseException):
                await w
        assert coord.metrics.results["rejected"] >= 2 * 6
        assert coord.status()["phase"] == "running"
        assert coord.version == 0


async def test_one_worker_the_policy_refuses_is_backed_off_once_its_unit_cannot_park(tmp_path: Path) -> None:
    # found by a probe: one worker, fewer than park_after_workers (3), a policy refusing every result:
    # the unit could not park and the refusal did not back the worker off, so it was leased again
    # at once, ~20 refusals a second, for ever. After max_attempts refusals of the unit the worker
    # now backs off as a failing one does (doubling, up to worker_backoff_max_s), not quarantined.
    config = {"max_attempts": 3, "worker_backoff_s": 0.05, "worker_backoff_max_s": 0.1}
    async with running(tmp_path, units=make_units(1, steps=2), policy=locks_out(0),
                       coordinator=config) as (coord, server):
        w = asyncio.ensure_future(worker(server.url, tmp_path / "w", make_trainer()).run())
        try:
            await eventually(lambda: coord.metrics.results["rejected"] >= 5 or w.done())
        finally:
            w.cancel()
            with contextlib.suppress(BaseException):
                await w
        assert coord.metrics.results["rejected"] >= 5
        ledger = coord.status()
        assert ledger["phase"] == "running"
        assert ledger["units"]["parked"] == 0                      # one worker cannot park it
        assert coord._ledger.stats["backoffs"] >= 2, coord._ledger.stats   # refusals 3, 4, ...
        (me,) = coord._ledger._workers.values()
        assert me.quarantined is None
