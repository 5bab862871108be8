"""Running statistics (BatchNorm's running_mean/var) through the coordinator: a rule of their own.

Measured on 2026-12-07 with real runs: fedbuff at its defaults and trimmed_mean with a buffer
ended a BatchNorm model with a running_var below zero (10 % accuracy), diloco with one of 1,575: a
policy's step on stale deltas (a server rate, outer momentum) is meaningless for statistics. The
coordinator now sets each version's statistics to the median of the values its results carry (a
delta's plus its base's). Real coordinators on real (memory) storage, crashed and restarted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from tests._crash import crash
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.storage import open_storage
from vcasync.tensors import ModelState

VAR, MEAN = "bn.running_var", "bn.running_mean"


def bn_model() -> ModelState:
    g = torch.Generator().manual_seed(0)
    return ModelState({"w": torch.randn(4, 3, generator=g), MEAN: torch.zeros(3),
                       VAR: torch.full((3,), 10.0), "n": torch.tensor(0, dtype=torch.int64)},
                      statistics={MEAN, VAR})


def make(storage: Any, clock: Any, policy: str, params: dict[str, Any] | None = None,
         **cfg: Any) -> Coordinator:
    config = CoordinatorConfig(**{"durability": "journal", "lease_timeout_s": 60.0,
                                  "restart_grace_s": 0.0, "snapshot_interval_s": 3600.0,
                                  "snapshot_every": 100, "max_staleness": 50,
                                  # one worker id stands for the workers holding the leases
                                  "max_leases_per_worker": None, **cfg})
    return Coordinator(bn_model(), make_units(40, steps=4), policy=build_policy(policy, params),
                       storage=storage, config=config, clock=clock)


async def send(kit: Any, coord: Coordinator, w: str, g: Any, kind: str, var: float,
               base: ModelState | None = None) -> Any:
    """A result that trained its base's weights a little and measured a variance of ``var``
    (``base``: its base version, when the coordinator no longer holds it)."""
    model = base if base is not None else coord.model(g.base_version)
    base = model if kind == "delta" else None
    values = {MEAN: torch.full((3,), 0.5), VAR: torch.full((3,), var)}
    if kind == "delta":
        assert base is not None
        tensors = {k: (values[k] - base[k] if k in values else
                       torch.full_like(v, 0.01) if v.is_floating_point() else torch.tensor(4))
                   for k, v in model.items()}
    else:
        tensors = {k: (values[k] if k in values else
                       v + 0.01 if v.is_floating_point() else v + 4) for k, v in model.items()}
    chunks = kit.result_chunks(g.lease_id, tensors, base_version=g.base_version, kind=kind, steps=4)
    return await coord.submit(w, g.lease_id, kit.stream(chunks))


#: the policies whose step moved statistics out of range, and two convex ones
POLICIES = [("fedbuff", {}), ("diloco", {}), ("trimmed_mean", {"buffer_size": 5}),
            ("vcasgd", {}), ("fedasync", {})]


@pytest.mark.parametrize(("policy", "params"), POLICIES)
@pytest.mark.parametrize("kind", ["delta", "weights"])
async def test_stale_results_keep_statistics_within_the_values_workers_measured(
        kit: Any, clock: Any, policy: str, params: dict[str, Any], kind: str) -> None:
    """Workers lease on old versions (their base's variance 10, the model's lower by then) and
    measure variances of 0.4-0.6: every version's variance is one of theirs or between them; a
    step on stale deltas went below zero (fedbuff, trimmed_mean) or far above (diloco)."""
    async with make(open_storage(f"memory://stats-{policy}-{kind}"), clock, policy, params) as c:
        w = await c.join("w")
        measured = [0.4, 0.6, 0.5, 0.45, 0.55]
        sent = 0
        for _ in range(4):   # rounds of leases taken before their results arrive, across buffers
            grants = [await c.lease(w) for _ in range(7)]
            for g in grants:
                receipt = await send(kit, c, w, g, kind, measured[sent % len(measured)])
                assert receipt.status == "accepted", receipt
                sent += 1
                var = c.model()[VAR]
                if c.version > 0:
                    assert bool((var >= 0.4 - 1e-5).all() and (var <= 0.6 + 1e-5).all()), (c.version,
                                                                                             var)
                    assert torch.allclose(c.model()[MEAN], torch.full((3,), 0.5))
        assert c.version > 0
        assert c.model()["n"].item() == 4 * sent or policy in ("fedbuff", "diloco", "trimmed_mean")


async def test_a_version_takes_the_median_of_the_values_it_applies(kit: Any, clock: Any) -> None:
    async with make(open_storage("memory://stats-median"), clock, "fedbuff",
                    {"buffer_size": 3}) as c:
        w = await c.join("w")
        grants = [await c.lease(w) for _ in range(3)]
        for g, var in zip(grants, [0.5, 90.0, 0.7], strict=True):   # one broken worker's 90
            await send(kit, c, w, g, "delta", var)
        assert c.version == 1
        assert torch.allclose(c.model()[VAR], torch.full((3,), 0.7))
        assert c.model().statistics == {MEAN, VAR}      # published versions name them too
        assert c.model()["w"].sub(bn_model()["w"]).abs().max().item() == pytest.approx(0.01)


@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_values_held_in_a_buffer_survive_a_crash(kit: Any, clock: Any, durability: str) -> None:
    """Two results wait in fedbuff's buffer (and their statistics with them) when the coordinator
    dies: after the restart the third applies all three, as without the crash."""
    async def run(crash_after: int | None) -> ModelState:
        storage = open_storage(f"memory://stats-crash-{durability}-{crash_after}")
        c = await make(storage, clock, "fedbuff", {"buffer_size": 3}, durability=durability,
                       snapshot_every=1).__aenter__()
        w = await c.join("w")
        grants = [await c.lease(w) for _ in range(3)]
        for i, (g, var) in enumerate(zip(grants, [0.5, 0.9, 0.7], strict=True)):
            if i == crash_after:
                for _ in range(500):          # the snapshot holding the two held results
                    if c.metrics.snapshots >= 3:
                        break
                    await asyncio.sleep(0.01)
                await crash(c)
                c = await make(storage, clock, "fedbuff", {"buffer_size": 3},
                               durability=durability, snapshot_every=1).__aenter__()
            before = c.version      # a snapshot-mode restart renumbers the version it recovered
            assert (await send(kit, c, w, g, "delta", var)).status == "accepted"
        assert c.version == before + 1
        model = c.model()
        await c.__aexit__(None, None, None)
        await storage.aclose()
        return model

    straight, crashed = await run(None), await run(2)
    assert torch.allclose(straight[VAR], torch.full((3,), 0.7))
    assert crashed.equal(straight)


async def test_journal_replay_gives_the_same_statistics_bit_for_bit(kit: Any, clock: Any) -> None:
    storage = open_storage("memory://stats-replay")
    a = await make(storage, clock, "diloco").__aenter__()
    w = await a.join("w")
    for var in [0.5, 0.9, 0.7, 0.6, 0.8, 0.4, 0.3]:
        g = await a.lease(w)
        await send(kit, a, w, g, "delta", var)
    model, version = a.model(), a.version
    await crash(a)
    async with make(storage, clock, "diloco") as b:
        assert b.version == version
        assert b.model().equal(model)
    await storage.aclose()


def test_from_module_names_float_buffers_as_statistics() -> None:
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
                                 torch.nn.Flatten(), torch.nn.Linear(4, 2))
    module.register_buffer("table", torch.ones(2), persistent=False)   # not in the state dict
    state = ModelState.from_module(module)
    assert state.statistics == {"1.running_mean", "1.running_var"}   # num_batches_tracked: a counter
    assert state.clone().statistics == state.statistics


@pytest.mark.parametrize(("statistics", "message"), [
    ({"nope"}, "not one of its tensors"), ({"n"}, "floating-point"), ("w", "collection")])
def test_statistics_that_do_not_fit_the_tensors_are_refused(statistics: Any, message: str) -> None:
    from vcasync.errors import ConfigError
    with pytest.raises(ConfigError, match=message):
        ModelState({"w": torch.zeros(2), "n": torch.tensor(0)}, statistics=statistics)


async def test_a_start_that_names_other_statistics_is_refused(kit: Any, clock: Any) -> None:
    """The journal keeps a result's statistics as values for the names the run had: a start whose
    model names none (a plain ``ModelState(tensors)``) replayed those values as the policy's deltas
    (a running_var of 11.05 where the run had 0.7). It is refused, naming them; a record from
    before the rule (no names) resumes and records the start's."""
    import json

    from vcasync.errors import ConfigError
    storage = open_storage("memory://stats-names")
    a = await make(storage, clock, "vcasgd").__aenter__()
    w = await a.join("w")
    for var in [0.5, 0.9, 0.7]:
        await send(kit, a, w, await a.lease(w), "delta", var)
    model = a.model()
    await crash(a)
    plain = ModelState(dict(bn_model().tensors))            # the same tensors, no names
    config = CoordinatorConfig(durability="journal", restart_grace_s=0.0, snapshot_every=100)
    with pytest.raises(ConfigError, match=r"running statistics: the run keeps bn\.running_mean, "
                                          r"bn\.running_var as running statistics, this model"):
        await Coordinator(plain, make_units(40, steps=4), policy=build_policy("vcasgd"),
                          storage=storage, config=config, clock=clock).__aenter__()
    async with make(storage, clock, "vcasgd") as b:           # the same names resume
        assert b.model().equal(model)
        assert torch.allclose(b.model()[VAR], torch.full((3,), 0.7))
    record = json.loads(await storage.get("vcasync/run"))
    assert record["identity"]["statistics"] == [MEAN, VAR]
    del record["identity"]["statistics"]                       # as a build before the rule wrote it
    await storage.put("vcasync/run", json.dumps(record).encode())
    async with make(storage, clock, "vcasgd") as c:
        assert c.version == model.version
    assert json.loads(await storage.get("vcasync/run"))["identity"]["statistics"] == [MEAN, VAR]
    await storage.aclose()


async def test_a_run_journaled_before_the_rule_replays_the_versions_it_had(kit: Any,
                                                                           clock: Any) -> None:
    """Entries journaled before statistics had a rule of their own carry no values: the policy
    merged their statistics as any float tensor. A restart with a model that names them (the build
    with the rule) replays those entries as they were merged then, so the version it publishes again
    is the one the run had (the replay kept the snapshot's statistics: version 2 had another
    running_var than the workers that downloaded it hold); results from then on take the median."""
    import json
    storage = open_storage("memory://stats-upgrade")
    config = CoordinatorConfig(durability="journal", lease_timeout_s=60.0, restart_grace_s=0.0,
                               snapshot_interval_s=3600.0, snapshot_every=100, max_staleness=50)

    def start(model: ModelState) -> Coordinator:
        return Coordinator(model, make_units(40, steps=4),
                           policy=build_policy("fedbuff", {"buffer_size": 2}), storage=storage,
                           config=config, clock=clock)

    old = await start(ModelState(dict(bn_model().tensors))).__aenter__()  # no names: as before
    w = await old.join("w")
    for var in [0.5, 0.9, 0.7, 0.6, 0.8]:
        await send(kit, old, w, await old.lease(w), "delta", var)
    model = old.model()
    await crash(old)
    record = json.loads(await storage.get("vcasync/run"))
    del record["identity"]["statistics"]                       # as a build before the rule wrote it
    await storage.put("vcasync/run", json.dumps(record).encode())
    async with start(bn_model()) as new:
        assert new.version == model.version == 2
        assert new.model().equal(model)
        w = await new.join("w2")
        await send(kit, new, w, await new.lease(w), "delta", 0.45)   # fills an old entry's buffer
        assert torch.allclose(new.model()[VAR], torch.full((3,), 0.45))
        for var in [0.55, 0.65]:
            await send(kit, new, w, await new.lease(w), "delta", var)
        assert new.version == 4
        assert torch.allclose(new.model()[VAR], torch.full((3,), 0.6))
    await storage.aclose()


@pytest.mark.parametrize("kind", ["delta", "weights"])
async def test_gate_refuses_a_result_whose_statistics_are_extreme(kit: Any, clock: Any,
                                                                  kind: str) -> None:
    """The policy sees what a result changes of the statistics, so gate measures them: a result
    whose weights are like the others' and whose running_var is -1e30 is a norm outlier. (When the
    policy saw neutral statistics, gate accepted it and the version published -1e30.)"""
    async with make(open_storage(f"memory://stats-gate-{kind}"), clock, "gate",
                    {"inner": "vcasgd", "warmup": 2}) as c:
        w = await c.join("w")
        for var in [0.5, 0.6, 0.55, 0.45, 0.5, 0.6, 0.4, 0.5]:
            assert (await send(kit, c, w, await c.lease(w), kind, var)).status == "accepted"
        before = c.model()
        receipt = await send(kit, c, w, await c.lease(w), kind, -1e30)
        assert (receipt.status, receipt.reason) == ("rejected", "norm_outlier")
        assert c.model().equal(before)


async def test_a_version_whose_result_left_its_statistics_out_keeps_the_previous_ones(
        kit: Any, clock: Any) -> None:
    """A delta on a base whose statistics are not held (its base predates a restart) leaves its
    statistics out: the version it makes keeps the previous version's, whatever the policy (here
    diloco, whose outer step on the raw delta moved them) made of them."""
    storage = open_storage("memory://stats-left-out")
    a = await make(storage, clock, "diloco", snapshot_every=1).__aenter__()
    w = await a.join("w")
    old = await a.lease(w)                                   # on version 0
    await send(kit, a, w, await a.lease(w), "delta", 0.5)    # version 1
    for _ in range(500):
        if a.metrics.snapshots >= 2:
            break
        await asyncio.sleep(0.01)
    await crash(a)
    async with make(storage, clock, "diloco", snapshot_every=1) as b:
        before = b.model()
        receipt = await send(kit, b, w, old, "delta", 9.0, base=bn_model())   # v0's are gone
        assert receipt.status == "accepted", receipt
        after = b.model()
        assert not torch.equal(after["w"], before["w"])      # its weights were merged
        assert torch.equal(after[VAR], before[VAR])
        assert torch.equal(after[MEAN], before[MEAN])
    await storage.aclose()
