"""The merge-policy contract and its registry.

A policy is a small class around pure tensor functions::

    init_state(model) -> state                      # tensors and scalars; checkpointed via the wire
    merge(model, update, state) -> model | None     # None keeps the model (e.g. a buffer is filling)

Same inputs, same output, bit for bit. ``merge`` may update ``model``'s tensors in place and return it
(the coordinator owns the model and copies what it must keep); it never mutates ``update``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

from .tensors import ModelState, Update

__all__ = ["MergePolicy", "PolicyState"]

#: Policy state: names -> tensors, ints, floats, bools, strings, None, or lists/dicts of those.
PolicyState = dict[str, Any]


@runtime_checkable
class MergePolicy(Protocol):
    """What the coordinator needs from a merge policy."""

    name: ClassVar[str]

    def init_state(self, model: ModelState) -> PolicyState: ...

    def merge(self, model: ModelState, update: Update,
              state: PolicyState) -> ModelState | None: ...
