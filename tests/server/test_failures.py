"""Issue 13 through the real Worker against a real coordinator and server on 127.0.0.1: a hung trainer
does not keep its unit from an idle worker, and a raising trainer (restarted by a supervisor with the
same state dir) is backed off, then quarantined, and never gets the unit parked."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path

import pytest
import torch

from vcasync.errors import TrainerError, WorkerQuarantinedError
from vcasync.ledger._units import make_units
from vcasync.trainer import TrainContext, TrainResult

from .conftest import running, tiny_model
from .test_worker import make_trainer, worker


async def test_a_hung_trainer_does_not_keep_its_unit_from_an_idle_worker(tmp_path: Path) -> None:
    entered, gate = threading.Event(), threading.Event()

    def hung(ctx: TrainContext) -> TrainResult:
        ctx.report_progress(1, 8)
        entered.set()
        gate.wait(30)            # hangs past the deadline, ignoring the stop; heartbeats go on
        return ctx.result({k: v + 0.5 for k, v in ctx.model.items()})

    async with running(tmp_path, units=make_units(1, steps=3), lease_timeout_s=1.0,
                       coordinator={"expiry_interval_s": 0.1}) as (coord, server):
        stuck = asyncio.create_task(worker(server.url, tmp_path / "hung", hung).run())
        try:
            assert await asyncio.to_thread(entered.wait, 30)
            healthy = await asyncio.wait_for(worker(server.url, tmp_path / "ok", make_trainer()).run(), 30)
            assert healthy.reason == "finished"
            assert healthy.results_accepted == 1          # the idle worker got the unit
            status = coord.status()
            assert status["units"] == {"queued": 0, "leased": 0, "done": 1, "parked": 0}
            assert status["leases"]["revived"] == 0       # no heartbeat without progress revived it
            assert status["leases"]["expired"] == 1
        finally:
            gate.set()
        late = await asyncio.wait_for(stuck, 30)
        assert late.results_accepted == 0                 # its late result came second: not merged
        assert late.results_refused == 1
        assert coord.status()["metrics"]["merges"] == 1


async def test_a_raising_trainer_is_backed_off_then_quarantined_and_never_parks(tmp_path: Path) -> None:
    calls: list[float] = []

    def broken(ctx: TrainContext) -> TrainResult:
        calls.append(time.monotonic())
        raise RuntimeError("boom")

    cfg = {"worker_backoff_s": 0.2, "quarantine_after": 4, "max_attempts": 2}
    async with running(tmp_path, units=make_units(1, steps=2), coordinator=cfg) as (coord, server):
        outcomes: list[str] = []
        message = ""
        for _ in range(5):          # a supervisor restarting the worker with the same state dir
            try:
                await asyncio.wait_for(worker(server.url, tmp_path / "bad", broken).run(), 30)
                outcomes.append("finished")
            except TrainerError:
                outcomes.append("trainer")
            except WorkerQuarantinedError as exc:
                outcomes.append("quarantined")
                message = str(exc)
                break
        assert outcomes == ["trainer", "quarantined"]
        assert "quarantined" in message
        assert "boom" in message
        assert len(calls) == 4
        gaps = [b - a for a, b in itertools.pairwise(calls)]
        assert min(gaps) >= 0.15, gaps                     # backed off: never three failures in 14 ms
        status = coord.status()
        assert status["units"]["parked"] == 0              # one worker never gets a unit parked
        assert status["workers"]["quarantined"] == 1
        (record,) = status["failing_workers"].values()
        assert record["failures"] == 4
        assert "boom" in record["last_failure"]
        healthy = await asyncio.wait_for(worker(server.url, tmp_path / "ok", make_trainer()).run(), 30)
        assert healthy.results_accepted == 1
        assert coord.status()["units"]["done"] == 1


async def test_a_worker_whose_trainer_failed_every_unit_does_not_end_as_finished(tmp_path: Path) -> None:
    # Found by a probe: two workers whose trainer always raises got the unit parked, heard "the run
    # is finished" and returned a plain "finished" report: `vcasync worker` exited 0, as a success.
    def broken(ctx: TrainContext) -> TrainResult:
        raise RuntimeError("boom")

    cfg = {"worker_backoff_s": 0.2, "max_attempts": 2, "park_after_workers": 2}
    async with running(tmp_path, units=make_units(1, steps=2), coordinator=cfg) as (coord, server):
        outcomes = await asyncio.gather(
            *(asyncio.wait_for(worker(server.url, tmp_path / f"bad{i}", broken).run(), 30)
              for i in range(2)), return_exceptions=True)
        assert coord.status()["units"]["parked"] == 1
        for outcome in outcomes:
            assert isinstance(outcome, TrainerError), outcome
            assert "delivered no result" in str(outcome)
            assert "failed all 1 unit(s)" in str(outcome)
        # a worker that delivered what it got ends as finished, as before
        healthy = await asyncio.wait_for(worker(server.url, tmp_path / "ok", make_trainer()).run(), 30)
        assert healthy.reason == "finished"


async def test_a_worker_whose_only_result_was_refused_as_non_finite_did_not_deliver(tmp_path: Path) -> None:
    # Found by a probe: `vcasync worker --max-units 1` whose trainer returned NaN weights logged
    # "done (max_units): 0 accepted, 1 refused" and exited 0, though the help says exit 1 when the
    # trainer failed every unit and docs/trainer.md counts such a refusal as the trainer's failure
    def nan(ctx: TrainContext) -> TrainResult:
        net = tiny_model()
        ctx.model.load_into(net)
        with torch.no_grad():
            next(iter(net.parameters())).fill_(float("nan"))
        return ctx.result(net, steps=ctx.unit.steps)

    async with running(tmp_path, units=make_units(2, steps=2)) as (coord, server):
        with pytest.raises(TrainerError, match=r"delivered no result: its trainer failed all 1 unit"):
            await asyncio.wait_for(worker(server.url, tmp_path / "nan", nan, max_units=1).run(), 30)
        assert coord.status()["metrics"]["merges"] == 0
        # a result refused for what is not the trainer's doing (a late one, as above) still counts
        # as delivered; and a worker whose result was merged ends as before
        healthy = await asyncio.wait_for(worker(server.url, tmp_path / "ok", make_trainer(),
                                                max_units=1).run(), 30)
        assert healthy.results_accepted == 1
