"""Recycled tensor sets: uploads decode into memory the coordinator already has, and memory that
anyone else can still see is never reused."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any, ClassVar

import pytest
import torch

from vcasync._aio import to_thread_released
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.coordinator._buffers import BufferPool, unshared
from vcasync.errors import VCAsyncError
from vcasync.ledger._units import make_units
from vcasync.storage import open_storage
from vcasync.tensors import ModelState, Update


def _set(model: ModelState) -> dict[str, torch.Tensor]:
    return {k: torch.empty_like(v) for k, v in model.items()}


def test_unshared_sees_references_views_and_numpy_arrays(kit) -> None:
    tensors = _set(kit.tiny_model())
    assert unshared(tensors)
    held = tensors["w"]
    assert not unshared(tensors)
    del held
    view = tensors["w"][1:]
    assert not unshared(tensors)
    del view
    array = tensors["b"].numpy()
    assert not unshared(tensors)
    del array
    assert unshared(tensors)


def test_pool_keeps_only_fitting_unshared_sets_up_to_capacity(kit) -> None:
    model = kit.tiny_model()
    pool = BufferPool(model.spec, capacity=1)
    assert pool.take() is None
    wrong = _set(model)
    wrong["w"] = torch.empty(3, 4)
    assert not pool.give(wrong)
    assert not pool.give({k: v for k, v in _set(model).items() if k != "b"})
    shared = _set(model)
    keep = shared["b"]
    assert pool.give(shared)
    assert not pool.give(_set(model))     # full
    del shared
    assert pool.take() is None            # still held elsewhere: dropped, never handed out
    del keep
    first = _set(model)
    assert pool.give(first)
    assert pool.take() is first
    assert pool.take() is None


class Hoarder:
    """Keeps every result's tensors (against the policy contract) and averages them in."""

    name: ClassVar[str] = "hoarder"
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self.kept: list[dict[str, torch.Tensor]] = []

    def init_state(self, model: ModelState) -> dict[str, Any]:
        return {}

    def merge(self, model: ModelState, update: Update, state: dict[str, Any]) -> ModelState:
        self.kept.append(update.tensors)
        for name, w in model.items():
            if w.is_floating_point():
                w.add_(update.tensors[name]).mul_(0.5)
        return model


async def _submit_values(kit, coord: Coordinator, worker: str, value: float) -> None:
    g = await coord.lease(worker)
    delta = kit.delta_like(kit.tiny_model(), value)
    receipt = await coord.submit(worker, g.lease_id, kit.stream(kit.result_chunks(
        g.lease_id, delta, base_version=g.base_version, steps=g.unit.steps)))
    assert receipt.status == "accepted"


async def test_uploads_and_versions_reuse_the_same_memory(kit, clock, policy) -> None:
    """After the first result nothing model-sized is allocated: an upload decodes into the spare
    set, and once merged that set becomes the next version (the working model is copied into it,
    not into another spare); the version it replaces is the next spare. Three sets in all: the
    working model, the current version and one spare (a copy into a spare of its own kept four)."""
    config = CoordinatorConfig(durability="none", max_concurrent_decodes=1)
    async with Coordinator(kit.tiny_model(), make_units(4), policy=policy, storage=None,
                           config=config, clock=clock) as coord:
        w = await coord.join("w")
        await _submit_values(kit, coord, w, 0.25)
        pool = coord._update_buffers
        assert len(pool) == 1                      # version 0's set, dropped after the merge
        seen = {pool._free[0]["w"].data_ptr(), coord._owner.versions.current.model["w"].data_ptr(),
                coord._owner._working["w"].data_ptr()}
        for value in (0.5, 0.75, 1.0):
            spare = pool._free[0]["w"].data_ptr()
            before = coord._owner.versions.current.model["w"].data_ptr()
            await _submit_values(kit, coord, w, value)
            assert len(pool) == 1
            assert coord._owner.versions.current.model["w"].data_ptr() == spare  # decoded there
            assert pool._free[0]["w"].data_ptr() == before                      # the old version
        assert {pool._free[0]["w"].data_ptr(), coord._owner.versions.current.model["w"].data_ptr(),
                coord._owner._working["w"].data_ptr()} == seen


async def test_a_policy_that_keeps_results_never_sees_them_overwritten(kit, clock) -> None:
    hoarder = Hoarder()
    config = CoordinatorConfig(durability="none", max_concurrent_decodes=1)
    async with Coordinator(kit.tiny_model(), make_units(4), policy=hoarder, storage=None,
                           config=config, clock=clock) as coord:
        w = await coord.join("w")
        for i in range(3):
            await _submit_values(kit, coord, w, float(i + 1))
    assert [float(k["w"][0, 0]) for k in hoarder.kept] == [1.0, 2.0, 3.0]
    assert len({k["w"].data_ptr() for k in hoarder.kept}) == 3


async def test_to_thread_released_lets_go_of_its_arguments_when_it_returns() -> None:
    t = torch.zeros(4)
    before = sys.getrefcount(t)
    for _ in range(50):     # plain asyncio.to_thread loses this race now and then
        assert await to_thread_released(torch.Tensor.sum, t) == 0
        assert sys.getrefcount(t) == before


@pytest.mark.parametrize("durability", ["none", "journal"])
async def test_the_callers_model_is_let_go_of_once_the_coordinator_started(kit, clock, policy,
                                                                           tmp_path,
                                                                           durability) -> None:
    """Start-up copies the model (the working model, the first version); the coordinator then
    holds no reference to the caller's tensors, so a caller that drops its own frees them, and
    the process holds one model-sized copy less for the whole run."""
    model = kit.tiny_model()
    refs = [weakref.ref(t) for t in model.tensors.values()]
    storage = None if durability == "none" else open_storage(f"file://{tmp_path}/state")
    coord = Coordinator(model, make_units(4), policy=policy, storage=storage,
                        config=CoordinatorConfig(durability=durability), clock=clock)
    del model
    async with coord:
        gc.collect()
        assert [r() for r in refs] == [None] * len(refs)
        w = await coord.join("w")
        await _submit_values(kit, coord, w, 0.25)       # and it runs on without it
        assert coord.version == 1
    if storage is not None:
        await storage.aclose()


async def test_an_adopted_model_is_merged_into_not_copied(kit, clock, policy) -> None:
    """``adopt_model`` (what ``vcasync coordinator`` passes): the caller's tensors become the
    working model, so start-up holds two model-sized sets (the working model and the first
    version), not three; the versions served are still copies, and the run merges as one that
    copied."""
    models = []
    for adopt in (True, False):
        model = kit.tiny_model()
        ptrs = {k: t.data_ptr() for k, t in model.items()}
        coord = Coordinator(model, make_units(4), policy=policy, storage=None,
                            config=CoordinatorConfig(durability="none"), clock=clock,
                            adopt_model=adopt)
        del model
        async with coord:
            working = coord._owner._working
            assert ({k: t.data_ptr() for k, t in working.items()} == ptrs) is adopt
            served = coord.model()
            assert all(served[k].data_ptr() != ptrs[k] for k in ptrs)
            w = await coord.join("w")
            await _submit_values(kit, coord, w, 0.25)
            await _submit_values(kit, coord, w, -0.5)
            assert coord.version == 2
            models.append(coord.model())
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0].tensors)


async def test_a_resume_lets_go_of_the_callers_model_before_it_decodes_the_snapshot(
        kit, clock, policy, tmp_path) -> None:
    """The stored run's snapshot supersedes the caller's model: it was held until the snapshot
    had been read and decoded beside it, one model-sized set more at resume."""
    from vcasync.testing.faults import FaultyStorage

    url = f"file://{tmp_path}/state"
    async with open_storage(url) as storage:
        async with Coordinator(kit.tiny_model(), make_units(4), policy=policy, storage=storage,
                               config=CoordinatorConfig(durability="journal"), clock=clock) as a:
            await _submit_values(kit, a, await a.join("w"), 0.25)
            want = a.model()
        model = kit.tiny_model()
        refs = [weakref.ref(t) for t in model.tensors.values()]
        alive_at_read: list[int] = []

        def at_read(op: str, key: str | None) -> bool:
            if op in ("get", "open_read") and key is not None and "/model." in key:
                gc.collect()
                alive_at_read.append(sum(r() is not None for r in refs))
            return False

        coord = Coordinator(model, make_units(4), policy=policy, clock=clock,
                            storage=FaultyStorage(storage, trigger=at_read),
                            config=CoordinatorConfig(durability="journal"), adopt_model=True)
        del model
        async with coord:
            assert alive_at_read == [0]
            got = coord.model()
            assert got.version == want.version
            assert all(torch.equal(got[k], want[k]) for k in want.tensors)


def _spoiled(kit, lease_id: str, base_version: int, steps: int, damage: str) -> list[bytes]:
    delta = kit.delta_like(kit.tiny_model(), 0.25)
    if damage == "nan":                    # well formed, refused by the checks after decoding
        delta["w"][3, 2] = float("nan")
    data = bytearray(b"".join(kit.result_chunks(lease_id, delta, base_version=base_version,
                                                steps=steps)))
    if damage == "checksum":               # refused by the decoder, half way through
        at = data.index(delta["w"][1].numpy().tobytes())
        data[at] ^= 0x01
    return [bytes(data[i:i + 61]) for i in range(0, len(data), 61)]


@pytest.mark.parametrize("durability", ["none", "journal"])
@pytest.mark.parametrize("damage", ["nan", "checksum"])
async def test_a_refused_upload_gives_its_set_back_unshared(kit, clock, policy, durability,
                                                            damage) -> None:
    """A refused upload's set goes back to the pool, and nothing else holds it: the next upload
    decodes into the same memory. Before, the error's traceback kept the frames that held the set
    (decoder, checks), in a reference cycle through the decoding task that only the cyclic garbage
    collector frees, which a coordinator may not run for a long time: every refused upload pinned
    a model-sized set (a real coordinator of a 95 MB model grew by about 55 MB a refusal, to 18x
    the model after 24), and the next upload allocated a new one."""
    config = CoordinatorConfig(durability=durability, max_concurrent_decodes=1)
    storage = open_storage("memory://refused") if durability == "journal" else None
    gc.collect()
    gc.disable()                           # what a coordinator that did not collect yet sees
    try:
        async with Coordinator(kit.tiny_model(), make_units(8), policy=policy, storage=storage,
                               config=config, clock=clock) as coord:
            w = await coord.join("w")
            await _submit_values(kit, coord, w, 0.25)
            pool = coord._update_buffers
            spare = pool._free[0]["w"].data_ptr()
            for i in range(3):
                worker = await coord.join(f"w{i}")       # a refusal backs its worker off
                g = await coord.lease(worker)
                chunks = _spoiled(kit, g.lease_id, g.base_version, g.unit.steps, damage)
                with pytest.raises(VCAsyncError):
                    await coord.submit(worker, g.lease_id, kit.stream(chunks))
                assert len(pool) == 1
                assert pool._free[0]["w"].data_ptr() == spare
                assert unshared(pool._free[0])
            await _submit_values(kit, coord, w, 0.5)     # decoded into that same set
            assert coord._owner.versions.current.model["w"].data_ptr() == spare
    finally:
        gc.enable()
        if storage is not None:
            await storage.aclose()


async def test_letting_go_of_an_error_leaves_a_coroutine_that_caught_its_context_running() -> None:
    """``let_go`` clears the frames an error left, not the frame that caught an error chained to
    it: on Python 3.11 and 3.12 clearing a suspended coroutine's frame closes the coroutine, and
    another task that had caught the context and gone on waiting died of ``GeneratorExit``."""
    import asyncio

    from vcasync.coordinator._result_checks import let_go

    caught: list[BaseException] = []
    gate = asyncio.Event()

    async def other() -> str:
        try:
            raise ValueError("caught here, and kept")
        except ValueError as exc:
            caught.append(exc)
        await gate.wait()            # suspended: its frame is the first of the error's traceback
        return "went on"

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    assert caught
    assert not task.done()
    try:
        try:
            raise caught[0]
        except ValueError:
            raise RuntimeError("refused") from None
    except RuntimeError as err:
        err.__context__ = caught[0]
        let_go(err)
    gate.set()
    assert await asyncio.wait_for(task, 5) == "went on"
