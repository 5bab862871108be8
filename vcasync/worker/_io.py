"""The worker's I/O with big tensors: models in (a cache checked by ETag), results out (spooled).

Kept apart from the worker loop so each stays small; nothing here talks HTTP itself (the worker
passes a ``fetch`` function that does, with its retries).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .._aio import close_file, file_blocks, open_binary
from ..errors import SpecMismatchError, ValidationError, VCAsyncError
from ..ledger._units import WorkUnit
from ..protocol._bodies import MAX_RESULT_SAMPLES, metrics_problem
from ..tensors import ModelSpec, ModelState, is_counter, make_delta
from ..trainer import TrainResult
from ..wire import Limits, aencode_payload, decode_payload
from ._state_dir import StateDir

__all__ = ["ModelCache", "counter_went_down", "result_problem", "result_tensors", "spool_result"]

log = logging.getLogger("vcasync.worker")

#: ``fetch(path, etag)``: download the model into ``path`` unless ``etag`` still matches (then leave
#: ``path`` alone); return the coordinator's current ETag for it.
Fetch = Callable[[Path, "str | None"], Awaitable["str | None"]]


class ModelCache:
    """Model versions in memory (the newest ``keep``) and on disk, revalidated by ETag on every use.

    Every use costs one conditional GET (a 304 without a body when the cache is good): a coordinator
    restarted without durability, or a new run on the same URL, reuses version numbers for different
    weights, and only the ETag tells them apart.
    """

    def __init__(self, state: StateDir, *, limits: Limits, keep: int) -> None:
        self._state = state
        self._limits = limits
        self._keep = keep
        self._memory: dict[int, tuple[str | None, ModelState]] = {}
        self._spec: ModelSpec | None = None

    async def get(self, version: int, fetch: Fetch) -> ModelState:
        path = self._state.model_path(version)
        cached = self._memory.get(version)
        etag = cached[0] if cached is not None else await asyncio.to_thread(self._state.load_etag, version)
        if cached is None and etag is not None and not await asyncio.to_thread(path.exists):
            etag = None
        got = await fetch(path, etag)
        if cached is not None and got == etag:
            return cached[1]
        for attempt in range(2):
            try:
                model = await self._decode(path, version)
                break
            except (VCAsyncError, OSError) as exc:
                await asyncio.to_thread(path.unlink, missing_ok=True)
                if attempt:
                    raise
                log.warning("cached model v%d is unusable (%s); downloading it again", version, exc)
                got = await fetch(path, None)
        await asyncio.to_thread(self._state.save_etag, version, got)
        self._memory[version] = (got, model)
        for old in sorted(self._memory)[:-self._keep]:
            del self._memory[old]
        await asyncio.to_thread(self._state.prune_models, set(self._memory))
        return model

    async def _decode(self, path: Path, version: int) -> ModelState:
        payload = await decode_payload(_file_chunks(path), limits=self._limits, spec=self._spec,
                                       expected_kind="model")
        got = payload.meta.get("version")
        if got != version:
            raise ValidationError(f"model file holds version {got}, expected {version}", reason="version")
        model = ModelState(payload.tensors, version=version)
        digest = payload.meta.get("digest")
        if digest is not None and await asyncio.to_thread(model.digest) != digest:
            raise ValidationError(f"model v{version} does not match its digest", reason="digest")
        if self._spec is None:
            self._spec = model.spec
        return model


async def _file_chunks(path: Path, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
    f = await open_binary(path)
    try:
        async for chunk in file_blocks(f, chunk_size):
            yield chunk
    finally:
        await close_file(f)


def result_problem(base: ModelState, result: TrainResult, unit: WorkUnit) -> str | None:
    """What makes ``result`` one the coordinator must refuse, found before any upload; None if nothing.

    Names, shapes and dtypes against the model the trainer started from, integer tensors (counters)
    not below it (:func:`counter_went_down`), ``steps`` within the unit
    (at least one step is checked by the worker before), ``samples`` in 0..2**40, metrics finite
    numbers. The same for both upload modes: a float64 result of a float32 model is refused, not cast
    (a ``weights`` upload would be refused for it, so a ``delta`` one must not hide it).
    """
    tensors: Mapping[Any, object] = result.tensors     # a hand-made TrainResult may hold anything
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            return f"result tensor {name!r} is a {type(t).__name__}, not a torch.Tensor"
        if t.layout != torch.strided or t.is_meta:
            # a sparse (or data-less meta) tensor passed every check below, then crashed the
            # worker at the delta (RuntimeError: add(sparse, dense)) with the lease still held
            if t.is_meta:
                return (f"result tensor {name!r} is a meta tensor, which holds no values; "
                        "return the trained tensor itself")
            return (f"result tensor {name!r} has layout {t.layout}; the model's tensors are "
                    "dense: return t.to_dense()")
    try:
        base.spec.check(result.tensors)     # what the coordinator checks first, with its messages
    except SpecMismatchError as exc:
        return f"the result does not match the model: {exc}"
    went_down = counter_went_down(base, result.tensors)
    if went_down is not None:
        return went_down
    if result.steps > unit.steps:
        return f"the result claims {result.steps} steps; unit {unit.unit_id} has {unit.steps}"
    if result.samples < 0:
        return f"the result claims {result.samples} samples; it must be >= 0"
    if result.samples > MAX_RESULT_SAMPLES:
        return (f"the result claims {result.samples} samples; a result may count at most 2**40 "
                f"({MAX_RESULT_SAMPLES})")
    return metrics_problem(result.metrics)       # the coordinator's own rule


def counter_went_down(base: ModelState, tensors: Mapping[str, torch.Tensor]) -> str | None:
    """What the coordinator would refuse as ``negative_increment``, said the way its cause is fixed:
    the first integer tensor with an element below its value in ``base``; None if none."""
    for name, b in base.items():
        if not is_counter(b) or not b.numel():
            continue
        t = tensors[name].detach().cpu()
        down = t < b
        if bool(down.any()):
            at = int(down.reshape(-1).nonzero()[0])
            where = f" (element {at})" if b.numel() > 1 else ""
            return (f"integer tensor {name!r} went down from {int(b.reshape(-1)[at])} to "
                    f"{int(t.reshape(-1)[at])}{where}: integer tensors are counters that may only "
                    "grow (the coordinator adds each result's increment and refuses one below "
                    "zero); make it a float buffer, or keep it out of the state dict "
                    "(register_buffer(..., persistent=False))")
    return None


def result_tensors(base: ModelState, result: TrainResult, upload: str) -> dict[str, torch.Tensor]:
    """The tensors to upload of a result :func:`result_problem` found nothing wrong with."""
    names = list(base)
    if upload == "weights":
        return {n: result.tensors[n].detach().cpu().contiguous() for n in names}
    # Integer tensors go as increments (t - base) and bools as values, like the coordinator's
    # reading of a full-weights result, so both upload modes merge to the same counters.
    return make_delta(base, result.tensors)


async def spool_result(path: Path, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                 codec: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    f = await open_binary(tmp, "wb")
    try:
        async for chunk in aencode_payload("result", meta, tensors, codec=codec):
            await asyncio.to_thread(f.write, chunk)
    finally:
        await close_file(f)
    await asyncio.to_thread(os.replace, tmp, path)
