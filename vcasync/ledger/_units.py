"""The value types the ledger hands out: work units, lease grants and receipts.

They are frozen, JSON-able through ``to_dict``/``from_dict`` (the server sends them as they are) and
validated on the way in, so a malformed unit list fails with a :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from ..errors import ConfigError
from ._plain import plain_problem, text_problem

__all__ = ["BLAMED_REASONS", "MAX_UNITS", "RESERVED_PARAMS", "LeaseGrant", "Receipt",
           "ReceiptStatus", "WorkUnit", "check_user_params", "make_units", "receipt_status"]

#: The most units :func:`make_units` builds: a run's ledger keeps a unit's state and spec in memory
#: and in every snapshot (about 185 bytes a unit there, ``bench.ledger``), so a typo such as
#: ``epochs = 100000000`` is refused at once instead of filling the machine's memory.
MAX_UNITS = 10_000_000

ReceiptStatus = Literal["accepted", "duplicate", "rejected"]

#: Rejections of a result for what the worker's own training made of it: an integer tensor (a
#: counter) that went down, or that would wrap past its dtype's maximum. The same trainer does it
#: again on every unit, so they count against the worker as a refused upload does (back-off, then
#: quarantine), and a worker counts them toward its trainer's failures in a row.
BLAMED_REASONS = frozenset({"negative_increment", "counter_overflow"})

#: Key in ``WorkUnit.params`` of a remainder unit: how many of the original unit's steps are done.
STEP_OFFSET = "step_offset"
#: Key in ``WorkUnit.params`` of a remainder unit: the unit it continues.
PARENT = "parent"
#: The keys only the ledger sets (on a remainder unit): a unit supplied with one would be taken for
#: a remainder (its trainer told that steps are done, its next remainder named after another unit).
RESERVED_PARAMS = (STEP_OFFSET, PARENT)


def check_user_params(params: Mapping[str, Any], where: str) -> None:
    """Refuse unit ``params`` from a user that hold a key only remainder units carry."""
    reserved = [k for k in RESERVED_PARAMS if k in params]
    if reserved:
        names = " and ".join(repr(k) for k in reserved)
        raise ConfigError(f"{where}: the params key{'s' if len(reserved) > 1 else ''} {names} "
                          f"{'are' if len(reserved) > 1 else 'is'} reserved: the ledger sets "
                          f"{STEP_OFFSET!r} and {PARENT!r} on the remainder of a partial result; "
                          "name your parameter otherwise")


#: The largest shard, epoch or step count a unit may hold: what a worker's result can carry back
#: (``vcasync.trainer.MAX_COUNT``) and a snapshot can store. ``--steps 100000000000000000000`` was
#: taken, wrote the run record, then crashed on the first snapshot (exit 1, a traceback), and the
#: corrected start was refused as another run.
MAX_UNIT_INT = 2**63 - 1


def _int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"work unit field {name!r} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ConfigError(f"work unit field {name!r} must be >= {minimum}, got {value}")
    if value > MAX_UNIT_INT:
        raise ConfigError(f"work unit field {name!r} must be at most 2**63 - 1, got {value}")
    return value


def _check_plain(unit_id: str, path: str, value: Any) -> None:
    """Refuse what a unit's params cannot carry: they go to workers as JSON and into snapshots."""
    problem = plain_problem(value, path, noun="params")
    if problem is not None:     # a NaN is not JSON: the trainer got lr=nan, far from the flag
        raise ConfigError(f"work unit {unit_id!r}: {problem}")


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """A data shard and a number of local steps to train from one model version.

    A *remainder* unit (what is left after a partial result) carries ``params["step_offset"]``, the
    number of the original unit's steps already merged, and ``params["parent"]``.
    """

    unit_id: str
    shard: int = 0
    num_shards: int = 1
    epoch: int = 0
    steps: int = 1
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.unit_id, str) or not self.unit_id:
            raise ConfigError("work unit field 'unit_id' must be a non-empty string")
        bad_text = text_problem(self.unit_id, "work unit field 'unit_id'")
        if bad_text is not None:
            raise ConfigError(bad_text)
        if len(self.unit_id.encode()) > 256:
            raise ConfigError(f"work unit id {self.unit_id[:40]!r}... is longer than 256 bytes")
        _int("shard", self.shard, minimum=0)
        _int("num_shards", self.num_shards, minimum=1)
        _int("epoch", self.epoch, minimum=0)
        _int("steps", self.steps, minimum=1)
        if self.shard >= self.num_shards:
            raise ConfigError(f"work unit {self.unit_id!r}: shard {self.shard} >= num_shards "
                              f"{self.num_shards}")
        if not isinstance(self.params, dict):
            raise ConfigError(f"work unit {self.unit_id!r}: params must be a dict with str keys, got "
                              f"{type(self.params).__name__}")
        if self.params:
            _check_plain(self.unit_id, "params", self.params)

    __hash__ = None  # type: ignore[assignment]  # params is a dict

    @property
    def step_offset(self) -> int:
        """Steps of the original unit done before this one (0 unless this is a remainder)."""
        return int(self.params.get(STEP_OFFSET, 0))

    def to_dict(self) -> dict[str, Any]:
        return {"unit_id": self.unit_id, "shard": self.shard, "num_shards": self.num_shards,
                "epoch": self.epoch, "steps": self.steps, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkUnit:
        unknown = set(data) - {"unit_id", "shard", "num_shards", "epoch", "steps", "params"}
        if unknown:
            raise ConfigError(f"work unit has unknown fields {sorted(unknown)}")
        if "unit_id" not in data:
            raise ConfigError("work unit lacks 'unit_id'")
        return cls(unit_id=data["unit_id"], shard=data.get("shard", 0),
                   num_shards=data.get("num_shards", 1), epoch=data.get("epoch", 0),
                   steps=data.get("steps", 1), params=dict(data.get("params") or {}))

    def remainder(self, steps_done: int) -> WorkUnit:
        """The unit that trains the ``steps - steps_done`` steps a partial result left over."""
        offset = self.step_offset + steps_done
        root = str(self.params.get(PARENT, self.unit_id))
        return WorkUnit(unit_id=f"{root}~{offset}", shard=self.shard, num_shards=self.num_shards,
                        epoch=self.epoch, steps=self.steps - steps_done,
                        params={**self.params, STEP_OFFSET: offset, PARENT: root})


def make_units(num_shards: int, *, epochs: int = 1, steps: int = 1,
               params: Mapping[str, Any] | None = None, count: int | None = None) -> list[WorkUnit]:
    """One unit per (epoch, shard), ids ``e{epoch}-s{shard}``: the usual data-parallel split.
    ``count``: only the first ``count`` of them (epoch by epoch), however many ``epochs`` say.
    More than :data:`MAX_UNITS` units raise :class:`ConfigError` before any is built."""
    _int("num_shards", num_shards, minimum=1)
    _int("epochs", epochs, minimum=1)
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(f"make_units: params must be a mapping of str keys (what the trainer reads "
                          f"in ctx.unit.params), got {type(params).__name__} {params!r}")
    if params is not None:
        check_user_params(params, "make_units")
    total = num_shards * epochs if count is None else _int("count", count, minimum=1)
    if total > MAX_UNITS:
        made = (f"{num_shards} shards x {epochs} epochs" if count is None else "count")
        raise ConfigError(f"{made} = {total:,} work units; the limit is {MAX_UNITS:,} "
                          f"(vcasync.ledger.MAX_UNITS: the ledger keeps every unit in memory)")
    units = (WorkUnit(f"e{e}-s{s}", shard=s, num_shards=num_shards, epoch=e, steps=steps,
                      params=dict(params or {}))
             for e in range(epochs) for s in range(num_shards))
    return list(itertools.islice(units, total))


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """A worker's right to train ``unit`` until ``deadline_s`` seconds from when it was sent.

    Heartbeats that report progress push the deadline out; ``heartbeat_interval_s`` is how often to
    send them. ``base_version`` is the model version current when the lease was granted (workers may
    train from any version still served; the result says which). ``resumed`` is True when an existing
    lease was picked up again (worker restart, coordinator restart).
    """

    lease_id: str
    unit: WorkUnit
    base_version: int
    deadline_s: float
    heartbeat_interval_s: float
    resumed: bool = False

    def heartbeat_at_most(self, seconds: float) -> LeaseGrant:
        """This grant with a heartbeat interval of at most ``seconds`` (the server's cap: half the
        time a finished run is served, so a worker hears the end at a heartbeat)."""
        if self.heartbeat_interval_s <= seconds:
            return self
        return dataclasses.replace(self, heartbeat_interval_s=seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"lease_id": self.lease_id, "unit": self.unit.to_dict(),
                "base_version": self.base_version, "deadline_s": self.deadline_s,
                "heartbeat_interval_s": self.heartbeat_interval_s, "resumed": self.resumed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeaseGrant:
        return cls(lease_id=str(data["lease_id"]), unit=WorkUnit.from_dict(data["unit"]),
                   base_version=int(data["base_version"]), deadline_s=float(data["deadline_s"]),
                   heartbeat_interval_s=float(data["heartbeat_interval_s"]),
                   resumed=bool(data.get("resumed", False)))


def receipt_status(value: Any) -> ReceiptStatus:
    """``value`` as a receipt status, or :class:`ConfigError` (read back from stored state)."""
    if value not in ("accepted", "duplicate", "rejected"):
        raise ConfigError(f"receipt status {value!r} is not one of accepted/duplicate/rejected")
    return cast(ReceiptStatus, value)


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a submitted result came to. ``version`` is the model version after it was handled.

    ``accepted``: merged (or buffered by the policy) exactly once. ``duplicate``: the same lease's
    result was accepted before; nothing changed now. ``rejected``: refused for ``reason`` (too stale,
    refused by the policy); never merged, the unit went back to the queue.
    """

    lease_id: str
    unit_id: str
    status: ReceiptStatus
    version: int
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"lease_id": self.lease_id, "unit_id": self.unit_id, "status": self.status,
                "version": self.version, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Receipt:
        return cls(lease_id=str(data["lease_id"]), unit_id=str(data["unit_id"]),
                   status=receipt_status(data["status"]),
                   version=int(data["version"]), reason=data.get("reason"))
