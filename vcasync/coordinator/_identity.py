"""What makes a run *this* run: recorded with it, compared at every start.

A coordinator restarted with the same command must resume; one started with another model (other
tensors, or another factory or seed for the same tensors), other work units or another merge policy
must not quietly mix itself into the stored run (a new policy handed the
old one's state fails every merge; new units join a run that already reported itself finished). So
the run record (``<prefix>/run``, see :mod:`vcasync.coordinator._journal`) keeps a
:class:`RunIdentity`, and a start whose identity differs is refused with one line per difference.

The initial model's *origin* (``vcasync coordinator``: its factory and seed; an embedding program:
whatever it passes as ``model_origin``) is what tells one initial model from another with the same
tensors. The weights themselves are not compared (a digest of them would make every restart of a
factory without a fixed seed mismatch), and the snapshot holds them anyway. Like the policy's
parameters, an origin is compared where both the run and the start know it: a run recorded without
one (by an older build, or an embedding program that passed none) resumes, and records the start's.

A policy imported by reference (``vcasync coordinator --policy module:Class``) is recorded with that
reference beside its name: not compared (the class's code, even its module, may move between
restarts; a start with another reference for the same name is warned about), but kept so that a
``--reset-policy`` away from it can import the class again to replay the journal. A record without a
reference (an older build, or a start that named the policy) takes the next start's.

The names of the model's running statistics (``ModelState.statistics``: a rule of their own, see
:mod:`vcasync.coordinator._statistics`) are part of it: the journal keeps a result's statistics as
values, and a snapshot the values of held results, for exactly those names; a start naming others
would replay those values as the policy's tensors. A run recorded before the rule (no names)
resumes, and records the start's.

Things that may change between starts (durability, lease timeout, ports, limits) are *not* part of the
identity: they configure the coordinator, not the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..ledger._units import WorkUnit
from ..tensors import ModelSpec

__all__ = ["LAYOUT", "RunIdentity"]

LAYOUT = 1
"""The version of the storage layout under the state prefix (snapshots, journal, run record)."""


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples become lists), so records compare equal."""
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"run identity: {value!r} cannot be recorded as JSON ({exc})") from None


def _short(params: Mapping[str, Any] | None) -> str:
    if params is None:
        return "(parameters not recorded)"
    return json.dumps(params, sort_keys=True)


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """Model spec (and origin, when known), units, policy (and its parameters, when known),
    storage layout version."""

    model: dict[str, list[Any]]           # name -> [dtype, shape], in order
    units: int
    units_digest: str
    first_unit: str
    last_unit: str
    policy: str
    policy_params: dict[str, Any] | None  # None: the embedding program did not say
    #: Where the initial weights came from (``{"factory": "pkg.mod:fn", "seed": 0}``); None: not
    #: said (an embedding program without ``model_origin``, or a run recorded before origins were).
    origin: dict[str, Any] | None = None
    layout: int = LAYOUT
    #: The ``module:Class`` the policy was imported from; None: an installed policy (or not said).
    #: Recorded, never compared.
    policy_ref: str | None = None
    #: The names of the model's running statistics, sorted; None: recorded before the rule.
    statistics: list[str] | None = None

    @classmethod
    def of(cls, spec: ModelSpec, units: Sequence[WorkUnit], policy: str,
           policy_params: Mapping[str, Any] | None,
           origin: Mapping[str, Any] | None = None,
           policy_ref: str | None = None, statistics: Iterable[str] = ()) -> RunIdentity:
        rows = [u.to_dict() for u in units]
        digest = hashlib.sha256(json.dumps(_plain(rows), sort_keys=True).encode()).hexdigest()[:32]
        return cls(model={name: [str(s.dtype).removeprefix("torch."), list(s.shape)]
                          for name, s in spec.items()},
                   units=len(rows), units_digest=digest,
                   first_unit=rows[0]["unit_id"] if rows else "",
                   last_unit=rows[-1]["unit_id"] if rows else "",
                   policy=policy,
                   policy_params=None if policy_params is None else _plain(dict(policy_params)),
                   origin=None if origin is None else _plain(dict(origin)), policy_ref=policy_ref,
                   statistics=sorted(statistics))

    def to_json(self) -> dict[str, Any]:
        policy: dict[str, Any] = {"name": self.policy, "params": self.policy_params}
        if self.policy_ref is not None:
            policy["ref"] = self.policy_ref
        out = {"layout": self.layout, "model": self.model,
               "units": {"count": self.units, "digest": self.units_digest,
                         "first": self.first_unit, "last": self.last_unit},
               "policy": policy, "origin": self.origin}
        if self.statistics is not None:
            out["statistics"] = list(self.statistics)
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunIdentity:
        """Raises KeyError/TypeError/ValueError on a malformed record (the caller names the key)."""
        units, policy = data["units"], data["policy"]
        params = policy["params"]
        origin = data.get("origin")      # absent in a record written before origins were
        ref = policy.get("ref")          # absent: an installed policy, or an older record
        stats = data.get("statistics")   # absent in a record written before the rule
        return cls(model={str(k): list(v) for k, v in dict(data["model"]).items()},
                   units=int(units["count"]), units_digest=str(units["digest"]),
                   first_unit=str(units["first"]), last_unit=str(units["last"]),
                   policy=str(policy["name"]),
                   policy_params=None if params is None else dict(params),
                   origin=None if origin is None else dict(origin),
                   layout=int(data["layout"]), policy_ref=None if ref is None else str(ref),
                   statistics=None if stats is None else sorted(str(n) for n in stats))

    def same_policy(self, other: RunIdentity) -> bool:
        """Same name, and the same parameters where both sides know them: a parameter one side
        lacks is unknown there, not different (a policy given a new parameter since the run was
        recorded, whose default keeps what it did: `diloco`'s ``staleness``, `gate`'s ``window``;
        until 2026-12-08 every run of such a policy was refused at its next start)."""
        if self.policy != other.policy:
            return False
        mine, theirs = self.policy_params, other.policy_params
        return mine is None or theirs is None or all(
            mine[key] == theirs[key] for key in mine.keys() & theirs.keys())

    def with_params_of(self, wanted: RunIdentity) -> RunIdentity:
        """This (recorded) identity with the parameters ``wanted`` knows and it does not, when the
        policy is the same: what a matching start records, so the next start compares them too."""
        if wanted.policy_params is None or not self.same_policy(wanted):
            return self
        merged = {**wanted.policy_params, **(self.policy_params or {})}
        return self if merged == self.policy_params else dataclasses.replace(self, policy_params=merged)

    def with_origin_of(self, wanted: RunIdentity) -> RunIdentity:
        """This (recorded) identity, with what ``wanted`` knows of the origin and it does not: what
        a matching start records, so that the next start is compared against it too."""
        if wanted.origin is None:
            return self
        merged = {**wanted.origin, **(self.origin or {})}
        return self if merged == self.origin else dataclasses.replace(self, origin=merged)

    def with_statistics_of(self, wanted: RunIdentity) -> RunIdentity:
        """This (recorded) identity with ``wanted``'s statistics names when it has none (recorded
        before the rule): what the start records, so the next start is compared against them."""
        if self.statistics is not None or wanted.statistics is None:
            return self
        return dataclasses.replace(self, statistics=list(wanted.statistics))

    def with_policy_ref_of(self, wanted: RunIdentity) -> RunIdentity:
        """This (recorded) identity with ``wanted``'s policy reference, when it has one and the
        policy is the same: the class this start imports is the one a later switch replays with."""
        if wanted.policy_ref is None or wanted.policy_ref == self.policy_ref \
                or not self.same_policy(wanted):
            return self
        return dataclasses.replace(self, policy_ref=wanted.policy_ref)

    def differences(self, wanted: RunIdentity) -> list[str]:
        """One readable line per thing ``wanted`` (this start) changes about the recorded run."""
        out: list[str] = []
        if self.layout != wanted.layout:
            out.append(f"storage layout: the run was written with layout {self.layout}, this "
                       f"build writes layout {wanted.layout}")
        if self.model != wanted.model:
            out.append("model: " + _model_difference(self.model, wanted.model))
        if (self.statistics is not None and wanted.statistics is not None
                and self.statistics != wanted.statistics):
            out.append("running statistics: " + _statistics_difference(self.statistics,
                                                                        wanted.statistics))
        out.extend(f"initial model: the run was started with {key}={old!r}, this start asks for "
                   f"{key}={new!r}" for key, old, new in _origin_differences(self.origin, wanted.origin))
        if self.units_digest != wanted.units_digest:
            out.append(f"units: the run has {self.units} ({self.first_unit} .. {self.last_unit}), "
                       f"this start asks for {wanted.units} ({wanted.first_unit} .. "
                       f"{wanted.last_unit})" + ("" if self.units != wanted.units else
                                                 ", with other steps, shards or parameters"))
        if not self.same_policy(wanted):
            out.append(f"policy: the run uses {self.policy} {_short(self.policy_params)}, this "
                       f"start asks for {wanted.policy} {_short(wanted.policy_params)}")
        return out


def _origin_differences(old: dict[str, Any] | None,
                        new: dict[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """``(key, recorded, given)`` for each part of the origin both know and that differs: a key one
    side lacks is unknown there, not different (a record from an older build has none)."""
    if old is None or new is None:
        return []
    return [(key, old[key], new[key]) for key in old if key in new and old[key] != new[key]]


def _statistics_difference(old: list[str], new: list[str]) -> str:
    def names(which: list[str]) -> str:
        return ", ".join(which[:5]) + (f" (and {len(which) - 5} more)" if len(which) > 5 else "")
    gone = [n for n in old if n not in new]
    added = [n for n in new if n not in old]
    parts = ([f"the run keeps {names(gone)} as running statistics, this model does not "
              "(ModelState.from_module names a module's float buffers)"] if gone else []) + \
            ([f"this model names {names(added)} as running statistics, the run does not"]
             if added else [])
    return "; ".join(parts)


def _model_difference(old: dict[str, list[Any]], new: dict[str, list[Any]]) -> str:
    gone = [n for n in old if n not in new]
    added = [n for n in new if n not in old]
    if gone or added:
        parts = ([f"tensors not in this model: {', '.join(gone[:5])}"] if gone else []) + \
                ([f"tensors not in the run: {', '.join(added[:5])}"] if added else [])
        return "; ".join(parts)
    for name, was in old.items():
        if new[name] != was:
            return f"tensor {name!r} is {was[0]}{was[1]} in the run, {new[name][0]}{new[name][1]} here"
    return "the tensors are in another order"
