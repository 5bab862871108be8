"""Capped, jittered exponential backoff for transient faults.

One small helper shared by everything that talks to something that can hiccup (storage backends,
the worker's reconnect loop). Time and randomness are injected, so tests run retries in zero time
and with a fixed seed::

    retrier = Retrier(RetryPolicy(attempts=5), sleep=fake_sleep, rng=random.Random(0))
    data = await retrier.call(lambda: backend_get(key), describe=f"get {key!r}")

The delay before retry ``n`` (1-based) is ``cap * (1 - jitter * u)`` with ``u`` uniform in [0, 1)
and ``cap = min(max_delay_s, base_delay_s * multiplier ** (n - 1))``: "full jitter" when
``jitter == 1``, which spreads a thundering herd of clients best (AWS architecture blog, 2015).

Logging: the first retry of an operation is INFO, later ones DEBUG (an outage must not bury the log
in retry lines), and giving up is WARNING: the operation failed for good.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import ConfigError, StorageError, TransientStorageError

__all__ = ["Retrier", "RetryPolicy", "is_transient"]

T = TypeVar("T")

log = logging.getLogger("vcasync.retry")


def is_transient(exc: BaseException) -> bool:
    """The default retry predicate: only :class:`TransientStorageError` is worth another try."""
    return isinstance(exc, TransientStorageError)


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
        cap = min(self.max_delay_s, self.base_delay_s * self.multiplier ** (retry - 1))
        return cap * (1.0 - self.jitter * rng.random())


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
