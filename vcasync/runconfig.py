"""The coordinator's run configuration: a TOML file, command-line overrides, one frozen value.

::

    [model]
    factory = "vcasync.examples.digits:model"   # returns an nn.Module: the initial weights
    seed = 0

    [units]                                     # shards x epochs units of `steps` local steps
    shards = 8
    epochs = 5
    steps = 40
    # count = 30                                # optional: total units (overrides epochs)
    [units.params]                              # handed to the trainer in ctx.unit.params
    lr = 0.05

    [policy]
    name = "vcasgd"
    [policy.params]
    alpha = 0.5

    [storage]
    url = "file:///var/lib/vcasync/run1"

    [coordinator]                               # any CoordinatorConfig field
    durability = "journal"
    lease_timeout_s = 60.0

    [server]                                    # any ServerConfig field
    host = "0.0.0.0"
    port = 8470
    tls_cert = "/etc/vcasync/cert.pem"
    tls_key = "/etc/vcasync/key.pem"

Secrets never live here: the join secret comes from the environment (see ``vcasync coordinator -h``).
Unknown keys are errors that name the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .coerce import SEED_RANGE, coerce, from_table, is_seed
from .errors import ConfigError
from .ledger._units import MAX_UNIT_INT, WorkUnit, check_user_params, make_units
from .server import ServerConfig

__all__ = ["RunConfig", "UnitsConfig", "dataclass_from_table", "load_run_config", "merge_tables"]

_SECTIONS = frozenset({"model", "units", "policy", "storage", "coordinator", "server", "run"})


@dataclass(frozen=True, slots=True)
class UnitsConfig:
    """How the training set is cut into work units."""

    shards: int = 1                     # data shards; ctx.unit.shard of ctx.unit.num_shards
    epochs: int = 1                     # units per shard (one per epoch)
    steps: int = 100                    # local steps per unit
    count: int | None = None            # exactly this many units, cycling through the shards
    params: Mapping[str, Any] = field(default_factory=dict)   # handed to the trainer: ctx.unit.params

    def __post_init__(self) -> None:
        # each count named as the run.toml key and the flag that set it: "--shards -1" was refused
        # as "work unit field 'num_shards' must be >= 1", which names neither
        for name, flag in (("shards", "--shards"), ("epochs", "--epochs"), ("steps", "--steps"),
                           ("count", "--units")):
            value = getattr(self, name)
            if value is None and name == "count":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"units.{name} ({flag}) must be a whole number >= 1, got {value!r}")
            if value > MAX_UNIT_INT:    # a unit carries it to workers and into every snapshot
                raise ConfigError(f"units.{name} ({flag}) must be at most 2**63 - 1 (what a "
                                  f"worker's result and a snapshot can carry), got {value}")
        if isinstance(self.params, Mapping):
            check_user_params(self.params, "units.params ([units.params] in run.toml, --unit-param)")

    def build(self) -> list[WorkUnit]:
        """``shards x epochs`` units ``e{epoch}-s{shard}``; with ``count``, exactly ``count`` units cycling
        through the shards (``count`` then overrides ``epochs``)."""
        epochs = self.epochs
        if self.count is not None:
            epochs = math.ceil(self.count / max(1, self.shards))
        # with count, only those units are built (5 units of 10**9 shards built them all)
        return make_units(self.shards, epochs=epochs, steps=self.steps, params=dict(self.params),
                          count=self.count)


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything ``vcasync coordinator`` needs except secrets."""

    model: str
    seed: int = 0
    units: UnitsConfig = field(default_factory=UnitsConfig)
    policy: Mapping[str, Any] = field(default_factory=lambda: {"name": "vcasgd"})
    storage: str = "./vcasync-run"
    coordinator: Mapping[str, Any] = field(default_factory=dict)
    server: ServerConfig = field(default_factory=ServerConfig)
    #: Seconds to keep serving after the run is finished (workers hear "finished"), then exit.
    linger_s: float = 10.0
    #: Where to write the final weights (``torch.save`` of the state dict), if anywhere; its
    #: directory must exist (checked when the coordinator starts).
    output: Path | None = None

    def __post_init__(self) -> None:
        # -5 and nan were taken ("serving -5s more", "serving nans more"): nan passes a "< 0" check
        if not (math.isfinite(self.linger_s) and self.linger_s >= 0):
            raise ConfigError(f"run.linger_s (--linger) must be a finite number of seconds >= 0, "
                              f"got {self.linger_s!r}")


def merge_tables(base: Mapping[str, Any], over: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """``over`` on top of ``base``, recursively for tables; ``None`` values in ``over`` are skipped.

    A table in ``over`` (command-line flags) never replaces a value of ``base`` that is not a table
    (``storage = "/path"`` written for ``[storage] url = "/path"``): that is a :class:`ConfigError`
    naming the key (``where`` prefixes it), not a silent fallback to the defaults.
    """
    out = dict(base)
    for k, v in over.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            if k in out and not isinstance(out[k], Mapping):
                raise ConfigError(_not_a_table(f"{where}{k}", out[k]))
            merged = merge_tables(out.get(k, {}), v, f"{where}{k}.")
            if merged or k in out:
                out[k] = merged
        else:
            out[k] = v
    return out


def _not_a_table(name: str, value: Any) -> str:
    return (f"[{name}] must be a table, got {_toml_type(value)} {value!r} (write [{name}] with "
            f"its keys below it, or {name}.key = value)")


def _toml_type(value: Any) -> str:
    """The TOML name of a parsed value's type, for messages."""
    names = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
             (list, "an array"))
    return next((name for kind, name in names if isinstance(value, kind)), f"a {type(value).__name__}")


#: Dataclass from a TOML table: :func:`vcasync.coerce.from_table`, the same function.
dataclass_from_table = from_table


def load_run_config(path: Path | None, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read ``path`` (TOML; optional), apply ``overrides`` (same shape, ``None`` = unset), validate."""
    table: dict[str, Any] = {}
    if path is not None:
        try:
            table = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    if isinstance(table.get("policy"), str):          # policy = "name": a table, so flags merge in
        table["policy"] = {"name": table["policy"]}
    unknown = sorted(set(table) - _SECTIONS)
    if unknown:
        raise ConfigError(f"unknown section(s) in the config: {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(_SECTIONS))})")
    # A section that is not a table (storage = "/path") was replaced by the flags' empty table,
    # and the run started with every default of that section, in ./vcasync-run.
    for name, value in table.items():
        if not isinstance(value, Mapping):
            raise ConfigError(_not_a_table(name, value))
    # The file's [policy.params] are its policy's: a --policy naming another one (to switch with
    # --reset-policy, or to try one) starts from that policy's defaults, not from keys it refuses.
    flag_policy = (overrides or {}).get("policy")
    file_policy = table.get("policy", {})
    if (isinstance(flag_policy, Mapping) and flag_policy.get("name") is not None
            and flag_policy["name"] != file_policy.get("name", "vcasgd")):
        table["policy"] = {k: v for k, v in file_policy.items() if k != "params"}
    table = merge_tables(table, overrides or {})
    # The name's default applies to a [policy] (or [policy.params]) that does not give one, as it
    # does with no [policy] at all: so ``--policy-param`` alone tunes vcasgd.
    table["policy"] = {"name": "vcasgd", **table.get("policy", {})}
    model = dict(table.get("model", {}))
    if "factory" not in model:
        raise ConfigError("no model factory: set [model] factory = \"pkg.mod:fn\" or pass --model")
    extra = sorted(set(model) - {"factory", "seed"})
    if extra:
        raise ConfigError(f"unknown key(s) in [model]: {', '.join(extra)} (known: factory, seed)")
    storage = dict(table.get("storage", {}))
    if set(storage) - {"url"}:
        raise ConfigError(f"unknown key(s) in [storage]: {', '.join(sorted(set(storage) - {'url'}))}")
    run = dict(table.get("run", {}))
    if set(run) - {"linger_s", "output"}:
        raise ConfigError(f"unknown key(s) in [run]: {', '.join(sorted(set(run) - {'linger_s', 'output'}))}")
    seed = coerce(model.get("seed", 0), int, "model.seed")
    if not is_seed(seed):   # torch.manual_seed overflowed past 2**64; a negative one was taken
        raise ConfigError(f"model.seed (--seed) must be in {SEED_RANGE}, as every seed, got {seed}")
    return RunConfig(
        model=coerce(model["factory"], str, "model.factory"),
        seed=seed,
        units=dataclass_from_table(UnitsConfig, table.get("units", {}), "units"),
        policy=coerce(table["policy"], dict, "policy"),
        storage=coerce(storage.get("url", "./vcasync-run"), str, "storage.url"),
        coordinator=coerce(table.get("coordinator", {}), dict, "coordinator"),
        server=dataclass_from_table(ServerConfig, table.get("server", {}), "server"),
        linger_s=coerce(run.get("linger_s", 10.0), float, "run.linger_s"),
        output=coerce(run.get("output"), Path | None, "run.output"),
    )
