"""One retry predicate for the whole package: ``vcasync.retry.is_transient`` and its one table."""

from __future__ import annotations

import random
import ssl
from typing import Any

import aiohttp
import pytest

from vcasync.errors import (
    AccessDeniedError,
    ClosedError,
    ConfigError,
    RequestTimeoutError,
    StorageUnavailableError,
    TransientStorageError,
)
from vcasync.retry import Retrier, RetryPolicy, classify, is_transient
from vcasync.worker import _client as client


def _bare(cls: type[BaseException]) -> BaseException:
    """An instance without its constructor's arguments: the table only looks at the class."""
    return cls.__new__(cls)


def _status(code: int) -> aiohttp.ClientResponseError:
    return aiohttp.ClientResponseError(None, (), status=code)  # type: ignore[arg-type]


CASES: list[tuple[str, BaseException, bool]] = [
    ("storage 5xx or throttling", TransientStorageError("503", key="k"), True),
    ("coordinator's storage down", StorageUnavailableError("down", retry_after=1.0), True),
    ("storage access denied", AccessDeniedError("no", key="k"), False),
    ("coordinator stopping", ClosedError("closing"), True),
    ("body cut off as too slow (408)", RequestTimeoutError("request body too slow"), True),
    ("connection reset", ConnectionResetError(), True),
    ("timeout", TimeoutError(), True),
    ("server disconnected", aiohttp.ServerDisconnectedError(), True),
    ("server timeout", aiohttp.ServerTimeoutError(), True),
    ("truncated body", aiohttp.ClientPayloadError("cut"), True),
    ("TLS handshake", _bare(aiohttp.ClientSSLError), False),
    ("certificate does not verify", _bare(aiohttp.ClientConnectorCertificateError), False),
    ("bare ssl error", ssl.SSLCertVerificationError(), False),
    ("502", _status(502), True),
    ("503", _status(503), True),
    ("504", _status(504), True),
    ("429 from a proxy", _status(429), True),
    ("500", _status(500), False),
    ("404", _status(404), False),
    ("bad config", ConfigError("no"), False),
    ("a bug", ValueError("no"), False),
]


@pytest.mark.parametrize(("what", "exc", "transient"), CASES, ids=[c[0] for c in CASES])
def test_one_classification_table(what: str, exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient, what


def test_the_client_re_exports_the_one_predicate() -> None:
    assert client.is_transient is is_transient


async def test_a_storage_retrier_retries_what_the_client_would() -> None:
    """Before there was one table, a Retrier gave up at once on a reset connection that the worker
    would have retried."""
    sleeps: list[float] = []
    failures: list[BaseException] = [ConnectionResetError("reset"), aiohttp.ServerDisconnectedError()]

    async def sleep(s: float) -> None:
        sleeps.append(s)

    async def op() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    retrier = Retrier(RetryPolicy(attempts=3), sleep=sleep, rng=random.Random(0))
    assert await retrier.call(op) == "done"
    assert len(sleeps) == 2


@pytest.mark.parametrize(("exc_type", "verdict"), [(ValueError(), True), (int, True), (KeyError, "yes")])
def test_classify_refuses_what_is_not_an_exception_class_or_a_verdict(exc_type: Any, verdict: Any) -> None:
    with pytest.raises(ConfigError):
        classify(exc_type, verdict)


def test_a_huge_retry_number_is_capped_not_an_overflow() -> None:
    policy = RetryPolicy(base_delay_s=0.2, max_delay_s=10.0, jitter=0.0)
    assert policy.delay(5000, random.Random(0)) == 10.0
