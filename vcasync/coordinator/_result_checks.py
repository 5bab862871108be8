"""Checks on one submitted result, before anything is merged: its metadata and its tensors.

The checks themselves (:func:`parse_result_meta`, :func:`check_tensors`) are pure functions;
:func:`read_result` is the async step that decodes an upload and runs them in a worker thread,
borrowing a held model version (``hold``/``release``) to measure a full-weights result's norm. Each
failure is a :class:`ValidationError` whose ``reason`` is short and stable (the coordinator counts
rejects by it and the server reports it), and whose message names the field.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import traceback
from collections.abc import AsyncIterable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from .._aio import to_thread_released
from ..errors import ValidationError, WireError
from ..ledger._units import WorkUnit
from ..protocol._bodies import MAX_RESULT_SAMPLES, ResultMeta, metrics_problem
from ..tensors import ModelSpec
from ..wire import Limits, decode_payload

if TYPE_CHECKING:
    from ._versions import Version

__all__ = ["ResultMeta", "check_ties", "check_tensors", "let_go", "parse_result_meta", "read_result",
           "reject_reason", "split_ties", "update_norm"]

#: Groups of state-dict names that are one tensor in the model (``ModelState.ties``).
Ties = tuple[tuple[str, ...], ...]



def _bad(message: str, reason: str, name: str | None = None) -> ValidationError:
    return ValidationError(f"result meta: {message}", reason=reason, name=name)


def _int(meta: Mapping[str, Any], key: str, *, default: int | None = None) -> int:
    value = meta.get(key, default)
    if value is None:
        raise _bad(f"missing {key!r}", "bad_meta", key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(f"{key!r} must be a non-negative int, got {value!r}"[:200], "bad_meta", key)
    return value


def parse_result_meta(meta: Mapping[str, Any], *, lease_id: str, unit: WorkUnit,
                      current_version: int) -> ResultMeta:
    """Validate a result's metadata against its lease, its unit and the model's current version.

    Required: ``lease_id`` (the lease it was uploaded to), ``base_version``, ``kind`` (``"delta"`` or
    ``"weights"``), ``steps`` (1..unit.steps). Optional: ``samples`` (0..``MAX_RESULT_SAMPLES``),
    ``partial``, ``metrics`` (name -> finite number). Other keys are ignored.
    """
    if meta.get("lease_id") != lease_id:
        raise _bad(f"lease_id {str(meta.get('lease_id'))[:80]!r} does not match the lease it was "
                   f"sent to ({lease_id!r})", "lease_mismatch", "lease_id")
    kind = meta.get("kind")
    if kind not in ("delta", "weights"):
        raise _bad(f"'kind' must be 'delta' or 'weights', got {str(kind)[:40]!r}", "bad_meta", "kind")
    base_version = _int(meta, "base_version")
    if base_version > current_version:
        raise _bad(f"base_version {base_version} is newer than the model ({current_version})",
                   "bad_base_version", "base_version")
    steps = _int(meta, "steps")
    if not 1 <= steps <= unit.steps:
        raise _bad(f"'steps' must be in [1, {unit.steps}] for unit {unit.unit_id!r}, got {steps}",
                   "bad_meta", "steps")
    partial = meta.get("partial", False)
    if not isinstance(partial, bool):
        raise _bad(f"'partial' must be a bool, got {partial!r}"[:100], "bad_meta", "partial")
    raw = meta.get("metrics") or {}
    problem = metrics_problem(raw)
    if problem is not None:
        raise _bad(problem, "bad_meta", "metrics")
    metrics = {name: float(value) for name, value in raw.items()}
    samples = _int(meta, "samples", default=0)
    if samples > MAX_RESULT_SAMPLES:
        raise _bad(f"'samples' must be at most 2**40 ({MAX_RESULT_SAMPLES}), got {samples}"[:200],
                   "bad_meta", "samples")
    return ResultMeta(lease_id, base_version, kind, steps, samples, partial and steps < unit.steps,
                      metrics)


def update_norm(tensors: Mapping[str, torch.Tensor],
                reference: Mapping[str, torch.Tensor] | None = None) -> float:
    """L2 norm over every floating tensor (of ``tensors - reference`` when a reference is given)."""
    total = 0.0
    for name, t in tensors.items():
        if not t.is_floating_point():
            continue
        d = t if reference is None else t.to(torch.float64) - reference[name].to(torch.float64)
        total += float(torch.linalg.vector_norm(d, dtype=torch.float64)) ** 2
    return math.sqrt(total)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of two tensors of one dtype and shape (NaN payloads and -0.0 too)."""
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def split_ties(tensors: Mapping[str, torch.Tensor], ties: Ties) -> list[tuple[str, str]]:
    """``(first, other)`` for each tied name whose tensor differs from its group's first name's."""
    return [(group[0], name) for group in ties for name in group[1:]
            if not _same_bits(tensors[group[0]], tensors[name])]


def check_ties(tensors: Mapping[str, torch.Tensor], ties: Ties) -> None:
    """A :class:`ValidationError` (``tie_mismatch``) when names the model ties hold different
    values: loaded into the module, one would silently win over the other."""
    split = split_ties(tensors, ties)
    if split:
        first, other = split[0]
        raise ValidationError(
            f"tensors {first!r} and {other!r} are one tensor in the model (tied weights), but the "
            f"result holds different values for them ({len(split)} tied name(s) differ): return "
            "ctx.result(net), or the same values under every tied name",
            reason="tie_mismatch", name=other)


def check_tensors(tensors: Mapping[str, torch.Tensor], spec: ModelSpec, *, require_finite: bool,
                  max_norm: float | None,
                  reference: Mapping[str, torch.Tensor] | None = None, ties: Ties = ()) -> float | None:
    """Names, shapes, dtypes, finiteness, tied names bit-identical (``ties``) and the optional
    norm bound; returns the norm if computed.

    ``reference`` is what a ``weights`` result is measured against (its base, or the current model).
    """
    spec.check(tensors, require_finite=require_finite)
    check_ties(tensors, ties)
    if max_norm is None:
        return None
    norm = update_norm(tensors, reference)
    if not norm <= max_norm:
        raise ValidationError(f"update norm {norm:.4g} exceeds the bound {max_norm:.4g}",
                              reason="norm_too_large")
    return norm


def reject_reason(exc: BaseException) -> str:
    """The short, stable reason a refused result is counted under (``reason`` or the class name)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    name = type(exc).__name__.removesuffix("Error")
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return f"wire_{snake}" if isinstance(exc, WireError) else snake


async def read_result(body: AsyncIterable[bytes], *, lease_id: str, unit: WorkUnit, spec: ModelSpec,
                      limits: Limits, require_finite: bool, max_norm: float | None,
                      current_version: int,
                      hold: Callable[[int], Version | None],
                      release: Callable[[Version], None],
                      out: dict[str, torch.Tensor] | None = None,
                      recycle: Callable[[dict[str, torch.Tensor]], object] | None = None,
                      ties: Ties = (),
                      ) -> tuple[ResultMeta, dict[str, torch.Tensor]]:
    """Decode a result payload (limits and spec checked before allocating) and validate it all.

    The CPU work runs in worker threads. ``out``: buffers of the model's spec to decode into
    (recycled ones: no fresh pages to fault in). ``ties``: the model's tied names
    (``ModelState.ties``), which must hold bit-identical tensors, a delta's or full weights'.
    A full-weights result's norm is measured against
    its base version when it is still held (``hold``), else against the current model.

    When the result is refused (or the body fails), its set goes to ``recycle`` and the error
    holds no reference to it: see :func:`let_go`.
    """
    payload = None
    try:
        payload = await decode_payload(body, limits=limits, spec=spec, expected_kind="result",
                                       out=out)
        out = None     # the result's tensors must end up referenced from one mapping only (recycling)
        meta = parse_result_meta(payload.meta, lease_id=lease_id, unit=unit,
                                 current_version=current_version)
        ref = None
        if max_norm is not None and meta.kind == "weights":
            ref = hold(meta.base_version) or hold(current_version)
        try:
            await to_thread_released(check_tensors, payload.tensors, spec,
                                    require_finite=require_finite, max_norm=max_norm,
                                    reference=None if ref is None else ref.model.tensors,
                                    ties=ties)
        finally:
            if ref is not None:
                release(ref)
            ref = None
    except BaseException as exc:
        spare = out if payload is None else payload.tensors
        out = payload = None
        let_go(exc)
        if spare is not None and recycle is not None:
            recycle(spare)
        del spare
        raise
    return meta, payload.tensors


#: Code flags of frames that can be suspended (coroutines, generators, async generators).
_SUSPENDABLE = (inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
                | inspect.CO_ITERABLE_COROUTINE)


def let_go(exc: BaseException) -> None:
    """Clear the local variables of the finished frames ``exc`` (and the errors chained to it)
    passed through, keeping its traceback's text.

    A refused upload's error passes through the frames that held its tensors (the decoder's, the
    checks' in a worker thread), and an error raised out of a task forms a reference cycle with the
    frame that awaited it (:func:`~vcasync.coordinator._ingest.tee`): only the cyclic garbage
    collector would free those tensors, which a coordinator may not run for a long while. Every
    refused upload then pinned a model-sized set.

    The errors chained to ``exc`` (its cause, its context) have only their plain functions'
    frames cleared: one may have been caught by a coroutine that went on running, suspended
    (another task's, say), and on Python 3.11 and 3.12 clearing a suspended frame closes its
    coroutine; a function's frame is finished or executing (``frame.clear()`` refuses those).
    ``exc`` itself has every frame after its first cleared: it left each of them (its first is
    the frame handling it), and the coroutines among them (the decoding's) held the tensors."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        if e is exc and tb is not None:
            traceback.clear_frames(tb.tb_next)
            tb = None
        while tb is not None:
            if not tb.tb_frame.f_code.co_flags & _SUSPENDABLE:
                with contextlib.suppress(RuntimeError):   # executing: left as it is
                    tb.tb_frame.clear()
            tb = tb.tb_next
        todo += [e.__cause__, e.__context__]
