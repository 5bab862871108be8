"""``damped``: move the model towards each result by ``rate / (1 + staleness)``.

A complete third-party vcasync merge policy. It imports only vcasync's public API, keeps no state
outside ``state`` (so a restarted coordinator replays it exactly), changes nothing it is given but
the model, and follows the contract's rule for integer and bool tensors.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from vcasync import ConfigError, ModelState, Update

__all__ = ["Damped"]


class Damped:
    """Staleness-damped mixing: w <- w + rate / (1 + staleness) * (w_c - w)."""

    name: ClassVar[str] = "damped"
    needs_base: ClassVar[bool] = True          # a delta is turned into weights with update.base
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "convex", "staleness_monotone"})

    def __init__(self, rate: float = 0.5) -> None:
        if not 0.0 < rate <= 1.0:
            raise ConfigError(f"damped: rate must be in (0, 1], got {rate}")
        self.rate = rate

    def init_state(self, model: ModelState) -> dict[str, int]:
        return {}

    def merge(self, model: ModelState, update: Update, state: dict[str, int]) -> ModelState:
        weight = self.rate / (1.0 + max(0, update.staleness))
        for name, w in model.items():
            x = update.tensors[name]
            if w.dtype == torch.bool:
                w.copy_(x)                       # flags: the worker's value
            elif not w.is_floating_point():
                w.add_(x)                        # counters: add the increment, unweighted
            elif update.kind == "weights":
                w.lerp_(x.to(w.dtype), weight)
            else:                                # w_c = base + delta, without a temporary
                assert update.base is not None
                w.lerp_(update.base[name], weight).add_(x.to(w.dtype), alpha=weight)
        return model
