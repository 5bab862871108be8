"""Staleness functions ``s(tau)`` in (0, 1], non-increasing in the staleness ``tau`` (versions).

From FedAsync (Xie, Koyejo, Gupta 2019, arXiv 1903.03934, section 5.2), also used by FedBuff and
VC-ASGD here:

- ``constant``:   ``s(tau) = 1``
- ``polynomial``: ``s(tau) = (tau + 1) ** -a``
- ``hinge``:      ``s(tau) = 1 if tau <= b else 1 / (a (tau - b) + 1)``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vcasync.errors import ConfigError

from ._bounds import MAX_VERSIONS, shown

__all__ = ["StalenessKind", "StalenessWeight"]

StalenessKind = Literal["constant", "polynomial", "hinge"]


@dataclass(frozen=True, slots=True)
class StalenessWeight:
    """A validated staleness function; call it with ``tau`` to get the weight."""

    kind: StalenessKind = "constant"
    a: float = 0.5
    b: int = 4

    def __post_init__(self) -> None:
        if self.kind not in ("constant", "polynomial", "hinge"):
            raise ConfigError(f"staleness must be 'constant', 'polynomial' or 'hinge', "
                             f"got {self.kind!r}")
        if not self.a >= 0.0 or self.a == float("inf"):
            raise ConfigError(f"staleness parameter a must be finite and >= 0, got {self.a}")
        if self.b < 0:
            raise ConfigError(f"staleness parameter b must be >= 0, got {self.b}")
        if self.b > MAX_VERSIONS:
            raise ConfigError(f"staleness parameter b must be at most {MAX_VERSIONS:,}, got "
                              f"{shown(self.b)} (2**40 versions: a cut-off no run reaches)")

    def __call__(self, tau: int) -> float:
        tau = max(int(tau), 0)
        if self.kind == "polynomial":
            return float((tau + 1.0) ** -self.a)
        if self.kind == "hinge":
            return 1.0 if tau <= self.b else 1.0 / (self.a * (tau - self.b) + 1.0)
        return 1.0
