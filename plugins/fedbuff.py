"""FedBuff: buffer K staleness-weighted deltas, then ``w <- w + eta_g * sum / K``.

Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, *Federated Learning with Buffered Asynchronous
Aggregation*, AISTATS 2022 (arXiv 2106.06639), algorithm 1: the server adds ``s(tau) d`` to a buffer
for each result, and after ``K`` results applies ``w <- w + eta_g * buffer / K`` and empties it.
The paper's default staleness weight is ``1 / sqrt(1 + tau)``, i.e. polynomial with ``a = 0.5``.

Full weights become a delta against the current model (which does not change while the buffer
fills; the difference goes into one reused scratch the size of a tensor), so no base is needed.
Integer tensors sum the buffered increments and bool tensors keep the last buffered value (the
policy contract's rule, :mod:`vcasync.policy`); both are applied with the rest at the flush, and not
scaled: a counter counts every merged step. Until then the model is untouched (``merge`` returns
None). The buffer is allocated once (``init_state``) and reused. At the end of the run the
coordinator calls ``flush``: a partial buffer of n results is applied as a buffer of n would be.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from vcasync.errors import ConfigError
from vcasync.policy import PolicyState
from vcasync.tensors import ModelState, Update

from ._bounds import MAX_BUFFER, at_most
from ._kernels import (
    Workspace,
    accumulate_delta,
    axpy,
    buffer_discrete,
    check_update,
    fused,
    mixable,
    take_discrete,
)
from ._staleness import StalenessKind, StalenessWeight

__all__ = ["FedBuff"]

_NEVER_FILLS = "a buffer no run fills leaves the model unchanged until the run's end"


class FedBuff:
    """FedBuff: sum K results' deltas weighted by s(staleness), then apply server_lr * sum / K.

    Parameters: ``buffer_size`` (K), ``server_lr`` (eta_g), ``staleness`` with ``a`` and ``b``.
    """

    name: ClassVar[str] = "fedbuff"
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "staleness_monotone"})

    def __init__(self, buffer_size: int = 10, server_lr: float = 1.0,
                 staleness: StalenessKind = "polynomial", a: float = 0.5, b: int = 4) -> None:
        if buffer_size < 1:
            raise ConfigError(f"fedbuff: buffer_size must be >= 1, got {buffer_size}")
        at_most("fedbuff", "buffer_size", buffer_size, MAX_BUFFER, _NEVER_FILLS)
        if not 0.0 < server_lr < float("inf"):
            raise ConfigError(f"fedbuff: server_lr must be positive and finite, got {server_lr}")
        self.buffer_size = buffer_size
        self.server_lr = server_lr
        self.staleness = StalenessWeight(staleness, a, b)
        self._ws = Workspace()

    def __repr__(self) -> str:
        return (f"FedBuff(buffer_size={self.buffer_size}, server_lr={self.server_lr}, "
                f"staleness={self.staleness})")

    def init_state(self, model: ModelState) -> PolicyState:
        return {
            "count": 0,
            "buffer": {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in model.items() if mixable(t)},
            "ints": {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in model.items()
                     if not mixable(t)},
        }

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState | None:
        check_update(model, update, needs_base=False)
        scale = self.staleness(update.staleness)
        weights = update.kind == "weights"
        first = int(state["count"]) == 0
        buffer, ints = state["buffer"], state["ints"]
        for name, w in model.items():
            x = update.tensors[name]
            if mixable(w):
                accumulate_delta(buffer[name], w, x, weights=weights, scale=scale, ws=self._ws)
            else:
                buffer_discrete(ints[name], x, first=first)
        state["count"] = int(state["count"]) + 1
        if state["count"] < self.buffer_size:
            return None
        return self._apply(model, state)

    def flush(self, model: ModelState, state: PolicyState) -> ModelState | None:
        """The end of the run: apply the n < K results buffered as a buffer of n would be
        (``w <- w + eta_g * sum / n``); None when the buffer is empty."""
        if int(state["count"]) == 0:
            return None
        return self._apply(model, state)

    def _apply(self, model: ModelState, state: PolicyState) -> ModelState:
        buffer, ints = state["buffer"], state["ints"]
        step = self.server_lr / int(state["count"])
        for name, w in model.items():
            if mixable(w):
                for ws_, bs in fused(w, buffer[name]):   # the buffer is cleared while in cache
                    axpy(ws_, bs, step, self._ws)
                    bs.zero_()
            else:
                take_discrete(w, ints[name])
        state["count"] = 0
        return model
