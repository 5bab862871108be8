"""Every control message as a typed struct, converted to and from its wire map in this one place.

A message is a frozen dataclass; :func:`to_body` gives the plain map that goes on the wire (msgpack
or JSON, see :mod:`vcasync.protocol._messages`), :func:`from_body` builds the struct back from a received map
and checks every field on the way in (type, ``minimum``, ``max_len`` from the field's metadata, a
``Literal``'s values, nested structs), raising :class:`~vcasync.errors.FrameError` that names the
field: the server answers it with the same 4xx JSON error as any malformed request. Keys the struct
does not know are ignored (a newer peer may send more). The maps are the ones the previous
hand-written converters built, key for key, so the wire format and the journal are unchanged.

Plain dataclasses over the existing codec, not msgspec Structs: the reasons are in
``docs/messages.md``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

from ..errors import ConfigError, FrameError
from ..ledger._units import LeaseGrant, Receipt
from ..tensors import UpdateKind

__all__ = ["MAX_EVAL_SERIES", "MAX_METRICS", "MAX_WORKER_NAME", "EvalRecorded", "EvalRequest",
           "HeartbeatRequest", "JoinRequest", "Joined", "JournalFlush", "JournalReject",
           "JournalResult", "LeaveRequest", "Left", "Released", "ReleaseRequest", "Requeued",
           "RequeueRequest", "ResultMeta", "from_body", "kind_of", "metrics_problem", "to_body"]

M = TypeVar("M")

#: The longest name a worker may join with (characters): ``--name``, ``WorkerConfig.name``.
MAX_WORKER_NAME = 128

#: The control message kind each struct travels as (the ``kind`` of its msgpack/JSON envelope).
KINDS: dict[type[Any], str] = {LeaseGrant: "lease", Receipt: "receipt"}


def rule(*, minimum: int | None = None, max_len: int | None = None) -> dict[str, Any]:
    """A field's wire checks, as its metadata: ``field(metadata=rule(minimum=0))``."""
    return {"minimum": minimum, "max_len": max_len}


def kind_of(cls: type[Any]) -> str:
    return KINDS[cls]


def message(kind: str) -> Any:
    """Class decorator: register a struct as control message ``kind``."""
    def register(cls: type[M]) -> type[M]:
        KINDS[cls] = kind
        return cls
    return register


# -- the one converter ---------------------------------------------------------------------------
def to_body(msg: Any) -> dict[str, Any]:
    """The wire map of a message struct (nested structs become maps; dicts are copied)."""
    out: dict[str, Any] = {}
    for name in _field_names(type(msg)):
        value = getattr(msg, name)
        if isinstance(value, dict):
            value = dict(value)
        elif isinstance(value, list):
            value = list(value)
        elif type(value) in _FIELD_NAMES or (dataclasses.is_dataclass(value)
                                              and not isinstance(value, type)):
            value = to_body(value)
        out[name] = value
    return out


#: Field names per struct class, looked up once (``dataclasses.fields`` on every call was a
#: measurable part of a heartbeat's answer).
_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def from_body(cls: type[M], body: Mapping[str, Any]) -> M:
    """The struct ``cls`` from a received map, every field checked; :class:`FrameError` if not."""
    if not isinstance(body, Mapping):
        raise FrameError(f"a {cls.__name__} must be a map, got {type(body).__name__}",
                         field=cls.__name__)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in body:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FrameError(f"missing field {f.name!r}", field=f.name)
            continue
        kwargs[f.name] = _check(hints[f.name], body[f.name], f.name, f.metadata)
    try:
        return cls(**kwargs)
    except (ConfigError, ValueError, TypeError) as exc:
        raise FrameError(f"invalid {cls.__name__}: {exc}", field=cls.__name__) from None


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


_NAMES = {str: "str", int: "int", float: "float", bool: "bool", dict: "dict", list: "list"}


def _check(tp: Any, value: Any, name: str, meta: Mapping[str, Any]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check(inner, value, name, meta)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise FrameError(f"field {name!r} must be one of {list(typing.get_args(tp))}, got "
                             f"{str(value)[:40]!r}", field=name)
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise FrameError(f"field {name!r} must be dict, got {type(value).__name__}", field=name)
        return from_body(tp, value)
    kind = origin or tp
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (type(value) is bool and kind is not bool) or not isinstance(value, kind):
        raise FrameError(f"field {name!r} must be {_NAMES.get(kind, str(kind))}, got "
                         f"{type(value).__name__}", field=name)
    minimum, max_len = meta.get("minimum"), meta.get("max_len", None)
    if minimum is not None and value < minimum:
        raise FrameError(f"field {name!r} must be >= {minimum}, got {value}", field=name)
    if isinstance(value, str | dict | list) and len(value) > (1024 if max_len is None else max_len):
        raise FrameError(f"field {name!r} is longer than {1024 if max_len is None else max_len}",
                         field=name)
    return value


# -- requests and answers --------------------------------------------------------------------------
@message("join")
@dataclass(frozen=True, slots=True)
class JoinRequest:
    name: str = field(default="", metadata=rule(max_len=MAX_WORKER_NAME))
    info: dict[str, Any] = field(default_factory=dict, metadata=rule(max_len=64))


@message("joined")
@dataclass(frozen=True, slots=True)
class Joined:
    worker_id: str
    token: str
    #: The run the token belongs to ("" from coordinators that did not say): a worker keys its
    #: saved identity by it, not by the URL it used.
    run_id: str = field(default="", metadata=rule(max_len=64))


@message("heartbeat")
@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    steps_done: int = field(metadata=rule(minimum=0))
    #: The worker is stopping (a spot notice, SIGTERM): it keeps this lease and its checkpoint for
    #: a restart to resume, or delivers a partial result on its way out; shown ``preempted`` until
    #: it is heard from again. (A coordinator from before the field ignores it, as every field it
    #: does not know.)
    stopping: bool = False


@message("release")
@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    reason: str = field(default="", metadata=rule(max_len=512))
    failed: bool = True       # False: nobody's fault
    #: With ``failed`` False: a preemption (shown so until the worker is heard from again); False
    #: for another release that is nobody's fault (the machine's configuration, a base model no
    #: longer served). A coordinator from before the field takes every such release for one.
    preempted: bool = True


@message("released")
@dataclass(frozen=True, slots=True)
class Released:
    lease_id: str


@message("leave")
@dataclass(frozen=True, slots=True)
class LeaveRequest:
    """The worker exits (``reason``: why, e.g. ``finished``, ``preempted``, ``max_units``, or
    ``error: TrainerError`` for one ending on an error):
    the coordinator shows it ``left`` and no longer counts it alive, until it is heard from again.
    Its leases stay as they are."""

    reason: str = field(default="", metadata=rule(max_len=64))


@message("left")
@dataclass(frozen=True, slots=True)
class Left:
    worker_id: str


#: Unit ids one requeue request may name.
MAX_REQUEUE_IDS = 10_000


@message("requeue")
@dataclass(frozen=True, slots=True)
class RequeueRequest:
    """``units`` None (absent): every parked unit."""

    units: list[str] | None = field(default=None, metadata=rule(max_len=MAX_REQUEUE_IDS))

    def __post_init__(self) -> None:
        if self.units is not None and not all(isinstance(u, str) and 0 < len(u) <= 256
                                              for u in self.units):
            raise FrameError("field 'units' must be a list of unit ids (non-empty strings)",
                             field="units")


@message("requeued")
@dataclass(frozen=True, slots=True)
class Requeued:
    units: list[str] = field(metadata=rule(max_len=1 << 20))


#: Curves (score names) one run's evaluations may have: the status page draws each.
MAX_EVAL_SERIES = 8


@message("eval")
@dataclass(frozen=True, slots=True)
class EvalRequest:
    """An evaluator's scores of model ``version``, e.g. ``{"accuracy": 0.91, "loss": 0.3}`` (names
    and values are checked by :meth:`vcasync.coordinator.Coordinator.record_eval`)."""

    version: int = field(metadata=rule(minimum=0))
    values: dict[str, Any] = field(metadata=rule(max_len=MAX_EVAL_SERIES))


@message("eval_recorded")
@dataclass(frozen=True, slots=True)
class EvalRecorded:
    version: int = field(metadata=rule(minimum=0))


# -- a result's metadata and the journal's records ----------------------------------------------------
#: The most samples one result may say it trained on: a trillion, far past any unit, and low enough
#: that a sum over a run's results (at most 10 million units and their remainders) stays within the
#: 64-bit ints a snapshot and the journal carry (a result claiming 2**63 - 1 was taken, and a
#: ``sync`` policy's running total of three such broke every snapshot after it; it also outweighed
#: every honest result in that policy's sample-weighted mean).
MAX_RESULT_SAMPLES = 2**40

#: A result's metrics: at most this many names, each at most ``MAX_METRIC_NAME`` characters.
MAX_METRICS = 64
MAX_METRIC_NAME = 128


def metrics_problem(metrics: object) -> str | None:
    """What makes a result's ``metrics`` ones the coordinator refuses (None: nothing): not a map,
    over :data:`MAX_METRICS` names, a name that is not a str of at most 128 characters, a value that
    is not a finite number. One rule for the worker, which checks before it uploads, and the
    coordinator, which checks what arrives."""
    if not isinstance(metrics, Mapping) or len(metrics) > MAX_METRICS:
        return f"'metrics' must be a map of at most {MAX_METRICS} names to numbers"
    for name, value in metrics.items():
        if not isinstance(name, str) or len(name) > MAX_METRIC_NAME:
            return f"metric name {str(name)[:60]!r} must be a str of at most {MAX_METRIC_NAME} characters"
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return f"metric {name[:60]!r} is {str(value)[:40]}: metrics must be finite numbers"
    return None


@dataclass(frozen=True, slots=True)
class ResultMeta:
    """The metadata of a result payload (kind ``"result"``): built by the worker, validated against
    its lease by :func:`vcasync.coordinator._result_checks.parse_result_meta`, stored in the
    journal's record."""

    lease_id: str
    base_version: int
    kind: UpdateKind
    steps: int
    samples: int = 0
    partial: bool = False
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return to_body(self)


@dataclass(frozen=True, slots=True)
class JournalResult:
    """The journal's record of a merged result (its tensors inline, or its received bytes named
    by the entry's ``blob``; the entry adds ``seq``)."""

    type: Literal["result"]
    worker_id: str
    unit_id: str
    lease_id: str
    base_version: int = field(metadata=rule(minimum=0))
    kind: UpdateKind
    steps: int = field(metadata=rule(minimum=0))
    samples: int = field(metadata=rule(minimum=0))
    partial: bool
    metrics: dict[str, float] = field(metadata=rule(max_len=1 << 16))
    #: ``"increment"``: integer tensors are increments (absent in entries from before the rule).
    ints: str | None = None
    #: ``"value"``: the model's running statistics are the worker's values; ``"left_out"``: a delta
    #: whose base's statistics were not held, its statistics left out; absent in entries from before
    #: the rule (the policy merged their statistics as any float tensor) and in runs without any.
    stats: str | None = None

    @classmethod
    def of(cls, meta: ResultMeta, *, worker_id: str, unit_id: str, ints: str,
           stats: str | None = None) -> JournalResult:
        return cls("result", worker_id, unit_id, meta.lease_id, meta.base_version, meta.kind,
                   meta.steps, meta.samples, meta.partial, dict(meta.metrics), ints, stats)

    def meta(self) -> ResultMeta:
        return ResultMeta(self.lease_id, self.base_version, self.kind, self.steps, self.samples,
                          self.partial, dict(self.metrics))


@dataclass(frozen=True, slots=True)
class JournalReject:
    """The journal's record of a valid result that was rejected (too stale, base unavailable)."""

    type: Literal["reject"]
    lease_id: str
    worker_id: str
    unit_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class JournalFlush:
    """The journal's record of the end-of-run flush: the merge policy applied what it still held
    (a partial buffer) once the run's last result was merged. Written before the flush, so replay
    applies it exactly once, at its place among the results."""

    type: Literal["flush"]
    #: accepted results the policy held when it was asked (the status's ``held_results``)
    held: int = field(metadata=rule(minimum=0))


JournalRecord = JournalResult | JournalReject | JournalFlush


def journal_record(body: Mapping[str, Any]) -> JournalRecord:
    """A journal entry's record by its ``type``; :class:`FrameError` when it is malformed."""
    kinds: dict[str, type[JournalResult] | type[JournalReject] | type[JournalFlush]] = {
        "result": JournalResult, "reject": JournalReject, "flush": JournalFlush}
    record_type = body.get("type")
    cls = kinds.get(record_type) if isinstance(record_type, str) else None
    if cls is None:
        raise FrameError(f"unknown journal record type {str(body.get('type'))[:40]!r}", field="type")
    return from_body(cls, body)
