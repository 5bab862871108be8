"""A lease on a worker's remote state: one live worker per state URL, by records, not by luck.

A spot VM that dies without notice comes back as another machine; given the same state URL it must
take over the dead worker's state, while a *second live* worker pointed at that URL by mistake must be
refused (two workers training one lease would each overwrite the other's checkpoints).

Object stores offer one atomic primitive everywhere: create-if-absent. So ownership is a sequence of
owner records, each created if-absent, the highest one current::

    owner/<epoch:012d>.json   {"holder", "host", "pid", "ttl_s", "beat", "renewed_at", "released"}

- the owner renews its record every ``ttl_s / 3`` (``beat`` + 1, a new ``renewed_at``);
- a newcomer takes over by creating ``owner/<epoch + 1>`` if-absent, only when the current record is
  ``released`` (a clean exit), or it watched the record not change for ``ttl_s`` by its own monotonic
  clock (which needs no agreement between clocks), or, so that a replacement booted long after the
  death need not wait, the record's ``renewed_at`` is over ``2 * ttl_s`` old by the newcomer's wall
  clock (which trusts the two clocks to agree within ``ttl_s``: a newcomer whose clock runs further
  ahead can take over a live owner, who then notices at its next write and stops);
- a newcomer that sees the record change while it watches knows the owner is alive and is refused with
  :class:`~vcasync.errors.StateInUseError`;
- of two newcomers racing for one epoch exactly one create succeeds; the loser looks again.

An owner that finds a higher epoch than its own has been taken over (it stalled longer than ``ttl_s``):
:meth:`StateLease.check` raises and the worker stops instead of writing over its successor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ObjectNotFoundError, PreconditionFailedError, StateInUseError, StorageError
from ..storage import Storage

__all__ = ["OwnerRecord", "StateLease"]

log = logging.getLogger("vcasync.worker")

_PREFIX = "owner/"
_DIGITS = 12


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """One owner record as stored (see the module docstring)."""

    holder: str
    host: str
    pid: int
    ttl_s: float
    beat: int
    renewed_at: float
    released: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps({"holder": self.holder, "host": self.host, "pid": self.pid, "ttl_s": self.ttl_s,
                           "beat": self.beat, "renewed_at": self.renewed_at,
                           "released": self.released}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> OwnerRecord | None:
        """The record, or None for one that does not parse (treated as released: it protects nothing)."""
        try:
            raw = json.loads(data)
            return cls(str(raw["holder"]), str(raw["host"]), int(raw["pid"]), float(raw["ttl_s"]),
                       int(raw["beat"]), float(raw["renewed_at"]), bool(raw.get("released", False)))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"{self.host} pid {self.pid}"


def _key(epoch: int) -> str:
    return f"{_PREFIX}{epoch:0{_DIGITS}d}.json"


class StateLease:
    """Holds ``storage``'s owner lease for this process: :meth:`acquire`, :meth:`renew` (every
    :attr:`renew_every_s`), :meth:`check` before writes, :meth:`release` on a clean exit.

    ``clock`` (wall time, seconds) and ``monotonic`` are injectable so tests can age records.
    """

    def __init__(self, storage: Storage, *, ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.storage = storage
        self.ttl_s = ttl_s
        self._clock = clock
        self._monotonic = monotonic
        self._holder = secrets.token_hex(8)
        self._epoch: int | None = None
        self._beat = 0
        self._lost = False

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / 3

    @property
    def held(self) -> bool:
        return self._epoch is not None and not self._lost

    def _record(self, *, released: bool = False) -> OwnerRecord:
        return OwnerRecord(self._holder, socket.gethostname(), os.getpid(), self.ttl_s, self._beat,
                           self._clock(), released)

    async def _current(self) -> tuple[int, OwnerRecord | None] | None:
        """The highest epoch and its record (None when it does not parse); None when there is none."""
        keys = [k async for k in self.storage.list(_PREFIX)]
        for key in reversed(keys):  # list is in key order, and epochs are zero-padded
            try:
                epoch = int(key[len(_PREFIX):-len(".json")])
            except ValueError:
                continue
            try:
                data = await self.storage.get(key)
            except ObjectNotFoundError:  # pruned by a newer owner between list and get: look again
                return await self._current()
            return epoch, OwnerRecord.from_bytes(data)
        return None

    def _stale(self, rec: OwnerRecord | None) -> bool:
        return rec is None or rec.released or self._clock() - rec.renewed_at > 2 * rec.ttl_s

    async def acquire(self, *, poll_s: float | None = None) -> None:
        """Become the owner, or raise :class:`StateInUseError` when a live worker holds the state.

        Takes at most about one ``ttl_s`` of the current owner (the time to see it is dead).
        """
        poll = poll_s if poll_s is not None else max(0.05, min(1.0, self.ttl_s / 6))
        watched: tuple[int, OwnerRecord | None] | None = None
        since = self._monotonic()
        while True:
            cur = await self._current()
            if cur is not None and not self._stale(cur[1]):
                epoch, rec = cur
                assert rec is not None
                if watched is None or watched[0] != epoch:
                    watched, since = cur, self._monotonic()
                elif watched[1] != rec:
                    raise StateInUseError(
                        f"the worker state at {self.storage.url} is in use by a live worker "
                        f"({rec.describe()}); give each worker its own --state URL",
                        url=self.storage.url, holder=rec.describe())
                if self._monotonic() - since < rec.ttl_s:
                    await asyncio.sleep(poll)
                    continue
                log.warning("the previous owner of %s (%s) stopped renewing %.0fs ago; taking over",
                            self.storage.url, rec.describe(), self._monotonic() - since)
            epoch = cur[0] + 1 if cur is not None else 1
            self._beat = 0
            try:
                await self.storage.put(_key(epoch), self._record().to_bytes(), if_absent=True)
            except PreconditionFailedError:  # another newcomer won this epoch: look at it
                watched = None
                continue
            self._epoch, self._lost = epoch, False
            log.info("holding the worker state at %s (owner epoch %d)", self.storage.url, epoch)
            await self._prune(epoch)
            return

    async def _prune(self, epoch: int) -> None:
        """Old records protect nothing; keep the previous one for whoever wants to know who it was."""
        async for key in self.storage.list(_PREFIX):
            if key < _key(epoch - 1):
                with contextlib.suppress(StorageError):
                    await self.storage.delete(key)

    async def check(self) -> None:
        """Raise :class:`StateInUseError` if a newer owner took the state over (we stalled past
        ``ttl_s``); called before every write, so a superseded worker never clobbers its successor."""
        if self._epoch is None:
            raise StateInUseError(f"the worker state at {self.storage.url} is not held; acquire it first",
                                  url=self.storage.url)
        if self._lost:
            raise StateInUseError(f"the worker state at {self.storage.url} was taken over by another "
                                  "worker", url=self.storage.url)
        cur = await self._current()
        if cur is None or cur[0] != self._epoch or cur[1] is None or cur[1].holder != self._holder:
            self._lost = True
            who = cur[1].describe() if cur is not None and cur[1] is not None else "nobody"
            raise StateInUseError(f"the worker state at {self.storage.url} was taken over by {who} "
                                  "while this worker stalled; stopping", url=self.storage.url, holder=who)

    async def renew(self) -> None:
        """Prove we are alive: a new beat in our record (after :meth:`check`)."""
        await self.check()
        assert self._epoch is not None
        self._beat += 1
        await self.storage.put(_key(self._epoch), self._record().to_bytes())

    async def release(self) -> None:
        """Mark our record released so a successor takes over at once (a clean exit)."""
        if not self.held:
            return
        try:
            await self.check()
            assert self._epoch is not None
            await self.storage.put(_key(self._epoch), self._record(released=True).to_bytes())
            log.info("released the worker state at %s", self.storage.url)
        except StateInUseError:
            pass
        except StorageError as exc:  # a successor then waits one TTL instead of none
            log.warning("could not release the worker state at %s (%s)", self.storage.url,
                        type(exc).__name__)
        self._epoch = None

    async def keep_renewed(self, on_lost: Callable[[], Any]) -> None:
        """Renew every :attr:`renew_every_s` until cancelled; call ``on_lost()`` once and return if
        the state was taken over. Storage hiccups are logged and retried at the next beat."""
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                await self.renew()
            except StateInUseError as exc:
                log.error("%s", exc)
                on_lost()
                return
            except StorageError as exc:
                log.warning("renewing the state lease on %s failed (%s); retrying", self.storage.url,
                            type(exc).__name__)
