"""Hypothesis strategies for merge policies: models, updates and update streams.

Everything is small (a few tensors of a few elements) so hundreds of examples run in seconds, and
shrinks to a readable counterexample. The pieces::

    model_states()         ModelState with mixed shapes (0-d, empty, non-contiguous) and dtypes
                           (float32/64, float16, bfloat16, int64 counters, bool masks)
    updates(model)         one Update that fits ``model`` (delta or full weights)
    update_streams()       an UpdateStream: a model plus results arriving with staleness, reordered,
                           duplicated, from one or many workers, zero samples, optionally NaN/Inf

An :class:`UpdateStream` records each result's *lag* (how many versions behind the current model
its base is) rather than a fixed base version, because which versions exist depends on what the
policy merged; :class:`vcasync.testing.harness.PolicyRun` turns lags into ``Update`` objects the way
the coordinator would (``base_version``, ``staleness``, ``base``).

Integer and bool tensors follow the policy contract: a delta carries the worker's values for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from hypothesis import strategies as st

from ..tensors import ModelState, Update, UpdateKind

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "StreamItem",
    "UpdateStream",
    "model_states",
    "shapes",
    "stream_items",
    "tensors",
    "update_streams",
    "updates",
]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES: tuple[torch.dtype, ...] = (torch.int64, torch.int32, torch.bool)


@dataclass(frozen=True, eq=False)
class StreamItem:
    """One result in a stream: its tensors (a delta or full weights) and the coordinator's facts."""

    tensors: dict[str, torch.Tensor]
    kind: UpdateKind = "delta"
    lag: int = 0
    samples: int = 1
    steps: int = 1
    worker_id: str = "w0"
    unit_id: str = "u0"

    def to_update(self, base_version: int, staleness: int, base: ModelState | None) -> Update:
        return Update(tensors=self.tensors, kind=self.kind, base_version=base_version,
                      staleness=staleness, samples=self.samples, steps=self.steps,
                      worker_id=self.worker_id, unit_id=self.unit_id, base=base)


@dataclass(frozen=True, eq=False)
class UpdateStream:
    """A starting model and the results that arrive for it, in arrival order."""

    model: ModelState
    items: tuple[StreamItem, ...] = field(default_factory=tuple)

    def __repr__(self) -> str:
        kinds = "".join("d" if i.kind == "delta" else "w" for i in self.items)
        lags = [i.lag for i in self.items]
        return f"UpdateStream({self.model!r}, {len(self.items)} items, kinds={kinds}, lags={lags})"


def shapes(*, max_dims: int = 3, max_side: int = 4, allow_empty: bool = True) -> st.SearchStrategy[
        tuple[int, ...]]:
    """Tensor shapes: 0-d scalars up to ``max_dims`` dimensions, sides 1..max_side (0 if allowed)."""
    side = st.integers(0 if allow_empty else 1, max_side)
    return st.lists(side, min_size=0, max_size=max_dims).map(tuple)


def _specials(dtype: torch.dtype, bound: float, allow_nan: bool) -> list[float]:
    values = [0.0, -0.0, bound, -bound, 1.0, -1.0, torch.finfo(dtype).tiny, 1e-3]
    return values + ([float("nan"), float("inf"), float("-inf")] if allow_nan else [])


@st.composite
def tensors(draw: st.DrawFn, shape: tuple[int, ...], dtype: torch.dtype, *, bound: float = 100.0,
            allow_nan: bool = False, contiguous: bool | None = None) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype``: floats in [-bound, bound] (NaN/Inf when allowed), ints in
    [0, 10^6] (counter-like), random bools; non-contiguous (a transposed view) at times.

    Values come from a drawn seed (one draw per tensor keeps generation fast) with a few drawn
    special values poked in (signed zeros, the bounds, the smallest normal, NaN/Inf), so
    hypothesis still shrinks towards simple cases: seed 0, no pokes.
    """
    numel = 1
    for d in shape:
        numel *= d
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    if dtype == torch.bool:
        flat = torch.rand(numel, generator=gen) < 0.5
    elif dtype.is_floating_point:
        scale = draw(st.sampled_from([bound, 1.0, 1e-3]))
        flat = ((torch.rand(numel, generator=gen, dtype=torch.float64) * 2 - 1) * scale).to(dtype)
        if numel:
            for _ in range(draw(st.integers(0, min(3, numel)))):
                index = draw(st.integers(0, numel - 1))
                flat[index] = draw(st.sampled_from(_specials(dtype, bound, allow_nan)))
    else:
        flat = torch.randint(0, 10**6, (numel,), generator=gen).to(dtype)
    strided = len(shape) >= 2 and (draw(st.booleans()) if contiguous is None else not contiguous)
    if strided:
        flipped = (*shape[:-2], shape[-1], shape[-2])
        return flat.reshape(flipped).transpose(-1, -2)
    return flat.reshape(shape)


@st.composite
def model_states(draw: st.DrawFn, *, min_tensors: int = 1, max_tensors: int = 4,
                 float_dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
                 int_dtypes: Sequence[torch.dtype] = INT_DTYPES, bound: float = 100.0,
                 max_side: int = 4) -> ModelState:
    """A model: at least one floating-point tensor, then any mix of float, integer and bool ones."""
    n = draw(st.integers(min_tensors, max_tensors))
    dtypes = [draw(st.sampled_from(list(float_dtypes)))]
    pool = list(float_dtypes) + list(int_dtypes)
    dtypes += [draw(st.sampled_from(pool)) for _ in range(n - 1)]
    out: dict[str, torch.Tensor] = {}
    for i, dtype in enumerate(dtypes):
        shape = draw(shapes(max_side=max_side, allow_empty=i > 0))
        out[f"layer{i}.{'weight' if dtype.is_floating_point else 'buffer'}"] = draw(
            tensors(shape, dtype, bound=bound))
    return ModelState(out, version=0)


@st.composite
def _payload(draw: st.DrawFn, model: ModelState, kind: UpdateKind, bound: float,
             allow_nan: bool) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t in model.items():
        shape = tuple(int(d) for d in t.shape)
        out[name] = draw(tensors(shape, t.dtype, bound=bound, allow_nan=allow_nan))
    return out


@st.composite
def stream_items(draw: st.DrawFn, model: ModelState, *, kinds: Sequence[UpdateKind] = ("delta", "weights"),
                 max_lag: int = 3, bound: float = 100.0, allow_nan: bool = False,
                 workers: Sequence[str] = ("w0", "w1", "w2")) -> StreamItem:
    """One result for ``model``: kind, payload, lag, samples (zero at times), steps, worker."""
    kind: UpdateKind = draw(st.sampled_from(list(kinds)))
    return StreamItem(
        tensors=draw(_payload(model, kind, bound, allow_nan)),
        kind=kind,
        lag=draw(st.integers(0, max_lag)),
        samples=draw(st.one_of(st.just(0), st.integers(1, 1000))),
        steps=draw(st.integers(0, 50)),
        worker_id=draw(st.sampled_from(list(workers))),
        unit_id=f"u{draw(st.integers(0, 99))}",
    )


@st.composite
def updates(draw: st.DrawFn, model: ModelState, *, kind: UpdateKind | None = None,
            bound: float = 100.0, allow_nan: bool = False, staleness: int | None = None) -> Update:
    """One ``Update`` that fits ``model``; a delta's ``base`` is ``model`` (cloned)."""
    k: UpdateKind = kind if kind is not None else draw(st.sampled_from(["delta", "weights"]))
    item = draw(stream_items(model, kinds=(k,), bound=bound, allow_nan=allow_nan))
    tau = staleness if staleness is not None else draw(st.integers(0, 5))
    return item.to_update(base_version=model.version, staleness=tau, base=model.clone())


@st.composite
def update_streams(draw: st.DrawFn, *, models: st.SearchStrategy[ModelState] | None = None,
                   min_items: int = 1, max_items: int = 8, max_lag: int = 3,
                   kinds: Sequence[UpdateKind] = ("delta", "weights"), bound: float = 100.0,
                   allow_nan: bool = False, duplicates: bool = True,
                   workers: int | Literal["any"] = "any") -> UpdateStream:
    """A model and up to ``max_items`` results for it.

    Lags are drawn independently, so results arrive out of order; with ``duplicates`` an earlier
    result (the very same tensors) may arrive again; ``workers`` fixes the number of distinct
    workers (1 = one worker) or draws it; ``allow_nan`` lets NaN and Inf into payloads.
    """
    model = draw(models if models is not None else model_states(bound=bound))
    n_workers = draw(st.integers(1, 4)) if workers == "any" else workers
    names = [f"w{i}" for i in range(n_workers)]
    n = draw(st.integers(min_items, max_items))
    items: list[StreamItem] = []
    for _ in range(n):
        if duplicates and items and draw(st.integers(0, 5)) == 0:
            items.append(draw(st.sampled_from(items)))
            continue
        items.append(draw(stream_items(model, kinds=kinds, max_lag=max_lag, bound=bound,
                                       allow_nan=allow_nan, workers=names)))
    return UpdateStream(model, tuple(items))
