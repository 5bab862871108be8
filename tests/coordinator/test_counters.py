"""Integer tensors through the coordinator: full weights count like deltas, and replay agrees.

The policy contract makes integer tensors counters that travel as increments; a full-weights result
carries values, which the coordinator turns into increments against its base version before the
journal write. These drive real coordinators on real (memory) storage, crashed and restarted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from tests._crash import crash
from vcasync.coordinator import Coordinator, CoordinatorConfig, _merger
from vcasync.coordinator._journal import Journal
from vcasync.errors import WorkerBackoffError, WorkerQuarantinedError
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.storage import open_storage


def make(kit: Any, storage: Any, clock: Any, **cfg: Any) -> Coordinator:
    config = CoordinatorConfig(**{"durability": "journal", "lease_timeout_s": 10.0, "restart_grace_s": 0.0,
                                  "snapshot_interval_s": 3600.0, "snapshot_every": 100, **cfg})
    return Coordinator(kit.tiny_model(), make_units(6, steps=4), policy=build_policy("vcasgd"),
                       storage=storage, config=config, clock=clock)


async def send(kit: Any, coord: Coordinator, w: str, g: Any, kind: str, n: int) -> Any:
    """A result whose counter ``n`` is an increment (delta) or a value (weights)."""
    model = coord.model()
    if kind == "delta":
        tensors = kit.delta_like(model, 0.25)
        tensors["n"] = torch.tensor(n)
    else:
        tensors = {k: (v + 0.25 if v.is_floating_point() else torch.tensor(n)) for k, v in model.items()}
    chunks = kit.result_chunks(g.lease_id, tensors, base_version=g.base_version, kind=kind, steps=4)
    return await coord.submit(w, g.lease_id, kit.stream(chunks))


async def test_weights_count_like_deltas_and_replay_bit_identically(kit: Any, clock: Any) -> None:
    storage = open_storage("memory://counters-replay")
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join("w")
    g1, g2 = await a.lease(w), await a.lease(w)                  # both on version 0 (n = 0)
    assert (await send(kit, a, w, g1, "weights", 5)).status == "accepted"
    assert (await send(kit, a, w, g2, "weights", 7)).status == "accepted"   # overlapping: +7
    g3 = await a.lease(w)
    assert (await send(kit, a, w, g3, "delta", 3)).status == "accepted"
    assert a.model()["n"].item() == 5 + 7 + 3      # the maximum of values counted 7, then 10
    model, version = a.model(), a.version
    await crash(a)

    async with make(kit, storage, clock) as b:
        assert b.version == version
        assert b.model().equal(model), "replay must give the same model bit for bit"
    await storage.aclose()


async def test_weights_on_a_version_whose_counters_are_gone_are_refused(kit: Any, clock: Any) -> None:
    storage = open_storage("memory://counters-gone")
    a = await make(kit, storage, clock, snapshot_every=1).__aenter__()
    w = await a.join("w")
    old = await a.lease(w)                                       # on version 0
    g = await a.lease(w)
    assert (await send(kit, a, w, g, "delta", 2)).status == "accepted"   # snapshot at version 1
    for _ in range(500):
        if a.metrics.snapshots >= 2:                            # the initial one, then version 1
            break
        await asyncio.sleep(0.01)
    await crash(a)

    async with make(kit, storage, clock, snapshot_every=1) as b:
        before = b.model()
        receipt = await send(kit, b, w, old, "weights", 9)
        assert (receipt.status, receipt.reason) == ("rejected", "base_unavailable")
        assert b.model().equal(before)
        again = await b.lease(w)                                 # a fresh lease counts again
        assert (await send(kit, b, w, again, "weights", before["n"].item() + 4)).status == "accepted"
        assert b.model()["n"].item() == 2 + 4
    await storage.aclose()


async def test_an_old_journal_of_full_weights_replays_by_the_old_rule(kit: Any, clock: Any,
                                                                      monkeypatch: Any) -> None:
    """Entries written before counters were increments carry values, merged then by maximum."""
    storage = open_storage("memory://counters-legacy")
    append = Journal.append

    async def old_writer(self: Journal, meta: dict[str, Any], tensors: Any, **kw: Any) -> Any:
        # What such an entry looked like: no marker. Both results are based on version 0, whose
        # counter is 0, so their increments are the values the workers sent.
        meta = {k: v for k, v in meta.items() if k != "ints" or v != _merger.INCREMENTS}
        return await append(self, meta, tensors, **kw)

    monkeypatch.setattr(Journal, "append", old_writer)
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join("w")
    g1, g2 = await a.lease(w), await a.lease(w)
    await send(kit, a, w, g1, "weights", 5)
    await send(kit, a, w, g2, "weights", 7)
    await crash(a)
    monkeypatch.setattr(Journal, "append", append)

    async with make(kit, storage, clock) as b:
        assert b.version == 2
        assert b.model()["n"].item() == 7                        # max(0, 5) then max(5, 7)
    await storage.aclose()


async def test_a_counter_that_would_go_down_is_refused_in_both_upload_modes(kit: Any, clock: Any) -> None:
    # Found by hand: a delta with num_batches_tracked = -10**15 was accepted, and the model's
    # counter became -10**15 (max_update_norm and require_finite look at floating tensors only).
    storage = open_storage("memory://counters-negative")
    async with make(kit, storage, clock) as a:
        w = await a.join("w")
        g = await a.lease(w)
        assert (await send(kit, a, w, g, "delta", 3)).status == "accepted"
        leases = [await a.lease(w) for _ in range(3)]     # before the refusals back the worker off
        before = a.model()
        for kind, n in (("delta", -10**15), ("weights", 2)):     # weights: 2 is 1 below the model's 3
            receipt = await send(kit, a, w, leases.pop(0), kind, n)
            assert (receipt.status, receipt.reason) == ("rejected", "negative_increment"), kind
            assert a.model().equal(before)
        assert (await send(kit, a, w, leases.pop(0), "weights", 3)).status == "accepted"   # +0
        assert a.model()["n"].item() == 3
    await storage.aclose()


async def test_a_counter_that_goes_down_backs_its_worker_off_then_quarantines_it(kit: Any,
                                                                                  clock: Any) -> None:
    # Found by a probe: a model whose int64 buffer wraps (a cursor) was refused as
    # negative_increment without blame: its one worker retrained and re-uploaded ~50 times a
    # second for ever (no back-off, no quarantine).
    storage = open_storage("memory://counters-blame")
    async with make(kit, storage, clock, quarantine_after=3) as a:
        w = await a.join("w")
        before = a.model()
        receipt = await send(kit, a, w, await a.lease(w), "delta", -1)
        assert (receipt.status, receipt.reason) == ("rejected", "negative_increment")
        with pytest.raises(WorkerBackoffError):
            await a.lease(w)                                    # backed off, like a refused upload
        health = a._ledger.worker_health()[w]
        assert (health["streak"], health["quarantined"]) == (1, None)
        assert "negative_increment" in health["last_failure"]
        for streak in (2, 3):
            clock.advance(60.0)                                 # past the back-off
            receipt = await send(kit, a, w, await a.lease(w), "delta", -1)
            assert receipt.reason == "negative_increment"
            assert a._ledger.worker_health()[w]["streak"] == streak
        clock.advance(60.0)
        with pytest.raises(WorkerQuarantinedError):
            await a.lease(w)
        assert a.model().equal(before), "a refusal changes nothing in the model"
    await storage.aclose()


async def test_a_counter_increment_that_would_wrap_is_refused(kit: Any, clock: Any) -> None:
    # Found by a probe: increments of 2**62 were all accepted, and int64 addition wrapped the
    # model's counter to -2**63: a hostile worker could set it to any value with positive increments.
    storage = open_storage("memory://counters-overflow")
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join("w")
    assert (await send(kit, a, w, await a.lease(w), "delta", 2**62)).status == "accepted"  # fits
    leases = [await a.lease(w) for _ in range(4)]          # on version 1, before any back-off
    before = a.model()
    receipt = await send(kit, a, w, leases[1], "delta", 2**62)       # 2**63: past int64's max
    assert (receipt.status, receipt.reason) == ("rejected", "counter_overflow")
    assert a.model().equal(before)
    # full weights: -2**63 - 2**62 wraps to a positive "increment" of 2**62; still refused
    receipt = await send(kit, a, w, leases[2], "weights", -2**63)
    assert (receipt.status, receipt.reason) == ("rejected", "counter_overflow")
    assert a.model().equal(before)
    assert a.model()["n"].item() == 2**62
    top = 2**63 - 1 - 2**62                                      # up to the maximum exactly: fits
    assert (await send(kit, a, w, leases[3], "delta", top)).status == "accepted"
    assert a.model()["n"].item() == 2**63 - 1
    model, version = a.model(), a.version
    await crash(a)

    async with make(kit, storage, clock) as b:                  # replay decides the same
        assert b.version == version
        assert b.model().equal(model)
    await storage.aclose()


async def test_increments_a_buffering_policy_holds_count_toward_the_overflow(kit: Any,
                                                                             clock: Any) -> None:
    # Each increment fits the model alone, but the buffer's flush would add them all: a wrap.
    storage = open_storage("memory://counters-buffered")
    config = CoordinatorConfig(durability="journal", lease_timeout_s=10.0, restart_grace_s=0.0,
                               snapshot_interval_s=3600.0, snapshot_every=100)
    async with Coordinator(kit.tiny_model(), make_units(6, steps=4),
                           policy=build_policy("fedbuff", {"buffer_size": 3}), storage=storage,
                           config=config, clock=clock) as a:
        w = await a.join("w")
        leases = [await a.lease(w) for _ in range(3)]
        assert (await send(kit, a, w, leases[0], "delta", 2**62)).status == "accepted"
        assert a.version == 0                                    # held in the buffer
        receipt = await send(kit, a, w, leases[1], "delta", 2**62)
        assert (receipt.status, receipt.reason) == ("rejected", "counter_overflow")
        assert (await send(kit, a, w, leases[2], "delta", 5)).status == "accepted"
    await storage.aclose()


async def test_a_bool_mask_two_workers_clear_stays_cleared(kit: Any, clock: Any) -> None:
    # The probe's uint8 case with the dtype a mask should have (uint8 is refused when the
    # coordinator is built): bools carry values, the last merged one wins, nothing wraps.
    model = kit.tiny_model()
    model.tensors["mask"] = torch.ones(2, dtype=torch.bool)
    storage = open_storage("memory://counters-bool")
    async with Coordinator(model, make_units(2, steps=4), policy=build_policy("vcasgd"),
                           storage=storage, clock=clock) as a:
        grants = [(w, await a.lease(w)) for w in (await a.join("a"), await a.join("b"))]
        for w, g in grants:
            tensors = kit.delta_like(a.model(), 0.0)
            tensors["mask"] = torch.zeros(2, dtype=torch.bool)
            chunks = kit.result_chunks(g.lease_id, tensors, base_version=g.base_version, steps=4)
            assert (await a.submit(w, g.lease_id, kit.stream(chunks))).status == "accepted"
        assert a.model()["mask"].tolist() == [False, False]
    await storage.aclose()


def test_the_overflow_check_names_the_first_element_for_every_signed_dtype() -> None:
    from vcasync.coordinator._counters import CounterBases
    from vcasync.tensors import ModelState
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        top = torch.iinfo(dtype).max
        bases = CounterBases(ModelState({"c": torch.tensor([-5, top - 3, 0], dtype=dtype),
                                         "s": torch.tensor(top - 1, dtype=dtype)}))
        fits = {"c": torch.tensor([top, 3, top], dtype=dtype), "s": torch.tensor(1, dtype=dtype)}
        assert bases.first_overflow(fits) is None, dtype
        over = {"c": torch.tensor([0, 4, 0], dtype=dtype), "s": torch.tensor(0, dtype=dtype)}
        assert bases.first_overflow(over) == ("c", top - 3, 4), dtype
        assert bases.first_overflow({**fits, "s": torch.tensor(2, dtype=dtype)}) == ("s", top - 1, 2)
        bases.hold({"c": torch.tensor([0, 3, 0], dtype=dtype), "s": torch.tensor(0, dtype=dtype)})
        assert bases.first_overflow(fits) == ("c", top, 3), dtype   # held by a buffer: counted
