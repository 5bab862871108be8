"""Tensor kernels the built-in policies share: in place, no model-sized temporaries, bit-exact.

Every kernel writes into an existing tensor with whole-tensor ``lerp_``/``add_``/``sub_``/``mul_``
(an element-wise op gives the same bits whatever the number of threads) and allocates nothing the
size of a model: where a difference ``x - w`` is needed first, it goes into one reusable scratch
buffer the size of the largest tensor (:class:`Workspace`, kept by the policy instance, so a warm
coordinator allocates nothing per merge).

Two torch behaviours shape the rest. ``add_(x, alpha=a)`` on float16/bfloat16 rounds differently
in its vectorised body and its scalar tail, so :func:`axpy` computes half tensors in float32
blocks. A full reduction (``sum()``) depends on the thread count, so :func:`dot2` sums fixed
16,384-element rows (one thread per row) and adds the row sums with ``math.fsum``.

Integer and bool tensors are never averaged (see :mod:`vcasync.policy`, "Integer and bool
tensors"). Integer tensors are counters: every update carries the worker's *increment* (its value
minus the value of the version it trained from, whatever its kind: the coordinator turns full
weights into increments before a policy sees them), and the model adds every merged increment
(:func:`add_counts`). Bool tensors carry the worker's value and the last merged one wins
(:func:`take_discrete`). Buffering policies sum the increments (and keep the last bool value) in
their state and apply them with the flush (:func:`buffer_discrete`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

from vcasync.errors import SpecMismatchError, UpdateRejectedError, ValidationError
from vcasync.tensors import ModelState, Update

__all__ = [
    "BLOCK",
    "DOT_BLOCK",
    "ROW",
    "Workspace",
    "accumulate_delta",
    "axpy",
    "blocks",
    "buffer_discrete",
    "check_update",
    "decay_add",
    "delta_of",
    "dot2",
    "fused",
    "lerp_delta",
    "mix_result",
    "mixable",
    "store_delta",
    "sumsq",
    "take_discrete",
]

#: Elements per reduction row: below torch's parallel grain (32,768), so one thread sums a row.
ROW = 16384
#: Elements per block where a loop over blocks bounds scratch memory (a multiple of ROW).
BLOCK = 16 * ROW
#: Elements per span of a fused kernel: every pass of a multi-pass update runs over one span of
#: each tensor before the next span, so a later pass reads what an earlier one wrote from cache
#: instead of memory (512 KiB of float32 per stream). Measured on a 25M-parameter model, 1 thread,
#: CPU time: 32K-256K elements are within noise of each other; smaller spans pay more per-op
#: dispatch (~2 us a call), larger ones spill the cache.
FUSE = 8 * ROW
#: Elements per block of a reduction (:func:`dot2`): a whole number of rows,
#: large enough that per-call overhead is small, small enough that a block read by one pass is
#: still in cache for the next. Measured at 100M parameters, 1 thread, CPU time: 16-64 rows are
#: within noise of each other, 8 rows pays ~15 % more, 256 rows ~10 % more.
DOT_BLOCK = 32 * ROW


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
    """Named scratch buffers reused across merges; holds no state (results never depend on it)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, slot: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A contiguous 1-d view of ``numel`` elements; contents are garbage."""
        buf = self._bufs.get((slot, dtype))
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype)
            self._bufs[(slot, dtype)] = buf
        return buf[:numel]

    @property
    def nbytes(self) -> int:
        """Bytes held by all scratch buffers."""
        return sum(b.numel() * b.element_size() for b in self._bufs.values())


def blocks(n: int, size: int = BLOCK) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of consecutive blocks covering ``range(n)``."""
    for start in range(0, n, size):
        yield start, min(start + size, n)


def fused(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Matching spans of ``tensors`` (same numel), as 1-d views, ``FUSE`` elements at a time.

    An element-wise op over the spans gives the same bits as over the whole tensors (spans start
    at multiples of ``FUSE``, so each span's vectorised body and tail line up like the whole
    tensor's threads' do), so a kernel that runs several passes per span is a pure speed-up.
    Small or non-contiguous tensors come whole, in their own shapes.
    """
    n = tensors[0].numel()
    if n <= FUSE or not all(t.is_contiguous() for t in tensors):
        yield tensors
        return
    flat = [t.view(-1) for t in tensors]
    for s in range(0, n, FUSE):
        yield tuple(f[s:s + FUSE] for f in flat)


_HALF = (torch.float16, torch.bfloat16)


def axpy(w: torch.Tensor, x: torch.Tensor, alpha: float, ws: Workspace) -> None:
    """``w += alpha * x`` in place, the same bits whatever the thread count (see module doc)."""
    if alpha == 1.0:
        w.add_(x)
    elif alpha == -1.0:
        w.sub_(x)
    elif w.dtype not in _HALF:
        w.add_(x, alpha=alpha)
    elif not w.is_contiguous():  # rare: one float32 temporary the size of this tensor
        w.copy_(w.float().add_(x.float(), alpha=alpha))
    else:
        wf, xf = w.view(-1), x.reshape(-1)
        for s, e in blocks(wf.numel()):
            a = ws.take("axpy_w", torch.float32, e - s)
            b = ws.take("axpy_x", torch.float32, e - s)
            a.copy_(wf[s:e])
            b.copy_(xf[s:e])
            wf[s:e].copy_(a.add_(b, alpha=alpha))


def decay_add(v: torch.Tensor, x: torch.Tensor, mu: float) -> None:
    """``v <- mu v + x`` in place, the same bits whatever the thread count: one pass
    (``torch.add(x, v, alpha=mu, out=v)``), or for half tensors two (each rounds once; see
    :func:`axpy` on half ``alpha``)."""
    if v.dtype in _HALF:
        v.mul_(mu).add_(x)
    else:
        torch.add(x, v, alpha=mu, out=v)


def take_discrete(w: torch.Tensor, x: torch.Tensor) -> None:
    """Merge one integer or bool tensor in place: ``w += x`` (an increment) for integers, ``w <- x``
    (the worker's value, last merged wins) for bools.

    Integer addition wraps on overflow, the same way on every machine, so replay stays bit-exact.
    """
    if w.dtype == torch.bool:
        w.copy_(x)
    else:
        w.add_(x)


def buffer_discrete(buf: torch.Tensor, x: torch.Tensor, *, first: bool) -> None:
    """Fold one result's integer/bool tensor into a buffer that :func:`take_discrete` applies later:
    the sum of the increments, or the last bool value (``first``: the buffer's contents are stale)."""
    if first or buf.dtype == torch.bool:
        buf.copy_(x)
    else:
        buf.add_(x)


def delta_of(x: torch.Tensor, w: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """``x - w`` in the workspace's ``delta`` buffer (valid until the next call), shaped like ``x``.

    Subtracting first keeps ``x == w`` an exact zero delta and small deltas of large weights exact.
    """
    d = ws.take("delta", x.dtype, x.numel()).view(x.shape)
    torch.sub(x, w, out=d)
    return d


def store_delta(slot: torch.Tensor, w: torch.Tensor, x: torch.Tensor, *, weights: bool) -> None:
    """``slot <- d`` (``x`` for a delta, ``x - w`` for full weights; integer and bool tensors are
    increments and values in both kinds, so they are copied as they are)."""
    if weights and mixable(w):
        torch.sub(x, w, out=slot)
    else:
        slot.copy_(x)


def mix_result(w: torch.Tensor, x: torch.Tensor, base: torch.Tensor | None, weight: float,
               ws: Workspace) -> None:
    """``w <- (1 - weight) w + weight w_c`` in place, ``w_c = x`` or ``base + x`` (a delta).

    Two passes, no temporary: ``lerp_`` towards the base, then add the weighted delta, span by
    span (:func:`fused`), so the model is read from memory once.
    """
    if not mixable(w):
        take_discrete(w, x)
        return
    if weight == 0.0:
        return
    if base is None:
        w.lerp_(x, weight)
    else:
        for ws_, bs, xs in fused(w, base, x):
            axpy(ws_.lerp_(bs, weight), xs, weight, ws)


def accumulate_delta(buf: torch.Tensor, w: torch.Tensor, x: torch.Tensor, *, weights: bool,
                     scale: float, ws: Workspace) -> None:
    """``buf += scale * d`` with ``d = x`` (a delta) or ``x - w`` (full weights against the model);
    ``x - w`` is formed span by span, in cache."""
    if not weights:
        axpy(buf, x, scale, ws)
        return
    for bs, wsp, xs in fused(buf, w, x):
        axpy(bs, delta_of(xs, wsp, ws), scale, ws)


def lerp_delta(buf: torch.Tensor, w: torch.Tensor, x: torch.Tensor, *, weights: bool,
               ratio: float, ws: Workspace) -> None:
    """``buf <- (1 - ratio) buf + ratio d`` (a running mean of deltas), ``d`` as in accumulate."""
    if not weights:
        buf.lerp_(x, ratio)
        return
    for bs, wsp, xs in fused(buf, w, x):
        bs.lerp_(delta_of(xs, wsp, ws), ratio)


def _row_values(t: torch.Tensor, op: str, ctype: torch.dtype) -> list[float]:
    """Per fixed row of ``t`` (1-d; ``ROW`` elements, the last row shorter): the sum (``op="sum"``)
    or the 2-norm (``"norm"``, computed in ``ctype``). One thread reduces one row (a row is below
    torch's parallel grain), so the values do not depend on the thread count."""
    n = t.numel()
    full = (n // ROW) * ROW
    parts = [t[:full].view(-1, ROW)] if full else []
    if full < n:
        parts.append(t[full:].view(1, -1))
    out: list[float] = []
    for rows in parts:
        if op == "sum":
            out.extend(rows.sum(dim=1).tolist())
        else:
            out.extend(torch.linalg.vector_norm(rows, dim=1, dtype=ctype).tolist())
    return out


def _exact_sum(values: list[float]) -> float:
    """``math.fsum`` of finite values; NaN or Inf propagate as in a plain sum (fsum refuses
    ``inf + -inf``, which rows that overflow either way can produce)."""
    return math.fsum(values) if all(map(math.isfinite, values)) else sum(values)


def _ctype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def dot2(x: torch.Tensor, r: torch.Tensor, ws: Workspace, *,
         x_minus: torch.Tensor | None = None) -> tuple[float, float]:
    """``(d.d, d.r)`` with ``d = x - x_minus`` (or ``x``), independent of the thread count.

    Block by block (``DOT_BLOCK`` elements, kept in cache between the two passes): ``d.r`` as the
    product (float32, or float64 for float64 tensors; half tensors are widened first) summed per
    fixed row, ``d.d`` as the squares of the per-row 2-norms (one fused pass, no product written);
    the row values are added exactly (``math.fsum``). A gate compares these against thresholds, so
    float32 rounding (about 1e-7 relative) is immaterial; what matters is that the same inputs give
    the same bits.
    """
    ctype = _ctype(x)
    xf, rf = x.reshape(-1), r.reshape(-1)
    mf = None if x_minus is None else x_minus.reshape(-1)
    dd: list[float] = []
    dr: list[float] = []
    for s, e in blocks(xf.numel(), DOT_BLOCK):
        n = e - s
        a, b = xf[s:e], rf[s:e]
        if mf is not None or a.dtype != ctype:
            a = ws.take("dot_a", ctype, n).copy_(a)
            if mf is not None:
                a.sub_(mf[s:e])
        if b.dtype != ctype:
            b = ws.take("dot_b", ctype, n).copy_(b)
        p = ws.take("dot_p", ctype, n)
        torch.mul(a, b, out=p)
        dr.extend(_row_values(p, "sum", ctype))
        dd.extend(v * v for v in _row_values(a, "norm", ctype))
    return _exact_sum(dd), _exact_sum(dr)


def sumsq(t: torch.Tensor) -> float:
    """``t.t`` by fixed rows (the squares of their 2-norms, added exactly), like :func:`dot2`."""
    return _exact_sum([v * v for v in _row_values(t.reshape(-1), "norm", _ctype(t))])
