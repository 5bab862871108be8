"""Tied weights (a head whose weight IS the embedding's: two state-dict names, one tensor) through a
real coordinator behind a real server on 127.0.0.1: a result that sends two values for the tie is
refused (422, nothing merged, counted as ``tie_mismatch``); the final model, a restart from its
snapshot and a snapshot written before the check keep one value under both names."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
import torch
from torch import nn

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.storage import open_storage
from vcasync.tensors import ModelState

from .conftest import PAYLOAD, bearer, result_payload, running
from .test_routes import error_of, join, lease, snapshot

TIE = ("emb.weight", "head.weight")


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(6, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight


def _split_delta(model: ModelState) -> dict[str, torch.Tensor]:
    """A hand-built delta that moves the head and not the embedding it is tied to."""
    delta = {k: torch.full_like(v, 0.01) for k, v in model.items()}
    delta["head.weight"] = torch.full_like(delta["head.weight"], 0.5)
    return delta


async def _put(http: aiohttp.ClientSession, url: str, token: str, lid: str,
               data: bytes) -> aiohttp.ClientResponse:
    return await http.put(f"{url}/v1/leases/{lid}/result", data=data,
                          headers={**bearer(token), "Content-Type": PAYLOAD})


def _one_value(model: ModelState) -> None:
    assert model.ties == (TIE,)
    assert torch.equal(model[TIE[0]], model[TIE[1]])
    net = TiedLM()
    model.load_into(net)
    assert net.head.weight is net.emb.weight
    assert torch.equal(net.emb.weight.detach(), model[TIE[0]])


async def test_a_result_that_splits_a_tie_is_refused_and_changes_nothing(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    async with running(tmp_path, initial=TiedLM(), durability="snapshot") as (coord, server):
        _, token = await join(http, server.url)
        grant = await lease(http, server.url, token)
        lid, base = grant["lease_id"], grant["base_version"]
        model = coord.model()
        before = await snapshot(coord)
        async with await _put(http, server.url, token, lid,
                              result_payload(model, lid, base, tensors=_split_delta(model))) as r:
            body = await error_of(r, 422, "invalid_update")
        assert body["reason"] == "tie_mismatch", body
        assert "'emb.weight' and 'head.weight' are one tensor" in body["message"]
        assert (await snapshot(coord))[:2] == before[:2]            # nothing merged
        assert coord.metrics.rejects["tie_mismatch"] == 1
        assert coord._ledger.stats["refused"] == 1
        # one value under both names (a worker's ctx.result(net)) is merged
        async with await _put(http, server.url, token, lid, result_payload(model, lid, base)) as r:
            assert r.status == 200, await r.text()
        assert coord.version == 1
        _one_value(coord.model())
    # the snapshot the clean stop wrote: a restart keeps the tie, and checks it again
    async with running(tmp_path, initial=TiedLM(), durability="snapshot") as (coord, server):
        assert coord.version == 1
        _one_value(coord.model())
        _, token = await join(http, server.url)
        grant = await lease(http, server.url, token)
        model = coord.model()
        async with await _put(http, server.url, token, grant["lease_id"],
                              result_payload(model, grant["lease_id"], grant["base_version"],
                                             tensors=_split_delta(model))) as r:
            assert (await error_of(r, 422, "invalid_update"))["reason"] == "tie_mismatch"
        assert coord.version == 1


async def test_a_snapshot_with_a_split_tie_from_before_the_check_still_loads(
        tmp_path: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    # an older build: no tie recorded, so a split result was merged and snapshotted
    untied = ModelState(dict(ModelState.from_module(TiedLM()).tensors))
    async with open_storage(f"file://{tmp_path / 'store'}") as storage, \
            Coordinator(untied, make_units(4, steps=3), policy=build_policy("vcasgd"),
                        storage=storage, config=CoordinatorConfig(durability="snapshot")) as old:
        w = await old.join()
        g = await old.lease(w)
        payload = result_payload(old.model(), g.lease_id, 0, tensors=_split_delta(old.model()))

        async def body():  # type: ignore[no-untyped-def]
            yield payload
        assert (await old.submit(w, g.lease_id, body())).status == "accepted"
        split = old.model()
        assert not torch.equal(split[TIE[0]], split[TIE[1]])
    caplog.set_level(logging.WARNING, "vcasync.coordinator")
    async with running(tmp_path, initial=TiedLM(), durability="snapshot") as (coord, server):
        model = coord.model()
        _one_value(model)
        assert torch.equal(model[TIE[0]], split[TIE[1]])     # what load_state_dict gave a module
        assert any("tied tensors 'emb.weight' and 'head.weight'" in r.getMessage()
                   for r in caplog.records)
        # a worker's delta from this model is accepted
        _, token = await join(http, server.url)
        grant = await lease(http, server.url, token)
        async with await _put(http, server.url, token, grant["lease_id"],
                              result_payload(model, grant["lease_id"], grant["base_version"])) as r:
            assert r.status == 200, await r.text()


def test_a_model_given_with_a_split_tie_is_refused() -> None:
    from vcasync.errors import ConfigError
    state = ModelState.from_module(TiedLM())
    state[TIE[1]].add_(1.0)
    with pytest.raises(ConfigError, match=r"tied tensors 'emb\.weight' and 'head\.weight' hold"):
        Coordinator(state, make_units(1, steps=1), policy=build_policy("vcasgd"), storage=None,
                    config=CoordinatorConfig(durability="none"))
