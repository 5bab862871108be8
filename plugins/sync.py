"""Synchronous averaging: wait for N results, then average them weighted by samples (FedAvg).

McMahan, Moore, Ramage, Hampson, Aguera y Arcas, *Communication-Efficient Learning of Deep Networks
from Decentralized Data*, AISTATS 2017 (arXiv 1602.05629): the server's new model is the
sample-weighted mean of the round's results. This is the synchronous baseline the asynchronous
policies are measured against.

The round's mean delta is kept as a running, sample-weighted mean (``lerp_`` with weight
``n_k / N_k``), so N equal results average to exactly themselves and no sum can overflow. Results
with zero samples weigh nothing, unless no result of the round has samples; then all weigh the same.
Full weights become a delta against the current model (which does not change during a round),
computed into one reused scratch the size of a tensor.
Integer tensors add the sum of the round's increments at the end of the round, bool tensors take
the round's last value (the policy contract's rule, :mod:`vcasync.policy`). At the end of the run
the coordinator calls ``flush``: a round short of N results is averaged as it stands.
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
    buffer_discrete,
    check_update,
    fused,
    lerp_delta,
    mixable,
    take_discrete,
)

__all__ = ["SyncAverage"]


class SyncAverage:
    """Synchronous FedAvg baseline: after every buffer_size results, the sample-weighted mean."""

    name: ClassVar[str] = "sync"
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "convex"})

    def __init__(self, buffer_size: int = 4) -> None:
        if buffer_size < 1:
            raise ConfigError(f"sync: buffer_size must be >= 1, got {buffer_size}")
        at_most("sync", "buffer_size", buffer_size, MAX_BUFFER,
                "a round no run fills leaves the model unchanged until the run's end")
        self.buffer_size = buffer_size
        self._ws = Workspace()

    def __repr__(self) -> str:
        return f"SyncAverage(buffer_size={self.buffer_size})"

    def init_state(self, model: ModelState) -> PolicyState:
        return {
            "count": 0,
            "samples": 0,
            "mean": {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in model.items() if mixable(t)},
            "ints": {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in model.items()
                     if not mixable(t)},
        }

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState | None:
        check_update(model, update, needs_base=False)
        count = int(state["count"]) + 1
        total = int(state["samples"]) + update.samples
        ratio = update.samples / total if total > 0 else 1.0 / count
        weights = update.kind == "weights"
        mean, ints = state["mean"], state["ints"]
        for name, w in model.items():
            x = update.tensors[name]
            if mixable(w):
                lerp_delta(mean[name], w, x, weights=weights, ratio=ratio, ws=self._ws)
            else:
                buffer_discrete(ints[name], x, first=count == 1)
        state["count"], state["samples"] = count, total
        if count < self.buffer_size:
            return None
        return self._apply(model, state)

    def flush(self, model: ModelState, state: PolicyState) -> ModelState | None:
        """The end of the run: a round of n < N results is averaged as a round of n would be;
        None when the round is empty."""
        if int(state["count"]) == 0:
            return None
        return self._apply(model, state)

    def _apply(self, model: ModelState, state: PolicyState) -> ModelState:
        mean, ints = state["mean"], state["ints"]
        for name, w in model.items():
            if mixable(w):
                for ws_, ms in fused(w, mean[name]):   # the mean is cleared while in cache
                    ws_.add_(ms)
                    ms.zero_()
            else:
                take_discrete(w, ints[name])
        state["count"], state["samples"] = 0, 0
        return model
