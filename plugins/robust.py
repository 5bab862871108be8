"""Robust aggregation: coordinate-wise median and trimmed mean over a buffer of K deltas.

Yin, Chen, Ramchandran, Bartlett, *Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates*, ICML 2018 (arXiv 1803.01498): the coordinate-wise median, and the
``beta``-trimmed mean (drop the ``floor(beta K)`` smallest and largest values of each coordinate,
average the rest). After K results the model moves by ``lr`` times the aggregate delta.

Bounded influence: with at most ``max_outliers`` arbitrary results among the K (``(K - 1) // 2`` for
the median, ``floor(beta K)`` for the trimmed mean), every coordinate of the aggregate stays within
the honest results' range. The median of an even K is the midpoint of the two middle values, and the
trimmed mean is a running mean (``lerp_``) over the kept sorted values, so both stay exactly inside
that range. At the end of the run the coordinator calls ``flush``: n < K buffered deltas are
aggregated as a buffer of n would be. Integer and bool tensors follow the policy contract's rule,
not the robust aggregate: the model adds the sum of the buffered increments and takes the last
buffered bool value (a counter counts every merged step; bounded influence is a promise about the
floating-point tensors).

Full weights become a delta against the current model (unchanged while the buffer fills). The
buffer holds K copies by nature (their tensors are reused after a flush); each coordinate block of
64 Ki is sorted in a reused K x 64 Ki scratch by a network of element-wise min/max (see
:func:`sort_columns`), so the merge itself allocates nothing model-sized.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from vcasync.errors import ConfigError
from vcasync.policy import PolicyState
from vcasync.tensors import ModelState, Update

from ._bounds import MAX_COPIES, at_most
from ._kernels import (
    Workspace,
    axpy,
    blocks,
    buffer_discrete,
    check_update,
    mixable,
    store_delta,
    take_discrete,
)

__all__ = ["Median", "TrimmedMean", "sort_columns"]

_BLOCK = 1 << 16  # coordinates sorted at once (K rows of scratch)


class _Buffered:
    """Buffers K deltas (state ``slots``), then aggregates each coordinate over the K of them."""

    name: ClassVar[str]
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "bounded_influence"})

    def __init__(self, buffer_size: int, lr: float) -> None:
        if buffer_size < 1:
            raise ConfigError(f"{self.name}: buffer_size must be >= 1, got {buffer_size}")
        at_most(self.name, "buffer_size", buffer_size, MAX_COPIES,
                "the buffer holds a copy of the model per result, in the coordinator's memory")
        if not 0.0 < lr < float("inf"):
            raise ConfigError(f"{self.name}: lr must be positive and finite, got {lr}")
        self.buffer_size = buffer_size
        self.lr = lr
        # emptied slots, reused (no state in them; see _slot for the ones a failed merge took back)
        self._spare: list[dict[str, torch.Tensor]] = []
        self._ws = Workspace()

    @property
    def max_outliers(self) -> int:
        raise NotImplementedError

    def init_state(self, model: ModelState) -> PolicyState:
        for name, t in model.items():
            if t.is_complex():
                raise ConfigError(f"{self.name}: tensor {name!r} is complex; a coordinate-wise "
                                  f"order needs real values")
        return {"slots": []}

    def _slot(self, model: ModelState, slots: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """An emptied slot to reuse, or a new one. ``_apply_slots`` hands its slots to ``_spare``
        before the coordinator has checked the model; when that merge or flush then fails, the
        coordinator's undo puts the same tensors back into ``slots`` (the state) while ``_spare``
        still lists them. Such a slot holds a buffered result, not scratch: reusing it would write
        over that result, so a slot whose tensors are in the state is dropped from the spares."""
        held = {id(t) for s in slots for t in s.values()}
        while self._spare:
            slot = self._spare.pop()
            if any(id(t) in held for t in slot.values()):
                continue
            if all(slot[n].shape == t.shape and slot[n].dtype == t.dtype for n, t in model.items()):
                return slot
            break
        return {n: torch.empty(t.shape, dtype=t.dtype) for n, t in model.items()}

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState | None:
        check_update(model, update, needs_base=False)
        slots: list[dict[str, torch.Tensor]] = state["slots"]
        slot = self._slot(model, slots)
        weights = update.kind == "weights"
        for name, w in model.items():
            store_delta(slot[name], w, update.tensors[name], weights=weights)
        slots.append(slot)
        if len(slots) < self.buffer_size:
            return None
        return self._apply_slots(model, slots, self.max_outliers)

    def flush(self, model: ModelState, state: PolicyState) -> ModelState | None:
        """The end of the run: aggregate the n < K buffered deltas as a buffer of n would be (the
        median of n; the trimmed mean cutting ``floor(beta n)`` at each end); None when empty."""
        slots: list[dict[str, torch.Tensor]] = state["slots"]
        if not slots:
            return None
        return self._apply_slots(model, slots, self._outliers(len(slots)))

    def _apply_slots(self, model: ModelState, slots: list[dict[str, torch.Tensor]],
                     trim: int) -> ModelState:
        for name, w in model.items():
            self._apply(w, [s[name] for s in slots], trim)
        self._spare = slots[:]
        slots.clear()
        return model

    def _outliers(self, k: int) -> int:
        """``max_outliers`` for a buffer of ``k``."""
        raise NotImplementedError

    def _apply(self, w: torch.Tensor, values: list[torch.Tensor], trim: int) -> None:
        if not mixable(w):
            # Sum the increments into the first slot (a buffer copy the policy owns), then apply.
            acc = values[0]
            for v in values[1:]:
                buffer_discrete(acc, v, first=False)
            take_discrete(w, acc)
            return
        k = len(values)
        flat = [v.reshape(-1) for v in values]
        n = flat[0].numel()
        wf = w.view(-1) if w.is_contiguous() else None
        agg_full = None if wf is not None else torch.empty(n, dtype=w.dtype)  # rare: strided model
        for s, e in blocks(n, _BLOCK):
            rows = self._ws.take("rows", w.dtype, k * (e - s)).view(k, e - s)
            for i, f in enumerate(flat):
                rows[i].copy_(f[s:e])
            sort_columns(rows, self._ws)
            agg = self._aggregate(rows, self._ws.take("agg", w.dtype, e - s), trim)
            if agg_full is not None:
                agg_full[s:e].copy_(agg)
            else:
                assert wf is not None
                self._update(wf[s:e], agg)
        if agg_full is not None:
            self._update(w, agg_full.view(w.shape))

    def _update(self, w: torch.Tensor, agg: torch.Tensor) -> None:
        axpy(w, agg, self.lr, self._ws)

    def _aggregate(self, ordered: torch.Tensor, out: torch.Tensor, trim: int) -> torch.Tensor:
        raise NotImplementedError


def sort_columns(rows: torch.Tensor, ws: Workspace) -> None:
    """Sort each column of ``rows`` (K x n) ascending, in place.

    Up to 32 rows: an odd-even transposition network of ``fmin``/``fmax`` compare-exchanges
    (whole-row element-wise ops, several times faster than ``torch.sort`` over a short strided
    dimension, and no index tensor). A NaN meeting a value is replaced by a copy of it, so NaNs can
    only ever become copies of other inputs: the number of hostile values never grows. Beyond 32
    rows, ``torch.msort`` (NaN sorted last), whose result is copied back.
    """
    k = rows.shape[0]
    if k > 32:
        rows.copy_(torch.msort(rows))
        return
    tmp = ws.take("swap", rows.dtype, rows.shape[1])
    for rnd in range(k):
        for j in range(rnd % 2, k - 1, 2):
            a, b = rows[j], rows[j + 1]
            tmp.copy_(a)
            torch.fmin(a, b, out=a)
            torch.fmax(tmp, b, out=b)


class Median(_Buffered):
    """Coordinate-wise median of K buffered deltas (the midpoint of the middle two for even K)."""

    name: ClassVar[str] = "median"

    def __init__(self, buffer_size: int = 5, lr: float = 1.0) -> None:
        super().__init__(buffer_size, lr)

    def __repr__(self) -> str:
        return f"Median(buffer_size={self.buffer_size}, lr={self.lr})"

    @property
    def max_outliers(self) -> int:
        return self._outliers(self.buffer_size)

    def _outliers(self, k: int) -> int:
        return (k - 1) // 2

    def _aggregate(self, ordered: torch.Tensor, out: torch.Tensor, trim: int) -> torch.Tensor:
        k = ordered.shape[0]
        if k % 2:
            return ordered[k // 2]
        return out.copy_(ordered[k // 2 - 1]).lerp_(ordered[k // 2], 0.5)


class TrimmedMean(_Buffered):
    """Coordinate-wise beta-trimmed mean of K buffered deltas (floor(beta K) cut at each end)."""

    name: ClassVar[str] = "trimmed_mean"

    def __init__(self, buffer_size: int = 5, beta: float = 0.2, lr: float = 1.0) -> None:
        if not 0.0 <= beta < 0.5:
            raise ConfigError(f"trimmed_mean: beta must be in [0, 0.5), got {beta}")
        super().__init__(buffer_size, lr)
        self.beta = beta

    def __repr__(self) -> str:
        return f"TrimmedMean(buffer_size={self.buffer_size}, beta={self.beta}, lr={self.lr})"

    @property
    def max_outliers(self) -> int:
        return self._outliers(self.buffer_size)

    def _outliers(self, k: int) -> int:
        return math.floor(self.beta * k)

    def _aggregate(self, ordered: torch.Tensor, out: torch.Tensor, trim: int) -> torch.Tensor:
        k, t = ordered.shape[0], trim
        out.copy_(ordered[t])
        for j, row in enumerate(ordered[t + 1 : k - t], start=2):
            out.lerp_(row, 1.0 / j)
        return out
