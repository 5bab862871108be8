"""The small pieces: token authority, the error table both ways, Prometheus rendering, run config."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from vcasync import errors as E
from vcasync.errors import AuthError, ConfigError
from vcasync.ledger import MAX_UNITS
from vcasync.protocol._errors import HTTP_ERRORS, error_fields, error_from_body, spec_for
from vcasync.runconfig import UnitsConfig, load_run_config
from vcasync.server._auth import StorageTokenStore, TokenAuthority
from vcasync.storage import open_storage

from .conftest import SECRET

# -- auth -------------------------------------------------------------------------------------------


async def test_tokens_issue_verify_revoke() -> None:
    auth = TokenAuthority(join_secret=SECRET)
    assert auth.check_join(SECRET).name is None
    t1 = await auth.issue("w1")
    t2 = await auth.issue("w1")
    t3 = await auth.issue("w2")
    assert len({t1, t2, t3}) == 3
    assert auth.verify(t1) == "w1"
    assert auth.verify(t3) == "w2"
    for bad in ("", "vca_", t1[:-1], t1 + "x", t1.replace("vca_", "vcb_"), SECRET, "vca_" + "0" * 60):
        with pytest.raises(AuthError):
            auth.verify(bad)
    assert await auth.revoke("w1") == 2
    with pytest.raises(AuthError, match="revoked"):
        auth.verify(t2)
    assert auth.verify(t3) == "w2"
    assert auth.live_tokens() == 1


def test_join_credentials() -> None:
    auth = TokenAuthority(join_secret=SECRET, join_tokens={"gpu-7": "pre-issued-token-gpu7-aaaa"})
    assert auth.check_join("pre-issued-token-gpu7-aaaa").name == "gpu-7"
    with pytest.raises(AuthError):
        auth.check_join(SECRET + " ")
    assert auth.revoke_join_token("gpu-7")
    with pytest.raises(AuthError):
        auth.check_join("pre-issued-token-gpu7-aaaa")
    with pytest.raises(ConfigError, match="no join credential"):
        TokenAuthority()
    with pytest.raises(ConfigError, match="too short"):
        TokenAuthority(join_secret="short")



def test_a_join_token_is_as_long_as_the_secret_and_never_the_secret() -> None:
    # found by a tester: a 3-character join token was taken, and so was a token equal to the join
    # secret (revoking that worker's token then left it the secret to join with)
    with pytest.raises(ConfigError, match="the join token of 'gpu-7' is too short: use at least 16") as info:
        TokenAuthority(join_secret=SECRET, join_tokens={"gpu-7": "abc"})
    assert "abc" not in str(info.value)
    with pytest.raises(ConfigError, match="the join token of 'gpu-7' is the join secret") as info:
        TokenAuthority(join_secret=SECRET, join_tokens={"ok": "pre-issued-token-ok-0000", "gpu-7": SECRET})
    assert SECRET not in str(info.value)
    TokenAuthority(join_tokens={"gpu-7": "pre-issued-token-gpu7-aaaa"})   # tokens alone: fine


async def test_tokens_survive_a_restart_through_storage_as_digests_only() -> None:
    async with open_storage("memory://tokens-test") as storage:
        first = TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage))
        token = await first.issue("w9")
        gone = await first.issue("w8")
        await first.revoke("w8")
        second = TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage))
        await second.load()
        assert second.verify(token) == "w9"
        with pytest.raises(AuthError, match="revoked"):
            second.verify(gone)
        blobs = [await storage.get(k) async for k in storage.list("auth/")]
        assert len(blobs) == 2
        for blob in blobs:
            assert token.encode() not in blob
            assert token.split("_", 2)[2].encode() not in blob   # the secret part, "_" and all


async def test_many_tokens_load_in_parallel_and_a_corrupt_one_is_named() -> None:
    """Each machine that joins leaves a record; a restart reads them ``LOAD_PARALLEL`` at a time
    (counted at the storage), every one of them, and names a corrupt one."""
    async with open_storage("memory://tokens-many") as storage:
        first = TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage))
        tokens = {f"w{i}": await first.issue(f"w{i}") for i in range(200)}
        in_flight, most = 0, 0
        real_get = storage.get

        async def counting_get(key: str) -> bytes:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                await asyncio.sleep(0.001)
                return await real_get(key)
            finally:
                in_flight -= 1

        storage.get = counting_get  # type: ignore[method-assign]
        second = TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage))
        await second.load()
        assert all(second.verify(tok) == w for w, tok in tokens.items())
        assert most == StorageTokenStore.LOAD_PARALLEL
        key = [k async for k in storage.list("auth/tokens/")][7]
        await storage.put(key, b"{not json")
        with pytest.raises(ConfigError, match="is corrupt"):
            await StorageTokenStore(storage).load()


# -- the error table --------------------------------------------------------------------------------


def _instance(cls: type[E.VCAsyncError]) -> E.VCAsyncError:
    params = inspect.signature(cls.__init__).parameters
    kwargs = {"plugin": "p"} if "plugin" in params else {}
    if "reason" in params and params["reason"].default is inspect.Parameter.empty:
        kwargs["reason"] = "because"
    return cls("it went wrong", **kwargs)


@pytest.mark.parametrize("name", E.__all__)
def test_every_error_has_an_http_answer_and_comes_back(name: str) -> None:
    cls = getattr(E, name)
    exc = _instance(cls)
    spec = spec_for(exc)
    assert 400 <= spec.status < 600
    body = {"error": spec.code, "message": str(exc), **error_fields(exc)}
    back = error_from_body(spec.status, body)
    assert isinstance(back, E.VCAsyncError)
    if cls in HTTP_ERRORS:  # classes with their own entry come back as themselves
        assert type(back) is cls


def test_error_fields_and_refinements() -> None:
    exc = E.LimitExceededError("too big", field="body", limit=10, value=11)
    assert spec_for(exc).status == 413
    assert error_fields(exc) == {"field": "body", "limit": 10, "value": 11}
    back = error_from_body(413, {"error": "limit_exceeded", "message": "m", **error_fields(exc)})
    assert isinstance(back, E.LimitExceededError)
    assert (back.limit, back.value, back.field) == (10, 11, "body")
    done = E.NoWorkAvailableError("done", finished=True)
    assert (spec_for(done).status, spec_for(done).code) == (410, "run_finished")
    back = error_from_body(410, {"error": "run_finished", "message": "x", "finished": True})
    assert isinstance(back, E.NoWorkAvailableError)
    assert back.finished
    assert spec_for(E.NoWorkAvailableError("later")).status == 503
    assert spec_for(ValueError("x")).status == 500
    unknown = error_from_body(418, {"error": "teapot", "message": "short and stout"})
    assert type(unknown) is E.VCAsyncError
    assert "teapot" in str(unknown)


# -- run config ---------------------------------------------------------------------------------------


def test_run_config_from_toml_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[model]\nfactory = "vcasync.examples.digits:model"\n'
                    '[units]\nshards = 3\nepochs = 2\nsteps = 5\n[units.params]\nlr = 0.1\n'
                    '[policy]\nname = "fedasync"\n[policy.params]\nalpha = 0.3\n'
                    '[coordinator]\ndurability = "snapshot"\n[server]\nport = 9000\ntls_cert = "c.pem"\n'
                    'tls_key = "k.pem"\n')
    cfg = load_run_config(path, {"units": {"steps": 7, "epochs": None}, "server": {"host": "0.0.0.0"}})
    assert cfg.model == "vcasync.examples.digits:model"
    units = cfg.units.build()
    assert [u.unit_id for u in units][:4] == ["e0-s0", "e0-s1", "e0-s2", "e1-s0"]
    assert len(units) == 6
    assert units[0].steps == 7
    assert units[0].params == {"lr": 0.1}
    assert cfg.policy == {"name": "fedasync", "params": {"alpha": 0.3}}
    assert cfg.coordinator == {"durability": "snapshot"}
    assert (cfg.server.port, cfg.server.host, cfg.server.tls_cert) == (9000, "0.0.0.0", Path("c.pem"))


def test_units_count() -> None:
    units = UnitsConfig(shards=4, count=10, steps=2).build()
    assert len(units) == 10
    assert {u.shard for u in units} == {0, 1, 2, 3}
    # only the units asked for are built: 5 of a billion shards, at once
    few = UnitsConfig(shards=10**9, count=5).build()
    assert [u.unit_id for u in few] == [f"e0-s{i}" for i in range(5)]
    assert few[0].num_shards == 10**9


@pytest.mark.parametrize(("table", "match"), [
    ({"shards": 2, "epochs": 100_000_000},
     r"2 shards x 100000000 epochs = 200,000,000 work units; the limit is 10,000,000"),
    ({"shards": 10**9}, r"1000000000 shards x 1 epochs = 1,000,000,000 work units"),
    ({"shards": 3, "count": MAX_UNITS + 1}, r"count = 10,000,001 work units; the limit"),
])
def test_a_run_of_more_units_than_the_ledger_keeps_is_refused_before_any_is_built(
        table: dict[str, int], match: str) -> None:
    # a typo (epochs = 100000000) used to build 200 million units until the machine ran out of memory
    with pytest.raises(ConfigError, match=match):
        UnitsConfig(**table).build()  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "match"), [
    ('[model]\nfactory = "m:f"\n[unitz]\nshards = 1\n', "unknown section.*unitz"),
    ('[model]\nfactory = "m:f"\n[units]\nshard = 1\n', r"unknown key\(s\) in \[units\]: shard"),
    ('[model]\nfactory = "m:f"\n[units]\nshards = "two"\n', "units.shards must be int, got .two."),
    ('[model]\nfactory = "m:f"\n[server]\nport = 99999\n', "port 99999 is out of range"),
    ('[model]\nfactory = "m:f"\n[server]\ntls_cert = "c.pem"\n', "needs both"),
    ('[units]\nshards = 1\n', "no model factory"),
    ("[model\n", "not valid TOML"),
    # each was served: "run finished; serving -5s more" (and "nans more")
    ('[model]\nfactory = "m:f"\n[run]\nlinger_s = -5\n', r"run.linger_s \(--linger\) must be a finite "
                                                        r"number of seconds >= 0, got -5.0"),
    ('[model]\nfactory = "m:f"\n[run]\nlinger_s = nan\n', "run.linger_s .* got nan"),
    ('[model]\nfactory = "m:f"\n[run]\nlinger_s = inf\n', "run.linger_s .* got inf"),
    # found by a new-user probe: -1 was taken, and a seed past 2**64 crashed torch.manual_seed
    ('[model]\nfactory = "m:f"\nseed = -1\n', r"model.seed \(--seed\) must be in \[0, 2\*\*32\), .*got -1"),
    ('[model]\nfactory = "m:f"\nseed = 4294967296\n', r"model.seed .* must be in \[0, 2\*\*32\)"),
])
def test_bad_run_configs_name_the_problem(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_run_config(path)


#: What ``vcasync coordinator`` passes when no flag is given: every key None, every section a table.
NO_FLAGS = {"model": {"factory": None, "seed": None}, "units": {"steps": None},
            "policy": {"name": None}, "storage": {"url": None},
            "coordinator": {"durability": None, "lease_timeout_s": None},
            "server": {"host": None, "port": None}, "run": {"linger_s": None, "output": None}}


@pytest.mark.parametrize(("text", "flags", "match"), [
    ('storage = "/srv/run1"\n', {}, r"\[storage\] must be a table, got a string '/srv/run1'"),
    ('coordinator = "none"\n', {}, r"\[coordinator\] must be a table, got a string 'none'"),
    ("server = 5\n", {}, r"\[server\] must be a table, got an integer 5"),
    ("run = [1]\n", {}, r"\[run\] must be a table, got an array \[1\]"),
    ("units.params = 0.1\n", {"units": {"params": {"lr": 0.2}}},
     r"\[units.params\] must be a table, got a float 0.1"),
])
def test_a_section_that_is_not_a_table_is_refused_with_the_flags_given(
        tmp_path: Path, text: str, flags: dict[str, dict[str, object]], match: str) -> None:
    # the flags' tables (all None) replaced the string by {}: storage = "/srv/run1" ran in ./vcasync-run
    path = tmp_path / "run.toml"
    path.write_text('model = {factory = "vcasync.examples.digits:model"}\n' + text)
    overrides = {k: {**v, **flags.get(k, {})} for k, v in NO_FLAGS.items()}
    with pytest.raises(ConfigError, match=match):
        load_run_config(path, overrides)
    with pytest.raises(ConfigError, match=match.split(r"\]")[0].replace(r"\[", "")):   # no flags
        load_run_config(path)


@pytest.mark.parametrize("flags", [{}, NO_FLAGS])
def test_policy_params_without_a_name_tune_the_default_policy(tmp_path: Path,
                                                               flags: dict[str, object]) -> None:
    # run-toml.md gives the name's default as "vcasgd", but [policy.params] alone was refused:
    # "the policy table needs a 'name'"
    path = tmp_path / "run.toml"
    path.write_text('[model]\nfactory = "m:f"\n[policy.params]\nalpha = 0.3\n')
    assert load_run_config(path, flags).policy == {"name": "vcasgd", "params": {"alpha": 0.3}}
    path.write_text('[model]\nfactory = "m:f"\n[policy]\nname = "fedasync"\n')
    assert load_run_config(path, flags).policy == {"name": "fedasync"}


@pytest.mark.parametrize("file_policy", ['[policy]\nname = "vcasgd"\n', ""])
def test_a_policy_flag_naming_another_policy_drops_the_files_params(tmp_path: Path, file_policy: str) -> None:
    # runs.md's "--policy fedbuff --policy-param buffer_size=4 --reset-policy" over the README's
    # run.toml (vcasgd, alpha = 0.5) was refused: "unknown parameter(s) for policy 'fedbuff': alpha"
    path = tmp_path / "run.toml"
    path.write_text('[model]\nfactory = "m:f"\n' + file_policy + '[policy.params]\nalpha = 0.5\n')
    flags = {"policy": {"name": "fedbuff", "params": {"buffer_size": 4}}}
    assert load_run_config(path, flags).policy == {"name": "fedbuff", "params": {"buffer_size": 4}}
    assert load_run_config(path, {"policy": {"name": "fedbuff"}}).policy == {"name": "fedbuff"}
    # the file's own policy named again: its params still apply, the flags' on top
    same = {"policy": {"name": "vcasgd", "params": {"schedule": "constant"}}}
    assert load_run_config(path, same).policy == {"name": "vcasgd",
                                                  "params": {"alpha": 0.5, "schedule": "constant"}}
    assert load_run_config(path, {"policy": {"name": None}}).policy == {"name": "vcasgd",
                                                                        "params": {"alpha": 0.5}}
