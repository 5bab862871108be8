"""An HTTP client for the coordinator's API, used by :class:`~vcasync.worker.Worker` (and tests).

One method per route. Errors come back as the same exception classes the coordinator raised (see
:mod:`vcasync.protocol._errors`); transport failures stay aiohttp/OS errors, and :func:`is_transient`
(the one predicate of :mod:`vcasync.retry`, re-exported here; importing this module adds aiohttp's
errors to its table) tells the caller which of either kind are worth retrying. Retrying itself is the
caller's choice (a :class:`~vcasync.retry.RetryPolicy`), because only it knows whether to keep going
while it is being preempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
import yarl

from .._aio import buffer_blocks, close_file, file_blocks, open_binary
from ..errors import (
    ClosedError,
    ConfigError,
    FrameError,
    NoWorkAvailableError,
)
from ..ledger._units import LeaseGrant, Receipt
from ..protocol import _messages as P
from ..protocol._bodies import (
    EvalRecorded,
    EvalRequest,
    HeartbeatRequest,
    Joined,
    JoinRequest,
    LeaveRequest,
    Left,
    Released,
    ReleaseRequest,
    Requeued,
    RequeueRequest,
    from_body,
    kind_of,
    to_body,
)
from ..protocol._errors import error_from_body
from ..retry import classify, is_transient

M = TypeVar("M")

__all__ = ["CoordinatorClient", "check_coordinator_url", "client_ssl_context", "is_transient",
           "plain_http_hint", "tls_problem"]


#: Answers without a vcasync error body that do not say the address is wrong, left as HTTP errors
#: and retried: a proxy or load balancer while the coordinator behind it is down or restarting (502,
#: 503, 504), one rate-limiting (429: until 2026-12-07 it ended the worker on a traceback), or one
#: that timed a slow body out (408: until 2026-12-07 taken for "not a vcasync coordinator", exit 2).
_NOT_OURS_TRANSIENT = frozenset({408, 429, 502, 503, 504})

# The HTTP transport's entries in the one transient table (vcasync.retry.TRANSIENT): the
# coordinator down, restarting or overloaded is worth another try; a certificate that does not verify
# is not (a retry cannot fix it), nor is any other answer than those of _NOT_OURS_TRANSIENT.
classify(aiohttp.ClientConnectionError, True)
classify(aiohttp.ClientPayloadError, True)
classify(aiohttp.ClientSSLError, False)
classify(aiohttp.ClientConnectorCertificateError, False)
classify(aiohttp.ClientResponseError,
         lambda exc: isinstance(exc, aiohttp.ClientResponseError) and exc.status in _NOT_OURS_TRANSIENT)


def check_requeue_units(units: list[str] | None) -> None:
    """Unit ids ``requeue`` would send that the coordinator refuses, refused here as configuration
    (``--unit ""`` was a FrameError from the client: exit 1)."""
    try:
        RequeueRequest(units)
    except FrameError as exc:
        raise ConfigError(f"--unit: {exc}") from None


def check_coordinator_url(url: str, name: str = "--coordinator") -> None:
    """Refuse a coordinator URL no request can be sent to, as a :class:`ConfigError` naming it
    (``name``: the flag or field it came from). aiohttp found a port out of range or an unclosed
    IPv6 bracket only at the first request: a traceback and exit status 1, or for ``vcasync
    requeue`` "cannot reach the coordinator", as if it were down; so were whitespace in the host
    and a query. A path is kept (a reverse proxy may mount the coordinator under one): requests go
    to ``URL + "/v1/..."``. ``user:password@`` is refused first, without echoing the password (see
    :func:`_refuse_userinfo`)."""
    _refuse_userinfo(url, name)
    if any(c.isspace() or not c.isprintable() for c in url):
        # yarl dropped a tab and kept "a b" as a host: "cannot reach the coordinator", exit 1
        raise ConfigError(f"{name} {url!r} is not a valid URL: it holds whitespace or a control "
                          "character")
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name} {url!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"{name} must look like http(s)://host:port, got {url!r}")
    if not _valid_host(parsed.raw_host or ""):
        raise ConfigError(f"{name} {url!r} is not a valid URL: {parsed.host!r} is not a host name "
                          "or an IP address")
    if "?" in url or "#" in url:
        # requests go to URL + "/v1/...": a query or fragment would end up in the middle of each
        raise ConfigError(f"{name} {url!r} has a query or fragment: give http(s)://host:port, "
                          "with a path if a reverse proxy mounts the coordinator under one")


def _refuse_userinfo(url: str, name: str) -> None:
    """Refuse ``user:password@`` in a coordinator URL, before anything else can echo the URL. It
    passed, then aiohttp refused it next to the Authorization header ("Cannot combine
    AUTHORIZATION header with ... credentials encoded in URL"): a traceback and exit 1, which a
    supervisor restarts for ever; and a password in the arguments is visible to anyone on the machine
    (``ps``). The message shows the URL without its user part, never the password."""
    scheme, sep, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0] if sep else ""   # by hand: parsers refuse
    if "@" not in authority:                                            # some (an open "[")
        return
    shown = f"{scheme}://{authority.rpartition('@')[2]}{rest[len(authority):]}"
    raise ConfigError(f"{name} holds credentials (user:password@ before the host, here for "
                      f"{shown!r}): credentials in a URL are not accepted, since the command line is "
                      "visible to every user of the machine (ps); a worker joins with "
                      "VCASYNC_JOIN_SECRET, VCASYNC_JOIN_TOKEN or --join-secret-file, an operator "
                      "with VCASYNC_OPERATOR_TOKEN or --operator-token-file")


def _valid_host(host: str) -> bool:
    """An IP address, or a DNS name (letters, digits, '-' and '_' in dot-separated labels;
    yarl gives an international name in its ASCII form)."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return True
    labels = host.removesuffix(".").split(".")
    return all(0 < len(label) <= 63 and all(c.isascii() and (c.isalnum() or c in "-_") for c in label)
               for label in labels)


def tls_problem(exc: BaseException, url: str, ca_file: Path | None) -> ConfigError | None:
    """A :class:`ConfigError` for a TLS handshake with the coordinator that failed for good (its
    certificate is not trusted, or it does not speak TLS), else None. Neither a retry nor a restart
    mends one: it was a traceback and exit 1, which a supervisor restarts for ever, and ``vcasync
    requeue`` asked whether the coordinator was running."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert = exc.certificate_error
        why = getattr(cert, "verify_message", None) or str(cert) or type(cert).__name__
        fix = ("give --ca-file with the CA certificate that signed it (or the coordinator's own "
               "certificate, when self-signed)" if ca_file is None else
               f"--ca-file {ca_file} did not sign it, or the certificate does not name this host")
        return ConfigError(f"the coordinator at {url} presented a TLS certificate that does not verify "
                           f"({why}): {fix}")
    if isinstance(exc, aiohttp.ClientSSLError):
        return ConfigError(f"the TLS handshake with the coordinator at {url} failed ({exc}): is it "
                           "serving https on that port (http:// for one started without --tls-cert)?")
    return None


def plain_http_hint(exc: BaseException, url: str) -> str:
    """A hint for an http:// URL whose server hangs up at once, as a coordinator serving TLS does
    on plain HTTP (the worker retried "ServerDisconnectedError" and gave up, with no word of TLS)."""
    if url.startswith("http://") and isinstance(exc, aiohttp.ServerDisconnectedError):
        return "; a coordinator serving TLS hangs up on plain HTTP like this: use https:// if it does"
    return ""


def client_ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verify the coordinator's certificate against ``ca_file`` (or the system store when None)."""
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load CA file {ca_file}: {exc}") from exc


#: Upload block sizes. The first block is copied once to join the request headers; the rest of a
#: buffer goes to the transport as memoryview slices, and a file is read one block per thread hop.
UPLOAD_BLOCK = 1 << 20
FILE_BLOCK = 4 << 20
#: An upload goes to the transport in pieces of at most this size, each a sign of progress (see
#: :meth:`CoordinatorClient._put_result`): at the coordinator's slowest accepted rate
#: (``min_upload_bytes_per_s``, 16 KiB/s by default) one takes 16 s.
UPLOAD_PIECE = 256 << 10
#: After the last piece, the bytes still in the sockets' buffers (at most this many counted) may
#: take their time at :data:`UPLOAD_SLOWEST_RATE` before the answer can come.
UPLOAD_IN_FLIGHT = 4 << 20
UPLOAD_SLOWEST_RATE = 16 << 10


class CoordinatorClient:
    """Talks to one coordinator; an async resource (``async with`` or ``aclose()``)."""

    def __init__(self, url: str, *, token: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 timeout_s: float = 60.0, chunk_size: int = 1 << 20, limit_per_host: int = 4) -> None:
        check_coordinator_url(url, "coordinator URL")
        self.url = url.rstrip("/")
        self.token = token
        #: The run the last join's token belongs to (None until a join; "" unsaid by the coordinator).
        self.run_id: str | None = None
        self.chunk_size = chunk_size
        self._ssl = ssl_context
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
        self._limit = limit_per_host
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"CoordinatorClient({self.url!r}, token={'set' if self.token else 'unset'})"

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _sess(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClosedError("this CoordinatorClient was closed")
        if self._session is None:
            conn = aiohttp.TCPConnector(limit_per_host=self._limit, ssl=self._ssl if self._ssl else True)
            self._session = aiohttp.ClientSession(connector=conn, timeout=self._timeout)
        return self._session

    def _headers(self, credential: str | None = None, ctype: str | None = P.MSGPACK) -> dict[str, str]:
        h = {"Accept": f"{P.MSGPACK}, {P.JSON}"}
        cred = credential or self.token
        if cred:
            h["Authorization"] = f"Bearer {cred}"
        if ctype:
            h["Content-Type"] = ctype
        return h

    async def _raise_for(self, resp: aiohttp.ClientResponse) -> None:
        """Raise what the coordinator answered; a non-vcasync error body (a proxy) stays HTTP-level."""
        if resp.status < 400:
            return
        data = await P.read_capped(resp.content, P.MAX_CONTROL_BYTES)
        try:
            body = json.loads(data)
        except ValueError:
            body = None
        if not isinstance(body, dict) or "error" not in body:
            if resp.status not in _NOT_OURS_TRANSIENT:
                # Another server at the URL (a web app on that port, a proxy that does not pass the
                # route or refuses the body): no retry mends it. It was an aiohttp traceback with
                # the other server's HTML in it (exit 1), for the worker and requeue alike.
                raise ConfigError(
                    f"{resp.method} {resp.url.path} at {self.url} was answered HTTP {resp.status} "
                    f"({resp.content_type or 'no content type'}) without a vcasync error body: what "
                    "answers there is not a vcasync coordinator, or a proxy in front of it refused "
                    "the request (a path it does not pass, a body size limit); give the address the "
                    "coordinator logs at start ('coordinator listening on ...')")
            raise aiohttp.ClientResponseError(resp.request_info, resp.history, status=resp.status,
                                              message=data[:200].decode("utf-8", "replace"))
        exc = error_from_body(resp.status, body)
        # The header is whole seconds; the body's ``retry_after`` (when sent) is the precise hint.
        if isinstance(exc, NoWorkAvailableError) and "retry_after" not in body \
                and "Retry-After" in resp.headers:
            with contextlib.suppress(ValueError):
                exc.retry_after = float(resp.headers["Retry-After"])
        raise exc

    async def _control(self, method: str, path: str, kind: str, body: Mapping[str, Any], reply_kind: str,
                       *, credential: str | None = None) -> dict[str, Any]:
        data = P.encode_control(kind, body, P.MSGPACK)
        async with self._sess().request(method, self.url + path, data=data,
                                        headers=self._headers(credential)) as resp:
            await self._raise_for(resp)
            raw = await P.read_capped(resp.content, P.MAX_CONTROL_BYTES)
            return P.decode_control(raw, resp.content_type, reply_kind)

    async def _send(self, msg: Any, reply: type[M], path: str, *, credential: str | None = None) -> M:
        """POST a typed message to ``/v1{path}``; the typed answer, every field checked."""
        body = await self._control("POST", f"{P.API_PREFIX}{path}", kind_of(type(msg)), to_body(msg),
                                   kind_of(reply), credential=credential)
        return from_body(reply, body)

    # -- the API ---------------------------------------------------------------------------------
    async def join(self, credential: str, name: str = "", info: Mapping[str, Any] | None = None
                   ) -> tuple[str, str]:
        """Join with a join secret or pre-issued join token: ``(worker_id, token)``; keeps the token."""
        joined = await self._send(JoinRequest(name, dict(info or {})), Joined, "/join",
                                  credential=credential)
        self.token = joined.token
        self.run_id = joined.run_id
        return joined.worker_id, joined.token

    async def leave(self, reason: str = "") -> None:
        """Tell the coordinator this worker exits (``reason``: why, a short word such as
        ``finished``, or ``error: <type>``): it is shown ``left`` and no longer counted alive until
        it is heard from again; its leases stay as they are."""
        await self._send(LeaveRequest(reason[:64]), Left, "/leave")

    async def served_run(self) -> str | None:
        """The id of the run the coordinator serves (``GET /healthz``, no credential: nothing is
        sent before the worker knows its token belongs there); None when it does not say, nor when
        the route is not there (a proxy that passes only ``/v1/``): a 502, 503 or 504 is raised, to
        be retried like any call."""
        async with self._sess().get(f"{self.url}/healthz", headers={"Accept": P.JSON}) as resp:
            if resp.status in (502, 503, 504):
                await self._raise_for(resp)
            if resp.status != 200:
                return None
            raw = await P.read_capped(resp.content, P.MAX_CONTROL_BYTES)
        try:
            run_id = json.loads(raw).get("run_id")
        except (ValueError, AttributeError):
            return None
        return run_id if isinstance(run_id, str) and run_id else None

    async def lease(self) -> LeaseGrant:
        body = await self._control("POST", f"{P.API_PREFIX}/leases", "lease_request", {}, "lease")
        return from_body(LeaseGrant, body)

    async def resume(self, lease_id: str) -> LeaseGrant:
        body = await self._control("POST", f"{P.API_PREFIX}/leases/{lease_id}/resume", "resume", {}, "lease")
        return from_body(LeaseGrant, body)

    async def heartbeat(self, lease_id: str, steps_done: int, *, stopping: bool = False) -> LeaseGrant:
        """Progress on a lease; ``stopping``: this worker is preempted and keeps the lease and its
        checkpoint for a restart to resume (the coordinator shows it preempted meanwhile)."""
        return await self._send(HeartbeatRequest(int(steps_done), stopping), LeaseGrant,
                                f"/leases/{lease_id}/heartbeat")

    async def release(self, lease_id: str, reason: str = "", *, failed: bool = True,
                      preempted: bool = True) -> None:
        """Give a lease up; ``failed=False`` when it is nobody's fault (a preemption, or with
        ``preempted=False`` another cause: a lost base, the machine's configuration)."""
        await self._send(ReleaseRequest(reason[:500], failed, preempted), Released,
                         f"/leases/{lease_id}/release")

    async def requeue(self, operator_token: str, units: list[str] | None = None) -> list[str]:
        """Operator: queue parked units again (all, or ``units``); returns the ids requeued."""
        msg = RequeueRequest(None if units is None else list(units))
        body = to_body(msg) if units is not None else {}
        done = await self._control("POST", f"{P.API_PREFIX}/units/requeue", kind_of(RequeueRequest),
                                   body, kind_of(Requeued), credential=operator_token)
        return [str(u) for u in from_body(Requeued, done).units]

    async def report_eval(self, version: int, values: Mapping[str, float]) -> None:
        """Send an evaluator's figures for model ``version`` (e.g. ``{"accuracy": 0.91}``): the
        status page draws them as curves (see :meth:`vcasync.coordinator.Coordinator.record_eval`)."""
        await self._control("POST", f"{P.API_PREFIX}/evals", kind_of(EvalRequest),
                            to_body(EvalRequest(int(version), dict(values))), kind_of(EvalRecorded))

    async def submit(self, lease_id: str, body: bytes | bytearray | memoryview | Path | AsyncIterator[bytes],
                     size: int | None = None) -> Receipt:
        """Upload a result payload (bytes, a spooled file, or chunks); re-sending is harmless.

        Bytes and files go out in blocks (:data:`UPLOAD_BLOCK`, :data:`FILE_BLOCK`): aiohttp given
        one whole buffer copies it to prepend the headers (and again to cut it to a Content-Length),
        so a 100 MB result would cost the worker two extra 100 MB copies before its first byte is sent.
        ``size``: the Content-Length of chunks (without it they go chunked); for a buffer it must
        match its length.
        """
        headers = self._headers(ctype=P.PAYLOAD)
        url = f"{self.url}{P.API_PREFIX}/leases/{lease_id}/result"
        if isinstance(body, Path):
            f = await open_binary(body)
            try:
                headers["Content-Length"] = str((await asyncio.to_thread(os.fstat, f.fileno())).st_size)
                return await self._put_result(url, file_blocks(f, FILE_BLOCK), headers)
            finally:
                await close_file(f)
        if isinstance(body, bytes | bytearray | memoryview):
            view = memoryview(body).cast("B")
            if size is not None and size != view.nbytes:
                raise ConfigError(f"size {size} does not match the body's {view.nbytes} bytes")
            headers["Content-Length"] = str(view.nbytes)
            return await self._put_result(url, buffer_blocks(view, UPLOAD_BLOCK), headers)
        if size is not None:
            headers["Content-Length"] = str(size)
        return await self._put_result(url, body, headers)

    async def _put_result(self, url: str, data: Any, headers: dict[str, str]) -> Receipt:
        """PUT a result body, timed by its progress, not by the session's read timeout.

        aiohttp's ``sock_read`` timeout runs from the request's head: an upload that took longer
        than ``timeout_s`` (a 4 MB result at 50 KB/s, 100 MB at 1 Mbit/s) was cut off by the
        worker itself while its bytes were still flowing, and every retry started again from zero,
        for ever. Here the limit is ``timeout_s`` without a piece of the body taken by the
        transport, then, after the last one, ``timeout_s`` plus what the bytes still buffered
        need at :data:`UPLOAD_SLOWEST_RATE` for the answer. A stalled or dead link is still cut
        off (``TimeoutError``, retried); the coordinator cuts off one too slow for it (408)."""
        timeout_s = self._timeout.sock_read or 60.0
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s) as limit:

            async def pieces() -> AsyncIterator[bytes | memoryview]:
                sent = 0
                async for block in data:
                    view = memoryview(block).cast("B")
                    for start in range(0, view.nbytes, UPLOAD_PIECE):
                        limit.reschedule(loop.time() + timeout_s)
                        piece = view[start:start + UPLOAD_PIECE]
                        sent += piece.nbytes
                        yield piece
                limit.reschedule(loop.time() + timeout_s
                                 + min(sent, UPLOAD_IN_FLIGHT) / UPLOAD_SLOWEST_RATE)

            no_read_timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout.connect,
                                                    sock_read=None)
            async with self._sess().put(url, data=pieces(), headers=headers,
                                        timeout=no_read_timeout) as resp:
                limit.reschedule(loop.time() + timeout_s)   # answered: its body is small
                await self._raise_for(resp)
                raw = await P.read_capped(resp.content, P.MAX_CONTROL_BYTES)
                return P.decode_msg(Receipt, raw, resp.content_type)

    async def download_model(self, version: int | str, dest: Path, *, etag: str | None = None
                             ) -> tuple[str | None, int]:
        """Stream model ``version`` into ``dest`` (atomically); ``(etag, version)``.

        With ``etag`` and a matching model on the coordinator, nothing is downloaded and ``dest`` is
        left alone: the answer is ``(etag, version)`` from the 304.
        """
        headers = self._headers(ctype=None)
        if etag:
            headers["If-None-Match"] = etag
        async with self._sess().get(f"{self.url}{P.API_PREFIX}/models/{version}", headers=headers) as resp:
            await self._raise_for(resp)
            got_version = _int_header(resp, "X-VCAsync-Version")
            new_etag = resp.headers.get("ETag")
            if resp.status == 304:
                return new_etag or etag, got_version
            tmp = dest.with_name(dest.name + ".part")
            f = await open_binary(tmp, "wb")
            try:
                async for chunk in resp.content.iter_chunked(self.chunk_size):
                    await asyncio.to_thread(f.write, chunk)
            finally:
                await close_file(f)
            await asyncio.to_thread(tmp.replace, dest)
            return new_etag, got_version

    async def status(self) -> dict[str, Any]:
        async with self._sess().get(f"{self.url}{P.API_PREFIX}/status",
                                    headers=self._headers(ctype=None)) as resp:
            await self._raise_for(resp)
            body = await resp.json()
            if not isinstance(body, dict):
                raise FrameError("status is not a JSON object", field="body")
            return body


def _int_header(resp: aiohttp.ClientResponse, name: str) -> int:
    try:
        return int(resp.headers[name])
    except (KeyError, ValueError) as exc:
        raise FrameError(f"response lacks a valid {name} header", field=name) from exc
