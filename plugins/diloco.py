"""DiLoCo outer step: Nesterov momentum SGD on pseudo-gradients, per result or buffered.

Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen, *DiLoCo: Distributed
Low-Communication Training of Language Models*, 2023 (arXiv 2311.08105), and Jaghouar, Ong, Hagemann,
*OpenDiLoCo*, 2024 (arXiv 2407.07852). The pseudo-gradient of a result is ``g = -d`` (``d = w_c -
w_base``), or the mean over a buffer of ``K`` results; the outer optimiser is SGD with Nesterov
momentum::

    m <- mu m + g
    w <- w - lr (g + mu m)          (plain momentum: w <- w - lr m)

with the published ``lr = 0.7``, ``mu = 0.9`` (inner steps H = 500 AdamW are the worker's business)
for an outer step on a buffer of results. Per result (``buffer_size`` 1, the default) an outer step
meant for the mean of a round, taken by each asynchronous result, made every result count about
``lr / (1 - mu) = 7`` times, and the default run diverged (10 % on digits, since 2026-12-08 no
longer): there ``momentum`` left unset is 0 and, with it unset, ``staleness`` left unset is
``"polynomial"``, a rate of ``lr / (1 + tau)`` for a result ``tau`` versions stale (about ``lr``
over the fleet's round); with a buffer they are 0.9 and ``"constant"`` (the paper's step), and a
momentum given keeps the constant rate, as before. ``staleness`` weighs only per-result steps.
The state keeps the momentum of the deltas, ``v = -m`` (key ``velocity``), so that one pass
updates it: ``v <- mu v + d``, ``w <- w + lr (d + mu v)`` (plain: ``w <- w + lr v``). A
state written before (key ``momentum``) is converted on its first merge. Full weights become a
delta against the current model, computed span by span into one reused scratch (``x - w`` first,
so small deltas of large weights stay exact). Integer tensors add their increments (summed over
a buffer) and bool tensors take the last value, applied with the outer step (the policy
contract's rule). The velocity (and the buffer when ``buffer_size > 1``) is allocated once in
``init_state`` and updated in place. At the end of the run the coordinator calls ``flush``: a
buffer short of K results takes its outer step on the mean of those it holds.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from vcasync.errors import ConfigError
from vcasync.policy import PolicyState
from vcasync.tensors import ModelState, Update

from ._bounds import MAX_BUFFER, at_most
from ._kernels import (
    Workspace,
    axpy,
    buffer_discrete,
    check_update,
    decay_add,
    delta_of,
    fused,
    lerp_delta,
    mixable,
    take_discrete,
)

__all__ = ["DiLoCo"]

PerResult = Literal["constant", "polynomial"]


class DiLoCo:
    """DiLoCo outer step: Nesterov SGD (lr 0.7) on -delta, per result or per K results.

    Parameters: ``lr``, ``momentum`` (unset: 0.9 with a buffer, 0 per result), ``nesterov``,
    ``buffer_size`` (1: every result is an outer step; K: the mean delta of K results is),
    ``staleness`` (per result: ``"polynomial"``, the rate ``lr / (1 + tau)``, or ``"constant"``;
    unset: polynomial when ``buffer_size`` is 1 and ``momentum`` unset, else constant).
    """

    name: ClassVar[str] = "diloco"
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset({"identity"})

    def __init__(self, lr: float = 0.7, momentum: float | None = None, nesterov: bool = True,
                 buffer_size: int = 1, staleness: PerResult | None = None) -> None:
        if staleness is None:  # damped only where every default is taken: given ones act as before
            staleness = "polynomial" if buffer_size == 1 and momentum is None else "constant"
        if momentum is None:
            momentum = _default_momentum(buffer_size)
        if staleness not in ("constant", "polynomial"):
            raise ConfigError(f"diloco: staleness must be 'constant' or 'polynomial', got {staleness!r}")
        if staleness != "constant" and buffer_size > 1:
            raise ConfigError("diloco: staleness 'polynomial' weighs per-result steps: it needs "
                              f"buffer_size 1, got {buffer_size}")
        if not 0.0 < lr < float("inf"):
            raise ConfigError(f"diloco: lr must be positive and finite, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"diloco: momentum must be in [0, 1), got {momentum}")
        if buffer_size < 1:
            raise ConfigError(f"diloco: buffer_size must be >= 1, got {buffer_size}")
        at_most("diloco", "buffer_size", buffer_size, MAX_BUFFER,
                "a buffer no run fills leaves the model unchanged until the run's end")
        self.lr = lr
        self.momentum = momentum
        self.nesterov = nesterov
        self.buffer_size = buffer_size
        self.staleness = staleness
        self._ws = Workspace()

    def __repr__(self) -> str:
        return (f"DiLoCo(lr={self.lr}, momentum={self.momentum}, nesterov={self.nesterov}, "
                f"buffer_size={self.buffer_size}, staleness={self.staleness!r})")

    def init_state(self, model: ModelState) -> PolicyState:
        floats = [(n, t) for n, t in model.items() if mixable(t)]
        state: PolicyState = {
            "count": 0,
            "velocity": {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in floats},
            "ints": {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in model.items()
                     if not mixable(t)},
        }
        if self.buffer_size > 1:
            state["buffer"] = {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in floats}
        return state

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState | None:
        check_update(model, update, needs_base=False)
        _upgrade(state)
        weights = update.kind == "weights"
        count = int(state["count"]) + 1
        ints = state["ints"]
        if self.buffer_size > 1:
            for name, w in model.items():
                x = update.tensors[name]
                if mixable(w):
                    lerp_delta(state["buffer"][name], w, x, weights=weights, ratio=1.0 / count,
                               ws=self._ws)
                else:
                    buffer_discrete(ints[name], x, first=count == 1)
            if count < self.buffer_size:
                state["count"] = count
                return None
            self._apply_buffer(model, state)
        else:
            lr = self.lr
            if self.staleness == "polynomial":
                lr /= 1.0 + max(0, int(update.staleness))
            for name, w in model.items():
                x = update.tensors[name]
                if mixable(w):
                    self._outer_step(w, state["velocity"][name], x, weights, lr)
                else:
                    take_discrete(w, x)
        state["count"] = 0
        return model

    def flush(self, model: ModelState, state: PolicyState) -> ModelState | None:
        """The end of the run: one outer step on the mean delta of the n < K results buffered
        (as a buffer of n would take it); None when nothing is buffered (or ``buffer_size`` 1)."""
        if self.buffer_size <= 1 or int(state["count"]) == 0:
            return None
        _upgrade(state)
        self._apply_buffer(model, state)
        state["count"] = 0
        return model

    def _apply_buffer(self, model: ModelState, state: PolicyState) -> None:
        for name, w in model.items():
            if mixable(w):
                self._outer_step(w, state["velocity"][name], state["buffer"][name], False, self.lr)
                state["buffer"][name].zero_()
            else:
                take_discrete(w, state["ints"][name])

    def _outer_step(self, w: torch.Tensor, v: torch.Tensor, x: torch.Tensor, weights: bool,
                    lr: float) -> None:
        """``d = x - w`` (full weights) or ``x``; ``v <- mu v + d``; ``w <- w + lr (d + mu v)``.

        Span by span (``fused``): the passes read w, v and x from memory once.
        """
        mu, ws = self.momentum, self._ws
        for ws_, vs, xs in fused(w, v, x):
            d = delta_of(xs, ws_, ws) if weights else xs  # scratch, before w changes
            decay_add(vs, d, mu)
            if self.nesterov:
                axpy(ws_, d, lr, ws)
                axpy(ws_, vs, lr * mu, ws)
            else:
                axpy(ws_, vs, lr, ws)


def _default_momentum(buffer_size: int) -> float:
    """0.9 (the paper's) for an outer step on a buffer's mean; 0 when every result is one."""
    return 0.9 if buffer_size > 1 else 0.0


def _upgrade(state: PolicyState) -> None:
    """Convert a state that kept ``m`` (key ``momentum``) to ``v = -m`` (key ``velocity``)."""
    old = state.pop("momentum", None)
    if old is not None:
        state["velocity"] = {n: t.neg_() for n, t in old.items()}
