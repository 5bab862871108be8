"""Capped, jittered exponential backoff for transient faults, and which faults are transient.

One policy type (:class:`RetryPolicy`) and one predicate (:func:`is_transient`) for everything that
talks to something that can hiccup: storage backends, the coordinator's start-up, the worker's calls
to its coordinator (``WorkerConfig.backoff``; the worker's former ``Backoff`` class is gone), and
``vcasync.worker._client.is_transient`` is this module's function, re-exported. Time and randomness are
injected, so tests run retries in zero time and with a fixed seed::

    retrier = Retrier(RetryPolicy(attempts=5), sleep=fake_sleep, rng=random.Random(0))
    data = await retrier.call(lambda: backend_get(key), describe=f"get {key!r}")

The delay before retry ``n`` (1-based) is ``cap * (1 - jitter * u)`` with ``u`` uniform in [0, 1)
and ``cap = min(max_delay_s, base_delay_s * multiplier ** (n - 1))``: "full jitter" when
``jitter == 1``, which spreads a thundering herd of clients best (AWS architecture blog, 2015).

What is transient is one table, :data:`TRANSIENT`: exception class -> verdict (a bool, or a test of
the instance). The most specific listed class in an exception's MRO decides; an exception with no
listed class is not transient. This module lists the standard and vcasync errors; the HTTP client
adds its transport's (aiohttp) errors with :func:`classify` when it is imported, so nothing here
imports a transport.

Logging: the first retry of an operation is INFO, later ones DEBUG (an outage must not bury the log
in retry lines), and giving up is WARNING: the operation failed for good.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeAlias, TypeVar

from .errors import ClosedError, ConfigError, RequestTimeoutError, StorageError, TransientStorageError

__all__ = ["TRANSIENT", "Retrier", "RetryPolicy", "Verdict", "classify", "is_transient"]

T = TypeVar("T")

log = logging.getLogger("vcasync.retry")

#: Whether a retry may cure an exception of one class: a constant, or a test of the instance.
Verdict: TypeAlias = bool | Callable[[BaseException], bool]

#: The one classification table (see the module docstring). Extend it with :func:`classify`.
TRANSIENT: dict[type[BaseException], Verdict] = {
    TransientStorageError: True,     # a backend's timeout, 5xx or throttling (or storage unavailable)
    ClosedError: True,               # the coordinator is stopping: a restarted one will answer
    RequestTimeoutError: True,       # a body cut off as too slow (408): the link, not the request
    ConnectionError: True,           # refused, reset, aborted
    TimeoutError: True,              # asyncio.TimeoutError is the same class
}


def classify(exc_type: type[BaseException], verdict: Verdict) -> None:
    """Say whether ``exc_type`` (and subclasses not listed themselves) is worth another try."""
    if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
        raise ConfigError(f"classify() takes an exception class, got {exc_type!r}")
    if not (isinstance(verdict, bool) or callable(verdict)):
        raise ConfigError(f"a verdict is a bool or a test of the exception, got {verdict!r}")
    TRANSIENT[exc_type] = verdict


def is_transient(exc: BaseException) -> bool:
    """True for failures that a retry may cure; the retry predicate of every :class:`Retrier`."""
    for cls in type(exc).__mro__:
        verdict = TRANSIENT.get(cls)
        if verdict is not None:
            return verdict if isinstance(verdict, bool) else bool(verdict(exc))
    return False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry. ``attempts`` counts the first try (1 = never retry)."""

    attempts: int = 5
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"RetryPolicy.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("base_delay_s", "max_delay_s", "multiplier", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
                raise ConfigError(f"RetryPolicy.{name} must be a number, got {value!r}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ConfigError("RetryPolicy delays must be >= 0")
        if self.multiplier < 1:
            raise ConfigError(f"RetryPolicy.multiplier must be >= 1, got {self.multiplier!r}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter!r}")

    def delay(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (1 = the first retry)."""
        try:
            cap = min(self.max_delay_s, self.base_delay_s * self.multiplier ** (retry - 1))
        except OverflowError:       # a loop that never gives up (the worker's) is long since capped
            cap = self.max_delay_s if self.base_delay_s > 0 else 0.0
        return cap * (1.0 - self.jitter * rng.random())


#: A worker's default waits while its coordinator is unreachable: 0.2 s doubling to at most 10 s.
#: Here, not in the worker, because the coordinator sizes its waits for those workers by it
#: (the grace after a takeover from a crash must outlast a worker's longest retry delay).
WORKER_BACKOFF: Final = RetryPolicy(base_delay_s=0.2, max_delay_s=10.0)


class Retrier:
    """Runs an operation under a :class:`RetryPolicy`; ``sleep`` and ``rng`` are injectable."""

    def __init__(self, policy: RetryPolicy | None = None, *,
                 sleep: Callable[[float], Awaitable[object]] | None = None,
                 rng: random.Random | None = None,
                 retry_on: Callable[[BaseException], bool] = is_transient) -> None:
        self.policy = policy if policy is not None else RetryPolicy()
        self._sleep = sleep if sleep is not None else asyncio.sleep
        self._rng = rng if rng is not None else random.Random()
        self._retry_on = retry_on

    async def backoff(self, retry: int) -> None:
        """Sleep before retry number ``retry`` (for loops that resume rather than repeat)."""
        await self._sleep(self.policy.delay(retry, self._rng))

    async def call(self, op: Callable[[], Awaitable[T]], *, describe: str = "operation",
                   on_retry: Callable[[BaseException], None] | None = None) -> T:
        """Await ``op()``; on a retryable error wait and try again, up to ``policy.attempts`` tries.

        The last error is re-raised when attempts run out (a :class:`StorageError` gets the number
        of attempts appended to its message). ``on_retry`` sees every error that is retried.
        """
        attempts = self.policy.attempts
        for attempt in range(1, attempts + 1):
            try:
                return await op()
            except Exception as exc:
                if not self._retry_on(exc):
                    raise
                if attempt == attempts:
                    if attempts > 1:
                        log.warning("%s gave up after %d attempts: %s", describe, attempts, exc)
                    if attempts > 1 and isinstance(exc, StorageError):
                        raise type(exc)(f"{exc} (gave up after {attempts} attempts)",
                                        key=exc.key) from exc
                    raise
                if on_retry is not None:
                    on_retry(exc)
                wait = self.policy.delay(attempt, self._rng)
                # One line per operation that needed a retry; the rest only when debugging.
                log.log(logging.INFO if attempt == 1 else logging.DEBUG,
                        "%s failed (%s); retry %d/%d in %.3fs", describe, exc, attempt,
                        attempts - 1, wait)
                await self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover
