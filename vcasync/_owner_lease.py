"""An owner lease on a storage prefix: one live holder at a time, by records, not by luck.

Two users need it. A worker's remote state (``--state URL``): a spot VM that dies without notice
comes back as another machine and must take over the dead worker's state, while a *second live*
worker pointed at that URL by mistake must be refused (both would train one lease and overwrite each
other's checkpoints). A coordinator's state prefix: a restarted coordinator must take its run over,
while a second live one must be refused before it reads or serves anything (both would journal and
acknowledge results of one run, and one's results would be lost).

Object stores offer one atomic primitive everywhere: create-if-absent. So ownership is a sequence of
owner records under ``prefix``, each created if-absent, the highest one current::

    <prefix><epoch:012d>.json   {"holder", "host", "node", "pid", "ttl_s", "beat", "since",
                                 "renewed_at", "released", "clean"}

- the owner renews its record every ``ttl_s / 3`` (``beat`` + 1, a new ``renewed_at``), checking
  before and after the write that its epoch is still the current one;
- a newcomer takes over by creating ``<epoch + 1>`` if-absent, at once when the current record is
  ``released`` (an exit; ``clean`` false when the holder could not save what it held, and the
  newcomer then takes over as from a crash: :attr:`OwnerLease.took_over`); or its holder is
  provably dead: it ran on this very machine (same
  host name, boot id and pid namespace, so the pid means the same process) and its pid no longer
  runs (or is a zombie), or it is this process and the lease object that held it let it go without
  a release (:meth:`OwnerLease.abandon`, what a crash leaves in a test). A pid that runs is never
  taken for dead, whatever the clocks say: it may be reused, and then the newcomer waits as below.
  A record of another machine is also taken at once when its ``renewed_at`` is over
  :data:`LONG_DEAD_S` (a day; ``2 * ttl_s`` if longer) old by the newcomer's wall clock (so a
  replacement booted long after the death need not wait; this trusts the two clocks to agree within
  a day, never within a TTL: a clock minutes or hours fast must not take a live holder's lease);
- otherwise the newcomer watches the record for ``ttl_s`` by its own monotonic clock (which needs
  no agreement between clocks): unchanged for that long, the owner stopped renewing and is taken
  over; changed, the owner is alive and the newcomer is refused with the error the user chose
  (naming the holder: host, pid, since when);
- of two newcomers racing for one epoch exactly one create succeeds; the loser looks again.

An owner that finds a higher epoch than its own (or another holder in its epoch, on a store that
ignores if-absent) has been taken over (it stalled longer than ``ttl_s``): :meth:`OwnerLease.check`
raises and the owner stops instead of writing over its successor. :meth:`OwnerLease.ensure` is that
check for the moments that matter (a coordinator acknowledging a result): free while the last
renewal that was confirmed by a read after it started less than ``2/3 ttl_s`` ago (no newcomer can
take over before one ``ttl_s`` after it), a renewal first otherwise.
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

from .errors import ObjectNotFoundError, PreconditionFailedError, StorageError
from .storage import Storage

__all__ = ["OwnerLease", "OwnerRecord", "this_node"]

_DIGITS = 12
#: The shortest TTL a coordinator's ``owner_ttl_s`` or a worker's ``state_lease_s`` may have. The
#: owner renews every ``ttl / 3``, and a renewal is about five storage round trips on S3 or GCS (a
#: list and a get before and after a put), each up to hundreds of milliseconds under load: a shorter
#: TTL lets a live owner miss renewals and be taken over, and renews hundreds of times a second when
#: very short (0.001 s: ~650 a second, 71 % of a core). Read at validation time (tests lower it).
MIN_TTL_S = 3.0
#: How old (by the newcomer's wall clock) another machine's record must be to be taken at once,
#: without watching it for a TTL: a day, so that two clocks that disagree by minutes or hours (a
#: fast clock, a time zone set wrong) never make a live holder look dead. Younger records are
#: watched on the newcomer's monotonic clock, which trusts no agreement between clocks.
LONG_DEAD_S = 24 * 3600.0
#: The longest TTL: a day. After a crash, a start on another machine watches the old record for a
#: TTL before taking it over, so a TTL of 1e12 s (it was taken) would keep the run down for ever.
MAX_TTL_S = LONG_DEAD_S
#: Why a record released without its holder's state saved is free: taken at once, as from a crash.
UNSAVED = "it stopped without saving its state"
#: Holder tokens of the leases this process holds now (see the module docstring: a record naming
#: this process whose holder is not here was let go without a release).
_HELD: set[str] = set()

#: ``(message, holder)`` -> the exception a refused newcomer or a superseded owner raises.
ErrorFactory = Callable[[str, str | None], Exception]


def this_node() -> str | None:
    """What makes a pid mean one process: host name, boot id and pid namespace (None where they
    cannot be read, off Linux: no holder is then ever provably dead, a newcomer waits its TTL)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{socket.gethostname()}/{boot}/{pidns}"


def _pid_gone(pid: int) -> bool:
    """True only when process ``pid`` (of this pid namespace) surely does not run."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:          # PermissionError: it runs, as another user
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[:1]
    return state in (["Z"], ["X"])     # killed, not yet reaped by its parent


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


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
    since: float = 0.0             # when the holder took the lease (wall clock)
    node: str | None = None        # this_node() of the holder
    #: with ``released``: the holder saved what it held before it let go (false: a coordinator
    #: whose final snapshot could not be written; its successor takes over as from a crash)
    clean: bool = True

    def to_bytes(self) -> bytes:
        return json.dumps({"holder": self.holder, "host": self.host, "node": self.node,
                           "pid": self.pid, "ttl_s": self.ttl_s, "beat": self.beat,
                           "since": self.since, "renewed_at": self.renewed_at,
                           "released": self.released, "clean": self.clean}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> OwnerRecord | None:
        """The record, or None for one that does not parse (treated as released: it protects nothing)."""
        try:
            raw = json.loads(data)
            node = raw.get("node")
            return cls(str(raw["holder"]), str(raw["host"]), int(raw["pid"]), float(raw["ttl_s"]),
                       int(raw["beat"]), float(raw["renewed_at"]), bool(raw.get("released", False)),
                       float(raw.get("since", raw["renewed_at"])), None if node is None else str(node),
                       bool(raw.get("clean", True)))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {_when(self.since)}"


class OwnerLease:
    """Holds ``storage``'s owner lease under ``prefix`` for this process: :meth:`acquire`,
    :meth:`renew` (every :attr:`renew_every_s`, or :meth:`keep_renewed`), :meth:`check` or
    :meth:`ensure` before writes, :meth:`release` on a clean exit.

    ``subject`` names what is held in messages ("the worker state at s3://..."), ``role`` who holds
    it ("worker"), ``hint`` what to do when refused; ``error(message, holder)`` builds what is raised
    when a live holder refuses a newcomer or an owner finds itself taken over. ``clock`` (wall time,
    seconds) and ``monotonic`` are injectable so tests can age records.
    """

    def __init__(self, storage: Storage, *, error: ErrorFactory, prefix: str = "owner/",
                 ttl_s: float = 30.0, subject: str = "", role: str = "owner", hint: str = "",
                 logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        if prefix and not prefix.endswith("/"):
            raise ValueError("prefix must end with '/'")
        self.storage = storage
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.subject = subject or f"the owner lease at {storage.url}/{prefix}"
        self.role = role
        self.hint = hint
        self._error = error
        self._log = logger or logging.getLogger("vcasync")
        self._clock = clock
        self._monotonic = monotonic
        self._holder = secrets.token_hex(8)
        self._node = this_node()
        self._epoch: int | None = None
        self._beat = 0
        self._since = 0.0
        self._lost = False
        #: set by :meth:`acquire`: the previous holder neither released its record nor was absent
        #: (it crashed, was killed, or stopped renewing): what it did since its last write is unknown
        self.took_over = False
        self._confirmed: float | None = None    # monotonic start of the last confirmed renewal
        #: What :meth:`check` raised when the lease was found taken over (None while held).
        self.error: Exception | None = None

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / 3

    @property
    def held(self) -> bool:
        return self._epoch is not None and not self._lost

    @property
    def epoch(self) -> int | None:
        return self._epoch

    def info(self) -> dict[str, Any] | None:
        """Who holds the lease, for operators (``GET /v1/status`` ``owner``), or None while this
        object holds nothing: ``host``, ``pid``, ``epoch``, ``since`` (ISO 8601, UTC) and
        ``since_unix`` (when it was taken), ``ttl_s``, ``renewed_s_ago`` (seconds since the last
        confirmed renewal started; None while none is confirmed, e.g. after a storage hiccup) and
        ``lost`` (found taken over). Never the holder token: whoever knows it could forge a renewal."""
        if self._epoch is None:
            return None
        age = None if self._confirmed is None else round(self._age(), 3)
        return {"host": socket.gethostname(), "pid": os.getpid(), "epoch": self._epoch,
                "since": _iso(self._since), "since_unix": self._since, "ttl_s": self.ttl_s,
                "renewed_s_ago": age, "lost": self._lost}

    def _key(self, epoch: int) -> str:
        return f"{self.prefix}{epoch:0{_DIGITS}d}.json"

    def _record(self, *, released: bool = False, clean: bool = True) -> OwnerRecord:
        return OwnerRecord(self._holder, socket.gethostname(), os.getpid(), self.ttl_s, self._beat,
                           self._clock(), released, self._since, self._node, clean)

    async def _current(self) -> tuple[int, OwnerRecord | None] | None:
        """The highest epoch and its record (None when it does not parse); None when there is none."""
        keys = [k async for k in self.storage.list(self.prefix)]
        for key in reversed(keys):  # list is in key order, and epochs are zero-padded
            name = key[len(self.prefix):]
            if "/" in name or not name.endswith(".json"):
                continue
            try:
                epoch = int(name[:-len(".json")])
            except ValueError:
                continue
            try:
                data = await self.storage.get(key)
            except ObjectNotFoundError:  # pruned by a newer owner between list and get: look again
                return await self._current()
            return epoch, OwnerRecord.from_bytes(data)
        return None

    def _free(self, rec: OwnerRecord | None) -> str | None:
        """Why ``rec`` protects nothing (it may be taken at once), or None while it may be live."""
        if rec is None:
            return "unreadable"
        if rec.released:
            return "released" if rec.clean else UNSAVED
        if self._node is not None and rec.node == self._node:
            # this very machine: the pid decides, never the clock (a record's stamp may be far off
            # by ours, the holder's clock set back or ours ahead, while its process renews it)
            if rec.pid == os.getpid():
                if rec.holder not in _HELD:
                    return "let go by this process without a release"
            elif _pid_gone(rec.pid):
                return "its process no longer runs"
            return None
        if self._clock() - rec.renewed_at > max(2 * rec.ttl_s, LONG_DEAD_S):
            return f"not renewed since {_when(rec.renewed_at)}"
        return None

    async def acquire(self, *, poll_s: float | None = None, prune: bool = True) -> None:
        """Become the owner, or raise ``error`` when a live holder holds the prefix.

        Takes at most about one ``ttl_s`` of the current owner (the time to see it is dead), and no
        time when the owner released it, or provably died on this machine. ``prune`` False leaves
        the older records for :meth:`prune` (a holder that may still :meth:`withdraw`)."""
        poll = poll_s if poll_s is not None else max(0.05, min(1.0, self.ttl_s / 6))
        watched: tuple[int, OwnerRecord | None] | None = None
        since = self._monotonic()
        told = False
        while True:
            cur = await self._current()
            why = self._free(cur[1]) if cur is not None else "none"
            if cur is not None and why is None:
                epoch, rec = cur
                assert rec is not None
                if watched is None or watched[0] != epoch:
                    watched, since = cur, self._monotonic()
                elif watched[1] != rec:
                    raise self._error(f"{self.subject} is in use by a live {self.role} "
                                      f"({rec.describe()}){'; ' + self.hint if self.hint else ''}",
                                      rec.describe())
                if self._monotonic() - since < rec.ttl_s:
                    if not told:
                        told = True
                        self._log.info("%s is held by a %s (%s): waiting up to %.0fs to see "
                                       "whether it is alive", self.subject, self.role,
                                       rec.describe(), rec.ttl_s)
                    await asyncio.sleep(poll)
                    continue
                self._log.warning("the previous %s of %s (%s) stopped renewing %.0fs ago; taking "
                                  "over", self.role, self.subject, rec.describe(),
                                  self._monotonic() - since)
            elif cur is not None and cur[1] is not None and why != "released":
                self._log.warning("the previous %s of %s (%s) is gone (%s); taking over", self.role,
                                  self.subject, cur[1].describe(), why)
            elif cur is not None and cur[1] is None:
                self._log.warning("the record of the previous %s of %s (%s) is unreadable; taking "
                                  "over as from a crash", self.role, self.subject, self._key(cur[0]))
            epoch = cur[0] + 1 if cur is not None else 1
            # an unreadable record says nothing of how its holder stopped: take the worse case
            # (until 2026-12-07 it was taken for a clean stop, and a crashed run got no grace)
            self.took_over = cur is not None and why != "released"
            self._beat, self._since = 0, self._clock()
            started = self._monotonic()
            try:
                await self.storage.put(self._key(epoch), self._record().to_bytes(), if_absent=True)
            except PreconditionFailedError:  # another newcomer won this epoch: look at it
                watched = None
                continue
            self._epoch, self._lost, self.error = epoch, False, None
            self._confirmed = started
            _HELD.add(self._holder)
            self._log.info("holding %s (owner epoch %d)", self.subject, epoch)
            if prune:
                await self.prune()
            return

    async def prune(self) -> None:
        """Old records protect nothing; keep the previous one for whoever wants to know who it was."""
        if self._epoch is None:
            return
        epoch = self._epoch
        async for key in self.storage.list(self.prefix):
            if key < self._key(epoch - 1):
                with contextlib.suppress(StorageError):
                    await self.storage.delete(key)

    def _taken(self, message: str, holder: str | None = None) -> Exception:
        self._lost = True
        self._confirmed = None
        _HELD.discard(self._holder)
        self.error = self._error(message, holder)
        return self.error

    async def check(self) -> None:
        """Raise ``error`` if a newer owner took the prefix over (we stalled past ``ttl_s``); called
        before writes, so a superseded owner never clobbers its successor."""
        if self._epoch is None:
            raise self._error(f"{self.subject} is not held; acquire it first", None)
        if self._lost:
            assert self.error is not None
            raise self.error
        cur = await self._current()
        if cur is None or cur[0] != self._epoch or cur[1] is None or cur[1].holder != self._holder:
            who = cur[1].describe() if cur is not None and cur[1] is not None else "nobody"
            raise self._taken(f"{self.subject} was taken over by another {self.role} ({who}) while "
                              f"this one stalled; stopping", who)

    async def renew(self) -> None:
        """Prove we are alive: a new beat in our record, between two :meth:`check`\\ s (the second
        confirms that nobody took over before the write landed)."""
        await self.check()
        assert self._epoch is not None
        self._beat += 1
        started = self._monotonic()
        await self.storage.put(self._key(self._epoch), self._record().to_bytes())
        await self.check()
        self._confirmed = started

    async def ensure(self) -> None:
        """Raise ``error`` if the lease is lost; a storage round trip only when the last confirmed
        renewal started ``2/3 ttl_s`` ago or more (a newcomer needs a whole ``ttl_s`` after it).

        A renewal that fails on storage (a hiccup: the put refused, its reply lost) while the last
        confirmed one started less than ``5/6 ttl_s`` ago is not an answer: nobody can have taken
        over yet, so the caller goes on (the renewer tries again soon). Past that, the
        :class:`StorageError` is raised: the lease cannot be vouched for."""
        if self.held and self._confirmed is not None and self._age() < self.ttl_s * 2 / 3:
            return
        try:
            await self.renew()
        except StorageError:
            if self._lost or self._confirmed is None or self._age() >= self.ttl_s * 5 / 6:
                raise
            self._log.info("renewing the lease on %s failed; still ours for %.1f s", self.subject,
                           self.ttl_s - self._age())

    def _age(self) -> float:
        """Seconds since the last confirmed renewal started (call only with one confirmed)."""
        assert self._confirmed is not None
        return self._monotonic() - self._confirmed

    async def release(self, *, clean: bool = True) -> None:
        """Mark our record released so a successor takes over at once (an exit). ``clean`` False:
        this holder could not save what it held (a coordinator whose final snapshot failed), so
        the successor takes over as from a crash (:attr:`took_over`), not from a clean stop."""
        if not self.held:
            self._epoch = None
            return
        try:
            await self.check()
            assert self._epoch is not None
            await self.storage.put(self._key(self._epoch),
                                   self._record(released=True, clean=clean).to_bytes())
            self._log.info("released %s%s", self.subject,
                           "" if clean else " (its state was not all saved: the next start takes "
                                            "it over as from a crash)")
        except StorageError as exc:  # a successor then waits one TTL instead of none
            if not self._lost:
                self._log.warning("could not release %s (%s)", self.subject, type(exc).__name__)
        except Exception:
            if not self._lost:
                raise
        finally:
            self._forget()

    async def withdraw(self, *, clean: bool = True) -> None:
        """Give the lease back as if it had never been taken: delete our own record, so the
        previous one (released, or its holder's last beat) is current again and the store holds
        what it held before :meth:`acquire` (with ``prune=False``). Only for a holder that wrote
        nothing under the lease: this epoch is taken again by the next newcomer, and a write
        fenced by it would be its. Where the delete fails, the record is released instead
        (``clean`` as :meth:`release` takes it)."""
        if not self.held:
            self._epoch = None
            return
        try:
            await self.check()
            assert self._epoch is not None
            await self.storage.delete(self._key(self._epoch))
            self._log.info("gave back %s (owner epoch %d): nothing was written under it",
                           self.subject, self._epoch)
        except StorageError:
            if not self._lost:      # the record stays, released: a successor takes over at once
                await self.release(clean=clean)
        except Exception:
            if not self._lost:
                raise
        finally:
            self._forget()

    def abandon(self) -> None:
        """Let go without writing anything, as a killed process does: a newcomer in this process
        takes over at once, one elsewhere after ``ttl_s`` (tests simulate a crash this way)."""
        self._forget()

    def _forget(self) -> None:
        """This process holds the lease no more (whatever the store says)."""
        _HELD.discard(self._holder)
        self._epoch = None
        self._confirmed = None

    async def keep_renewed(self, on_lost: Callable[[], Any]) -> None:
        """Renew every :attr:`renew_every_s` until cancelled; call ``on_lost()`` once and return if
        the prefix was taken over (:attr:`error` says how). A renewal that failed on storage is
        logged and tried again after a quarter of a beat, not a whole one: one hiccup must not age
        the confirmation past the point where :meth:`ensure` needs storage on every call."""
        wait = self.renew_every_s
        while True:
            await asyncio.sleep(wait)
            wait = self.renew_every_s
            if self._epoch is None:
                return
            try:
                await self.renew()
            except Exception as exc:
                if self._lost:
                    self._log.error("%s", exc)
                    on_lost()
                    return
                if not isinstance(exc, StorageError):
                    raise
                self._log.warning("renewing the lease on %s failed (%s); retrying", self.subject,
                                  type(exc).__name__)
                wait = self.renew_every_s / 4
