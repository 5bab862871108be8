"""Published model versions: immutable copies that downloads and delta bases read from.

The coordinator merges into a private *working* model; after each merge that changed it, the working
tensors are copied into a published :class:`Version` that nobody mutates again, so a download streams
a consistent version while the next merge runs. Old versions are dropped by the retention rule the
coordinator passes (staleness window, bases of open leases) and a byte budget, oldest first. Their
buffers are recycled (a copy into existing pages runs at memcpy speed; fresh pages fault at a
fraction of it), but only once no download still reads them: the coordinator's pool is shared with
the uploads, so a merged result's own set usually takes the next copy (see ``ModelOwner.merge``).

Index changes happen on the event loop; only the copies run in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import torch

from ..tensors import ModelState
from ._buffers import BufferPool

__all__ = ["Version", "VersionStore"]


class Version:
    """One published version. ``refs`` counts readers; ``digest`` is computed on first need."""

    __slots__ = ("_digest", "evicted", "model", "refs")

    def __init__(self, model: ModelState) -> None:
        self.model = model
        self.refs = 0
        self.evicted = False
        self._digest: str | None = None

    @property
    def number(self) -> int:
        return self.model.version

    async def digest(self) -> str:
        if self._digest is None:
            self._digest = await asyncio.to_thread(self.model.digest)
        return self._digest


def copy_tensors(src: Mapping[str, torch.Tensor],
                 into: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """``src`` copied into the buffers of ``into`` (same specs), or into fresh ones."""
    if into is None:    # the coordinator's copies live on the CPU, whatever the caller's device
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in src.items()}
    with torch.no_grad():
        for k, v in src.items():
            into[k].copy_(v)
    return into


class VersionStore:
    """Published versions by number, with buffer recycling and a byte budget."""

    def __init__(self, model: ModelState, *, max_bytes: int | None, spare_buffers: int = 1,
                 pool: BufferPool | None = None) -> None:
        """``pool``: where dropped versions' buffers go and new versions' come from (the
        coordinator shares one with the uploads' decode buffers); else one of ``spare_buffers``."""
        first = Version(ModelState(copy_tensors(model.tensors, None), model.version,
                                   statistics=model.statistics, ties=model.ties))
        self._versions: dict[int, Version] = {first.number: first}
        self._current = first
        self._nbytes = max(model.nbytes, 1)
        self._max_versions = None if max_bytes is None else max(1, max_bytes // self._nbytes)
        self._pool = pool if pool is not None else BufferPool(model.spec, spare_buffers)

    @property
    def current(self) -> Version:
        return self._current

    def get(self, number: int) -> Version | None:
        return self._versions.get(number)

    def numbers(self) -> list[int]:
        return sorted(self._versions)

    @property
    def retained_bytes(self) -> int:
        return len(self._versions) * self._nbytes

    def take_buffer(self) -> dict[str, torch.Tensor] | None:
        """A recycled buffer for the next copy, or None (then the copy allocates)."""
        return self._pool.take()

    def give_back(self, buffer: dict[str, torch.Tensor]) -> None:
        self._pool.give(buffer)

    def publish(self, model: ModelState) -> Version:
        """Make ``model`` (a private copy, never mutated again) the current version."""
        if model.version <= self._current.number:
            raise ValueError(f"version {model.version} does not go forward from "
                             f"{self._current.number}")
        v = Version(model)
        self._versions[v.number] = v
        self._current = v
        return v

    def adopt(self, model: ModelState) -> None:
        """Hold an older version again (a restart reads back the bases open leases need); a
        number already held, or not older than the current one, is left as it is."""
        if model.version in self._versions or model.version >= self._current.number:
            return
        self._versions[model.version] = Version(ModelState(copy_tensors(model.tensors, None),
                                                           model.version, statistics=model.statistics,
                                                           ties=model.ties))

    def retain(self, keep: Callable[[int], bool]) -> list[int]:
        """Drop every version but the current one that ``keep`` refuses, then the oldest over budget."""
        drop = [n for n in self._versions if n != self._current.number and not keep(n)]
        if self._max_versions is not None:
            kept = sorted(n for n in self._versions if n not in drop)
            excess = len(kept) - self._max_versions
            drop += [n for n in kept if n != self._current.number][:max(excess, 0)]
        for n in drop:
            v = self._versions.pop(n)
            v.evicted = True
            if v.refs == 0:
                self.give_back(v.model.tensors)
        return drop

    def acquire(self, number: int) -> Version | None:
        v = self._versions.get(number)
        if v is not None:
            v.refs += 1
        return v

    def release(self, v: Version) -> None:
        v.refs -= 1
        if v.refs == 0 and v.evicted:
            self.give_back(v.model.tensors)
