"""``gs://bucket/prefix``: Google Cloud Storage through gcloud-aio-storage.

- Credentials: a service-account JSON (``service_file``) or the application default credentials
  (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's user credentials, the metadata server), as
  gcloud-aio-auth finds them. Against an emulator (``emulator_host``, or ``STORAGE_EMULATOR_HOST``
  as gcloud-aio-storage reads it) no credentials are used.
- Small objects go up in one request; larger ones, and streams, through a resumable upload in
  ``chunk_size`` pieces, each retried on its own after asking the server how much it persisted.
  An upload that fails or is cancelled is never finalised, so nothing appears under the key.
- ``if_absent`` sends ``ifGenerationMatch=0``; the write carries a random ``vcasync-writer``
  metadata value so an ambiguous retry can tell its own success from a lost race.
- :meth:`GCSStorage.preflight` (run by a coordinator before it writes anything) finds the
  credentials locally and quickly (see :mod:`._gcp_credentials`) and checks that the bucket exists,
  so neither a missing credential nor a missing bucket surfaces later as a puzzling 404 or a
  minute of retries against ``metadata.google.internal``.
- Timeouts, 408/429/5xx and dropped connections are retried with capped, jittered backoff;
  streamed reads are pinned to the object's generation and resume where they broke.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from operator import methodcaller
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
from gcloud.aio.storage import Storage as GcloudStorage

from vcasync.errors import (
    ConfigError,
    InvalidKeyError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
    VCAsyncError,
)
from vcasync.retry import RetryPolicy
from vcasync.storage import (
    DEFAULT_CHUNK_SIZE,
    ObjectInfo,
    buffer_blocks,
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
    shown_url,
    split_url,
    writer_token,
)
from ._gcp_credentials import find_credentials, shown_source
from ._objectstore import Block, ObjectStore, status_error

__all__ = ["GCSOptions", "GCSStorage"]

T = TypeVar("T")
MiB = 1 << 20
_QUANTUM = 256 * 1024  # resumable chunks must be multiples of this
log = logging.getLogger("vcasync.storage.gcs")


class HTTPStatusError(Exception):
    """A non-success answer to one of our own requests (resumable upload, streamed read)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


@dataclass(frozen=True, slots=True)
class GCSOptions:
    """Options for :class:`GCSStorage`; all may also be URL query parameters (except ``retry``)."""

    emulator_host: str | None = None
    service_file: str | None = None
    chunk_size: int = 16 * MiB
    simple_upload_max: int = 8 * MiB
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        check_positive("GCSOptions", chunk_size=self.chunk_size, timeout_s=self.timeout_s,
                       simple_upload_max=self.simple_upload_max,
                       connect_timeout_s=self.connect_timeout_s)
        if self.chunk_size % _QUANTUM:
            raise ConfigError(f"GCSOptions.chunk_size must be a multiple of 256 KiB, got {self.chunk_size}")
        check_retry("GCSOptions", self.retry)
        check_endpoint("GCSOptions", "emulator_host", self.emulator_host)


class GCSStorage(ObjectStore):
    """Objects under ``gs://bucket/prefix``; see the module docstring. Connects lazily."""

    scheme = "gs"
    store = "GCS"
    _log = log

    def __init__(self, bucket: str, prefix: str = "", options: GCSOptions | None = None, *,
                 sleep: Callable[[float], Awaitable[object]] | None = None,
                 rng: random.Random | None = None) -> None:
        self.options = options if options is not None else GCSOptions()
        host = self.options.emulator_host
        if host and "://" not in host:
            host = f"http://{host}"
        self._emulator = host
        super().__init__(bucket, prefix, f"?emulator_host={host}" if host else "", self.options.retry,
                         sleep=sleep, rng=rng)
        self._session: aiohttp.ClientSession | None = None
        self._gcs: GcloudStorage | None = None
        self._connecting = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, *, sleep: Callable[[float], Awaitable[object]] | None = None,
                 rng: random.Random | None = None, **options: Any) -> GCSStorage:
        parts = split_url(url, "gs")
        return cls(parts.netloc, parts.path, parse_options(GCSOptions, url, parts.query, options),
                   sleep=sleep, rng=rng)

    # --- plumbing -----------------------------------------------------------------------------

    async def _connect(self) -> GcloudStorage:
        self._check_open()
        if self._gcs is not None:
            return self._gcs
        async with self._connecting:
            if self._gcs is None:
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.options.connect_timeout_s)
                session = aiohttp.ClientSession(timeout=timeout)
                try:
                    self._gcs = GcloudStorage(service_file=self.options.service_file,
                                              session=session,  # type: ignore[arg-type]
                                              api_root=self._emulator)
                except (OSError, ValueError, KeyError) as exc:
                    await session.close()
                    raise ConfigError(f"{shown_url(self.url)}: cannot use the service_file "
                                      f"{shown_source(self.options.service_file or '')}: "
                                      f"{type(exc).__name__}") from None
                self._session = session
        return self._gcs

    async def _release(self) -> None:
        session, self._session, self._gcs = self._session, None, None
        if session is not None:
            await session.close()

    def _api(self, gcs: GcloudStorage) -> str:
        # gcloud-aio-storage resolved the root (option, STORAGE_EMULATOR_HOST, or Google's).
        return gcs._api_root

    async def _headers(self, gcs: GcloudStorage) -> dict[str, str]:
        if gcs._api_is_dev:
            return {}
        return {"Authorization": f"Bearer {await gcs.token.get()}"}

    def _translate(self, exc: Exception, what: str, key: str | None) -> Exception:
        if isinstance(exc, VCAsyncError):
            return exc
        where = self._where(what, key)
        status = exc.status if isinstance(exc, aiohttp.ClientResponseError | HTTPStatusError) else None
        if status is not None:
            if status == 404 and "bucket does not exist" in str(exc).lower():
                return self._no_bucket(where, key)
            return status_error(status, f"{where}: {exc}", key)
        if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
            return TransientStorageError(f"{where}: {type(exc).__name__}: {exc}", key=key)
        return exc

    def _uses_emulator(self) -> bool:
        return bool(self._emulator or os.environ.get("STORAGE_EMULATOR_HOST"))

    async def preflight(self) -> None:
        """Credentials (found locally, in about a second) and the bucket, before anything is
        written: a missing bucket is named as such, not reported as a missing object."""
        self._check_open()
        if not self._uses_emulator():
            found = await find_credentials(self.url, self.options.service_file)
            log.info("%s: using credentials from %s", shown_url(self.url), found)
        await super().preflight()

    async def _check_bucket(self) -> None:
        async def bucket(gcs: GcloudStorage) -> None:
            await self._request("GET", f"{self._api(gcs)}/storage/v1/b/{quote(self.bucket, safe='')}",
                                ok=(200,))

        await self._call("check bucket", None, bucket)

    async def _request(self, method: str, url: str, *, ok: tuple[int, ...], **kwargs: Any
                       ) -> tuple[int, dict[str, str], bytes]:
        """One raw request on our session; a status outside ``ok`` raises HTTPStatusError."""
        gcs = await self._connect()
        assert self._session is not None
        headers = {**kwargs.pop("headers", {}), **(await self._headers(gcs))}
        timeout = aiohttp.ClientTimeout(total=self.options.timeout_s)
        async with self._session.request(method, url, headers=headers, allow_redirects=False,
                                         timeout=timeout, **kwargs) as resp:
            body = await resp.read()
            if resp.status not in ok:
                raise HTTPStatusError(resp.status, body.decode(errors="replace"))
            return resp.status, dict(resp.headers), body

    # --- writes -------------------------------------------------------------------------------

    @property
    def _one_request_max(self) -> int:
        return self.options.simple_upload_max

    @property
    def _block_size(self) -> int:
        return self.options.chunk_size

    async def _split(self, view: memoryview) -> AsyncIterator[Block]:
        yield view          # one block: _send streams it in 1 MiB pieces

    async def _put_one(self, key: str, name: str, body: bytes, if_absent: bool) -> None:
        token = writer_token() if if_absent else None
        params = {"ifGenerationMatch": "0"} if if_absent else None
        meta = {"metadata": {WRITER_META: token}} if token else None
        await self._create(key, "put", token, lambda g: g.upload(
            self.bucket, name, body, content_type="application/octet-stream", parameters=params,
            metadata=meta, force_resumable_upload=False, timeout=int(self.options.timeout_s)))

    async def _writer(self, key: str) -> str | None:
        value = ((await self._metadata(key)).get("metadata") or {}).get(WRITER_META)
        return str(value) if value is not None else None

    async def _put_many(self, key: str, name: str, blocks: AsyncIterator[Block], if_absent: bool) -> None:
        """A resumable upload, each block retried on its own; cancelled unless it completes."""
        token = writer_token() if if_absent else None

        async def start(gcs: GcloudStorage) -> str:
            params = {"uploadType": "resumable", "name": name}
            if if_absent:
                params["ifGenerationMatch"] = "0"
            body: dict[str, Any] = {"name": name}
            if token:
                body["metadata"] = {WRITER_META: token}
            _, headers, _ = await self._request(
                "POST", f"{self._api(gcs)}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o",
                ok=(200, 201), params=params, json=body,
                headers={"X-Upload-Content-Type": "application/octet-stream"})
            location = headers.get("Location")
            if not location:
                raise StorageError(f"{self.url}: no resumable session URL for {key!r}", key=key)
            return location

        session_url = await self._call("start upload", key, start)
        finished = False
        try:
            offset = 0
            block = await anext(blocks, None)
            while block is not None:
                following = await anext(blocks, None)
                last = following is None
                tries = 0

                async def send(_g: GcloudStorage, b: bytes | memoryview = block, o: int = offset,
                               e: bool = last) -> None:
                    nonlocal tries
                    tries += 1
                    await self._send(key, session_url, memoryview(b), o, e, resume=tries > 1)

                await self._create(key, "put", token if last else None, send)
                offset += len(block)
                block = following
            finished = True
        finally:
            if not finished:
                await asyncio.shield(self._cancel(key, session_url))

    async def _send(self, key: str, session_url: str, block: memoryview, start: int, last: bool, *,
                    resume: bool) -> None:
        """Send ``block`` (at ``start``). A retry (``resume``) first asks the server where it
        stands, so it resends only what was not persisted."""
        total = start + len(block) if last else None
        persisted = await self._status(session_url, total) if resume else start
        while True:
            if persisted is None:  # the upload is complete
                return
            if not start <= persisted <= start + len(block):
                raise StorageError(f"{self.url}: the resumable upload of {key!r} lost data "
                                   f"(server has {persisted} bytes, we are at {start})", key=key)
            rest = block[persisted - start:]
            if not rest and not last:
                return
            rng = (f"bytes {persisted}-{persisted + len(rest) - 1}/{total if last else '*'}" if rest
                   else f"bytes */{total}")
            status, headers, _ = await self._request(
                "PUT", session_url, ok=(200, 201, 308), data=buffer_blocks(rest, MiB),
                headers={"Content-Range": rng, "Content-Length": str(len(rest))})
            if status in (200, 201):
                if not last:
                    raise StorageError(f"{self.url}: the upload of {key!r} finished early", key=key)
                return
            persisted = _persisted(headers)
            if not last and persisted == start + len(block):
                return

    async def _status(self, session_url: str, total: int | None) -> int | None:
        """Bytes the server holds for this session, or None when the upload is complete."""
        status, headers, _ = await self._request(
            "PUT", session_url, ok=(200, 201, 308),
            headers={"Content-Range": f"bytes */{total if total is not None else '*'}"})
        return None if status in (200, 201) else _persisted(headers)

    async def _cancel(self, key: str, session_url: str) -> None:
        try:
            await self._request("DELETE", session_url, ok=(200, 204, 404, 499))
        except Exception as exc:  # best effort: an unfinished session expires after a week
            log.debug("%s: could not cancel the upload of %r: %s", self.url, key, exc)

    async def delete(self, key: str) -> None:
        name = self._full(key)
        try:
            await self._call("delete", key, lambda g: g.delete(
                self.bucket, name, timeout=int(self.options.timeout_s)))
        except ObjectNotFoundError:
            return

    # --- reads --------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes:
        name = self._full(key)
        return await self._call("get", key, lambda g: g.download(
            self.bucket, name, timeout=int(self.options.timeout_s)))

    async def _metadata(self, key: str) -> dict[str, Any]:
        name = self._full(key)
        return await self._call("stat", key, lambda g: g.download_metadata(
            self.bucket, name, timeout=int(self.options.timeout_s)))

    async def stat(self, key: str) -> ObjectInfo:
        meta = await self._metadata(key)
        return ObjectInfo(key=key, size=int(meta["size"]), etag=str(meta.get("generation")))

    async def list(self, prefix: str = "") -> AsyncIterator[str]:
        self._check_open()
        validate_prefix(prefix)
        params = {"prefix": self._root + prefix, "fields": "items(name),nextPageToken"}
        while True:
            page = await self._call("list", prefix, methodcaller(
                "list_objects", self.bucket, params=dict(params), timeout=int(self.options.timeout_s)))
            names = sorted(item["name"][len(self._root):] for item in page.get("items") or [])
            for key in names:
                try:
                    validate_key(key)
                except InvalidKeyError:  # written by another tool (e.g. a "dir/" placeholder)
                    continue
                self._check_open()
                yield key
            token = page.get("nextPageToken")
            if not token:
                return
            params["pageToken"] = token

    async def open_read(self, key: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
                        ) -> AsyncIterator[bytes]:
        check_chunk_size(chunk_size)
        name = self._full(key)
        meta = await self._metadata(key)
        size, generation = int(meta["size"]), str(meta.get("generation", ""))
        offset, resumes = 0, 0
        while offset < size:
            gcs = await self._connect()
            assert self._session is not None
            url = f"{self._api(gcs)}/storage/v1/b/{quote(self.bucket, safe='')}/o/{quote(name, safe='')}"
            params = {"alt": "media", **({"generation": generation} if generation else {})}
            headers = {"Range": f"bytes={offset}-", **(await self._headers(gcs))}
            try:
                async with self._session.get(url, params=params, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=None,
                                                                           sock_read=self.options.timeout_s)
                                             ) as resp:
                    if resp.status not in (200, 206):
                        raise HTTPStatusError(resp.status, (await resp.read()).decode(errors="replace"))
                    if resp.status == 200 and offset:
                        raise StorageError(f"{self.url}: the server ignored the Range of a resumed "
                                           f"read of {key!r}", key=key)
                    while True:
                        self._check_open()
                        chunk = await resp.content.read(chunk_size)
                        if not chunk:
                            break
                        offset += len(chunk)
                        yield chunk
                if offset < size:
                    raise aiohttp.ClientPayloadError(f"the stream ended at byte {offset} of {size}")
            except Exception as exc:
                resumes = await self._resume_read(exc, key, offset, resumes)


def _persisted(headers: dict[str, str]) -> int:
    """Bytes persisted according to a 308's ``Range: bytes=0-N`` header (none: 0)."""
    value = headers.get("Range")
    if not value:
        return 0
    return int(value.rpartition("-")[2]) + 1

