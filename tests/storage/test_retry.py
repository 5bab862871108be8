"""The retry helper: capped, jittered, seeded, injected sleep; only transient errors retried."""

from __future__ import annotations

import logging
import random

import pytest

from vcasync.errors import AccessDeniedError, ConfigError, TransientStorageError
from vcasync.retry import Retrier, RetryPolicy


class FakeSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def test_delays_are_capped_and_jittered() -> None:
    policy = RetryPolicy(attempts=10, base_delay_s=0.1, max_delay_s=1.0, multiplier=2.0, jitter=1.0)
    rng = random.Random(1)
    delays = [policy.delay(n, rng) for n in range(1, 10)]
    caps = [min(1.0, 0.1 * 2 ** (n - 1)) for n in range(1, 10)]
    assert all(0 <= d <= c for d, c in zip(delays, caps, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    assert RetryPolicy(jitter=0.0, base_delay_s=0.5, max_delay_s=0.8).delay(3, rng) == 0.8
    assert [policy.delay(n, random.Random(5)) for n in range(1, 4)] == \
        [policy.delay(n, random.Random(5)) for n in range(1, 4)]


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"attempts": True}, {"base_delay_s": -1},
                                 {"multiplier": 0.5}, {"jitter": 2}, {"max_delay_s": float("nan")}])
def test_policy_rejects_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**bad)  # type: ignore[arg-type]


async def test_retries_transient_then_succeeds() -> None:
    sleep, seen = FakeSleep(), []
    failures = [TransientStorageError("503", key="k"), TransientStorageError("timeout", key="k")]

    async def op() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    retrier = Retrier(RetryPolicy(attempts=5), sleep=sleep, rng=random.Random(0))
    assert await retrier.call(op, on_retry=seen.append) == "done"
    assert len(sleep.calls) == 2
    assert len(seen) == 2


async def test_gives_up_after_attempts_naming_them() -> None:
    sleep, calls = FakeSleep(), []

    async def op() -> None:
        calls.append(1)
        raise TransientStorageError("slow down", key="obj")

    with pytest.raises(TransientStorageError, match="gave up after 4 attempts") as info:
        await Retrier(RetryPolicy(attempts=4), sleep=sleep).call(op)
    assert info.value.key == "obj"
    assert len(calls) == 4
    assert len(sleep.calls) == 3


async def test_permanent_errors_are_not_retried() -> None:
    sleep, calls = FakeSleep(), []

    async def op() -> None:
        calls.append(1)
        raise AccessDeniedError("forbidden", key="k")

    with pytest.raises(AccessDeniedError):
        await Retrier(RetryPolicy(attempts=5), sleep=sleep).call(op)
    assert calls == [1]
    assert sleep.calls == []


async def test_an_outage_logs_one_info_line_per_operation_and_gives_up_at_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """A short outage used to log every retry at INFO and giving up not above it: the log was
    buried in retries while the one line that mattered did not stand out."""
    retrier = Retrier(RetryPolicy(attempts=5), sleep=FakeSleep(), rng=random.Random(0))

    async def down() -> None:
        raise TransientStorageError("connection refused", key="journal/7")

    with caplog.at_level(logging.DEBUG, logger="vcasync.retry"), \
            pytest.raises(TransientStorageError, match="gave up after 5 attempts"):
        await retrier.call(down, describe="put 'journal/7'")
    levels = [(r.levelno, r.getMessage().split(";")[-1].strip()) for r in caplog.records]
    assert [lv for lv, _ in levels] == [logging.INFO] + [logging.DEBUG] * 3 + [logging.WARNING]
    assert levels[0][1].startswith("retry 1/4")
    assert "put 'journal/7' gave up after 5 attempts: connection refused" in caplog.records[-1].getMessage()
