"""FedAsync: ``w <- (1 - a s(tau)) w + a s(tau) w_c``, one result at a time.

Xie, Koyejo, Gupta, *Asynchronous Federated Optimization*, 2019 (arXiv 1903.03934), algorithm 1 with
the staleness functions of its section 5.2: constant, polynomial ``(tau + 1) ** -a`` and hinge
``1 if tau <= b else 1 / (a (tau - b) + 1)``.

A delta is turned into ``w_c = w_base + d`` with the base model the coordinator kept
(``needs_base``). Integer tensors add the worker's increment, bool tensors take its value
(the policy contract's rule). In place, no temporary.
"""

from __future__ import annotations

from typing import ClassVar

from vcasync.errors import ConfigError
from vcasync.policy import PolicyState
from vcasync.tensors import ModelState, Update

from ._kernels import Workspace, check_update, mix_result
from ._staleness import StalenessKind, StalenessWeight

__all__ = ["FedAsync"]


class FedAsync:
    """FedAsync: mix each result with weight alpha * s(staleness); s constant, polynomial or hinge.

    Parameters: ``alpha`` in (0, 1] (the paper's mixing hyperparameter), ``staleness`` and its
    ``a`` (exponent / slope) and ``b`` (hinge cut-off, in versions).
    """

    name: ClassVar[str] = "fedasync"
    needs_base: ClassVar[bool] = True
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "convex", "staleness_monotone"})

    def __init__(self, alpha: float = 0.6, staleness: StalenessKind = "polynomial", a: float = 0.5,
                 b: int = 4) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"fedasync: alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.staleness = StalenessWeight(staleness, a, b)
        self._ws = Workspace()

    def __repr__(self) -> str:
        return f"FedAsync(alpha={self.alpha}, staleness={self.staleness})"

    def result_weight(self, staleness: int) -> float:
        return self.alpha * self.staleness(staleness)

    def init_state(self, model: ModelState) -> PolicyState:
        return {}

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState:
        check_update(model, update, needs_base=self.needs_base)
        weight = self.result_weight(update.staleness)
        base = update.base if update.kind == "delta" else None
        for name, w in model.items():
            mix_result(w, update.tensors[name], None if base is None else base[name], weight,
                       self._ws)
        return model
