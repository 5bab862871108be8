"""Worker state in storage (``Worker(..., state=URL)``), in-process against a real coordinator and
server on 127.0.0.1: a preempted worker's lease and checkpoint resume on a *fresh local disk*, a second
live worker on the same state is refused, checkpoints stay bounded; the owner lease's rules in virtual
time. (Real processes killed with SIGKILL: tests/integration/test_remote_state.py.)"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from vcasync.backends.memory import MemoryStorage

from vcasync import _owner_lease
from vcasync.errors import ConfigError, StateInUseError, TrainerError
from vcasync.ledger._units import make_units
from vcasync.testing.storage import IgnoringPreconditions
from vcasync.trainer import TrainContext, TrainResult
from vcasync.worker import Worker, WorkerConfig
from vcasync.worker._remote_state import state_lease

from .conftest import SECRET, running, tiny_model
from .test_worker import FAST, Blocker, make_trainer


@pytest.fixture(autouse=True)
def quick_ttl(monkeypatch):
    """Owner TTLs below the 3 s minimum, so that takeovers here take a fraction of a second."""
    monkeypatch.setattr(_owner_lease, "MIN_TTL_S", 0.1)


def remote_worker(url: str, state: Any, trainer: Any, local: Path | None = None, **cfg: Any) -> Worker:
    return Worker(url, trainer, state=state, state_dir=local, join_secret=SECRET,
                  config=WorkerConfig(backoff=FAST, **cfg))


async def keys(store: MemoryStorage, prefix: str = "") -> list[str]:
    return [k async for k in store.list(prefix)]


async def test_a_replacement_on_a_fresh_disk_resumes_the_lease_from_its_checkpoint(tmp_path: Path) -> None:
    store = MemoryStorage("workers")
    async with running(tmp_path, units=make_units(2, steps=20)) as (_, server):
        blocker, log = Blocker(at_step=5), []
        first = remote_worker(server.url, store.peer(), make_trainer(blocker, log), tmp_path / "disk-a")
        task = asyncio.create_task(first.run())
        await blocker.wait_reached()
        first.request_stop()
        report = await task
        assert report.reason == "preempted"
        assert "lease.json" in await keys(store)
        assert len(await keys(store, "checkpoints/")) == 1

        # Another machine: an empty local disk, the same state URL.
        again = await remote_worker(server.url, store.peer(), make_trainer(None, log),
                                    tmp_path / "disk-b").run()
        assert again.reason == "finished"
        assert again.results_accepted == 2
        assert again.worker_id == report.worker_id          # the identity came from storage
        assert log[1]["lease"] == log[0]["lease"]
        assert log[1]["resumed"] is True
        assert log[1]["start"] == 6                          # the checkpoint came from storage too
        assert await keys(store, "checkpoints/") == []       # finished leases leave nothing behind
        assert "lease.json" not in await keys(store)


async def test_a_state_url_holding_work_of_another_run_is_refused_by_its_url(tmp_path: Path) -> None:
    # Found by a probe: restarted against run B, the worker dropped run A's lease and checkpoint
    # from the state URL, and its message named the temporary local cache instead of the URL.
    store = MemoryStorage("workers")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with running(tmp_path / "a", units=make_units(1, steps=20)) as (coord_a, server_a), \
            running(tmp_path / "b", units=make_units(1, steps=2)) as (coord_b, server_b):
        blocker = Blocker(at_step=5)
        first = remote_worker(server_a.url, store.peer(), make_trainer(blocker))
        task = asyncio.create_task(first.run())
        await blocker.wait_reached()
        first.request_stop()
        await task
        before = {k: await store.get(k) for k in await keys(store) if not k.startswith(("owner/", "probe"))}
        with pytest.raises(ConfigError, match=f"in {store.url} belongs to run {coord_a.run_id}") as info:
            await remote_worker(server_b.url, store.peer(), make_trainer()).run()
        assert coord_b.run_id in str(info.value)
        after = {k: await store.get(k) for k in await keys(store) if not k.startswith(("owner/", "probe"))}
        assert after == before


async def test_a_second_live_worker_on_the_same_state_is_refused(tmp_path: Path) -> None:
    store = MemoryStorage("workers")
    async with running(tmp_path, units=make_units(1, steps=20)) as (_, server):
        blocker = Blocker(at_step=2)
        first = remote_worker(server.url, store.peer(), make_trainer(blocker), state_lease_s=0.6)
        task = asyncio.create_task(first.run())
        await blocker.wait_reached()
        second = remote_worker(server.url, store.peer(), make_trainer(), state_lease_s=0.6)
        with pytest.raises(StateInUseError) as info:
            await second.run()
        assert isinstance(info.value, ConfigError)          # the CLI exits with the CONFIG status
        assert "in use by a live worker" in str(info.value)
        blocker.release.set()
        report = await task
        assert (report.reason, report.results_accepted) == ("finished", 1)


def checkpointing_trainer(every: int) -> Any:
    def train(ctx: TrainContext) -> TrainResult:
        net = tiny_model()
        ctx.model.load_into(net)
        for step in range(ctx.unit.steps):
            if step % every == 0:
                ctx.save_checkpoint({"model": net.state_dict(), "step": step})
            ctx.report_progress(step + 1)
        return ctx.result(net, steps=ctx.unit.steps)

    return train


async def test_checkpoints_are_bounded_and_each_is_stored_before_the_trainer_goes_on(tmp_path: Path) -> None:
    store = MemoryStorage("workers")
    seen: list[list[str]] = []
    inner = checkpointing_trainer(every=1)

    def train(ctx: TrainContext) -> TrainResult:
        original = ctx.save_checkpoint

        def save(state: Any) -> None:
            original(state)
            seen.append(asyncio.run(keys(store.peer(), "checkpoints/")))  # what storage holds now

        ctx.save_checkpoint = save  # type: ignore[method-assign]
        return inner(ctx)

    async with running(tmp_path, units=make_units(1, steps=6)) as (_, server):
        report = await remote_worker(server.url, store.peer(), train, keep_checkpoints=2).run()
    assert report.results_accepted == 1
    assert [len(s) for s in seen] == [1, 2, 2, 2, 2, 2]
    assert seen[-1][-1].split("/")[-1].startswith("000000000006-")   # the newest one is there


async def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one(tmp_path: Path) -> None:
    store = MemoryStorage("workers")
    async with running(tmp_path, units=make_units(1, steps=20)) as (_, server):
        blocker, log = Blocker(at_step=5), []
        first = remote_worker(server.url, store.peer(), make_trainer(blocker, log))
        task = asyncio.create_task(first.run())
        await blocker.wait_reached()
        first.request_stop()
        await task
        (ckpt,) = await keys(store, "checkpoints/")
        # A newer one whose bytes do not match the digest in its name (a torn or tampered object).
        await store.put(ckpt.replace("/000000000001-", "/000000000002-"), b"torn bytes")
        again = await remote_worker(server.url, store.peer(), make_trainer(None, log)).run()
        assert again.results_accepted == 1
        assert log[1]["start"] == 6


async def test_errors_leave_a_remote_state_worker_as_they_leave_a_local_one(tmp_path: Path) -> None:
    """Not wrapped in the session's exception group: callers (and the CLI) catch our error classes."""
    def broken(ctx: TrainContext) -> TrainResult:
        raise RuntimeError("boom")

    async with running(tmp_path, units=make_units(2, steps=2)) as (_, server):
        with pytest.raises(TrainerError, match="failed 3 units in a row"):
            await remote_worker(server.url, MemoryStorage("workers"), broken).run()
        wrong = Worker(server.url, make_trainer(), state=MemoryStorage("others"), join_secret="x" * 20,
                       config=WorkerConfig(backoff=FAST))
        with pytest.raises(ConfigError, match="refused this worker's join secret"):   # a first join
            await wrong.run()
    async with running(tmp_path / "again", units=make_units(1, steps=20)) as (_, server):
        blocker = Blocker(at_step=2)
        blocker.ignore_stop = True
        w = remote_worker(server.url, MemoryStorage("stubborn"), make_trainer(blocker), grace_period_s=0.3)
        task = asyncio.create_task(w.run())
        await blocker.wait_reached()
        w.request_stop()
        report = await task
        blocker.release.set()
        assert (report.reason, report.grace_exceeded) == ("preempted", True)


async def test_without_a_state_dir_the_temporary_local_cache_is_removed_when_the_worker_ends(
        tmp_path: Path) -> None:
    store = MemoryStorage("workers")
    async with running(tmp_path, units=make_units(2, steps=2)) as (_, server):
        w = remote_worker(server.url, store.peer(), make_trainer(), max_units=1)
        assert w.state.root.name.startswith("vcasync-worker-")
        assert (await w.run()).results_accepted == 1
        assert not w.state.root.exists()                   # it held the worker's token
        assert (await w.run()).results_accepted == 1       # run again: a cache is made again
        assert not w.state.root.exists()
        local = remote_worker(server.url, store.peer(), make_trainer(), tmp_path / "mine")
        assert (await local.run()).reason == "finished"
        assert (tmp_path / "mine" / "identity.json").exists()    # a --state-dir the user gave stays


async def preempted_locally(url: str, local: Path, log: list[dict[str, Any]]) -> str:
    """A worker with a local --state-dir only, stopped mid-unit: its lease and checkpoint stay there."""
    blocker = Blocker(at_step=5)
    w = Worker(url, make_trainer(blocker, log), state_dir=local, join_secret=SECRET,
               config=WorkerConfig(backoff=FAST))
    task = asyncio.create_task(w.run())
    await blocker.wait_reached()
    w.request_stop()
    report = await task
    assert report.reason == "preempted"
    assert (local / "lease.json").exists()
    return report.worker_id


async def test_adding_a_state_url_to_a_state_dir_moves_the_local_state_into_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "vcasync.worker")
    store = MemoryStorage("workers")
    async with running(tmp_path, units=make_units(2, steps=20)) as (_, server):
        log: list[dict[str, Any]] = []
        worker_id = await preempted_locally(server.url, tmp_path / "disk", log)
        held = Blocker(at_step=8)                            # the unit stays open while we look
        again = remote_worker(server.url, store.peer(), make_trainer(held, log), tmp_path / "disk",
                              max_units=1)
        task = asyncio.create_task(again.run())
        await held.wait_reached()
        assert "lease.json" in await keys(store)            # stored remotely before the trainer ran
        assert len(await keys(store, "checkpoints/")) >= 1
        held.release.set()
        report = await task
        assert report.worker_id == worker_id                # the same worker...
        assert log[1]["lease"] == log[0]["lease"]           # ...resumed the same lease...
        assert log[1]["start"] == 6                         # ...from its local checkpoint
        assert "moved the local state" in caplog.text


async def test_a_local_state_the_remote_state_overrides_is_dropped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStorage("workers")
    async with running(tmp_path, units=make_units(3, steps=20)) as (_, server):
        first = await remote_worker(server.url, store.peer(), make_trainer(), max_units=1).run()
        log: list[dict[str, Any]] = []
        local_id = await preempted_locally(server.url, tmp_path / "disk", log)
        lease = log[0]["lease"]
        again = await remote_worker(server.url, store.peer(), make_trainer(), tmp_path / "disk",
                                    max_units=1).run()
        assert again.worker_id == first.worker_id           # the remote state is the truth
        assert f"(worker {local_id}) is replaced" in caplog.text
        assert f"dropping the local lease {lease}" in caplog.text


async def test_a_state_store_that_ignores_conditional_writes_is_refused_unless_allowed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStorage("workers")
    async with running(tmp_path, units=make_units(1, steps=2)) as (_, server):
        with pytest.raises(ConfigError, match="does not honour conditional writes") as info:
            await remote_worker(server.url, IgnoringPreconditions(store.peer()), make_trainer()).run()
        assert "--allow-unsafe-store" in str(info.value)
        assert await keys(store) == []                      # refused before anything was written
        report = await remote_worker(server.url, IgnoringPreconditions(store.peer()), make_trainer(),
                                     allow_unsafe_store=True).run()
        assert report.results_accepted == 1
        assert "UNSAFE STORE" in caplog.text
        assert await keys(store, "probe/") == []            # the probe cleans up


def test_a_worker_needs_some_state() -> None:
    with pytest.raises(ConfigError, match="state_dir"):
        Worker("http://127.0.0.1:1", make_trainer(), join_secret=SECRET)


# -- the owner lease, in virtual time ----------------------------------------------------------------


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_000_000.0
        self.mono = 0.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


async def test_a_dead_owner_is_taken_over_after_one_ttl_of_silence() -> None:
    store = MemoryStorage("s")
    c = Clocks()
    dead = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    await dead.acquire()
    newcomer = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    waiting = asyncio.create_task(newcomer.acquire(poll_s=0.001))
    await asyncio.sleep(0.05)
    assert not waiting.done()                               # the record might still be renewed
    c.mono += 10.5                                          # ...but it was not, for a whole TTL
    await asyncio.wait_for(waiting, 5)
    assert newcomer.held
    with pytest.raises(StateInUseError, match="taken over"):
        await dead.check()                                  # the stalled one learns it and stops
    assert sorted(await keys(store, "owner/")) == ["owner/000000000001.json", "owner/000000000002.json"]


async def test_a_live_owner_is_refused_as_soon_as_it_renews() -> None:
    store = MemoryStorage("s")
    c = Clocks()
    live = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    await live.acquire()
    newcomer = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    waiting = asyncio.create_task(newcomer.acquire(poll_s=0.001))
    await asyncio.sleep(0.05)
    await live.renew()
    with pytest.raises(StateInUseError, match="in use by a live worker"):
        await asyncio.wait_for(waiting, 5)
    await live.check()                                      # nothing changed for the owner


ELSEWHERE = "vm-b/another-boot/pid:[4026531836]"      # another machine's this_node()


async def plant_elsewhere(store: MemoryStorage, renewed_at: float, beat: int = 1) -> None:
    """Epoch 1 held by a worker on another machine, last renewed at ``renewed_at`` by its clock."""
    rec = _owner_lease.OwnerRecord("h-b", "vm-b", 27730, 10.0, beat, renewed_at, False,
                                   renewed_at - 60, ELSEWHERE)
    await store.put("owner/000000000001.json", rec.to_bytes())


async def test_released_or_long_stale_records_are_taken_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStorage("s")
    c = Clocks()
    one = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    await one.acquire()
    await one.release()
    with monkeypatch.context() as m:                        # a worker on another machine
        m.setattr(_owner_lease, "this_node", lambda: ELSEWHERE)
        two = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    await asyncio.wait_for(two.acquire(poll_s=0.001), 1)    # a clean exit: no wait
    c.wall += 25                                            # over 2 TTLs since its last beat: that
    three = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)   # may be a clock
    with pytest.raises(TimeoutError):                       # ahead, so it is watched, not taken
        await asyncio.wait_for(three.acquire(poll_s=0.001), 0.2)
    c.wall += _owner_lease.LONG_DEAD_S                      # over a day: dead, whatever the clocks
    three = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    await asyncio.wait_for(three.acquire(poll_s=0.001), 1)
    assert three.held
    assert await keys(store, "owner/") == ["owner/000000000002.json", "owner/000000000003.json"]


@pytest.mark.parametrize("ahead_s", [100.0, 5 * 3600.0])
async def test_a_newcomer_whose_clock_runs_ahead_is_refused_by_a_live_holder_elsewhere(
        ahead_s: float) -> None:
    # a worker on a machine whose clock ran 100 s ahead read a live worker's fresh record as "not
    # renewed since" and took its state over at once; the live one then stopped, exit 2
    store = MemoryStorage("s")
    c = Clocks()
    await plant_elsewhere(store, c.wall)
    newcomer = state_lease(store.peer(), 10, clock=lambda: c.wall + ahead_s, monotonic=c.monotonic)
    waiting = asyncio.create_task(newcomer.acquire(poll_s=0.001))
    await asyncio.sleep(0.05)
    assert not waiting.done()                               # watched, not presumed dead
    c.wall += 3
    c.mono += 3
    await plant_elsewhere(store, c.wall, beat=2)            # the holder renews
    with pytest.raises(StateInUseError, match=r"in use by a live worker \(host vm-b, pid 27730"):
        await asyncio.wait_for(waiting, 5)
    assert not newcomer.held
    assert await keys(store, "owner/") == ["owner/000000000001.json"]


async def test_a_dead_holder_elsewhere_is_taken_over_after_one_ttl_of_watching_whatever_the_clocks(
        ) -> None:
    store = MemoryStorage("s")
    c = Clocks()
    await plant_elsewhere(store, c.wall)
    newcomer = state_lease(store.peer(), 10, clock=lambda: c.wall + 100, monotonic=c.monotonic)
    waiting = asyncio.create_task(newcomer.acquire(poll_s=0.001))
    await asyncio.sleep(0.05)
    c.mono += 9.5
    await asyncio.sleep(0.05)
    assert not waiting.done()                               # less than a TTL of silence
    c.mono += 1                                             # a whole TTL on the newcomer's clock
    await asyncio.wait_for(waiting, 5)
    assert newcomer.held
    assert newcomer.took_over


async def test_a_live_holder_on_this_machine_keeps_its_state_whatever_the_clocks_say() -> None:
    # the probe's case: both workers on one host, the newcomer's clock 100 s ahead (or a day)
    store = MemoryStorage("s")
    c = Clocks()
    live = state_lease(store.peer(), 10, clock=c.time, monotonic=c.monotonic)
    await live.acquire()
    for ahead_s in (100.0, 2 * _owner_lease.LONG_DEAD_S):
        newcomer = state_lease(store.peer(), 10, clock=lambda a=ahead_s: c.wall + a,
                               monotonic=c.monotonic)
        waiting = asyncio.create_task(newcomer.acquire(poll_s=0.001))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await live.renew()
        with pytest.raises(StateInUseError, match="in use by a live worker"):
            await asyncio.wait_for(waiting, 5)
    await live.check()                                      # still the owner
    assert live.held


async def test_an_async_trainers_checkpoints_reach_storage_before_the_worker_returns(tmp_path: Path) -> None:
    store = MemoryStorage("workers")
    starts: list[int] = []
    reached = asyncio.Event()

    async def train(ctx: TrainContext) -> TrainResult:     # awaited on the loop: saves from the loop
        net = tiny_model()
        ctx.model.load_into(net)
        ck = ctx.load_checkpoint()
        start = int(ck["step"]) if ck is not None else 0
        starts.append(start)
        for step in range(start, ctx.unit.steps):
            if ctx.should_stop:
                return ctx.result(net, steps=step)
            ctx.save_checkpoint({"model": net.state_dict(), "step": step + 1})
            ctx.report_progress(step + 1)
            if step == 3:
                reached.set()
            await asyncio.sleep(0.01)
        return ctx.result(net, steps=ctx.unit.steps)

    async with running(tmp_path, units=make_units(1, steps=200)) as (_, server):
        first = remote_worker(server.url, store.peer(), train, tmp_path / "disk-a")
        task = asyncio.create_task(first.run())
        await asyncio.wait_for(reached.wait(), 30)
        first.request_stop()
        assert (await task).reason == "preempted"
        assert len(await keys(store, "checkpoints/")) == 2     # stored, and bounded
        again = await remote_worker(server.url, store.peer(), train, tmp_path / "disk-b").run()
        assert again.results_accepted == 1
    assert starts[0] == 0
    assert starts[1] >= 4


async def test_a_storage_outage_does_not_stop_the_worker(tmp_path: Path) -> None:
    from vcasync.testing.faults import FaultyStorage

    down = {"now": False}
    store = MemoryStorage("workers")
    flaky = FaultyStorage(store.peer(), trigger=lambda op, key: down["now"])
    async with running(tmp_path, units=make_units(3, steps=6)) as (coord, server):
        blocker = Blocker(at_step=2)
        w = remote_worker(server.url, flaky, make_trainer(blocker), state_lease_s=0.6)
        task = asyncio.create_task(w.run())
        await blocker.wait_reached()
        down["now"] = True            # every call fails from here: renewals, leases, cleanup, release
        blocker.release.set()
        report = await asyncio.wait_for(task, 60)
        assert (report.reason, report.results_accepted) == ("finished", 3)
        assert flaky.injected
        await coord.wait_finished()


def test_the_worker_command_needs_a_state_dir_or_a_state_url(capsys: pytest.CaptureFixture[str]) -> None:
    from vcasync.cli import ExitCode, main

    code = main(["worker", "--coordinator", "http://127.0.0.1:1",
                 "--trainer", "vcasync.examples.digits:train"])
    assert code == ExitCode.CONFIG
    assert "--state-dir DIR (local state) or --state URL" in capsys.readouterr().err
