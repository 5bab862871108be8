"""The end-of-run flush: a buffering policy applies what it still holds when the run's last result
is merged, so the final model includes every accepted result.

fedbuff, median, trimmed_mean, sync and diloco apply their buffer when it is full; the run ends
when every unit is merged, and what was still buffered then was acknowledged to its workers but
missing from the final model (on 4 units fedbuff, median and trimmed_mean finished at version 0).
The flush is journaled as a step of its own, so a coordinator killed anywhere around it recovers
to the same model, bit for bit, and never applies it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest
import torch

from tests._crash import crash
from vcasync.coordinator import Coordinator, CoordinatorConfig, StartOptions
from vcasync.errors import NoWorkAvailableError
from vcasync.ledger._units import make_units
from vcasync.policy import MergePolicy, build_policy, policy_spec
from vcasync.storage import open_storage
from vcasync.tensors import ModelState
from vcasync.testing.faults import FaultyStorage

UNITS = 4

#: Each buffering policy with a buffer larger than the run, and the same policy with a buffer of
#: exactly the run's results: flushing the first must give what the second gives.
BUFFERED: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "fedbuff": ({}, {"buffer_size": UNITS}),
    "median": ({}, {"buffer_size": UNITS}),
    "trimmed_mean": ({"buffer_size": 7, "beta": 0.3}, {"buffer_size": UNITS, "beta": 0.3}),
    "sync": ({"buffer_size": 8}, {"buffer_size": UNITS}),
    "diloco": ({"buffer_size": 8}, {"buffer_size": UNITS}),
}


def make(kit, clock, policy: MergePolicy, storage=None, *, units: int = UNITS,
         **cfg: Any) -> Coordinator:
    config = CoordinatorConfig(**{"durability": "journal" if storage is not None else "none",
                                  "lease_timeout_s": 10.0, "snapshot_interval_s": 3600.0,
                                  "max_staleness": 3, **cfg})
    return Coordinator(kit.tiny_model(), make_units(units, steps=4), policy=policy,
                       storage=storage, config=config, clock=clock)


def result(model: ModelState, i: int) -> dict[str, torch.Tensor]:
    """Unit i's delta: different per unit and per element (a median has something to choose), and
    an increment of i + 1 for the integer counter."""
    g = torch.Generator().manual_seed(100 + i)
    return {k: (torch.randn(v.shape, generator=g, dtype=v.dtype) * 0.1 if v.is_floating_point()
                else torch.full_like(v, i + 1)) for k, v in model.items()}


async def feed(kit, coord: Coordinator, units: int = UNITS) -> None:
    """One worker trains every unit on version 0 and sends its result."""
    w = await coord.join("w")
    for i in range(units):
        g = await coord.lease(w)
        r = await coord.submit(w, g.lease_id, kit.stream(kit.result_chunks(
            g.lease_id, result(kit.tiny_model(), i), steps=g.unit.steps, base_version=0)))
        assert r.status == "accepted"


async def finish(kit, coord: Coordinator, units: int = UNITS) -> ModelState:
    await feed(kit, coord, units)
    await asyncio.wait_for(coord.wait_finished(), 10)
    return coord.model()


def held_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "holds without having applied" in r.getMessage()]


@pytest.mark.parametrize("name", sorted(BUFFERED))
async def test_a_buffer_larger_than_the_run_is_applied_at_its_end(kit, clock, caplog, name) -> None:
    """4 results into a buffer of 5 to 10: the run ends with one more version, whose model is the
    one a buffer of exactly 4 gives, nothing held, no warning (it finished at version 0)."""
    caplog.set_level("WARNING", logger="vcasync.coordinator")
    big, exact = BUFFERED[name]
    async with make(kit, clock, build_policy(name, big)) as coord:
        flushed = await finish(kit, coord)
        assert coord.version == 1
        assert coord.status()["held_results"] == 0
        assert coord.status()["finished"]
    async with make(kit, clock, build_policy(name, exact)) as ref:
        expected = await finish(kit, ref)
        assert ref.version == 1
    assert not flushed.equal(kit.tiny_model())
    assert flushed.equal(expected), "the flush must apply the 4 results as a buffer of 4 does"
    assert int(flushed["n"]) == 1 + 2 + 3 + 4     # every result's counter increment counted
    assert held_warnings(caplog) == []


async def test_fedbuff_default_on_16_units_applies_all_16(kit, clock) -> None:
    """The probe's case: 10 applied when the buffer filled, the other 6 (dropped before) at the end."""
    async with make(kit, clock, build_policy("fedbuff"), units=16) as coord:
        model = await finish(kit, coord, 16)
        assert coord.version == 2
        assert coord.status()["held_results"] == 0
        assert int(model["n"]) == sum(range(1, 17))


class KeepsThree:
    """A user's buffering policy without a flush: sums deltas, applies every third result."""

    name = "keeps_three"
    needs_base = False
    claims: frozenset[str] = frozenset()

    def init_state(self, model: ModelState) -> dict[str, Any]:
        return {"count": 0, "sum": {k: torch.zeros_like(v) for k, v in model.items()}}

    def merge(self, model: ModelState, update, state: dict[str, Any]) -> ModelState | None:
        for k, v in update.tensors.items():
            state["sum"][k].add_(v)
        state["count"] += 1
        if state["count"] < 3:
            return None
        for k, w in model.items():
            w.add_(state["sum"][k])
            state["sum"][k].zero_()
        state["count"] = 0
        return model


async def test_a_policy_without_flush_that_holds_results_says_so(kit, clock, caplog) -> None:
    """What can still be lost is loud: a user policy with no flush holding 1 of 4 results."""
    caplog.set_level("WARNING", logger="vcasync.coordinator")
    async with make(kit, clock, KeepsThree()) as coord:   # type: ignore[arg-type]
        await finish(kit, coord)
        assert coord.version == 1
        assert coord.status()["held_results"] == 1
    assert held_warnings(caplog) == [
        "the run finished with 1 accepted result(s) that merge policy 'keeps_three' holds without "
        "having applied them to the model (its merge returned None for each since version 1, and "
        "it has no flush(model, state) method to apply them at the end of the run): the final "
        "model does not include them. See 'A buffer at the end of the run' in docs/policies.md"]


# -- crash safety ----------------------------------------------------------------------------------


async def uninterrupted(kit, clock) -> ModelState:
    st = open_storage("memory://flush-reference")
    try:
        async with make(kit, clock, build_policy("fedbuff"), st) as coord:
            return await finish(kit, coord)
    finally:
        await st.aclose()


async def flush_entries(storage) -> int:
    """Journal entries that record a flush (kept until a clean close prunes them). A live
    coordinator's snapshot may prune an entry between the listing and its read: one gone is not
    counted (it failed 1 run in about 17 under load with ObjectNotFoundError)."""
    from vcasync.errors import ObjectNotFoundError
    from vcasync.wire import decode_payload_bytes
    n = 0
    async for key in storage.list("vcasync/journal/"):
        try:
            data = await storage.get(key)
        except ObjectNotFoundError:
            continue
        if decode_payload_bytes(data).meta.get("type") == "flush":
            n += 1
    return n


async def restarted(kit, clock, storage, expected: ModelState) -> None:
    """A new coordinator on the crashed run's storage ends with the uninterrupted model, once:
    started again after a clean close, nothing more is applied."""
    for _ in range(2):
        async with make(kit, clock, build_policy("fedbuff"), storage) as b:
            await asyncio.wait_for(b.wait_finished(), 10)
            assert b.version == 1
            assert b.model().equal(expected), "recovery must give the uninterrupted model bit for bit"
            assert b.status()["held_results"] == 0
            assert await flush_entries(storage) <= 1


class StuckFlush(policy_spec("fedbuff").cls):   # type: ignore[misc]
    """fedbuff whose flush waits to be let go: the coordinator dies with the flush journaled but
    not applied."""

    entered = threading.Event()
    release = threading.Event()

    def flush(self, model: ModelState, state: dict[str, Any]) -> ModelState | None:
        self.entered.set()
        self.release.wait(30)
        return super().flush(model, state)


@pytest.mark.parametrize("snapshot_every", [1, 100])
async def test_killed_after_the_flush_is_journaled_replays_it_once(kit, clock, storage,
                                                                   snapshot_every) -> None:
    expected = await uninterrupted(kit, clock)
    StuckFlush.entered.clear()
    StuckFlush.release.clear()
    a = await make(kit, clock, StuckFlush(), storage, snapshot_every=snapshot_every).__aenter__()
    await feed(kit, a)
    assert await asyncio.to_thread(StuckFlush.entered.wait, 10)
    assert a.version == 0
    assert not a.finished
    assert await flush_entries(storage) == 1
    await crash(a)
    StuckFlush.release.set()          # the dead coordinator's thread ends; its result goes nowhere
    await restarted(kit, clock, storage, expected)


async def test_with_linger_0_the_coordinator_still_answers_the_workers_told_to_ask_again(
        kit, clock, storage) -> None:
    """Found by a probe: with ``--linger 0`` a worker told "the run is finishing, ask again in 1 s"
    asked again of a coordinator that had exited as soon as the run finished, and retried for its
    --give-up-after (an hour) instead of hearing the end. The coordinator serves at least until
    those it told have asked again."""
    from types import SimpleNamespace

    from vcasync.commands.coordinator import _serve_on

    StuckFlush.entered.clear()
    StuckFlush.release.clear()
    async with make(kit, clock, StuckFlush(), storage) as a:
        await feed(kit, a)
        assert await asyncio.to_thread(StuckFlush.entered.wait, 10)
        w = await a.join("late")
        with pytest.raises(NoWorkAvailableError) as told:
            await a.lease(w)                       # the flush is still running: "finishing"
        assert not told.value.finished
        assert a.answers_owed_s == pytest.approx(told.value.retry_after + 1.0)
        StuckFlush.release.set()
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await _serve_on(SimpleNamespace(linger_s=0.0, output=None), a, asyncio.Event())
        assert loop.time() - start >= 0.9 * a.answers_owed_s     # lingered for them: 2 s
        with pytest.raises(NoWorkAvailableError) as end:
            await a.lease(w)
        assert end.value.finished


async def test_a_worker_told_every_unit_is_leased_out_is_owed_an_answer_too(kit, clock, storage) -> None:
    """Found by a third probe: with --linger 0, a worker told "no queued work; 1 units are leased,
    retry in 5 s" while another delivered the last unit asked again of a coordinator that served
    only the 2 s owed to the "finishing" answers, and exited 1 after its --give-up-after."""
    async with make(kit, clock, build_policy("vcasgd"), storage, units=1) as a:
        w1, w2 = await a.join("w1"), await a.join("w2")
        await a.lease(w2)
        with pytest.raises(NoWorkAvailableError) as told:
            await a.lease(w1)
        assert not told.value.finished
        assert told.value.retry_after is not None
        assert a.answers_owed_s == pytest.approx(told.value.retry_after + 1.0)


async def test_a_stop_while_lingering_still_answers_the_workers_told_to_ask_again(
        kit, clock, storage) -> None:
    """Found by a probe: a worker told "no queued work (or: the run is finishing), ask again",
    then the run finished and the coordinator got SIGTERM while it lingered, before that worker
    asked again: it never heard ``410 run_finished`` and retried the dead URL for its
    --give-up-after (an hour), and a restart did not help (a cleanly stopped finished run exits
    at once). A stop serves on until those told to ask again have asked (bounded by what was
    owed at the stop)."""
    from types import SimpleNamespace

    from vcasync.commands.coordinator import _serve_on

    async with make(kit, clock, build_policy("vcasgd"), storage, units=1,
                    lease_timeout_s=60.0) as a:
        w1, w2 = await a.join("w1"), await a.join("w2")
        g = await a.lease(w2)
        with pytest.raises(NoWorkAvailableError) as told:
            await a.lease(w1)                  # "no queued work; 1 units are leased": ask in 15 s
        assert not told.value.finished
        owed = a.answers_owed_s
        assert owed > 10
        r = await a.submit(w2, g.lease_id, kit.stream(kit.result_chunks(
            g.lease_id, result(kit.tiny_model(), 0), steps=g.unit.steps, base_version=0)))
        assert r.status == "accepted"
        stop = asyncio.Event()
        serving = asyncio.create_task(_serve_on(SimpleNamespace(linger_s=600.0, output=None), a,
                                                stop))
        await asyncio.wait_for(a.wait_finished(), 10)
        stop.set()                             # SIGTERM while it lingers
        await asyncio.sleep(1.0)               # (the fake clock stands: w1 is still owed)
        assert not serving.done(), "stopped before the worker told to ask again had asked"
        with pytest.raises(NoWorkAvailableError) as end:
            await a.lease(w1)                  # it asks again, and hears the end
        assert end.value.finished
        clock.advance(owed)
        assert await asyncio.wait_for(serving, 10)


class FailFlushWrite:
    """FaultyStorage trigger: every write of journal entry 5 (the flush after 4 results) fails."""

    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, op: str, key: str | None) -> bool:
        if op in ("put", "put_stream") and key is not None and key.endswith("/journal/0000000000000005"):
            self.failed += 1
            return True
        return False


@pytest.mark.parametrize("snapshot_every", [1, 100])
async def test_killed_before_the_flush_is_journaled_flushes_at_the_restart(kit, clock, storage,
                                                                           snapshot_every) -> None:
    """Every result merged, the flush not yet recorded (its journal write fails), then killed: the
    restart finds the results still held (replayed, or counted in the snapshot that holds them)
    and flushes them: the same model as a run never interrupted."""
    expected = await uninterrupted(kit, clock)
    trigger = FailFlushWrite()
    a = await make(kit, clock, build_policy("fedbuff"), FaultyStorage(storage, trigger=trigger),
                   snapshot_every=snapshot_every).__aenter__()
    await feed(kit, a)
    for _ in range(500):
        if trigger.failed and (snapshot_every > 1 or a.status()["journal"]["last_snapshot_seq"] == 4):
            break
        await asyncio.sleep(0.01)
    assert trigger.failed
    assert a.version == 0
    assert not a.finished
    assert a.status()["held_results"] == 4
    await crash(a)
    assert await flush_entries(storage) == 0
    await restarted(kit, clock, storage, expected)


async def test_snapshot_mode_finishes_once_a_snapshot_holds_the_flush(kit, clock, storage) -> None:
    expected = await uninterrupted(kit, clock)
    a = await make(kit, clock, build_policy("fedbuff"), storage, durability="snapshot").__aenter__()
    model = await finish(kit, a)
    assert a.version == 1
    assert model.equal(expected)
    await crash(a)                    # finished: a snapshot holds the flushed model
    async with make(kit, clock, build_policy("fedbuff"), storage, durability="snapshot") as b:
        await asyncio.wait_for(b.wait_finished(), 10)
        assert b.model().equal(expected)
        assert b.status()["held_results"] == 0


async def test_a_final_snapshot_that_cannot_be_written_is_a_storage_outage_with_an_end(
        kit, clock, storage, caplog) -> None:
    """Found by a probe: durability snapshot, the snapshots' directory made immutable once every
    unit was done: the coordinator retried its final snapshot once a second without end, said
    "results are still made durable" (they are in no journal), and, since workers now hear the end
    only once the run is finished, the whole fleet waited with it. The final snapshot is a write
    the run needs: its failure is an outage, ended by storage_outage_limit_s (exit 4)."""
    caplog.set_level("WARNING", logger="vcasync.coordinator")
    blocked = False

    def snapshots_refused(op: str, key: str | None) -> bool:
        return blocked and op in ("put", "put_stream") and key is not None and "snapshots/" in key

    a = await make(kit, clock, build_policy("fedbuff"), FaultyStorage(storage, trigger=snapshots_refused),
                   durability="snapshot", storage_outage_limit_s=5.0).__aenter__()
    try:
        blocked = True
        await feed(kit, a)
        for _ in range(400):
            if a.storage_error is not None:
                break
            clock.advance(0.5)
            await asyncio.sleep(0.02)
        assert a.storage_error is not None, a.status()["storage"]
        assert not a.finished
        assert "the final snapshot failed" in caplog.text
        assert "results are still made durable" not in caplog.text
        # found by a probe: the outage's ERROR said workers were told to wait for the storage,
        # while a lease is answered "finishing" (every unit done, nothing to take in)
        assert "workers are told the run is finishing (503 no_work)" in caplog.text
        assert "503 storage_unavailable" not in caplog.text
    finally:
        with contextlib.suppress(Exception):
            await a.aclose()


async def told_finished(coord: Coordinator) -> None:
    """Ask for work as a worker does until told the run is finished (410 run_finished)."""
    w = await coord.join("asks")
    waits: list[float | None] = []
    while True:
        try:
            await coord.lease(w)
        except NoWorkAvailableError as exc:
            if exc.finished:
                break
            waits.append(exc.retry_after)
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("every unit was delivered: no lease to give")
    assert all(wait is not None and 0 < wait <= 1.0 for wait in waits)   # "soon"


@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_a_worker_is_told_the_run_is_finished_only_once_it_is(kit, clock, storage,
                                                                    durability) -> None:
    """A lease request was answered "finished" (after which a worker leaves) as soon as every unit
    was done: before the policy's end-of-run flush (the model downloaded next had none of the
    buffered results) and, with durability snapshot, before the snapshot holding them, so a crash
    then lost acknowledged results with every worker gone. Until the run is finished a worker is
    told to ask again, soon."""
    expected = await uninterrupted(kit, clock)
    a = await make(kit, clock, build_policy("fedbuff"), storage, durability=durability).__aenter__()
    await feed(kit, a)
    await told_finished(a)
    assert a.finished
    assert a.model().equal(expected)       # the flush is in the model the worker would download
    await crash(a)                         # right after the worker left
    async with make(kit, clock, build_policy("fedbuff"), storage, durability=durability) as b:
        await asyncio.wait_for(b.wait_finished(), 10)
        assert b.model().equal(expected)
        assert b.status()["units"]["done"] == UNITS


class BrokenFlush(policy_spec("fedbuff").cls):   # type: ignore[misc]
    def flush(self, model: ModelState, state: dict[str, Any]) -> ModelState | None:
        raise RuntimeError("the policy's own bug")


async def test_a_flush_that_fails_leaves_the_model_and_says_so(kit, clock, caplog, storage) -> None:
    """A flush the policy breaks changes nothing (logged at ERROR); the run still finishes, with
    the WARNING for what it holds, and a restart replays the journaled flush without stopping."""
    caplog.set_level("WARNING", logger="vcasync.coordinator")
    a = await make(kit, clock, BrokenFlush(), storage).__aenter__()
    model = await finish(kit, a)
    assert a.version == 0
    assert model.equal(kit.tiny_model())
    assert a.status()["held_results"] == 4
    await crash(a)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("merge policy 'fedbuff' failed (RuntimeError" in m and "the end-of-run flush" in m
               for m in errors), errors
    assert any("its end-of-run flush applied nothing" in m for m in held_warnings(caplog))
    async with make(kit, clock, BrokenFlush(), storage) as b:
        await asyncio.wait_for(b.wait_finished(), 10)
        assert b.version == 0
        assert b.status()["held_results"] == 4


async def test_a_policy_reset_applies_what_the_old_policy_held(kit, clock, caplog, storage) -> None:
    """--reset-policy on a run whose buffering policy holds accepted results: the recorded policy
    flushes them before the new one starts from its fresh state. They were acknowledged to their
    workers; the switch dropped them with the old state (fedbuff holding 3 results switched to
    vcasgd at version 0, held_results 0, and no word of it)."""
    caplog.set_level("WARNING", logger="vcasync.coordinator")
    ref_store = open_storage("memory://flush-reset-reference")
    try:
        async with make(kit, clock, build_policy("fedbuff"), ref_store, units=3) as ref:
            expected = await finish(kit, ref, 3)       # the 3 results, flushed by fedbuff
    finally:
        await ref_store.aclose()
    assert expected.version == 1

    a = await make(kit, clock, build_policy("fedbuff"), storage).__aenter__()
    await feed(kit, a, 3)                             # held in fedbuff's buffer of 10
    assert a.status()["held_results"] == 3
    await a.aclose()                                  # a clean stop: the snapshot holds them

    config = CoordinatorConfig(durability="journal", lease_timeout_s=10.0,
                               snapshot_interval_s=3600.0, max_staleness=3)
    async with Coordinator(kit.tiny_model(), make_units(UNITS, steps=4),
                           policy=build_policy("vcasgd"), storage=storage, config=config,
                           clock=clock, start=StartOptions(reset_policy=True)) as b:
        assert b.version == 1
        assert b.model().equal(expected), "the held results must be in the model the switch keeps"
        assert b.status()["held_results"] == 0
    async with Coordinator(kit.tiny_model(), make_units(UNITS, steps=4),
                           policy=build_policy("vcasgd"), storage=storage, config=config,
                           clock=clock) as c:                  # the switch is stored, once
        assert c.version == 1
        assert c.model().equal(expected)
    assert not held_warnings(caplog)
