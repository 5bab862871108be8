"""The worker loop in-process against a real coordinator and server on 127.0.0.1: full runs,
preemption (checkpoint and partial), resuming a lease from the state dir, a coordinator that is down or
forgot our token, results spooled and re-sent, trainers that fail or ignore the stop."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import random
import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vcasync.errors import ConfigError, StateInUseError, TrainerError
from vcasync.ledger._units import make_units
from vcasync.retry import RetryPolicy
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import TokenAuthority
from vcasync.server._routes import HTTP_METRICS
from vcasync.tensors import ModelState
from vcasync.trainer import TrainContext, TrainResult
from vcasync.worker import Worker, WorkerConfig, WorkerReport

from .conftest import SECRET, running, tiny_model

FAST = RetryPolicy(base_delay_s=0.02, max_delay_s=0.2)
StepHook = Callable[[TrainContext, int], None]


def make_trainer(hook: StepHook | None = None, log: list[dict[str, Any]] | None = None
                 ) -> Callable[[TrainContext], TrainResult]:
    """A trainer that nudges every parameter per step and checkpoints when told to stop."""

    def train(ctx: TrainContext) -> TrainResult:
        net = tiny_model()
        ctx.model.load_into(net)
        start = 0
        ck = ctx.load_checkpoint()
        if ck is not None:
            net.load_state_dict(ck["model"])
            start = int(ck["step"])
        if log is not None:
            log.append({"unit": ctx.unit.unit_id, "lease": ctx.lease_id, "resumed": ctx.resumed,
                        "start": start})
        for step in range(start, ctx.unit.steps):
            if ctx.should_stop:
                ctx.save_checkpoint({"model": net.state_dict(), "step": step})
                return ctx.result(net, steps=step, samples=step * 8)
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(0.01)
            ctx.report_progress(step + 1, (step + 1) * 8)
            if hook is not None:
                hook(ctx, step)
        return ctx.result(net, steps=ctx.unit.steps, samples=ctx.unit.steps * 8)

    return train


def worker(url: str, state_dir: Path, trainer: Callable[..., Any], **cfg: Any) -> Worker:
    return Worker(url, trainer, state_dir=state_dir, join_secret=SECRET,
                  config=WorkerConfig(backoff=FAST, **cfg))


async def eventually(predicate: Callable[[], bool], attempts: int = 1500) -> None:
    """Poll ``predicate`` (every 20 ms, up to 30 s): for states only the file system shows."""
    for _ in range(attempts):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the condition never came true")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Blocker:
    """A step hook that parks the trainer at ``at_step`` of its first unit until released or stopped."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step
        self.reached = threading.Event()
        self.release = threading.Event()
        self.ignore_stop = False
        self.fired = False

    def __call__(self, ctx: TrainContext, step: int) -> None:
        if self.fired or step != self.at_step:
            return
        self.fired = True
        self.reached.set()
        while not self.release.is_set():
            if ctx.should_stop and not self.ignore_stop:
                return
            self.release.wait(0.01)

    async def wait_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 30), "the trainer never reached the step"


async def started(url: str, state_dir: Path, blocker: Blocker, log: list[dict[str, Any]] | None = None,
                  **cfg: Any) -> tuple[Worker, asyncio.Task[WorkerReport]]:
    """A worker running, its trainer held at ``blocker``'s step."""
    w = worker(url, state_dir, make_trainer(blocker, log), **cfg)
    task = asyncio.create_task(w.run())
    await blocker.wait_reached()
    return w, task


async def preempted(url: str, state_dir: Path, blocker: Blocker, log: list[dict[str, Any]] | None = None,
                    **cfg: Any) -> WorkerReport:
    """A worker asked to stop (a preemption notice) once its trainer reached ``blocker``'s step."""
    w, task = await started(url, state_dir, blocker, log, **cfg)
    w.request_stop()
    return await task


def units_done(coord: Any) -> int:
    units = coord.status()["units"]
    return int(units["done"]) if isinstance(units, dict) else -1


async def test_worker_runs_until_finished(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(3, steps=4)) as (coord, server):
        v0 = coord.version
        report = await worker(server.url, tmp_path / "w", make_trainer()).run()
        assert report.reason == "finished"
        assert report.results_accepted == 3
        assert report.results_refused == 0
        await coord.wait_finished()
        assert coord.version > v0
    state = tmp_path / "w"
    assert not (state / "lease.json").exists()
    assert list((state / "results").iterdir()) == []
    assert (state / "identity.json").stat().st_mode & 0o077 == 0  # the token file is private


async def test_a_worker_with_no_work_to_lease_says_so_while_it_waits(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a probe: a worker told "no work now, ask again" (every unit leased elsewhere, or the
    run finishing) asked again silently for as long as it lasted, and looked hung."""
    caplog.set_level(logging.INFO, logger="vcasync.worker")
    async with running(tmp_path, units=make_units(1, steps=4)) as (coord, server):
        blocker = Blocker(at_step=1)
        _, task = await started(server.url, tmp_path / "a", blocker)
        second = asyncio.create_task(worker(server.url, tmp_path / "b", make_trainer()).run())
        await eventually(lambda: "no work to lease now" in caplog.text)
        assert "no queued work; 1 units are leased" in caplog.text
        blocker.release.set()
        assert (await task).results_accepted == 1
        assert (await second).reason == "finished"
        await coord.wait_finished()
        assert "work again after" not in caplog.text        # it never got work: none was left


async def test_preempted_worker_keeps_the_lease_and_resumes_it(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(2, steps=20)) as (coord, server):
        log: list[dict[str, Any]] = []
        report = await preempted(server.url, tmp_path / "w", Blocker(at_step=5), log)
        assert report.reason == "preempted"
        assert not report.grace_exceeded
        assert report.results_accepted == 0
        assert (tmp_path / "w" / "lease.json").exists()
        # found by a probe: it told the coordinator nothing, so the status showed it alive and
        # holding its lease (then gone), never preempted, with no event for the preemption
        (row,) = coord.live_status()["worker_rows"]
        assert row["state"] == "preempted"
        assert coord.status()["workers"]["alive"] == 0         # counted preempted, not alive too
        assert coord.status()["units"]["leased"] == 1          # the lease stays, for the resume
        (event,) = [e for e in coord.activity.events() if e.kind == "preempted"]
        assert "stays until a restart resumes it" in event.detail
        assert len(list((tmp_path / "w" / "checkpoints").iterdir())) == 1

        again = await worker(server.url, tmp_path / "w", make_trainer(None, log)).run()
        assert again.reason == "finished"
        assert again.results_accepted == 2
        assert log[1]["lease"] == log[0]["lease"]
        assert log[1]["resumed"] is True
        assert log[1]["start"] == 6  # the checkpoint saved when it stopped after step index 5
        assert again.worker_id == report.worker_id  # same identity from the state dir
        assert units_done(coord) in (2, -1)


async def test_a_checkpoint_another_model_wrote_is_refused_naming_the_tensor_and_the_file(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a probe: a lease resumed from a checkpoint of another model shape (the model
    changed, a stale --state-dir reused) failed deep in the trainer with torch's "size mismatch for
    0.weight". Now ctx.load_checkpoint refuses it with a ConfigError naming the tensor, both shapes
    and the file: the worker hands the unit back (dropping that checkpoint) and stops (exit 2)."""
    async with running(tmp_path, units=make_units(1, steps=20), lease_timeout_s=300) as (coord, server):
        log: list[dict[str, Any]] = []
        report = await preempted(server.url, tmp_path / "w", Blocker(at_step=5), log)
        assert report.reason == "preempted"
        (ckpt,) = (tmp_path / "w" / "checkpoints").iterdir()
        other = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        torch.save({"model": other.state_dict(), "step": 6}, ckpt)

        with pytest.raises(ConfigError) as info:
            await asyncio.wait_for(worker(server.url, tmp_path / "w", make_trainer(None, log)).run(), 60)
        message = str(info.value)
        assert f"the checkpoint {ckpt} of lease {log[0]['lease']} was not written for this run's " \
               "model: tensor '0.weight' is shape (3, 5) float32 in the checkpoint, the model's is " \
               "shape (3, 4) float32" in message
        assert f"the unit must start over without it: a worker drops it as it hands the lease " \
               f"back; otherwise remove {ckpt}, or start with a fresh --state-dir" in message
        assert "size mismatch" not in caplog.text
        assert "configuration error: the checkpoint" in caplog.text
        assert len(log) == 1                     # the trainer never got past load_checkpoint
        assert not ckpt.exists()                 # handed back with the lease: a restart starts over
        units = coord.status()["units"]
        assert isinstance(units, dict)
        assert units.get("queued") == 1, units

        again = await asyncio.wait_for(worker(server.url, tmp_path / "w", make_trainer(None, log)).run(), 60)
        assert (again.reason, again.results_accepted) == ("finished", 1)
        assert log[1]["start"] == 0


def test_load_checkpoint_checks_only_a_model_entry_named_as_the_model(tmp_path: Path) -> None:
    """What the shape check leaves alone: a checkpoint of the same model (another dtype too), one
    with no "model" entry, and a "model" entry named otherwise (a trainer's own scheme); a tensor
    the model does not have is refused."""
    ctx = _context(tmp_path)
    net = tiny_model()
    for state in ({"model": net.state_dict(), "step": 1},
                  {"model": {k: v.double() for k, v in net.state_dict().items()}, "step": 1},
                  {"weights": torch.ones(3)}, {"model": {"module.0.weight": torch.ones(1)}},
                  {"model": "a path"}):
        torch.save(state, tmp_path / "ck")
        assert ctx.load_checkpoint() is not None
    torch.save({"model": {**net.state_dict(), "3.weight": torch.ones(2, 2)}}, tmp_path / "ck")
    with pytest.raises(ConfigError, match=re.escape("its model holds 1 tensor(s) the model does not "
                                                    "have: '3.weight'")):
        ctx.load_checkpoint()


async def test_a_second_worker_on_a_state_dir_in_use_waits_for_it_then_is_refused(tmp_path: Path) -> None:
    # Found by a probe: a second live worker on the same --state-dir took the same identity and
    # resumed the lease the first was training; both wrote checkpoints for it, and one deleted
    # the other's spooled result under it (a FileNotFoundError traceback, exit 1).
    async with running(tmp_path, units=make_units(2, steps=20)) as (_, server):
        blocker, log = Blocker(at_step=5), []
        first, task = await started(server.url, tmp_path / "w", blocker, log)
        second = worker(server.url, tmp_path / "w", make_trainer(None, log))
        second.state.lock_wait_s = 0.3
        with pytest.raises(StateInUseError, match=r"in use by a live worker \(pid \d+ on host") as info:
            await second.run()
        assert info.value.url == str(tmp_path / "w")
        assert len(log) == 1                                # it touched nothing

        # a restart while the first wraps up (a supervisor during the grace period) waits for it
        third = worker(server.url, tmp_path / "w", make_trainer(None, log))
        later = asyncio.create_task(third.run())
        await asyncio.sleep(0.3)
        assert len(log) == 1
        assert not later.done()
        first.request_stop()
        assert (await task).reason == "preempted"
        report = await later
        assert (report.reason, report.results_accepted) == ("finished", 2)
        assert (log[1]["lease"], log[1]["resumed"]) == (log[0]["lease"], True)


async def test_a_run_reached_at_another_address_keeps_the_identity_and_the_lease(tmp_path: Path) -> None:
    # Found by a probe: the saved identity was keyed by the exact URL, so the same coordinator on a
    # new port (a restart), or by a hostname for its address, got a new worker: its lease was not
    # resumed, its checkpoint dropped, and the unit waited for the old lease to expire.
    auth = TokenAuthority(join_secret=SECRET)        # kept, as a coordinator keeps tokens on storage
    async with running(tmp_path, units=make_units(2, steps=20), authority=auth) as (coord, server):
        log: list[dict[str, Any]] = []
        first = await preempted(server.url, tmp_path / "w", Blocker(at_step=5), log)
        saved = json.loads((tmp_path / "w" / "identity.json").read_text())
        assert saved["run_id"] == coord.run_id
        await server.aclose()
        port = free_port()
        async with Server(coord, auth, ServerConfig(port=port)):
            again = await worker(f"http://localhost:{port}", tmp_path / "w", make_trainer(None, log)).run()
        assert again.worker_id == first.worker_id
        assert again.results_accepted == 2
        assert (log[1]["lease"], log[1]["resumed"], log[1]["start"]) == (log[0]["lease"], True, 6)
        saved = json.loads((tmp_path / "w" / "identity.json").read_text())
        assert (saved["coordinator"], saved["run_id"]) == (f"http://localhost:{port}", coord.run_id)


async def test_an_identity_of_another_run_is_not_sent_there_and_an_old_one_learns_its_run(
        tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with running(tmp_path / "a", units=make_units(2, steps=2)) as (coord_a, server_a):
        first = await worker(server_a.url, tmp_path / "w", make_trainer(), max_units=1).run()
        # an identity.json written before identities named their run: kept at its own URL, and
        # given the run it is used in
        ident = tmp_path / "w" / "identity.json"
        old = json.loads(ident.read_text())
        ident.write_text(json.dumps({k: old[k] for k in ("coordinator", "worker_id", "token")}))
        again = await worker(server_a.url, tmp_path / "w", make_trainer()).run()
        assert again.worker_id == first.worker_id
        assert json.loads(ident.read_text())["run_id"] == coord_a.run_id
    async with running(tmp_path / "b", units=make_units(1, steps=2)) as (coord_b, server_b):
        other = await worker(server_b.url, tmp_path / "w", make_trainer()).run()
        assert other.worker_id != first.worker_id       # another run: joined anew ...
        assert server_b.app[HTTP_METRICS].auth_failures == 0   # ... without showing run a's token
        assert json.loads(ident.read_text())["run_id"] == coord_b.run_id


async def test_a_state_holding_work_of_another_run_is_refused_untouched(tmp_path: Path) -> None:
    # Found by a probe: a worker killed mid-unit on run A and restarted against run B joined B as
    # a new worker, sent A's lease id to B ("cannot be resumed ... starting fresh") and deleted the
    # lease and checkpoint: pointed back at A, the unit was lost.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    state = tmp_path / "w"
    async with running(tmp_path / "a", units=make_units(1, steps=20)) as (coord_a, server_a), \
            running(tmp_path / "b", units=make_units(1, steps=2)) as (coord_b, server_b):
        log: list[dict[str, Any]] = []
        first = await preempted(server_a.url, state, Blocker(at_step=5), log)
        before = {p.relative_to(state): p.read_bytes() for p in state.rglob("*")
                  if p.is_file() and p.name != "lock"}
        with pytest.raises(ConfigError) as info:
            await worker(server_b.url, state, make_trainer(None, log)).run()
        message = str(info.value)
        assert coord_a.run_id in message
        assert coord_b.run_id in message
        assert f"lease {log[0]['lease']}" in message
        after = {p.relative_to(state): p.read_bytes() for p in state.rglob("*")
                 if p.is_file() and p.name != "lock"}
        assert after == before                                  # nothing touched
        assert server_b.app[HTTP_METRICS].auth_failures == 0
        assert coord_b.status()["workers"]["known"] == 0       # B never saw this worker
        again = await worker(server_a.url, state, make_trainer(None, log)).run()
        assert again.worker_id == first.worker_id
        assert again.results_accepted == 1
        assert (log[1]["lease"], log[1]["resumed"], log[1]["start"]) == (log[0]["lease"], True, 6)


async def test_a_new_run_at_the_address_mid_unit_stops_the_worker_with_its_work_kept(
        tmp_path: Path) -> None:
    """Found by a probe: the coordinator stopped mid-unit and a new run was started at the same
    address; the worker's next heartbeat was refused (401), it joined the new run without a word,
    uploaded the old lease's result there ("never issued here") and dropped the lease, so pointed
    back at its run the unit was lost. The check a start makes (a state holding work of another
    run) is made at a re-join too: the worker stops with a ConfigError, its lease and checkpoint
    kept."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    state = tmp_path / "w"
    port = free_port()
    blocker = Blocker(at_step=2)
    async with running(tmp_path / "a", units=make_units(1, steps=20), lease_timeout_s=3.0,
                       server_config=ServerConfig(port=port)) as (coord_a, _):
        run_a = coord_a.run_id
        _, task = await started(f"http://127.0.0.1:{port}", state, blocker)
    async with running(tmp_path / "b", units=make_units(1, steps=2), lease_timeout_s=3.0,
                       server_config=ServerConfig(port=port)) as (coord_b, _):
        with pytest.raises(ConfigError) as info:
            await asyncio.wait_for(task, 30)
        message = str(info.value)
        assert run_a in message
        assert coord_b.run_id in message
        assert "lease" in message
        assert coord_b.status()["workers"]["known"] == 0        # it never joined run B
    assert (state / "lease.json").exists()                       # the lease is kept ...
    assert len(list((state / "checkpoints").iterdir())) == 1      # ... and its checkpoint


async def test_partial_result_on_preemption(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(1, steps=20)) as (coord, server):
        v0 = coord.version
        report = await preempted(server.url, tmp_path / "w", Blocker(at_step=4), on_preempt="partial")
        assert report.reason == "preempted"
        assert report.results_accepted == 1
        assert not (tmp_path / "w" / "lease.json").exists()
        assert coord.version >= v0
        # found by a probe: it showed alive (then gone), never preempted, with no event
        (row,) = coord.live_status()["worker_rows"]
        assert row["state"] == "preempted"
        assert [e.kind for e in coord.activity.events()].count("preempted") == 1


def stalled_trainer(started: threading.Event) -> Callable[[TrainContext], TrainResult]:
    """A trainer that never gets to its first step before it is told to stop."""

    def train(ctx: TrainContext) -> TrainResult:
        net = tiny_model()
        ctx.model.load_into(net)
        started.set()
        while not ctx.should_stop:
            ctx.stop_event.wait(0.01)
        return ctx.result(net, steps=0, samples=0)

    return train


async def test_preempted_before_the_first_step_releases_instead_of_uploading(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(1, steps=5)) as (coord, server):
        started = threading.Event()
        w = worker(server.url, tmp_path / "w", stalled_trainer(started), on_preempt="partial")
        task = asyncio.create_task(w.run())
        assert await asyncio.to_thread(started.wait, 30)
        w.request_stop()
        report = await task
        assert report.reason == "preempted"
        assert (report.results_accepted, report.results_refused) == (0, 0)
        status = coord.status()
        assert status["leases"]["released"] == 1
        assert status["metrics"]["rejects"] == {}       # nothing was sent to be refused
        assert not (tmp_path / "w" / "lease.json").exists()
        assert list((tmp_path / "w" / "results").iterdir()) == []
        again = await worker(server.url, tmp_path / "w", make_trainer()).run()
        assert (again.reason, again.results_accepted) == ("finished", 1)


async def test_grace_period_bounds_a_trainer_that_ignores_the_stop(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(1, steps=20)) as (_, server):
        blocker = Blocker(at_step=2)
        blocker.ignore_stop = True
        w = worker(server.url, tmp_path / "w", make_trainer(blocker), grace_period_s=0.3)
        task = asyncio.create_task(w.run())
        await blocker.wait_reached()
        w.request_stop()
        report = await task
        blocker.release.set()
        assert report.reason == "preempted"
        assert report.grace_exceeded
        assert (tmp_path / "w" / "lease.json").exists()


async def test_worker_waits_for_a_coordinator_that_is_down(tmp_path: Path) -> None:
    port = free_port()
    async with running(tmp_path, units=make_units(2, steps=2),
                       server_config=ServerConfig(port=port)) as (coord, server):
        await server.aclose()  # the coordinator is alive, its server is not: connection refused
        w = worker(f"http://127.0.0.1:{port}", tmp_path / "w", make_trainer())
        task = asyncio.create_task(w.run())
        await asyncio.sleep(0.3)
        assert not task.done()
        auth = TokenAuthority(join_secret=SECRET)
        async with Server(coord, auth, ServerConfig(port=port)):
            report = await asyncio.wait_for(task, 60)
        assert report.reason == "finished"
        assert report.results_accepted == 2


async def test_an_outage_logs_one_warning_a_summary_a_minute_and_the_recovery(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # found by a probe: every retry while the coordinator was down logged a WARNING ("join:
    # coordinator unreachable (ClientConnectorError); retry 17 in 9.21s"), ~800 lines an hour per
    # worker, a flood from a fleet. Now: one WARNING with the retry policy, at most one summary per
    # OUTAGE_LOG_S (shortened here so that one comes), each try at DEBUG, one INFO at the end.
    from vcasync.worker import _outage

    monkeypatch.setattr(_outage, "OUTAGE_LOG_S", 0.5)
    caplog.set_level(logging.DEBUG, logger="vcasync.worker")
    port = free_port()

    def tries() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("join: coordinator unreachable")]

    async with running(tmp_path, units=make_units(2, steps=2),
                       server_config=ServerConfig(port=port)) as (coord, server):
        await server.aclose()  # the coordinator is alive, its server is not: connection refused
        w = Worker(f"http://127.0.0.1:{port}", make_trainer(), state_dir=tmp_path / "w",
                   join_secret=SECRET, config=WorkerConfig(backoff=FAST), rng=random.Random(0))
        task = asyncio.create_task(w.run())
        await eventually(lambda: len(tries()) >= 30)
        async with Server(coord, TokenAuthority(join_secret=SECRET), ServerConfig(port=port)):
            report = await asyncio.wait_for(task, 60)
        assert (report.reason, report.results_accepted) == ("finished", 2)
    said = [r for r in caplog.records if r.getMessage().startswith("join: ")]
    loud = [r for r in said if r.levelno >= logging.WARNING]
    failed = len([r for r in said if "unreachable" in r.getMessage() and "still" not in r.getMessage()])
    assert failed >= 30
    assert len(loud) < failed / 2, [r.getMessage() for r in loud]
    first, summaries = loud[0], loud[1:]
    assert first.getMessage().startswith("join: coordinator unreachable (ClientConnectorError); retry 1 in ")
    assert "then at most 0.2 s apart, giving up after 3600 s without an answer (--give-up-after)" \
        in first.getMessage()
    assert summaries, "an outage longer than OUTAGE_LOG_S says that it goes on"
    for r in summaries:
        text = r.getMessage()
        assert re.fullmatch(r"join: coordinator still unreachable after \d+ tries over \d+ s "
                            r"\(ClientConnectorError\); next retry in [\d.]+s", text), text
    # at most one line per OUTAGE_LOG_S (the records' own clock; a little slack for the wall clock)
    gaps = [b.created - a.created for a, b in itertools.pairwise(loud)]
    assert all(gap >= 0.45 for gap in gaps), gaps
    back = [r.getMessage() for r in said if "reachable again" in r.getMessage()]
    assert len(back) == 1
    assert said[-1].levelno == logging.INFO
    assert re.fullmatch(rf"join: coordinator reachable again after \d+ s, {failed} failed tries", back[0])


async def test_a_worker_gives_up_on_a_coordinator_gone_for_good(tmp_path: Path) -> None:
    # Found by hand: a worker whose coordinator had exited for good retried "coordinator
    # unreachable ... retry 12" until killed: a spot machine billing for ever.
    from vcasync.errors import ClosedError

    slow = RetryPolicy(base_delay_s=3.0, max_delay_s=10.0)        # waits that would overshoot
    w = Worker(f"http://127.0.0.1:{free_port()}", make_trainer(), state_dir=tmp_path / "w",
               join_secret=SECRET, config=WorkerConfig(backoff=slow, give_up_after_s=0.5))
    started = asyncio.get_running_loop().time()
    with pytest.raises(ClosedError, match=r"unreachable for \d+ s \(give_up_after_s, --give-up-after\)"):
        await asyncio.wait_for(w.run(), 30)
    assert asyncio.get_running_loop().time() - started < 2.5     # not a 3-10 s backoff past it
    with pytest.raises(ConfigError, match="give_up_after_s must be > 0"):
        WorkerConfig(give_up_after_s=float("nan"))
    assert WorkerConfig(give_up_after_s=float("inf")).give_up_after_s == float("inf")


async def test_a_call_answered_storage_unavailable_between_two_outages_does_not_give_up_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a probe: ``--give-up-after`` counted from the first failure of a call, not reset
    when the coordinator answered: a join that found it unreachable, was then told ``503
    storage_unavailable`` for longer than --give-up-after, and found it unreachable once more gave
    up at that first failure ("unreachable for 7200 s") though the coordinator had answered all
    along. Every answer (a storage wait, a 401 re-join) starts the count again."""
    from vcasync.coordinator import Coordinator, CoordinatorConfig
    from vcasync.policy import build_policy
    from vcasync.server._auth import StorageTokenStore
    from vcasync.storage import open_storage
    from vcasync.testing.faults import FaultyStorage, WriteOutage

    caplog.set_level(logging.INFO, logger="vcasync.worker")
    give_up = 3.0
    port = free_port()
    switch = WriteOutage()

    def said(text: str) -> int:
        return sum(text in r.getMessage() for r in caplog.records)

    async with open_storage("memory://give-up-reset") as inner:
        storage: Any = FaultyStorage(inner, trigger=switch)
        auth = TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage))
        config = CoordinatorConfig(storage_probe_interval_s=0.05, storage_outage_limit_s=600.0)
        async with Coordinator(ModelState.from_module(tiny_model()), make_units(2, steps=2),
                               policy=build_policy("vcasgd"), storage=storage,
                               config=config) as coord:
            switch.down = True          # a join's token write fails: 503 storage_unavailable
            w = worker(f"http://127.0.0.1:{port}", tmp_path / "w", make_trainer(),
                       give_up_after_s=give_up)
            task = asyncio.create_task(w.run())
            await eventually(lambda: said("join: coordinator unreachable") == 1)   # 1st outage
            async with Server(coord, auth, ServerConfig(port=port)):
                await eventually(lambda: said("coordinator's storage unavailable, waiting") == 1)
                await asyncio.sleep(give_up + 1.0)     # answered "storage unavailable" meanwhile
            # unreachable again: a new outage, said again, not given up at its first failure
            await eventually(lambda: task.done() or said("join: coordinator unreachable") == 2)
            assert not task.done(), task.exception()
            switch.down = False
            async with Server(coord, auth, ServerConfig(port=port)):
                report = await asyncio.wait_for(task, 60)
    assert (report.reason, report.results_accepted) == ("finished", 2)


@pytest.mark.parametrize("ending", ["stopped", "gave_up"])
async def test_result_spooled_during_an_outage_is_resent_after_restart(tmp_path: Path, ending: str) -> None:
    # gave_up: the coordinator stayed away past --give-up-after, and the upload gave up. That was
    # taken for a refusal ("refused for good"): the spooled result was deleted, though the give-up
    # message promises "a restart resumes from the state kept", and the worker then asked for a
    # lease for a second give-up period.
    from vcasync.errors import CoordinatorGoneError

    port = free_port()
    auth = TokenAuthority(join_secret=SECRET)
    async with running(tmp_path, units=make_units(1, steps=3), authority=auth,
                       server_config=ServerConfig(port=port)) as (coord, server):
        loop = asyncio.get_running_loop()

        def outage(ctx: TrainContext, step: int) -> None:  # the server dies as the unit ends
            if step == ctx.unit.steps - 1:
                asyncio.run_coroutine_threadsafe(server.aclose(), loop).result(10)

        url = f"http://127.0.0.1:{port}"
        if ending == "stopped":
            w = worker(url, tmp_path / "w", make_trainer(outage), grace_period_s=0.5)
            task = asyncio.create_task(w.run())
            await eventually(lambda: bool(list((tmp_path / "w" / "results").glob("*.vca"))))
            w.request_stop()
            report = await task
            assert report.grace_exceeded
            assert report.results_accepted == 0
        else:
            w = worker(url, tmp_path / "w", make_trainer(outage), give_up_after_s=1.0)
            with pytest.raises(CoordinatorGoneError, match=r"^upload: .*unreachable for \d+ s"):
                await asyncio.wait_for(w.run(), 60)
        assert len(list((tmp_path / "w" / "results").glob("*.vca"))) == 1     # kept, not dropped
        async with Server(coord, auth, ServerConfig(port=port)):
            again = await worker(url, tmp_path / "w", make_trainer()).run()
        assert (again.reason, again.results_accepted) == ("finished", 1)
        assert list((tmp_path / "w" / "results").glob("*.vca")) == []
        await coord.wait_finished()


async def test_worker_joins_again_when_its_token_is_unknown(tmp_path: Path) -> None:
    port = free_port()
    async with running(tmp_path, units=make_units(2, steps=2),
                       server_config=ServerConfig(port=port)) as (coord, server):
        first = await worker(server.url, tmp_path / "w", make_trainer(), max_units=1).run()
        assert first.reason == "max_units"
        assert first.results_accepted == 1
        await server.aclose()
        async with Server(coord, TokenAuthority(join_secret=SECRET), ServerConfig(port=port)):
            again = await worker(f"http://127.0.0.1:{port}", tmp_path / "w", make_trainer()).run()
        assert again.reason == "finished"
        assert again.results_accepted == 1
        assert again.worker_id != first.worker_id


@pytest.mark.parametrize("kind", ["secret", "token"])
async def test_a_refused_first_join_is_a_configuration_error(tmp_path: Path, kind: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # a wrong join secret was taken for a token the coordinator forgot: "the coordinator no longer
    # knows our token; joining again", then AuthError (exit status 1) instead of a configuration error
    wrong = "not-the-join-secret-of-this-run"
    async with running(tmp_path, units=make_units(1, steps=2)) as (_, server):
        w = Worker(server.url, make_trainer(), state_dir=tmp_path / "w", config=WorkerConfig(backoff=FAST),
                   join_secret=wrong if kind == "secret" else None,
                   join_token=wrong if kind == "token" else None)
        with pytest.raises(ConfigError, match=f"the coordinator at {server.url} refused this worker's "
                                              f"join {kind} .*join refused.*: set VCASYNC_JOIN_"):
            await w.run()
    assert "no longer knows our token" not in caplog.text


async def test_failing_trainer_releases_and_gives_up(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(2, steps=2)) as (_, server):
        def broken(ctx: TrainContext) -> TrainResult:
            raise RuntimeError("boom")

        # A trainer failure is the trainer's, not a configuration error (issue 13).
        with pytest.raises(TrainerError, match="failed 3 units in a row") as ei:
            await worker(server.url, tmp_path / "w", broken).run()
        assert not isinstance(ei.value, ConfigError)


async def test_a_trainers_configuration_error_hands_the_unit_back_before_the_worker_stops(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a probe: a digits worker on an image without scikit-learn exited 2 (the trainer's
    ConfigError) holding its lease ("leased 1, released 0"): the unit sat until the lease timed out.
    Now it is handed back at once, counted against neither the unit nor the worker (the machine's
    configuration is at fault), and the worker still stops with the ConfigError."""
    def needs_a_package(ctx: TrainContext) -> TrainResult:
        raise ConfigError("the digits data set needs scikit-learn: pip install 'vcasync[examples]'")

    async with running(tmp_path, units=make_units(1, steps=2), lease_timeout_s=300) as (coord, server):
        with pytest.raises(ConfigError, match="needs scikit-learn"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", needs_a_package).run(), 60)
        status = coord.status()
        assert status["leases"]["released"] == 1
        units = status["units"]
        assert isinstance(units, dict)
        assert not units.get("leased")
        assert units.get("queued") == 1, units                  # queued again at once, not in 300 s
        assert not status["failing_workers"], status["failing_workers"]   # nobody's fault
        # nor a preemption (found by a second probe: the status showed the worker "preempted")
        (row,) = coord.live_status()["worker_rows"]
        assert row["state"] != "preempted"
        assert [e.kind for e in coord.activity.events() if e.kind in ("preempted", "released")] \
            == ["released"]
        assert not (tmp_path / "w" / "lease.json").exists()
        assert "configuration error: the digits data set needs scikit-learn" in caplog.text
        # another (well configured) worker takes it straight away and the run finishes
        report = await asyncio.wait_for(worker(server.url, tmp_path / "w2", make_trainer()).run(), 60)
        assert (report.reason, report.results_accepted) == ("finished", 1)


async def test_a_configuration_error_does_not_wait_long_on_a_coordinator_that_does_not_answer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-back of a ConfigError'd unit is best effort: the coordinator unreachable for the
    release, the worker still stops (within CONFIG_ERROR_RELEASE_S, not give_up_after_s) with the
    ConfigError, and keeps the lease in its state for a restart to resume."""
    import time

    import aiohttp

    from vcasync.worker import _client, _worker

    def needs_a_package(ctx: TrainContext) -> TrainResult:
        raise ConfigError("the digits data set needs scikit-learn")

    async def unreachable(self: Any, *args: Any, **kwargs: Any) -> None:
        raise aiohttp.ClientConnectionError("connection refused")

    monkeypatch.setattr(_client.CoordinatorClient, "release", unreachable)
    monkeypatch.setattr(_worker, "CONFIG_ERROR_RELEASE_S", 0.5)
    async with running(tmp_path, units=make_units(1, steps=2)) as (coord, server):
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="needs scikit-learn"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", needs_a_package).run(), 60)
        assert time.monotonic() - t0 < 10
        assert coord.status()["leases"]["released"] == 0
        assert (tmp_path / "w" / "lease.json").exists()          # kept: a restart resumes it
        assert "could not hand lease" in caplog.text


async def test_max_units_counts_the_units_taken_not_only_those_delivered(tmp_path: Path) -> None:
    """``--max-units 1`` with a failing trainer took 3 units (it counted only delivered ones, and
    stopped at the third failure): each lease taken counts, and having delivered none of them is an
    error, as at the end of a run."""
    tried: list[str] = []

    def broken(ctx: TrainContext) -> TrainResult:
        tried.append(ctx.unit.unit_id)
        raise RuntimeError("boom")

    async with running(tmp_path, units=make_units(4, steps=2)) as (_, server):
        with pytest.raises(TrainerError, match=r"its max_units \(1\) were taken and this worker delivered no "
                                               "result: its trainer failed all 1 unit"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", broken, max_units=1).run(), 60)
        assert len(tried) == 1
        calls: list[str] = []

        def flaky(ctx: TrainContext) -> TrainResult:        # fails its first unit, then trains
            calls.append(ctx.unit.unit_id)
            if len(calls) == 1:
                raise RuntimeError("boom")
            return make_trainer()(ctx)

        report = await asyncio.wait_for(worker(server.url, tmp_path / "w2", flaky, max_units=2).run(), 60)
        assert report.reason == "max_units"
        assert len(calls) == 2
        assert report.results_accepted == 1


async def test_each_run_of_one_worker_reports_its_own_units(tmp_path: Path) -> None:
    """Found by a probe: the counts were the Worker object's, not the run's: a second run() of a
    finished run reported "finished 2" though it delivered nothing, and a second run after max_units
    returned at once, having taken nothing."""
    trained: list[str] = []

    def train(ctx: TrainContext) -> TrainResult:
        trained.append(ctx.unit.unit_id)
        return make_trainer()(ctx)

    async with running(tmp_path, units=make_units(3, steps=2)) as (_, server):
        w = worker(server.url, tmp_path / "w", train, max_units=2)
        reports = [await asyncio.wait_for(w.run(), 60) for _ in range(3)]
    got = [(r.reason, r.results_accepted, r.results_refused, r.units_abandoned) for r in reports]
    assert got == [("max_units", 2, 0, 0), ("finished", 1, 0, 0), ("finished", 0, 0, 0)]
    assert len(trained) == 3
    assert len({r.worker_id for r in reports}) == 1


def _nan_metric(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result(sd, steps=ctx.unit.steps, loss=float("nan"))


def _not_a_number(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result(sd, steps=ctx.unit.steps, loss="abc")  # type: ignore[arg-type]


def _too_many_steps(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result(sd, steps=ctx.unit.steps * 10)


def _too_many_samples(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result(sd, steps=ctx.unit.steps, samples=2**63 - 1)


def _wrong_shape(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result({**sd, "0.bias": torch.zeros(2)}, steps=ctx.unit.steps)


def _float64(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result({k: v.double() for k, v in sd.items()}, steps=ctx.unit.steps)


def _missing(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result({k: v for k, v in sd.items() if k != "2.bias"}, steps=ctx.unit.steps)


def _numpy_value(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result({**sd, "0.bias": sd["0.bias"].numpy()},  # type: ignore[dict-item]
                      steps=ctx.unit.steps)


def _none_value(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> Any:
    return {**sd, "2.bias": None}          # a plain dict returned: the worker wraps it the same way


def _sparse(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return ctx.result({**sd, "0.weight": sd["0.weight"].to_sparse()}, steps=ctx.unit.steps)


def _meta(ctx: TrainContext, sd: dict[str, torch.Tensor]) -> TrainResult:
    return TrainResult({**sd, "0.weight": torch.empty(3, 4, device="meta")}, steps=ctx.unit.steps)


@pytest.mark.parametrize("upload", ["delta", "weights"])
@pytest.mark.parametrize(("mistake", "message"), [
    (_nan_metric, "metric 'loss' is nan: metrics must be finite numbers"),
    # found by a probe: an AttributeError("'numpy.ndarray' object has no attribute 'detach'")
    (_numpy_value, "the trained state dict's entry '0.bias' is a numpy.ndarray, not a torch.Tensor"),
    (_none_value, "the trained state dict's entry '2.bias' is a builtins.NoneType, not a torch.Tensor"),
    # found by a probe: both passed every check, then crashed the worker (RuntimeError from the
    # delta or the encoder), the lease held until it timed out
    (_sparse, "result tensor '0.weight' has layout torch.sparse_coo; the model's tensors are dense"),
    (_meta, "result tensor '0.weight' is a meta tensor, which holds no values"),
    (_not_a_number, "metric 'loss' = 'abc' is not a number"),
    (_too_many_steps, "the result claims 20 steps; unit e0-s0 has 2"),
    (_too_many_samples, "a result may count at most 2**40"),
    (_wrong_shape, "tensor '0.bias' has shape (2,), the model has (3,)"),
    (_float64, "tensor '0.weight' has dtype torch.float64, the model has torch.float32"),
    (_missing, "lacks tensor '2.bias'"),
])
async def test_a_result_the_coordinator_must_refuse_fails_the_unit_here_whatever_the_upload(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, upload: str, message: str,
        mistake: Callable[[TrainContext, dict[str, torch.Tensor]], TrainResult]) -> None:
    """Found before any upload, named, and counted as a trainer failure (not ~5 refused uploads and a
    quarantine); a float64 result is refused in both upload modes, not cast in one of them."""
    def train(ctx: TrainContext) -> TrainResult:
        net = tiny_model()
        ctx.model.load_into(net)
        return mistake(ctx, {k: v.clone() for k, v in net.state_dict().items()})

    async with running(tmp_path, units=make_units(2, steps=2)) as (coord, server):
        v0 = coord.version
        with pytest.raises(TrainerError, match="failed 1 units in a row"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", train, upload=upload,
                                          max_trainer_failures=1).run(), 60)
        assert "trainer failed on unit e0-s0: " in caplog.text
        assert message in caplog.text
        assert "refused" not in caplog.text                 # nothing was uploaded
        assert coord.version == v0
        assert not list((tmp_path / "w" / "results").iterdir())


async def test_async_trainer(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(2, steps=2)) as (_, server):
        async def train(ctx: TrainContext) -> TrainResult:
            await asyncio.sleep(0)
            ctx.report_progress(ctx.unit.steps)
            return ctx.result({k: v + 0.5 for k, v in ctx.model.items()}, samples=4)

        report = await worker(server.url, tmp_path / "w", train).run()
        assert report.reason == "finished"
        assert report.results_accepted == 2


async def test_model_cache_is_revalidated_with_the_etag(tmp_path: Path) -> None:
    calls: list[str] = []
    inner = make_trainer()

    def flaky(ctx: TrainContext) -> TrainResult:  # fails once: the next lease has the same base version
        calls.append(ctx.model.digest())
        if len(calls) == 1:
            raise RuntimeError("first try fails")
        return inner(ctx)

    async with running(tmp_path, units=make_units(2, steps=2)) as (_, server):
        report = await worker(server.url, tmp_path / "w", flaky).run()
        assert report.reason == "finished"
        assert report.results_accepted == 2
        hits = server.app[HTTP_METRICS].requests
        assert hits.get(("model", "GET", 304), 0) >= 1  # the cached v0 was revalidated, not re-sent
    assert calls[0] == calls[1]


async def test_a_new_run_on_the_same_url_replaces_cached_models(tmp_path: Path) -> None:
    port = free_port()
    seen: list[str] = []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    def record(ctx: TrainContext, step: int) -> None:
        if step == 0:
            seen.append(ctx.model.digest())

    async with running(tmp_path / "a", units=make_units(2, steps=2),
                       server_config=ServerConfig(port=port)) as (coord, server):
        first = coord.model(0).digest()
        await worker(server.url, tmp_path / "w", make_trainer(record), max_units=1).run()
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    async with running(tmp_path / "b", units=make_units(2, steps=2), server_config=ServerConfig(port=port),
                       initial=other) as (coord, server):
        second = coord.model(0).digest()
        assert second != first
        await worker(server.url, tmp_path / "w", make_trainer(record), max_units=1).run()
    assert seen == [first, second]


async def test_digits_example_learns(tmp_path: Path) -> None:
    from vcasync.examples import digits

    torch.manual_seed(0)
    net = digits.model()
    before = digits.evaluate(net)
    async with running(tmp_path, units=make_units(2, epochs=3, steps=40), initial=net) as (coord, server):
        report = await worker(server.url, tmp_path / "w", digits.train).run()
        assert report.results_accepted == 6
        after = digits.evaluate(coord.model())
    assert after > max(0.5, before + 0.3), (before, after)


# --- integer tensors: counters count every step, whatever the upload mode ----------------------


def bn_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU(),
                               torch.nn.Linear(3, 2))


def bn_trainer(barrier: threading.Barrier | None = None) -> Callable[[TrainContext], TrainResult]:
    """Real training steps in train mode: each forward pass counts one BatchNorm batch.

    With ``barrier``, every worker's first unit waits for the others to have leased theirs, so the
    units overlap (all based on the same version)."""

    def train(ctx: TrainContext) -> TrainResult:
        if barrier is not None:
            barrier.wait(timeout=30)
        net = bn_model()
        ctx.model.load_into(net)
        net.train()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(ctx.unit.shard)
        for step in range(ctx.unit.steps):
            loss = net(torch.randn(8, 4, generator=gen)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ctx.report_progress(step + 1, (step + 1) * 8)
        return ctx.result(net, steps=ctx.unit.steps, samples=ctx.unit.steps * 8)

    return train


@pytest.mark.parametrize("upload", ["delta", "weights"])
async def test_sequential_units_count_every_batchnorm_step(tmp_path: Path, upload: str) -> None:
    """Issue 13: four units of 10 steps ended with num_batches_tracked = 10 under delta uploads (a
    policy took the maximum of the model's counter and the worker's difference)."""
    async with running(tmp_path, units=make_units(4, steps=10), initial=bn_model()) as (coord, server):
        report = await worker(server.url, tmp_path / "w", bn_trainer(), upload=upload).run()
        assert report.results_accepted == 4
        await coord.wait_finished()
        model = coord.model()
    assert model["1.num_batches_tracked"].item() == 40
    assert model["1.running_mean"].abs().sum() > 0   # the float buffers merged as usual


@pytest.mark.parametrize("upload", ["delta", "weights"])
async def test_overlapping_units_count_every_step(tmp_path: Path, upload: str) -> None:
    """Two workers train from the same version at once: the counter adds both increments (the
    maximum of values, the old rule for full weights, counted 10 of the 20 steps)."""
    barrier = threading.Barrier(2)
    async with running(tmp_path, units=make_units(2, steps=10), initial=bn_model()) as (coord, server):
        runs = [worker(server.url, tmp_path / f"w{i}", bn_trainer(barrier), upload=upload,
                       max_units=1).run() for i in range(2)]
        reports = await asyncio.gather(*runs)
        assert [r.results_accepted for r in reports] == [1, 1]
        await coord.wait_finished()
        model = coord.model()
    assert model["1.num_batches_tracked"].item() == 20


def counter_down_trainer(ctx: TrainContext) -> TrainResult:
    """BatchNorm's counter set below the base's: a buffer used as something other than a count."""
    net = bn_model()
    ctx.model.load_into(net)
    with torch.no_grad():
        net[0].weight.add_(0.01)
    net[1].num_batches_tracked.fill_(int(ctx.model["1.num_batches_tracked"]) - 2)
    ctx.report_progress(ctx.unit.steps, 8)
    return ctx.result(net, steps=ctx.unit.steps, samples=8)


def bn_model_counted(n: int) -> torch.nn.Module:
    net = bn_model()
    net[1].num_batches_tracked.fill_(n)
    return net


@pytest.mark.parametrize("upload", ["delta", "weights"])
async def test_a_counter_that_goes_down_fails_the_unit_here_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, upload: str) -> None:
    """Found by a probe: such a result was uploaded, rejected (negative_increment) and trained
    again ~50 times a second for ever; now the worker names the buffer and the fix, and counts it
    as a trainer failure without uploading."""
    async with running(tmp_path, units=make_units(2, steps=2),
                       initial=bn_model_counted(7)) as (coord, server):
        v0 = coord.version
        with pytest.raises(TrainerError, match="failed 2 units in a row"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", counter_down_trainer,
                                          upload=upload, max_trainer_failures=2).run(), 30)
        assert ("integer tensor '1.num_batches_tracked' went down from 7 to 5: integer tensors are "
                "counters that may only grow") in caplog.text
        assert "rejected" not in caplog.text                # nothing was uploaded
        assert coord.version == v0


async def test_a_result_rejected_for_its_counters_is_a_trainer_failure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Uploaded all the same (the worker's own check off): the coordinator rejects it and backs the
    worker off, and the worker counts the rejection toward its trainer's failures in a row."""
    from vcasync.worker import _worker
    monkeypatch.setattr(_worker, "result_problem", lambda *args: None)
    async with running(tmp_path, units=make_units(2, steps=2),
                       initial=bn_model_counted(7)) as (coord, server):
        v0 = coord.version
        with pytest.raises(TrainerError, match="failed 2 units in a row"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", counter_down_trainer,
                                          max_trainer_failures=2).run(), 30)
        assert caplog.text.count("rejected: negative_increment (the trainer") == 2
        assert "backing off" in caplog.text
        assert coord.version == v0


def nan_trainer(ctx: TrainContext) -> TrainResult:
    net = tiny_model()
    ctx.model.load_into(net)
    with torch.no_grad():
        net[0].weight.fill_(float("nan"))            # a trainer that diverged
    ctx.report_progress(ctx.unit.steps, 8)
    return ctx.result(net, steps=ctx.unit.steps, samples=8)


def far_trainer(ctx: TrainContext) -> TrainResult:
    net = tiny_model()
    ctx.model.load_into(net)
    with torch.no_grad():
        net[0].weight.add_(100.0)                    # a learning rate far too high
    ctx.report_progress(ctx.unit.steps, 8)
    return ctx.result(net, steps=ctx.unit.steps, samples=8)


@pytest.mark.parametrize(("trainer", "config", "refusal"), [
    (nan_trainer, {}, "refused: tensor '0.weight' holds NaN or Inf (the trainer's result"),
    (far_trainer, {"max_update_norm": 1.0}, "exceeds the bound 1 (the trainer's result"),
], ids=["non_finite", "norm_too_large"])
async def test_a_result_refused_for_what_its_tensors_hold_is_a_trainer_failure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, trainer: Callable[..., TrainResult],
        config: dict[str, Any], refusal: str) -> None:
    """Found by a probe: only the coordinator knows whether it refuses NaN (require_finite) or a
    norm over a bound, so the worker uploads such a result; its refusal was a WARNING and no
    failure of the trainer, so max_trainer_failures=1 never stopped the worker: it trained unit
    after unit until the coordinator quarantined it (5 in a row) for an hour, exit 1 with
    WorkerQuarantinedError, and its restart after a fix of the trainer was quarantined too."""
    async with running(tmp_path, units=make_units(4, steps=2),
                       coordinator={"worker_backoff_s": 0.01, **config}) as (coord, server):
        v0 = coord.version
        with pytest.raises(TrainerError, match="failed 2 units in a row"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", trainer,
                                          max_trainer_failures=2).run(), 60)
        assert caplog.text.count(refusal) == 2
        assert "quarantined" not in caplog.text
        assert coord.version == v0


class Masked(torch.nn.Module):
    """A layer with a bool mask buffer the trainer switches on, one entry per unit."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 2)
        self.register_buffer("mask", torch.zeros(2, dtype=torch.bool))


def mask_trainer(ctx: TrainContext) -> TrainResult:
    net = Masked()
    ctx.model.load_into(net)
    with torch.no_grad():
        net.lin.weight.add_(0.01)
        net.get_buffer("mask")[ctx.unit.shard] = True
    ctx.report_progress(ctx.unit.steps, 8)
    return ctx.result(net, steps=ctx.unit.steps, samples=8)


@pytest.mark.parametrize("upload", ["delta", "weights"])
async def test_bool_buffers_travel_as_values(tmp_path: Path, upload: str) -> None:
    """A delta carries a bool tensor's value (the worker refused to make one before); the last
    merged value wins, so two sequential units leave both entries on."""
    async with running(tmp_path, units=make_units(2, steps=2), initial=Masked()) as (coord, server):
        report = await worker(server.url, tmp_path / "w", mask_trainer, upload=upload).run()
        assert (report.results_accepted, report.results_refused) == (2, 0)
        await coord.wait_finished()
        assert coord.model()["mask"].tolist() == [True, True]


def test_uvloop_is_used_when_installed() -> None:
    import asyncio

    from vcasync._loop import run, uvloop_available

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_module(), use_uvloop=False).startswith("asyncio")
    if uvloop_available():
        assert run(loop_module()).startswith("uvloop")


@pytest.mark.parametrize(("field", "value", "match"), [
    ("codec", "nosuch", "unknown codec 'nosuch'; known: .*'raw'"),
    ("max_units", 0, "max_units must be >= 1 or None, got 0"),
    ("request_timeout_s", 0.0, "request_timeout_s must be > 0"),
    ("max_trainer_failures", 0, "max_trainer_failures must be >= 1"),
    ("keep_checkpoints", -1, "keep_checkpoints must be >= 1, got -1"),
    ("state_lease_s", 0.0, r"state_lease_s must be >= 3 s .*, got 0.0"),
    # found by a tester: NaN passed the `grace_period_s <= 0` check
    ("grace_period_s", float("nan"), r"grace_period_s must be a finite number > 0, got nan"),
    ("grace_period_s", float("inf"), r"grace_period_s must be a finite number > 0, got inf"),
    ("grace_period_s", 0.0, r"grace_period_s must be a finite number > 0, got 0.0"),
])
def test_a_worker_config_that_could_never_work_is_refused_when_made(field: str, value: object,
                                                                    match: str) -> None:
    # found by starting 'vcasync worker' with each: all were taken, the codec failing only at
    # the first upload, after a whole unit's training
    with pytest.raises(ConfigError, match=match):
        WorkerConfig(**{field: value})  # type: ignore[arg-type]
    WorkerConfig(codec="zstd", max_units=1, keep_checkpoints=1)


async def test_a_trainer_that_returns_a_plain_state_dict_without_reporting_progress(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a tester: such a trainer's every unit was "the trainer returned after 0 steps" and
    handed back as a trainer failure, as if 0 had been measured. It trained the whole unit (it was
    not asked to stop): that is what counts, with one warning naming the trainer and the fix."""
    def plain_trainer(ctx: TrainContext) -> dict[str, torch.Tensor]:
        net = tiny_model()
        ctx.model.load_into(net)
        return {k: v + 0.5 for k, v in net.state_dict().items()}

    async with running(tmp_path, units=make_units(3, steps=2)) as (_, server):
        report = await asyncio.wait_for(worker(server.url, tmp_path / "w", plain_trainer).run(), 60)
    assert report.reason == "finished"
    assert (report.results_accepted, report.units_abandoned) == (3, 0)
    warnings = [m for m in (r.getMessage() for r in caplog.records)
                if "does not call ctx.report_progress" in m]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "trainer tests.server.test_worker:test_a_trainer_that_returns_a_plain_state_dict_without_reporting_"
        "progress.<locals>.plain_trainer does not call ctx.report_progress: its results count as whole units "
        "(2 steps for unit ")
    assert "ctx.report_progress(step + 1)" in warnings[0]
    assert "0 steps" not in caplog.text


async def test_a_trainer_stopped_before_its_first_step_is_not_said_to_never_report(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a probe: a trainer that reports every step, stopped before its first one (or its
    first after a resume: the demo's preemptions land there), was warned about as one that "does not
    call ctx.report_progress" and told to call it; at 0 steps its steps were "unknown" besides,
    though it had said them with ``steps=`` to ``ctx.result``."""
    caplog.set_level(logging.INFO, logger="vcasync")
    entered = threading.Event()
    inner = make_trainer()

    def train(ctx: TrainContext) -> TrainResult:
        entered.set()
        ctx.stop_event.wait(30)                    # the notice comes before the trainer's next step
        return inner(ctx)

    async def stopped_at_once(state_dir: Path) -> WorkerReport:
        entered.clear()
        w = worker(server.url, state_dir, train)
        task = asyncio.create_task(w.run())
        assert await asyncio.to_thread(entered.wait, 30), "the trainer never started"
        w.request_stop()
        return await asyncio.wait_for(task, 60)

    async with running(tmp_path, units=make_units(2, steps=5)) as (_, server):
        first = await stopped_at_once(tmp_path / "w1")                # a fresh unit: 0 steps
        checkpointed = await preempted(server.url, tmp_path / "w2", Blocker(at_step=2))
        resumed = await stopped_at_once(tmp_path / "w2")              # resumed at step 3, stopped again
    assert (first.reason, checkpointed.reason, resumed.reason) == ("preempted",) * 3
    assert "does not call ctx.report_progress" not in caplog.text
    assert "are unknown" not in caplog.text
    assert re.search(r"preempted before the first step of unit e0-s\d; releasing its lease", caplog.text)
    # once when the blocker stopped it, once when it was stopped again on its resume
    assert len(re.findall(r"preempted after 3/5 steps of unit e0-s\d", caplog.text)) == 2


def off_by_one(ctx: TrainContext) -> TrainResult:
    """Reports the step's index where its count is meant, ``report_progress(step)``, on every unit
    but a remainder (on which it is right, so that the run can finish)."""
    net = tiny_model()
    ctx.model.load_into(net)
    fix = 1 if "~" in ctx.unit.unit_id else 0
    for step in range(ctx.unit.steps):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.01)
        ctx.report_progress(step + fix, 8 * (step + fix))
    return ctx.result(net)


async def test_a_short_result_not_asked_to_stop_is_uploaded_as_a_partial_and_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a probe: with ``report_progress(step)`` every whole unit went up as a partial of one
    step less, logged only as "accepted", and a remainder queued for it; there the trainer reported 0
    ("returned after 0 steps") and the worker gave up. The partial still goes up (the steps are real
    work), but the worker says why once, and the cause."""
    caplog.set_level(logging.INFO, logger="vcasync")
    async with running(tmp_path, units=make_units(2, steps=4)) as (coord, server):
        report = await asyncio.wait_for(worker(server.url, tmp_path / "w", off_by_one).run(), 60)
        assert units_done(coord) in (4, -1)                 # two partials and their remainders
    assert (report.reason, report.results_accepted, report.units_abandoned) == ("finished", 4, 0)
    said = [r for r in caplog.records if "without being asked to stop" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO]
    assert re.fullmatch(
        r"trainer tests\.server\.test_worker:off_by_one returned unit e0-s[01] after 3 of its 4 steps "
        r"without being asked to stop \(it reported 3 steps done\): uploading it as a partial result "
        r"of 3 steps; the coordinator queues the other 1 as a remainder unit; is "
        r"ctx\.report_progress\(step\) called where ctx\.report_progress\(step \+ 1\) is meant\? .*"
        r"\(see docs/trainer\.md\)", said[0].getMessage())


async def test_a_trainer_that_reports_no_step_done_is_told_the_likely_cause(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same trainer on a one-step unit (a remainder, as often as not) reports 0 steps done: the
    failure says why, not only "returned after 0 steps"."""
    def always_off(ctx: TrainContext) -> TrainResult:
        for step in range(ctx.unit.steps):
            ctx.report_progress(step)
        return ctx.result(ctx.model.tensors)

    async with running(tmp_path, units=make_units(1, steps=1)) as (_, server):
        with pytest.raises(TrainerError, match="failed 1 units in a row"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", always_off,
                                          max_trainer_failures=1).run(), 60)
    assert re.search(r"the trainer returned after 0 steps of unit e0-s0; is "
                     r"ctx\.report_progress\(step\) called where", caplog.text)


def test_an_unreported_result_counts_the_whole_unit_unless_asked_to_stop(tmp_path: Path) -> None:
    stop = threading.Event()
    unit = make_units(1, steps=5)[0]
    ctx = TrainContext(unit=unit, lease_id="l", base_version=0, model=ModelState.from_module(tiny_model()),
                       checkpoint_path=tmp_path / "ck", resumed=False, stop=stop)
    assert not ctx.progress_reported
    assert ctx.result(tiny_model()).steps == 5
    assert ctx.result(tiny_model(), steps=3).steps == 3
    stop.set()
    assert ctx.result(tiny_model()).steps == 0           # stopped early: unknown, never weighed
    ctx.report_progress(2)
    assert ctx.progress_reported
    assert ctx.result(tiny_model()).steps == 2


def _context(tmp_path: Path) -> TrainContext:
    return TrainContext(unit=make_units(1, steps=5)[0], lease_id="l", base_version=0,
                        model=ModelState.from_module(tiny_model()), checkpoint_path=tmp_path / "ck",
                        resumed=False, stop=threading.Event())


@pytest.mark.parametrize("value", ["abc", None, [1.0], torch.ones(3)])
def test_a_metric_that_is_not_a_number_is_refused_naming_it(tmp_path: Path, value: object) -> None:
    """report_progress and result name the metric and its value (they once raised float()'s bare
    "could not convert string to float: 'abc'", naming no metric)."""
    ctx = _context(tmp_path)
    with pytest.raises(TypeError, match=r"^metric 'loss' = .* is not a number$"):
        ctx.report_progress(1, loss=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^metric 'acc' = .* is not a number$"):
        ctx.result(tiny_model(), acc=value)  # type: ignore[arg-type]
    ctx.report_progress(1, loss=torch.tensor(0.5), acc=1)       # numbers of any kind still count
    assert ctx.result(tiny_model()).metrics == {"loss": 0.5, "acc": 1.0}


def test_progress_beyond_the_unit_is_refused_where_it_is_reported(tmp_path: Path) -> None:
    """A trainer that reports a global step (or a remainder's step counted from its parent's first)
    had every heartbeat refused while the whole unit trained on, then its result refused for
    claiming more steps than the unit has: found one unit late, and the hint was nowhere."""
    ctx = _context(tmp_path)
    ctx.report_progress(5)                                    # the unit's last step: fine
    with pytest.raises(ValueError, match=r"^report_progress\(6\): unit e0-s0 has 5 steps; count "
                                         r"this unit's steps done, 0 to 5$"):
        ctx.report_progress(6)
    assert ctx.steps_done == 5                                # nothing recorded
    remainder = make_units(1, steps=12)[0].remainder(7)      # 5 steps left, 7 done
    ctx = TrainContext(unit=remainder, lease_id="l", base_version=0,
                       model=ModelState.from_module(tiny_model()), checkpoint_path=tmp_path / "ck",
                       resumed=False, stop=threading.Event())
    with pytest.raises(ValueError, match=r"params\['step_offset'\] = 7 are the parent unit's"):
        ctx.report_progress(7 + 1)


@pytest.mark.parametrize(("args", "error", "message"), [
    ((1.5,), TypeError, "steps_done = 1.5 is not an integer; it counts this unit's steps done"),
    (("2", "16"), TypeError, "steps_done = '2' is not an integer"),
    ((True,), TypeError, "steps_done = True is not an integer"),
    ((torch.tensor(True),), TypeError, "steps_done = tensor(True) is not an integer"),
    ((torch.tensor(2.0),), TypeError, "steps_done = tensor(2.) is not an integer"),
    ((2, 16.0), TypeError, "samples_done = 16.0 is not an integer; it counts this unit's samples done"),
    ((-5, -7), ValueError, "steps_done = -5 is negative; it counts this unit's steps done, from 0"),
    ((2, -7), ValueError, "samples_done = -7 is negative"),
])
def test_progress_that_is_not_a_count_is_refused_naming_the_argument(
        tmp_path: Path, args: tuple[Any, ...], error: type[Exception], message: str) -> None:
    """Found by a probe: report_progress took int() of anything, max(0, ...): 1.5 was one step, "2"
    two, True one, -5 none, all without a word (a metric passed badly was a TypeError naming it)."""
    ctx = _context(tmp_path)
    ctx.report_progress(1, 8, loss=0.5)
    with pytest.raises(error, match="^report_progress: " + re.escape(message)):
        ctx.report_progress(*args, loss=0.25)
    assert (ctx.steps_done, ctx.samples_done, ctx.result(tiny_model()).metrics) == (1, 8, {"loss": 0.5})
    ctx.report_progress(np.int64(2), torch.tensor(16))      # integer scalars of numpy and torch count
    assert (ctx.steps_done, ctx.samples_done) == (2, 16)
    assert type(ctx.steps_done) is int
    assert type(ctx.samples_done) is int


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"steps": 2.7}, TypeError, "steps = 2.7 is not an integer"),
    ({"steps": True}, TypeError, "steps = True is not an integer"),
    ({"samples": "16"}, TypeError, "samples = '16' is not an integer"),
    ({"steps": -1}, ValueError, "steps = -1 is negative"),
    # found by a probe: 2**70 samples crashed the upload (msgpack) and left the lease held
    ({"samples": 2**70}, ValueError, "samples = 1180591620717411303424 is more than a result can carry"),
])
def test_steps_and_samples_given_to_the_result_are_counts_too(
        tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    """ctx.result(steps=2.7) became 2 steps and steps=True one, as report_progress's did."""
    ctx = _context(tmp_path)
    with pytest.raises(error, match="^ctx.result: " + re.escape(message)):
        ctx.result(tiny_model(), **kwargs)
    got = ctx.result(tiny_model(), steps=np.int64(2), samples=torch.tensor(16))
    assert (got.steps, got.samples) == (2, 16)


def test_progress_that_goes_back_is_refused_but_a_resumed_lease_starts_again(tmp_path: Path) -> None:
    """Steps or samples that go down within a unit are a trainer's bug, and the result's steps
    default to the last report; a resumed lease (a new context) reports from its checkpoint on."""
    ctx = _context(tmp_path)
    ctx.report_progress(3, 24)
    ctx.report_progress(3, 24)                                # the same again: fine
    with pytest.raises(ValueError, match=r"^report_progress: steps_done went back from 3 to 2 in "
                                         r"unit e0-s0; report this unit's steps done so far"):
        ctx.report_progress(2, 24)
    with pytest.raises(ValueError, match=r"^report_progress: samples_done went back from 24 to 16"):
        ctx.report_progress(4, 16)
    assert (ctx.steps_done, ctx.samples_done) == (3, 24)
    ctx.report_progress(4)                                    # samples not given: kept
    assert ctx.result(tiny_model()).steps == 4

    resumed = TrainContext(unit=make_units(1, steps=5)[0], lease_id="l", base_version=0,
                           model=ModelState.from_module(tiny_model()), checkpoint_path=tmp_path / "ck",
                           resumed=True, stop=threading.Event())
    resumed.report_progress(3, 24)                            # the checkpoint's step, then on
    resumed.report_progress(4, 32)
    remainder = make_units(1, steps=12)[0].remainder(7)       # step_offset 7, 5 steps left
    rest = TrainContext(unit=remainder, lease_id="l2", base_version=0,
                        model=ModelState.from_module(tiny_model()), checkpoint_path=tmp_path / "ck2",
                        resumed=False, stop=threading.Event())
    for step in range(remainder.steps):
        rest.report_progress(step + 1)
    assert (resumed.steps_done, rest.steps_done) == (4, 5)


@pytest.mark.parametrize(("extra", "where", "kind"), [
    ({"np_rng": np.random.get_state()}, "state['np_rng'][1]", "numpy.ndarray"),
    ({"opt": {"lrs": [0.1, np.float64(0.2)]}}, "state['opt']['lrs'][1]", "numpy.float64"),
    ({"counts": collections.defaultdict(int)}, "state['counts']", "collections.defaultdict"),
    ({"by": {np.int64(3): 1}}, "state['by'] key np.int64(3)", "numpy.int64"),
])
def test_a_checkpoint_that_could_not_be_loaded_back_is_refused_when_saved(
        tmp_path: Path, extra: dict[str, Any], where: str, kind: str) -> None:
    """Once saved without a word and then dropped at the resume as 'unreadable (Weights only load
    failed)': every checkpoint of such a trainer was useless, found only at a preemption."""
    ctx = _context(tmp_path)
    net = tiny_model()
    with pytest.raises(TypeError, match=re.escape(f"checkpoint value {where} is a {kind}, which "
                                                  "torch.load(weights_only=True) cannot read back")):
        ctx.save_checkpoint({"model": net.state_dict(), "step": 3, **extra})
    assert not (tmp_path / "ck").exists()
    assert not list(tmp_path.iterdir())                      # no temp file left behind either
    ok = {"model": net.state_dict(), "step": 3, "rng": torch.get_rng_state(), "none": None,
          "np_rng": [torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                     for a in np.random.get_state()],
          "meta": (torch.float16, torch.Size([2, 3]), True, "s", 1.5), "opt": torch.optim.SGD(
              net.parameters(), lr=0.1, momentum=0.9).state_dict()}
    ctx.save_checkpoint(ok)
    back = ctx.load_checkpoint()
    assert back is not None
    assert back.keys() == ok.keys()
    assert torch.equal(back["rng"], ok["rng"])
    assert back["meta"] == ok["meta"]


def _sys_exit(ctx: TrainContext) -> TrainResult:
    raise SystemExit(7)


async def _async_sys_exit(ctx: TrainContext) -> TrainResult:
    raise SystemExit("bye")


def _ctrl_c(ctx: TrainContext) -> TrainResult:
    raise KeyboardInterrupt


@pytest.mark.parametrize(("trainer", "what"), [
    (_sys_exit, "called sys.exit(7)"),
    (_async_sys_exit, "called sys.exit('bye')"),
    (_ctrl_c, "raised KeyboardInterrupt"),
])
async def test_a_trainer_that_exits_is_a_failed_unit_not_a_dead_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, trainer: Callable[..., Any], what: str) -> None:
    """A probe's trainer called sys.exit(): the worker process exited 7, its last log line "joined as
    worker", the lease held until it timed out. Now a trainer failure: named, released, counted."""
    async with running(tmp_path, units=make_units(2, steps=2)) as (coord, server):
        with pytest.raises(TrainerError, match="failed 2 units in a row"):
            await asyncio.wait_for(worker(server.url, tmp_path / "w", trainer,
                                          max_trainer_failures=2).run(), 60)
        name = f"{__name__}:{trainer.__qualname__}"
        assert f"trainer failed on unit e0-s0: trainer {name} {what}" in caplog.text
        assert "trainer failed on unit e0-s1: " in caplog.text      # the next unit was leased
        counts = coord.status()["units"]
        assert isinstance(counts, dict)
        assert not counts.get("leased")                             # both released, none held
        assert not (tmp_path / "w" / "lease.json").exists()
