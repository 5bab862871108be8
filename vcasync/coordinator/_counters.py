"""The integer tensors of recent versions, so a full-weights result's counters become increments.

The policy contract (:mod:`vcasync.policy`) has integer tensors travel as *increments*: the worker's
value minus the value of the version it trained from. A delta already carries them that way; a
full-weights result carries the worker's values, and the coordinator subtracts its base version's
values before the result is journaled and merged, so both upload modes give the same counters and
replay needs no base. The values are tiny (BatchNorm's ``num_batches_tracked`` is one int64 per
layer), so they are kept here per version for the staleness window, apart from the published
versions, whose byte budget may drop a version a lease is still based on. A tensor unchanged since
the previous version is shared, not copied.

An increment is refused when it is below zero (:meth:`CounterBases.first_negative`) or when adding
it would take a counter past its dtype's maximum (:meth:`CounterBases.first_overflow`): integer
addition wraps, so a hostile worker could otherwise set a counter to any value with increments
that are all positive. The overflow check counts what the model holds plus the increments of
results a buffering policy merged but has not applied yet (:meth:`CounterBases.hold`), so the
flush cannot wrap either. Both checks read only what the merge loop wrote, in journal order, so
replay decides the same.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..tensors import ModelState, is_counter
from ._by_version import ByVersion

__all__ = ["CounterBases"]


class CounterBases:
    """Integer tensors by version number: :meth:`record` each published version, :meth:`retain`
    the window, :meth:`to_increments` a full-weights result."""

    def __init__(self, model: ModelState) -> None:
        self._bases = ByVersion((n for n, t in model.items() if is_counter(t)), model)
        self._names = self._bases.names
        #: The newest version's counters plus the increments merged since and held by the policy:
        #: the value each counter reaches once they are applied (what an increment must not wrap).
        self._reach: dict[str, torch.Tensor] = {}
        self.record(model)

    @property
    def empty(self) -> bool:
        """True when the model has no integer tensors (then nothing needs converting)."""
        return not self._names

    def record(self, model: ModelState) -> None:
        """Keep the integer tensors of a newly published version (copies; shared when unchanged)."""
        if self._names:
            # replaced, never changed in place: shared with the version
            self._reach = dict(self._bases.record(model))

    def adopt(self, model: ModelState) -> None:
        """Keep the integer tensors of an older version read back at a restart."""
        if self._names:
            self._bases.adopt(model)

    def retain(self, floor: int) -> None:
        """Forget versions below ``floor`` (the newest is always kept)."""
        self._bases.retain(floor)

    def to_increments(self, tensors: Mapping[str, torch.Tensor], base_version: int) -> bool:
        """Turn the integer tensors of a full-weights result into increments over ``base_version``,
        in place; False (and nothing changed) when that version's counters are no longer held."""
        if not self._names:
            return True
        base = self._bases.get(base_version)
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

    def first_overflow(self, tensors: Mapping[str, torch.Tensor]) -> tuple[str, int, int] | None:
        """The first integer tensor of an update (its increments, none below zero) that would
        take the model's counter past its dtype's maximum, as (name, the counter's value, the
        increment) of its first such element; None when every sum fits."""
        for name in self._names:
            inc, reach = tensors[name], self._reach[name]
            if inc.numel() == 1:          # the common case (num_batches_tracked): plain ints, ~10x faster
                value, step = int(reach), int(inc)
                if value > torch.iinfo(inc.dtype).max - step:
                    return name, value, step
                continue
            if not inc.numel():
                continue
            # reach + inc > max  <=>  reach > max - inc: no wrap for inc >= 0 (checked before)
            room = inc.neg().add_(torch.iinfo(inc.dtype).max)
            over = reach > room
            if bool(over.any()):
                at = int(over.reshape(-1).nonzero()[0])
                return name, int(reach.reshape(-1)[at]), int(inc.reshape(-1)[at])
        return None

    def hold(self, increments: Mapping[str, torch.Tensor]) -> None:
        """A merged result the policy holds without applying it yet (a buffer): its increments
        count toward what the counters reach (until the next :meth:`record`). The sums are new
        tensors: nothing of ``increments`` is kept (they go back to the buffer pool)."""
        self._reach = {name: torch.add(self._reach[name], increments[name]) for name in self._names}

    def legacy_increments(self, tensors: Mapping[str, torch.Tensor], model: ModelState) -> None:
        """A full-weights journal entry written before counters were increments: its integers are
        values that policies then merged by element-wise maximum. ``max(value - model, 0)`` added to
        the model gives that same maximum, so such an entry replays to the counters it had."""
        for name in self._names:
            tensors[name].sub_(model[name]).clamp_(min=0)
