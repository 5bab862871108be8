"""Fault injection for storage: a wrapper that fails, delays or breaks a seeded share of calls.

    flaky = FaultyStorage(inner, FaultPlan(fail=0.2, lose_reply=0.1, delay=0.3), seed=7)
    crash = FaultyStorage(inner, trigger=lambda op, key: op == "put" and "/manifests/" in key)

Kinds of fault, each a probability per call:

- ``fail``: raise before the call reaches the inner storage (nothing happened);
- ``lose_reply``: let the call happen, then raise as if its answer was lost (it did happen);
- ``delay``: sleep up to ``max_delay_s`` first (reorders concurrent calls);
- ``break_stream``: ``put_stream`` hands the inner storage a stream that breaks after its first
  chunk (so nothing may be published), ``open_read`` breaks after yielding its first chunk.

``trigger(op, key)`` fails chosen calls deterministically (a crash at an exact point). The raised
error comes from ``make_error(op, key)``: a :class:`TransientStorageError` by default.
``injected`` counts what was done, by kind.
"""

from __future__ import annotations

import asyncio
import random
import types
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Self, TypeVar

from vcasync.errors import ConfigError, TransientStorageError
from vcasync.storage import BytesLike, ObjectInfo, Storage

__all__ = ["OPS", "FaultPlan", "FaultyStorage", "ForwardingStorage", "InjectedFault", "WriteOutage"]

T = TypeVar("T")

OPS = frozenset({"get", "put", "put_stream", "exists", "stat", "list", "delete", "open_read"})


class ForwardingStorage:
    """A storage that forwards every call to ``inner``: the base of the test wrappers, which
    override only the calls they change (and own ``inner``: closing the wrapper closes it)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.url = inner.url

    async def get(self, key: str) -> bytes:
        return await self.inner.get(key)

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        await self.inner.put(key, data, if_absent=if_absent)

    async def exists(self, key: str) -> bool:
        return await self.inner.exists(key)

    async def stat(self, key: str) -> ObjectInfo:
        return await self.inner.stat(key)

    def list(self, prefix: str = "") -> AsyncIterator[str]:
        return self.inner.list(prefix)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    def open_read(self, key: str, *, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        return self.inner.open_read(key, chunk_size=chunk_size)

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        await self.inner.put_stream(key, chunks, if_absent=if_absent)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        await self.inner.__aenter__()  # a closed inner refuses (ClosedError), as the contract says
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: types.TracebackType | None) -> None:
        await self.aclose()


class InjectedFault(TransientStorageError):
    """The default injected error: transient, so callers treat it like a real hiccup."""


def _default_error(op: str, key: str | None) -> Exception:
    return InjectedFault(f"injected fault in {op} {key!r}", key=key)


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Probabilities per call of each kind of fault; see the module docstring."""

    fail: float = 0.0
    lose_reply: float = 0.0
    delay: float = 0.0
    max_delay_s: float = 0.005
    break_stream: float = 0.0
    ops: frozenset[str] = OPS
    make_error: Callable[[str, str | None], Exception] = _default_error

    def __post_init__(self) -> None:
        for name in ("fail", "lose_reply", "delay", "break_stream"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"FaultPlan.{name} is a probability, got {value!r}")
        if self.max_delay_s < 0:
            raise ConfigError("FaultPlan.max_delay_s must be >= 0")
        unknown = set(self.ops) - OPS
        if unknown:
            raise ConfigError(f"FaultPlan.ops: unknown operations {sorted(unknown)}")


class WriteOutage:
    """A ``trigger`` for :class:`FaultyStorage` that fails every write (``put``, ``put_stream``,
    ``delete``) while :attr:`down` is true, and nothing otherwise: the bucket gone, the endpoint
    refusing, for as long as a test says; reads keep working."""

    WRITES: frozenset[str] = frozenset({"put", "put_stream", "delete"})

    def __init__(self) -> None:
        self.down = False

    def __call__(self, op: str, key: str | None) -> bool:
        return self.down and op in self.WRITES


class FaultyStorage:
    """A :class:`Storage` that forwards to ``inner`` and injects faults per ``plan``."""

    def __init__(self, inner: Storage, plan: FaultPlan | None = None, *, seed: int = 0,
                 trigger: Callable[[str, str | None], bool] | None = None,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self.inner = inner
        self.plan = plan if plan is not None else FaultPlan()
        self.trigger = trigger
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._sleep = sleep

    @property
    def url(self) -> str:
        return self.inner.url

    def __repr__(self) -> str:
        return f"<FaultyStorage {self.inner!r} {self.plan}>"

    def _roll(self, op: str, share: float) -> bool:
        return op in self.plan.ops and share > 0 and self._rng.random() < share

    async def _before(self, op: str, key: str | None) -> None:
        if self._roll(op, self.plan.delay):
            self.injected["delay"] += 1
            await self._sleep(self._rng.uniform(0, self.plan.max_delay_s))
        if self.trigger is not None and self.trigger(op, key):
            self.injected["trigger"] += 1
            raise self.plan.make_error(op, key)
        if self._roll(op, self.plan.fail):
            self.injected["fail"] += 1
            raise self.plan.make_error(op, key)

    def _after(self, op: str, key: str | None) -> None:
        if self._roll(op, self.plan.lose_reply):
            self.injected["lose_reply"] += 1
            raise self.plan.make_error(op, key)

    async def _wrap(self, op: str, key: str, call: Callable[[], Awaitable[T]]) -> T:
        await self._before(op, key)
        result = await call()
        self._after(op, key)
        return result

    async def get(self, key: str) -> bytes:
        return await self._wrap("get", key, lambda: self.inner.get(key))

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        await self._wrap("put", key, lambda: self.inner.put(key, data, if_absent=if_absent))

    async def exists(self, key: str) -> bool:
        return await self._wrap("exists", key, lambda: self.inner.exists(key))

    async def stat(self, key: str) -> ObjectInfo:
        return await self._wrap("stat", key, lambda: self.inner.stat(key))

    async def delete(self, key: str) -> None:
        await self._wrap("delete", key, lambda: self.inner.delete(key))

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        await self._before("put_stream", key)
        if self._roll("put_stream", self.plan.break_stream):
            self.injected["break_stream"] += 1
            chunks = self._breaking(chunks, key)
        await self.inner.put_stream(key, chunks, if_absent=if_absent)
        self._after("put_stream", key)

    async def _breaking(self, chunks: AsyncIterable[BytesLike], key: str) -> AsyncIterator[BytesLike]:
        async for chunk in chunks:
            yield chunk
            break
        raise self.plan.make_error("put_stream", key)

    async def list(self, prefix: str = "") -> AsyncIterator[str]:
        await self._before("list", prefix)
        async for key in self.inner.list(prefix):
            yield key
        self._after("list", prefix)

    async def open_read(self, key: str, *, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        await self._before("open_read", key)
        breaks = self._roll("open_read", self.plan.break_stream)
        reader = self.inner.open_read(key, chunk_size=chunk_size)
        try:
            async for chunk in reader:
                yield chunk
                if breaks:
                    self.injected["break_stream"] += 1
                    raise self.plan.make_error("open_read", key)
        finally:
            close = getattr(reader, "aclose", None)
            if close is not None:
                await close()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: types.TracebackType | None) -> None:
        await self.aclose()
