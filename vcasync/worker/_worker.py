"""The worker loop: join, lease, fetch the model, train, upload the result, repeat.

``Worker(url, trainer, state_dir=...)`` runs a user's trainer (see :mod:`vcasync.trainer`) on the
units a coordinator hands out, until the run is finished or the worker is told to stop.

Preemption: :meth:`Worker.request_stop` (the CLI calls it on SIGTERM) sets ``ctx.should_stop``; the
trainer returns at its next step and, within ``grace_period_s``, the worker either keeps the lease and
the trainer's checkpoint in its state dir (``on_preempt="checkpoint"``: a restart with the same state
dir resumes the same lease while it is valid) or uploads a partial result weighted by the steps done
(``"partial"``). A SIGKILL loses only the progress since the trainer's last checkpoint. A trainer
that returns fewer steps than its unit without being asked to stop has its result uploaded as a
partial one all the same (the coordinator queues the rest as a remainder unit), with a warning, once
per worker, that names the likely cause: ``report_progress(step)`` where ``step + 1`` is meant.

Failures: a trainer that raises (``sys.exit()`` in it included: the worker does not exit with it),
or returns a result the coordinator would refuse (checked here before any upload: tensor names,
shapes and dtypes, integer tensors (counters) not below the base, steps within the unit, finite
metrics), releases its lease as a failure, which the coordinator attributes to this worker; a
result the coordinator rejects for its counters all the same (``BLAMED_REASONS``), or refuses for
what its tensors hold where only the coordinator's configuration says so (NaN or Inf, a norm over
its bound: ``TRAINED_TENSOR_REASONS``), counts as such a failure too. The failure's text goes
with the release, and to the log, without the secrets the worker knows (its join credential and
token, its state storage's credentials: :mod:`vcasync._redact`), and cut to
:data:`RELEASE_REASON_CHARS`. It answers a worker that keeps
failing with a back-off (:class:`WorkerBackoffError`: the worker waits that long before it leases
again, so the unit goes to another worker) and then a quarantine (:class:`WorkerQuarantinedError`:
the worker stops with that message). After ``max_trainer_failures`` in a row the worker stops by
itself with a :class:`TrainerError`; so does one that hears the run is finished when its trainer
failed every unit it got (none delivered). A trainer that raises a :class:`ConfigError` (a package
missing on the machine) stops the worker with it, after handing its lease back as nobody's failure.

Outages: every call to the coordinator is retried with capped, jittered backoff while it is down or
restarting, said in a few lines per outage, not one per try (:mod:`vcasync.worker._outage`); failed
heartbeats are said when they start, when the lease has probably expired, and when they recover.
Results are written to the state dir before upload and re-sent until acknowledged: the
lease id makes a re-send harmless. When the coordinator is up but its storage is not (``503
storage_unavailable``), the worker says so ("coordinator's storage unavailable, waiting"), keeps its
result and asks no new work, retrying as often as the coordinator's ``Retry-After`` says.
A worker told there is no work now (every unit leased elsewhere, the run finishing) asks again as
often as the coordinator says, and logs so when the wait starts and every :data:`WAITING_LOG_S`.
A coordinator that said the run is finished (``410 run_finished``: at a lease request, a join or a
heartbeat) and is unreachable afterwards has stopped lingering: the worker is done, and exits as
finished at once instead of retrying for ``give_up_after_s``.

State anywhere: ``Worker(..., state="s3://bucket/workers/w7")`` keeps identity, lease and checkpoints
in a storage backend (see :mod:`vcasync.worker._remote_state`), so a replacement *machine* given the same URL
resumes the lease from its last checkpoint; ``state_dir`` is then only a local cache (a temporary
directory when omitted). A second live worker on the same state URL is refused; so is one on a
``state_dir`` in use (a lock held for the worker's life), once the holder has had its grace period
and 10 s more to exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import math
import os
import random
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from .. import _owner_lease
from .._redact import Redactor, bounded, env_secrets, option_secrets, url_secrets
from ..errors import (
    AuthError,
    ConfigError,
    CoordinatorGoneError,
    LeaseExpiredError,
    LeaseNotFoundError,
    LedgerError,
    NotLeaseHolderError,
    NoWorkAvailableError,
    StateInUseError,
    StorageUnavailableError,
    TrainerError,
    UnitClosedError,
    ValidationError,
    VCAsyncError,
    WorkerBackoffError,
    WorkersFullError,
)
from ..ledger._plain import text_problem
from ..ledger._units import BLAMED_REASONS, LeaseGrant, Receipt
from ..protocol._bodies import MAX_WORKER_NAME, ResultMeta, to_body
from ..retry import WORKER_BACKOFF as WORKER_BACKOFF  # the coordinator CLI reads it here (its room)
from ..retry import RetryPolicy, is_transient
from ..storage import Storage
from ..tensors import ModelState
from ..trainer import TrainContext, Trainer, TrainResult
from ..wire import Limits, resolve_codec
from ._client import CoordinatorClient, client_ssl_context, plain_http_hint, tls_problem
from ._io import ModelCache, result_problem, result_tensors, spool_result
from ._outage import CallOutage, HeartbeatSilence, failure_name
from ._remote_state import RemoteStateDir
from ._state_dir import Identity, StateDir

__all__ = ["Worker", "WorkerConfig", "WorkerReport"]

log = logging.getLogger("vcasync.worker")
T = TypeVar("T")

#: The most characters of a failure a released lease carries (the coordinator keeps 300 of them).
RELEASE_REASON_CHARS = 300
#: How long a preempted worker tries to tell the coordinator it keeps its lease (one heartbeat).
STOPPING_NOTICE_S = 2.0
#: How long a worker exiting cleanly tries to tell the coordinator it leaves (``POST /v1/leave``).
LEAVE_NOTICE_S = 2.0
#: How long a worker whose trainer raised a ConfigError tries to hand its lease back before it exits.
CONFIG_ERROR_RELEASE_S = 10.0
#: The least time a heartbeat is given to be answered before it counts as failed (its interval when
#: longer, ``request_timeout_s`` when shorter).
HEARTBEAT_MIN_WAIT_S = 1.0
#: While no work can be leased (every unit leased elsewhere, the run finishing), the worker says
#: so when the wait starts and again every this many seconds.
WAITING_LOG_S = 60.0

_LEASE_GONE = (LeaseNotFoundError, NotLeaseHolderError, UnitClosedError, LeaseExpiredError)
#: Reasons of a ``422`` refusal of an upload for what the trainer's tensors hold, which the worker
#: cannot check before uploading (it does not know the coordinator's ``require_finite`` and
#: ``max_update_norm``): NaN or Inf, a norm over the bound. The same trainer does it again on the
#: next unit, so such a refusal is a trainer failure toward ``max_trainer_failures``, as a result
#: rejected for its counters is (``BLAMED_REASONS``).
TRAINED_TENSOR_REASONS = frozenset({"non_finite", "norm_too_large"})


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker behaves; credentials are passed to :class:`Worker` separately (never in a repr)."""

    name: str = ""
    grace_period_s: float = 20.0
    on_preempt: Literal["checkpoint", "partial"] = "checkpoint"
    #: ``delta`` (:func:`vcasync.tensors.make_delta`: ``t - base``, bools as values) or ``weights``;
    #: both merge to the same integer counters (the coordinator reads full weights as increments).
    upload: Literal["delta", "weights"] = "delta"
    codec: str = "raw"
    #: Delays between calls to a coordinator that is down: retried as long as the worker runs
    #: (``attempts`` is not used), each wait drawn from the policy (capped, full jitter).
    backoff: RetryPolicy = field(default_factory=lambda: WORKER_BACKOFF)
    #: Stop after taking this many units (tests, batch jobs): every lease it takes counts, a new one
    #: or one resumed from its state, whatever came of it (delivered, failed, handed back, lost);
    #: None: until the run is finished.
    max_units: int | None = None
    request_timeout_s: float = 60.0
    ca_file: Path | None = None
    keep_models: int = 2
    max_trainer_failures: int = 3
    limits: Limits = field(default_factory=Limits)
    #: With a remote ``state``: checkpoints kept per lease, and the owner record's time to live.
    keep_checkpoints: int = 2
    state_lease_s: float = 30.0
    #: With a remote ``state``: run (with a loud warning) on a store that ignores conditional writes
    #: instead of refusing it; then only you keep a second worker off the same state.
    allow_unsafe_store: bool = False
    #: Give up (an error; lease and checkpoints stay for a restart) once the coordinator has been
    #: unreachable this long without a break: a spot machine whose coordinator is gone for good
    #: must not bill for ever. ``inf``: never.
    give_up_after_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.on_preempt not in ("checkpoint", "partial"):
            raise ConfigError(f"on_preempt must be 'checkpoint' or 'partial', got {self.on_preempt!r}")
        if self.upload not in ("delta", "weights"):
            raise ConfigError(f"upload must be 'delta' or 'weights', got {self.upload!r}")
        if not (self.grace_period_s > 0 and math.isfinite(self.grace_period_s)):  # NaN fails `<= 0` too
            raise ConfigError(f"grace_period_s must be a finite number > 0, got {self.grace_period_s!r}")
        if self.grace_period_s > _owner_lease.MAX_TTL_S:
            raise ConfigError(f"grace_period_s must be at most {_owner_lease.MAX_TTL_S:g} s (a day), "
                              f"got {self.grace_period_s!r}")
        if self.keep_models < 1:
            raise ConfigError("keep_models must be at least 1")
        # Each was taken as it came and found wrong only late: a codec at the first upload, after
        # a unit's training; max_units 0, a worker that can do nothing; a state lease of 0 s.
        checks = [
            (self.max_units is None or self.max_units >= 1,
             f"max_units must be >= 1 or None, got {self.max_units}"),
            (self.request_timeout_s > 0, f"request_timeout_s must be > 0, got {self.request_timeout_s}"),
            (self.max_trainer_failures >= 1,
             f"max_trainer_failures must be >= 1, got {self.max_trainer_failures}"),
            (self.keep_checkpoints >= 1, f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}"),
            (self.state_lease_s >= _owner_lease.MIN_TTL_S,
             f"state_lease_s must be >= {_owner_lease.MIN_TTL_S:g} s (renewed every third of it, each "
             "renewal several storage round trips: a shorter lease gets a live worker's state taken "
             f"over), got {self.state_lease_s}"),
            (not self.state_lease_s > _owner_lease.MAX_TTL_S,
             f"state_lease_s must be at most {_owner_lease.MAX_TTL_S:g} s (a day: a replacement "
             f"machine waits up to this long for a dead worker's state), got {self.state_lease_s}"),
            (self.give_up_after_s > 0,
             f"give_up_after_s must be > 0 (inf: never), got {self.give_up_after_s}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        # refused by the coordinator at the join (a FrameError, exit 1: "restart") or by the
        # client's encoder (a TypeError traceback, for bytes that are not UTF-8), the state dir made
        if not isinstance(self.name, str) or len(self.name) > MAX_WORKER_NAME:
            raise ConfigError(f"name (--name) must be a string of at most {MAX_WORKER_NAME} "
                              f"characters, got {bounded(repr(self.name), 60)}")
        bad_name = text_problem(self.name, "name (--name)")
        if bad_name is not None:
            raise ConfigError(bad_name)
        resolve_codec(self.codec)     # an unknown codec names the known ones
        if not isinstance(self.backoff, RetryPolicy) or self.backoff.base_delay_s <= 0:
            raise ConfigError(f"backoff must be a RetryPolicy with base_delay_s > 0 (the worker retries "
                              f"a coordinator that is down without end), got {self.backoff!r}")


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """Why :meth:`Worker.run` returned and what it got done: in that call, not in earlier ones."""

    reason: Literal["finished", "preempted", "max_units"]
    worker_id: str
    results_accepted: int
    results_refused: int
    units_abandoned: int
    grace_exceeded: bool = False


class _Stopped(Exception):
    """Internal: the worker was asked to stop while waiting."""


class Worker:
    """Trains units for one coordinator until the run is finished, or :meth:`request_stop`."""

    def __init__(self, coordinator_url: str, trainer: Trainer, *, state_dir: Path | str | None = None,
                 state: str | Storage | None = None, state_options: Mapping[str, Any] | None = None,
                 join_secret: str | None = None, join_token: str | None = None,
                 config: WorkerConfig | None = None, rng: random.Random | None = None) -> None:
        self.url = coordinator_url.rstrip("/")
        self.trainer = trainer
        self.config = config or WorkerConfig()
        self.state = _state(state_dir, state, state_options, self.config)
        self._credential = join_token or join_secret
        #: Failure text (a trainer's exception) goes to the coordinator and the log without these.
        state_url = state if isinstance(state, str) else str(getattr(state, "url", "") or "")
        self._redact = Redactor([join_token, join_secret, *url_secrets(state_url),
                                 *option_secrets(state_options), *env_secrets()])
        self._credential_what = (("token", "VCASYNC_JOIN_TOKEN") if join_token else
                                 ("secret", "VCASYNC_JOIN_SECRET or --join-secret-file"))
        self._rng = rng or random.Random()
        self._client: CoordinatorClient | None = None
        self._ident: Identity | None = None
        self._models = ModelCache(self.state, limits=self.config.limits, keep=self.config.keep_models)
        self._stop = asyncio.Event()
        self._unit_stop: threading.Event | None = None
        self._grace: asyncio.Timeout | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepted = self._refused = self._abandoned = self._taken = 0
        self._trainer_failures = 0      # units this worker's trainer failed (raised, or a bad result)
        self._blamed = 0                # of the refused results, those refused for the trainer's doing
        self._warned_unreported = False  # the trainer's "no report_progress" warning is given once
        self._warned_short = False      # and its "returned short, not asked to stop" warning
        #: The coordinator said the run is finished (``410 run_finished``): once it is gone, it is
        #: done lingering, and there is nothing left to wait for.
        self._finish_heard = False
        #: Heard at a heartbeat: the address now serves another run while this worker holds a
        #: lease of its own (:meth:`_rejoin`); the unit stops and the worker stops with it.
        self._run_moved: ConfigError | None = None

    def __repr__(self) -> str:
        return f"Worker({self.url!r}, state_dir={str(self.state.root)!r})"

    # -- stopping ----------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """The preemption notice: stop at the next step and wrap up within ``grace_period_s``.

        Safe to call from a signal handler on the loop, or from any thread.
        """
        loop = self._loop
        if loop is not None and loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                loop.call_soon_threadsafe(self._stop_now)
                return
        self._stop_now()

    def _stop_now(self) -> None:
        if self._stop.is_set():
            return
        log.info("stop requested: wrapping up within %.1fs", self.config.grace_period_s)
        self._stop.set()
        if self._unit_stop is not None:
            self._unit_stop.set()
        if self._grace is not None and self._loop is not None:
            self._grace.reschedule(self._loop.time() + self.config.grace_period_s)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but raise :class:`_Stopped` as soon as a stop is requested."""
        if self.stopping:
            raise _Stopped
        try:
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        except TimeoutError:
            return
        raise _Stopped

    # -- running -----------------------------------------------------------------------------------
    async def run(self) -> WorkerReport:
        """Work until the run is finished, ``max_units`` are taken, or a stop was requested.

        The report (and ``max_units``) counts this call's units only: a second ``run()`` of the same
        worker starts its counts from 0."""
        self._loop = asyncio.get_running_loop()
        # per run, not per object: a second run() of a finished run said "finished 2" for nothing
        # delivered, and one after max_units returned at once, having taken nothing
        self._accepted = self._refused = self._abandoned = self._taken = 0
        self._trainer_failures = self._blamed = 0
        self._run_moved = None
        if self._stop.is_set():
            # stopped before it started (a SIGTERM while ``vcasync worker`` imported torch): it
            # holds nothing new, and a lease, checkpoint or result in its state waits for a restart
            log.info("stopped before it started: nothing joined or leased; the state in %s is kept "
                     "for a restart", self.state.where)
            return WorkerReport(reason="preempted", worker_id="", results_accepted=0,
                                results_refused=0, units_abandoned=0)
        ssl_ctx = client_ssl_context(self.config.ca_file) if self.url.startswith("https://") else None
        grace_exceeded = False
        leave_by: float | None = None
        async with CoordinatorClient(self.url, ssl_context=ssl_ctx,
                                     timeout_s=self.config.request_timeout_s) as client:
            self._client = client
            try:
                async with self.state.session(self.request_stop), asyncio.timeout(None) as grace:
                    self._grace = grace
                    if self.stopping:
                        grace.reschedule(self._loop.time() + self.config.grace_period_s)
                    reason = await self._main()
                    if reason == "finished":
                        await self._remember_finished()
                    leave_by = grace.when()
            except TimeoutError as exc:
                if not self._grace or not self._grace.expired():
                    await self._leave(client, _error_reason(exc), None)
                    raise
                log.warning("grace period of %.1fs exceeded; leaving the lease for a restart",
                            self.config.grace_period_s)
                reason, grace_exceeded = "preempted", True
            except StateInUseError:
                raise       # another live worker holds this state, and this identity: it is not leaving
            except Exception as exc:
                # An error ends the worker (exit 1, 2 or 4): it says so as a clean exit does, within
                # the same bound, so the status stops counting it alive at once instead of after
                # twice the lease timeout. Its lease stays as it is, for a restart or its expiry.
                await self._leave(client, _error_reason(exc), None)
                raise
            finally:
                self._grace = None
                self._client = None
            if not grace_exceeded:
                await self._leave(client, reason, leave_by)
        worker_id = self._ident.worker_id if self._ident else ""
        return WorkerReport(reason=reason, worker_id=worker_id, results_accepted=self._accepted,
                            results_refused=self._refused, units_abandoned=self._abandoned,
                            grace_exceeded=grace_exceeded)

    async def _main(self) -> Literal["finished", "preempted", "max_units"]:
        try:
            await self._ensure_identity()
            await self._deliver_pending()
            grant = await self._restore_lease()
            failures = 0
            while not self.stopping:
                if self.config.max_units is not None and self._taken >= self.config.max_units:
                    self._check_delivered(f"its max_units ({self.config.max_units}) were taken")
                    return "max_units"
                if grant is None:
                    grant = await self._next_lease()
                    if grant is None:
                        self._check_delivered("the run is finished")
                        return "finished"
                self._taken += 1     # the units taken, not only those delivered: max_units
                ok = await self._work(grant)
                grant = None
                failures = 0 if ok else failures + 1
                self._trainer_failures += not ok
                if failures >= self.config.max_trainer_failures:
                    raise TrainerError(f"the trainer failed {failures} units in a row; its errors "
                                       "are in the log above")
        except _Stopped:
            pass
        except NoWorkAvailableError as exc:
            # 410 run_finished outside a lease request (a join, a heartbeat, a coordinator gone
            # after saying so): the run is over for this worker too, which is its job done.
            if not exc.finished:
                raise
            log.info("the run is finished: %s", exc)
            self._check_delivered("the run is finished")
            return "finished"
        return "preempted"

    async def _remember_finished(self) -> None:
        """Keep in the state that this identity's run is finished: a restart (a supervisor that
        restarts every exit, as Kubernetes does) that then finds the coordinator gone is done at
        once, instead of retrying for ``give_up_after_s`` against a coordinator that will not come
        back for a finished run (:meth:`_identity_of_this_run`)."""
        if self._ident is None or self._ident.finished:
            return
        self._ident = dataclasses.replace(self._ident, finished=True)
        try:
            await asyncio.to_thread(self.state.save_identity, self._ident)
        except OSError as exc:
            log.warning("could not note in %s that the run is finished (%s); a restart retries the "
                        "coordinator for --give-up-after", self.state.where, exc)

    async def _leave(self, client: CoordinatorClient, reason: str, grace_ends: float | None) -> None:
        """Tell the coordinator this worker exits (``POST /v1/leave``), so that its status stops
        counting it alive at once rather than after twice the lease timeout: best effort, within
        :data:`LEAVE_NOTICE_S` and what is left of a grace period; any failure is only logged."""
        if self._ident is None or not client.token:
            return          # never joined: nothing to say
        assert self._loop is not None
        wait = LEAVE_NOTICE_S
        if grace_ends is not None:
            wait = min(wait, grace_ends - self._loop.time())
        if wait <= 0:
            return
        try:
            async with asyncio.timeout(wait):
                await client.leave(reason)
        except Exception as exc:    # a coordinator gone, slow or older (404): it finds out later
            log.info("could not tell the coordinator this worker leaves (%s); it shows it gone once "
                     "it has not heard from it for a while", type(exc).__name__)

    def _check_delivered(self, why: str) -> None:
        """The worker is done (``why``: the run is finished, or it took its ``max_units``): one whose
        trainer failed every unit it got, so that it delivered nothing, did not do its job (the run
        may have ended with those units parked after failing here): a :class:`TrainerError` (exit
        1), not a plain "finished". A result refused for what the trainer made of it (a NaN, a
        counter that went down) is no delivery: until 2026-12-07 it counted as one, and ``--max-units
        1`` whose one result was refused as non-finite exited 0."""
        if self._trainer_failures and not (self._accepted or self._refused - self._blamed):
            raise TrainerError(f"{why} and this worker delivered no result: its trainer failed all "
                               f"{self._trainer_failures} unit(s) it was given; its errors are in the "
                               "log above")

    # -- calls with retry --------------------------------------------------------------------------
    def _cli(self) -> CoordinatorClient:
        assert self._client is not None, "only inside run()"
        return self._client

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]], *, interruptible: bool = True,
                    rejoin: bool = True) -> T:
        """``fn()`` retried with backoff while the coordinator is unreachable, and as often as it
        asks while its storage is unavailable; re-joins on 401 (unless not ``rejoin``: a join)."""
        attempt = 0
        rejoined = not rejoin
        storage_down = False
        unreachable_since: float | None = None
        # one WARNING when an outage starts, a summary a minute while it lasts, one INFO at its end
        outage = CallOutage(what, self.config.backoff, self.config.give_up_after_s)
        while True:
            try:
                answer = await fn()
            except AuthError:
                outage.answered(time.monotonic())
                if rejoined:
                    raise
                log.warning("%s: the coordinator no longer knows our token; joining again", what)
                rejoined = True
                attempt, unreachable_since = 0, None     # it answered: an outage after is new
                await self._rejoin()
                continue
            except NoWorkAvailableError as exc:
                outage.answered(time.monotonic())
                if exc.finished:
                    self._finish_heard = True
                raise
            except StorageUnavailableError as exc:
                outage.answered(time.monotonic())
                # it answered: --give-up-after counts an outage after this one from its own start
                # (counted from the call's first failure, an unreachable try after an hour of
                # "storage unavailable" gave up at once, "unreachable for 3600 s")
                attempt, unreachable_since = 0, None
                # The coordinator is up but cannot make anything durable: wait as long as it
                # asks, keeping what we hold (a spooled result stays on disk until acknowledged).
                delay = max(0.05, exc.retry_after) * self._rng.uniform(0.5, 1.0)
                if not storage_down:
                    log.warning("%s: coordinator's storage unavailable, waiting (%s); retrying as "
                                "often as it says", what, exc)
                storage_down = True
            except Exception as exc:
                if not is_transient(exc):
                    problem = tls_problem(exc, self.url, self.config.ca_file)
                    if problem is not None:
                        raise problem from exc
                    if isinstance(exc, VCAsyncError):       # the coordinator's refusal: it answered
                        outage.answered(time.monotonic())
                    raise
                if self._finish_heard:
                    # It said the run is finished and has stopped lingering since: nobody will
                    # answer, and nothing is left to do (exit 0, not --give-up-after's error).
                    log.info("%s: the coordinator at %s is gone (%s) after it said the run is "
                             "finished: nothing left to do", what, self.url, type(exc).__name__)
                    raise NoWorkAvailableError(
                        f"{what}: the coordinator at {self.url} is gone ({type(exc).__name__}) after "
                        "it said the run is finished", finished=True) from exc
                attempt += 1
                now = time.monotonic()
                unreachable_since = now if unreachable_since is None else unreachable_since
                if now - unreachable_since >= self.config.give_up_after_s:
                    raise CoordinatorGoneError(
                        f"{what}: the coordinator at {self.url} has been unreachable for "
                        f"{now - unreachable_since:.0f} s (give_up_after_s, --give-up-after):"
                        " giving up; a restart resumes from the state kept"
                        f"{plain_http_hint(exc, self.url)}") from exc
                # no wait past the give-up time (a 5 s limit gave up after 9-11 s)
                left = self.config.give_up_after_s - (now - unreachable_since)
                delay = min(self.config.backoff.delay(attempt, self._rng), max(left, 0.01))
                outage.failed(exc, now, delay, plain_http_hint(exc, self.url))
            else:
                outage.answered(time.monotonic())
                if storage_down:
                    log.info("%s: the coordinator's storage is back", what)
                return answer
            if interruptible:
                await self._sleep(delay)
            else:
                await asyncio.sleep(delay)

    async def _ensure_identity(self) -> None:
        ident = await self._identity_of_this_run(await asyncio.to_thread(self.state.stored_identity))
        if ident is None:
            try:
                await self._call("join", self._join, rejoin=False)
            except AuthError as exc:
                # Our first join: the credential we were given is wrong, which no retry mends. It
                # was taken for a token the coordinator forgot ("joining again", then exit 1).
                kind, source = self._credential_what
                raise ConfigError(f"the coordinator at {self.url} refused this worker's join {kind} "
                                  f"({exc}): set {source} to the coordinator's") from exc
            return
        self._ident = ident
        self._cli().token = ident.token
        log.info("worker %s: resuming with the identity in %s", ident.worker_id, self.state.where)

    async def _identity_of_this_run(self, stored: Identity | None) -> Identity | None:
        """The saved identity if it belongs to the run the coordinator serves, else None (join).

        A run is its run id, not the URL that reaches it: a coordinator restarted on another port,
        or reached by a hostname instead of its address, serves the same run, and the worker keeps
        its id, its lease and its checkpoint. The run id comes from ``/healthz``, so the token goes
        to no coordinator of another run. An identity saved before identities named their run
        (or by a coordinator that does not say) is kept at its own URL only, as it always was, and
        learns its run there."""
        if stored is None:
            return None
        heard = self._finish_heard
        if stored.finished:
            # Its coordinator said the run is finished before this process started: if it does not
            # answer now, it has stopped lingering, and there is nothing left to do (exit 0). One
            # that answers says again, or serves more work (requeued units, a new run) as usual.
            log.info("the state in %s says run %s is finished; asking the coordinator at %s whether "
                     "it serves anything more", self.state.where, stored.run_id, self.url)
            self._finish_heard = True
        try:
            served = await self._call("run id", self._cli().served_run, rejoin=False)
        finally:
            self._finish_heard = heard
        if stored.run_id is None or served is None:
            if stored.coordinator != self.url:
                log.info("the identity in %s is for %s, not %s, and does not name its run: joining "
                         "as a new worker", self.state.where, stored.coordinator, self.url)
                return None
            # a token of another run at this URL is refused at the first call: joined again then
            ident = Identity(self.url, stored.worker_id, stored.token, served or stored.run_id)
        elif stored.run_id != served:
            held = await asyncio.to_thread(self._work_held)
            if held:
                # Joining run B here would drop run A's lease and checkpoint (and show run A's lease
                # id to run B): the state goes untouched; the operator says which run it is for.
                raise ConfigError(
                    f"the worker state in {self.state.where} belongs to run {stored.run_id} (worker "
                    f"{stored.worker_id}) and holds {held} of it, but the coordinator at {self.url} "
                    f"serves run {served}: point this worker at run {stored.run_id}'s coordinator to "
                    f"finish that work, or give it another --state-dir/--state for run {served} (or "
                    "remove the old state if that work is not wanted); nothing was changed")
            log.info("the identity in %s (worker %s) belongs to run %s and holds no work of it; the "
                     "coordinator at %s serves run %s: joining as a new worker", self.state.where,
                     stored.worker_id, stored.run_id, self.url, served)
            return None
        else:
            ident = Identity(self.url, stored.worker_id, stored.token, served)
            if stored.coordinator != self.url:
                log.info("run %s is now at %s (was %s): keeping worker %s, its lease and checkpoints",
                         served, self.url, stored.coordinator, stored.worker_id)
        if ident != stored:
            await asyncio.to_thread(self.state.save_identity, ident)
        return ident

    def _work_held(self) -> str:
        """What of its run the state holds ("" for nothing): a lease, results not yet delivered."""
        parts = []
        grant = self.state.load_lease()
        if grant is not None:
            parts.append(f"lease {grant.lease_id} (unit {grant.unit.unit_id})")
        pending = len(self.state.pending_results())
        if pending:
            parts.append(f"{pending} undelivered result(s)")
        return " and ".join(parts)

    async def _rejoin(self) -> None:
        """Join again: the coordinator no longer knows our token. The same check as at start
        (:meth:`_identity_of_this_run`): a coordinator of *another run* now at this address while
        this state holds work of ours is a :class:`ConfigError`, the state untouched (joined, the
        worker uploaded its old lease's result there, "never issued here", and dropped it, and a
        restart pointed back at its run found the lease gone)."""
        await self._identity_of_this_run(self._ident)
        await self._join()

    async def _join(self) -> None:
        if not self._credential:
            raise ConfigError("no join credential: set VCASYNC_JOIN_SECRET (or VCASYNC_JOIN_TOKEN)")
        info = {"host": socket.gethostname(), "pid": os.getpid(),
                "previous": self._ident.worker_id if self._ident else ""}
        while True:
            try:
                worker_id, token = await self._cli().join(self._credential, self.config.name, info)
                break
            except WorkersFullError as exc:
                # the coordinator holds its max_workers records (503 workers_full): it registers
                # us once some are forgotten: wait, rather than end the worker on a refusal for now
                log.warning("join refused for now, waiting %.0f s: %s", exc.retry_after,
                            self._scrub(str(exc)))
                await self._sleep(max(0.05, exc.retry_after) * self._rng.uniform(1.0, 1.1))
        self._ident = Identity(self.url, worker_id, token, self._cli().run_id or None)
        await asyncio.to_thread(self.state.save_identity, self._ident)
        log.info("joined as worker %s", worker_id)

    # -- leases ------------------------------------------------------------------------------------
    async def _restore_lease(self) -> LeaseGrant | None:
        saved = await asyncio.to_thread(self.state.load_lease)
        if saved is None:
            return None
        try:
            grant = await self._call("resume", lambda: self._cli().resume(saved.lease_id))
        except LedgerError as exc:
            log.info("lease %s cannot be resumed (%s); starting fresh", saved.lease_id, type(exc).__name__)
            await asyncio.to_thread(self.state.finish_lease, saved.lease_id)
            return None
        log.info("resumed lease %s (unit %s)", grant.lease_id, grant.unit.unit_id)
        return grant

    async def _next_lease(self) -> LeaseGrant | None:
        waiting_since: float | None = None      # told "no work now, ask again" since
        said_at = 0.0
        while True:
            try:
                grant = await self._call("lease", self._cli().lease)
                if waiting_since is not None:
                    log.info("work again after %.0f s without", time.monotonic() - waiting_since)
                return grant
            except WorkerBackoffError as exc:
                # Our last units failed: the coordinator gives them to other workers first. Wait
                # the whole back-off (asking earlier only gets the same answer).
                log.warning("backing off %.2fs: %s", exc.retry_after, self._scrub(str(exc)))
                await self._sleep(max(0.05, exc.retry_after) * self._rng.uniform(1.0, 1.1))
            except NoWorkAvailableError as exc:
                if exc.finished:
                    log.info("the run is finished")
                    return None
                cap = self.config.backoff.max_delay_s
                wait = min(cap, max(0.05, exc.retry_after))
                # Said when the wait starts and every WAITING_LOG_S while it lasts: a worker that
                # sat silent for minutes (the last units leased elsewhere, a run finishing) looked hung.
                now = time.monotonic()
                if waiting_since is None:
                    waiting_since = said_at = now
                    log.info("no work to lease now: %s; asking again every %.1f s or less",
                             self._scrub(str(exc)), wait)
                elif now - said_at >= WAITING_LOG_S:
                    said_at = now
                    log.info("still no work to lease after %.0f s: %s", now - waiting_since,
                             self._scrub(str(exc)))
                await self._sleep(wait * self._rng.uniform(0.5, 1.0))

    # -- one unit ----------------------------------------------------------------------------------
    async def _work(self, grant: LeaseGrant) -> bool:
        """Train and deliver one unit; False only when the trainer raised."""
        granted_at = time.monotonic()       # the grant just came: its deadline counts from about now
        await asyncio.to_thread(self.state.save_lease, grant)
        try:
            base = await self._model(grant.base_version)
        except LedgerError as exc:  # the coordinator no longer has that version: too stale to train
            log.warning("model v%d for lease %s is gone (%s)", grant.base_version, grant.lease_id, exc)
            await self._release(grant, "base model unavailable", failed=False, preempted=False)
            return True
        unit_stop = threading.Event()
        if self.stopping:
            unit_stop.set()
        self._unit_stop = unit_stop
        ckpt = self.state.checkpoint_path(grant.lease_id)
        ctx = TrainContext(unit=grant.unit, lease_id=grant.lease_id, base_version=grant.base_version,
                           model=base.clone(), checkpoint_path=ckpt, resumed=grant.resumed, stop=unit_stop,
                           on_checkpoint=lambda: self.state.checkpoint_saved(grant.lease_id))
        lost = asyncio.Event()
        try:
            result = await self._train(grant, ctx, lost, granted_at)
        except (_Stopped, StateInUseError):
            raise          # a takeover of the state: its new holder resumes this lease, never released
        except ConfigError as exc:
            # The trainer's configuration error (a package missing on this machine, an option it
            # refuses): the worker stops with it (exit 2, a restart cannot help), but hands the unit
            # back first, so it is queued again at once instead of when the lease times out.
            log.error("trainer on unit %s: configuration error: %s", grant.unit.unit_id,
                      self._scrub(str(exc)))
            self._abandoned += 1
            await self._release_config_error(grant, exc)
            raise
        except TrainerError as exc:
            # The trainer returned something that is not a result (None): a bug in its code, so the
            # worker stops; but it hands the unit back first, as for a trainer that raised, instead
            # of leaving it leased to nobody until the lease times out.
            self._abandoned += 1
            await self._release(grant, f"trainer error: {exc}")
            raise
        except Exception as exc:       # the trainer raised (or exited: _TrainerExited)
            logged, reason = _trainer_failure(exc)
            log.error("trainer failed on unit %s: %s", grant.unit.unit_id, self._scrub(logged))
            self._abandoned += 1
            await self._release(grant, f"trainer error: {reason}")
            return False
        finally:
            self._unit_stop = None
        if self._run_moved is not None:
            log.error("%s", self._run_moved)
            raise self._run_moved
        if lost.is_set() and self._finish_heard:
            log.info("the run is finished (said at a heartbeat): dropping unit %s, which another "
                     "worker delivered or which was parked", grant.unit.unit_id)
            self._abandoned += 1
            await asyncio.to_thread(self.state.finish_lease, grant.lease_id)
            return True
        if lost.is_set():
            log.warning("lease %s was lost; dropping unit %s", grant.lease_id, grant.unit.unit_id)
            self._abandoned += 1
            await asyncio.to_thread(self.state.finish_lease, grant.lease_id)
            return True
        # stopped before its first step (or its first after a resume), a trainer that reports every
        # step reported none: said so by steps= to ctx.result, it is not one that never reports (the
        # demo's own trainer was warned about, "call ctx.report_progress", and its steps "unknown")
        said = ctx.should_stop and ctx.steps_given
        if not ctx.progress_reported and not said:
            self._warn_unreported(grant, result)
        measured = result.steps > 0 or ctx.progress_reported
        unknown = not measured and not said          # not measured nor said: not "0 steps"
        partial = result.steps < grant.unit.steps
        if self.stopping and partial and self.config.on_preempt == "checkpoint" and measured:
            log.info("preempted after %d/%d steps of unit %s; the lease and checkpoint stay in %s",
                     result.steps, grant.unit.steps, grant.unit.unit_id, self.state.where)
            await self._say_stopping(grant, result.steps)
            raise _Stopped
        if result.steps <= 0:
            # Nothing to send (a result needs at least one step): hand the unit back at once
            # instead of uploading something the coordinator must refuse.
            if self.stopping:
                if unknown:
                    log.info("stopped during unit %s; the trainer reports no progress, so the steps it "
                             "did are unknown: releasing its lease", grant.unit.unit_id)
                    await self._release(grant, "stopped; the trainer reported no progress", failed=False)
                    return True
                log.info("preempted before the first step of unit %s; releasing its lease",
                         grant.unit.unit_id)
                await self._release(grant, "preempted before the first step", failed=False)
                return True
            log.error("the trainer returned after 0 steps of unit %s%s", grant.unit.unit_id,
                      _short_cause(ctx) if ctx.progress_reported and not ctx.steps_given else "")
            self._abandoned += 1
            await self._release(grant, "the trainer did no steps")
            return False
        problem = result_problem(base, result, grant.unit)
        if problem is not None:
            # Refused for certain by the coordinator (several times, then a quarantine): a trainer
            # failure found here, counted as one whose trainer raised, whatever the upload mode.
            log.error("trainer failed on unit %s: %s", grant.unit.unit_id, problem)
            self._abandoned += 1
            await self._release(grant, f"trainer error: {problem}")
            return False
        if partial and not ctx.should_stop:
            self._warn_short(grant, ctx, result)
        if self.stopping and partial:      # --on-preempt partial: shown preempted as it delivers
            await self._say_stopping(grant, result.steps)
        return await self._deliver(grant, base, result, partial=partial)

    def _warn_short(self, grant: LeaseGrant, ctx: TrainContext, result: TrainResult) -> None:
        """A trainer not asked to stop returned fewer steps than its unit: its result is uploaded as a
        partial one, weighted by its steps, and the coordinator queues the rest as a remainder unit
        (real work is not thrown away). Said once per worker as a warning, naming the likely cause
        (``report_progress(step)`` for ``step + 1``: every unit a partial of one step less, each
        remainder then "returned after 0 steps", and the worker gave up), then at INFO."""
        unit = grant.unit
        said = (f"passed steps={result.steps} to ctx.result" if ctx.steps_given
                else f"reported {result.steps} steps done")
        text = (f"trainer {_trainer_name(self.trainer)} returned unit {unit.unit_id} after "
                f"{result.steps} of its {unit.steps} steps without being asked to stop (it {said}): "
                f"uploading it as a partial result of {result.steps} steps; the coordinator queues "
                f"the other {unit.steps - result.steps} as a remainder unit")
        if self._warned_short:
            log.info("%s", text)
            return
        self._warned_short = True
        log.warning("%s%s (see docs/trainer.md)", text, _short_cause(ctx))

    async def _say_stopping(self, grant: LeaseGrant, steps: int) -> None:
        """Tell the coordinator this worker is preempted (one heartbeat with ``stopping``): it
        keeps ``grant`` for a restart to resume (``--on-preempt checkpoint``) or delivers a partial
        result on its way out (``partial``), and its status shows it preempted instead of alive
        (and holding the lease until the lease runs out). Best effort, within a couple of seconds
        of the grace period: nothing depends on it."""
        try:
            async with asyncio.timeout(STOPPING_NOTICE_S):
                await self._cli().heartbeat(grant.lease_id, steps, stopping=True)
        except Exception as exc:      # the coordinator away, the lease gone: it is only a notice
            log.debug("could not tell the coordinator this worker is stopping: %r", exc)

    def _warn_unreported(self, grant: LeaseGrant, result: TrainResult) -> None:
        """Once per worker: the trainer never calls ``ctx.report_progress``, so what the worker and
        the coordinator say of its steps is not measured (see docs/trainer.md)."""
        if self._warned_unreported:
            return
        self._warned_unreported = True
        name = _trainer_name(self.trainer)
        counted = (f"its results count as whole units ({grant.unit.steps} steps for unit "
                   f"{grant.unit.unit_id}) unless it passes steps= to ctx.result"
                   if result.steps > 0 else "its steps are unknown when it is stopped early")
        log.warning("trainer %s does not call ctx.report_progress: %s, and its heartbeats show no "
                    "progress; call ctx.report_progress(step + 1) after each step (see "
                    "docs/trainer.md)", name, counted)

    async def _train(self, grant: LeaseGrant, ctx: TrainContext, lost: asyncio.Event,
                     granted_at: float) -> TrainResult:
        """The trainer, with heartbeats flowing beside it until it returns."""
        beats = asyncio.create_task(self._heartbeats(grant, ctx, lost, granted_at),
                                    name=f"heartbeats-{grant.lease_id}")
        try:
            return await self._run_trainer(ctx)
        finally:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)

    async def _run_trainer(self, ctx: TrainContext) -> TrainResult:
        try:
            if inspect.iscoroutinefunction(self.trainer):
                out: Any = await self.trainer(ctx)
            else:
                out = await _in_daemon_thread(self.trainer, ctx)
                if inspect.isawaitable(out):
                    out = await out
        except SystemExit as exc:   # sys.exit() in the trainer's code: its failure, not the worker's
            raise _TrainerExited(_trainer_name(self.trainer), exc) from None
        if isinstance(out, TrainResult):
            return out
        if isinstance(out, (torch.nn.Module, Mapping)):
            return ctx.result(out)
        raise TrainerError(f"the trainer returned {type(out).__name__}; return ctx.result(module) or a "
                           "TrainResult")

    async def _heartbeats(self, grant: LeaseGrant, ctx: TrainContext, lost: asyncio.Event,
                          granted_at: float) -> None:
        """Heartbeats every ``heartbeat_interval_s`` the coordinator says, until the trainer returns.
        An expired lease keeps heartbeating: progress may revive it, and a unit delivered by
        another worker meanwhile (or a run finished meanwhile) is heard there, while the
        coordinator still answers, instead of at the upload of a result nobody needs.

        A heartbeat gets an answer within the interval (at least :data:`HEARTBEAT_MIN_WAIT_S`, at
        most ``request_timeout_s``) or counts as failed: on a link that drops packets a request
        waited ``request_timeout_s`` (60 s) for nothing while a 20 s lease ran out. Failures are
        said once when they start (with the time left on the lease), once more when the lease has
        probably expired, and once when heartbeats get through again (:class:`HeartbeatSilence`)."""
        interval = max(0.05, grant.heartbeat_interval_s)
        expired = False
        silence = HeartbeatSilence(grant, granted_at)
        while True:
            await asyncio.sleep(interval)
            wait = min(self.config.request_timeout_s, max(interval, HEARTBEAT_MIN_WAIT_S))
            try:
                async with asyncio.timeout(wait):
                    g = await self._cli().heartbeat(grant.lease_id, ctx.steps_done)
            except Exception as exc:  # never let a heartbeat problem kill the unit: the result may count
                if is_transient(exc):
                    why = (f"no answer within {wait:.1f} s" if type(exc) is TimeoutError
                           else failure_name(exc))
                    silence.failed(why, time.monotonic(), interval)
                    continue
                silence.answered(time.monotonic())
                if await self._heartbeat_refused(grant, ctx, lost, exc, expired):
                    return
                expired = expired or isinstance(exc, LeaseExpiredError)
            else:
                silence.answered(time.monotonic(), g)
                interval = max(0.05, g.heartbeat_interval_s)
                expired = False

    async def _heartbeat_refused(self, grant: LeaseGrant, ctx: TrainContext, lost: asyncio.Event,
                                 exc: Exception, expired: bool) -> bool:
        """What a heartbeat's refusal means for the unit; True: stop heartbeating."""
        if isinstance(exc, LeaseExpiredError):
            if not expired:
                log.info("lease %s expired; finishing anyway (a late result may still count)",
                         grant.lease_id)
            return False
        if isinstance(exc, NoWorkAvailableError):
            if not exc.finished:
                log.warning("heartbeat for %s failed: %r", grant.lease_id, exc)
                return False
            self._finish_heard = True
            lost.set()
            ctx.stop_event.set()
            return True
        if isinstance(exc, LeaseNotFoundError | NotLeaseHolderError | UnitClosedError):
            lost.set()
            ctx.stop_event.set()
            return True
        if isinstance(exc, AuthError):
            try:
                await self._rejoin()
            except ConfigError as err:
                # another run at this address: stop the trainer (it checkpoints as when
                # preempted), keep the lease and the checkpoint, and stop with this error
                self._run_moved = err
                ctx.stop_event.set()
                return True
            except Exception as err:
                log.warning("re-joining failed: %s", type(err).__name__)
            return False
        log.warning("heartbeat for %s failed: %r", grant.lease_id, exc)
        return False

    def _scrub(self, text: str) -> str:
        """``text`` without the secrets this worker knows: its join credential, its worker token,
        its state storage's credentials, secret-named environment variables (see
        :mod:`vcasync._redact`)."""
        if self._ident is not None:
            self._redact.add(self._ident.token)
        return self._redact(text)

    async def _release(self, grant: LeaseGrant, reason: str, *, failed: bool = True,
                       preempted: bool = True, interruptible: bool = True) -> None:
        """Hand the lease back; ``failed``: the unit failed here (the coordinator counts it);
        ``preempted`` (with ``failed`` False): shown as a preemption. ``reason`` is scrubbed of
        secrets, then cut to :data:`RELEASE_REASON_CHARS`."""
        reason = bounded(self._scrub(reason), RELEASE_REASON_CHARS)
        with contextlib.suppress(LedgerError):      # expired or closed meanwhile: nothing is held
            await self._call("release", lambda: self._cli().release(grant.lease_id, reason,
                                                                   failed=failed, preempted=preempted),
                             interruptible=interruptible)
        await asyncio.to_thread(self.state.finish_lease, grant.lease_id)

    async def _release_config_error(self, grant: LeaseGrant, exc: ConfigError) -> None:
        """Hand back the lease of a unit the trainer refused with a :class:`ConfigError`, best effort,
        within :data:`CONFIG_ERROR_RELEASE_S`: the worker is about to exit, and need not wait long for
        a coordinator that does not answer. Released with ``failed=False``: the machine's or the run's
        configuration is at fault, not the unit (several misconfigured machines must not park it) nor
        this worker's luck (it stops anyway, so no back-off is needed to keep the unit from it). A
        lease that could not be handed back stays in the state: a restart resumes it, or the
        coordinator re-queues it when it times out."""
        try:
            async with asyncio.timeout(CONFIG_ERROR_RELEASE_S):
                await self._release(grant, f"configuration error: {exc}", failed=False,
                                    preempted=False, interruptible=False)
        except Exception as err:
            log.warning("could not hand lease %s back (%s): the coordinator re-queues unit %s when the "
                        "lease times out", grant.lease_id, type(err).__name__, grant.unit.unit_id)

    # -- models ------------------------------------------------------------------------------------
    async def _model(self, version: int) -> ModelState:
        async def fetch(path: Path, etag: str | None) -> str | None:
            got, _ = await self._call("model", lambda: self._cli().download_model(version, path, etag=etag))
            return got

        return await self._models.get(version, fetch)

    # -- results -----------------------------------------------------------------------------------
    async def _deliver(self, grant: LeaseGrant, base: ModelState, result: TrainResult, *,
                       partial: bool) -> bool:
        """Upload a result; False when the coordinator refused it for what training made of it
        (``BLAMED_REASONS``, ``TRAINED_TENSOR_REASONS``): a failure of the trainer, counted as one
        that raised."""
        tensors = await asyncio.to_thread(result_tensors, base, result, self.config.upload)
        meta = to_body(ResultMeta(grant.lease_id, grant.base_version, self.config.upload,
                                  steps=int(result.steps), samples=int(result.samples), partial=partial,
                                  metrics={k: float(v) for k, v in result.metrics.items()}))
        path = self.state.result_path(grant.lease_id)
        await spool_result(path, meta, tensors, self.config.codec)
        return await self._upload(grant.lease_id, path)

    async def _upload(self, lease_id: str, path: Path) -> bool:
        """Send a spooled result until it is answered; False when it was rejected for a reason
        in ``BLAMED_REASONS`` or refused for one in ``TRAINED_TENSOR_REASONS``."""
        ok = True
        try:
            receipt: Receipt = await self._call("upload", lambda: self._cli().submit(lease_id, path),
                                                interruptible=False)
        except (AuthError, ConfigError, CoordinatorGoneError):
            raise       # not a refusal: the spooled result stays for a restart to send
        except VCAsyncError as exc:  # refused for good (closed unit, expired lease, invalid): drop it
            if isinstance(exc, NoWorkAvailableError) and exc.finished:
                raise           # the coordinator is gone after saying the run is finished: done
            self._refused += 1
            if isinstance(exc, ValidationError) and exc.reason in TRAINED_TENSOR_REASONS:
                # what the trainer made of the tensors (a NaN): it fails the same way on the next
                # unit, so a failure in a row, as a raise; it used to be a warning per unit until
                # the coordinator quarantined this worker (5 in a row), max_trainer_failures unmet
                log.error("result for lease %s refused: %s (the trainer's result; see "
                          "docs/trainer.md)", lease_id, self._scrub(str(exc)))
                self._blamed += 1
                ok = False
            else:
                log.warning("result for lease %s refused: %s", lease_id, exc)
        else:
            await asyncio.to_thread(self.state.record_receipt, receipt)
            if receipt.status == "rejected" and receipt.reason in BLAMED_REASONS:
                # the coordinator blamed this worker's training (a counter that went down or
                # would wrap): an error, and a trainer failure toward max_trainer_failures
                log.error("result for lease %s rejected: %s (the trainer's result broke an integer "
                          "counter; see docs/policies.md, 'Integer and bool tensors')", lease_id,
                          receipt.reason)
                self._refused += 1
                self._blamed += 1
                ok = False
            elif receipt.status == "rejected":
                log.warning("result for lease %s rejected: %s", lease_id, receipt.reason)
                self._refused += 1
            else:
                log.info("result for lease %s (unit %s) %s; model is now v%d", lease_id, receipt.unit_id,
                         receipt.status, receipt.version)
                self._accepted += 1
        await asyncio.to_thread(self.state.finish_lease, lease_id)
        return ok

    async def _deliver_pending(self) -> None:
        for lease_id, path in await asyncio.to_thread(self.state.pending_results):
            log.info("re-sending the result spooled for lease %s", lease_id)
            await self._upload(lease_id, path)


def _state(state_dir: Path | str | None, state: str | Storage | None,
           options: Mapping[str, Any] | None, config: WorkerConfig) -> StateDir:
    """A local state dir, or a remote state with ``state_dir`` (or a temp dir) as its local cache."""
    if state is None:
        if state_dir is None:
            raise ConfigError("a worker needs state_dir (local) or state (a storage URL)")
        return StateDir(Path(state_dir), lock_wait_s=_lock_wait(config))
    # Without state_dir the local cache is a temporary dir, removed when the worker's session ends.
    temporary = state_dir is None
    root = Path(tempfile.mkdtemp(prefix="vcasync-worker-") if state_dir is None else state_dir)
    return RemoteStateDir(root, state, keep_checkpoints=config.keep_checkpoints,
                          lease_ttl_s=config.state_lease_s, options=options, temporary=temporary,
                          allow_unsafe_store=config.allow_unsafe_store, lock_wait_s=_lock_wait(config))


def _lock_wait(config: WorkerConfig) -> float:
    """How long a worker waits for one still using its state dir: a supervisor may restart it while
    the old process wraps up (its grace period, then a moment to exit) before it refuses."""
    return config.grace_period_s + 10.0


def _short_cause(ctx: TrainContext) -> str:
    """The likely cause of a short result a trainer was not asked to stop before, for the log."""
    if ctx.steps_given:
        return ("; a trainer passes steps= below ctx.unit.steps only when ctx.should_stop told it "
                "to stop early")
    return ("; is ctx.report_progress(step) called where ctx.report_progress(step + 1) is meant? "
            "It counts the steps done, so after the last step it reports ctx.unit.steps")


def _trainer_name(trainer: object) -> str:
    """``module:qualname`` of a trainer, as its users wrote it on the command line."""
    t = trainer
    return f"{getattr(t, '__module__', None) or '?'}:{getattr(t, '__qualname__', type(t).__name__)}"


class _TrainerExited(Exception):
    """The trainer raised :class:`SystemExit` (``sys.exit``), or :class:`KeyboardInterrupt` in its
    thread: a failure of that unit, counted as a trainer that raised, not an exit of the worker.
    Private: it never leaves :meth:`Worker._work`, which logs it and releases the lease."""

    def __init__(self, trainer: str, exc: SystemExit | KeyboardInterrupt) -> None:
        if isinstance(exc, SystemExit):
            code = repr(exc.code)
            what = f"called sys.exit({code if len(code) <= 80 else code[:80] + '...'})"
        else:
            what = "raised KeyboardInterrupt"
        super().__init__(f"trainer {trainer} {what}; a trainer returns a result or raises an exception, "
                         "it must not exit the worker: counted as a failed unit")


def _trainer_failure(exc: Exception) -> tuple[str, str]:
    """How the log and the lease's release name a trainer's failure: a :class:`_TrainerExited`
    says everything in its message; any other exception is logged by its repr and released as
    ``Type: message``."""
    if isinstance(exc, _TrainerExited):
        return str(exc), str(exc)
    return repr(exc), f"{type(exc).__name__}: {exc}"


def _in_daemon_thread(fn: Callable[[TrainContext], Any], ctx: TrainContext) -> asyncio.Future[Any]:
    """Run a sync trainer in a daemon thread: a trainer that ignores ``should_stop`` cannot keep a
    preempted process alive past its grace period."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def body() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(ctx))
        except (SystemExit, KeyboardInterrupt) as exc:
            # Only the trainer's code raises these in this thread (a real SIGINT or SIGTERM goes to
            # the main thread): a trainer failure, which must not end the worker with its lease held.
            outcome = (False, _TrainerExited(_trainer_name(fn), exc))
        except BaseException as exc:
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop is gone: the worker gave up on this trainer
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=body, name=f"vcasync-trainer-{ctx.unit.unit_id}", daemon=True).start()
    return fut


def _error_reason(exc: BaseException) -> str:
    """The ``reason`` of the leave a worker ending on ``exc`` sends: ``error: <its type>`` (the
    innermost of an exception group), never its message, which may quote a path or a credential."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"error: {type(exc).__name__}"[:64]
