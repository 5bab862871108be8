"""What the object-store backends (``s3://``, ``gs://``) share: one base, the store-specific calls.

Both stores keep objects under ``bucket/prefix`` behind an HTTP API that can hiccup, so both need the
same plumbing, and it lives here once:

- a call made through the store's client, its exception translated into the storage error tree and
  retried under the backend's :class:`~vcasync.retry.RetryPolicy` (:meth:`ObjectStore._call`);
- a *creating* call that, when conditional (``if_absent``), retried and then refused as already
  existing, reads the object's writer tag to tell its own first attempt's success from a lost race
  (:meth:`ObjectStore._create`);
- ``put`` and ``put_stream``: peek at a stream's first two blocks to send something small in one
  request, anything else as a multi-request upload (:meth:`ObjectStore._put_one`,
  :meth:`ObjectStore._put_many`);
- a streamed read that broke: raise, or back off and resume (:meth:`ObjectStore._resume_read`);
- HTTP status -> storage error (:func:`status_error`), ``exists``, ``preflight``'s missing bucket.

A subclass supplies the client (``_connect``), the translation of its exceptions (``_translate``),
the two uploads, the writer tag lookup (``_writer``) and the bucket check (``_check_bucket``).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from vcasync.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ConfigError,
    InvalidKeyError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    TransientStorageError,
)
from vcasync.retry import Retrier, RetryPolicy
from vcasync.storage import MAX_KEY_BYTES, BytesLike, ObjectInfo, shown_url, validate_key

from ._common import StorageBase, check_data, rechunk

__all__ = ["ObjectStore", "status_error"]

T = TypeVar("T")
Block = bytes | memoryview


def status_error(status: int, text: str, key: str | None) -> StorageError:
    """The storage error for an HTTP ``status`` (404 missing, 401/403 denied, 412 precondition,
    408/429/5xx transient, anything else a plain :class:`StorageError`)."""
    if status == 404:
        return ObjectNotFoundError(text, key=key)
    if status in (401, 403):
        return AccessDeniedError(text, key=key)
    if status == 412:
        return PreconditionFailedError(text, key=key)
    if status in (408, 429) or status >= 500:
        return TransientStorageError(text, key=key)
    return StorageError(text, key=key)


class ObjectStore(StorageBase):
    """Objects under ``scheme://bucket/prefix``; see the module docstring for what a subclass adds."""

    #: ``s3``, ``gs``: the URL scheme, and the store's name in messages.
    scheme: ClassVar[str]
    store: ClassVar[str]
    _log: ClassVar[logging.Logger]

    def __init__(self, bucket: str, prefix: str, query: str, retry: RetryPolicy, *,
                 sleep: Callable[[float], Awaitable[object]] | None,
                 rng: random.Random | None) -> None:
        if not bucket or "/" in bucket:
            raise ConfigError(f"{self.store}: a bucket name is required, got {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            try:
                validate_key(prefix)
            except InvalidKeyError as exc:
                # the URL is the operator's input: a configuration error naming it (exit 2,
                # nothing written), not a storage error about some key
                url = shown_url(f"{self.scheme}://{bucket}/{prefix}{query}")
                raise ConfigError(f"{url}: the prefix {prefix!r} cannot be used: {exc}; give a "
                                  "prefix of '/'-separated names, none empty, '.' or '..'") from None
        self.bucket = bucket
        self.prefix = prefix
        super().__init__(f"{self.scheme}://{bucket}/{prefix}{query}")
        self._root = f"{prefix}/" if prefix else ""
        self._retrier = Retrier(retry, sleep=sleep, rng=rng)

    # --- what a store supplies ----------------------------------------------------------------

    #: A ``put`` of at most this many bytes (and a stream of one block no larger) is one request.
    @property
    def _one_request_max(self) -> int:
        raise NotImplementedError

    #: Blocks a stream is cut into for a multi-request upload.
    @property
    def _block_size(self) -> int:
        raise NotImplementedError

    async def _connect(self) -> Any:
        raise NotImplementedError

    def _translate(self, exc: Exception, what: str, key: str | None) -> Exception:
        """``exc`` as a storage error (itself when it is not the store's to translate)."""
        raise NotImplementedError

    async def _put_one(self, key: str, full: str, body: bytes, if_absent: bool) -> None:
        raise NotImplementedError

    async def _put_many(self, key: str, full: str, blocks: AsyncIterator[Block], if_absent: bool) -> None:
        raise NotImplementedError

    def _split(self, view: memoryview) -> AsyncIterator[Block]:
        """A large ``put``'s data as the blocks of a multi-request upload."""
        raise NotImplementedError

    async def _writer(self, key: str) -> str | None:
        """The writer tag (``vcasync-writer`` metadata) of the object at ``key``."""
        raise NotImplementedError

    async def stat(self, key: str) -> ObjectInfo:
        raise NotImplementedError

    async def _check_bucket(self) -> None:
        """One call that fails with :class:`ObjectNotFoundError` when the bucket is missing."""
        raise NotImplementedError

    # --- shared plumbing ----------------------------------------------------------------------

    def _where(self, what: str, key: str | None) -> str:
        return f"{self.url}: {what}" + (f" {key!r}" if key is not None else "")

    def _full(self, key: str) -> str:
        self._check_open()
        validate_key(key)
        full = self._root + key
        if len(full.encode("utf-8")) > MAX_KEY_BYTES:
            raise InvalidKeyError(f"{self.url}: {key!r} is too long with the prefix "
                                  f"({MAX_KEY_BYTES} bytes at most)", key=key)
        return full

    def _no_bucket(self, where: str, key: str | None, at: str = "") -> BucketNotFoundError:
        return BucketNotFoundError(f"{where}: the bucket {self.bucket!r} does not exist{at} (create "
                                   "it, or fix the storage URL)", bucket=self.bucket, key=key)

    async def preflight(self) -> None:
        """The bucket exists: a missing one is named as such, not reported as a missing object."""
        try:
            await self._check_bucket()
        except ObjectNotFoundError:
            raise self._no_bucket(f"{self.url}: check bucket", None) from None

    async def _call(self, what: str, key: str | None, fn: Callable[[Any], Awaitable[T]], *,
                    on_retry: Callable[[BaseException], None] | None = None) -> T:
        """``fn(client)``, its errors translated, retried while they are transient."""
        async def attempt() -> T:
            client = await self._connect()
            try:
                return await fn(client)
            except Exception as exc:
                raise self._translate(exc, what, key) from exc

        return await self._retrier.call(attempt, describe=f"{self.url} {what} {key!r}",
                                        on_retry=on_retry)

    async def _create(self, key: str, what: str, token: str | None,
                      fn: Callable[[Any], Awaitable[T]]) -> T | None:
        """A creating call. If it is conditional (``token``), was retried, and then lost the race,
        look at who wrote the object: the first attempt may have been ours after all (None)."""
        retried = False

        def seen(_exc: BaseException) -> None:
            nonlocal retried
            retried = True

        try:
            return await self._call(what, key, fn, on_retry=seen)
        except PreconditionFailedError:
            if token is None or not retried or await self._writer(key) != token:
                raise
            return None

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        full = self._full(key)
        view = check_data(data)
        async with self._bucket_named(key):
            if len(view) <= self._one_request_max:
                await self._put_one(key, full, data if isinstance(data, bytes) else view.tobytes(),
                                    if_absent)
                return
            await self._put_many(key, full, self._split(view), if_absent)

    @contextlib.asynccontextmanager
    async def _bucket_named(self, key: str) -> AsyncIterator[None]:
        """A write answered "not found" can only mean the bucket is gone (an object being written
        cannot be missing): said as :class:`BucketNotFoundError` when a check of the bucket finds
        it so. GCS said "404 Not Found" on ``put 'k'``, an ObjectNotFoundError naming the key, where
        the bucket had been deleted mid-run (S3 says so itself: NoSuchBucket)."""
        try:
            yield
        except ObjectNotFoundError as exc:
            try:
                await self._check_bucket()
            except ObjectNotFoundError:
                raise self._no_bucket(self._where("put", key), key) from exc
            except StorageError:
                pass        # the check failed otherwise: the write's own error says more
            raise

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        full = self._full(key)
        blocks = rechunk(chunks, self._block_size)
        first = await anext(blocks, b"")
        second = await anext(blocks, None)
        if second is None and len(first) <= self._one_request_max:
            async with self._bucket_named(key):
                await self._put_one(key, full, first, if_absent)
            return

        async def all_blocks() -> AsyncIterator[Block]:
            yield first
            if second is not None:
                yield second
                async for block in blocks:
                    yield block

        async with self._bucket_named(key):
            await self._put_many(key, full, all_blocks(), if_absent)

    async def exists(self, key: str) -> bool:
        try:
            await self.stat(key)
        except ObjectNotFoundError:
            return False
        return True

    async def _resume_read(self, exc: Exception, key: str, offset: int, resumes: int) -> int:
        """A streamed read broke with ``exc`` at byte ``offset``: raise what it means, or wait
        and return the new count of resumes (the caller reads again from ``offset``)."""
        error = self._translate(exc, "read", key)
        if error is exc:
            raise exc
        if isinstance(error, ObjectNotFoundError) and offset:
            raise StorageError(f"{self.url}: {key!r} was replaced or deleted while it was being read",
                               key=key) from exc
        resumes += 1
        if not isinstance(error, TransientStorageError) or resumes >= self._retrier.policy.attempts:
            raise error from exc
        self._log.info("%s: read of %r broke at byte %d (%s); resuming", self.url, key, offset, exc)
        await self._retrier.backoff(resumes)
        return resumes
