"""VC-ASGD: merge each result the moment it arrives, ``w <- alpha w + (1 - alpha) w_c``.

Atre, Jha, Rao, *Distributed Deep Learning Using Volunteer Computing-Like Paradigm*, IPDPS Workshops
2021 (arXiv 2103.08894). The paper's body is not available to this project: the rule below is the
project's reading of it (see PAPER.md), kept configurable rather than claiming more fidelity.

``alpha`` is the weight kept on the server's copy. It is a constant, a schedule over training
progress (the number of results merged so far, against ``horizon``), and/or scaled by a function of
staleness ``tau`` so that stale results move the model less: the result's weight is
``(1 - alpha_t) * s(tau)``. A delta is turned into ``w_c = w_base + d`` with the base model the
coordinator kept (``needs_base``); full weights are used as they are. Integer tensors add the
worker's increment and bool tensors take its value, unweighted (the policy contract's rule: a
counter such as ``num_batches_tracked`` counts every step trained).

In place, two passes per tensor (``lerp_`` then ``add_``), no temporary: a merge costs about what
copying the model once or twice does.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from vcasync.errors import ConfigError
from vcasync.policy import PolicyState
from vcasync.tensors import ModelState, Update

from ._bounds import MAX_VERSIONS, at_most
from ._kernels import Workspace, check_update, mix_result
from ._staleness import StalenessKind, StalenessWeight

__all__ = ["VCASGD"]

Schedule = Literal["constant", "linear", "cosine"]


class VCASGD:
    """VC-ASGD: w <- alpha w + (1 - alpha) w_c; alpha constant, scheduled, or scaled by staleness.

    Parameters: ``alpha`` in [0, 1) (weight kept on the server copy); ``schedule`` moves it from
    ``alpha`` to ``alpha_end`` over ``horizon`` merged results (``linear`` or ``cosine``);
    ``staleness`` (``constant``, ``polynomial``, ``hinge`` with ``a``, ``b``) scales the result's
    weight ``1 - alpha`` by ``s(tau)``.
    """

    name: ClassVar[str] = "vcasgd"
    needs_base: ClassVar[bool] = True
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "convex", "staleness_monotone"})

    def __init__(self, alpha: float = 0.5, schedule: Schedule = "constant",
                 alpha_end: float | None = None, horizon: int = 0,
                 staleness: StalenessKind = "constant", a: float = 0.5, b: int = 4) -> None:
        for label, value in (("alpha", alpha), ("alpha_end", alpha_end)):
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"vcasgd: {label} must be in [0, 1), got {value}")
        if schedule not in ("constant", "linear", "cosine"):
            raise ConfigError(f"vcasgd: schedule must be constant, linear or cosine, got {schedule!r}")
        if schedule != "constant" and (alpha_end is None or horizon < 1):
            raise ConfigError(f"vcasgd: schedule {schedule!r} needs alpha_end and horizon >= 1")
        if horizon < 0:
            raise ConfigError(f"vcasgd: horizon must be >= 0, got {horizon}")
        at_most("vcasgd", "horizon", horizon, MAX_VERSIONS,
                "a schedule no run reaches the end of keeps alpha where it starts")
        self.alpha = alpha
        self.schedule: Schedule = schedule
        self.alpha_end = alpha if alpha_end is None else alpha_end
        self.horizon = horizon
        self.staleness = StalenessWeight(staleness, a, b)
        self._ws = Workspace()

    def __repr__(self) -> str:
        return (f"VCASGD(alpha={self.alpha}, schedule={self.schedule!r}, alpha_end={self.alpha_end}, "
                f"horizon={self.horizon}, staleness={self.staleness})")

    def alpha_at(self, merged: int) -> float:
        """The kept weight after ``merged`` results: the schedule over progress."""
        if self.schedule == "constant":
            return self.alpha
        p = min(1.0, merged / self.horizon)
        if self.schedule == "linear":
            return self.alpha + (self.alpha_end - self.alpha) * p
        return self.alpha_end + (self.alpha - self.alpha_end) * (1.0 + math.cos(math.pi * p)) / 2.0

    def result_weight(self, merged: int, staleness: int) -> float:
        """The weight ``(1 - alpha_t) s(tau)`` a result gets: in [0, 1], never larger when staler."""
        return (1.0 - self.alpha_at(merged)) * self.staleness(staleness)

    def init_state(self, model: ModelState) -> PolicyState:
        return {"merged": 0}

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState:
        check_update(model, update, needs_base=self.needs_base)
        weight = self.result_weight(int(state["merged"]), update.staleness)
        base = update.base if update.kind == "delta" else None
        for name, w in model.items():
            mix_result(w, update.tensors[name], None if base is None else base[name], weight,
                       self._ws)
        state["merged"] = int(state["merged"]) + 1
        return model
