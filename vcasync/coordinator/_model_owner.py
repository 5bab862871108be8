"""The model side of the coordinator: the working model, the policy and its state, the versions.

The policy merges into a private *working* model (in a worker thread); a merge that changed it is
published as an immutable :class:`~vcasync.coordinator._versions.Version` that downloads and delta bases read
while the next merge runs. If the policy raises, the working model is restored from the current
published version and the policy's state from what was taken before the merge
(:mod:`~vcasync.coordinator._state_undo`), so a refused or broken merge leaves no trace in either.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Iterable, Mapping

import torch

from .._aio import to_thread_released
from ..errors import (
    PolicyFailedError,
    SpecMismatchError,
    UpdateRejectedError,
    ValidationError,
    VCAsyncError,
    VersionNotFoundError,
)
from ..policy import MergePolicy, PolicyState
from ..tensors import ModelSpec, ModelState, Update
from ..wire import aencode_payload, check_tree, pack_tree
from ._buffers import BufferPool
from ._counters import CounterBases
from ._state_undo import StateUndo
from ._statistics import Statistics
from ._versions import Version, VersionStore, copy_tensors

__all__ = ["ModelOwner"]

log = logging.getLogger("vcasync.coordinator")

#: A policy that keeps failing is logged at most once per this many seconds after its first failure.
LOG_EVERY_S = 60.0


class _Broken(Exception):
    """Internal: the merge broke its contract in a way ``what`` says after the policy's name."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _NonFinite(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding a NaN or an infinity, or None.

    A finite sum means every element is finite (a NaN or an infinity makes the sum one), and a sum
    is one read with nothing allocated: about half a plain merge's cost (``isfinite().all()`` costs
    30 times more). Only a sum that is not finite (a bad value, or finite values that overflow it)
    is checked element by element."""
    for name, t in tensors.items():
        if not (t.is_floating_point() or t.is_complex()):
            continue
        if bool(torch.isfinite(t.sum())):
            continue
        if not bool(torch.isfinite(t).all()):
            return name
    return None


def _adoptable(model: ModelState) -> bool:
    """Tensors the working model can be made of as they are (what copy_tensors would make)."""
    return all(t.is_cpu and t.is_contiguous() and not t.requires_grad for t in model.values())


class ModelOwner:
    """Only the merge loop calls :meth:`merge`, :meth:`retain`, :meth:`jump` and :meth:`pack_state`."""

    def __init__(self, policy: MergePolicy, model: ModelState, *, max_retained_bytes: int | None,
                 policy_state: PolicyState | None = None, pool: BufferPool | None = None,
                 adopt: bool = False, held: int = 0,
                 renumbered: Mapping[int, int] | None = None,
                 statistics: Iterable[str] = (),
                 pending_statistics: Iterable[Mapping[str, torch.Tensor]] = (),
                 ties: Iterable[Iterable[str]] = ()) -> None:
        """``adopt``: ``model``'s tensors (CPU, contiguous, no grad) become the working model
        instead of being copied: the caller hands them over and keeps no reference it uses again
        (a snapshot decoded at resume, nobody else's; one model-sized copy less at start-up).
        ``statistics``: the names of the model's running statistics (``ModelState.statistics``),
        with ``pending_statistics`` the values of held results a snapshot kept
        (:mod:`vcasync.coordinator._statistics`). ``ties``: the model's tied names
        (``ModelState.ties``), which every version it publishes carries."""
        self.policy = policy
        self.needs_base = bool(getattr(policy, "needs_base", False))
        self.spec: ModelSpec = model.spec
        #: Merges the policy broke (raised, spec, non-finite) in this process, for the log's
        #: count; the merge loop keeps the failures in a row that stop the run (``Merger``).
        self.policy_failures = 0
        #: Accepted results the policy merged without changing the model (``merge`` returned None,
        #: e.g. into a buffer not yet full) since the last published version (``held``: the
        #: recovered snapshot's count, which replay goes on from). When the run's last result is
        #: merged with some held, the policy's ``flush`` applies them; without one (or when it
        #: applies nothing) the final model does not include them.
        self.held = held
        #: The end-of-run flush was done (or tried) since the last result was merged.
        self.flushed = False
        self._failure_logged_at = 0.0
        self._failures_unlogged = 0
        self._working = ModelState(dict(model.tensors) if adopt and _adoptable(model)
                                   else copy_tensors(model.tensors, None), model.version,
                                   statistics=statistics, ties=ties)
        self.state: PolicyState = (policy.init_state(self._working) if policy_state is None
                                   else policy_state)
        self.versions = VersionStore(self._working, max_bytes=max_retained_bytes, pool=pool)
        self._undo = StateUndo()      # the policy state before each merge, for a failed one
        self._undo_point: object = None      # the last one taken (a merge undone after it ran)
        self._merge_s = 0.0
        #: Seconds the last :meth:`merge` took: the policy, plus publishing the new version (not
        #: the wait for what ran ``alongside`` it)
        self.last_merge_s = 0.0
        #: Integer tensors per version, to turn full-weights results into increments (the policy
        #: contract); kept for the staleness window whatever the versions' byte budget drops.
        self.counters = CounterBases(self._working)
        #: Running statistics by version, and the values of results merged since the last version:
        #: they get a rule of their own, not the policy's (see :mod:`._statistics`).
        self.statistics = Statistics(self._working.statistics, self._working, pending_statistics)
        #: Snapshot-mode recovery: the recovered snapshot's version -> the number :meth:`jump`
        #: renumbered it to (the same weights), kept in snapshots; see :meth:`renumbered`.
        self._renumbered: dict[int, int] = dict(renumbered or {})

    @property
    def version(self) -> int:
        return self.versions.current.number

    def switch_policy(self, policy: MergePolicy) -> None:
        """Start-up only, before anything is served: merge with ``policy`` from here on, starting
        from its fresh state on the current model (the old policy's state would not fit it)."""
        self.policy = policy
        self.needs_base = bool(getattr(policy, "needs_base", False))
        self.state = policy.init_state(self._working)
        self.held = 0                      # the old policy's buffer went with its state
        self.statistics.forget_pending()
        self.flushed = False

    # -- merge loop only --------------------------------------------------------------------------
    async def merge(self, update: Update, release: Callable[[], None] | None = None, *,
                    alongside: Callable[[], Awaitable[None]] | None = None,
                    statistics: Mapping[str, torch.Tensor] | None = None) -> bool:
        """Merge one update; True when a new version was published. Refusals raise unchanged.

        ``release`` is called once the policy is done with the update, before the new version is
        copied out of the working model: there the caller gives the update's tensors back to the
        buffer pool, so the copy can go into them (one model-sized set less than a copy into a
        spare). The caller must pass the only reference to ``update``: a reference kept anywhere
        else (the policy's, against the contract) keeps its tensors from being reused.

        ``alongside``: what must be done before the merge may be published (journal mode: the
        upload's bytes on storage and the record that names them). It runs while the policy
        merges into the working model, and may read ``update`` (the policy leaves it unchanged:
        the ``inputs_unchanged`` law); if it raises, the merge is undone (the working model and
        the policy's state as they were, nothing published) and its error raised. A refusal of
        the policy is raised once ``alongside`` is done.

        ``statistics``: the result's running statistics as values (``update`` holds what the
        result changes of them, see :meth:`Statistics.for_policy`), applied with the version that
        applies the result."""
        current = self.version
        if alongside is None:
            changed = await to_thread_released(self._merge_sync, update, current)
        else:
            changed = await self._merge_alongside(update, current, alongside)
        merged_s = self._merge_s
        if not changed:
            # held by the policy (a buffer): its increments count toward what the counters reach,
            # read before the update's tensors go back to the pool (policies leave inputs as they
            # are: the ``inputs_unchanged`` law); a merge applied at once costs nothing here
            self.counters.hold(update.tensors)
        if statistics is not None:
            self.statistics.hold(statistics)
        del update, statistics
        if release is not None:
            release()
        self.flushed = False
        if not changed:
            self.held += 1
            self.last_merge_s = merged_s
            return False
        started = time.perf_counter()
        self.statistics.apply(self._working)
        await self._publish(current + 1)
        self.last_merge_s = merged_s + time.perf_counter() - started
        return True

    async def _merge_alongside(self, update: Update, current: int,
                               alongside: Callable[[], Awaitable[None]]) -> bool:
        """:meth:`_merge_sync` in a worker thread while ``alongside`` runs; undone if it fails."""
        merging = asyncio.ensure_future(to_thread_released(self._merge_sync, update, current))
        try:
            await alongside()
        except BaseException:
            cancelled = await _wait_out(merging)      # a thread cannot be stopped: its merge ends
            if not merging.cancelled() and merging.exception() is None:
                self._undo_merge(current, changed=merging.result())
            if cancelled:
                raise asyncio.CancelledError from None
            raise
        return await merging

    def _undo_merge(self, current: int, *, changed: bool) -> None:
        """Undo the merge just made (not published): the policy's state as it was, and the working
        model as the current version (when the merge changed it)."""
        self._undo.restore(self.state, self._undo_point)
        if changed:
            self._restore_working()
            self._working.version = current

    @property
    def flush_due(self) -> bool:
        """The policy holds accepted results unapplied, has a ``flush`` and was not asked yet."""
        return self.held > 0 and not self.flushed and callable(getattr(self.policy, "flush", None))

    async def flush(self) -> bool:
        """The end of the run: the policy applies what it holds (``flush``); True when a new version
        was published. A flush the policy broke raises :class:`PolicyFailedError` with the model
        as it was; either way the flush is not asked again until another result is merged."""
        current = self.version
        self.flushed = True
        if not await to_thread_released(self._flush_sync, current):
            return False
        self.statistics.apply(self._working)
        await self._publish(current + 1)
        return True

    async def _publish(self, number: int) -> None:
        """The working model, changed by the policy, becomes version ``number``."""
        self.held = 0
        buffer = self.versions.take_buffer()
        published = await to_thread_released(self._copy_out, buffer, number)
        self.versions.publish(published)
        self.counters.record(published)
        self.statistics.record(published)

    def _copy_out(self, buffer: dict[str, torch.Tensor] | None, version: int) -> ModelState:
        return ModelState(copy_tensors(self._working.tensors, buffer), version,
                          statistics=self._working.statistics, ties=self._working.ties)

    def _merge_sync(self, update: Update, current: int) -> bool:
        """The policy's merge into the working model, checked; False when it changed nothing."""
        started = time.perf_counter()
        try:
            return self._run_policy(functools.partial(self.policy.merge, self._working, update,
                                                      self.state),
                                    current, "merge", f"unit {update.unit_id}")
        finally:
            self._merge_s = time.perf_counter() - started

    def _flush_sync(self, current: int) -> bool:
        """The policy's end-of-run flush into the working model, checked as a merge is."""
        flush: Callable[[ModelState, PolicyState], ModelState | None] | None = getattr(
            self.policy, "flush", None)
        if flush is None:
            return False
        return self._run_policy(functools.partial(flush, self._working, self.state), current,
                                "flush", "the end-of-run flush")

    def _run_policy(self, call: Callable[[], ModelState | None], current: int, method: str,
                    subject: str) -> bool:
        """``call`` (the policy's merge or flush on the working model), checked; False when it
        changed nothing. ``subject`` names what it worked on, for the error."""
        working = self._working
        before = self._undo_point = self._undo.take(self.state)
        try:
            out = call()
            if out is not None and not isinstance(out, ModelState):
                raise _Broken(f"returned a {type(out).__name__}; {method} must return the model (a "
                              "ModelState: the one it was given, changed in place, or a new one) or "
                              "None (the model did not change)")
            try:    # the state is snapshotted: one it cannot hold would fail every snapshot from now
                check_tree(self.state)      # structure and dtypes only, microseconds (no bytes)
            except (TypeError, ValueError, VCAsyncError) as exc:
                raise _Broken(f"put into its state a value that cannot be stored ({exc}); a "
                              "policy's state holds only tensors, ints, floats, bools, strings, "
                              "None, and lists, tuples and str-keyed dicts of those") from exc
            if out is not None:
                # in place too: a policy may have put a tensor of another dtype or shape into the
                # model's dict, and that must never be published
                self.spec.check(out.tensors)
                # the policy law 'finite' (finite inputs give a finite model): the result was
                # checked finite on arrival, so a NaN or inf here is the policy's doing
                bad = first_non_finite(out.tensors)
                if bad is not None:
                    raise _NonFinite(bad)
                if out is not working:
                    copy_tensors(out.tensors, working.tensors)
        except Exception as exc:
            self._restore_working()
            self._undo.restore(self.state, before)
            if isinstance(exc, UpdateRejectedError) or (isinstance(exc, ValidationError)
                                                        and not isinstance(exc, SpecMismatchError)):
                raise
            raise self._policy_failed(exc, subject) from exc
        if out is None:
            return False
        working.version = current + 1
        return True

    def _policy_failed(self, exc: Exception, subject: str) -> PolicyFailedError:
        """The error for a merge the policy broke (the model is restored already), logged: the
        first failure with its traceback, later ones at most once a ``LOG_EVERY_S`` with a count."""
        name = self.policy.name
        if isinstance(exc, SpecMismatchError):
            what = f"merge policy {name!r} broke the model's spec ({exc})"
        elif isinstance(exc, _Broken):
            what = f"merge policy {name!r} {exc.what}"
        elif isinstance(exc, _NonFinite):
            what = (f"merge policy {name!r} made the model's tensor {exc.name!r} non-finite (NaN "
                    "or inf; the policy law 'finite' forbids it)")
        else:
            what = f"merge policy {name!r} failed ({exc!r})"
        refused = "the result is refused" if subject.startswith("unit ") else "nothing is applied"
        message = f"{what} on {subject}: {refused}, the model and the policy's state are as they were"
        self.policy_failures += 1
        now = time.monotonic()
        if self.policy_failures == 1:
            log.error("%s", message, exc_info=not isinstance(exc, SpecMismatchError | _NonFinite | _Broken))
            self._failure_logged_at, self._failures_unlogged = now, 0
        elif now - self._failure_logged_at >= LOG_EVERY_S:
            log.error("%s (%d more policy failure(s) since the last one logged; %d in all)",
                      message, self._failures_unlogged, self.policy_failures)
            self._failure_logged_at, self._failures_unlogged = now, 0
        else:
            self._failures_unlogged += 1
        return PolicyFailedError(message[:400], policy=name)

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
        self.statistics.adopt(model)

    def jump(self, version: int) -> None:
        """Publish the current tensors again under a higher number (snapshot-mode recovery).

        The old number stays another name of the new one (:meth:`renumbered`): leases based on
        it hold exactly these weights, so their results are merged as based on the new number."""
        old = self.version
        self._working.version = version
        published = ModelState(copy_tensors(self._working.tensors, None), version,
                               statistics=self._working.statistics, ties=self._working.ties)
        self.versions.publish(published)
        self.counters.record(published)
        self.statistics.record(published)
        for was, now in self._renumbered.items():
            if now == old:
                self._renumbered[was] = version
        self._renumbered[old] = version

    def renumbered(self, number: int) -> int:
        """The version whose weights ``number`` names: ``number`` itself, or, for the version a
        snapshot-mode restart recovered, the number :meth:`jump` gave it (snapshots keep it while
        the new number is within the staleness window)."""
        return self._renumbered.get(number, number)

    def renumbered_pairs(self) -> tuple[tuple[int, int], ...]:
        """``(old, new)`` for each renumbered version still within the window, for a snapshot."""
        return tuple(sorted(self._renumbered.items()))

    def retain(self, max_staleness: int, bases: Container[int]) -> None:
        """Keep, within the staleness window, the versions ``bases`` holds (besides the current
        one): the bases of results that may still come (policies that apply a delta to its base),
        or of open leases (downloads). Others go, and their buffers are recycled."""
        floor = self.version - max_staleness
        self.counters.retain(floor)
        self.statistics.retain(floor)
        for old in [o for o, new in self._renumbered.items() if new < floor]:
            del self._renumbered[old]         # results on it are too stale now, whatever its name
        self.versions.retain(lambda n: n >= floor and n in bases)

    async def pack_state(self) -> bytes:
        return await asyncio.to_thread(pack_tree, dict(self.state))

    # -- anyone ------------------------------------------------------------------------------------
    def hold(self, number: int) -> Version | None:
        return self.versions.acquire(number)

    def release(self, version: Version) -> None:
        self.versions.release(version)

    def _require(self, number: int) -> int:
        """The held version ``number`` names: itself, or the number a snapshot-mode restart gave
        its weights (:meth:`renumbered`), so a worker whose lease was granted on the old number
        before the crash still downloads its base; raises when none is held."""
        held = self.renumbered(number)
        if self.versions.get(held) is None:
            raise VersionNotFoundError(f"model version {number} is not held (current: "
                                       f"{self.version}); fetch the latest", version=number)
        return held

    def copy(self, number: int | None = None) -> ModelState:
        number = self.version if number is None else number
        v = self.versions.get(self._require(number))
        assert v is not None
        return v.model.clone()

    def payload(self, number: int, codec: str, count: Callable[[int], None]) -> AsyncIterator[bytes]:
        """The wire payload of a held version, under the number asked for (an old number of a
        renumbered version names the same weights); raises now when it is not held."""
        return self._stream(number, self._require(number), codec, count)

    async def _stream(self, number: int, held: int, codec: str,
                      count: Callable[[int], None]) -> AsyncIterator[bytes]:
        v = self.versions.acquire(held)
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


async def _wait_out(future: asyncio.Future[bool]) -> bool:
    """Wait until ``future`` is done, even when cancelled meanwhile; True when that happened."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait({future})
        except asyncio.CancelledError:
            cancelled = True
    return cancelled
