"""``s3://bucket/prefix``: Amazon S3 and S3-compatible stores, through aiobotocore.

- Credentials come from the standard AWS chain (environment, shared config and credentials files,
  SSO, container and instance metadata) unless given as keyword options; ``profile`` picks a
  profile. Secrets are never accepted in the URL and never shown in ``repr``.
- ``endpoint_url`` (URL query or option) points at an S3-compatible store (MinIO, R2, moto).
- Objects above ``multipart_threshold`` (and every stream longer than one part) go up as a
  multipart upload, ``max_concurrency`` parts in flight, each part retried on its own; a failed or
  cancelled upload is aborted, so nothing appears under the key.
- ``if_absent`` sends ``If-None-Match: *`` on PutObject / CompleteMultipartUpload (S3 has honoured
  it since August 2024; moto supports it). The write is tagged with a random ``vcasync-writer``
  metadata value, so a retry whose first attempt in fact succeeded is recognised as ours instead of
  being reported as a lost race.
- :meth:`S3Storage.preflight` (run by a coordinator before it writes anything) checks that the
  bucket exists, so a missing bucket is named as such rather than reported as a missing object.
- Timeouts, 5xx, throttling and dropped connections are retried with capped, jittered backoff
  (botocore's own retries are switched off so that one policy, :class:`RetryPolicy`, governs);
  reads that break mid-stream resume at the byte they reached, pinned to the same ETag.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from operator import methodcaller
from typing import Any, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from vcasync.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ConfigError,
    InvalidKeyError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    TransientStorageError,
    VCAsyncError,
)
from vcasync.retry import Retrier, RetryPolicy
from vcasync.storage import (
    DEFAULT_CHUNK_SIZE,
    MAX_KEY_BYTES,
    BytesLike,
    ObjectInfo,
    first_error,
    validate_key,
    validate_prefix,
)

from ._common import (
    WRITER_META,
    StorageBase,
    check_chunk_size,
    check_data,
    check_positive,
    check_retry,
    parse_options,
    rechunk,
    split_url,
    writer_token,
)

__all__ = ["S3Options", "S3Storage"]

T = TypeVar("T")
MiB = 1 << 20
log = logging.getLogger("vcasync.storage.s3")

_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
           "InvalidToken", "AllAccessDisabled", "AccountProblem", "403", "401"}
_TRANSIENT = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
              "ServiceUnavailable", "RequestLimitExceeded", "ConditionalRequestConflict",
              "OperationAborted", "BadDigest", "IncompleteBody", "RequestTimeTooSkewed"}


@dataclass(frozen=True, slots=True)
class S3Options:
    """Options for :class:`S3Storage`; the non-secret ones may also be URL query parameters."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    addressing_style: str = "auto"
    aws_access_key_id: str | None = field(default=None, repr=False, metadata={"secret": True})
    aws_secret_access_key: str | None = field(default=None, repr=False, metadata={"secret": True})
    aws_session_token: str | None = field(default=None, repr=False, metadata={"secret": True})
    part_size: int = 16 * MiB
    multipart_threshold: int = 64 * MiB
    max_concurrency: int = 4
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        check_positive("S3Options", part_size=self.part_size, max_concurrency=self.max_concurrency,
                       multipart_threshold=self.multipart_threshold,
                       connect_timeout_s=self.connect_timeout_s, read_timeout_s=self.read_timeout_s)
        if not 5 * MiB <= self.part_size <= 5 * 1024 * MiB:
            raise ConfigError(f"S3Options.part_size must be 5 MiB..5 GiB (S3's limits), "
                              f"got {self.part_size}")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(f"S3Options.addressing_style must be auto, path or virtual, "
                              f"got {self.addressing_style!r}")
        check_retry("S3Options", self.retry)


class S3Storage(StorageBase):
    """Objects under ``s3://bucket/prefix``; see the module docstring. The client connects lazily
    on first use, inside the running event loop."""

    def __init__(self, bucket: str, prefix: str = "", options: S3Options | None = None, *,
                 sleep: Callable[[float], Awaitable[object]] | None = None,
                 rng: random.Random | None = None) -> None:
        if not bucket or "/" in bucket:
            raise ConfigError(f"an S3 bucket name is required, got {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self.bucket = bucket
        self.prefix = prefix
        self.options = options if options is not None else S3Options()
        query = f"?endpoint_url={self.options.endpoint_url}" if self.options.endpoint_url else ""
        super().__init__(f"s3://{bucket}/{prefix}{query}")
        self._root = f"{prefix}/" if prefix else ""
        self._retrier = Retrier(self.options.retry, sleep=sleep, rng=rng)
        self._client: Any = None
        self._client_cm: Any = None
        self._connecting = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, *, sleep: Callable[[float], Awaitable[object]] | None = None,
                 rng: random.Random | None = None, **options: Any) -> S3Storage:
        parts = split_url(url, "s3")
        return cls(parts.netloc, parts.path, parse_options(S3Options, url, parts.query, options),
                   sleep=sleep, rng=rng)

    # --- plumbing -----------------------------------------------------------------------------

    async def _connect(self) -> Any:
        self._check_open()
        if self._client is not None:
            return self._client
        async with self._connecting:
            if self._client is None:
                opts = self.options
                session = get_session()
                if opts.profile:
                    session.set_config_variable("profile", opts.profile)
                config = AioConfig(
                    connect_timeout=opts.connect_timeout_s, read_timeout=opts.read_timeout_s,
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    max_pool_connections=max(10, 2 * opts.max_concurrency),
                    s3={"addressing_style": opts.addressing_style})
                cm = session.create_client(
                    "s3", region_name=opts.region, endpoint_url=opts.endpoint_url, config=config,
                    aws_access_key_id=opts.aws_access_key_id,
                    aws_secret_access_key=opts.aws_secret_access_key,
                    aws_session_token=opts.aws_session_token)
                client = await cm.__aenter__()
                if self._closed:  # closed while we were connecting
                    await cm.__aexit__(None, None, None)
                    self._check_open()
                self._client, self._client_cm = client, cm
        return self._client

    async def _release(self) -> None:
        cm, self._client, self._client_cm = self._client_cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    def _full(self, key: str) -> str:
        self._check_open()
        validate_key(key)
        full = self._root + key
        if len(full.encode("utf-8")) > MAX_KEY_BYTES:
            raise InvalidKeyError(f"{self.url}: {key!r} is too long with the prefix "
                                  f"({MAX_KEY_BYTES} bytes at most)", key=key)
        return full

    def _translate(self, exc: Exception, what: str, key: str | None) -> Exception:
        if isinstance(exc, VCAsyncError):
            return exc
        where = f"{self.url}: {what}" + (f" {key!r}" if key is not None else "")
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            msg = f"{where}: {code or status} {err.get('Message', '')}".rstrip()
            if code == "NoSuchBucket":
                return self._no_bucket(where, key)
            if code in _NOT_FOUND or (status == 404 and code != "NoSuchUpload"):
                return ObjectNotFoundError(msg, key=key)
            if code in _DENIED or status in (401, 403):
                return AccessDeniedError(msg, key=key)
            if code == "PreconditionFailed" or status == 412:
                return PreconditionFailedError(msg, key=key)
            if code in _TRANSIENT or status in (408, 429) or status >= 500:
                return TransientStorageError(msg, key=key)
            return StorageError(msg, key=key)
        if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
            return AccessDeniedError(f"{where}: no usable AWS credentials ({exc}); set them in the "
                                     "environment, a profile, or as options", key=key)
        if isinstance(exc, HTTPClientError | BotoConnectionError | IncompleteReadError | ChecksumError
                      | aiohttp.ClientError | TimeoutError | OSError):
            return TransientStorageError(f"{where}: {type(exc).__name__}: {exc}", key=key)
        if isinstance(exc, BotoCoreError):
            return StorageError(f"{where}: {exc}", key=key)
        return exc

    def _no_bucket(self, where: str, key: str | None) -> BucketNotFoundError:
        at = f" at {self.options.endpoint_url}" if self.options.endpoint_url else ""
        return BucketNotFoundError(f"{where}: the bucket {self.bucket!r} does not exist{at} (create "
                                   "it, or fix the storage URL)", bucket=self.bucket, key=key)

    async def preflight(self) -> None:
        """The bucket exists (HeadBucket, whose 404 has no body to tell a bucket from a key)."""
        try:
            await self._call("check bucket", None, lambda c: c.head_bucket(Bucket=self.bucket))
        except ObjectNotFoundError:
            raise self._no_bucket(f"{self.url}: check bucket", None) from None

    async def _call(self, what: str, key: str | None, fn: Callable[[Any], Awaitable[T]], *,
                    on_retry: Callable[[BaseException], None] | None = None) -> T:
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
        """Run a creating call. If it is conditional (``token``), was retried, and then lost the
        race, look at who wrote the object: the first attempt may have been ours after all."""
        retried = False

        def seen(_exc: BaseException) -> None:
            nonlocal retried
            retried = True

        try:
            return await self._call(what, key, fn, on_retry=seen)
        except PreconditionFailedError:
            if token is None or not retried:
                raise
            head = await self._call("head", key, lambda c: c.head_object(
                Bucket=self.bucket, Key=self._full(key)))
            if head.get("Metadata", {}).get(WRITER_META) == token:
                return None
            raise

    # --- writes -------------------------------------------------------------------------------

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        full = self._full(key)
        view = check_data(data)
        if len(view) > self.options.multipart_threshold:
            size = self.options.part_size
            parts = (bytes(view[i:i + size]) for i in range(0, len(view), size))
            await self._multipart(key, full, _aiter(parts), if_absent)
            return
        body = data if isinstance(data, bytes) else view.tobytes()
        await self._put_object(key, full, body, if_absent)

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        full = self._full(key)
        parts = rechunk(chunks, self.options.part_size)
        first = await anext(parts, b"")
        second = await anext(parts, None)
        if second is None:
            await self._put_object(key, full, first, if_absent)
            return

        async def all_parts() -> AsyncIterator[bytes]:
            yield first
            yield second
            async for part in parts:
                yield part

        await self._multipart(key, full, all_parts(), if_absent)

    async def _put_object(self, key: str, full: str, body: bytes, if_absent: bool) -> None:
        token = writer_token() if if_absent else None
        extra: dict[str, Any] = {"IfNoneMatch": "*", "Metadata": {WRITER_META: token}} if token else {}
        await self._create(key, "put", token, lambda c: c.put_object(
            Bucket=self.bucket, Key=full, Body=body, **extra))

    async def _multipart(self, key: str, full: str, parts: AsyncIterator[bytes],
                         if_absent: bool) -> None:
        token = writer_token() if if_absent else None
        meta: dict[str, Any] = {"Metadata": {WRITER_META: token}} if token else {}
        created = await self._call("create multipart upload", key, lambda c: c.create_multipart_upload(
            Bucket=self.bucket, Key=full, **meta))
        upload_id: str = created["UploadId"]
        etags: dict[int, str] = {}
        slots = asyncio.Semaphore(self.options.max_concurrency)

        async def upload(number: int, body: bytes) -> None:
            try:
                done = await self._call(f"upload part {number}", key, lambda c: c.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body))
                etags[number] = done["ETag"]
            finally:
                slots.release()

        try:
            try:
                async with asyncio.TaskGroup() as tasks:
                    number = 0
                    async for body in parts:
                        self._check_open()
                        number += 1
                        await slots.acquire()  # at most max_concurrency parts held in memory
                        tasks.create_task(upload(number, body))
            except BaseExceptionGroup as group:
                raise first_error(group) from group
            listing = {"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]}
            condition = {"IfNoneMatch": "*"} if token else {}
            await self._create(key, "complete multipart upload", token,
                               lambda c: c.complete_multipart_upload(
                                   Bucket=self.bucket, Key=full, UploadId=upload_id,
                                   MultipartUpload=listing, **condition))
        except BaseException:
            await asyncio.shield(self._abort(key, full, upload_id))
            raise

    async def _abort(self, key: str, full: str, upload_id: str) -> None:
        if self._client is None:
            return
        try:
            await self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except Exception as exc:  # best effort: a lifecycle rule reaps what we could not abort
            log.warning("%s: could not abort the multipart upload of %r: %s", self.url, key, exc)

    async def delete(self, key: str) -> None:
        full = self._full(key)
        await self._call("delete", key, lambda c: c.delete_object(Bucket=self.bucket, Key=full))

    # --- reads --------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes:
        full = self._full(key)

        async def fetch(client: Any) -> bytes:
            resp = await client.get_object(Bucket=self.bucket, Key=full)
            async with resp["Body"] as body:
                data: bytes = await body.read()
                return data

        return await self._call("get", key, fetch)

    async def stat(self, key: str) -> ObjectInfo:
        full = self._full(key)
        head = await self._call("head", key, lambda c: c.head_object(Bucket=self.bucket, Key=full))
        return ObjectInfo(key=key, size=int(head["ContentLength"]), etag=head["ETag"].strip('"'))

    async def exists(self, key: str) -> bool:
        try:
            await self.stat(key)
        except ObjectNotFoundError:
            return False
        return True

    async def list(self, prefix: str = "") -> AsyncIterator[str]:
        self._check_open()
        validate_prefix(prefix)
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._root + prefix}
        while True:
            page = await self._call("list", prefix, methodcaller("list_objects_v2", **params))
            for item in page.get("Contents", []):
                key = item["Key"][len(self._root):]
                try:
                    validate_key(key)
                except InvalidKeyError:  # written by another tool (e.g. a "dir/" marker): skip
                    continue
                self._check_open()
                yield key
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            params["ContinuationToken"] = token

    async def open_read(self, key: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
                        ) -> AsyncIterator[bytes]:
        check_chunk_size(chunk_size)
        full = self._full(key)
        offset, etag, resumes = 0, None, 0
        while True:
            pinned: dict[str, Any] = {"Range": f"bytes={offset}-", "IfMatch": etag} if offset else {}
            try:
                resp = await self._call("get", key, methodcaller(
                    "get_object", Bucket=self.bucket, Key=full, **pinned))
            except PreconditionFailedError:
                raise StorageError(f"{self.url}: {key!r} was replaced while it was being read",
                                   key=key) from None
            etag = etag or resp["ETag"]
            body = resp["Body"]
            try:
                while True:
                    self._check_open()
                    try:
                        chunk = await body.read(chunk_size)
                    except Exception as exc:
                        error = self._translate(exc, "read", key)
                        if error is exc:
                            raise
                        if not isinstance(error, TransientStorageError):
                            raise error from exc
                        resumes += 1
                        if resumes >= self._retrier.policy.attempts:
                            raise error from exc
                        log.info("%s: read of %r broke at byte %d (%s); resuming", self.url, key,
                                 offset, exc)
                        await self._retrier.backoff(resumes)
                        break
                    if not chunk:
                        return
                    offset += len(chunk)
                    yield chunk
            finally:
                body.close()


async def _aiter(items: Any) -> AsyncIterator[bytes]:
    for item in items:
        yield item
