"""Hypothesis strategies for merge policies: models, updates and update streams.

Everything is small (a few tensors of a few elements) so hundreds of examples run in seconds, and
shrinks to a readable counterexample. The pieces::

    model_states()         ModelState with mixed shapes (0-d, empty, non-contiguous) and dtypes
                           (float32/64, float16, bfloat16, int64 counters, bool masks)
    updates(model)         one Update that fits ``model`` (delta or full weights)
    update_streams()       an UpdateStream: a model plus results arriving with staleness, reordered,
                           duplicated, from one or many workers, zero samples, optionally NaN/Inf
    staleness_values()     staleness up to a window (the coordinator's ``max_staleness``), mostly,
                           with a wide tail far beyond it (up to 2**40)

An :class:`UpdateStream` records each result's *lag* (how many versions behind the current model
its base is) rather than a fixed base version, because which versions exist depends on what the
policy merged; :class:`vcasync.testing.policy_run.PolicyRun` turns lags into ``Update`` objects the way
the coordinator would (``base_version``, ``staleness``, ``base``).

Integer and bool tensors follow the policy contract: integers in a delta are the worker's
increments, and in full weights its values (PolicyRun turns them into increments against the
base version, as the coordinator does); bools are the worker's values in both.

A stream's model starts at a drawn version (0 at times, up to 2**40), so a lag drawn from
:func:`staleness_values` can make a result that stale: PolicyRun takes versions before the start
to equal the starting model.
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
    "DEFAULT_WINDOW",
    "INT_DTYPES",
    "TAIL_MAX",
    "StreamItem",
    "UpdateStream",
    "model_states",
    "shapes",
    "staleness_values",
    "stream_items",
    "tensors",
    "update_streams",
    "updates",
]

#: The staleness window drawn up to by default: the coordinator's default ``max_staleness``.
DEFAULT_WINDOW = 16
#: The largest staleness (and starting version) the wide tail draws.
TAIL_MAX = 2**40

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
    metrics: dict[str, float] = field(default_factory=dict)

    def to_update(self, base_version: int, staleness: int, base: ModelState | None) -> Update:
        return Update(tensors=self.tensors, kind=self.kind, base_version=base_version,
                      staleness=staleness, samples=self.samples, steps=self.steps,
                      worker_id=self.worker_id, unit_id=self.unit_id, metrics=dict(self.metrics),
                      base=base)


@dataclass(frozen=True, eq=False)
class UpdateStream:
    """A starting model and the results that arrive for it, in arrival order."""

    model: ModelState
    items: tuple[StreamItem, ...] = field(default_factory=tuple)

    def __repr__(self) -> str:
        kinds = "".join("d" if i.kind == "delta" else "w" for i in self.items)
        lags = [i.lag for i in self.items]
        return f"UpdateStream({self.model!r}, {len(self.items)} items, kinds={kinds}, lags={lags})"


def staleness_values(window: int = DEFAULT_WINDOW, *, tail: bool = True) -> st.SearchStrategy[int]:
    """Staleness (or lag) values: mostly in ``[0, window]``, edges included, and with ``tail`` a
    wide tail beyond it, up to :data:`TAIL_MAX` (a coordinator may be configured with any window,
    and a policy must not misbehave only at large staleness)."""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    inside = st.one_of(st.integers(0, window), st.sampled_from(sorted({0, 1, window})))
    if not tail:
        return inside
    beyond = st.one_of(st.integers(window + 1, window + 64),
                       st.integers(0, 40).flatmap(lambda e: st.integers(window + 1,
                                                                        window + 1 + 2**e)),
                       st.just(TAIL_MAX))
    return st.one_of(inside, inside, beyond)


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


_METRICS = st.dictionaries(st.sampled_from(["loss", "accuracy", "lr"]),
                           st.floats(-1e3, 1e3, allow_nan=False), max_size=2)


@st.composite
def stream_items(draw: st.DrawFn, model: ModelState, *, kinds: Sequence[UpdateKind] = ("delta", "weights"),
                 max_lag: int = 3, bound: float = 100.0, allow_nan: bool = False,
                 workers: Sequence[str] = ("w0", "w1", "w2"),
                 lags: st.SearchStrategy[int] | None = None) -> StreamItem:
    """One result for ``model``: kind, payload, lag (``lags``, else 0..max_lag), samples (zero at
    times), steps, worker, metrics."""
    kind: UpdateKind = draw(st.sampled_from(list(kinds)))
    return StreamItem(
        tensors=draw(_payload(model, kind, bound, allow_nan)),
        kind=kind,
        lag=draw(lags if lags is not None else st.integers(0, max_lag)),
        samples=draw(st.one_of(st.just(0), st.integers(1, 1000))),
        steps=draw(st.integers(0, 50)),
        worker_id=draw(st.sampled_from(list(workers))),
        unit_id=f"u{draw(st.integers(0, 99))}",
        metrics=draw(_METRICS),
    )


@st.composite
def updates(draw: st.DrawFn, model: ModelState, *, kind: UpdateKind | None = None,
            bound: float = 100.0, allow_nan: bool = False, staleness: int | None = None) -> Update:
    """One ``Update`` that fits ``model``; a delta's ``base`` is ``model`` (cloned)."""
    k: UpdateKind = kind if kind is not None else draw(st.sampled_from(["delta", "weights"]))
    item = draw(stream_items(model, kinds=(k,), bound=bound, allow_nan=allow_nan))
    tau = staleness if staleness is not None else draw(staleness_values())
    return item.to_update(base_version=model.version, staleness=tau, base=model.clone())


@st.composite
def update_streams(draw: st.DrawFn, *, models: st.SearchStrategy[ModelState] | None = None,
                   min_items: int = 1, max_items: int = 8, max_lag: int | None = None,
                   kinds: Sequence[UpdateKind] = ("delta", "weights"), bound: float = 100.0,
                   allow_nan: bool = False, duplicates: bool = True,
                   workers: int | Literal["any"] = "any", window: int = DEFAULT_WINDOW,
                   tail: bool = True) -> UpdateStream:
    """A model and up to ``max_items`` results for it.

    Lags are drawn independently (from :func:`staleness_values` with ``window`` and ``tail``, or
    uniformly up to ``max_lag`` when given), so results arrive out of order and some very stale;
    the model starts at a drawn version, so such lags are real staleness. With ``duplicates`` an
    earlier result (the very same tensors) may arrive again; ``workers`` fixes the number of
    distinct workers (1 = one worker) or draws it; ``allow_nan`` lets NaN and Inf into payloads.
    """
    model = draw(models if models is not None else model_states(bound=bound))
    if model.version == 0:   # a model drawn at a version of its own keeps it
        start = draw(st.one_of(st.just(0), st.integers(1, window + 8), st.just(TAIL_MAX)))
        model = ModelState(model.tensors, version=start)
    lags = staleness_values(window, tail=tail) if max_lag is None else st.integers(0, max_lag)
    n_workers = draw(st.integers(1, 4)) if workers == "any" else workers
    names = [f"w{i}" for i in range(n_workers)]
    n = draw(st.integers(min_items, max_items))
    items: list[StreamItem] = []
    for _ in range(n):
        if duplicates and items and draw(st.integers(0, 5)) == 0:
            items.append(draw(st.sampled_from(items)))
            continue
        items.append(draw(stream_items(model, kinds=kinds, bound=bound, allow_nan=allow_nan,
                                       workers=names, lags=lags)))
    return UpdateStream(model, tuple(items))
