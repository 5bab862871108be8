"""A few named small tensors of recent versions, kept apart from the published versions.

Counters (:mod:`._counters`) and running statistics (:mod:`._statistics`) both turn a result into
what it means against its base version (an increment, a value), so both need that version's
tensors of a few names. The published versions' byte budget may drop a version a lease is still
based on, and these tensors are tiny (BatchNorm's are one int64 and two floats a channel per
layer), so they are kept here per version for the staleness window. A tensor unchanged since the
previous version is shared, not copied.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..tensors import ModelState

__all__ = ["ByVersion"]

Tensors = dict[str, torch.Tensor]


class ByVersion:
    """The tensors ``names`` of ``model`` (in its order) by version: :meth:`record` each published
    version, :meth:`adopt` one read back at a restart, :meth:`retain` the window."""

    def __init__(self, names: Iterable[str], model: ModelState) -> None:
        wanted = frozenset(names)
        self.names = [n for n in model if n in wanted]
        self._by_version: dict[int, Tensors] = {}

    def get(self, version: int) -> Tensors | None:
        """The tensors of ``version``, or None when it is not held (never change them)."""
        return self._by_version.get(version)

    def newest(self) -> Tensors:
        """The tensors of the newest version recorded."""
        return self._by_version[max(self._by_version)]

    def record(self, model: ModelState) -> Tensors:
        """Keep the tensors of a newly published version (copies; shared when unchanged); returns
        them."""
        prev = self._by_version[max(self._by_version)] if self._by_version else {}
        kept: Tensors = {}
        for name in self.names:
            t, old = model[name], prev.get(name)
            kept[name] = old if old is not None and torch.equal(old, t) else t.detach().clone()
        self._by_version[model.version] = kept
        return kept

    def adopt(self, model: ModelState) -> None:
        """Keep the tensors of an older version read back at a restart."""
        if model.version not in self._by_version:
            self._by_version[model.version] = {n: model[n].detach().clone() for n in self.names}

    def retain(self, floor: int) -> None:
        """Forget versions below ``floor`` (the newest is always kept)."""
        newest = max(self._by_version, default=None)
        for number in [n for n in self._by_version if n < floor and n != newest]:
            del self._by_version[number]
