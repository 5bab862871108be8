"""Tensor kernels the built-in policies share: in place, no model-sized temporaries, bit-exact.

Every kernel here writes into an existing tensor with ``lerp_``/``add_``/``sub_``/``mul_`` (an
element-wise op gives the same bits whatever the number of threads) and allocates nothing the size of
a model. Reductions (the gate's norms and cosines) run row by row over fixed 16,384-element rows,
each row summed by one thread in float64, and the rows added with ``math.fsum``: the result does not
depend on the thread count either.

Integer and bool tensors are never averaged: the model takes the element-wise maximum of its value
and the worker's (logical or for bools). Deltas carry the worker's values for such tensors (a
difference of counters or masks means nothing), so the same rule serves both kinds of update.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

from vcasync.errors import SpecMismatchError, UpdateRejectedError, ValidationError
from vcasync.tensors import ModelState, Update

__all__ = [
    "ROW",
    "Workspace",
    "accumulate_delta",
    "check_update",
    "delta_blocks",
    "dot_rows",
    "lerp_delta",
    "mixable",
    "mix_result",
    "store_delta",
    "take_max",
]

#: Elements per reduction row: below torch's parallel grain (32,768), so one thread sums a row.
ROW = 16384
_STEP_ROWS = 64


def mixable(t: torch.Tensor) -> bool:
    """True for tensors that are averaged (floating point and complex); others take the max rule."""
    return t.is_floating_point() or t.is_complex()


def check_update(model: ModelState, update: Update, *, needs_base: bool) -> None:
    """Refuse, before touching anything, an update that does not fit ``model``.

    The coordinator validates results first; this keeps a policy honest when it is fed directly.
    """
    if update.kind not in ("delta", "weights"):
        raise ValidationError(f"update kind must be 'delta' or 'weights', got {update.kind!r}",
                              reason="unknown_kind")
    if update.staleness < 0 or update.samples < 0 or update.steps < 0:
        raise ValidationError("staleness, samples and steps must not be negative",
                              reason="negative_count")
    _check_tensors(model, update.tensors, "update")
    if needs_base and update.kind == "delta":
        if update.base is None:
            raise UpdateRejectedError(
                f"a delta based on version {update.base_version} needs that model, which the "
                f"coordinator no longer holds; send full weights or lease again",
                reason="base_unavailable")
        _check_tensors(model, update.base, "base")


def _check_tensors(model: ModelState, tensors: Mapping[str, torch.Tensor], what: str) -> None:
    if len(tensors) != len(model) or any(n not in tensors for n in model):
        missing = [n for n in model if n not in tensors]
        extra = [n for n in tensors if n not in model.tensors]
        name = (missing or extra)[0]
        raise SpecMismatchError(f"{what} tensors do not match the model (first: {name!r})",
                                reason="missing_tensor" if missing else "unknown_tensor", name=name)
    for name, t in model.items():
        u = tensors[name]
        if u.shape != t.shape or u.dtype != t.dtype:
            raise SpecMismatchError(
                f"{what} tensor {name!r} is {u.dtype}{tuple(u.shape)}, the model has "
                f"{t.dtype}{tuple(t.shape)}", reason="spec_mismatch", name=name)


class Workspace:
    """Reusable scratch rows, so reductions allocate a few MiB once per policy instance, not per merge.

    Holds no algorithm state: results never depend on what it held before.
    """

    def __init__(self) -> None:
        self._bufs: dict[torch.dtype, torch.Tensor] = {}

    def take(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        buf = self._bufs.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype)
            self._bufs[dtype] = buf
        return buf[:numel]


def _steps(n: int) -> Iterator[tuple[int, int]]:
    step = ROW * _STEP_ROWS
    for start in range(0, n, step):
        yield start, min(start + step, n)


def take_max(w: torch.Tensor, x: torch.Tensor) -> None:
    """``w <- max(w, x)`` element-wise, in place (logical or for bools)."""
    torch.maximum(w, x, out=w)


def mix_result(w: torch.Tensor, x: torch.Tensor, base: torch.Tensor | None, weight: float) -> None:
    """``w <- (1 - weight) w + weight w_c`` in place, ``w_c = x`` or ``base + x`` (a delta).

    Two passes, no temporary: ``lerp_`` towards the base, then ``add_`` the weighted delta.
    """
    if not mixable(w):
        take_max(w, x)
        return
    if weight == 0.0:
        return
    if base is None:
        w.lerp_(x, weight)
    else:
        w.lerp_(base, weight).add_(x, alpha=weight)


def delta_blocks(x: torch.Tensor, w: torch.Tensor,
                 ws: Workspace) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield ``(start, end, x - w)`` over flat blocks of 1 Mi elements, computed into scratch.

    Subtracting first (rather than ``add_(x).sub_(w)``) keeps ``x == w`` an exact zero delta.
    """
    xf, wf = x.reshape(-1), w.reshape(-1)
    for s, e in _steps(xf.numel()):
        tmp = ws.take(x.dtype, e - s)
        torch.sub(xf[s:e], wf[s:e], out=tmp)
        yield s, e, tmp


def accumulate_delta(buf: torch.Tensor, w: torch.Tensor, x: torch.Tensor, *, weights: bool,
                     scale: float, ws: Workspace) -> None:
    """``buf += scale * d`` with ``d = x`` (a delta) or ``x - w`` (full weights against the model).

    ``buf`` is contiguous (the policy allocated it).
    """
    if not weights:
        buf.add_(x, alpha=scale)
        return
    bf = buf.view(-1)
    for s, e, d in delta_blocks(x, w, ws):
        bf[s:e].add_(d, alpha=scale)


def lerp_delta(buf: torch.Tensor, w: torch.Tensor, x: torch.Tensor, *, weights: bool,
               ratio: float, ws: Workspace) -> None:
    """``buf <- (1 - ratio) buf + ratio d`` (a running mean of deltas), ``d`` as in accumulate."""
    if not weights:
        buf.lerp_(x, ratio)
        return
    bf = buf.view(-1)
    for s, e, d in delta_blocks(x, w, ws):
        bf[s:e].lerp_(d, ratio)


def store_delta(slot: torch.Tensor, w: torch.Tensor, x: torch.Tensor, *, weights: bool) -> None:
    """``slot <- d`` (``x`` for a delta, ``x - w`` for full weights; integers keep their values)."""
    if weights and mixable(w):
        torch.sub(x, w, out=slot)
    else:
        slot.copy_(x)


def dot_rows(x: torch.Tensor, y: torch.Tensor, ws: Workspace, *, x_minus: torch.Tensor | None = None,
             y_minus: torch.Tensor | None = None) -> float:
    """``sum((x - x_minus) * (y - y_minus))`` in float64, independent of the thread count.

    All tensors have the same shape; the ``*_minus`` ones turn full weights into a delta on the
    fly, one scratch block at a time (see the module docstring for the fixed-row reduction).
    """
    xf, yf = x.reshape(-1), y.reshape(-1)
    xm = None if x_minus is None else x_minus.reshape(-1)
    ym = None if y_minus is None else y_minus.reshape(-1)
    parts: list[float] = []
    for s, e in _steps(xf.numel()):
        n = e - s
        tmp = ws.take(torch.float64, 2 * n)
        a, b = tmp[:n], tmp[n:]
        a.copy_(xf[s:e])
        if xm is not None:
            a.sub_(xm[s:e])
        b.copy_(yf[s:e])
        if ym is not None:
            b.sub_(ym[s:e])
        a.mul_(b)
        full = (n // ROW) * ROW
        if full:
            parts.extend(a[:full].view(-1, ROW).sum(dim=1).tolist())
        if full < n:
            parts.extend(a[full:].view(1, -1).sum(dim=1).tolist())
    return math.fsum(parts)
