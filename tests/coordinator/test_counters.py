"""Integer tensors through the coordinator: full weights count like deltas, and replay agrees.

The policy contract makes integer tensors counters that travel as increments; a full-weights result
carries values, which the coordinator turns into increments against its base version before the
journal write. These drive real coordinators on real (memory) storage, crashed and restarted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from vcasync.coordinator import Coordinator, CoordinatorConfig, _merger
from vcasync.coordinator._journal import Journal
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.storage import open_storage


def make(kit: Any, storage: Any, clock: Any, **cfg: Any) -> Coordinator:
    config = CoordinatorConfig(**{"durability": "journal", "lease_timeout_s": 10.0, "restart_grace_s": 0.0,
                                  "snapshot_interval_s": 3600.0, "snapshot_every": 100, **cfg})
    return Coordinator(kit.tiny_model(), make_units(6, steps=4), policy=build_policy("vcasgd"),
                       storage=storage, config=config, clock=clock)


async def crash(coord: Coordinator) -> None:
    assert coord._runner is not None
    coord._runner.cancel()
    await asyncio.gather(coord._runner, return_exceptions=True)
    coord._abandon_prefix()                 # no renewal, no release: as SIGKILL leaves it
    coord._phase = "closed"


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
        before = a.model()
        for kind, n in (("delta", -10**15), ("weights", 2)):     # weights: 2 is 1 below the model's 3
            receipt = await send(kit, a, w, await a.lease(w), kind, n)
            assert (receipt.status, receipt.reason) == ("rejected", "negative_increment"), kind
            assert a.model().equal(before)
        assert (await send(kit, a, w, await a.lease(w), "weights", 3)).status == "accepted"   # +0
        assert a.model()["n"].item() == 3
    await storage.aclose()
