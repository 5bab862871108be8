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
from collections.abc import AsyncIterator, Awaitable, Callable
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
    ProfileNotFound,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from vcasync.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ConfigError,
    InvalidKeyError,
    PreconditionFailedError,
    StorageError,
    TransientStorageError,
    VCAsyncError,
)
from vcasync.retry import RetryPolicy
from vcasync.storage import (
    DEFAULT_CHUNK_SIZE,
    ObjectInfo,
    first_error,
    validate_key,
    validate_prefix,
)

from ._common import (
    WRITER_META,
    check_chunk_size,
    check_endpoint,
    check_positive,
    check_retry,
    parse_options,
    split_url,
    writer_token,
)
from ._objectstore import Block, ObjectStore, status_error

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
        check_endpoint("S3Options", "endpoint_url", self.endpoint_url)


class S3Storage(ObjectStore):
    """Objects under ``s3://bucket/prefix``; see the module docstring. The client connects lazily
    on first use, inside the running event loop."""

    scheme = "s3"
    store = "S3"
    _log = log

    def __init__(self, bucket: str, prefix: str = "", options: S3Options | None = None, *,
                 sleep: Callable[[float], Awaitable[object]] | None = None,
                 rng: random.Random | None = None) -> None:
        self.options = options if options is not None else S3Options()
        query = f"?endpoint_url={self.options.endpoint_url}" if self.options.endpoint_url else ""
        super().__init__(bucket, prefix, query, self.options.retry, sleep=sleep, rng=rng)
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
                try:
                    client = await cm.__aenter__()
                except ProfileNotFound as exc:
                    # the operator's configuration (a typo in ?profile= or AWS_PROFILE): named,
                    # not a traceback out of botocore
                    raise ConfigError(
                        f"{self.url}: the AWS profile {exc.kwargs.get('profile')!r} (from "
                        f"{'?profile=' if opts.profile else 'AWS_PROFILE'}) is not in the AWS "
                        "configuration (~/.aws/config and ~/.aws/credentials, or AWS_CONFIG_FILE "
                        "and AWS_SHARED_CREDENTIALS_FILE); name a profile that is there, or drop "
                        "it to use the rest of the AWS credential chain") from None
                except BotoCoreError as exc:
                    raise self._translate(exc, "connect", None) from exc
                if self._closed:  # closed while we were connecting
                    await cm.__aexit__(None, None, None)
                    self._check_open()
                self._client, self._client_cm = client, cm
        return self._client

    async def _release(self) -> None:
        cm, self._client, self._client_cm = self._client_cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    def _translate(self, exc: Exception, what: str, key: str | None) -> Exception:
        if isinstance(exc, VCAsyncError):
            return exc
        where = self._where(what, key)
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            msg = f"{where}: {code or status} {err.get('Message', '')}".rstrip()
            if code == "NoSuchBucket":
                return self._no_bucket(where, key)
            if code in _NOT_FOUND:
                status = 404
            elif code in _DENIED:
                status = 403
                if code in ("403", "401"):   # a HEAD's bare status: no error code or message to show
                    msg = (f"{where}: {code} access denied to bucket {self.bucket!r}: the credentials "
                           "are wrong (a key that does not exist, a wrong secret, an expired session) "
                           "or lack permission on it; check the AWS credential chain (environment, "
                           "profile, instance or pod role) and the bucket policy")
            elif code == "PreconditionFailed":
                status = 412
            elif code in _TRANSIENT:
                status = 503
            elif code == "NoSuchUpload":      # a 404 that is not a missing object
                status = 400
            return status_error(status, msg, key)
        if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
            return AccessDeniedError(f"{where}: no usable AWS credentials ({exc}); set them in the "
                                     "environment, a profile, or as options", key=key)
        if isinstance(exc, HTTPClientError | BotoConnectionError | IncompleteReadError | ChecksumError
                      | aiohttp.ClientError | TimeoutError | OSError):
            return TransientStorageError(f"{where}: {type(exc).__name__}: {exc}", key=key)
        if isinstance(exc, BotoCoreError):
            return StorageError(f"{where}: {exc}", key=key)
        return exc

    def _no_bucket(self, where: str, key: str | None, at: str = "") -> BucketNotFoundError:
        at = at or (f" at {self.options.endpoint_url}" if self.options.endpoint_url else "")
        return super()._no_bucket(where, key, at)

    async def _check_bucket(self) -> None:
        """HeadBucket, whose 404 has no body to tell a bucket from a key."""
        await self._call("check bucket", None, lambda c: c.head_bucket(Bucket=self.bucket))

    async def _writer(self, key: str) -> str | None:
        head = await self._call("head", key, lambda c: c.head_object(
            Bucket=self.bucket, Key=self._full(key)))
        value = head.get("Metadata", {}).get(WRITER_META)
        return str(value) if value is not None else None

    # --- writes -------------------------------------------------------------------------------

    @property
    def _one_request_max(self) -> int:
        return self.options.multipart_threshold

    @property
    def _block_size(self) -> int:
        return self.options.part_size

    async def _split(self, view: memoryview) -> AsyncIterator[Block]:
        size = self.options.part_size
        for i in range(0, len(view), size):
            yield bytes(view[i:i + size])

    async def _put_one(self, key: str, full: str, body: bytes, if_absent: bool) -> None:
        token = writer_token() if if_absent else None
        extra: dict[str, Any] = {"IfNoneMatch": "*", "Metadata": {WRITER_META: token}} if token else {}
        await self._create(key, "put", token, lambda c: c.put_object(
            Bucket=self.bucket, Key=full, Body=body, **extra))

    async def _put_many(self, key: str, full: str, parts: AsyncIterator[Block], if_absent: bool) -> None:
        """A multipart upload, ``max_concurrency`` parts in flight; aborted unless it completes."""
        token = writer_token() if if_absent else None
        meta: dict[str, Any] = {"Metadata": {WRITER_META: token}} if token else {}
        created = await self._call("create multipart upload", key, lambda c: c.create_multipart_upload(
            Bucket=self.bucket, Key=full, **meta))
        upload_id: str = created["UploadId"]
        etags: dict[int, str] = {}
        slots = asyncio.Semaphore(self.options.max_concurrency)

        async def upload(number: int, body: Block) -> None:
            try:
                done = await self._call(f"upload part {number}", key, lambda c: c.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number,
                    Body=body if isinstance(body, bytes) else bytes(body)))
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
                        resumes = await self._resume_read(exc, key, offset, resumes)
                        break
                    if not chunk:
                        return
                    offset += len(chunk)
                    yield chunk
            finally:
                body.close()

