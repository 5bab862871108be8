"""The run under a state prefix, for an embedding program: identity recorded and compared, a policy
reset that replays the journal with the run's own policy first, finished runs, records written
before identities were kept, unsafe stores, and start-up retried through transient faults."""

from __future__ import annotations

import json
import logging
import os
import stat
from typing import Any

import pytest
import torch

from tests._crash import crash
from vcasync.coordinator import Coordinator, CoordinatorConfig, StartOptions
from vcasync.errors import ConfigError, CorruptObjectError, TransientStorageError
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy, policy_spec
from vcasync.retry import RetryPolicy
from vcasync.storage import open_storage
from vcasync.testing.faults import FaultyStorage
from vcasync.testing.storage import IgnoringPreconditions

CFG = CoordinatorConfig(durability="journal", lease_timeout_s=10.0, snapshot_interval_s=3600.0,
                        snapshot_every=1000)


def make(kit, storage, clock, name: str = "vcasgd", params: dict[str, Any] | None = None, *,
         units: int = 6, start: StartOptions | None = None, **kw: Any) -> Coordinator:
    full = {**policy_spec(name).defaults(), **(params or {})}
    return Coordinator(kit.tiny_model(), make_units(units, steps=4), policy=build_policy(name, params),
                       storage=storage, config=CFG, clock=clock, policy_params=full, start=start,
                       **kw)


async def feed(kit, coord: Coordinator, n: int) -> None:
    w = await coord.join("w")
    for i in range(n):
        g = await coord.lease(w)
        chunks = kit.result_chunks(g.lease_id, kit.delta_like(coord.model(), 0.1 * (i + 1)),
                                   base_version=g.base_version, steps=g.unit.steps)
        receipt = await coord.submit(w, g.lease_id, kit.stream(chunks))
        assert receipt.status == "accepted", receipt


@pytest.fixture
async def storage():
    st = open_storage("memory://runs")
    yield st
    await st.aclose()


async def test_another_policy_is_refused_and_a_reset_replays_with_the_old_one(kit, clock,
                                                                              storage) -> None:
    a = await make(kit, storage, clock).__aenter__()
    await feed(kit, a, 3)
    expected = a.model()
    await crash(a)                      # three journal entries after the first snapshot

    for name, params in (("fedbuff", None), ("vcasgd", {"alpha": 0.7})):
        with pytest.raises(ConfigError, match="policy: the run uses vcasgd") as info:
            await make(kit, storage, clock, name, params).__aenter__()
        assert "--reset-policy" in str(info.value)

    b = await make(kit, storage, clock, "fedbuff", {"buffer_size": 1},
                   start=StartOptions(reset_policy=True)).__aenter__()
    assert b.status()["run_id"] == a.status()["run_id"]
    # the refused starts left a's record as it was: b takes the run over from a crash (before,
    # they released an owner record of their own and b took over from a clean stop, no grace)
    assert b._prefix_lease is not None
    assert b._prefix_lease.took_over
    clock.advance(b.config.restart_grace())
    for name, t in expected.items():   # replayed with vcasgd, bit for bit
        assert torch.equal(b.model()[name], t), name
    await feed(kit, b, 2)               # fedbuff merges from its own fresh state: no KeyError
    after = b.model()
    await crash(b)

    c = await make(kit, storage, clock, "fedbuff", {"buffer_size": 1}).__aenter__()  # recorded now
    for name, t in after.items():
        assert torch.equal(c.model()[name], t), name
    await c.aclose()


async def test_other_units_and_another_model_are_refused_with_what_differs(kit, clock,
                                                                           storage) -> None:
    async with make(kit, storage, clock):
        pass
    with pytest.raises(ConfigError, match=r"units: the run has 6 \(e0-s0 \.\. e0-s5\), this start "
                                          r"asks for 9"):
        await make(kit, storage, clock, units=9).__aenter__()
    record = json.loads(await storage.get("vcasync/run"))
    assert record["identity"]["units"]["count"] == 6         # a refused start changes nothing
    async with make(kit, storage, clock, start=StartOptions(new_run=True), units=9) as fresh:
        assert fresh.status()["units"]["queued"] == 9
        assert fresh.status()["run_id"] != record["run_id"]


async def _objects(storage) -> dict[str, bytes]:
    return {k: await storage.get(k) async for k in storage.list("")}


async def test_a_refused_start_leaves_every_stored_object_as_it_was(kit, clock, storage) -> None:
    # found by review: the refused start took owner epoch 3 (released on the way out) and pruned
    # epoch 1's record, so the next start was epoch 4 and the store no longer what it was
    for _ in range(2):                      # owner records 1 and 2 (2 released)
        async with make(kit, storage, clock):
            pass
    before = await _objects(storage)
    assert sorted(k for k in before if k.startswith("vcasync/owner/")) == [
        "vcasync/owner/000000000001.json", "vcasync/owner/000000000002.json"]
    with pytest.raises(ConfigError, match="which this start does not match"):
        await make(kit, storage, clock, units=9).__aenter__()
    assert await _objects(storage) == before            # byte for byte, no key more or less
    async with make(kit, storage, clock) as again:      # and the next start takes epoch 3
        assert again._prefix_lease is not None
        assert again._prefix_lease.epoch == 3
    assert [k async for k in storage.list("vcasync/owner/")] == [
        "vcasync/owner/000000000002.json", "vcasync/owner/000000000003.json"]


async def test_a_start_refused_after_reading_the_run_leaves_it_as_it_was_too(kit, clock,
                                                                            storage) -> None:
    from vcasync.policy import register_policy, unregister_policy

    class Gone(kit.HalfWay):
        name = "gone"

    register_policy("gone", Gone)
    try:
        async with Coordinator(kit.tiny_model(), make_units(6, steps=4), policy=Gone(),
                               storage=storage, config=CFG, clock=clock, policy_params={}):
            pass
    finally:
        unregister_policy("gone")
    before = await _objects(storage)
    # the run record is read and matches but for the policy; the run's own policy, needed to
    # replay its journal before the switch, is not installed: refused before anything is written
    with pytest.raises(ConfigError, match="the run's policy 'gone' is needed"):
        await make(kit, storage, clock, start=StartOptions(reset_policy=True)).__aenter__()
    assert await _objects(storage) == before


async def test_a_finished_run_says_so_at_start(kit, clock, storage) -> None:
    async with make(kit, storage, clock, units=2) as a:
        await feed(kit, a, 2)
        await a.wait_finished()
    async with make(kit, storage, clock, units=2) as b:
        assert b.finished
        assert b.status()["units"]["done"] == 2


async def test_a_run_recorded_before_identities_is_adopted(kit, clock, storage) -> None:
    async with make(kit, storage, clock) as a:
        run_id = a.status()["run_id"]
    record = json.loads(await storage.get("vcasync/run"))
    del record["identity"]
    await storage.put("vcasync/run", json.dumps(record).encode())
    async with make(kit, storage, clock) as b:
        assert b.status()["run_id"] == run_id
    assert json.loads(await storage.get("vcasync/run"))["identity"]["policy"]["name"] == "vcasgd"


@pytest.mark.parametrize("found", [2, "1", True])
async def test_a_run_record_of_another_format_is_refused_and_left_as_it_was(kit, clock, storage,
                                                                           found) -> None:
    """A record a later build wrote (or one damaged into another format) may mean something else
    by its fields: the start refuses it, naming both formats, and changes nothing of the run (it
    used to resume it as if it were format 1). --new-run still starts afresh."""
    async with make(kit, storage, clock) as a:
        await feed(kit, a, 2)
        run_id = a.status()["run_id"]
    record = json.loads(await storage.get("vcasync/run"))
    record["format"] = found
    await storage.put("vcasync/run", json.dumps(record).encode())

    async def stored() -> dict[str, bytes]:
        return {k: await storage.get(k) async for k in storage.list("vcasync/")
                if "/owner/" not in k}

    before = await stored()
    with pytest.raises(CorruptObjectError, match=f"vcasync/run: run record format {found!r}, "
                                                 "and this vcasync reads format 1 only"):
        await make(kit, storage, clock).__aenter__()
    assert await stored() == before
    async with make(kit, storage, clock, start=StartOptions(new_run=True)) as b:
        assert b.status()["run_id"] != run_id
        assert b.version == 0


@pytest.mark.parametrize(("record", "why"), [
    ({"format": 1}, "it has no 'run_id' and no 'secret' field"),
    ({"format": 1, "run_id": "0123abcd"}, "it has no 'secret' field"),
    ({"format": 1, "run_id": None, "secret": "ab"}, "its 'run_id' is None, not a non-empty string"),
    ({"format": 1, "run_id": "0123abcd", "secret": "not-hex-s3cr3t"},
     "its 'secret' is not a non-empty hexadecimal string"),
    ({"format": 1, "run_id": "0123abcd", "secret": "ab", "identity": {"layout": 1}},
     "its 'identity' has no 'units' field"),
    ([1], "a JSON list, not an object"),
])
async def test_a_damaged_run_record_names_what_is_wrong_and_is_left_as_it_was(kit, clock, storage,
                                                                             record, why) -> None:
    """Found by a probe: a record ``{"format": 1}`` was refused as "not a vcasync run record
    (KeyError('run_id'))", and a null run id was resumed as the run "None". Each problem is named
    plainly (the secret never shown), and nothing is written."""
    await storage.put("vcasync/run", json.dumps(record).encode())
    with pytest.raises(CorruptObjectError) as info:
        await make(kit, storage, clock).__aenter__()
    assert str(info.value) == f"vcasync/run: not a vcasync run record ({why})"
    assert "s3cr3t" not in str(info.value)
    assert json.loads(await storage.get("vcasync/run")) == record
    assert [k async for k in storage.list("vcasync/") if "/owner/" not in k] == ["vcasync/run"]


async def test_a_store_that_ignores_if_absent_is_refused_unless_allowed(kit, clock, storage,
                                                                        caplog) -> None:
    unsafe = IgnoringPreconditions(storage)
    with pytest.raises(ConfigError, match="does not honour conditional writes"):
        await make(kit, unsafe, clock).__aenter__()
    assert [k async for k in storage.list()] == []
    async with make(kit, unsafe, clock, start=StartOptions(allow_unsafe_store=True)) as a:
        run_id = a.status()["run_id"]
    assert "UNSAFE STORE" in caplog.text
    async with make(kit, unsafe, clock, start=StartOptions(allow_unsafe_store=True)) as b:
        assert b.status()["run_id"] == run_id          # read first: never overwritten


async def test_start_up_retries_a_transient_storage_fault(kit, clock, storage) -> None:
    failed: list[str] = []

    def first_record_write(op: str, key: str | None) -> bool:
        if op == "put" and key == "vcasync/run" and not failed:
            failed.append(key)
            return True
        return False

    flaky = FaultyStorage(storage, trigger=first_record_write)
    fast = RetryPolicy(attempts=3, base_delay_s=0.0, max_delay_s=0.0)
    async with make(kit, flaky, clock, startup_retry=fast) as a:   # type: ignore[arg-type]
        assert a.status()["phase"] == "running"
    assert failed == ["vcasync/run"]
    never = FaultyStorage(storage, trigger=lambda op, key: op == "get")
    with pytest.raises(TransientStorageError, match="gave up after 3 attempts"):
        await make(kit, never, clock, startup_retry=fast).__aenter__()   # type: ignore[arg-type]


@pytest.mark.parametrize(("state", "why"), [
    ({"obj": object()}, "the state init_state(model) returns cannot be stored (tree.obj: cannot pack"),
    ({1: 2}, "cannot be stored (tree: dict keys must be str"),
    ([1, 2], "init_state(model) returned a list"),
    (ZeroDivisionError("boom"), "init_state(model) raised ZeroDivisionError: boom"),
])
async def test_a_policy_state_the_run_cannot_store_is_refused_before_anything_is_written(
        kit, clock, storage, state: Any, why: str) -> None:
    # the first snapshot's TypeError came after the run record and the owner lease were written
    class Unstorable(kit.HalfWay):
        name = "unstorable"

        def init_state(self, model):
            if isinstance(state, Exception):
                raise state
            return state

    with pytest.raises(ConfigError, match=r"policy 'unstorable': ") as info:
        Coordinator(kit.tiny_model(), make_units(2, steps=4), policy=Unstorable(), storage=storage,
                    config=CFG, clock=clock)
    assert why in str(info.value)
    assert [k async for k in storage.list("")] == []


# -- the initial model's origin: seed and factory (probe D2: a seed sweep in one directory reused the
#    first seed's finished run, exit 0, training nothing) ------------------------------------------

SEED0 = {"factory": "app:model", "seed": 0}


async def test_another_seed_or_factory_is_refused_with_both_values(kit, clock, storage) -> None:
    async with make(kit, storage, clock, model_origin=SEED0) as a:
        run_id = a.status()["run_id"]
    before = await _objects(storage)
    for origin, line in (({**SEED0, "seed": 1},
                          "initial model: the run was started with seed=0, this start asks for "
                          "seed=1"),
                         ({**SEED0, "factory": "other:model"},
                          "initial model: the run was started with factory='app:model', this start "
                          "asks for factory='other:model'")):
        with pytest.raises(ConfigError, match="which this start does not match") as info:
            await make(kit, storage, clock, model_origin=origin).__aenter__()
        assert line in str(info.value)
        assert "--new-run" in str(info.value)
        assert "--reset-policy" not in str(info.value)          # no policy changed
        assert await _objects(storage) == before                # a refused start changes nothing
    async with make(kit, storage, clock, model_origin=SEED0) as same:     # the same command resumes
        assert same.status()["run_id"] == run_id
    async with make(kit, storage, clock, model_origin={**SEED0, "seed": 1},
                    start=StartOptions(new_run=True)) as fresh:
        assert fresh.status()["run_id"] != run_id


async def test_the_same_origin_resumes_after_a_crash(kit, clock, storage) -> None:
    a = await make(kit, storage, clock, model_origin=SEED0).__aenter__()
    await feed(kit, a, 2)
    expected, run_id = a.model(), a.status()["run_id"]
    await crash(a)
    async with make(kit, storage, clock, model_origin=SEED0) as b:
        assert b.status()["run_id"] == run_id
        assert b.version == expected.version
        assert all(torch.equal(b.model().tensors[k], v) for k, v in expected.tensors.items())


async def test_an_origin_one_side_does_not_know_is_not_a_difference(kit, clock, storage) -> None:
    """A run recorded by an older build (no origin) resumes and takes the start's; an embedding
    program that passes none resumes a run that has one, and keeps it in the record."""
    async with make(kit, storage, clock, model_origin=SEED0) as a:
        run_id = a.status()["run_id"]
    record = json.loads(await storage.get("vcasync/run"))
    assert record["identity"]["origin"] == SEED0
    del record["identity"]["origin"]                    # as the previous version wrote it
    await storage.put("vcasync/run", json.dumps(record).encode())
    async with make(kit, storage, clock, model_origin={**SEED0, "seed": 7}) as b:
        assert b.status()["run_id"] == run_id
    assert json.loads(await storage.get("vcasync/run"))["identity"]["origin"]["seed"] == 7
    with pytest.raises(ConfigError, match="seed=7, this start asks for seed=0"):
        await make(kit, storage, clock, model_origin=SEED0).__aenter__()
    async with make(kit, storage, clock) as c:         # no origin said: unknown, not different
        assert c.status()["run_id"] == run_id
    async with make(kit, storage, clock, "fedbuff", {"buffer_size": 1},
                    start=StartOptions(reset_policy=True)) as d:   # a reset keeps the origin
        assert d.status()["run_id"] == run_id
    identity = json.loads(await storage.get("vcasync/run"))["identity"]
    assert (identity["policy"]["name"], identity["origin"]) == ("fedbuff", {**SEED0, "seed": 7})


async def test_a_policy_reference_is_recorded_and_not_compared(kit, clock, storage, caplog) -> None:
    """A run without one (an installed policy, an older build) records none and takes a start's;
    another reference for the same policy resumes the run with a warning naming both."""
    async with make(kit, storage, clock) as a:
        run_id = a.status()["run_id"]
    assert "ref" not in json.loads(await storage.get("vcasync/run"))["identity"]["policy"]
    async with make(kit, storage, clock, policy_ref="here:Policy") as b:
        assert b.status()["run_id"] == run_id
    assert json.loads(await storage.get("vcasync/run"))["identity"]["policy"]["ref"] == "here:Policy"
    caplog.clear()
    async with make(kit, storage, clock, policy_ref="there:Policy") as c:
        assert c.status()["run_id"] == run_id
    assert ("was started with policy 'vcasgd' from 'here:Policy'; this start imports 'vcasgd' from "
            "'there:Policy'") in caplog.text
    assert json.loads(await storage.get("vcasync/run"))["identity"]["policy"]["ref"] == "there:Policy"


async def test_a_policy_reset_on_a_finished_run_switches_nothing_and_writes_nothing(
        kit, clock, storage, caplog: pytest.LogCaptureFixture) -> None:
    # found by a probe: --reset-policy on a finished run rewrote the run record and a snapshot,
    # logged "switches from vcasgd to fedbuff", then reported the run finished
    async with make(kit, storage, clock, units=2) as a:
        await feed(kit, a, 2)
        assert a.finished
        final, version = a.model(), a.version

    async def kept() -> dict[str, bytes]:   # each start takes and releases the owner lease
        return {k: v for k, v in (await _objects(storage)).items()
                if "/owner/" not in k and not k.endswith(("/probe", "probe/"))}

    before = await kept()
    with caplog.at_level("WARNING", logger="vcasync.coordinator"):
        async with make(kit, storage, clock, "fedbuff", {"buffer_size": 1}, units=2,
                        start=StartOptions(reset_policy=True)) as b:
            assert b.finished
            assert b.version == version
            assert b.status()["policy"] == "vcasgd"
            for name, t in final.items():
                assert torch.equal(b.model()[name], t), name
    assert await kept() == before
    assert "is finished at v2, so nothing is switched: it keeps its policy vcasgd" in caplog.text
    assert "switches from" not in caplog.text


def test_a_new_run_with_a_policy_reset_is_refused_as_meaning_nothing() -> None:
    # found by a probe: --new-run --reset-policy was taken, the stored run deleted and the reset
    # meaningless without a word
    with pytest.raises(ConfigError, match="means nothing beside it: give one of the two"):
        StartOptions(new_run=True, reset_policy=True)


async def test_a_run_record_other_local_users_can_read_is_named_with_the_chmod_to_run(
        kit, clock, tmp_path, caplog) -> None:
    """Found by a probe: the file:// store writes objects 0600, but a run record a build before
    2026-12-07 wrote 0644 (the secret that signs the run's leases) kept that mode at every start,
    without a word. A start now warns, once, naming the file and the chmod to run; a root the
    operator made 0755 is left alone (the record's own mode keeps the secret)."""
    root = tmp_path / "shared store"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    record = root / "vcasync" / "run"

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and "run record" in r.getMessage()]

    async with open_storage(root.as_uri()) as st:
        async with make(kit, st, clock):
            pass
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
        assert warnings() == []                          # a new run: nothing to say

        os.chmod(record, 0o644)                          # as the older build left it
        async with make(kit, st, clock):
            pass
        assert warnings() == [
            f"the run record {record} (mode 0644) holds the secret that signs this run's leases, "
            f"but other local users can read it: run chmod 600 '{record}'"]
        assert stat.S_IMODE(record.stat().st_mode) == 0o644  # warned about, not changed

        caplog.clear()
        os.chmod(record, 0o600)                          # the command it named
        async with make(kit, st, clock):
            pass
        assert warnings() == []
        assert stat.S_IMODE(root.stat().st_mode) == 0o755


async def test_a_policy_parameter_the_record_lacks_is_not_a_difference(kit, clock, storage) -> None:
    """A policy that gained a parameter (diloco's ``staleness``, 2026-12-08) refused every run
    recorded before, even one whose recorded values all matched: a parameter one side lacks is
    unknown there now, the start records it, and a value both know still has to match."""
    given = {"momentum": 0.9}
    async with make(kit, storage, clock, "diloco", given) as a:
        await feed(kit, a, 2)
        run_id = a.status()["run_id"]
    record = json.loads(await storage.get("vcasync/run"))
    del record["identity"]["policy"]["params"]["staleness"]     # as the build before wrote it
    await storage.put("vcasync/run", json.dumps(record).encode())
    async with make(kit, storage, clock, "diloco", given) as b:
        assert b.status()["run_id"] == run_id
    params = json.loads(await storage.get("vcasync/run"))["identity"]["policy"]["params"]
    assert "staleness" in params
    assert params["momentum"] == 0.9
    # the old defaults recorded momentum 0.9; today's unset one is another policy, said so
    with pytest.raises(ConfigError, match=r"policy: the run uses diloco .*momentum"):
        await make(kit, storage, clock, "diloco").__aenter__()
