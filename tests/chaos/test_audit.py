"""The audit can fail: it finds a lost acknowledged result, a result merged twice, and a version
that went backwards (checked on a small run made in-process, then tampered with)."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.audit import audit
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.coordinator._journal import Journal
from vcasync.ledger._units import Receipt, make_units
from vcasync.policy import build_policy
from vcasync.storage import open_storage
from vcasync.tensors import ModelState
from vcasync.wire import decode_payload, encode_payload

CFG = CoordinatorConfig(keep_snapshots=1000, snapshot_every=2, prune_on_close=False)


def model() -> ModelState:
    torch.manual_seed(0)
    return ModelState.from_module(torch.nn.Linear(4, 2))


async def _run(url: str) -> list[Receipt]:
    receipts = []
    async with open_storage(url) as st, Coordinator(model(), make_units(4, steps=2),
                                                     policy=build_policy("vcasgd"), storage=st,
                                                     config=CFG) as coord:
        w = await coord.join("w")
        for _ in range(4):
            g = await coord.lease(w)
            # Full weights, so a replayed copy needs no base version (the tampering test below).
            delta = {k: v + 0.01 for k, v in coord.model().items()}
            meta = {"lease_id": g.lease_id, "base_version": g.base_version, "kind": "weights",
                    "samples": 1, "steps": 2, "partial": False, "metrics": {}}

            async def body(m: dict[str, object] = meta, d: dict[str, torch.Tensor] = delta):
                for chunk in encode_payload("result", m, d):
                    yield chunk

            receipts.append(await coord.submit(w, g.lease_id, body()))
    return receipts


async def _audit(url: str, receipts: list[Receipt], observed: list[int] = ()):  # type: ignore[assignment]
    async with open_storage(url) as st:
        return await audit(st, model=model(), units=make_units(4, steps=2), policy=build_policy("vcasgd"),
                           config=CFG, receipts={"w": receipts}, observed_versions=observed)


async def test_a_clean_run_passes(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    receipts = await _run(url)
    rep = await _audit(url, receipts, [0, 1, 2, 4])
    assert rep.ok, rep.problems
    assert (rep.accepted_results, rep.version_final, rep.results_acknowledged) == (4, 4, 4)


async def test_it_finds_lost_results_and_backward_versions(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    receipts = await _run(url)
    ghost = Receipt("9.9.0000000000000000.00000000000000000000", "nope", "accepted", 3, None)
    rep = await _audit(url, [*receipts, ghost], [0, 2, 1])
    assert rep.results_lost == 1
    assert not rep.versions_monotonic
    assert not rep.ok


async def test_it_finds_a_result_merged_twice(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    receipts = await _run(url)
    async with open_storage(url) as st:       # journal the first result again, as a buggy replay would
        key = sorted([k async for k in st.list("vcasync/journal/")])[0]
        first = await decode_payload(st.open_read(key))
        journal = Journal(st, config=CFG.journal_config(), spec=model().spec)
        await journal.open()
        await journal.load_snapshot()
        async for _ in journal.entries():
            pass
        meta = {k: v for k, v in first.meta.items() if k not in ("seq", "blob")}
        await journal.append(meta, first.tensors, blob=first.meta.get("blob"))
    rep = await _audit(url, receipts)
    assert rep.double_merges >= 1
    assert not rep.ok
