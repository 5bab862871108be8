"""The model side of the coordinator: the working model, the policy and its state, the versions.

The policy merges into a private *working* model (in a worker thread); a merge that changed it is
published as an immutable :class:`~vcasync.coordinator._versions.Version` that downloads and delta bases read
while the next merge runs. If the policy raises, the working model is restored from the current
published version, so a refused or broken merge leaves no trace in the model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Container

import torch

from .._aio import to_thread_released
from ..errors import (
    PolicyError,
    SpecMismatchError,
    UpdateRejectedError,
    ValidationError,
    VersionNotFoundError,
)
from ..policy import MergePolicy, PolicyState
from ..tensors import ModelSpec, ModelState, Update
from ..wire import aencode_payload, pack_tree
from ._counters import CounterBases
from ._versions import Version, VersionStore, copy_tensors

__all__ = ["ModelOwner"]

log = logging.getLogger("vcasync.coordinator")


class ModelOwner:
    """Only the merge loop calls :meth:`merge`, :meth:`retain`, :meth:`jump` and :meth:`pack_state`."""

    def __init__(self, policy: MergePolicy, model: ModelState, *, max_retained_bytes: int | None,
                 policy_state: PolicyState | None = None) -> None:
        self.policy = policy
        self.needs_base = bool(getattr(policy, "needs_base", False))
        self.spec: ModelSpec = model.spec
        self._working = ModelState(copy_tensors(model.tensors, None), model.version)
        self.state: PolicyState = (policy.init_state(self._working) if policy_state is None
                                   else policy_state)
        self.versions = VersionStore(self._working, max_bytes=max_retained_bytes)
        #: Integer tensors per version, to turn full-weights results into increments (the policy
        #: contract); kept for the staleness window whatever the versions' byte budget drops.
        self.counters = CounterBases(self._working)

    @property
    def version(self) -> int:
        return self.versions.current.number

    def switch_policy(self, policy: MergePolicy) -> None:
        """Start-up only, before anything is served: merge with ``policy`` from here on, starting
        from its fresh state on the current model (the old policy's state would not fit it)."""
        self.policy = policy
        self.needs_base = bool(getattr(policy, "needs_base", False))
        self.state = policy.init_state(self._working)

    # -- merge loop only --------------------------------------------------------------------------
    async def merge(self, update: Update) -> bool:
        """Merge one update; True when a new version was published. Refusals raise unchanged."""
        current = self.version
        buffer = self.versions.take_buffer()
        published = await to_thread_released(self._merge_sync, update, buffer, current)
        if published is None:
            if buffer is not None:
                self.versions.give_back(buffer)
            return False
        self.versions.publish(published)
        self.counters.record(published)
        return True

    def _merge_sync(self, update: Update, buffer: dict[str, torch.Tensor] | None,
                    current: int) -> ModelState | None:
        working = self._working
        try:
            out = self.policy.merge(working, update, self.state)
            if out is not None:
                # in place too: a policy may have put a tensor of another dtype or shape into the
                # model's dict, and that must never be published
                self.spec.check(out.tensors)
                if out is not working:
                    copy_tensors(out.tensors, working.tensors)
        except Exception as exc:
            self._restore_working()
            if isinstance(exc, SpecMismatchError):
                log.error("merge policy %s changed the model's %s: refused, the model is as it was",
                          self.policy.name, exc)
                raise PolicyError(f"merge policy {self.policy.name!r} broke the model's spec: "
                                  f"{exc}"[:300]) from exc
            if isinstance(exc, UpdateRejectedError | ValidationError):
                raise
            log.exception("merge policy %s failed on unit %s", self.policy.name, update.unit_id)
            raise PolicyError(f"merge policy {self.policy.name!r} failed: {exc!r}"[:300]) from exc
        if out is None:
            return None
        working.version = current + 1
        return ModelState(copy_tensors(working.tensors, buffer), current + 1)

    def _restore_working(self) -> None:
        """The working copy back to the current version: values, and the tensor objects too when
        a policy replaced, added or dropped some (a merge must change nothing when it fails)."""
        current, work = self.versions.current.model.tensors, self._working.tensors
        for name in [n for n in work if n not in current]:
            del work[name]
        with torch.no_grad():
            for name, t in current.items():
                mine = work.get(name)
                if mine is None or mine.dtype != t.dtype or mine.shape != t.shape:
                    work[name] = t.detach().clone()
                else:
                    mine.copy_(t)
        if list(work) != list(current):         # the model's order, too
            ordered = {name: work[name] for name in current}
            work.clear()
            work.update(ordered)

    def adopt(self, model: ModelState) -> None:
        """An older version, held again (start-up only): a base open leases' results need."""
        self.versions.adopt(model)
        self.counters.adopt(model)

    def jump(self, version: int) -> None:
        """Publish the current tensors again under a higher number (snapshot-mode recovery)."""
        self._working.version = version
        published = ModelState(copy_tensors(self._working.tensors, None), version)
        self.versions.publish(published)
        self.counters.record(published)

    def retain(self, max_staleness: int, bases: Container[int]) -> None:
        """Keep, within the staleness window, the versions ``bases`` holds (besides the current
        one): the bases of results that may still come (policies that apply a delta to its base),
        or of open leases (downloads). Others go, and their buffers are recycled."""
        floor = self.version - max_staleness
        self.counters.retain(floor)
        self.versions.retain(lambda n: n >= floor and n in bases)

    async def pack_state(self) -> bytes:
        return await asyncio.to_thread(pack_tree, dict(self.state))

    # -- anyone ------------------------------------------------------------------------------------
    def hold(self, number: int) -> Version | None:
        return self.versions.acquire(number)

    def release(self, version: Version) -> None:
        self.versions.release(version)

    def _require(self, number: int) -> None:
        if self.versions.get(number) is None:
            raise VersionNotFoundError(f"model version {number} is not held (current: "
                                       f"{self.version}); fetch the latest", version=number)

    def copy(self, number: int | None = None) -> ModelState:
        number = self.version if number is None else number
        self._require(number)
        v = self.versions.get(number)
        assert v is not None
        return v.model.clone()

    def payload(self, number: int, codec: str, count: Callable[[int], None]) -> AsyncIterator[bytes]:
        """The wire payload of a held version; raises now when it is not held."""
        self._require(number)
        return self._stream(number, codec, count)

    async def _stream(self, number: int, codec: str,
                      count: Callable[[int], None]) -> AsyncIterator[bytes]:
        v = self.versions.acquire(number)
        if v is None:
            raise VersionNotFoundError(f"model version {number} was dropped", version=number)
        try:
            meta = {"version": number, "digest": await v.digest()}
            async for chunk in aencode_payload("model", meta, v.model.tensors, codec=codec):
                count(len(chunk))
                yield chunk
        finally:
            self.versions.release(v)

    def etag(self, run_id: str, number: int) -> str:
        self._require(number)
        return f"{run_id}-{number}"
