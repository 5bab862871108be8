"""The integer tensors of recent versions, so a full-weights result's counters become increments.

The policy contract (:mod:`vcasync.policy`) has integer tensors travel as *increments*: the worker's
value minus the value of the version it trained from. A delta already carries them that way; a
full-weights result carries the worker's values, and the coordinator subtracts its base version's
values before the result is journaled and merged, so both upload modes give the same counters and
replay needs no base. The values are tiny (BatchNorm's ``num_batches_tracked`` is one int64 per
layer), so they are kept here per version for the staleness window, apart from the published
versions, whose byte budget may drop a version a lease is still based on. A tensor unchanged since
the previous version is shared, not copied.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..tensors import ModelState, is_counter

__all__ = ["CounterBases"]


class CounterBases:
    """Integer tensors by version number: :meth:`record` each published version, :meth:`retain`
    the window, :meth:`to_increments` a full-weights result."""

    def __init__(self, model: ModelState) -> None:
        self._names = [n for n, t in model.items() if is_counter(t)]
        self._by_version: dict[int, dict[str, torch.Tensor]] = {}
        self.record(model)

    @property
    def empty(self) -> bool:
        """True when the model has no integer tensors (then nothing needs converting)."""
        return not self._names

    def versions(self) -> list[int]:
        return sorted(self._by_version)

    def record(self, model: ModelState) -> None:
        """Keep the integer tensors of a newly published version (copies; shared when unchanged)."""
        if not self._names:
            return
        prev = self._by_version[max(self._by_version)] if self._by_version else {}
        kept: dict[str, torch.Tensor] = {}
        for name in self._names:
            t, old = model[name], prev.get(name)
            kept[name] = old if old is not None and torch.equal(old, t) else t.detach().clone()
        self._by_version[model.version] = kept

    def adopt(self, model: ModelState) -> None:
        """Keep the integer tensors of an older version read back at a restart."""
        if self._names and model.version not in self._by_version:
            self._by_version[model.version] = {n: model[n].detach().clone() for n in self._names}

    def retain(self, floor: int) -> None:
        """Forget versions below ``floor`` (the newest is always kept)."""
        newest = max(self._by_version, default=None)
        for number in [n for n in self._by_version if n < floor and n != newest]:
            del self._by_version[number]

    def to_increments(self, tensors: Mapping[str, torch.Tensor], base_version: int) -> bool:
        """Turn the integer tensors of a full-weights result into increments over ``base_version``,
        in place; False (and nothing changed) when that version's counters are no longer held."""
        if not self._names:
            return True
        base = self._by_version.get(base_version)
        if base is None:
            return False
        for name in self._names:
            tensors[name].sub_(base[name])
        return True

    def first_negative(self, tensors: Mapping[str, torch.Tensor]) -> str | None:
        """The first integer tensor of an update (its increments) with an element below zero:
        counters count, so a negative increment is a broken or hostile worker's (one result set
        ``num_batches_tracked`` to -10**15 before this was checked)."""
        for name in self._names:
            t = tensors[name]
            if t.numel() and bool((t < 0).any()):
                return name
        return None

    def legacy_increments(self, tensors: Mapping[str, torch.Tensor], model: ModelState) -> None:
        """A full-weights journal entry written before counters were increments: its integers are
        values that policies then merged by element-wise maximum. ``max(value - model, 0)`` added to
        the model gives that same maximum, so such an entry replays to the counters it had."""
        for name in self._names:
            tensors[name].sub_(model[name]).clamp_(min=0)
